"""Archives in ``(path, stream)`` pairs: TarArchiveLoader [load_from_tar], ZipArchiveLoader
[load_from_zip], WebDatasetGrouper [webdataset]. Compressed files (``decompress``) are
:mod:`datapipes.iter.io.compression`'s.

The archive loaders yield ``(path inside the archive, stream)`` where the stream is an
``io.BytesIO`` of the member's bytes, read before the archive advances: members stay valid
through ``batch``, ``shuffle``, ``prefetch`` and concurrent stages, in any order. Tar archives are
read in streaming mode (``r|*``), so non-seekable streams (HTTP, pipes) work and no member list is
kept in memory. Each archive's stream is closed when the loader is done with it.

**Bad input.** A truncated or corrupt archive raises the very error ``tarfile`` / ``zipfile``
raised, with a note naming the stage, the archive and the member (or entry) where known::

    [datapipes] raised in stage TarArchiveLoader('r:*') at archive 'shard-3.tar', member 'a/17.jpg', entry 33

With ``on_error="skip"`` the failure is counted in ``pipe.failures`` and the loader goes on: with
the next archive for a tar (a tar stream cannot be read past a damaged spot) or an archive that
does not open, with the next member for a zip member that does not read. Members already yielded
stay yielded.

**Archives from elsewhere.** An archive is data, and its member names and sizes are the writer's
word. So:

- A member's path stays inside its archive: a name that leaves it once normalised (``../x``,
  ``a/../../x``), an absolute name (``/x``, ``\\x``), a drive letter (``C:x``), ``..`` between
  backslashes (``..\\x``, a separator on Windows) or a NUL character is refused with a
  ``ValueError`` naming the stage, the archive and the member (tar and GNU tar strip a leading
  ``/`` instead; here it is refused like the rest).
- A member larger than ``max_member_size`` (1 GiB by default) is refused before it is read, by
  the size its header gives; a zip member is read no further than that size.
- A tar that ends without its end-of-archive blocks (a writer that died, a download cut on a
  512-byte block) raises ``tarfile.ReadError`` after the members it holds, and so does a
  compressed tar whose stream is truncated or fails its check (the gzip CRC-32 and length,
  checked once the whole stream is read: members before the damage are yielded first).
- Links in a tar (symbolic or hard) are skipped, never followed.

Under ``on_error="skip"`` a refused member is counted and skipped, and the archive goes on.

**Checkpoints** (``it.state_dict()``). A loader stopped inside an archive saves its path and the
entries read, as the text readers (``readlines``, ``parse_csv``) do (a resumed pass reads past them in
a tar, jumps to them in a zip); ``webdataset`` saves the sample it has begun (its in-memory files
copied).

>>> import io, tarfile
>>> from datapipes.iter import IterableWrapper
>>> buf = io.BytesIO()
>>> with tarfile.open(fileobj=buf, mode="w") as tar:
...     for name in ("0.jpg", "0.cls", "1.jpg", "1.cls"):
...         info = tarfile.TarInfo(name); info.size = len(name)
...         tar.addfile(info, io.BytesIO(name.encode()))
>>> shards = IterableWrapper([("shard.tar", io.BytesIO(buf.getvalue()))])
>>> [(s["__key__"], s[".cls"].read()) for s in shards.load_from_tar().webdataset()]
[('shard.tar/0', b'0.cls'), ('shard.tar/1', b'1.cls')]
"""

from __future__ import annotations

import bz2
import copy
import gzip
import io
import lzma
import os
import re
import tarfile
import zipfile
import zlib
from itertools import chain, islice
from typing import Any, Iterator

from .._runtime.passes import Pass
from .._positions import Enumerated, skip as skip_items
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_int, require_pipe, stage_label
from .._engine import abandon
from .._engine import close_iterator as _close
from ..errors import WARN_FAILURES, _OnError, policy_and_log
from ._readers import _item, _on_fail, _open_item, _pair, _read_run, _ReadRun
from .._engine.lifecycle import Resumable

