"""TFRecord files of ``tf.train.Example`` records: TFRecordLoader [load_from_tfrecord], with the
record framing, CRC-32C and the protobuf wire format decoded here (no TensorFlow, no protobuf).

**Checkpoints.** ``load_from_tfrecord`` saves the file it is reading and the records read.

**Record sizes** (docs/howto/security.rst). A record's header claims its length, and its CRC is no
defence (anyone can compute it), so a claim is checked before anything is allocated for it: where the
stream's size is known (a local file, an in-memory stream) a record claiming more bytes than follow
its header raises at once, naming the file, the record's offset, the claim and what is left; a
record longer than ``max_record_size`` (:data:`MAX_RECORD_SIZE` by default) raises
:class:`~datapipes.errors.SizeLimitError`; and on a stream of unknown size (decompressed, remote)
a record is read in blocks, so a lying length holds no more memory than the bytes that arrive.
"""

from __future__ import annotations

import io
import os
import stat
from itertools import chain, islice
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

if TYPE_CHECKING:  # the aliases below name torch types; importing torch here at runtime is not needed
    import torch

from ..._checks import require_bool
from ..._engine import abandon
from ..._engine import close_iterator as _close
from ..._runtime.passes import Pass
from ..._positions import Enumerated
from ..._redact import redact
from ...datapipe import IterDataPipe, functional_datapipe, len_unknown, require_int, require_pipe, stage_label
from ...errors import SizeLimitError, add_stage_note
from .._readers import _inner, _item, _open_item, _read_run

__all__ = ["TFRecordExample", "TFRecordExampleSpec", "TFRecordLoader"]

#: The default ``max_record_size`` of ``load_from_tfrecord``: 1 GiB. Generous: protobuf itself
#: refuses messages of 2 GiB, and a ``tf.train.Example`` of even a few hundred MiB is rare.
MAX_RECORD_SIZE = 1 << 30

_CHUNK = 4 << 20  # a record of a stream of unknown size is read in blocks of this many bytes

#: The type of one parsed ``tf.train.Example``, as torchdata's (feature name -> tensor, or a list
#: of tensors, or a list of bytes).
TFRecordExample = dict[str, "torch.Tensor | list[torch.Tensor] | list[bytes] | list[list[bytes]]"]
#: The type of ``load_from_tfrecord``'s ``spec``, as torchdata's (feature name -> (shape, dtype)).
TFRecordExampleSpec = dict[str, tuple[tuple[int, ...], "torch.dtype"]]


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def _crc32c_python(data: Any) -> int:
    table = _CRC_TABLE
    crc = 0xFFFFFFFF
    for b in bytes(data):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc32c_function() -> Callable[[Any], int]:
    """CRC-32C (Castagnoli): from the ``crc32c`` or ``google_crc32c`` package where installed (C),
    else in Python (about 10 MB/s)."""
    try:
        import crc32c  # type: ignore[import-not-found]

        return lambda data: int(crc32c.crc32c(bytes(data)))
    except ImportError:
        pass
    try:
        import google_crc32c  # type: ignore[import-not-found]

        return lambda data: int(google_crc32c.value(bytes(data)))
    except ImportError:
        return _crc32c_python


def _masked_crc(crc32c: Callable[[Any], int], data: Any) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _position_and_size(stream: Any) -> tuple[int, int | None]:
    """The position of ``stream`` and its size where known without reading it: a local file (a
    regular file under ``FileIO``, buffered or not) or an in-memory stream; else ``(0, None)`` (a
    decompressed stream's ``fileno()`` is its compressed file's: its size says nothing)."""
    raw = _inner(stream)
    try:
        if isinstance(raw, io.BytesIO):
            with raw.getbuffer() as view:
                return int(raw.tell()), view.nbytes
        local = isinstance(raw, io.FileIO) or (
            isinstance(raw, (io.BufferedReader, io.BufferedRandom)) and isinstance(raw.raw, io.FileIO)
        )
        if local:
            st = os.fstat(raw.fileno())
            if stat.S_ISREG(st.st_mode):
                return int(raw.tell()), st.st_size
    except (OSError, ValueError):  # closed, detached or not seekable after all: size unknown
        pass
    return 0, None


