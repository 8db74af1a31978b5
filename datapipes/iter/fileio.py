"""Files where they live: FileLister [list_files], FileOpener [open_files], Saver [save_to_disk],
and their fsspec counterparts for any URL: FSSpecFileLister [list_files_by_fsspec],
FSSpecFileOpener [open_files_by_fsspec], FSSpecSaver [save_by_fsspec].

Streams are read lazily: an opener hands out open file objects, never their contents.

**When a stream is closed.** The openers yield ``(path, stream)`` where ``stream`` is a
:class:`StreamWrapper` around the open file. A stream stays valid while something holds it, so
streams pass through ``batch``, ``shuffle``, ``prefetch`` and ``next(iter(pipe))`` intact. It is
closed:

- when you close it (``stream.close()``, ``with stream:``), or the stage that reads it does;
- when it is garbage collected (nothing holds it any more);
- when the pass that opened it is *abandoned*: its iterator is closed (``it.close()``, or a
  downstream stage closing its upstream) before the source ran out, or an exception escapes the
  pass (a missing file, a failing source). Every stream of that pass still open is then closed,
  even one you still hold.

A pass that runs to the end of its source leaves the streams it handed out alone: downstream
buffers (shuffle, batch, prefetch) may still hold them, and they close when dropped. A pass that is
merely dropped (``next(iter(pipe))``) does not close its streams either; they close when they are
dropped. So no file is left open once nothing refers to it, and none outlives a pass that failed or
was closed.

>>> import os, tempfile
>>> from pathlib import Path
>>> from datapipes.iter import FileLister
>>> with tempfile.TemporaryDirectory() as d:
...     for name in ("b.txt", "a.txt", "notes.md"):
...         _ = Path(d, name).write_text(name.upper())
...     pipe = FileLister(d, masks="*.txt").open_files()
...     [(os.path.basename(path), stream.read()) for path, stream in pipe]
[('a.txt', 'A.TXT'), ('b.txt', 'B.TXT')]
"""

from __future__ import annotations

import errno
import fnmatch
import io
import os
import posixpath
import re
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Iterator, Sequence, Union

from ..datapipe import IterDataPipe, functional_datapipe, len_unknown, require_callable, require_int, require_pipe, stage_label
from ..errors import ErrorPolicy, FailureLog, add_stage_note
from .util import IterableWrapper

__all__ = [
    "FSSpecFileLister",
    "FSSpecFileOpener",
    "FSSpecSaver",
    "FileLister",
    "FileOpener",
    "Saver",
    "StreamWrapper",
]

PathLike = Union[str, "os.PathLike[str]"]

_READ_MODES = {"r": "r", "rt": "r", "t": "r", "rb": "rb", "b": "rb"}
_WRITE_MODES = ("w", "wb", "wt", "a", "ab", "at", "x", "xb", "xt")
_TEXT_KWARGS = ("encoding", "errors", "newline")


# -- StreamWrapper ---------------------------------------------------------------------------------

# Methods cached on the wrapper at their first use, so later calls (read, readline) go straight to
# the file object's C methods: no ``__getattr__`` miss per call.
_CACHED = frozenset(("read", "readline", "readlines", "readinto", "read1", "readinto1", "seek", "tell", "peek"))


