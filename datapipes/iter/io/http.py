"""HTTP(S) downloads: HttpReader [read_from_http] and OnlineReader [read_from_remote], on fsspec's
HTTP file system.

Streams follow the rules of :mod:`datapipes.iter.fileio` (when a stream is closed); reads are
retried as :mod:`datapipes.iter.remote` retries them.

A server is not trusted to behave (docs/howto/remote.rst, "HTTP"): connecting and each read have a
finite default timeout (:data:`TIMEOUT`), a body is refused past ``max_size`` bytes (:data:`MAX_SIZE`:
by its Content-Length up front, and by the bytes actually read), a body that ends short of its
Content-Length raises, and secrets in URLs are masked in everything the stages write
(datapipes._redact).

**Checkpoints.** Neither stage keeps a position of its own (one stream per URL).
"""

from __future__ import annotations

import base64
import warnings
from typing import Any, Callable, Iterator

from ..._checks import require_bool
from ..._redact import redact
from ..._runtime.passes import Pass
from ...datapipe import IterDataPipe, functional_datapipe, stage_label
from ...errors import SizeLimitError, policy_and_log
from ..fileio import StreamWrapper, _open_pass, _opened_len, _paths_pipe
from ..remote import _Buffered, _check_retries, _RetryingReader, _url_note

__all__ = ["HttpReader", "OnlineReader"]

#: The default ``timeout``: ``(connect, read)`` seconds. 30 s to connect (aiohttp's own default),
#: 60 s without a byte while reading: a server that stalls fails the read (retried as a transient
#: error) instead of hanging the pass. Never a bound on the whole download.
TIMEOUT = (30.0, 60.0)

#: The default ``max_size``: 16 GiB, more than any shard or archive a pipe usually streams;
#: a bound on a server that sends without end. Lower it where bodies are read whole into memory.
MAX_SIZE = 16 * 2**30

_CHUNK = 1 << 20  # bytes per read when a body is read whole


def _check_max_size(max_size: Any, stage: str) -> None:
    if max_size is None:
        return
    if isinstance(max_size, bool) or not isinstance(max_size, int):
        raise TypeError(f"{stage}: max_size must be a number of bytes (an int) or None, got {type(max_size).__name__}")
    if max_size < 1:
        raise ValueError(f"{stage}: max_size must be >= 1 byte or None (no limit), got {max_size!r}")


def _check_timeout(timeout: Any, stage: str) -> None:
    if timeout is None:
        return
    values = timeout if isinstance(timeout, tuple) and len(timeout) == 2 else (timeout,)
    for v in values:
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise TypeError(f"{stage}: timeout must be seconds, a (connect, read) pair of them, or None, got {timeout!r}")
        if v is not None and not v > 0:
            raise ValueError(f"{stage}: timeout must be > 0, got {timeout!r}")


def _client_timeout(timeout: Any) -> Any:
    """requests' ``timeout`` (seconds, or ``(connect, read)``; ``None``: none) as aiohttp's: a bound
    on connecting (``sock_connect``) and on each read (``sock_read``, which also bounds the wait for
    the reply's headers), never on the whole download (``total=None``)."""
    import aiohttp

    connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
    return aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)


def _request_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """requests' keyword arguments as aiohttp takes them (``auth=(user, password)``, ``verify``)."""
    kw = dict(kwargs)
    kw.pop("stream", None)  # always streamed
    auth = kw.get("auth")
    if isinstance(auth, tuple) and len(auth) == 2:  # HTTP basic authentication, as a header
        del kw["auth"]
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode("ascii")
        kw["headers"] = {**(kw.get("headers") or {}), "Authorization": f"Basic {token}"}
    if "verify" in kw:
        verify = kw.pop("verify")
        if verify is False:
            kw["ssl"] = False
    return kw