__all__ = ["TarArchiveLoader", "WebDataset", "WebDatasetGrouper", "ZipArchiveLoader"]


#: The default ``max_member_size`` of the archive loaders: 1 GiB. Larger than the members of common
#: datasets (images, audio clips, documents, tensor shards), and a bound on what one member (a
#: decompression bomb included) can take in memory; pass ``None`` or a larger number for bigger ones.
MAX_MEMBER_SIZE = 1 << 30

_DRIVE = re.compile(r"[A-Za-z]:")
_SEPARATORS = re.compile(r"[/\\]")


def _unsafe(name: str) -> str | None:
    """Why member ``name`` would not stay inside its archive (backslashes count as separators:
    they are on Windows), or ``None``."""
    if "\x00" in name:
        return "contains a NUL character"
    if name[:1] in ("/", "\\"):
        return "is absolute"
    if _DRIVE.match(name):
        return "starts with a drive letter"
    if ".." not in name:  # the usual name: it cannot climb
        return None if name.strip("./") else "names no file inside the archive"
    depth = 0
    for part in _SEPARATORS.split(name):
        if part == "..":
            depth -= 1
            if depth < 0:
                return "leaves the archive"
        elif part and part != ".":
            depth += 1
    return "names no file inside the archive" if depth == 0 else None


def _member_path(stage: str, archive: Any, name: str) -> str:
    """The path of member ``name``: joined to the archive's and normalised, as torchdata does.
    ``ValueError`` naming the stage, the archive and the member where it would not stay inside
    the archive."""
    why = _unsafe(name)
    if why is not None:
        raise ValueError(f"{stage}: refused member {name!r} of archive {archive!r}: its path {why}")
    return os.path.normpath(os.path.join(archive, name))


def _check_size(stage: str, archive: Any, name: str, size: int, limit: int | None) -> None:
    """``ValueError`` naming the stage, the archive, the member and the limit where ``size`` (as
    the member's header gives it) is over ``limit``."""
    if limit is not None and size > limit:
        raise ValueError(
            f"{stage}: member {name!r} of archive {archive!r} is {size} bytes, more than max_member_size={limit} "
            "(pass a larger max_member_size, or None for no limit)"
        )


def _check_limit(limit: Any, stage: str) -> None:
    require_int(limit, stage, "max_member_size", minimum=1, optional=True)


def _archive_where(path: Any, n: int, opened: bool, name: Any, entry: int) -> tuple[str, int]:
    """The ``(what, position)`` of a note: the archive, and the member or entry being read."""
    if not opened:
        return f"archive {path!r}, item", n
    if name is not None:
        return f"archive {path!r}, member {name!r}, entry", entry
    return f"archive {path!r}, entry", entry


def _check_length(length: Any, stage: str) -> None:
    require_int(length, stage, "length", minimum=-1)


def _nominal_len(pipe: Any) -> int:
    if pipe.length == -1:
        raise len_unknown(pipe, "the number of members is known only after reading (pass length=... to set it)")
    return pipe.length


# -- tar -------------------------------------------------------------------------------------------


class _CheckedTarInfo(tarfile.TarInfo):
    """Remembers why an archive ended: after the first member ``tarfile`` ends an archive quietly at a
    truncated or corrupt header, or where the stream ends without the end-of-archive blocks, as if
    it had reached the end; the loader raises instead."""

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> _CheckedTarInfo:
        try:
            return super().fromtarfile(tarfile_)
        except (tarfile.TruncatedHeaderError, tarfile.InvalidHeaderError,  # type: ignore[attr-defined]
                tarfile.EmptyHeaderError) as e:  # type: ignore[attr-defined]
            tarfile_._datapipes_bad_header = e  # type: ignore[attr-defined]
            raise


def _check_tar_end(tar: tarfile.TarFile, path: Any, entries: int) -> None:
    bad = tar.__dict__.get("_datapipes_bad_header")
    if bad is None:
        return  # a zero block ended it: the first of the two end-of-archive blocks is enough
    if isinstance(bad, tarfile.EmptyHeaderError):  # type: ignore[attr-defined]
        raise tarfile.ReadError(
            f"archive {path!r} ends after {entries} entries without the end-of-archive blocks: it is truncated"
        )
    raise tarfile.ReadError(f"{bad}: the archive is truncated or corrupt after {entries} entries")