def _records(
    stream: Any, check: Callable[[Any], int] | None, limit: int | None, stage: str, path: Any
) -> Iterator[memoryview]:
    """The records of a TFRecord stream: ``uint64 length, uint32 masked crc32c(length), data,
    uint32 masked crc32c(data)``, little-endian; the CRCs checked with ``check`` (a crc32c function).

    A length is checked against the bytes left (where the size is known) and ``limit`` before
    anything is allocated for it; on a stream of unknown size a long record is read in blocks."""
    head = bytearray(12)
    tail = bytearray(4)
    at, size = _position_and_size(stream)  # ``at``: the offset of the next record
    while True:
        got = stream.readinto(head)
        if got == 0:
            return
        if got != 12:
            got += _fill(stream, memoryview(head)[got:])
            if got != 12:
                raise RuntimeError("Invalid tfrecord file: failed to read the record size.")
        length = int.from_bytes(head[:8], "little")
        if check is not None and _masked_crc(check, head[:8]) != int.from_bytes(head[8:], "little"):
            raise RuntimeError("Invalid tfrecord file: the CRC of the record size does not match.")
        if size is not None and length > size - at - 12:
            raise RuntimeError(
                f"Invalid tfrecord file: failed to read the record: the record at byte {at:,} of "
                f"{redact(repr(path))} claims {length:,} bytes, but only {size - at - 12:,} bytes follow its header"
            )
        if limit is not None and length > limit:
            raise SizeLimitError(
                f"{stage}: the record at byte {at:,} of {redact(repr(path))} claims {length:,} bytes, more than "
                f"max_record_size={limit:,}: pass a larger max_record_size (None: no limit) to read it"
            )
        if size is not None or length <= _CHUNK:  # the bytes are there (or the claim is small)
            data = bytearray(length)
            done = _fill(stream, memoryview(data))
        else:
            data, done = _read_blocks(stream, length)
        if done != length:
            raise RuntimeError("Invalid tfrecord file: failed to read the record.")
        if _fill(stream, memoryview(tail)) != 4:
            raise RuntimeError("Invalid tfrecord file: failed to read the end token.")
        if check is not None and _masked_crc(check, data) != int.from_bytes(tail, "little"):
            raise RuntimeError("Invalid tfrecord file: the CRC of the record data does not match.")
        at += 16 + length
        yield memoryview(data)


def _read_blocks(stream: Any, length: int) -> tuple[bytearray, int]:
    """Up to ``length`` bytes of ``stream`` read in blocks of :data:`_CHUNK`: what is held grows with
    what arrives, not with what a header claims. Returns the bytes and their count."""
    data = bytearray()
    read = stream.read
    while len(data) < length:
        piece = read(min(_CHUNK, length - len(data)))
        if not piece:
            break
        data += piece
    return data, len(data)


def _fill(stream: Any, view: memoryview) -> int:
    """Read into ``view`` until it is full or the stream ends; the bytes read."""
    done = 0
    while done < len(view):
        got = stream.readinto(view[done:])
        if not got:
            break
        done += got
    return done


