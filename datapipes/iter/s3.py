"""torchdata's S3 pipes on fsspec: S3FileLister [list_files_by_s3] and S3FileLoader
[load_files_by_s3].

torchdata built them on its own AWS SDK extension (``BUILD_S3=1``). Here they are
:class:`~datapipes.iter.FSSpecFileLister` and :class:`~datapipes.iter.FSSpecFileOpener` over the
``s3`` protocol of fsspec, which s3fs provides (``pip install 'datapipes[remote]'``), with
torchdata's parameters mapped onto s3fs's storage options:

- ``region`` -> ``client_kwargs={"region_name": region}``;
- ``request_timeout_ms`` -> ``config_kwargs={"connect_timeout": s, "read_timeout": s}``
  (botocore's ``Config``, in seconds);
- ``buffer_size`` -> ``block_size`` of each opened file (the bytes fetched per ranged request).

Any other keyword goes to s3fs as it is (``anon=True``, ``endpoint_url=...``, ``profile=...``,
``key=``/``secret=``); credentials and the region are otherwise found as boto finds them (the
``AWS_*`` environment variables, ``~/.aws/config``). Listing and opening are those of the fsspec
pipes: transient errors retried with backoff, errors naming the URL, positions saved and resumed.

Both pipes take only ``s3://`` URLs and say which one is not. A pipe is a description that needs no
s3fs to be built or pickled; iterating one without s3fs installed raises ``ImportError`` naming the
``datapipes[remote]`` extra at once, at ``iter(pipe)``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

from .._checks import require_bool
from .._redact import redact
from .._runtime.passes import Pass
from ..datapipe import IterDataPipe, functional_datapipe, len_unknown, require_int, stage_label
from ..errors import WARN_FAILURES, _OnError
from .fileio import StreamWrapper, _check_masks, _ListRun, _open_pass, _paths_pipe, _roots_pipe
from .remote import FSSpecFileLister, FSSpecFileOpener, _check_kwargs_for_open, _check_retries, _fsspec_list, _fsspec_opener

__all__ = ["S3FileLister", "S3FileLoader"]

_SCHEME = "s3://"


# -- shared pieces ---------------------------------------------------------------------------------


def _require_s3fs(stage: str) -> None:
    """Raise ``ImportError`` naming the extra unless fsspec can reach the ``s3`` protocol."""
    import fsspec

    try:
        fsspec.get_filesystem_class("s3")
    except (ImportError, ValueError) as e:
        raise ImportError(
            f"{stage}: s3:// URLs need s3fs, which is not installed: pip install 'datapipes[remote]' "
            f"(or pip install s3fs)"
        ) from e


def _check_s3_url(url: Any, stage: str) -> Any:
    """``url`` itself when it is an ``s3://bucket[/key]`` URL; ``TypeError``/``ValueError`` naming
    ``stage`` and the URL otherwise."""
    if not isinstance(url, str):
        raise TypeError(f"{stage}: each URL must be a str, got {type(url).__name__}: {redact(repr(url)):.100}")
    if not url.startswith(_SCHEME):
        raise ValueError(f"{stage}: expects s3:// URLs (s3://bucket/key), got {redact(repr(url)):.200}")
    if not url[len(_SCHEME):].split("/", 1)[0]:
        raise ValueError(f"{stage}: the URL {redact(repr(url)):.200} names no bucket (s3://bucket/key)")
    return url


class _CheckedURLs:
    """The URLs of an upstream iterator, each checked to be an ``s3://`` URL as it is pulled;
    ``close()`` closes the upstream (so a failing pass releases it)."""

    __slots__ = ("_it", "_stage")

    def __init__(self, it: Iterator[Any], stage: str) -> None:
        self._it = it
        self._stage = stage

    def __iter__(self) -> _CheckedURLs:
        return self

    def __next__(self) -> Any:
        return _check_s3_url(next(self._it), self._stage)

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


def _merge(options: dict[str, Any], key: str, values: dict[str, Any], stage: str, param: str) -> None:
    """Add ``values`` to the dict ``options[key]`` (a copy of the caller's); a key the caller gave a
    different value raises ``ValueError`` naming both spellings."""
    given = options.get(key)
    if given is None:
        merged: dict[str, Any] = {}
    elif isinstance(given, dict):
        merged = dict(given)
    else:
        raise TypeError(f"{stage}: {key} must be a dict, got {type(given).__name__}")
    for name, value in values.items():
        if name in merged and merged[name] != value:
            raise ValueError(
                f"{stage}: {param} sets {key}[{name!r}] to {value!r}, but {key} gives {merged[name]!r}; pass one of them"
            )
        merged[name] = value
    options[key] = merged


def _s3_storage_options(
    stage: str, request_timeout_ms: Any, region: Any, storage_options: dict[str, Any]
) -> dict[str, Any]:
    """s3fs's storage options for torchdata's ``request_timeout_ms`` and ``region``, merged into
    the caller's own ``storage_options``."""
    require_int(request_timeout_ms, stage, "request_timeout_ms", minimum=-1)
    if request_timeout_ms == 0:
        raise ValueError(f"{stage}: request_timeout_ms must be -1 (s3fs's default) or a positive number of ms, got 0")
    if not isinstance(region, str):
        raise TypeError(f"{stage}: region must be a str ('' for the configured one), got {type(region).__name__}")
    options = dict(storage_options)
    if region:
        _merge(options, "client_kwargs", {"region_name": region}, stage, "region")
    if request_timeout_ms > 0:
        seconds = request_timeout_ms / 1000
        _merge(options, "config_kwargs", {"connect_timeout": seconds, "read_timeout": seconds}, stage, "request_timeout_ms")
    return options


# -- S3FileLister ----------------------------------------------------------------------------------


def _s3_list(pipe: FSSpecFileLister, roots: Iterator[Any], run: _ListRun) -> Iterator[str]:
    return _fsspec_list(pipe, _CheckedURLs(roots, stage_label(pipe)), run)


@functional_datapipe("list_files_by_s3")
class S3FileLister(FSSpecFileLister):
    """List the objects under ``s3://`` prefixes (functional name: ``list_files_by_s3``).

    torchdata's pipe on fsspec and s3fs: an :class:`FSSpecFileLister` that takes only ``s3://``
    URLs, lists recursively by default (as S3's listing of a prefix does) and maps torchdata's
    ``request_timeout_ms`` and ``region`` onto s3fs's options.

    Args:
        source_datapipe: ``s3://bucket``, ``s3://bucket/folder`` or ``s3://bucket/folder/`` URLs:
            an ``IterDataPipe`` of them, a list, or one URL. A URL naming an object lists itself.
        length: the nominal ``len()`` (``-1``: unknown, as torchdata).
        request_timeout_ms: the connect and read timeout of each request, in milliseconds
            (``-1``: s3fs's defaults).
        region: the bucket's region (``""``: the one configured, e.g. ``AWS_REGION``).
        masks: glob pattern(s) the object's *name* (the last part of its key) must match.
        recursive: list the objects under sub-folders too (default, as torchdata); ``False``: only
            those directly under each prefix.
        retries, backoff: how often and after how long a transient error is retried
            (:class:`FSSpecFileLister`).
        **storage_options: passed to s3fs (``anon=True``, ``endpoint_url=...``, ``profile=...``);
            ``region`` and ``request_timeout_ms`` are merged into its ``client_kwargs`` and
            ``config_kwargs``.

    Yields:
        ``s3://bucket/key`` URLs of the objects, sorted by key within each prefix.

    Raises:
        ImportError: at ``iter(pipe)``, when s3fs is not installed (``datapipes[remote]``).
        ValueError: a URL that is not ``s3://bucket/...`` (the message names the stage and the URL).
        FileNotFoundError: a prefix under which there is nothing (torchdata yields nothing), with
        notes naming the URL and the stage; other errors of s3fs pass through the same way.

    Differs from torchdata: ``masks`` match the object's name, as in ``list_files``, not the whole
    URL; a prefix is a folder (``s3://bucket/data/part-`` does not list ``data/part-0.csv``: use
    ``s3://bucket/data`` with ``masks="part-*"``).

    ``len()`` is ``length`` when given; otherwise ``TypeError``.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper(["s3://bucket/folder/"]).list_files_by_s3(region="eu-west-1", masks="*.csv")
        >>> pipe.storage_options  # what s3fs gets (iterating needs s3fs and credentials: not run here)
        {'client_kwargs': {'region_name': 'eu-west-1'}}

    See also: :class:`S3FileLoader`, :class:`FSSpecFileLister` for any fsspec URL.
    """

    _saves = "same as list_files"

    def __init__(
        self,
        source_datapipe: str | Sequence[str] | IterDataPipe[str],
        length: int = -1,
        request_timeout_ms: int = -1,
        region: str = "",
        masks: str | list[str] = "",
        *,
        recursive: bool = True,
        retries: int = 3,
        backoff: float = 0.5,
        **storage_options: Any,
    ) -> None:
        stage = "S3FileLister"
        # Checked here so that errors name this stage (FSSpecFileLister checks the same).
        source = _roots_pipe(source_datapipe, stage, (str,))
        if not isinstance(source_datapipe, IterDataPipe):
            for url in [source_datapipe] if isinstance(source_datapipe, str) else source_datapipe:
                _check_s3_url(url, stage)
        require_int(length, stage, "length", minimum=-1)
        _check_masks(masks, stage)
        require_bool(recursive, stage, "recursive")
        _check_retries(retries, backoff, stage)
        options = _s3_storage_options(stage, request_timeout_ms, region, storage_options)
        super().__init__(source, masks, recursive=recursive, retries=retries, backoff=backoff, **options)
        self.length = length
        self.request_timeout_ms = request_timeout_ms
        self.region = region
        self._run = _s3_list

    def _open(self, ctx: Pass) -> Iterator[str]:
        _require_s3fs(stage_label(self))
        return super()._open(ctx)

    def __len__(self) -> int:
        if self.length == -1:
            raise len_unknown(self, "the number of objects is known only after listing (pass length= to set it)")
        return self.length


# -- S3FileLoader ----------------------------------------------------------------------------------


def _s3_opener(pipe: S3FileLoader) -> Callable[[Any], Any]:
    stage = stage_label(pipe)
    open_url = _fsspec_opener(pipe)

    def open_s3(url: Any) -> Any:
        return open_url(_check_s3_url(url, stage))

    return open_s3


@functional_datapipe("load_files_by_s3")
class S3FileLoader(FSSpecFileOpener):
    """Open ``s3://`` URLs and yield ``(url, stream)`` pairs (functional name: ``load_files_by_s3``).

    torchdata's pipe on fsspec and s3fs: an :class:`FSSpecFileOpener` in binary mode that takes
    only ``s3://`` URLs and maps torchdata's parameters onto s3fs's options.

    Args:
        source_datapipe: a pipe of ``s3://bucket/key`` URLs (e.g. :class:`S3FileLister`), or a list.
        request_timeout_ms: the connect and read timeout of each request, in milliseconds
            (``-1``: s3fs's defaults).
        region: the bucket's region (``""``: the one configured, e.g. ``AWS_REGION``).
        buffer_size: the bytes fetched per ranged request as the stream is read (s3fs's
            ``block_size``; ``None``: s3fs's default, 50 MiB).
        multi_part_download: accepted for torchdata's signature (``None``, ``True`` or ``False``);
            s3fs fetches a file's blocks one request at a time, so it changes nothing.
        kwargs_for_open: other keyword arguments for s3fs's ``open`` (``cache_type``,
            ``version_id``, ...).
        retries, backoff: how often and after how long a transient error is retried, at open and
            at every read (a read retried mid-file resumes at the same byte).
        on_error, max_failures, warn_failures: ``"skip"`` skips (and counts in ``pipe.failures``) a
            URL that cannot be opened, as :class:`FSSpecFileOpener`.
        **storage_options: passed to s3fs (``anon=True``, ``endpoint_url=...``, ``profile=...``);
            ``region`` and ``request_timeout_ms`` are merged into its ``client_kwargs`` and
            ``config_kwargs``.

    Yields:
        ``(url, stream)``: the URL and a binary :class:`StreamWrapper` over the object, read
        lazily (torchdata read each object whole into a ``BytesIO``); streams are closed as
        :class:`FileOpener`'s are.

    Raises:
        ImportError: at ``iter(pipe)``, when s3fs is not installed (``datapipes[remote]``).
        ValueError: a URL that is not ``s3://bucket/key``, with a note naming the stage.
        s3fs's errors (``FileNotFoundError``, ``PermissionError``, ...) as the same objects, with
        notes naming the URL and the stage.

    ``len()`` is the source's length (unknown with ``on_error="skip"``).

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper(["s3://bucket/a.bin"]).load_files_by_s3(request_timeout_ms=5000, buffer_size=1 << 20)
        >>> pipe.storage_options, pipe.kwargs_for_open  # what s3fs gets (iterating is not run here)
        ({'config_kwargs': {'connect_timeout': 5.0, 'read_timeout': 5.0}}, {'block_size': 1048576})

    See also: :class:`S3FileLister`, :class:`FSSpecFileOpener` for any fsspec URL.
    """

    _saves = "same as open_files"

    _repr_fields = ()  # type: ignore[assignment]  # always binary: no mode to show

    def __init__(
        self,
        source_datapipe: IterDataPipe[str] | Sequence[str],
        request_timeout_ms: int = -1,
        region: str = "",
        buffer_size: int | None = None,
        multi_part_download: bool | None = None,
        *,
        kwargs_for_open: dict[str, Any] | None = None,
        retries: int = 3,
        backoff: float = 0.5,
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        **storage_options: Any,
    ) -> None:
        stage = "S3FileLoader"
        # Checked here so that errors name this stage (FSSpecFileOpener checks the same).
        if isinstance(source_datapipe, (list, tuple)):
            for url in source_datapipe:
                _check_s3_url(url, stage)
        source = _paths_pipe(source_datapipe, stage, "source_datapipe")
        require_int(buffer_size, stage, "buffer_size", minimum=1, optional=True)
        if multi_part_download is not None:
            require_bool(multi_part_download, stage, "multi_part_download")
        open_kwargs = _check_kwargs_for_open(kwargs_for_open, stage)
        if buffer_size is not None:
            _merge_block_size(open_kwargs, buffer_size, stage)
        _check_retries(retries, backoff, stage)
        options = _s3_storage_options(stage, request_timeout_ms, region, storage_options)
        super().__init__(
            source, "rb", kwargs_for_open=open_kwargs, retries=retries, backoff=backoff,
            on_error=on_error, max_failures=max_failures, warn_failures=warn_failures, **options,
        )
        self.request_timeout_ms = request_timeout_ms
        self.region = region
        self.buffer_size = buffer_size
        self.multi_part_download = multi_part_download

    def _open(self, ctx: Pass) -> Iterator[tuple[str, StreamWrapper]]:
        _require_s3fs(stage_label(self))
        return _open_pass(self, ctx, self.source_datapipe, _s3_opener(self))

    def _reopener(self) -> Callable[[Any, int], StreamWrapper]:
        open_s3 = _s3_opener(self)
        return lambda url, n: StreamWrapper(open_s3(url), url)


def _merge_block_size(open_kwargs: dict[str, Any], buffer_size: int, stage: str) -> None:
    given = open_kwargs.get("block_size")
    if given is not None and given != buffer_size:
        raise ValueError(
            f"{stage}: buffer_size={buffer_size!r} and kwargs_for_open['block_size']={given!r} disagree; pass one of them"
        )
    open_kwargs["block_size"] = buffer_size
