"""fsspec counterparts of the file pipes, for any URL (``file://``, ``memory://``, ``http(s)://``,
``s3://`` with s3fs, ...): FSSpecFileLister [list_files_by_fsspec], FSSpecFileOpener
[open_files_by_fsspec], FSSpecSaver [save_by_fsspec].

Streams follow the rules of :mod:`datapipes.iter.fileio` (when a stream is closed). Remote reads are
retried with exponential backoff on transient errors; the error given up on names the URL.
"""

from __future__ import annotations

import errno
import io
import os
import posixpath
import time
from typing import Any, Callable, Iterator, Sequence

from .._checks import require_bool
from .._redact import redact, redact_exception
from .._runtime.passes import Pass
from .._engine import abandon
from ..datapipe import IterDataPipe, functional_datapipe, len_unknown, require_callable, require_int, require_pipe, source_len, stage_label
from ..errors import WARN_FAILURES, _OnError, add_stage_note, policy_and_log
from .fileio import StreamWrapper, _TEXT_KWARGS, _named_folder, _refused, _check_masks, _check_read_mode, _check_write_mode, _listed, _ListRun, _mask_matcher, _open_pass, _opened_len, _opener_stateless, _pair, _paths_pipe, _roots_pipe

__all__ = ["FSSpecFileLister", "FSSpecFileOpener", "FSSpecSaver"]

# -- fsspec: shared pieces -------------------------------------------------------------------------

# OSErrors that retrying cannot fix.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError, io.UnsupportedOperation)

# The optional client libraries under fsspec's backends (s3fs: botocore over aiohttp; HTTP: aiohttp;
# some others: requests) are recognised by the (module, class name) of an exception's classes, so
# that judging an error imports none of them. A subclass counts: botocore's EndpointConnectionError
# is a botocore ConnectionError (and not an OSError). What is retried: docs/howto/remote.rst.

# The connection or the transfer failed: a retry makes a new one.
_TRANSIENT_CLASSES = frozenset({
    ("botocore.exceptions", "ConnectionError"),  # EndpointConnectionError, ConnectTimeoutError, ...
    ("botocore.exceptions", "HTTPClientError"),  # ConnectionClosedError, ReadTimeoutError, ...
    ("botocore.exceptions", "IncompleteReadError"),  # a body shorter than announced
    ("botocore.parsers", "ResponseParserError"),  # a reply cut short
    ("aiohttp.client_exceptions", "ClientConnectionError"),  # ServerDisconnectedError, timeouts, ...
    ("aiohttp.client_exceptions", "ClientPayloadError"),  # a body cut short
    ("requests.exceptions", "ConnectionError"),
    ("requests.exceptions", "Timeout"),
    ("requests.exceptions", "ChunkedEncodingError"),
})

# Their base classes: any other error of theirs is permanent (a bad URL or parameter, missing
# credentials), although requests' errors are OSErrors.
_CLIENT_ERRORS = frozenset({
    ("botocore.exceptions", "BotoCoreError"),
    ("aiohttp.client_exceptions", "ClientError"),
    ("requests.exceptions", "RequestException"),
})

# The error codes of an AWS reply that ask for a retry: those botocore's own standard retry mode
# retries (transient and throttling) and S3's InternalError and ServiceUnavailable.
_RETRY_CODES = frozenset({
    "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "RequestTimeoutException",
    "PriorRequestNotComplete", "Throttling", "ThrottlingException", "ThrottledException",
    "RequestThrottledException", "TooManyRequestsException", "ProvisionedThroughputExceededException",
    "TransactionInProgressException", "RequestLimitExceeded", "BandwidthLimitExceeded",
    "LimitExceededException", "RequestThrottled", "EC2ThrottledException",
})


def _class_names(exc: BaseException) -> set[tuple[str, str]]:
    return {(c.__module__, c.__qualname__) for c in type(exc).__mro__}


def _retry_status(status: Any) -> bool:
    """Whether an HTTP status asks for a retry: 5xx, 408 (timeout), 425 (too early), 429 (too many)."""
    return isinstance(status, int) and (status >= 500 or status in (408, 425, 429))