class StreamWrapper:
    """An open file handed out by an opener: behaves as the file, and closes it when dropped.

    Reading methods and attributes are the wrapped file's (``read``, ``readline``, iteration,
    ``seek``, ``name``, ...). The file is closed by :meth:`close` (idempotent), on leaving a
    ``with`` block, when the wrapper is garbage collected, or when the opener's pass is abandoned
    (see :mod:`datapipes.iter.fileio` for the rule).

    Args:
        file_obj: the open file object.
        name: what the stream is, for messages (the path or URL it was opened from).

    >>> import io
    >>> from datapipes.iter import StreamWrapper
    >>> s = StreamWrapper(io.BytesIO(b"abc"), name="mem")
    >>> s.read(2), s.closed
    (b'ab', False)
    >>> s.close(); s.closed
    True
    """

    def __init__(self, file_obj: Any, name: Any = None) -> None:
        d = self.__dict__
        d["file_obj"] = file_obj
        d["name"] = name

    #: set by :meth:`close`: some file objects (fsspec's in-memory files) do not mark themselves
    _closed = False

    @property
    def closed(self) -> bool:
        return self._closed or bool(self.file_obj.closed)

    def close(self) -> None:
        """Close the wrapped file; closing again does nothing."""
        self.__dict__["_closed"] = True
        self.file_obj.close()

    @classmethod
    def close_streams(cls, v: Any, depth: int = 0) -> None:
        """Close every :class:`StreamWrapper` found in ``v`` (nested lists, tuples, dicts; depth <= 10)."""
        if depth > 10:
            return
        if isinstance(v, StreamWrapper):
            v.close()
        elif isinstance(v, dict):
            for vv in v.values():
                cls.close_streams(vv, depth + 1)
        elif isinstance(v, (list, tuple)):
            for vv in v:
                cls.close_streams(vv, depth + 1)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        try:
            file_obj = d["file_obj"]
        except KeyError:
            raise AttributeError(name) from None
        value = getattr(file_obj, name)
        if name in _CACHED:
            d[name] = value
        return value

    def __iter__(self) -> Iterator[Any]:
        return iter(self.file_obj)

    def __next__(self) -> Any:
        return next(self.file_obj)

    def __enter__(self) -> StreamWrapper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        file_obj = self.__dict__.get("file_obj")
        if file_obj is not None:
            try:
                file_obj.close()
            except Exception:  # noqa: BLE001 - a finalizer must not raise
                pass

    def __dir__(self) -> list[str]:
        return sorted(set(dir(type(self))) | set(self.__dict__) | set(dir(self.file_obj)))

    def __reduce__(self) -> tuple[Any, ...]:
        # An open OS file cannot travel to another process: pickle raises TypeError naming its type.
        return (StreamWrapper, (self.file_obj, self.name))

    def __repr__(self) -> str:
        return f"StreamWrapper<{self.name!r}, {self.file_obj!r}>"


# -- one pass of an opener -------------------------------------------------------------------------


class _OpenPass:
    """The iterator of one pass of an opener: opens each path, tracks the streams it handed out.

    ``close()`` before the source ran out, or an exception escaping ``__next__``, closes every
    stream of this pass still open. After the source ran out the streams are left alone.
    """

    __slots__ = ("_source", "_open", "_stage", "_failures", "_streams", "_lock", "_n", "__weakref__")

    def __init__(self, source: Iterable[Any], open_fn: Callable[[Any], Any], stage: str, failures: Any) -> None:
        self._open = open_fn
        self._stage = stage
        self._failures = failures  # a PassFailures with on_error="skip", else None
        self._streams: weakref.WeakSet[StreamWrapper] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._n = 0
        self._source: Iterator[Any] = iter(source)

    def __iter__(self) -> _OpenPass:
        return self

    def __next__(self) -> tuple[Any, StreamWrapper]:
        while True:
            try:
                path = next(self._source)
            except StopIteration:
                # Ran to the end: downstream buffers may still hold the streams; leave them be.
                self._source = iter(())
                self._streams = weakref.WeakSet()
                raise
            except BaseException:
                self._abandon()
                raise
            n = self._n
            self._n = n + 1
            try:
                stream = StreamWrapper(self._open(path), path)
            except Exception as e:
                if self._failures is None:
                    add_stage_note(e, self._stage, n)
                    self._abandon()
                    raise
                try:
                    self._failures.skip(e, n)
                except BaseException:
                    self._abandon()
                    raise
                continue
            except BaseException:
                self._abandon()
                raise
            with self._lock:
                self._streams.add(stream)
            return path, stream

    def _abandon(self) -> None:
        self._source = iter(())
        with self._lock:
            streams = list(self._streams)
            self._streams = weakref.WeakSet()
        for stream in streams:
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - closing a read stream; the pass is failing already
                pass

    def close(self) -> None:
        """Stop this pass: close the source's iterator and every stream of this pass still open
        (streams are left alone when the source already ran out). Idempotent."""
        source = self._source
        self._source = iter(())
        try:
            close = getattr(source, "close", None)
            if close is not None:
                close()
        finally:
            self._abandon()