_TAR_MODE = re.compile(r"r(?:([:|])(\*|gz|bz2|xz|)?)?")


def _stream_mode(mode: Any, stage: str) -> str:
    """The compression of the archives ``mode`` reads: ``"*"`` (detected), ``""`` (none), ``"gz"``,
    ``"bz2"`` or ``"xz"``."""
    if not isinstance(mode, str):
        raise TypeError(f"{stage}: mode must be a str, got {type(mode).__name__}")
    m = _TAR_MODE.fullmatch(mode)
    if m is None:
        raise ValueError(f"{stage}: mode must be a tarfile read mode ('r:*', 'r|*', 'r:gz', 'r|xz', ...), got {mode!r}")
    sep, comp = m.groups()
    return "*" if sep is None or comp is None else comp


class _Source:
    """The stream under a tar's decompressor: first the bytes read to tell its compression, then
    the rest. An error of the stream itself is remembered, so that it passes through as it is
    (only the errors of the compressed data become ``tarfile.ReadError``)."""

    __slots__ = ("stream", "head", "error")

    def __init__(self, stream: Any, head: bytes) -> None:
        self.stream = stream
        self.head = head
        self.error: BaseException | None = None

    def read(self, size: int | None = -1) -> bytes:
        head = self.head
        if head:
            if size is None or size < 0:
                self.head = b""
                return head + self._read(-1)
            self.head = head[size:]
            return head[:size]
        return self._read(size)

    def _read(self, size: int | None) -> bytes:
        try:
            return self.stream.read(size)
        except BaseException as e:
            self.error = e
            raise


#: Errors of compressed data (a truncated stream, a bad CRC-32 or length, corrupt data).
_DATA_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)

_READ_CHUNK = 1 << 16  # the least a tar's decompressed stream is read by


class _Decompressed:
    """A tar's decompressed stream, as ``tarfile`` reads it: an error of the compressed data is
    raised as ``tarfile.ReadError`` naming the archive (chained to the decompressor's own)."""

    __slots__ = ("file", "source", "path", "kind")

    def __init__(self, file: Any, source: _Source, path: Any, kind: str) -> None:
        self.file = file
        self.source = source
        self.path = path
        self.kind = kind

    def read(self, size: int | None = -1) -> bytes:
        # What one read of the compressed stream gives (``tarfile`` asks again for the rest, and
        # keeps what is more than it asked for): the data before a truncation reaches the member
        # it belongs to, which the error then names. At least 64 KiB: fewer, larger calls (a
        # decompressor's cost per call is not small beside 10 KiB, what tarfile asks for).
        try:
            return self.file.read1(_READ_CHUNK if size is None or size < _READ_CHUNK else size)
        except _DATA_ERRORS as e:
            if e is self.source.error:
                raise
            raise tarfile.ReadError(
                f"archive {self.path!r}: the {self.kind} stream is corrupt or truncated: {e}"
            ) from e

    def drain(self) -> None:
        """Read the stream to its end: a gzip stream's CRC-32 and length are checked there (and
        the end of a bzip2 or xz stream), after the tar's end-of-archive blocks."""
        while self.read(_READ_CHUNK):
            pass

    def close(self) -> None:
        self.file.close()  # the decompressor's buffers; the stream under it is the loader's to close


#: The compressions of tar streams, as Python's ``tarfile`` detects them (a bzip2 stream of any
#: block size); anything else is read as an uncompressed tar.
_MAGIC = ((b"\x1f\x8b\x08", "gz"), (b"\x5d\x00\x00\x80", "xz"), (b"\xfd7zXZ", "xz"))
_OPEN = {
    "gz": lambda f: gzip.GzipFile(fileobj=f, mode="rb"),
    "bz2": lambda f: bz2.BZ2File(f, "rb"),
    "xz": lambda f: lzma.LZMAFile(f, "rb"),
}
_KIND = {"gz": "gzip", "bz2": "bzip2", "xz": "xz"}


