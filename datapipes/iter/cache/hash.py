"""Hash checks of whole files: HashChecker [check_hash], and the digests the on-disk cache
(:mod:`datapipes.iter.cache.disk`) checks its files with.

**Checkpoints.** ``check_hash`` keeps no position of its own (one output per item).
"""

from __future__ import annotations

import hashlib
import io
from typing import Any, Callable, Iterator, Mapping

from ..._checks import phrased, require_bool
from ..._engine import abandon
from ..._engine import close_iterator as _close
from ..._runtime.passes import Pass
from ...datapipe import IterDataPipe, functional_datapipe, require_pipe, source_len, stage_label
from ...errors import add_stage_note
from ..fileio import StreamWrapper
from .._readers import _pair, _reopener

__all__ = ["HashChecker"]

_HASH_TYPES = ("sha256", "md5")
_CHUNK = 1 << 20  # bytes read at a time when hashing or copying a stream


def _check_hash_args(hash_dict: Any, hash_type: Any, stage: str, optional: bool) -> None:
    if hash_dict is None:
        if not optional:
            raise TypeError(f"{stage}: hash_dict must be a dict of file path -> hex digest, got None")
    elif not isinstance(hash_dict, Mapping):
        raise TypeError(f"{stage}: hash_dict must be a dict of file path -> hex digest, got {type(hash_dict).__name__}")
    if hash_type not in _HASH_TYPES:
        # torchdata's words: HashChecker lists the types, OnDiskCacheHolder gives a tuple
        kinds = list(_HASH_TYPES) if stage == "HashChecker" else _HASH_TYPES
        raise ValueError(phrased(stage, f"Invalid hash_type requested, should be one of {kinds}", hash_type=hash_type))


def _hasher(hash_type: str) -> Any:
    return hashlib.sha256() if hash_type == "sha256" else hashlib.md5()


def _file_digest(path: str, hash_type: str) -> str:
    h = _hasher(hash_type)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _mismatch(stage: str, path: Any, digest: str, expected: str) -> RuntimeError:
    # torchdata's phrase last, intact
    return RuntimeError(
        f"{stage}: expected {expected}: The hash {digest} of {path} does not match. Delete the file manually and retry."
    )


def _unspecified(stage: str, path: Any) -> RuntimeError:
    return RuntimeError(f"{stage}: Unspecified hash for file {path}")  # torchdata's words, hash_dict has no entry


# -- HashChecker -----------------------------------------------------------------------------------


def _seekable(stream: Any) -> bool:
    seekable = getattr(stream, "seekable", None)
    try:
        return bool(seekable()) if seekable is not None else False
    except (OSError, ValueError):
        return False


def _hash_data(data: Any, h: Any, rewind: bool, path: Any, stage: str) -> Any:
    """Feed ``data`` to ``h``; return what to yield in its place (the stream rewound, or its
    contents in memory when it cannot seek)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        h.update(data)
        return data
    if isinstance(data, str):
        h.update(data.encode())
        return data
    read = getattr(data, "read", None)
    if read is None:
        raise TypeError(f"{stage}: expects (path, data) pairs with bytes, str or a stream, got {type(data).__name__}")
    keep: list[Any] | None = [] if rewind and not _seekable(data) else None
    while True:
        chunk = read(_CHUNK)
        if not chunk:
            break
        h.update(chunk.encode() if isinstance(chunk, str) else chunk)
        if keep is not None:
            keep.append(chunk)
    if not rewind:
        return data
    if keep is None:
        data.seek(0)
        return data
    # A stream that cannot seek (HTTP): its contents, read once, are handed on in memory.
    _close(data)
    text = bool(keep) and isinstance(keep[0], str)
    return StreamWrapper(io.StringIO("".join(keep)) if text else io.BytesIO(b"".join(keep)), path)


def _check_hashes(pipe: HashChecker, it: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
    stage = stage_label(pipe)
    hash_dict, hash_type, rewind = pipe.hash_dict, pipe.hash_type, pipe.rewind
    n = -1
    try:
        for item in it:
            n += 1
            path, data = _pair(item, stage, n)
            try:
                expected = hash_dict.get(path)
                if expected is None:
                    raise _unspecified(stage, path)
                h = _hasher(hash_type)
                data = _hash_data(data, h, rewind, path, stage)
                digest = h.hexdigest()
                if digest != expected:
                    raise _mismatch(stage, path, digest, expected)
            except Exception as e:
                add_stage_note(e, stage, n, f"file {path!r}, item")
                raise
            yield path, data
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


@functional_datapipe("check_hash")
class HashChecker(IterDataPipe[tuple[Any, Any]]):
    """Check the hash of each file of ``(path, data)`` pairs against ``hash_dict``
    (functional name: ``check_hash``).

    Args:
        source_datapipe: a pipe of ``(path, data)`` pairs: ``data`` is ``bytes``, ``str`` (hashed
            as UTF-8) or a stream (read to its end in 1 MiB chunks).
        hash_dict: ``{path: expected hex digest}``.
        hash_type: ``"sha256"`` (default) or ``"md5"``.
        rewind: hand on a stream rewound to its start after hashing it. A stream that cannot seek
            (HTTP) is handed on as an in-memory copy of what was read (torchdata fails on it).
            ``False``: the stream is handed on as it is, read to its end.

    Yields:
        ``(path, data)`` once the hash matched.

    Raises:
        RuntimeError: the path has no entry in ``hash_dict``, or the hash does not match
        (torchdata's phrases: "Unspecified hash for file ...", "The hash ... of ... does not match.
        Delete the file manually and retry."), with a note naming the stage and file.
        TypeError: an item is not a ``(path, data)`` pair.

    ``len()`` is the source's length.

    Example:
        >>> import hashlib, io
        >>> from datapipes.iter import IterableWrapper
        >>> digest = hashlib.sha256(b"abc").hexdigest()
        >>> pipe = IterableWrapper([("a.bin", io.BytesIO(b"abc"))]).check_hash({"a.bin": digest})
        >>> [(path, stream.read()) for path, stream in pipe]
        [('a.bin', b'abc')]

    See also: :class:`OnDiskCacheHolder` (its ``hash_dict``).
    """

    _saves = "nothing: at a boundary their position is their source's"

    _stateless = True  # one item out per item in: its position is its source's

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[Any, Any]],
        hash_dict: dict[str, str],
        hash_type: str = "sha256",
        rewind: bool = True,
    ) -> None:
        stage = "HashChecker"
        require_pipe(source_datapipe, stage, "source_datapipe")
        _check_hash_args(hash_dict, hash_type, stage, optional=False)
        require_bool(rewind, stage, "rewind")
        self.source_datapipe = source_datapipe
        self.hash_dict = hash_dict
        self.hash_type = hash_type
        self.rewind = rewind

    def _open(self, ctx: Pass) -> Iterator[tuple[Any, Any]]:
        return _check_hashes(self, ctx.open(self.source_datapipe))

    def _reopener(self) -> Callable[[Any, int], Any] | None:
        """A reader downstream opens a file again through the source's opener (the same file)."""
        return _reopener(self.source_datapipe)

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")