def _reply_verdict(exc: BaseException) -> bool | None:
    """For an error that carries the server's reply (botocore's ClientError, aiohttp's
    ClientResponseError, requests' HTTPError), whether that reply asks for a retry; ``None`` for
    any other error."""
    names = _class_names(exc)
    if ("botocore.exceptions", "ClientError") in names:
        response = getattr(exc, "response", None) or {}
        code = str(response.get("Error", {}).get("Code", ""))
        if code in _RETRY_CODES:
            return True
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status is None and code.isdigit():  # a reply without a body (HEAD): the code is the status
            status = int(code)
        return _retry_status(status)
    if ("aiohttp.client_exceptions", "ClientResponseError") in names:
        return _retry_status(getattr(exc, "status", None))
    if ("requests.exceptions", "HTTPError") in names:
        return _retry_status(getattr(getattr(exc, "response", None), "status_code", None))
    return None


def _out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``MemoryError`` or was raised from or while handling one (aiohttp turns
    a failure inside its parser into a ``ClientPayloadError`` raised from it)."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:
        if isinstance(e, MemoryError):
            return True
        e = e.__cause__ if e.__cause__ is not None else e.__context__
        seen += 1
    return False


def _is_transient(exc: BaseException, depth: int = 0) -> bool:
    """Whether a remote file system error may go away on a retry.

    Transient: the connection and timeout errors of the client libraries and of Python (other
    ``OSError``s too), and replies with HTTP 5xx/408/425/429 or an AWS throttling or server error
    code. Not: missing paths, permission errors, other HTTP 4xx replies, the client libraries'
    other errors, anything else. fsspec's HTTP file system reports any failure to stat a URL as
    ``FileNotFoundError`` raised *from* the real error, and s3fs turns botocore's ClientError into
    an ``OSError`` raised from it, so such an error is judged by its cause. Never transient: a
    ``MemoryError``, or an error raised from or while handling one (a retry would download again
    into the memory that just ran out).
    """
    if depth == 0 and _out_of_memory(exc):
        return False
    cause = exc.__cause__
    if isinstance(exc, _PERMANENT):
        return cause is not None and depth < 3 and not isinstance(cause, _PERMANENT) and _is_transient(cause, depth + 1)
    verdict = _reply_verdict(exc)
    if verdict is not None:
        return verdict
    names = _class_names(exc)
    if names & _TRANSIENT_CLASSES:
        return True
    if names & _CLIENT_ERRORS:
        return False
    if isinstance(exc, OSError) and cause is not None and depth < 3 and _reply_verdict(cause) is not None:
        return _is_transient(cause, depth + 1)
    return isinstance(exc, (OSError, TimeoutError))


def _note_once(exc: BaseException, note: str) -> None:
    notes = getattr(exc, "__notes__", None)
    if notes is None or note not in notes:
        exc.add_note(note)


def _url_note(exc: BaseException, what: str, url: str, attempts: int) -> None:
    """Note the URL on ``exc`` (and the attempts made), unless a note names it already, and mask the
    secrets of the URLs ``exc`` carries (its message, aiohttp's ``request_info``, its causes: see
    datapipes._redact), in place: the error of a remote read, given up on, leaves here."""
    redact_exception(exc)
    named = repr(redact(url))
    if any(named in note for note in getattr(exc, "__notes__", ())):
        return
    if attempts > 1:
        _note_once(exc, f"[datapipes] {what} {named} failed after {attempts} attempts")
    else:
        _note_once(exc, f"[datapipes] while {what} {named}")


def _retry(call: Callable[[], Any], what: str, url: str, retries: int, backoff: float) -> Any:
    """``call()``, retried on transient errors with exponential backoff (``backoff * 2**k`` s)."""
    attempt = 0
    while True:
        try:
            return call()
        except Exception as e:
            if attempt < retries and _is_transient(e):
                time.sleep(backoff * (1 << attempt))
                attempt += 1
                continue
            _url_note(e, what, url, attempt + 1)
            raise


def _retries_apply(fs: Any) -> bool:
    """Whether ``fs`` is remote (retries apply): anything but the local and in-memory systems."""
    from fsspec.implementations.local import LocalFileSystem
    from fsspec.implementations.memory import MemoryFileSystem

    return not isinstance(fs, (LocalFileSystem, MemoryFileSystem))


