"""HTTP(S) downloads: HttpReader [read_from_http] and OnlineReader [read_from_remote], on fsspec's
HTTP file system.

Streams follow the rules of :mod:`datapipes.iter.fileio` (when a stream is closed); reads are
retried as :mod:`datapipes.iter.remote` retries them.

**Checkpoints.** Neither stage keeps a position of its own (one stream per URL).
"""

from __future__ import annotations

import base64
import io
import warnings
from typing import Any, Callable, Iterator

from ..._checks import require_bool
from ...datapipe import IterDataPipe, functional_datapipe, stage_label
from ...errors import policy_and_log
from ..fileio import StreamWrapper, _open_pass, _opened_len, _paths_pipe
from ..remote import _check_retries, _RetryingReader, _url_note

__all__ = ["HttpReader", "OnlineReader"]


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
    on connecting and on each read, never on the whole download."""
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


def _http_opener(pipe: Any) -> Callable[[Any], Any]:
    """``open_url(url)``: a binary stream over the body of a GET of ``url`` (fsspec's HTTP file
    system, streamed: one request), retried as :class:`~datapipes.iter.FSSpecFileOpener` retries."""
    import fsspec

    stage = stage_label(pipe)
    fs = fsspec.filesystem("http", client_kwargs={"timeout": _client_timeout(pipe.timeout)})
    # block_size=0: a streamed GET; a size given: fsspec skips the HEAD it sends to learn the size
    # (a stream has no use for it), so a download is one request, as with requests in torchdata.
    kw = {**_request_kwargs(pipe.query_params), "block_size": 0, "size": -1}
    retries, backoff, skip = pipe.retries, pipe.backoff, pipe.skip_on_error

    def open_url(url: Any) -> Any:
        try:
            if not isinstance(url, str):
                raise TypeError(f"{stage}: each URL must be a str, got {type(url).__name__}: {url!r:.100}")
            if not url.lower().startswith(("http://", "https://")):
                raise ValueError(f"{stage}: not an http(s) URL: {url!r:.200} (open_files_by_fsspec reads other URLs)")
            if retries == 0:
                try:
                    return fs.open(url, "rb", **kw)
                except Exception as e:
                    _url_note(e, "opening", url, 1)
                    raise
            return io.BufferedReader(_RetryingReader(fs, url, url, kw, retries, backoff))
        except Exception as e:
            if skip:
                warnings.warn(f"{e}, skipping...", stacklevel=2)
            raise

    return open_url


class _HttpBase(IterDataPipe[tuple[str, StreamWrapper]]):
    def _setup(self, stage: str, source_datapipe: Any, timeout: Any, skip_on_error: Any, retries: Any, backoff: Any,
               kwargs: dict[str, Any]) -> None:
        self.source_datapipe = _paths_pipe(source_datapipe, stage, "source_datapipe")
        _check_timeout(timeout, stage)
        require_bool(skip_on_error, stage, "skip_on_error")
        _check_retries(retries, backoff, stage)
        self.timeout = timeout
        self.skip_on_error = skip_on_error
        self.retries = retries
        self.backoff = backoff
        self.query_params = kwargs
        self._policy, self.failures = policy_and_log(self, "skip" if skip_on_error else "raise", None)
        self._stateless = True  # one stream per URL: its position is its source's

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        return _open_pass(self, self.source_datapipe, _http_opener(self))

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
        timeout: seconds allowed to connect and for each read (not the whole download), or a
            ``(connect, read)`` pair, as in requests; ``None`` (default): no limit.
        skip_on_error: skip a URL that fails (after its retries) with a warning ("..., skipping..."),
            counted in ``pipe.failures``; otherwise the error is raised.
        retries: how many times a transient error (connection reset, timeout, HTTP 5xx/408/429)
            is retried, at the request and at every read; a read retried mid-body requests the URL
            again and skips what was read. HTTP 404 and other 4xx are never retried.
        backoff: the first retry's delay in seconds, doubled at each further retry.
        **kwargs: request options, as requests names them: ``headers``, ``params``, ``cookies``,
            ``auth=(user, password)``, ``allow_redirects``, ``verify=False``.

    Yields:
        ``(url, stream)``: the URL and a :class:`StreamWrapper` over a binary stream of the body,
        read as it is consumed (one request per URL; it cannot seek). Streams are closed by the
        rule of :mod:`datapipes.iter.fileio`.

    Raises:
        FileNotFoundError (HTTP 404), ``aiohttp.ClientResponseError`` (other statuses),
        ``aiohttp.ClientError`` / ``OSError`` / ``TimeoutError`` (connection), as the same object
        with notes naming the URL, the attempts made and the stage. ValueError: a URL that is not
        http(s). TypeError: an item that is not a str.

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
        timeout: float | None = None,
        skip_on_error: bool = False,
        *,
        retries: int = 3,
        backoff: float = 0.5,
        **kwargs: Any,
    ) -> None:
        self._setup("HttpReader", source_datapipe, timeout, skip_on_error, retries, backoff, kwargs)


@functional_datapipe("read_from_remote")
class OnlineReader(_HttpBase):
    """GET each HTTP(S) URL and yield ``(url, stream)`` pairs (functional name: ``read_from_remote``).

    The same reader as :class:`HttpReader`, with torchdata's keyword-only ``timeout`` and
    ``skip_on_error``. Google Drive links are fetched as any URL: the confirmation page Google
    serves for large files is not followed (torchdata's OnlineReader follows it).

    Args:
        source_datapipe: a pipe of ``http://`` or ``https://`` URLs (or a list of them).
        timeout: as :class:`HttpReader`'s.
        skip_on_error: as :class:`HttpReader`'s.
        retries: as :class:`HttpReader`'s.
        backoff: as :class:`HttpReader`'s.
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
        timeout: float | None = None,
        skip_on_error: bool = False,
        retries: int = 3,
        backoff: float = 0.5,
        **kwargs: Any,
    ) -> None:
        self._setup("OnlineReader", source_datapipe, timeout, skip_on_error, retries, backoff, kwargs)