def _detect(head: bytes) -> str:
    for magic, comp in _MAGIC:
        if head.startswith(magic):
            return comp
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[3:4] != b"0":
        return "bz2"
    return ""


def _open_tar(stream: Any, comp: str, path: Any) -> tuple[tarfile.TarFile, _Decompressed | None]:
    """A streaming ``TarFile`` over ``stream`` and, for a compressed one, the decompressed stream it
    reads (Python's own decompressing files, which check a stream's end: ``tarfile``'s streaming
    mode reads gzip without checking its CRC-32 or length). ``comp``: from :func:`_stream_mode`."""
    head = b""
    if comp == "*":
        while len(head) < 6:  # the longest magic
            more = stream.read(6 - len(head))
            if not more:
                break
            head += more
        comp = _detect(head)
    source = _Source(stream, head)
    dec = None
    if comp:
        dec = _Decompressed(_OPEN[comp](source), source, path, _KIND[comp])
    fileobj: Any = dec or source  # read() is all that tarfile's streaming mode calls
    try:
        return tarfile.open(fileobj=fileobj, mode="r|", tarinfo=_CheckedTarInfo), dec
    except BaseException:
        if dec is not None:
            dec.close()
        raise


def _tar(pipe: TarArchiveLoader, it: Iterator[Any], run: _ReadRun) -> Iterator[tuple[str, io.BytesIO]]:
    stage = stage_label(pipe)
    on_fail = _on_fail(pipe, stage)
    comp: Any = pipe._stream_mode
    limit = pipe.max_member_size
    n, first = run.begin(on_fail)  # n: the item (archive) being read; first: the one a resumed pass was in
    try:
        for item in chain(first, it) if first else it:
            n += 1
            path, stream, skip, _ = _item(item, stage, n, 0)
            tar = dec = None
            entry = skip - 1  # the entry of this archive being read
            name = None  # the member whose data is being read
            refused = None  # a refused member, being reported (on_fail raises it, or counts it)
            try:
                stream = _open_item(item, stream, run, n)
                tar, dec = _open_tar(stream, comp, path)
                entries = iter(tar)
                if skip:  # resumed: read past the entries the saved pass had read (a tar stream cannot jump)
                    next(islice(entries, skip - 1, None), None)
                counted = Enumerated(entries, skip)
                run.enter(n, path, stream, counted, None, 0)
                for entry, info in counted:
                    if info.isfile():
                        try:
                            member = _member_path(stage, path, info.name)
                            _check_size(stage, path, info.name, info.size, limit)
                        except ValueError as e:
                            # Refused, the archive is intact: skipped, the next member still reads.
                            refused = e
                            on_fail(e, *_archive_where(path, n, True, info.name, entry))
                            refused = None
                            continue
                        name = info.name
                        # No more than the header's size, which is within the limit: tarfile reads no further.
                        data = tar.extractfile(info).read()  # type: ignore[union-attr]
                        name = None
                        yield member, io.BytesIO(data)
                _check_tar_end(tar, path, entry + 1)
                if dec is not None:
                    dec.drain()
            except Exception as e:
                if refused is not None:  # reported already
                    raise
                # Skipped or not, the rest of this archive is lost: a tar stream cannot be read past a
                # damaged spot.
                on_fail(e, *_tar_where(path, n, tar, name, entry))
            finally:
                if tar is not None:
                    tar.close()
                if dec is not None:
                    dec.close()
                _close(stream)
                run.leave()  # done with this file: a state taken now is between files
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise
    finally:
        run.end()


def _tar_where(path: Any, n: int, tar: Any, name: Any, entry: int) -> tuple[str, int]:
    # Reading a member's data: that member; else the header after the last entry read.
    return _archive_where(path, n, tar is not None, name, entry if name is not None else entry + 1)