def _url_to_fs(url: Any, stage: str, storage_options: dict[str, Any]) -> tuple[Any, str]:
    if not isinstance(url, str):
        raise TypeError(f"{stage}: each URL must be a str, got {type(url).__name__}: {redact(repr(url)):.100}")
    import fsspec.core

    try:
        return fsspec.core.url_to_fs(url, **storage_options)
    except Exception as e:
        _url_note(e, "resolving", url, 1)
        raise


def _check_retries(retries: Any, backoff: Any, stage: str) -> None:
    require_int(retries, stage, "retries", minimum=0)
    if isinstance(backoff, bool) or not isinstance(backoff, (int, float)):
        raise TypeError(f"{stage}: backoff must be a number of seconds, got {type(backoff).__name__}")
    if not backoff >= 0:
        raise ValueError(f"{stage}: backoff must be >= 0, got {backoff!r}")


def _check_kwargs_for_open(kwargs_for_open: Any, stage: str) -> dict[str, Any]:
    if kwargs_for_open is None:
        return {}
    if not isinstance(kwargs_for_open, dict):
        raise TypeError(f"{stage}: kwargs_for_open must be a dict or None, got {type(kwargs_for_open).__name__}")
    return dict(kwargs_for_open)


# -- FSSpecFileLister ------------------------------------------------------------------------------


def _join_url(root: str, path: str, name: str, fs: Any) -> str:
    """The URL of ``name`` spelled as the user spelled ``root`` (``memory://d`` -> ``memory://d/a``)."""
    base = path.rstrip("/")
    if base and name.startswith(base + "/"):
        return root.rstrip("/") + name[len(base) :]
    return fs.unstrip_protocol(name) if "://" in root else name


def _fsspec_list_root(pipe: FSSpecFileLister, root: Any, match: Callable[[str], Any] | None) -> list[str]:
    stage = stage_label(pipe)
    try:
        fs, path = _url_to_fs(root, stage, pipe.storage_options)
        if _retries_apply(fs):
            retries, backoff = pipe.retries, pipe.backoff
        else:
            retries, backoff = 0, 0.0

        def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            return _retry(lambda: fn(*args, **kwargs), "listing", root, retries, backoff)

        # HTTP has no directories: a root ending in "/" is always listed (a page of links).
        if not root.endswith("/") and call(fs.isfile, path):
            name = posixpath.basename(path.rstrip("/"))
            return [root] if match is None or match(name) else []
        if pipe.recursive:
            found = call(fs.find, path, withdirs=False, detail=True)
            entries = list(found.values())
        else:
            entries = [e for e in call(fs.ls, path, detail=True) if e.get("type") != "directory"]
        if not entries and not call(fs.exists, path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), root)
        names = [e["name"] for e in entries]
        if match is not None:
            names = [n for n in names if match(posixpath.basename(n.rstrip("/")))]
        names.sort()
        return [_join_url(root, path, n, fs) for n in names]
    except Exception as e:
        if isinstance(root, str):
            _url_note(e, "listing", root, 1)
        add_stage_note(e, stage)
        raise


def _fsspec_list(pipe: FSSpecFileLister, roots: Iterator[Any], run: _ListRun) -> Iterator[str]:
    match = _mask_matcher(pipe.masks)
    run.started = True
    try:
        if run.resume is not None:  # the root the saved pass was listing: listed again, from where it stood
            root, skip = run.resume
            run.resume = None
            yield from _listed(run, root, [_fsspec_list_root(pipe, root, match)], skip)
        for root in roots:
            yield from _listed(run, root, [_fsspec_list_root(pipe, root, match)], 0)
    except BaseException:
        abandon(roots)  # this frame names the upstream: release it now, not at collection
        raise