class _HttpBody(_RetryingReader):
    """The body of one GET, read through :class:`~datapipes.iter.remote._RetryingReader` (retried,
    resumed mid-body), never past ``max_size`` bytes and never short of its Content-Length.

    The Content-Length of each response (counted where the body is sent as it is, with no
    Content-Encoding: aiohttp decodes gzip and deflate) is checked against ``max_size`` when the
    URL is opened; the bytes read are counted against it as they come (a body without a length, a
    decoded one), and no read asks the file for more than one byte past the limit, so a body read
    whole holds at most ``max_size`` bytes plus one chunk. A body that ends before its
    Content-Length raises ``EOFError``: a short body is never returned as if it were whole.
    """

    def __init__(self, fs: Any, url: str, open_kwargs: dict[str, Any], retries: int, backoff: float,
                 max_size: int | None, stage: str) -> None:
        self._max_size = max_size
        self._stage = stage
        self._length: int | None = None  # the body's Content-Length, where it is sent as it is
        super().__init__(fs, url, url, open_kwargs, retries, backoff)

    def _opened(self, f: Any) -> None:
        headers = getattr(getattr(f, "r", None), "headers", None) or {}
        declared = headers.get("Content-Length")
        encoded = headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity")
        try:
            length = int(declared) if declared is not None and not encoded else None
        except ValueError:
            length = None  # aiohttp refuses a malformed length before this; say nothing of it here
        self._length = length
        if length is not None and self._max_size is not None and length > self._max_size:
            raise SizeLimitError(
                f"{self._stage}: the body of {redact(self._url)!r} is {length} bytes (its Content-Length), more than "
                f"max_size={self._max_size}; pass a larger max_size (or None: no limit) to read it"
            )

    def _over(self) -> SizeLimitError:
        where = "a body with no Content-Length" if self._length is None else "its body"
        return SizeLimitError(
            f"{self._stage}: {where} of {redact(self._url)!r} went past max_size={self._max_size} bytes while "
            f"being read; pass a larger max_size (or None: no limit) to read it"
        )

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        limit = self._max_size
        want = size if limit is None else min(size, limit - self._pos + 1)
        data = super().read(want)
        try:
            if limit is not None and self._pos > limit:
                raise self._over()
            length = self._length
            if length is not None and (self._pos > length or not data and want and self._pos < length):
                raise EOFError(
                    f"{self._stage}: the body of {redact(self._url)!r} ended after {self._pos} bytes, short of its "
                    f"Content-Length of {length} bytes" if self._pos < length else
                    f"{self._stage}: the body of {redact(self._url)!r} ran past its Content-Length of {length} bytes"
                )
        except Exception as e:
            _url_note(e, "reading", self._url, 1)
            raise
        return data

    def readall(self) -> bytes:
        out = bytearray()
        while chunk := self.read(_CHUNK):
            out += chunk
        return bytes(out)


def _http_opener(pipe: Any) -> Callable[[Any], Any]:
    """``open_url(url)``: a binary stream over the body of a GET of ``url`` (fsspec's HTTP file
    system, streamed: one request), retried as :class:`~datapipes.iter.FSSpecFileOpener` retries,
    within ``pipe.max_size``."""
    import fsspec

    stage = stage_label(pipe)
    fs = fsspec.filesystem("http", client_kwargs={"timeout": _client_timeout(pipe.timeout)})
    # block_size=0: a streamed GET; a size given: fsspec skips the HEAD it sends to learn the size
    # (a stream has no use for it), so a download is one request, as with requests in torchdata.
    kw = {**_request_kwargs(pipe.query_params), "block_size": 0, "size": -1}
    retries, backoff, skip, max_size = pipe.retries, pipe.backoff, pipe.skip_on_error, pipe.max_size

    def open_url(url: Any) -> Any:
        try:
            if not isinstance(url, str):
                raise TypeError(f"{stage}: each URL must be a str, got {type(url).__name__}: {redact(repr(url)):.100}")
            if not url.lower().startswith(("http://", "https://")):
                raise ValueError(f"{stage}: not an http(s) URL: {redact(repr(url)):.200} "
                                 f"(open_files_by_fsspec reads other URLs)")
            return _Buffered(_HttpBody(fs, url, kw, retries, backoff, max_size, stage))
        except Exception as e:
            if skip:
                warnings.warn(f"{redact(str(e))}, skipping...", stacklevel=2)
            raise

    return open_url


class _HttpBase(IterDataPipe[tuple[str, StreamWrapper]]):
    def _setup(self, stage: str, source_datapipe: Any, timeout: Any, skip_on_error: Any, retries: Any, backoff: Any,
               max_size: Any, kwargs: dict[str, Any]) -> None:
        self.source_datapipe = _paths_pipe(source_datapipe, stage, "source_datapipe")
        _check_timeout(timeout, stage)
        require_bool(skip_on_error, stage, "skip_on_error")
        _check_retries(retries, backoff, stage)
        _check_max_size(max_size, stage)
        self.timeout = timeout
        self.skip_on_error = skip_on_error
        self.retries = retries
        self.backoff = backoff
        self.max_size = max_size
        self.query_params = kwargs
        self._policy, self.failures = policy_and_log(self, "skip" if skip_on_error else "raise", None)
        self._stateless = True  # one stream per URL: its position is its source's

    def _open(self, ctx: Pass) -> Iterator[tuple[str, StreamWrapper]]:
        return _open_pass(self, ctx, self.source_datapipe, _http_opener(self))

    def _reopener(self) -> Callable[[Any, int], StreamWrapper]:
        """How a reader of this stage's items opens one again by its URL: a new GET."""
        open_url = _http_opener(self)
        return lambda url, n: StreamWrapper(open_url(url), url)

    def __len__(self) -> int:
        return _opened_len(self, self.source_datapipe, "source_datapipe")