@functional_datapipe("load_from_tar")
class TarArchiveLoader(IterDataPipe[tuple[str, io.BytesIO]]):
    """Read the tar archives of ``(path, stream)`` pairs and yield their files as
    ``(path/member, stream)`` pairs (functional name: ``load_from_tar``).

    Args:
        datapipe: a pipe of ``(path, binary stream)`` pairs, e.g. ``open_files(mode="b")``.
        mode: the tarfile read mode: ``"r:*"`` (default, compression detected), ``"r:gz"``,
            ``"r:bz2"``, ``"r:xz"``, ``"r:"`` (uncompressed), or their ``"r|..."`` forms. The
            archive is always read in streaming mode (``r|``), which reads the same archives,
            works on non-seekable streams and keeps no member list in memory.
        length: the nominal ``len()`` (``-1``: unknown).
        on_error: ``"raise"`` (default) or ``"skip"``: an archive that fails to open or read is
            counted in ``pipe.failures``, the members it already gave stay, and the loader goes on
            with the next archive; a refused member (its path, its size) is counted and skipped,
            and the archive goes on.
        max_failures: with ``on_error="skip"``, failures tolerated per pass: a number, or a float
            between 0 and 1 for a share of the items (``None``: any).
        warn_failures: with ``on_error="skip"``, past how many failures (a number, or a share:
            10% by default) a pass warns once (``None``: never); see :mod:`datapipes.errors`.
        max_member_size: the largest member, in bytes, read into memory: 1 GiB by default
            (:data:`MAX_MEMBER_SIZE`), more than the members of common datasets and a bound on
            what one member of an archive from elsewhere (a decompression bomb) can take.
            Checked against the member's header before its data is read; ``None``: no limit.

    Yields:
        ``(os.path.normpath(os.path.join(path, member_name)), io.BytesIO(member_bytes))`` for each
        regular file of each archive, in archive order (directories and links are skipped). The
        member's bytes are read before the archive advances.

    Raises:
        tarfile.ReadError: a truncated or corrupt archive (also a damaged header after the first
        member, which ``tarfile`` alone would take for the end, and an archive that ends without
        its end-of-archive blocks), or a compressed stream that is truncated or fails its check
        (the gzip CRC-32 and length, checked at the end of the stream), with a note naming the
        stage, the archive and the member or entry; the stream's own errors (``OSError``,
        ``EOFError``) pass through the same way. ValueError: a member whose path would leave the
        archive (see the module docstring) or whose size is over ``max_member_size``, naming the
        archive and the member. TypeError: an item is not a ``(path, stream)`` pair.

    Example:
        >>> import io, tarfile
        >>> from datapipes.iter import IterableWrapper
        >>> buf = io.BytesIO()
        >>> with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        ...     info = tarfile.TarInfo("a/b.txt"); info.size = 2
        ...     tar.addfile(info, io.BytesIO(b"hi"))
        >>> [(p, s.read()) for p, s in IterableWrapper([("x.tar.gz", io.BytesIO(buf.getvalue()))]).load_from_tar()]
        [('x.tar.gz/a/b.txt', b'hi')]

    See also: :class:`WebDatasetGrouper` to group members into samples, :class:`ZipArchiveLoader`.
    """

    _saves = "same as readlines"

    _repr_fields = ("mode",)

    def __init__(
        self,
        datapipe: IterDataPipe[tuple[str, Any]],
        mode: str = "r:*",
        length: int = -1,
        *,
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        max_member_size: int | None = MAX_MEMBER_SIZE,
    ) -> None:
        stage = "TarArchiveLoader"
        require_pipe(datapipe, stage)
        self._stream_mode = _stream_mode(mode, stage)
        _check_length(length, stage)
        _check_limit(max_member_size, stage)
        self.datapipe = datapipe
        self.mode = mode
        self.length = length
        self.max_member_size = max_member_size
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures)

    def _open(self, ctx: Pass) -> Iterator[tuple[str, io.BytesIO]]:
        # The archive being read and the entries of it read (see _readers._ReadRun).
        return _tar(self, ctx.open(self.datapipe), _read_run(self, ctx, self.datapipe))

    def __len__(self) -> int:
        return _nominal_len(self)