def _paths_pipe(datapipe: Any, stage: str, name: str) -> IterDataPipe[Any]:
    """The source of an opener: a pipe, or a list/tuple of paths wrapped as one (as torch allows)."""
    if isinstance(datapipe, (list, tuple)):
        return IterableWrapper(list(datapipe))
    require_pipe(datapipe, stage, name)
    return datapipe


def _require_path(path: Any, stage: str, what: str = "path") -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{stage}: each {what} must be a str or os.PathLike, got {type(path).__name__}: {path!r:.100}")


# -- FileLister ------------------------------------------------------------------------------------


def _mask_matcher(masks: str | Sequence[str]) -> Callable[[str], Any] | None:
    """A function telling whether a file name matches one of the glob ``masks``; None matches all."""
    if isinstance(masks, str):
        masks = [masks] if masks else []
    if not masks:
        return None
    pattern = "|".join(fnmatch.translate(os.path.normcase(m)) for m in masks)
    match = re.compile(pattern).match
    if os.path.normcase("A") == "A":
        return match
    return lambda name: match(os.path.normcase(name))


def _raise(err: OSError) -> None:
    raise err


def _list_root(pipe: FileLister, root: Any, match: Callable[[str], Any] | None) -> Iterator[str]:
    stage = stage_label(pipe)
    try:
        _require_path(root, stage, "root")
        root = os.fspath(root)
        if pipe.abspath:
            root = os.path.abspath(root)
        if not os.path.isdir(root):
            if not os.path.exists(root):
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), root)
            # A root that is a file (or a FIFO, a device) is listed as itself.
            if match is None or match(os.path.basename(root)):
                yield root
            return
        join = os.path.join
        if not pipe.recursive:
            with os.scandir(root) as entries:
                names = [e.name for e in entries if not e.is_dir()]
            if not pipe.non_deterministic:
                names.sort()
            for name in names:
                if match is None or match(name):
                    yield join(root, name)
            return
        for dirpath, dirs, files in os.walk(root, onerror=_raise):
            if not pipe.non_deterministic:
                files.sort()
                dirs.sort()  # in place: os.walk descends in this order
            for name in files:
                if match is None or match(name):
                    yield join(dirpath, name)
    except Exception as e:
        add_stage_note(e, stage)
        raise


def _list_files(pipe: FileLister) -> Iterator[str]:
    match = _mask_matcher(pipe.masks)
    for root in pipe.datapipe:
        yield from _list_root(pipe, root, match)


def _check_masks(masks: Any, stage: str) -> None:
    if isinstance(masks, str):
        return
    if isinstance(masks, (list, tuple)) and all(isinstance(m, str) for m in masks):
        return
    raise TypeError(f"{stage}: masks must be a str or a list of str, got {masks!r:.100}")