@functional_datapipe("list_files_by_fsspec")
class FSSpecFileLister(IterDataPipe[str]):
    """List the files under fsspec URLs (functional name: ``list_files_by_fsspec``).

    Any URL fsspec knows: local paths and ``file://``, ``memory://``, ``http(s)://`` (the links
    of an HTML index page), ``s3://`` with s3fs installed, chained URLs.

    Args:
        root: a URL, a list of URLs, or an ``IterDataPipe`` yielding them. A URL naming a file is
            listed as itself; one ending in ``"/"`` is always listed as a directory.
        masks: glob pattern(s) the file *name* (the last path part) must match; ``""``: all.
        recursive: also list the files below subdirectories (``fs.find``).
        retries: how many times a transient remote error (connection, timeout, HTTP 5xx) is
            retried per call; local and ``memory://`` file systems are never retried.
        backoff: the first retry's delay in seconds, doubled at each further retry.
        **storage_options: passed to the file system (``anon=True``, ``client_kwargs=...``).

    Yields:
        File URLs spelled as their root was (``memory://d`` gives ``memory://d/a.txt``), sorted by
        name within each root.

    Raises:
        FileNotFoundError: a root does not exist. Errors from the file system pass through as the
        same object, with notes naming the URL (and the attempts made) and the stage.

    ``len()`` raises ``TypeError``: the number of files is known only after listing.

    Example:
        >>> import fsspec
        >>> from datapipes.iter import FSSpecFileLister
        >>> fs = fsspec.filesystem("memory")
        >>> for name in ("b.txt", "a.txt", "c.csv"):
        ...     fs.pipe(f"/doc-lister/{name}", b"x")
        >>> list(FSSpecFileLister("memory://doc-lister", masks="*.txt"))
        ['memory://doc-lister/a.txt', 'memory://doc-lister/b.txt']
        >>> fs.rm("/doc-lister", recursive=True)

    See also: :class:`FSSpecFileOpener`, :class:`FileLister` for plain local folders.
    """

    _saves = "same as list_files"

    def __init__(
        self,
        root: str | Sequence[str] | IterDataPipe[str],
        masks: str | list[str] = "",
        *,
        recursive: bool = False,
        retries: int = 3,
        backoff: float = 0.5,
        **storage_options: Any,
    ) -> None:
        stage = "FSSpecFileLister"
        self.datapipe = _roots_pipe(root, stage, (str,))
        _check_masks(masks, stage)
        require_bool(recursive, stage, "recursive")
        _check_retries(retries, backoff, stage)
        self.masks = masks
        self.recursive = recursive
        self.retries = retries
        self.backoff = backoff
        self.storage_options = storage_options
        self._run = _fsspec_list

    def _open(self, ctx: Pass) -> Iterator[str]:
        # The root being listed (a URL) and the files of it yielded: a resumed pass lists that root
        # again (one listing, sorted as every listing is) and starts at the count (see _ListRun).
        run = _ListRun(self, ctx)  # a loaded root must be one of those self.datapipe yields
        ctx.track(self, run)
        return self._run(self, ctx.open(self.datapipe), run)

    def __len__(self) -> int:
        raise len_unknown(self, "the number of files is known only after listing")


# -- FSSpecFileOpener ------------------------------------------------------------------------------


def _read(f: Any, size: int) -> bytes:
    return f.read(size)


def _seek(f: Any, offset: int, whence: int) -> int:
    f.seek(offset, whence)
    return int(f.tell())