# -- zip -------------------------------------------------------------------------------------------


def _open_zip(stream: Any) -> zipfile.ZipFile:
    seekable = getattr(stream, "seekable", None)
    if seekable is not None and seekable():
        return zipfile.ZipFile(stream)
    # The directory of a zip is at its end: a non-seekable stream is read into memory first.
    return zipfile.ZipFile(io.BytesIO(stream.read()))


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, stage: str, path: Any) -> bytes:
    """The bytes of a zip member, read no further than the size its directory entry gives (which
    ``_check_size`` has held to the limit): a longer member raises ``ValueError`` naming the stage,
    the archive and the member (``zipfile`` itself stops there, and its CRC-32 check fails)."""
    with zf.open(info) as f:
        data = f.read(info.file_size)
        if f.read(1):
            raise ValueError(
                f"{stage}: member {info.filename!r} of archive {path!r} holds more than the {info.file_size} bytes "
                "its header gives"
            )
    return data


def _zip(pipe: ZipArchiveLoader, it: Iterator[Any], run: _ReadRun) -> Iterator[tuple[str, io.BytesIO]]:
    stage = stage_label(pipe)
    on_fail = _on_fail(pipe, stage)
    limit = pipe.max_member_size
    n, first = run.begin(on_fail)  # n: the item (archive) being read; first: the one a resumed pass was in
    try:
        for item in chain(first, it) if first else it:
            n += 1
            path, stream, skip, _ = _item(item, stage, n, 0)
            zf = None
            try:
                try:
                    stream = _open_item(item, stream, run, n)
                    zf = _open_zip(stream)
                    infos = zf.infolist()
                except Exception as e:
                    on_fail(e, *_archive_where(path, n, False, None, 0))
                    continue
                entries = iter(infos)
                if skip:  # resumed: jump to the entry the saved pass stood at (the directory is read)
                    skip_items(entries, skip)
                counted = Enumerated(entries, skip)
                # zf.fp: the stream itself, or its in-memory copy where it cannot seek
                run.enter(n, path, zf.fp, counted, None, 0)
                for entry, info in counted:  # entry: the entry of this archive being read
                    if info.is_dir():
                        continue
                    try:
                        member = _member_path(stage, path, info.filename)
                        _check_size(stage, path, info.filename, info.file_size, limit)
                        data = _read_member(zf, info, stage, path)
                    except Exception as e:
                        # Zip members are independent: skipped, the next one still reads.
                        on_fail(e, *_archive_where(path, n, True, info.filename, entry))
                        continue
                    yield member, io.BytesIO(data)
            finally:
                if zf is not None:
                    zf.close()
                _close(stream)
                run.leave()  # done with this file: a state taken now is between files
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise
    finally:
        run.end()