def _check_bool(value: Any, stage: str, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{stage}: {name} must be a bool, got {type(value).__name__}: {value!r:.100}")


def _roots_pipe(root: Any, stage: str, kinds: tuple[type, ...]) -> IterDataPipe[Any]:
    """``root`` as a pipe of roots: a single root, a list of roots, or a pipe yielding roots."""
    if isinstance(root, IterDataPipe):
        return root
    if isinstance(root, kinds):
        return IterableWrapper([root])
    if isinstance(root, (list, tuple)):
        for r in root:
            if not isinstance(r, kinds):
                want = " or ".join(k.__name__ for k in kinds)
                raise TypeError(f"{stage}: each root must be a {want}, got {type(r).__name__}: {r!r:.100}")
        return IterableWrapper(list(root))
    raise TypeError(
        f"{stage}: root must be a path, a list of paths or an IterDataPipe of paths, got {type(root).__name__}"
    )


@functional_datapipe("list_files")
class FileLister(IterDataPipe[str]):
    """List the files under local root directories (functional name: ``list_files``).

    Args:
        root: a directory or file path (str or ``os.PathLike``), a list of them, or an
            ``IterDataPipe`` yielding them (``IterableWrapper(dirs).list_files()``). A root that is
            a file is listed as itself.
        masks: glob pattern(s) the file *name* must match (``"*.csv"`` or ``["*.jpg", "*.png"]``);
            ``""`` matches every file.
        recursive: also list the files of subdirectories (symlinked directories are not entered).
        abspath: yield absolute paths; otherwise paths are joined onto the root as given.
        non_deterministic: skip sorting (the order is then the file system's).
        length: the nominal ``len()`` of the listing (``-1``: unknown).

    Yields:
        File paths, root by root; within a directory sorted by name, each directory's files before
        those of its subdirectories (also sorted).

    Raises:
        FileNotFoundError: a root does not exist (the message names it).
        PermissionError / OSError: a directory cannot be read (the message names it).
        TypeError: a root is not a path.
        Each with a note naming the stage.

    ``len()`` is ``length`` when given; otherwise ``TypeError`` (listing is lazy, as in torch).

    >>> import os, tempfile
    >>> from pathlib import Path
    >>> from datapipes.iter import FileLister
    >>> with tempfile.TemporaryDirectory() as d:
    ...     for name in ("b.csv", "a.csv", "sub/c.csv", "sub/d.txt"):
    ...         Path(d, name).parent.mkdir(exist_ok=True)
    ...         _ = Path(d, name).write_text("x")
    ...     [os.path.relpath(p, d) for p in FileLister(d, "*.csv", recursive=True)]
    ['a.csv', 'b.csv', 'sub/c.csv']

    See also: :class:`FileOpener`, :class:`FSSpecFileLister` for URLs.
    """

    def __init__(
        self,
        root: PathLike | Sequence[PathLike] | IterDataPipe[PathLike] = ".",
        masks: str | list[str] = "",
        *,
        recursive: bool = False,
        abspath: bool = False,
        non_deterministic: bool = False,
        length: int = -1,
    ) -> None:
        stage = "FileLister"
        self.datapipe = _roots_pipe(root, stage, (str, os.PathLike))
        _check_masks(masks, stage)
        _check_bool(recursive, stage, "recursive")
        _check_bool(abspath, stage, "abspath")
        _check_bool(non_deterministic, stage, "non_deterministic")
        require_int(length, stage, "length", minimum=-1)
        self.masks = masks
        self.recursive = recursive
        self.abspath = abspath
        self.non_deterministic = non_deterministic
        self.length = length
        self._run = _list_files

    def __iter__(self) -> Iterator[str]:
        return self._run(self)

    def __len__(self) -> int:
        if self.length == -1:
            raise len_unknown(self, "the number of files is known only after listing; pass length= to set it")
        return self.length


# -- FileOpener ------------------------------------------------------------------------------------


def _check_read_mode(mode: Any, encoding: Any, stage: str) -> str:
    if mode not in _READ_MODES:
        raise ValueError(f"{stage}: mode must be one of 'r', 'rt', 't', 'rb', 'b', got {mode!r}")
    if encoding is not None and not isinstance(encoding, str):
        raise TypeError(f"{stage}: encoding must be a str or None, got {type(encoding).__name__}")
    normal = _READ_MODES[mode]
    if normal == "rb" and encoding is not None:
        raise ValueError(f"{stage}: binary mode {mode!r} takes no encoding, got encoding={encoding!r}")
    return normal


def _local_opener(pipe: FileOpener) -> Callable[[Any], Any]:
    mode = pipe._mode
    encoding = pipe.encoding
    stage = stage_label(pipe)

    def open_path(path: Any) -> Any:
        if not isinstance(path, (str, os.PathLike)):
            _require_path(path, stage)
        return open(path, mode, encoding=encoding)  # noqa: SIM115 - the stream's owner closes it

    return open_path


@functional_datapipe("open_files")
class FileOpener(IterDataPipe[tuple[str, StreamWrapper]]):
    """Open local files and yield ``(path, stream)`` pairs (functional name: ``open_files``).

    Args:
        datapipe: a pipe of paths (str or ``os.PathLike``), e.g. a :class:`FileLister`, or a
            list of paths.
        mode: ``"r"``/``"rt"``/``"t"`` for text (``str`` streams) or ``"rb"``/``"b"`` for binary.
        encoding: the text encoding (``None``: the locale's, as ``open``); binary mode takes none.
        length: the nominal ``len()`` (``-1``: the source's length, when known).
        on_error: ``"raise"`` (default) or ``"skip"``: a path that cannot be opened (missing,
            permission denied, a directory) is skipped and counted in ``pipe.failures``.
        max_failures: with ``on_error="skip"``, failures tolerated per pass (``None``: any).

    Yields:
        ``(path, stream)``: the path as given and a :class:`StreamWrapper` over the open file.
        Files are opened lazily, one per item. The module docstring says when a stream is closed:
        when closed by its reader, when dropped, or when the pass is closed or fails.

    Raises:
        FileNotFoundError, PermissionError, IsADirectoryError, ... (``OSError``): the very error
        ``open`` raised (its message names the path), with a note naming the stage and position.
        TypeError: an item is not a path.

    ``len()`` is ``length`` when given, else the source's length (unknown with ``on_error="skip"``).

    >>> import os, tempfile
    >>> from pathlib import Path
    >>> from datapipes.iter import IterableWrapper
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = Path(d, "a.bin").write_bytes(b"\\x00\\x01")
    ...     pipe = IterableWrapper([os.path.join(d, "a.bin")]).open_files(mode="b")
    ...     [stream.read() for _, stream in pipe]
    [b'\\x00\\x01']

    See also: :class:`FileLister`, :class:`FSSpecFileOpener` for URLs and remote files,
    :class:`StreamWrapper`.
    """

    _repr_fields = ("mode",)

    def __init__(
        self,
        datapipe: Iterable[PathLike],
        mode: str = "r",
        encoding: str | None = None,
        length: int = -1,
        *,
        on_error: str = "raise",
        max_failures: int | None = None,
    ) -> None:
        stage = "FileOpener"
        datapipe = _paths_pipe(datapipe, stage, "datapipe")
        self._mode = _check_read_mode(mode, encoding, stage)
        require_int(length, stage, "length", minimum=-1)
        self.datapipe = datapipe
        self.mode = mode
        self.encoding = encoding
        self.length = length
        self._policy = ErrorPolicy(on_error, max_failures)
        self.failures = FailureLog()

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        stage = stage_label(self)
        failures = self._policy.new_pass(stage, self.failures) if self._policy.skips else None
        return _OpenPass(self.datapipe, _local_opener(self), stage, failures)

    def __len__(self) -> int:
        if self.length != -1:
            return self.length
        if self._policy.skips:
            raise len_unknown(self, "with on_error='skip' the number of files that open is known only after iterating")
        return len(self.datapipe)  # type: ignore[arg-type]


# -- Saver -----------------------------------------------------------------------------------------


def _check_write_mode(mode: Any, stage: str) -> None:
    if mode not in _WRITE_MODES:
        raise ValueError(f"{stage}: mode must be one of {', '.join(map(repr, _WRITE_MODES))}, got {mode!r}")


def _pair(item: Any, stage: str, n: int) -> tuple[Any, Any]:
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    raise TypeError(f"{stage}: expects (meta, data) pairs, got {type(item).__name__}: {item!r:.100}")


def _save(pipe: Saver) -> Iterator[Any]:
    stage = stage_label(pipe)
    fn = pipe.filepath_fn
    mode = pipe.mode
    n = 0
    for item in pipe.source_datapipe:
        try:
            meta, data = _pair(item, stage, n)
            path = meta if fn is None else fn(meta)
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            with open(path, mode) as f:
                f.write(data)
        except Exception as e:
            add_stage_note(e, stage, n)
            raise
        yield path
        n += 1


@functional_datapipe("save_to_disk")
class Saver(IterDataPipe[str]):
    """Write each ``(meta, data)`` pair's data to a local file (functional name: ``save_to_disk``).

    Args:
        source_datapipe: a pipe of ``(meta, data)`` pairs.
        mode: the ``open`` mode: ``"w"`` (text, default), ``"wb"`` (bytes), ``"a"``/``"ab"``
            (append), ``"x"``/``"xb"`` (fail if the file exists).
        filepath_fn: ``filepath_fn(meta)`` gives the file's path; ``None``: ``meta`` is the path.
            Missing parent directories are created.

    Yields:
        The path of each file written, once it is written and closed.

    Raises:
        Whatever ``filepath_fn`` or writing raises (``OSError`` naming the path, ``TypeError`` for
        ``str`` data in a binary mode), as the same object with a note naming the stage and item.
        TypeError: an item is not a ``(meta, data)`` pair.

    ``len()`` is the source's length.

    >>> import os, tempfile
    >>> from pathlib import Path
    >>> from datapipes.iter import IterableWrapper
    >>> with tempfile.TemporaryDirectory() as d:
    ...     pipe = IterableWrapper([("a.txt", "hello"), ("sub/b.txt", "world")])
    ...     paths = list(pipe.save_to_disk(filepath_fn=lambda name: os.path.join(d, name)))
    ...     [Path(p).read_text() for p in paths]
    ['hello', 'world']

    See also: :class:`FSSpecSaver` for URLs.
    """

    _repr_fields = ("mode",)

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[Any, Any]],
        mode: str = "w",
        filepath_fn: Callable[[Any], Any] | None = None,
    ) -> None:
        stage = "Saver"
        require_pipe(source_datapipe, stage, "source_datapipe")
        _check_write_mode(mode, stage)
        require_callable(filepath_fn, stage, "filepath_fn", optional=True)
        self.source_datapipe = source_datapipe
        self.mode = mode
        self.filepath_fn = filepath_fn
        self._run = _save

    def __iter__(self) -> Iterator[Any]:
        return self._run(self)

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]