# The protobuf wire format, as far as tf.train.Example / SequenceExample need it.


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise RuntimeError("Invalid tf.train.Example: a varint runs past the end of its message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise RuntimeError("Invalid tf.train.Example: a varint is longer than 10 bytes")


def _fields(buf: memoryview) -> Iterator[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of a message: an int (varint, fixed32/64 as raw bytes) or
    a memoryview (length-delimited)."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > end:
                raise RuntimeError("Invalid tf.train.Example: a field runs past the end of its message")
            value = buf[pos : pos + size]
            pos += size
        elif wire == 5:
            value = buf[pos : pos + 4]
            pos += 4
        elif wire == 1:
            value = buf[pos : pos + 8]
            pos += 8
        else:
            raise RuntimeError(f"Invalid tf.train.Example: wire type {wire} of field {number} is not supported")
        yield number, wire, value


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _feature(buf: memoryview) -> Any:
    """A ``tf.train.Feature``: a list of bytes, a float32 tensor or an int64 tensor."""
    import numpy as np
    import torch

    kind: int | None = None
    values: Any = None
    for number, _, inner in _fields(buf):
        if number in (1, 2, 3):  # bytes_list, float_list, int64_list (a oneof: the last one wins)
            kind, values = number, inner
    if kind is None:
        return []
    if kind == 1:
        return [bytes(v) for n, w, v in _fields(values) if n == 1 and w == 2]
    if kind == 2:
        parts = []
        for n, w, v in _fields(values):
            if n == 1:
                parts.append(bytes(v))  # packed (wire 2) or one fixed32 (wire 5): little-endian floats
        return torch.from_numpy(np.frombuffer(b"".join(parts), dtype="<f4").astype(np.float32))
    ints: list[int] = []
    for n, w, v in _fields(values):
        if n != 1:
            continue
        if w == 0:
            ints.append(_int64(v))
        elif w == 2:  # packed varints
            pos = 0
            while pos < len(v):
                x, pos = _varint(v, pos)
                ints.append(_int64(x))
    return torch.tensor(ints, dtype=torch.int64)


def _map_entries(buf: memoryview) -> Iterator[tuple[str, memoryview]]:
    """The ``(key, value message)`` entries of a ``map<string, message>`` field 1 of ``buf``."""
    for number, wire, entry in _fields(buf):
        if number != 1 or wire != 2:
            continue
        key, value = "", memoryview(b"")
        for n, _, v in _fields(entry):
            if n == 1:
                key = bytes(v).decode("utf-8")
            elif n == 2:
                value = v
        yield key, value


def _reshape_list(value: Any, shape: Any) -> Any:
    """``value`` (nested lists of bytes) flattened and nested again to ``shape`` (one ``-1`` allowed)."""
    flat: list[Any] = []

    def flatten(v: Any) -> None:
        if isinstance(v, (str, bytes)):
            flat.append(v)
        else:
            for x in v:
                flatten(x)

    flatten(value)
    if sum(1 for x in shape if x == -1) > 1:
        raise RuntimeError("Shape can contain at most one dynamic dimension (-1).")
    known = 1
    for x in shape:
        if x != -1:
            known *= x
    dims = [x if x != -1 else len(flat) // max(known, 1) for x in shape]
    total = 1
    for x in dims:
        total *= x
    if total != len(flat):
        raise RuntimeError(f"Cannot reshape {len(flat)} values into shape {shape}")

    def nest(values: list[Any], dims: list[int]) -> Any:
        if not dims:
            return values[0]
        if len(dims) == 1:
            return values
        step = len(values) // dims[0]
        return [nest(values[i * step : (i + 1) * step], dims[1:]) for i in range(dims[0])]

    return nest(flat, dims)


def _apply_spec(value: Any, feature_spec: Any) -> Any:
    import torch

    if feature_spec is None:
        return value
    shape, dtype = feature_spec
    if isinstance(dtype, torch.dtype):
        if not isinstance(value, torch.Tensor):
            value = torch.tensor(value, dtype=dtype)  # an empty feature; bytes cannot be converted
        if shape is not None:
            value = value.reshape(shape)
        return value.to(dtype)
    if shape is not None:
        return _reshape_list(value, shape)
    return value


def _example(record: memoryview, spec: dict[str, Any] | None) -> dict[str, Any]:
    """A ``tf.train.Example`` (or ``SequenceExample``) record as ``{name: value}``."""
    import torch

    context = lists = None
    for number, wire, value in _fields(record):
        if wire != 2:
            continue
        if number == 1:
            context = value  # Example.features / SequenceExample.context
        elif number == 2:
            lists = value  # SequenceExample.feature_lists
    result: dict[str, Any] = {}
    if context is not None:
        for key, feature in _map_entries(context):
            if spec is None or key in spec:
                result[key] = _apply_spec(_feature(feature), None if spec is None else spec[key])
    if lists is not None:
        for key, feature_list in _map_entries(lists):
            if spec is not None and key not in spec:
                continue
            if key in result:
                raise RuntimeError(
                    f"TFRecord example's key {key} is contained in both the context and feature lists. This is not supported."
                )
            values: Any = [_feature(f) for n, w, f in _fields(feature_list) if n == 1 and w == 2]
            feature_spec = None if spec is None else spec[key]
            if feature_spec is not None and isinstance(feature_spec[1], torch.dtype):
                values = torch.stack(values, 0)
            result[key] = _apply_spec(values, feature_spec)
    if spec is not None and len(result) != len(spec):
        raise RuntimeError(f"Example is missing some required keys: {sorted(result)} != {sorted(spec)}")
    return result


def _tfrecords(pipe: TFRecordLoader, it: Iterator[Any], run: Any) -> Iterator[dict[str, Any]]:
    stage = stage_label(pipe)
    spec = pipe.spec
    limit = pipe.max_record_size
    check = _crc32c_function() if pipe.length_check else None
    n, first = run.begin(_raise_with_note(stage))
    try:
        for item in chain(first, it) if first else it:
            n += 1
            path, stream, skip, _ = _item(item, stage, n, 0)
            record = skip - 1  # the last record read
            reading = True  # reading the next record's frame (else parsing ``record``)
            try:
                stream = _open_item(item, stream, run, n)
                records = _records(stream, check, limit, stage, path)
                if skip:  # resumed: read past the records the saved pass had read
                    next(islice(records, skip - 1, None), None)
                counted = Enumerated(records, skip)
                run.enter(n, path, stream, counted, None, 0)
                for record, data in counted:
                    reading = False
                    example = _example(data, spec)
                    reading = True
                    yield example
            except Exception as e:
                add_stage_note(e, stage, record + 1 if reading else record, f"file {path!r}, record")
                raise
            finally:
                _close(stream)
                run.leave()
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


def _raise_with_note(stage: str) -> Any:
    def fail(exc: Exception, what: str, position: int) -> None:
        add_stage_note(exc, stage, position, what)
        raise exc

    return fail


@functional_datapipe("load_from_tfrecord")
class TFRecordLoader(IterDataPipe[dict[str, Any]]):
    """Read the ``tf.train.Example`` records of TFRecord files in ``(path, stream)`` pairs
    (functional name: ``load_from_tfrecord``), without TensorFlow or protobuf.

    Args:
        datapipe: a pipe of ``(path, binary stream)`` pairs, e.g. ``open_files(mode="b")``.
        spec: ``{name: (shape, dtype)}``: only these features are kept, each reshaped (``shape``
            may hold one ``-1``; ``None`` keeps it) and, for a ``torch.dtype``, converted; a
            record lacking one of them raises. ``None`` (default): every feature, as it is.
        length: the nominal ``len()`` (``-1``: unknown).
        length_check: check the CRC-32C of every record's length and data (torchdata checks
            none). In pure Python this runs at about 10 MB/s of records; the ``crc32c`` or
            ``google_crc32c`` package, where installed, does it in C. ``False`` skips the check.
        max_record_size: the longest record read, in bytes: :data:`MAX_RECORD_SIZE` (1 GiB) by
            default, ``None`` for no limit. A header's claimed length is checked against it (and,
            where the stream's size is known, against the bytes left) before anything is
            allocated: a file you did not write could claim any length (16 bytes claiming 16 GiB).

    Yields:
        One dict per record, ``{name: value}``: an ``int64_list`` as an ``int64`` tensor, a
        ``float_list`` as a ``float32`` tensor, a ``bytes_list`` as a list of ``bytes``. A
        ``SequenceExample``'s feature lists give lists of those (stacked into one tensor when
        ``spec`` gives a ``torch.dtype``).

    Raises:
        RuntimeError: a truncated file (or a record claiming more bytes than the file has left:
        the message names its offset, the claim and what is left), a CRC that does not match, a
        malformed record or a record missing a feature of ``spec`` (torchdata's phrases), with a
        note naming the stage, the file and the record.
        datapipes.errors.SizeLimitError: (a ``ValueError``) a record longer than
            ``max_record_size``, named the same way.
        TypeError: an item is not a ``(path, stream)`` pair.

    Checkpoint: a pass stopped inside a file saves its path and the records read; the resumed
    pass opens it again through the opener upstream (or copies an in-memory stream into the
    state, as the text readers (``readlines``, ``parse_csv``) do) and reads past them.

    Example:
        >>> import io, struct
        >>> from datapipes.iter import IterableWrapper
        >>> def varint(n):
        ...     out = b""
        ...     while n > 0x7F:
        ...         out += bytes([n & 0x7F | 0x80]); n >>= 7
        ...     return out + bytes([n])
        >>> def field(number, payload):
        ...     return varint(number << 3 | 2) + varint(len(payload)) + payload
        >>> feature = field(3, field(1, varint(7)))  # Feature{int64_list: Int64List{value: [7]}} (packed)
        >>> example = field(1, field(1, field(1, b"label") + field(2, feature)))
        >>> record = struct.pack("<Q", len(example)) + b"\\0" * 4 + example + b"\\0" * 4
        >>> list(IterableWrapper([("a.tfrecord", io.BytesIO(record))]).load_from_tfrecord(length_check=False))
        [{'label': tensor([7])}]

    See also: :class:`~datapipes.iter.FileOpener`.
    """

    _saves = "same as readlines"

    def __init__(
        self,
        datapipe: IterDataPipe[tuple[str, Any]],
        spec: dict[str, tuple[Any, Any]] | None = None,
        length: int = -1,
        *,
        length_check: bool = True,
        max_record_size: int | None = MAX_RECORD_SIZE,
    ) -> None:
        stage = "TFRecordLoader"
        require_pipe(datapipe, stage)
        if spec is not None:
            if not isinstance(spec, Mapping):
                raise TypeError(f"{stage}: spec must be a dict of name -> (shape, dtype), got {type(spec).__name__}")
            for key, value in spec.items():
                if not isinstance(key, str) or not (isinstance(value, (tuple, list)) and len(value) == 2):
                    raise TypeError(f"{stage}: spec must map names to (shape, dtype) pairs, got {key!r}: {value!r:.100}")
        require_int(length, stage, "length", minimum=-1)
        require_bool(length_check, stage, "length_check")
        require_int(max_record_size, stage, "max_record_size", minimum=1, optional=True)
        self.datapipe = datapipe
        self.spec = spec
        self.length = length
        self.length_check = length_check
        self.max_record_size = max_record_size

    def _open(self, ctx: Pass) -> Iterator[dict[str, Any]]:
        # The file being read and the records of it read (see _readers._ReadRun).
        return _tfrecords(self, ctx.open(self.datapipe), _read_run(self, ctx, self.datapipe))

    def __len__(self) -> int:
        if self.length == -1:
            raise len_unknown(self, "the number of records is known only after reading (pass length=... to set it)")
        return self.length