@functional_datapipe("load_from_zip")
class ZipArchiveLoader(IterDataPipe[tuple[str, io.BytesIO]]):
    """Read the zip archives of ``(path, stream)`` pairs and yield their files as
    ``(path/member, stream)`` pairs (functional name: ``load_from_zip``).

    Args:
        datapipe: a pipe of ``(path, binary stream)`` pairs. A zip's directory is at its end, so
            a stream that cannot seek is read into memory first.
        length: the nominal ``len()`` (``-1``: unknown).
        on_error: ``"raise"`` (default) or ``"skip"``: an archive that does not open, or a member
            that does not read (bad CRC, corrupt data, encrypted) or is refused (its path, its
            size), is counted in ``pipe.failures`` and skipped; the other members still come through.
        max_failures: with ``on_error="skip"``, failures tolerated per pass: a number, or a float
            between 0 and 1 for a share of the items (``None``: any).
        warn_failures: with ``on_error="skip"``, past how many failures (a number, or a share:
            10% by default) a pass warns once (``None``: never); see :mod:`datapipes.errors`.
        max_member_size: the largest member, in bytes, read into memory: 1 GiB by default
            (:data:`MAX_MEMBER_SIZE`), as for :class:`TarArchiveLoader`. Checked against the size
            in the archive's directory before the member is read, and no more than that size is
            read; ``None``: no limit.

    Yields:
        ``(os.path.normpath(os.path.join(path, member_name)), io.BytesIO(member_bytes))`` for each
        file of each archive, in the archive's order (directories are skipped).

    Raises:
        zipfile.BadZipFile: a truncated archive or a member with a bad CRC; ``zlib.error`` for
        corrupt compressed data; each with a note naming the stage, the archive and the member.
        ValueError: a member whose path would leave the archive (see the module docstring) or
        whose size is over ``max_member_size``, naming the archive and the member.
        TypeError: an item is not a ``(path, stream)`` pair.

    Example:
        >>> import io, zipfile
        >>> from datapipes.iter import IterableWrapper
        >>> buf = io.BytesIO()
        >>> with zipfile.ZipFile(buf, "w") as zf:
        ...     zf.writestr("d/a.txt", b"A")
        >>> [(p, s.read()) for p, s in IterableWrapper([("x.zip", io.BytesIO(buf.getvalue()))]).load_from_zip()]
        [('x.zip/d/a.txt', b'A')]

    See also: :class:`TarArchiveLoader`.
    """

    _saves = "same as readlines"

    def __init__(
        self,
        datapipe: IterDataPipe[tuple[str, Any]],
        length: int = -1,
        *,
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        max_member_size: int | None = MAX_MEMBER_SIZE,
    ) -> None:
        stage = "ZipArchiveLoader"
        require_pipe(datapipe, stage)
        _check_length(length, stage)
        _check_limit(max_member_size, stage)
        self.datapipe = datapipe
        self.length = length
        self.max_member_size = max_member_size
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures)

    def _open(self, ctx: Pass) -> Iterator[tuple[str, io.BytesIO]]:
        # The archive being read and the entries of it read (see _readers._ReadRun).
        return _zip(self, ctx.open(self.datapipe), _read_run(self, ctx, self.datapipe))

    def __len__(self) -> int:
        return _nominal_len(self)


# -- WebDataset grouping ---------------------------------------------------------------------------


def _split_key(path: str) -> tuple[str, str]:
    """``(key, suffix)``: the suffix runs from the first dot of the file name (``.jpg``,
    ``.seg.png``); the key is the path before it, with ``/`` separators."""
    p = path.replace("\\", "/")
    dot = p.find(".", p.rfind("/") + 1)
    if dot < 0:
        return p, ""
    return p[:dot], p[dot:]


class _GroupRun(Resumable):
    """The position of a grouper's pass: the sample being gathered (when a sample is yielded, the
    first file of the next one has been pulled already) and the items pulled (read from the loop's
    ``Enumerated``). State: that partial sample, usually one file: an in-memory stream (an archive
    member) is copied at its position; another stream cannot be saved (``TypeError`` naming the
    stage); other data is saved as it is."""

    __slots__ = ("stage", "sample", "counted", "resume")

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.sample: dict[str, Any] | None = None
        self.counted: Any = None
        self.resume: dict[str, Any] | None = None
        self.started = False

    def state(self) -> dict[str, Any]:
        sample = self.sample
        if sample is not None:
            sample = {k: v if k == "__key__" else _held(v, self.stage, sample["__key__"]) for k, v in sample.items()}
        return {"n": 0 if self.counted is None else self.counted.count(), "sample": sample}

    def load(self, state: dict[str, Any]) -> None:
        self.resume = state

    def begin(self, it: Iterator[Any]) -> tuple[Any, dict[str, Any] | None]:
        """Called as the pass starts: ``Enumerated(it)`` from the saved count, and the saved sample."""
        self.started = True
        state, self.resume = self.resume, None
        start, sample = 0, None
        if state is not None:
            start = int(state["n"])
            if state["sample"] is not None:
                sample = self.sample = dict(state["sample"])
        self.counted = Enumerated(it, start)
        return self.counted, sample