# -- fsspec: shared pieces -------------------------------------------------------------------------

# OSErrors that retrying cannot fix.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError, io.UnsupportedOperation)


def _is_transient(exc: BaseException, depth: int = 0) -> bool:
    """Whether a remote file system error may go away on a retry.

    Transient: connection and timeout errors, other ``OSError``s, aiohttp client errors, and HTTP
    5xx/408/425/429 responses. Not: missing paths, permission errors, other HTTP 4xx, anything
    else. fsspec's HTTP file system reports any failure to stat a URL as ``FileNotFoundError``
    raised *from* the real error, so such an error is judged by its cause.
    """
    if isinstance(exc, _PERMANENT):
        cause = exc.__cause__
        return cause is not None and depth < 3 and not isinstance(cause, _PERMANENT) and _is_transient(cause, depth + 1)
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(exc, aiohttp.ClientResponseError):
        return exc.status >= 500 or exc.status in (408, 425, 429)
    if isinstance(exc, (OSError, TimeoutError)):
        return True
    return aiohttp is not None and isinstance(exc, aiohttp.ClientError)


def _note_once(exc: BaseException, note: str) -> None:
    notes = getattr(exc, "__notes__", None)
    if notes is None or note not in notes:
        exc.add_note(note)


def _url_note(exc: BaseException, what: str, url: str, attempts: int) -> None:
    """Note the URL on ``exc`` (and the attempts made), unless a note names it already."""
    named = repr(url)
    if any(named in note for note in getattr(exc, "__notes__", ())):
        return
    if attempts > 1:
        _note_once(exc, f"[datapipes] {what} {url!r} failed after {attempts} attempts")
    else:
        _note_once(exc, f"[datapipes] while {what} {url!r}")


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
        raise TypeError(f"{stage}: each URL must be a str, got {type(url).__name__}: {url!r:.100}")
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