@functional_datapipe("read_from_http")
class HttpReader(_HttpBase):
    """GET each HTTP(S) URL and yield ``(url, stream)`` pairs (functional name: ``read_from_http``).

    Args:
        source_datapipe: a pipe of ``http://`` or ``https://`` URLs (or a list of them).
        timeout: seconds allowed to connect and for each read (between two bytes received, and
            for the reply's headers; never the whole download), or a ``(connect, read)`` pair, as
            in requests. Default :data:`TIMEOUT`, ``(30.0, 60.0)``: a server that stalls fails the
            read (retried as transient) instead of hanging the pass. ``None``: no limit at all,
            for servers trusted to answer (torchdata's default).
        skip_on_error: skip a URL that fails (after its retries) with a warning ("..., skipping..."),
            counted in ``pipe.failures``; otherwise the error is raised.
        retries: how many times a transient error (connection reset, timeout, HTTP 5xx/408/429)
            is retried, at the request and at every read; a read retried mid-body requests the URL
            again and skips what was read. HTTP 404 and other 4xx, body size errors and
            ``MemoryError`` are never retried.
        backoff: the first retry's delay in seconds, doubled at each further retry.
        max_size: the most bytes a body may have, as read (after aiohttp decodes any gzip or
            deflate Content-Encoding). Default :data:`MAX_SIZE`, 16 GiB; ``None``: no limit.
            Checked against the Content-Length when the URL is opened and against the bytes read
            (a server may send no length, or lie): past it, :class:`~datapipes.errors.SizeLimitError`.
            Lower it when bodies are read whole into memory.
        **kwargs: request options, as requests names them: ``headers``, ``params``, ``cookies``,
            ``auth=(user, password)``, ``allow_redirects``, ``verify=False``.

    Yields:
        ``(url, stream)``: the URL and a :class:`StreamWrapper` over a binary stream of the body,
        read as it is consumed (one request per URL; it cannot seek). Streams are closed by the
        rule of :mod:`datapipes.iter.fileio`.

    Raises:
        FileNotFoundError (HTTP 404), ``aiohttp.ClientResponseError`` (other statuses),
        ``aiohttp.ClientError`` / ``OSError`` / ``TimeoutError`` (connection, a timeout), as the
        same object with notes naming the URL, the attempts made and the stage; the secrets of
        the URL (credentials, signed-URL parameters) are masked in its message, its
        ``request_info`` and its notes (``https://***@host/a?X-Amz-Signature=***``).
        :class:`~datapipes.errors.SizeLimitError` (a ``ValueError``): a Content-Length over
        ``max_size`` (at open, so ``skip_on_error`` skips it) or a body that grows past it (while
        reading). EOFError: a body that ends short of its Content-Length.
        ``aiohttp.NonHttpUrlRedirectClientError``: a redirect to a URL that is not http(s)
        (``file://`` is never followed). ValueError: a URL that is not http(s). TypeError: an item
        that is not a str.

    Implemented on fsspec's HTTP file system (aiohttp) rather than requests; ``len()`` is the
    source's length (unknown with ``skip_on_error=True``).

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> IterableWrapper(["https://example.com/a.txt"]).read_from_http(timeout=30)
        IterableWrapper -> HttpReader

    See also: :class:`OnlineReader`, :class:`~datapipes.iter.FSSpecFileOpener`.
    """

    _saves = "nothing: at a boundary their position is their source's"

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        timeout: float | tuple[float | None, float | None] | None = TIMEOUT,
        skip_on_error: bool = False,
        *,
        retries: int = 3,
        backoff: float = 0.5,
        max_size: int | None = MAX_SIZE,
        **kwargs: Any,
    ) -> None:
        self._setup("HttpReader", source_datapipe, timeout, skip_on_error, retries, backoff, max_size, kwargs)


@functional_datapipe("read_from_remote")
class OnlineReader(_HttpBase):
    """GET each HTTP(S) URL and yield ``(url, stream)`` pairs (functional name: ``read_from_remote``).

    The same reader as :class:`HttpReader`, with torchdata's keyword-only ``timeout`` and
    ``skip_on_error``. Google Drive links are fetched as any URL: the confirmation page Google
    serves for large files is not followed (torchdata's OnlineReader follows it).

    Args:
        source_datapipe: a pipe of ``http://`` or ``https://`` URLs (or a list of them).
        timeout: as :class:`HttpReader`'s (default :data:`TIMEOUT`: 30 s to connect, 60 s per read).
        skip_on_error: as :class:`HttpReader`'s.
        retries: as :class:`HttpReader`'s.
        backoff: as :class:`HttpReader`'s.
        max_size: as :class:`HttpReader`'s (default :data:`MAX_SIZE`, 16 GiB).
        **kwargs: request options, as :class:`HttpReader`'s.

    Yields:
        ``(url, stream)`` pairs, as :class:`HttpReader`.

    Raises:
        As :class:`HttpReader`.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> IterableWrapper(["https://example.com/a.txt"]).read_from_remote()
        IterableWrapper -> OnlineReader

    See also: :class:`HttpReader`.
    """

    _saves = "nothing: at a boundary their position is their source's"

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        *,
        timeout: float | tuple[float | None, float | None] | None = TIMEOUT,
        skip_on_error: bool = False,
        retries: int = 3,
        backoff: float = 0.5,
        max_size: int | None = MAX_SIZE,
        **kwargs: Any,
    ) -> None:
        self._setup("OnlineReader", source_datapipe, timeout, skip_on_error, retries, backoff, max_size, kwargs)