def _held(value: Any, stage: str, key: str) -> Any:
    """A file of a partial sample, as a state holds it: an in-memory stream is copied (at its
    position: the consumer reads the original later)."""
    if getattr(value, "read", None) is None:
        return value
    raw = getattr(value, "file_obj", value)
    if isinstance(raw, (io.BytesIO, io.StringIO)):
        return copy.copy(raw)
    raise TypeError(
        f"{stage} cannot save its position: it holds a file of sample {key!r} as an open {type(raw).__name__}, "
        "which a state cannot carry (archive members, read into memory, can be saved)"
    )


def _webdataset(pipe: WebDatasetGrouper, it: Iterator[Any], run: _GroupRun) -> Iterator[dict[str, Any]]:
    stage = stage_label(pipe)
    counted, sample = run.begin(it)
    current = "" if sample is None else sample["__key__"]
    try:
        for n, item in counted:
            path, data = _pair(item, stage, n)
            if not isinstance(path, str):
                raise TypeError(f"{stage}: paths must be str, got {type(path).__name__} at item {n}")
            key, suffix = _split_key(path)
            if not suffix:
                continue  # a file without a suffix has no field name: WebDataset leaves it out
            if key != current or sample is None:
                done = sample
                sample = run.sample = {"__key__": key, suffix: data}  # the run holds it before done is yielded
                current = key
                if done is not None:
                    yield done
                continue
            if suffix in sample:
                raise ValueError(
                    f"{stage}: sample {key!r} has two files with the suffix {suffix!r} (the second at item {n})"
                )
            sample[suffix] = data
        run.sample = None
        if sample is not None:
            yield sample
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


@functional_datapipe("webdataset")
class WebDatasetGrouper(IterDataPipe[dict[str, Any]]):
    """Group consecutive ``(path, stream)`` pairs that share a key into WebDataset samples
    (functional name: ``webdataset``).

    A WebDataset shard is a tar whose files are laid out sample by sample: ``0001.jpg``,
    ``0001.cls``, ``0002.jpg``, ... The key of a file is its path up to the first dot of its name;
    the suffix, from that dot on (``.jpg``, ``.seg.png``), names the field.

    Args:
        source_datapipe: a pipe of ``(path, data)`` pairs, e.g. ``load_from_tar()``.

    Yields:
        ``{"__key__": key, ".jpg": stream, ".cls": stream, ...}`` for each run of consecutive files
        with the same key. Files without a suffix are left out, as WebDataset does.

    Raises:
        ValueError: two files of one sample have the same suffix. TypeError: an item is not a
        ``(path, data)`` pair with a str path.

    ``len()`` raises ``TypeError``: the number of samples is known only after grouping.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> files = IterableWrapper([("s/a.jpg", 1), ("s/a.cls", 2), ("s/b.jpg", 3)])
        >>> list(files.webdataset())
        [{'__key__': 's/a', '.jpg': 1, '.cls': 2}, {'__key__': 's/b', '.jpg': 3}]

    See also: :class:`TarArchiveLoader`.
    """

    _saves = (
        "the sample being gathered (usually one file; an in-memory stream is saved whole, any other stream "
        "raises ``TypeError``)"
    )

    def __init__(self, source_datapipe: IterDataPipe[tuple[str, Any]]) -> None:
        require_pipe(source_datapipe, "WebDatasetGrouper", "source_datapipe")
        self.source_datapipe = source_datapipe

    def _open(self, ctx: Pass) -> Iterator[dict[str, Any]]:
        run = _GroupRun(stage_label(self))  # the sample being gathered (see _GroupRun)
        ctx.track(self, run)
        return _webdataset(self, ctx.open(self.source_datapipe), run)

    def __len__(self) -> int:
        raise len_unknown(self, "the number of samples is known only after grouping", NO_LEN)


#: torchdata's name for :class:`WebDatasetGrouper` (``webdataset``).
WebDataset = WebDatasetGrouper