def _fsspec_list(pipe: FSSpecFileLister) -> Iterator[str]:
    match = _mask_matcher(pipe.masks)
    for root in pipe.datapipe:
        yield from _fsspec_list_root(pipe, root, match)


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
        _check_bool(recursive, stage, "recursive")
        _check_retries(retries, backoff, stage)
        self.masks = masks
        self.recursive = recursive
        self.retries = retries
        self.backoff = backoff
        self.storage_options = storage_options
        self._run = _fsspec_list

    def __iter__(self) -> Iterator[str]:
        return self._run(self)

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
    object, with a note naming the URL and the attempts made.
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
        self._do(lambda f: None, "opening")

    @property
    def name(self) -> str:
        return self._url

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
                raise EOFError(f"{self._url!r} ended at byte {self._pos - left} while resuming at byte {self._pos}")
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
        stream: Any = io.BufferedReader(_RetryingReader(fs, path, url, kw, retries, backoff))
        if mode == "r":
            stream = io.TextIOWrapper(stream, **text_kw)
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
        retries: on a remote file system, how many times a transient error (connection reset,
            timeout, HTTP 5xx/408/429, other ``OSError``) is retried, at open and at every read.
            A read retried mid-file reopens the URL and resumes at the same byte. Missing files
            and permission errors are never retried; nor is anything on local or ``memory://``
            file systems.
        backoff: the first retry's delay in seconds, doubled at each further retry (0.5, 1, 2 s
            by default).
        on_error: ``"raise"`` (default) or ``"skip"``: a URL that cannot be opened (after its
            retries) is skipped and counted in ``pipe.failures``.
        max_failures: with ``on_error="skip"``, failures tolerated per pass (``None``: any).
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

    >>> import fsspec
    >>> from datapipes.iter import IterableWrapper
    >>> fsspec.filesystem("memory").pipe("/doc-opener/a.txt", b"hello")
    >>> pipe = IterableWrapper(["memory://doc-opener/a.txt"]).open_files_by_fsspec(mode="rb")
    >>> [(url, stream.read()) for url, stream in pipe]
    [('memory://doc-opener/a.txt', b'hello')]
    >>> fsspec.filesystem("memory").rm("/doc-opener", recursive=True)

    See also: :class:`FSSpecFileLister`, :class:`FSSpecSaver`, :class:`FileOpener`.
    """

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
        on_error: str = "raise",
        max_failures: int | None = None,
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
        self._policy = ErrorPolicy(on_error, max_failures)
        self.failures = FailureLog()

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        stage = stage_label(self)
        failures = self._policy.new_pass(stage, self.failures) if self._policy.skips else None
        return _OpenPass(self.source_datapipe, _fsspec_opener(self), stage, failures)

    def __len__(self) -> int:
        if self._policy.skips:
            raise len_unknown(self, "with on_error='skip' the number of files that open is known only after iterating")
        return len(self.source_datapipe)  # type: ignore[arg-type]


# -- FSSpecSaver -----------------------------------------------------------------------------------


def _fsspec_save(pipe: FSSpecSaver) -> Iterator[Any]:
    stage = stage_label(pipe)
    fn = pipe.filepath_fn
    mode = pipe.mode
    kw = pipe.kwargs_for_open
    n = 0
    for item in pipe.source_datapipe:
        url: Any = None
        try:
            meta, data = _pair(item, stage, n)
            url = meta if fn is None else fn(meta)
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
        **storage_options: passed to the file system.

    Yields:
        The URL of each file written, once it is written and closed.

    Raises:
        Whatever ``filepath_fn``, the file system or writing raises, as the same object with notes
        naming the URL and the stage. TypeError: an item is not a ``(meta, data)`` pair.

    ``len()`` is the source's length.

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

    _repr_fields = ("mode",)

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[Any, Any]],
        mode: str = "w",
        filepath_fn: Callable[[Any], Any] | None = None,
        *,
        kwargs_for_open: dict[str, Any] | None = None,
        **storage_options: Any,
    ) -> None:
        stage = "FSSpecSaver"
        require_pipe(source_datapipe, stage, "source_datapipe")
        _check_write_mode(mode, stage)
        require_callable(filepath_fn, stage, "filepath_fn", optional=True)
        self.kwargs_for_open = _check_kwargs_for_open(kwargs_for_open, stage)
        self.source_datapipe = source_datapipe
        self.mode = mode
        self.filepath_fn = filepath_fn
        self.storage_options = storage_options
        self._run = _fsspec_save

    def __iter__(self) -> Iterator[Any]:
        return self._run(self)

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]