class _RetryingReader(io.RawIOBase):
    """A binary reader over a remote fsspec file that survives transient errors.

    Every open, read and seek is retried up to ``retries`` times on a transient error (see
    :func:`_is_transient`), waiting ``backoff * 2**k`` seconds before retry ``k``: the broken file
    is dropped, the URL opened again and positioned where the reader was (by seeking, or by reading
    and discarding on a stream that cannot seek). The error given up on is raised as the same
    object, with a note naming the URL and the attempts made (secrets masked). A subclass checks
    each file it opens in :meth:`_opened`.
    """

    def __init__(self, fs: Any, path: str, url: str, open_kwargs: dict[str, Any], retries: int, backoff: float) -> None:
        super().__init__()
        self._fs = fs
        self._path = path
        self._url = url
        self._kw = open_kwargs
        self._retries = retries
        self._backoff = backoff
        self._f: Any = None
        self._pos = 0
        try:
            self._do(lambda f: None, "opening")
        except BaseException:
            self._drop()  # a file refused by _opened is closed now, not at collection
            raise

    @property
    def name(self) -> str:
        return self._url

    def _opened(self, f: Any) -> None:
        """Check a file just opened (before it is positioned); raise to refuse it."""

    def _reposition(self, f: Any) -> None:
        try:
            f.seek(self._pos)
            return
        except (ValueError, OSError):
            pass  # a stream that cannot seek: read up to the position
        left = self._pos
        while left:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                raise EOFError(f"{redact(self._url)!r} ended at byte {self._pos - left} while resuming at byte {self._pos}")
            left -= len(chunk)

    def _drop(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            try:
                f.close()
            except Exception:  # noqa: BLE001 - the file is broken already
                pass

    def _do(self, op: Callable[..., Any], what: str, *args: Any) -> Any:
        attempt = 0
        while True:
            try:
                f = self._f
                if f is None:
                    f = self._fs.open(self._path, "rb", **self._kw)
                    self._f = f
                    self._opened(f)
                    if self._pos:
                        self._reposition(f)
                return op(f, *args)
            except Exception as e:
                transient = _is_transient(e)
                if transient:
                    self._drop()
                if transient and attempt < self._retries:
                    time.sleep(self._backoff * (1 << attempt))
                    attempt += 1
                    continue
                _url_note(e, what, self._url, attempt + 1)
                raise

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        data = self._do(_read, "reading", -1 if size is None else size)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = self._do(_seek, "seeking", offset, whence)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            try:
                self._drop()
            finally:
                super().close()


class _Buffered(io.BufferedReader):
    """A buffered reader whose ``repr`` names its URL without its secrets (datapipes._redact)."""

    def __repr__(self) -> str:
        return redact(super().__repr__())


class _Text(io.TextIOWrapper):
    """A text reader whose ``repr`` names its URL without its secrets (datapipes._redact)."""

    def __repr__(self) -> str:
        return redact(super().__repr__())


def _fsspec_opener(pipe: FSSpecFileOpener) -> Callable[[Any], Any]:
    stage = stage_label(pipe)
    mode = pipe._mode
    storage_options = pipe.storage_options
    kw = dict(pipe.kwargs_for_open)
    if pipe.encoding is not None:
        kw["encoding"] = pipe.encoding
    text_kw = {k: kw.pop(k) for k in _TEXT_KWARGS if k in kw}
    local_kw = {**kw, **text_kw} if mode == "r" else kw
    retries, backoff = pipe.retries, pipe.backoff

    def open_url(url: Any) -> Any:
        fs, path = _url_to_fs(url, stage, storage_options)
        if retries == 0 or not _retries_apply(fs):
            try:
                return fs.open(path, mode, **local_kw)
            except Exception as e:
                _url_note(e, "opening", url, 1)
                raise
        stream: Any = _Buffered(_RetryingReader(fs, path, url, kw, retries, backoff))
        if mode == "r":
            stream = _Text(stream, **text_kw)
        return stream

    return open_url


@functional_datapipe("open_files_by_fsspec")
class FSSpecFileOpener(IterDataPipe[tuple[str, StreamWrapper]]):
    """Open fsspec URLs and yield ``(url, stream)`` pairs (functional name: ``open_files_by_fsspec``).

    Any URL fsspec knows: local paths and ``file://``, ``memory://``, ``http(s)://`` (needs aiohttp),
    ``s3://`` with s3fs installed, chained URLs (``simplecache::https://...``).

    Args:
        source_datapipe: a pipe of URLs, e.g. an :class:`FSSpecFileLister`, or a list of URLs.
        mode: ``"r"``/``"rt"``/``"t"`` for text or ``"rb"``/``"b"`` for binary.
        kwargs_for_open: keyword arguments for ``fs.open`` (``block_size``, ``compression``, ...).
        encoding: the text encoding (text mode only).
        retries: on a remote file system, how many times a transient error (a connection lost,
            refused or reset, a timeout, HTTP 5xx/408/429, S3 throttling, other ``OSError``: the
            list is in docs/howto/remote.rst) is retried, at open and at every read. A read
            retried mid-file reopens the URL and resumes at the same byte. Missing files and
            permission errors are never retried; nor is anything on local or ``memory://`` file
            systems.
        backoff: the first retry's delay in seconds, doubled at each further retry (0.5, 1, 2 s
            by default).
        on_error: ``"raise"`` (default) or ``"skip"``: a URL that cannot be opened (after its
            retries) is skipped and counted in ``pipe.failures``.
        max_failures: with ``on_error="skip"``, failures tolerated per pass: a number, or a float
            between 0 and 1 for a share of the items (``None``: any).
        warn_failures: with ``on_error="skip"``, past how many failures (a number, or a share:
            10% by default) a pass warns once (``None``: never); see :mod:`datapipes.errors`.
        **storage_options: passed to the file system (``anon=True``, ``client_kwargs=...``).

    Yields:
        ``(url, stream)``: the URL as given and a :class:`StreamWrapper` over the open file,
        closed by the same rule as :class:`FileOpener`'s (see the module docstring).

    Raises:
        The file system's error as the same object (``FileNotFoundError``, ``PermissionError``,
        an aiohttp error, ...), with notes naming the URL, the attempts made and the stage. An
        error given up on while *reading* reaches the stage that reads, with the URL note.
        TypeError: an item is not a str.

    ``len()`` is the source's length (unknown with ``on_error="skip"``).

    Example:
        >>> import fsspec
        >>> from datapipes.iter import IterableWrapper
        >>> fsspec.filesystem("memory").pipe("/doc-opener/a.txt", b"hello")
        >>> pipe = IterableWrapper(["memory://doc-opener/a.txt"]).open_files_by_fsspec(mode="rb")
        >>> [(url, stream.read()) for url, stream in pipe]
        [('memory://doc-opener/a.txt', b'hello')]
        >>> fsspec.filesystem("memory").rm("/doc-opener", recursive=True)

    See also: :class:`FSSpecFileLister`, :class:`FSSpecSaver`, :class:`FileOpener`.
    """

    _saves = "same as open_files"

    _repr_fields = ("mode",)

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        mode: str = "r",
        *,
        kwargs_for_open: dict[str, Any] | None = None,
        encoding: str | None = None,
        retries: int = 3,
        backoff: float = 0.5,
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        **storage_options: Any,
    ) -> None:
        stage = "FSSpecFileOpener"
        source_datapipe = _paths_pipe(source_datapipe, stage, "source_datapipe")
        self._mode = _check_read_mode(mode, encoding, stage)
        self.kwargs_for_open = _check_kwargs_for_open(kwargs_for_open, stage)
        _check_retries(retries, backoff, stage)
        self.source_datapipe = source_datapipe
        self.mode = mode
        self.encoding = encoding
        self.retries = retries
        self.backoff = backoff
        self.storage_options = storage_options
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures)
        self._stateless = _opener_stateless(self)  # one file per URL: its position is its source's

    def _open(self, ctx: Pass) -> Iterator[tuple[str, StreamWrapper]]:
        return _open_pass(self, ctx, self.source_datapipe, _fsspec_opener(self))

    def _reopener(self) -> Callable[[Any, int], StreamWrapper]:
        """How a reader of this stage's items opens one again by its URL (``reopen(url, n)``): a
        pass resumed inside a file reads it from its start again."""
        open_url = _fsspec_opener(self)
        return lambda url, n: StreamWrapper(open_url(url), url)

    def __len__(self) -> int:
        return _opened_len(self, self.source_datapipe, "source_datapipe")


