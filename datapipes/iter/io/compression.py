"""Compressed files: Decompressor [decompress] and the readers it opens (gzip, bz2, xz, zstd);
single compressed files and archives by their kind: Bz2FileLoader [load_from_bz2], XzFileLoader
[load_from_xz], Extractor [extract] (the archive readers are :mod:`datapipes.iter.archive`'s).

**Checkpoints.** ``decompress``, ``load_from_bz2`` and ``load_from_xz`` keep no position of their own
(one reader per item); ``extract`` saves the archive it is reading, as ``load_from_tar`` does.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
from typing import Any, Callable, Iterator

from ..._engine import abandon
from ..._engine import close_iterator as _close
from ..._runtime.passes import Pass
from ...datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_int, require_pipe, source_len, stage_label
from ...errors import add_stage_note, policy_and_log
from ..archive import MAX_MEMBER_SIZE, _check_limit, _tar, _zip
from ..fileio import StreamWrapper
from .._readers import _REWRAP, _pair, _read_run, _reopener, set_origin

__all__ = ["Bz2FileLoader", "Decompressor", "Extractor", "XzFileLoader"]


# -- decompression ---------------------------------------------------------------------------------


class _Reading:
    """Mixin of the decompressing readers: closing one closes the compressed stream under it, and
    an error while reading gets a note naming the stage and the file."""

    _dp_source: Any = None
    _dp_note: tuple[str, int, str] | None = None
    _dp_format: str | None = None  # the key of _OPENERS that made it

    def _dp_failed(self, exc: BaseException) -> None:
        if self._dp_note is not None:
            stage, position, what = self._dp_note
            add_stage_note(exc, stage, position, what)

    def read(self, size: Any = -1) -> bytes:
        try:
            return super().read(size)  # type: ignore[misc]
        except Exception as e:
            self._dp_failed(e)
            raise

    def read1(self, size: Any = -1) -> bytes:
        try:
            return super().read1(size)  # type: ignore[misc]
        except Exception as e:
            self._dp_failed(e)
            raise

    def readinto(self, b: Any) -> int:
        try:
            return super().readinto(b)  # type: ignore[misc]
        except Exception as e:
            self._dp_failed(e)
            raise

    def readline(self, size: Any = -1) -> bytes:
        try:
            return super().readline(size)  # type: ignore[misc]
        except Exception as e:
            self._dp_failed(e)
            raise

    def close(self) -> None:
        try:
            super().close()  # type: ignore[misc]
        finally:
            source = self._dp_source
            if source is not None:
                self._dp_source = None
                _close(source)


class _GzipReader(_Reading, gzip.GzipFile):
    pass


class _BZ2Reader(_Reading, bz2.BZ2File):
    pass


class _XZReader(_Reading, lzma.LZMAFile):
    pass


class _ZstdReader(_Reading, io.BufferedReader):
    pass


class _ZstdRaw(io.RawIOBase):
    """zstd decompression as a raw stream: frame after frame, and ``EOFError`` when the input ends
    inside a frame (``zstandard``'s own stream reader returns the truncated data silently)."""

    _CHUNK = 1 << 14  # compressed bytes fed at a time: bounds the memory of one decompress call

    def __init__(self, source: Any, zstandard: Any) -> None:
        self._source = source
        self._new = zstandard.ZstdDecompressor().decompressobj
        self._dec = self._new()
        self._in_frame = False
        self._out = b""
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while self._pos >= len(self._out):
            chunk = self._source.read(self._CHUNK)
            if not chunk:
                if self._in_frame:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                return 0
            self._feed(chunk)
        n = min(len(b), len(self._out) - self._pos)
        b[:n] = self._out[self._pos : self._pos + n]
        self._pos += n
        return n

    def _feed(self, chunk: bytes) -> None:
        out = []
        while chunk:
            self._in_frame = True
            out.append(self._dec.decompress(chunk))
            chunk = b""
            if self._dec.eof:  # a frame ended; what follows is the next frame
                chunk = self._dec.unused_data
                self._dec = self._new()
                self._in_frame = False
        self._out = b"".join(out)
        self._pos = 0

    def close(self) -> None:
        try:
            super().close()
        finally:
            _close(self._source)


def _zstd_module() -> Any:
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard


def _open_gzip(source: Any) -> Any:
    return _GzipReader(fileobj=source, mode="rb")


def _open_bz2(source: Any) -> Any:
    return _BZ2Reader(source, "rb")


def _open_xz(source: Any) -> Any:
    return _XZReader(source, "rb")


def _open_zstd(source: Any) -> Any:
    zstandard = _zstd_module()
    if zstandard is None:
        raise ModuleNotFoundError(_ZSTD_MISSING, name="zstandard")
    return _ZstdReader(_ZstdRaw(source, zstandard))


_ZSTD_MISSING = "reading zstd needs the 'zstandard' package (pip install zstandard)"

_OPENERS: dict[str, Callable[[Any], Any]] = {"gzip": _open_gzip, "bz2": _open_bz2, "xz": _open_xz, "zstd": _open_zstd}
_ALIASES = {
    "gzip": "gzip", "gz": "gzip", "bz2": "bz2", "bzip2": "bz2", "xz": "xz", "lzma": "xz", "zstd": "zstd", "zst": "zstd",
}
_EXTENSIONS = (
    (".gz", "gzip"), (".tgz", "gzip"), (".bz2", "bz2"), (".tbz2", "bz2"), (".tbz", "bz2"),
    (".xz", "xz"), (".txz", "xz"), (".lzma", "xz"), (".zst", "zstd"), (".zstd", "zstd"),
)


def _detect(path: Any, stage: str) -> str:
    name = str(path).lower()
    for ext, fmt in _EXTENSIONS:
        if name.endswith(ext):
            return fmt
    raise ValueError(
        f"{stage}: cannot tell the compression of {path!r} from its extension "
        f"({', '.join(e for e, _ in _EXTENSIONS)}); pass file_type='gzip', 'bz2', 'xz' or 'zstd'"
    )


def _decompressing(fmt: str, stream: Any) -> Any:
    """A reader decompressing ``stream`` (``fmt``: a key of ``_OPENERS``); closing it closes ``stream``."""
    try:
        reader = _OPENERS[fmt](stream)
    except BaseException:
        _close(stream)
        raise
    reader._dp_source = stream
    reader._dp_format = fmt  # with _dp_source: how a reader's state copies it when in memory (_readers._memory_copy)
    return reader


_REWRAP["decompressed"] = _decompressing


def _decompressed(pipe: Decompressor, stage: str, path: Any, stream: Any, n: int) -> Any:
    """The reader of item ``n``, ``(path, stream)``, with a note naming the stage and the file on
    its errors; ``stream`` is closed if it cannot be made."""
    try:
        try:
            fmt = pipe._format or _detect(path, stage)
        except BaseException:
            _close(stream)
            raise
        reader = _decompressing(fmt, stream)
    except Exception as e:
        add_stage_note(e, stage, n, f"file {path!r}, item")
        raise
    reader._dp_note = (stage, n, f"file {path!r}, item")
    return reader


def _decompress(pipe: Decompressor, it: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
    stage = stage_label(pipe)
    n = -1
    try:
        for item in it:
            n += 1
            path, stream = _pair(item, stage, n)
            yield path, set_origin(_decompressed(pipe, stage, path, stream, n), pipe, path, n)
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


@functional_datapipe("decompress")
class Decompressor(IterDataPipe[tuple[Any, Any]]):
    """Decompress the streams of ``(path, stream)`` pairs (functional name: ``decompress``).

    Args:
        source_datapipe: a pipe of ``(path, binary stream)`` pairs.
        file_type: ``"gzip"`` (``"gz"``), ``"bz2"``, ``"xz"`` (``"lzma"``) or ``"zstd"`` (needs the
            ``zstandard`` package); ``None`` (default): from each path's extension (``.gz``,
            ``.tgz``, ``.bz2``, ``.xz``, ``.lzma``, ``.zst``, ...). Tar and zip archives are read by
            :class:`TarArchiveLoader` (which also decompresses ``.tar.gz``) and
            :class:`ZipArchiveLoader`.

    Yields:
        ``(path, reader)``: the path unchanged (as torchdata) and a binary stream that decompresses
        lazily as it is read. Closing the reader closes the compressed stream.

    Raises:
        ValueError: the compression of a path cannot be told from its extension (raised when that
        item is reached). ModuleNotFoundError: zstd without the ``zstandard`` package.
        Errors of the compressed data (``EOFError`` for a truncated file, ``gzip.BadGzipFile``,
        ``lzma.LZMAError``, ...) are raised when the reader is read, with a note naming this stage
        and the file; a parser reading the stream adds the line.

    ``len()`` is the source's length.

    Example:
        >>> import gzip, io
        >>> from datapipes.iter import IterableWrapper
        >>> files = IterableWrapper([("a.txt.gz", io.BytesIO(gzip.compress(b"x\\ny\\n")))])
        >>> list(files.decompress().readlines(return_path=False))
        [b'x', b'y']

    See also: :class:`TarArchiveLoader`, :class:`~datapipes.iter.LineReader`.
    """

    _saves = (
        "nothing: one lazy reader per item; the reader below it keeps the position. A reader stopped inside a "
        "file that ``load_from_bz2``/``load_from_xz`` decompressed from a file cannot save it (``TypeError``: "
        "the renamed path cannot be opened again); ``decompress`` keeps the path"
    )

    _stateless = True  # one lazy reader per item (its consumer keeps its position): the position is its source's

    def __init__(self, source_datapipe: IterDataPipe[tuple[Any, Any]], file_type: str | None = None) -> None:
        stage = "Decompressor"
        require_pipe(source_datapipe, stage, "source_datapipe")
        fmt = None
        if file_type is not None:
            if not isinstance(file_type, str):
                raise TypeError(f"{stage}: file_type must be a str or None, got {type(file_type).__name__}")
            low = file_type.lower()
            if low in ("tar", "zip"):
                raise ValueError(
                    f"{stage}: file_type={file_type!r} is an archive: read it with load_from_tar() or load_from_zip()"
                )
            fmt = _ALIASES.get(low)
            if fmt is None:
                raise ValueError(f"{stage}: file_type must be one of {sorted(_ALIASES)} or None, got {file_type!r}")
            if fmt == "zstd" and _zstd_module() is None:
                raise ModuleNotFoundError(f"{stage}: file_type={file_type!r}: {_ZSTD_MISSING}", name="zstandard")
        self.source_datapipe = source_datapipe
        self.file_type = file_type
        self._format = fmt

    def _open(self, ctx: Pass) -> Iterator[tuple[Any, Any]]:
        return _decompress(self, ctx.open(self.source_datapipe))

    def _reopener(self) -> Callable[[Any, int], Any] | None:
        """How a reader of this stage's items opens one again by its path: through the source's own
        (an opener's), decompressed again; ``None`` where the source has none."""
        reopen = _reopener(self.source_datapipe)
        if reopen is None:
            return None
        stage = stage_label(self)
        return lambda path, n: _decompressed(self, stage, path, reopen(path, n), n)

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")


# -- Bz2FileLoader / XzFileLoader ------------------------------------------------------------------


def _reader(stage: str, fmt: str, path: Any, stream: Any, n: int) -> Any:
    """A reader decompressing item ``n``'s ``stream`` (closing it closes ``stream``), whose errors get
    a note naming the stage and the file."""
    try:
        reader = _decompressing(fmt, stream)
    except Exception as e:
        add_stage_note(e, stage, n, f"file {path!r}, item")
        raise
    reader._dp_note = (stage, n, f"file {path!r}, item")
    return reader


def _load_compressed(pipe: Any, it: Iterator[Any]) -> Iterator[tuple[Any, StreamWrapper]]:
    stage = stage_label(pipe)
    fmt, suffix = pipe._format, pipe._suffix
    n = -1
    try:
        for item in it:
            n += 1
            path, stream = _pair(item, stage, n)
            name = path[: -len(suffix)] if isinstance(path, str) and path.endswith(suffix) else path
            yield name, set_origin(StreamWrapper(_reader(stage, fmt, path, stream, n), name), pipe, path, n)
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


class _CompressedLoader(IterDataPipe[tuple[str, StreamWrapper]]):
    _format = ""
    _suffix = ""
    _stateless = True  # one lazy reader per item (its consumer keeps its position): the position is its source's

    def __init__(self, datapipe: IterDataPipe[tuple[str, Any]], length: int = -1) -> None:
        stage = type(self).__name__
        require_pipe(datapipe, stage)
        require_int(length, stage, "length", minimum=-1)
        self.datapipe = datapipe
        self.length = length

    def _open(self, ctx: Pass) -> Iterator[tuple[str, StreamWrapper]]:
        return _load_compressed(self, ctx.open(self.datapipe))

    def _origin_reopener(self) -> Callable[[Any, int], Any] | None:
        """How a pass state holding one of this stage's readers opens it again by the compressed
        file's path (the items carry the path without the suffix, so readers downstream cannot)."""
        reopen = _reopener(self.datapipe)
        if reopen is None:
            return None
        stage, fmt = stage_label(self), self._format
        return lambda path, n: _reader(stage, fmt, path, reopen(path, n), n)

    def __len__(self) -> int:
        if self.length != -1:
            return self.length
        return source_len(self, self.datapipe)


@functional_datapipe("load_from_bz2")
class Bz2FileLoader(_CompressedLoader):
    """Decompress the bzip2 streams of ``(path, stream)`` pairs (functional name: ``load_from_bz2``).

    Args:
        datapipe: a pipe of ``(path, binary stream)`` pairs, e.g. ``open_files(mode="b")``.
        length: the nominal ``len()`` (``-1``: the source's length).

    Yields:
        ``(path without ".bz2", stream)``: a :class:`StreamWrapper` over a reader that decompresses
        as it is read; closing it closes the compressed stream.

    Raises:
        OSError ("Invalid data stream") or EOFError (a truncated file), raised when the stream is
        read, with a note naming the stage and the file. TypeError: an item is not a
        ``(path, stream)`` pair.

    Checkpoint: a reader downstream that stops inside a decompressed stream copies it into the
    state when the compressed stream is in memory; over a file, ``state_dict()`` raises
    ``TypeError`` (the renamed path cannot be opened again): read with ``decompress()``, which
    keeps the path, to resume inside files.

    Example:
        >>> import bz2, io
        >>> from datapipes.iter import IterableWrapper
        >>> files = IterableWrapper([("a.txt.bz2", io.BytesIO(bz2.compress(b"hello")))])
        >>> [(path, stream.read()) for path, stream in files.load_from_bz2()]
        [('a.txt', b'hello')]

    See also: :class:`XzFileLoader`, :class:`~datapipes.iter.Decompressor`.
    """

    _saves = "same as decompress"

    _format = "bz2"
    _suffix = ".bz2"


@functional_datapipe("load_from_xz")
class XzFileLoader(_CompressedLoader):
    """Decompress the xz/lzma streams of ``(path, stream)`` pairs (functional name: ``load_from_xz``).

    Args:
        datapipe: a pipe of ``(path, binary stream)`` pairs, e.g. ``open_files(mode="b")``.
        length: the nominal ``len()`` (``-1``: the source's length).

    Yields:
        ``(path without ".xz", stream)``: a :class:`StreamWrapper` over a reader that decompresses
        as it is read; closing it closes the compressed stream.

    Raises:
        lzma.LZMAError (corrupt data) or EOFError (a truncated file), raised when the stream is
        read, with a note naming the stage and the file. TypeError: an item is not a
        ``(path, stream)`` pair.

    Checkpoint: as :class:`Bz2FileLoader`.

    Example:
        >>> import io, lzma
        >>> from datapipes.iter import IterableWrapper
        >>> files = IterableWrapper([("a.txt.xz", io.BytesIO(lzma.compress(b"hello")))])
        >>> [(path, stream.read()) for path, stream in files.load_from_xz()]
        [('a.txt', b'hello')]

    See also: :class:`Bz2FileLoader`, :class:`~datapipes.iter.Decompressor`.
    """

    _saves = "same as decompress"

    _format = "xz"
    _suffix = ".xz"


# -- Extractor -------------------------------------------------------------------------------------

_ARCHIVE_SUFFIXES = (
    (".tar", "tar"), (".tar.gz", "tar"), (".tgz", "tar"), (".tar.bz2", "tar"), (".tbz2", "tar"), (".tbz", "tar"),
    (".tar.xz", "tar"), (".txz", "tar"), (".zip", "zip"),
    (".gz", "gzip"), (".bz2", "bz2"), (".xz", "xz"), (".lzma", "xz"), (".zst", "zstd"), (".zstd", "zstd"),
)
_FILE_TYPES = {
    "tar": "tar", "zip": "zip", "gzip": "gzip", "gz": "gzip", "bz2": "bz2", "bzip2": "bz2", "xz": "xz",
    "lzma": "xz", "zstd": "zstd", "zst": "zstd",
}


def _kind_of(path: Any, stage: str) -> str:
    name = str(path).lower()
    for suffix, kind in _ARCHIVE_SUFFIXES:
        if name.endswith(suffix):
            return kind
    ext = os.path.splitext(name)[1]
    raise RuntimeError(
        f"{stage}: File at {path} has file extension {ext}, which does not match what are supported by "
        f"ExtractorIterDataPipe ({', '.join(s for s, _ in _ARCHIVE_SUFFIXES)}); pass file_type=..."
    )


def _extract(pipe: Extractor, it: Iterator[Any], run: Any) -> Iterator[tuple[Any, Any]]:
    stage = stage_label(pipe)
    fixed = pipe._kind
    readers: dict[str, Callable[..., Iterator[Any]]] = {"tar": _tar, "zip": _zip}
    try:
        resumed = run.resume
        if resumed is not None and resumed.get("file") is not None:  # stopped inside an archive: finish it first
            kind = fixed or _kind_of(resumed["file"]["path"], stage)
            yield from readers[kind](pipe, iter(()), run)
        n = -1
        for item in it:
            n += 1
            path, stream = _pair(item, stage, n)
            try:
                kind = fixed or _kind_of(path, stage)
            except Exception as e:
                _close(stream)
                add_stage_note(e, stage, n, f"file {path!r}, item")
                raise
            read = readers.get(kind)
            if read is not None:
                yield from read(pipe, iter((item,)), run)  # the archive's members, its position in ``run``
            else:
                yield path, set_origin(_reader(stage, kind, path, stream, n), pipe, path, n)
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


@functional_datapipe("extract")
class Extractor(IterDataPipe[tuple[Any, Any]]):
    """Extract archives and decompress files of ``(path, stream)`` pairs, each by its kind
    (functional name: ``extract``).

    Args:
        source_datapipe: a pipe of ``(path, binary stream)`` pairs.
        file_type: ``"tar"``, ``"zip"``, ``"gzip"``, ``"bz2"``, ``"xz"`` (``"lzma"``) or ``"zstd"``
            for every item; ``None`` (default): each path's suffix says (``.tar``, ``.tar.gz``,
            ``.tgz``, ``.tar.bz2``, ``.tar.xz``, ``.zip``, ``.gz``, ``.bz2``, ``.xz``, ``.zst``).
        max_member_size: the largest archive member, in bytes, read into memory: 1 GiB by
            default, as for :class:`~datapipes.iter.TarArchiveLoader` (``None``: no limit). A
            compressed file is not read into memory (its reader decompresses as it is read).

    Yields:
        For a tar or zip archive, its files as :class:`~datapipes.iter.TarArchiveLoader` and
        :class:`~datapipes.iter.ZipArchiveLoader` yield them: ``(path/member, io.BytesIO)``. For a
        compressed file, ``(path, reader)`` as :class:`~datapipes.iter.Decompressor` yields it.
        (torchdata 0.9's ``extract`` is ``decompress`` under another name and yields an archive as
        an open ``TarFile``/``ZipFile``.)

    Raises:
        RuntimeError: a path whose suffix names no kind (torchdata's phrase). The archive and
        decompression errors of those stages (a member refused for its path or its size among
        them), with notes naming this stage and the file.

    ``len()`` is the source's length when ``file_type`` names a compression (one item each);
    otherwise ``TypeError``.

    Example:
        >>> import gzip, io, tarfile
        >>> from datapipes.iter import IterableWrapper
        >>> buf = io.BytesIO()
        >>> with tarfile.open(fileobj=buf, mode="w") as tar:
        ...     info = tarfile.TarInfo("m.txt"); info.size = 1
        ...     tar.addfile(info, io.BytesIO(b"m"))
        >>> files = IterableWrapper([("a.tar", io.BytesIO(buf.getvalue())), ("b.txt.gz", io.BytesIO(gzip.compress(b"b")))])
        >>> [(path, stream.read()) for path, stream in files.extract()]
        [('a.tar/m.txt', b'm'), ('b.txt.gz', b'b')]

    See also: :class:`~datapipes.iter.Decompressor`, :class:`~datapipes.iter.TarArchiveLoader`.
    """

    _saves = {
        "``extract`` (a compression for every item)": "same as decompress",
        "``extract`` (archives)": "same as readlines",
    }

    _stream_mode = "*"  # as TarArchiveLoader reads (compression detected)

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        file_type: str | None = None,
        *,
        max_member_size: int | None = MAX_MEMBER_SIZE,
    ) -> None:
        stage = "Extractor"
        require_pipe(source_datapipe, stage, "source_datapipe")
        _check_limit(max_member_size, stage)
        kind = None
        if file_type is not None:
            name = getattr(file_type, "value", file_type)  # torchdata's CompressionType members too
            if not isinstance(name, str):
                raise TypeError(f"{stage}: file_type must be a str or None, got {type(file_type).__name__}")
            kind = _FILE_TYPES.get(name.lower())
            if kind is None:
                raise ValueError(f"{stage}: file_type must be one of {sorted(_FILE_TYPES)} or None, got {file_type!r}")
        self.source_datapipe = source_datapipe
        self.file_type = file_type
        self.max_member_size = max_member_size
        self._kind = kind
        self._policy, self.failures = policy_and_log(self, "raise", None)
        # A compression for every item: one lazy reader per item, the position is the source's.
        self._stateless = kind not in (None, "tar", "zip")

    def _open(self, ctx: Pass) -> Iterator[tuple[Any, Any]]:
        # The archive being read and its entries read (_readers._ReadRun), as the archive loaders keep.
        run = _read_run(self, ctx, self.source_datapipe) if not self._stateless else _NoRun()
        return _extract(self, ctx.open(self.source_datapipe), run)

    def _reopener(self) -> Callable[[Any, int], Any] | None:
        """With a compression for every item: the source's opener, decompressed again (readers of
        archive members copy them instead)."""
        if not self._stateless:
            return None
        reopen = _reopener(self.source_datapipe)
        if reopen is None:
            return None
        stage, kind = stage_label(self), self._kind
        return lambda path, n: _reader(stage, kind, path, reopen(path, n), n)  # type: ignore[arg-type]

    def _origin_reopener(self) -> Callable[[Any, int], Any] | None:
        """How a pass state holding one of this stage's decompressed files opens it again: the
        source's opener, decompressed by the kind of the path (archives' members are copied)."""
        reopen = _reopener(self.source_datapipe)
        if reopen is None:
            return None
        stage, fixed = stage_label(self), self._kind
        return lambda path, n: _reader(stage, fixed or _kind_of(path, stage), path, reopen(path, n), n)

    def __len__(self) -> int:
        if self._stateless:
            return source_len(self, self.source_datapipe, "source_datapipe")
        raise len_unknown(self, "an archive holds any number of files", NO_LEN)


class _NoRun:
    resume = None