# -- FSSpecSaver -----------------------------------------------------------------------------------


def _url_path(url: str) -> tuple[str, str]:
    """``(scheme, path)`` of a URL (``""`` for a local path), the path normalised with its ``..``
    resolved by name, starting with ``/``: ``memory://d/x/../y`` gives ``("memory", "/d/y")``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", os.path.abspath(url)
    return scheme.lower(), posixpath.normpath("/" + rest.split("?", 1)[0])


def _check_url_target(stage: str, url: Any, root: str | None) -> None:
    """Refuse a target URL outside ``root`` (same scheme, under its path); without one, a URL that
    climbs with ``..`` out of the folder it names first: as :class:`~datapipes.iter.Saver` does."""
    if not isinstance(url, str):
        return  # a path-like object or an open file: fsspec's to refuse
    if root is not None:
        scheme, path = _url_path(url)
        root_scheme, folder = _url_path(root)
        if scheme != root_scheme or not path.startswith(folder.rstrip("/") + "/") or path == folder:
            raise _refused(stage, redact(url), redact(root))
    elif ".." in url:
        rest = url.partition("://")[2] or url
        named = _named_folder(rest.split("?", 1)[0])
        if named is not None:
            base = url[: len(url) - len(rest)] + named
            if not _url_path(url)[1].startswith(_url_path(base)[1].rstrip("/") + "/"):
                raise _refused(stage, redact(url), redact(base),
                               " (which the URL names before its '..'; normalise it, or pass root=... to name the folder)")


def _fsspec_save(pipe: FSSpecSaver, it: Iterator[Any]) -> Iterator[Any]:
    stage = stage_label(pipe)
    fn = pipe.filepath_fn
    mode = pipe.mode
    kw = pipe.kwargs_for_open
    n = 0
    try:
        for item in it:
            url: Any = None
            try:
                meta, data = _pair(item, stage, n)
                url = meta if fn is None else fn(meta)
                _check_url_target(stage, url, pipe.root)
                fs, path = _url_to_fs(url, stage, pipe.storage_options)
                if not _retries_apply(fs):  # local: create the parent folders (memory:// needs none)
                    fs.makedirs(fs._parent(path), exist_ok=True)
                with fs.open(path, mode, **kw) as f:
                    f.write(data)
            except Exception as e:
                if isinstance(url, str):
                    _url_note(e, "writing", url, 1)
                add_stage_note(e, stage, n)
                raise
            yield url
            n += 1
    except BaseException:
        abandon(it)
        raise


@functional_datapipe("save_by_fsspec")
class FSSpecSaver(IterDataPipe[str]):
    """Write each ``(meta, data)`` pair's data to an fsspec URL (functional name: ``save_by_fsspec``).

    Args:
        source_datapipe: a pipe of ``(meta, data)`` pairs.
        mode: ``"w"`` (text, default) or ``"wb"`` (bytes); ``"a"``/``"ab"``/``"x"``/``"xb"``
            where the file system supports them.
        filepath_fn: ``filepath_fn(meta)`` gives the URL; ``None``: ``meta`` is the URL. Missing
            local parent folders are created.
        kwargs_for_open: keyword arguments for ``fs.open``.
        root: a URL (or local folder) every target must lie strictly inside, the same scheme and
            under its path once ``..`` is resolved; a target outside it raises ``ValueError``
            before anything is written. ``None`` (default): a URL may still not climb with ``..``
            out of the folder it names first (``memory://out/x/../../y``), as :class:`Saver`.
            Where ``filepath_fn`` builds URLs from data (a member name, a key), pass the folder.
        **storage_options: passed to the file system.

    Yields:
        The URL of each file written, once it is written and closed.

    Raises:
        Whatever ``filepath_fn``, the file system or writing raises, as the same object with notes
        naming the URL and the stage. TypeError: an item is not a ``(meta, data)`` pair.

    ``len()`` is the source's length.

    Example:
        >>> import fsspec
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper([("a.txt", b"DATA1"), ("b.txt", b"DATA2")])
        >>> list(pipe.save_by_fsspec(mode="wb", filepath_fn=lambda name: "memory://doc-saver/" + name))
        ['memory://doc-saver/a.txt', 'memory://doc-saver/b.txt']
        >>> fs = fsspec.filesystem("memory")
        >>> fs.cat("/doc-saver/b.txt")
        b'DATA2'
        >>> fs.rm("/doc-saver", recursive=True)

    See also: :class:`Saver` for local files, :class:`FSSpecFileOpener`.
    """

    _saves = "nothing: at a boundary their position is their source's"

    _repr_fields = ("mode",)
    _stateless = True  # one file written per item, before the item is yielded: its position is its source's

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[Any, Any]],
        mode: str = "w",
        filepath_fn: Callable[[Any], Any] | None = None,
        *,
        kwargs_for_open: dict[str, Any] | None = None,
        root: str | None = None,
        **storage_options: Any,
    ) -> None:
        stage = "FSSpecSaver"
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"{stage}: root must be a URL (str) or a local path, or None, got {type(root).__name__}")
        require_pipe(source_datapipe, stage, "source_datapipe")
        _check_write_mode(mode, stage)
        require_callable(filepath_fn, stage, "filepath_fn", optional=True)
        self.kwargs_for_open = _check_kwargs_for_open(kwargs_for_open, stage)
        self.source_datapipe = source_datapipe
        self.mode = mode
        self.filepath_fn = filepath_fn
        self.root = None if root is None else os.fspath(root)
        self.storage_options = storage_options
        self._run = _fsspec_save

    def _open(self, ctx: Pass) -> Iterator[Any]:
        return self._run(self, ctx.open(self.source_datapipe))

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")
