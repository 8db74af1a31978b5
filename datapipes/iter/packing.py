"""TokenPacker [pack_tokens]: tokenized documents packed into rows of ``seq_len`` tokens for LLM
training, and :func:`collate_packed`, which batches the rows for attention kernels that take packed
sequences (FlashAttention's varlen functions, FlexAttention document masks).

Three strategies:

- ``"concat"``: the documents back to back, cut where a row is full. A document cut at the end of a
  row goes on as the first segment of the next row (a new segment: ``segment_ids`` restart at 1 in
  every row), and its ``positions`` *continue* from where the previous row left it (as pre-training
  loaders such as torchtitan's read the text: a position is the token's offset in its document).
  Only the last row can be padded (``drop_remainder=True`` drops it).
- ``"first_fit"`` and ``"best_fit"``: documents are never cut (one longer than ``seq_len`` is handled
  as ``long_documents`` says) and ``positions`` restart at 0 at each document. Up to ``num_bins``
  rows are open at once; each document goes into the first open row (in opening order) with room
  for it, or the open row it leaves the least room in (best fit; ties go to the older row).

Every row is a dict of numpy arrays of shape ``(seq_len,)``: ``tokens`` (the documents' dtype, padded
with ``pad_id``), ``segment_ids`` and ``positions`` (int32), the documents' other keys (padded with
0), and ``cu_seqlens`` (int32, the row's segment boundaries: see :class:`TokenPacker`).

The loops are vectorised per document and per row: a document is placed by looking up the open
rows' free space (first fit: a scan of at most ``num_bins`` numbers; best fit: a bisection of them
kept sorted), and a row is built when it leaves with one ``np.concatenate`` per key and a few numpy
operations for its segment ids, positions and boundaries, never a Python loop over tokens.

Checkpoint and resume (docs/howto/checkpoint.rst): a pass's run holds the open rows (their tokens
and other keys, kept as the arrays they came in, and their segment lengths) and the rest of a
document being cut into rows, and the loops update it before each ``yield``; its state saves them as
``bytes`` with the dtype's name beside them, never pickled, and a loaded state is checked against the
stage's own limits (``seq_len``, ``num_bins``, an allow-list of numeric dtypes) before anything is
taken from it.

>>> import numpy as np
>>> from datapipes.iter import IterableWrapper
>>> from datapipes.iter.packing import TokenPacker
>>> docs = [np.array([1, 2, 3], np.int32), np.array([4, 5], np.int32), np.array([6, 7, 8, 9], np.int32)]
>>> rows = list(TokenPacker(IterableWrapper(docs), 4))
>>> [row["tokens"].tolist() for row in rows]
[[1, 2, 3, 4], [5, 6, 7, 8], [9, 0, 0, 0]]
>>> rows[1]["segment_ids"].tolist(), rows[1]["positions"].tolist(), rows[1]["cu_seqlens"].tolist()
([1, 2, 2, 2], [1, 0, 1, 2], [0, 1, 4])
"""

from __future__ import annotations

import weakref
from bisect import bisect_left, insort
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Literal, Sequence

import numpy as np
import torch

from .._collate import collate
from .._checks import require_bool
from .._engine import abandon
from .._engine.lifecycle import Resumable
from .._runtime.passes import Pass
from .._runtime.validate import check_dict, check_int, check_list, invalid
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_int, require_pipe, stage_label

__all__ = ["TokenPacker", "collate_packed"]

Row = dict[str, np.ndarray]

STRATEGIES = ("concat", "first_fit", "best_fit")
LONG_DOCUMENTS = ("split", "truncate", "drop", "error")
#: the keys a row gets from the stage; a document may not bring its own
WRITTEN = ("segment_ids", "positions", "cu_seqlens")
#: ``num_bins`` for the fit strategies when not given
DEFAULT_NUM_BINS = 16
#: the dtypes a saved state may name (numpy's ``dtype.str`` of the native numeric types)
_STATE_DTYPES = {
    np.dtype(name).str: np.dtype(name)
    for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                 "float16", "float32", "float64")
}
_INT32_MAX = 2**31 - 1
#: the counts of a pass (:attr:`TokenPacker.counts`); a state saves all but ``documents`` (its ``read``)
COUNTS = ("documents", "empty", "split", "truncated", "dropped", "rows", "tokens", "padding", "remainder")

#: stage -> the counts of its most recent pass in this process (``TokenPacker.counts``; weak keys)
_latest: weakref.WeakKeyDictionary[Any, _Counts] = weakref.WeakKeyDictionary()


# -- the position of a pass ------------------------------------------------------------------------


class _Counts:
    """The counts of a pass (see :class:`TokenPacker`, "Counts"); ``documents`` is also the position
    of the next item read, which an error names."""

    __slots__ = COUNTS

    def __init__(self) -> None:
        self.documents = 0
        self.empty = 0
        self.split = 0
        self.truncated = 0
        self.dropped = 0
        self.rows = 0
        self.tokens = 0
        self.padding = 0
        self.remainder = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COUNTS}


class _Row:
    """An open row: the documents placed in it (tuples of arrays, one per key, in any cut: a row
    loaded from a state holds one part), its segment lengths, how many tokens they make, and the
    position of its first token (``concat``: a document continued from the previous row)."""

    __slots__ = ("parts", "lengths", "fill", "first")

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.lengths: list[int] = []
        self.fill = 0
        self.first = 0


class _PackRun(Resumable):
    """The position of a ``pack_tokens`` pass between two rows:

    - the document keys and dtypes, fixed by the first document (a later one is checked and cast
      to them);
    - the open rows, each holding fewer than ``seq_len`` tokens: ``concat``'s one ``row``; the fit
      strategies' ``open`` (at most ``num_bins``, by opening number, in opening order), with
      ``by_room`` for best fit, their ``(free space, opening number)`` pairs sorted, and ``opened``,
      the next opening number;
    - ``tail``: a document being cut into rows (``concat``, or ``long_documents="split"``) and
      ``offset``, the number of its tokens already placed;
    - the counts (``counts.documents``, the items read, is the position an error names).

    The loops keep these attributes up to date before each ``yield``; nothing is read from a frame.
    """

    __slots__ = ("pipe", "label", "keys", "dtypes", "pads", "plain", "dtype", "index", "counts", "row", "open",
                 "by_room", "opened", "tail", "offset")

    def __init__(self, pipe: TokenPacker) -> None:
        super().__init__()
        self.pipe = pipe
        self.label = stage_label(pipe)
        self.keys: tuple[str, ...] = ()  # () until the first document fixes them
        self.dtypes: tuple[np.dtype[Any], ...] = ()
        self.pads: tuple[np.ndarray, ...] = ()
        self.plain = False  # the documents are bare token arrays (keys == ("tokens",))
        self.dtype: np.dtype[Any] | None = None  # the tokens' dtype
        self.index = np.arange(pipe.seq_len, dtype=np.int32)
        self.counts = _Counts()
        self.row = _Row()
        self.open: dict[int, _Row] = {}
        self.by_room: list[tuple[int, int]] = []
        self.opened = 0
        self.tail: tuple[np.ndarray, ...] | None = None
        self.offset = 0

    # -- documents --------------------------------------------------------------------------------
    def document(self, item: Any) -> tuple[np.ndarray, ...] | None:
        """``item`` as a tuple of 1-D arrays (``tokens`` first, then the other keys in the first
        document's order), cast to the fixed dtypes; ``None`` for an empty document."""
        counts = self.counts
        n = counts.documents
        counts.documents = n + 1
        if type(item) is np.ndarray and self.plain and item.dtype == self.dtype and item.ndim == 1:
            if len(item):
                return (item,)
            counts.empty += 1
            return None
        if type(item) is dict and len(item) == len(self.keys) > 1:  # a dict as the first document's
            arrays: tuple[Any, ...] = tuple([item.get(key) for key in self.keys])
            length = len(arrays[0]) if type(arrays[0]) is np.ndarray else 0
            if length and all(type(a) is np.ndarray and a.dtype == dt and a.ndim == 1 and len(a) == length
                              for a, dt in zip(arrays, self.dtypes)):
                return arrays
        return self._document(item, n)

    def _document(self, item: Any, n: int) -> tuple[np.ndarray, ...] | None:
        label = self.label
        if isinstance(item, Mapping):
            if "tokens" not in item:
                raise ValueError(f"{label}: item {n}: a dict document must have a 'tokens' key, got the keys "
                                 f"{list(item)!r:.200}")
            values: Mapping[Any, Any] = item
            names = list(item)
            in_dict = True
        else:
            values = {"tokens": item}
            names = ["tokens"]
            in_dict = False
        keys = self.keys
        if not keys:
            for name in names:
                if type(name) is not str:
                    raise TypeError(f"{label}: item {n}: a dict document's keys must be str, got {name!r:.100}")
                if name in WRITTEN:
                    raise ValueError(f"{label}: item {n}: the document has a key {name!r}, which the stage writes "
                                     f"itself ({', '.join(WRITTEN)}); rename it")
            keys = ("tokens", *(name for name in names if name != "tokens"))
        elif len(names) != len(keys) or set(names) != set(keys):
            raise ValueError(f"{label}: item {n}: the document's keys {sorted(map(str, names))} differ from the first "
                             f"document's, {sorted(keys)}; every document must have the same keys")
        fixed = self.dtypes or (None,) * len(keys)
        arrays = tuple(self._array(values[key], key, dt, n, in_dict) for key, dt in zip(keys, fixed))
        length = len(arrays[0])
        for key, array in zip(keys[1:], arrays[1:]):
            if len(array) != length:
                raise ValueError(f"{label}: item {n}: key {key!r} holds {len(array)} values and 'tokens' {length}; "
                                 "every key must hold one value per token")
        if length == 0:
            self.counts.empty += 1
            return None
        if not self.keys:  # the first document fixes the keys and dtypes (in native byte order)
            self.fix(keys, tuple(array.dtype.newbyteorder("=") for array in arrays))
            arrays = tuple(a if a.dtype == dt else a.astype(dt) for a, dt in zip(arrays, self.dtypes))
        return arrays

    def _array(self, x: Any, key: str, fixed: np.dtype[Any] | None, n: int, in_dict: bool) -> np.ndarray:
        """One key of a document as a 1-D array of an allowed kind, of its fixed dtype once known."""
        label = self.label
        what = f"key {key!r}" if in_dict else "a document"
        tokens = key == "tokens"
        if type(x) is not np.ndarray:
            if isinstance(x, torch.Tensor):
                try:
                    x = x.detach().cpu().numpy()
                except TypeError as e:  # a dtype numpy lacks (bfloat16)
                    raise TypeError(f"{label}: item {n}: {what} is a torch tensor of dtype {x.dtype}, which numpy "
                                    "cannot hold; convert it to an integer dtype") from e
            elif isinstance(x, (list, tuple)):
                if not x:
                    x = np.empty(0, np.int64 if fixed is None else fixed)
                else:
                    try:
                        x = np.asarray(x)
                    except (ValueError, TypeError) as e:
                        raise ValueError(f"{label}: item {n}: {what} is a list that is not a flat list of numbers "
                                         f"({e})") from None
            elif not isinstance(x, np.ndarray):
                if in_dict:
                    raise TypeError(f"{label}: item {n}: {what} must be a 1-D array (a numpy array, a list or a 1-D "
                                    f"torch tensor), got {type(x).__name__}")
                raise TypeError(f"{label}: item {n}: a document must be a 1-D array of integer tokens (a numpy array, "
                                f"a list or a 1-D torch tensor) or a dict of them with a 'tokens' key, got "
                                f"{type(x).__name__}")
        if x.ndim != 1:
            raise ValueError(f"{label}: item {n}: {what} must be 1-D, got an array of shape {x.shape}")
        kind = x.dtype.kind
        if kind not in ("iu" if tokens else "biuf"):
            want = "integer tokens" if tokens else "numbers (bool, int or float)"
            raise TypeError(f"{label}: item {n}: {what} must hold {want}, got dtype {x.dtype}")
        if fixed is not None and x.dtype != fixed:
            x = self._cast(x, fixed, what, n)
        return x

    def _cast(self, x: np.ndarray, fixed: np.dtype[Any], what: str, n: int) -> np.ndarray:
        kind, want = x.dtype.kind, fixed.kind
        if np.can_cast(x.dtype, fixed) or (want == "f" and kind in "biuf"):
            return x.astype(fixed)
        if want in "iu" and kind in "iu":
            info = np.iinfo(fixed)
            low, high = int(x.min()), int(x.max())
            if low < info.min or high > info.max:
                raise ValueError(f"{self.label}: item {n}: {what} holds values from {low} to {high}, which the dtype "
                                 f"{fixed} of the first document cannot hold; give every document one dtype")
            return x.astype(fixed)
        raise TypeError(f"{self.label}: item {n}: {what} has dtype {x.dtype} and the first document {fixed}, which "
                        "it cannot be cast to; give every document one dtype")

    def fix(self, keys: tuple[str, ...], dtypes: tuple[np.dtype[Any], ...]) -> None:
        """Fix the documents' keys and dtypes (from the first document, or from a state)."""
        pad_id = self.pipe.pad_id
        info = np.iinfo(dtypes[0])
        if not info.min <= pad_id <= info.max:
            raise ValueError(f"{self.label}: pad_id={pad_id} does not fit the tokens' dtype {dtypes[0]} "
                             f"({info.min} to {info.max})")
        self.keys, self.dtypes = keys, dtypes
        self.dtype = dtypes[0]
        self.plain = keys == ("tokens",)
        seq_len = self.pipe.seq_len
        self.pads = (np.full(seq_len, pad_id, dtypes[0]), *(np.zeros(seq_len, dt) for dt in dtypes[1:]))

    # -- rows -------------------------------------------------------------------------------------
    def build(self, row: _Row) -> Row:
        """The row as the stage yields it, counted; one concatenation per key."""
        seq_len = self.pipe.seq_len
        fill = row.fill
        pad = seq_len - fill
        lengths = np.array(row.lengths, np.int32)
        cu = np.zeros(len(lengths) + 1, np.int32)
        np.cumsum(lengths, out=cu[1:])
        segment_ids = np.zeros(seq_len, np.int32)
        segment_ids[:fill] = np.repeat(_segment_numbers(len(lengths)), lengths)
        starts = cu[:-1]
        if row.first:
            starts = starts.copy()
            starts[0] -= row.first
        positions = np.zeros(seq_len, np.int32)
        positions[:fill] = self.index[:fill] - np.repeat(starts, lengths)
        out: Row = {}
        for k, key in enumerate(self.keys):
            parts = [doc[k] for doc in row.parts]
            if pad:
                parts.append(self.pads[k][:pad])
            out[key] = np.concatenate(parts)
            if k == 0:
                out["segment_ids"] = segment_ids
                out["positions"] = positions
        out["cu_seqlens"] = cu
        counts = self.counts
        counts.rows += 1
        counts.tokens += fill
        counts.padding += pad
        return out

    def alone(self, doc: tuple[np.ndarray, ...], first: int) -> Row:
        """A row of ``doc`` (``seq_len`` tokens) alone, the position of its first token ``first``."""
        row = _Row()
        row.parts.append(doc)
        row.lengths.append(len(doc[0]))
        row.fill = len(doc[0])
        row.first = first
        return self.build(row)

    # -- state ------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        counts = self.counts
        nkeys = len(self.keys)
        state: dict[str, Any] = {
            "keys": list(self.keys) or None,
            "dtypes": [dt.str for dt in self.dtypes] or None,
            "read": counts.documents,
            "counts": {name: getattr(counts, name) for name in COUNTS[1:]},
            "rows": [{"data": _bytes(row.parts, nkeys), "lengths": list(row.lengths), "first": row.first}
                     for row in ([self.row] if self.row.fill else []) + list(self.open.values())],
            "tail": None,
        }
        if self.tail is not None:
            state["tail"] = {"data": [array.tobytes() for array in self.tail], "offset": self.offset}
        return state

    def load(self, state: dict[str, Any]) -> None:
        pipe = self.pipe
        seq_len, bins, concat = pipe.seq_len, pipe._bins, pipe.strategy == "concat"
        check_dict(state, keys=("keys", "dtypes", "read", "counts", "rows", "tail"))
        read = check_int(state, "read")
        counts = check_dict(state["counts"], "state['counts']", keys=COUNTS[1:])
        for name in COUNTS[1:]:
            _check_int(counts[name], f"state['counts'][{name!r}]", 0, None)
        keys: list[str] = []
        dtypes: list[np.dtype[Any]] = []
        if state["keys"] is None or state["dtypes"] is None:
            if state["keys"] is not None or state["dtypes"] is not None:
                invalid("state['keys'] and state['dtypes'] must both be None (no document read yet) or both lists")
            if state["rows"] or state["tail"] is not None:
                invalid("the state holds rows or a document but no keys and dtypes")
        else:
            keys, dtypes = _check_keys(state)
        saved_rows = check_list(state, "rows", 1 if concat else bins,
                                limit="concat (one open row)" if concat else f"num_bins={bins}")
        rows: list[_Row] = []
        for i, saved in enumerate(saved_rows):
            where = f"state['rows'][{i}]"
            check_dict(saved, where, keys=("data", "lengths", "first"))
            lengths = check_list(saved, "lengths", seq_len, where=where)
            if not lengths or any(type(x) is not int or x < 1 for x in lengths):
                invalid(f"{where}['lengths'] must be a non-empty list of ints >= 1, got {lengths!r:.100}")
            fill = sum(lengths)
            if fill >= seq_len:
                invalid(f"{where}: its segment lengths sum to {fill}; an open row holds fewer than "
                        f"seq_len={seq_len} tokens")
            # a continued document's first position (concat only), kept within int32 positions
            first = saved["first"]
            if not concat and (type(first) is not int or first != 0):
                invalid(f"{where}['first'] must be 0: only concat continues a document across rows, got "
                        f"{first!r:.100}")
            first = _check_int(first, f"{where}['first']", 0, _INT32_MAX - seq_len)
            row = _Row()
            row.parts.append(_arrays(saved, where, keys, dtypes, fill))
            row.lengths = list(lengths)
            row.fill = fill
            row.first = first
            rows.append(row)
        tail = state["tail"]
        doc: tuple[np.ndarray, ...] | None = None
        offset = 0
        if tail is not None:
            if not concat and pipe.long_documents != "split":
                invalid(f"state['tail'] must be None: long_documents={pipe.long_documents!r} cuts no document")
            if concat and rows:
                invalid("state['tail'] must be None while a row is open: concat cuts a document into rows before "
                        "it opens one")
            check_dict(tail, "state['tail']", keys=("data", "offset"))
            doc = _arrays(tail, "state['tail']", keys, dtypes, None)
            # the tokens of the document already placed: fewer than it holds (concat: at least one,
            # and its positions within int32)
            high = len(doc[0]) - 1
            offset = _check_int(tail["offset"], "state['tail']['offset']", 1 if concat else 0,
                                min(high, _INT32_MAX - seq_len) if concat else high)
        if keys:
            self.fix(tuple(keys), tuple(dtypes))
        c = self.counts
        c.documents = read
        for name in COUNTS[1:]:
            setattr(c, name, counts[name])
        if concat:
            self.row = rows[0] if rows else _Row()
        else:
            self.open = dict(enumerate(rows))
            self.by_room = sorted((seq_len - row.fill, i) for i, row in enumerate(rows))
            self.opened = len(rows)
        self.tail, self.offset = doc, offset


def _check_int(value: Any, what: str, lo: int, hi: int | None) -> int:
    """``value``, an int (not a bool) from ``lo`` to ``hi`` (``None``: no bound), else the state's
    ``ValueError`` naming ``what``."""
    if type(value) is not int or value < lo or (hi is not None and value > hi):
        bounds = f"an int >= {lo}" if hi is None else f"an int from {lo} to {hi}"
        invalid(f"{what} must be {bounds}, got {value!r:.100}")
    return value


def _bytes(parts: list[tuple[np.ndarray, ...]], nkeys: int) -> list[bytes]:
    if len(parts) == 1:
        return [array.tobytes() for array in parts[0]]
    return [np.concatenate([doc[k] for doc in parts]).tobytes() for k in range(nkeys)]


def _check_keys(state: dict[str, Any]) -> tuple[list[str], list[np.dtype[Any]]]:
    """The state's document keys and dtypes: ``tokens`` first, of an integer dtype; the dtypes
    named from the allow-list."""
    keys = check_list(state, "keys")
    names = check_list(state, "dtypes")
    if not keys or keys[0] != "tokens" or any(type(k) is not str for k in keys) or len(set(keys)) != len(keys):
        invalid(f"state['keys'] must be a list of distinct str, 'tokens' first, got {keys!r:.100}")
    if any(k in WRITTEN for k in keys):
        invalid(f"state['keys'] holds a key the stage writes ({', '.join(WRITTEN)}): {keys!r:.100}")
    if len(names) != len(keys):
        invalid(f"state['dtypes'] holds {len(names)} dtypes for {len(keys)} keys")
    dtypes = []
    for name in names:
        dt = _STATE_DTYPES.get(name) if type(name) is str else None
        if dt is None:
            invalid(f"state['dtypes'] must name numeric dtypes ({', '.join(sorted(_STATE_DTYPES))}), "
                    f"got {name!r:.100}")
        dtypes.append(dt)
    if dtypes[0].kind not in "iu":
        invalid(f"state['dtypes'][0] is the tokens' dtype and must be an integer dtype, got {names[0]!r}")
    return list(keys), dtypes


def _arrays(saved: dict[str, Any], where: str, keys: list[str], dtypes: list[np.dtype[Any]],
            length: int | None) -> tuple[np.ndarray, ...]:
    """``saved['data']``: one bytes buffer per key, each of ``length`` values (of one number of
    values, at least 1, when ``length`` is None), as read-only arrays over the bytes."""
    data = check_list(saved, "data", where=where)
    if len(data) != len(keys):
        invalid(f"{where}['data'] must hold one bytes buffer per key ({len(keys)}), got {len(data)}")
    arrays = []
    for key, dt, buffer in zip(keys, dtypes, data):
        if type(buffer) is not bytes:
            invalid(f"{where}['data'] must hold bytes, got {type(buffer).__name__} for {key!r}")
        if len(buffer) % dt.itemsize:
            invalid(f"{where}['data'] holds {len(buffer)} bytes for {key!r}, not a multiple of {dt.itemsize} "
                    f"(the size of a {dt})")
        count = len(buffer) // dt.itemsize
        if length is None:
            if count < 1:
                invalid(f"{where}['data'] holds an empty document")
            length = count
        if count != length:
            invalid(f"{where}['data'] holds {count} values for {key!r}, where {length} are expected (its segment "
                    "lengths' sum, or the tokens' count)")
        arrays.append(np.frombuffer(buffer, dt))
    return tuple(arrays)


#: segment numbers 1, 2, ... (a row holds at most seq_len segments)
_ARANGE = np.arange(2**16 + 1, dtype=np.int32)


def _segment_numbers(n: int) -> np.ndarray:
    return _ARANGE[1:n + 1] if n <= 2**16 else np.arange(1, n + 1, dtype=np.int32)


# -- the loops -------------------------------------------------------------------------------------


def _cut_concat(run: _PackRun, seq_len: int) -> Iterator[Row]:
    """``concat``: the rows cut from ``run.tail`` past ``run.offset`` (whole rows, positions going on),
    then the rest of it (fewer than ``seq_len`` tokens) opens the row (empty before)."""
    doc = run.tail
    assert doc is not None
    length = len(doc[0])
    offset = run.offset
    while length - offset >= seq_len:
        out = run.alone(tuple(a[offset:offset + seq_len] for a in doc), offset)
        offset += seq_len
        if offset == length:
            run.tail = None
        run.offset = offset
        yield out
    if offset < length:
        row = run.row
        row.parts.append(tuple(a[offset:] for a in doc))
        row.lengths.append(length - offset)
        row.fill = length - offset
        row.first = offset
    run.tail = None


def _concat(pipe: TokenPacker, source: Iterator[Any], run: _PackRun) -> Iterator[Row]:
    run.started = True
    seq_len = pipe.seq_len
    document = run.document
    try:
        if run.tail is not None:
            yield from _cut_concat(run, seq_len)
        for item in source:
            doc = document(item)
            if doc is None:
                continue
            row = run.row
            length = len(doc[0])
            room = seq_len - row.fill
            if length < room:
                row.parts.append(doc)
                row.lengths.append(length)
                row.fill += length
                continue
            row.parts.append(doc if length == room else tuple(a[:room] for a in doc))
            row.lengths.append(room)
            row.fill = seq_len
            run.row = _Row()
            if length > room:
                run.tail, run.offset = doc, room
            out = run.build(row)
            yield out
            if run.tail is not None:
                yield from _cut_concat(run, seq_len)
        row = run.row
        if row.fill:
            run.row = _Row()
            if pipe.drop_remainder:
                run.counts.remainder += row.fill
            else:
                yield run.build(row)
    except BaseException:
        abandon(source)  # this frame names it: release the upstream now, not at collection
        raise


_Place = Callable[["_PackRun", tuple[np.ndarray, ...], int, int], "Row | None"]


def _place_first(run: _PackRun, doc: tuple[np.ndarray, ...], length: int, seq_len: int) -> Row | None:
    """First fit: put ``doc`` (1 to ``seq_len`` tokens) in the first open row, in opening order,
    with room for it (a scan of at most ``num_bins`` rows), else open a row (:func:`_open`).
    Returns the row that leaves, if any."""
    most = seq_len - length  # the fill of a row with room for it
    for key, row in run.open.items():
        if row.fill <= most:
            return _add(run, key, row, doc, length, seq_len)
    return _open(run, doc, length, seq_len, False)


def _place_best(run: _PackRun, doc: tuple[np.ndarray, ...], length: int, seq_len: int) -> Row | None:
    """Best fit: put ``doc`` in the open row it leaves the least room in, the oldest of equals (a
    bisection of ``by_room``), else open a row (:func:`_open`). Returns the row that leaves, if any."""
    by_room = run.by_room
    j = bisect_left(by_room, (length, -1))
    if j == len(by_room):
        return _open(run, doc, length, seq_len, True)
    room, key = by_room.pop(j)
    if room > length:
        insort(by_room, (room - length, key))
    return _add(run, key, run.open[key], doc, length, seq_len)


def _add(run: _PackRun, key: int, row: _Row, doc: tuple[np.ndarray, ...], length: int, seq_len: int) -> Row | None:
    row.parts.append(doc)
    row.lengths.append(length)
    row.fill += length
    if row.fill < seq_len:
        return None
    del run.open[key]
    return run.build(row)


def _open(run: _PackRun, doc: tuple[np.ndarray, ...], length: int, seq_len: int, best: bool) -> Row | None:
    """``doc`` fits no open row: a document of ``seq_len`` tokens leaves at once as a row of its own;
    another opens a row, once the fullest open row (the oldest of equals) has left if ``num_bins``
    are open. Returns the row that leaves, if any."""
    if length == seq_len:
        return run.alone(doc, 0)
    rows = run.open
    out = None
    if len(rows) == run.pipe._bins:
        if best:
            key = run.by_room.pop(0)[1]
        else:
            key = max(rows, key=lambda k: rows[k].fill)  # the first of equals: the oldest
        out = run.build(rows.pop(key))
    row = _Row()
    row.parts.append(doc)
    row.lengths.append(length)
    row.fill = length
    key = run.opened
    run.opened = key + 1
    rows[key] = row
    if best:
        insort(run.by_room, (seq_len - length, key))
    return out


def _pieces(run: _PackRun, seq_len: int, place: _Place) -> Iterator[Row]:
    """``long_documents="split"``: the whole rows cut from ``run.tail`` past ``run.offset`` (each its
    own document), then the rest placed as a document."""
    doc = run.tail
    assert doc is not None
    length = len(doc[0])
    offset = run.offset
    while length - offset >= seq_len:
        out = run.alone(tuple(a[offset:offset + seq_len] for a in doc), 0)
        offset += seq_len
        if offset == length:
            run.tail = None
        run.offset = offset
        yield out
    run.tail = None
    if offset < length:
        out_ = place(run, tuple(a[offset:] for a in doc), length - offset, seq_len)
        if out_ is not None:
            yield out_


def _fit(pipe: TokenPacker, source: Iterator[Any], run: _PackRun) -> Iterator[Row]:
    run.started = True
    seq_len = pipe.seq_len
    place = _place_best if pipe.strategy == "best_fit" else _place_first
    long_documents = pipe.long_documents
    document = run.document
    try:
        if run.tail is not None:
            yield from _pieces(run, seq_len, place)
        for item in source:
            doc = document(item)
            if doc is None:
                continue
            length = len(doc[0])
            if length > seq_len:
                if long_documents == "split":
                    run.counts.split += 1
                    run.tail, run.offset = doc, 0
                    yield from _pieces(run, seq_len, place)
                    continue
                if long_documents == "truncate":
                    run.counts.truncated += 1
                    doc = tuple(a[:seq_len] for a in doc)
                    length = seq_len
                elif long_documents == "drop":
                    run.counts.dropped += 1
                    continue
                else:
                    raise ValueError(f"{run.label}: item {run.counts.documents - 1}: a document of {length} tokens "
                                     f"is longer than seq_len={seq_len} (long_documents='error'; 'split', "
                                     "'truncate' or 'drop' handle it)")
            out = place(run, doc, length, seq_len)
            if out is not None:
                yield out
        rows = run.open
        run.by_room.clear()
        if pipe.drop_remainder:
            run.counts.remainder += sum(row.fill for row in rows.values())
            rows.clear()
        while rows:  # the rows still open, oldest first
            yield run.build(rows.pop(next(iter(rows))))
    except BaseException:
        abandon(source)  # this frame names it: release the upstream now, not at collection
        raise


_LOOPS: dict[str, Callable[[TokenPacker, Iterator[Any], _PackRun], Iterator[Row]]] = {
    "concat": _concat, "first_fit": _fit, "best_fit": _fit,
}


# -- the stage -------------------------------------------------------------------------------------


@functional_datapipe("pack_tokens")
class TokenPacker(IterDataPipe[Row]):
    """Pack tokenized documents into rows of ``seq_len`` tokens for LLM training
    (functional name: ``pack_tokens``).

    Each document is a 1-D array of integer tokens (numpy; a list of ints or a 1-D torch tensor is
    converted), or a dict of equal-length 1-D arrays with a ``tokens`` key, whose other keys (a
    fine-tuning ``loss_mask``, say) travel token by token with their tokens. The first document
    fixes the keys and each key's dtype; later documents must have the same keys, and are cast to
    those dtypes where their values fit. Empty documents are skipped (counted as ``empty``).

    Strategies:

    - ``"concat"``: the documents back to back, cut where a row is full. The rest of a cut document
      starts the next row as its first segment; its ``positions`` continue from the previous row
      (the token's offset in its document, as torchtitan's pre-training loader has them), and
      ``segment_ids`` restart at 1 in every row. Only the last row is padded, or dropped with
      ``drop_remainder=True``.
    - ``"first_fit"``: a document goes into the first open row, in opening order, with room for it.
    - ``"best_fit"``: into the open row it leaves the least room in (the oldest of equals).

    With the fit strategies a document is never cut across rows and its ``positions`` start at 0.
    Up to ``num_bins`` rows are open at once. A row leaves as soon as it is full; a document that
    fits no open row opens a new one, and when ``num_bins`` rows are already open the *fullest* of
    them (the oldest of equally full ones) leaves first. A document of exactly ``seq_len`` tokens
    that fits no open row leaves at once as a row of its own. A document longer than ``seq_len``
    is, by ``long_documents``: ``"split"`` (default) cut into pieces of ``seq_len`` tokens and a last
    shorter one, each its own document (the whole pieces leave at once as rows of their own, the
    last is placed as any document); ``"truncate"``: cut to its first ``seq_len`` tokens;
    ``"drop"``: skipped; ``"error"``: ``ValueError``. At the end of the input the rows still open
    leave in opening order, padded, or, with ``drop_remainder=True``, are dropped (the rows that
    left earlier are always kept, full or not).

    A row is a dict of numpy arrays: ``tokens``, ``segment_ids``, ``positions``, the documents'
    other keys, each of shape ``(seq_len,)``, and ``cu_seqlens``:

    - ``tokens``: the documents' dtype; padding is ``pad_id``;
    - ``segment_ids`` (int32): 1, 2, ... for the segments of the row, in order; 0 for padding;
    - ``positions`` (int32): the position of each token in its document (0 at a document's start;
      ``concat``: a continued document goes on counting); 0 for padding;
    - the other keys: their own dtypes; padding is 0 (``False``);
    - ``cu_seqlens`` (int32, shape ``(segments + 1,)``): the segments' cumulative boundaries,
      FlashAttention's varlen convention: ``[0, end_1, ..., end_k]``, ``end_k`` the number of tokens
      that are not padding. Padding is not a segment, so ``cu_seqlens[-1] < seq_len`` exactly when
      the row is padded. :func:`collate_packed` makes one for a whole batch.

    Args:
        datapipe: the source pipe, yielding documents.
        seq_len: the tokens per row, at least 1.
        strategy: ``"concat"`` (default), ``"first_fit"`` or ``"best_fit"``.
        num_bins: the fit strategies' number of open rows, at least 1 (default 16). Memory and
            checkpoint size grow with it (at most ``num_bins * seq_len`` tokens held), padding falls.
            Refused with ``"concat"``, which keeps one row open.
        pad_id: the token that pads ``tokens`` (an int that fits their dtype).
        long_documents: what the fit strategies do with a document longer than ``seq_len``:
            ``"split"`` (default), ``"truncate"``, ``"drop"`` or ``"error"``. Refused with ``"concat"``,
            which cuts every document where the row ends.
        drop_remainder: drop the rows left at the end of the input (``concat``: the last, partial
            row; fit strategies: the rows still open) instead of padding them.

    Yields:
        Rows, dicts of numpy arrays as above, in the order they leave.

    Raises:
        TypeError/ValueError: bad arguments, naming the argument and the value.
        TypeError/ValueError: a bad document (not a 1-D array of integers, a dict without ``tokens``,
            keys of unequal lengths, keys or dtypes unlike the first document's, a ``pad_id`` its
            dtype cannot hold, a document too long with ``long_documents="error"``); the message
            names the stage and the item's position.

    Counts: ``pipe.counts`` is a dict of the counts of the stage's most recent pass, in this process
    (with a DataLoader's worker processes, the counts stay in the workers): ``documents`` (items
    read), ``empty`` (empty documents skipped), ``split``, ``truncated`` and ``dropped`` (long
    documents so handled), ``rows`` (rows yielded), ``tokens`` (document tokens yielded),
    ``padding`` (padding tokens yielded) and ``remainder`` (tokens dropped by ``drop_remainder``).
    They are part of the pass's state, so a resumed pass counts on from where it was saved.

    A pass's state (``it.state_dict()``, taken between two rows) holds the rest of a document being
    cut into rows (as bytes, with its dtypes' names), the counts, and, for the fit strategies, the
    open rows: their tokens and other keys as bytes and their segment lengths (at most ``num_bins``
    rows of fewer than ``seq_len`` tokens). ``concat``'s one open row has always just left at a row
    boundary, so its state holds only the rest of the document that filled it, if any. Nothing in
    a state is pickled; a loaded one is checked (dtypes from an allow-list, lengths within
    ``seq_len`` and ``num_bins``, buffers of whole values agreeing with the lengths) and refused with
    ``ValueError`` otherwise. A document's arrays are held, not copied, until its row leaves: a
    source must not change an array it has yielded.

    ``len()`` is unknown (``TypeError``): how many rows the documents fill is known only by packing them.

    Example:
        >>> import numpy as np
        >>> from datapipes.iter import IterableWrapper
        >>> from datapipes.iter.packing import TokenPacker
        >>> docs = IterableWrapper([np.arange(1, 4), np.arange(4, 9), np.arange(9, 11)])
        >>> [r["tokens"].tolist() for r in TokenPacker(docs, 6, strategy="first_fit")]
        [[1, 2, 3, 9, 10, 0], [4, 5, 6, 7, 8, 0]]
        >>> [r["segment_ids"].tolist() for r in TokenPacker(docs, 6, strategy="first_fit")]
        [[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 0]]
        >>> [r["tokens"].tolist() for r in docs.pack_tokens(6)]  # concat: cut where a row is full
        [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 0, 0]]

    See also: :func:`collate_packed`, :class:`~datapipes.iter.MaxTokenBucketizer` (batches of
    similar lengths, unpacked).
    """

    _saves = (
        "the rest of a document being cut into rows, and a few counts; ``first_fit``/``best_fit``: also the open "
        "rows' tokens and other keys (bytes, with their dtypes' names) and segment lengths (at most ``num_bins`` "
        "rows of fewer than ``seq_len`` tokens)"
    )

    _repr_fields = ("seq_len", "strategy")

    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        seq_len: int,
        *,
        strategy: Literal["concat", "first_fit", "best_fit"] = "concat",
        num_bins: int | None = None,
        pad_id: int = 0,
        long_documents: Literal["split", "truncate", "drop", "error"] | None = None,
        drop_remainder: bool = False,
    ) -> None:
        stage = "TokenPacker"
        require_pipe(datapipe, stage)
        require_int(seq_len, stage, "seq_len", minimum=1)
        if strategy not in STRATEGIES:
            raise ValueError(f"{stage}: strategy must be one of {', '.join(map(repr, STRATEGIES))}, got {strategy!r}")
        require_int(num_bins, stage, "num_bins", minimum=1, optional=True)
        require_int(pad_id, stage, "pad_id")
        if long_documents is not None and long_documents not in LONG_DOCUMENTS:
            raise ValueError(f"{stage}: long_documents must be one of {', '.join(map(repr, LONG_DOCUMENTS))}, "
                             f"got {long_documents!r}")
        if strategy == "concat":
            if num_bins is not None:
                raise ValueError(f"{stage}: num_bins={num_bins!r} is for strategy='first_fit' or 'best_fit'; "
                                 "strategy='concat' keeps one row open")
            if long_documents is not None:
                raise ValueError(f"{stage}: long_documents={long_documents!r} is for strategy='first_fit' or "
                                 "'best_fit'; strategy='concat' cuts every document where its row ends")
        self.datapipe = datapipe
        self.seq_len = seq_len
        self.strategy = strategy
        self.num_bins = num_bins
        self.pad_id = pad_id
        self.long_documents = long_documents
        self.drop_remainder = require_bool(drop_remainder, stage, "drop_remainder")
        if strategy != "concat":
            self.num_bins = DEFAULT_NUM_BINS if num_bins is None else num_bins
            self.long_documents = "split" if long_documents is None else long_documents
        self._bins = 1 if self.num_bins is None else self.num_bins

    def _open(self, ctx: Pass) -> Iterator[Row]:
        run = _PackRun(self)
        source = ctx.open(self.datapipe)
        ctx.track(self, run)
        _latest[self] = run.counts
        return _LOOPS[self.strategy](self, source, run)

    def __len__(self) -> int:
        raise len_unknown(self, "how many rows the documents fill is known only by packing them", NO_LEN)

    @property
    def counts(self) -> dict[str, int] | None:
        """The counts of this stage's most recent pass in this process, live while it runs (see the
        class's docstring); ``None`` before any pass."""
        counts = _latest.get(self)
        return None if counts is None else counts.as_dict()


# -- batches of rows -------------------------------------------------------------------------------


def collate_packed(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Turn a list of rows from ``pack_tokens`` into one batch of torch tensors for attention over
    packed sequences.

    Args:
        rows: a non-empty list of rows of one ``seq_len`` (dicts from :class:`TokenPacker`).

    Returns:
        A dict: every per-token key (``tokens``, ``segment_ids``, ``positions`` and the documents'
        other keys) as a tensor of shape ``(B, seq_len)``, stacked by the default collate (in a
        DataLoader worker, in shared memory); ``cu_seqlens``, one flat int32 tensor for the whole
        batch flattened to one sequence of ``B * seq_len`` tokens (row ``b``'s boundaries shifted
        by ``b * seq_len``); and ``max_seqlen``, an int, the longest sequence in it.

        In the flattened ``cu_seqlens`` the sequences tile all ``B * seq_len`` tokens, as
        ``flash_attn_varlen_func`` requires: a row's padding, which is not a segment of its row's
        own ``cu_seqlens``, is a sequence of its own here (attending only to padding; mask its loss
        where ``segment_ids == 0``). It starts at 0 and ends at ``B * seq_len``.

    Use with FlashAttention (the batch flattened to one sequence)::

        q = q.reshape(B * seq_len, n_heads, head_dim)   # and k, v alike
        out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=batch["cu_seqlens"], cu_seqlens_k=batch["cu_seqlens"],
                                     max_seqlen_q=batch["max_seqlen"], max_seqlen_k=batch["max_seqlen"],
                                     causal=True)

    Use with FlexAttention, a causal document mask from ``segment_ids``::

        seg = batch["segment_ids"]   # (B, seq_len), on the device
        def mask_mod(b, h, q, kv):
            return (seg[b, q] == seg[b, kv]) & (seg[b, q] > 0) & (q >= kv)
        block_mask = create_block_mask(mask_mod, B, None, seq_len, seq_len)

    and ``batch["positions"]`` for the rotary embeddings of each token.

    The default collate (:func:`datapipes.collate`, the DataLoader's default ``collate_fn``) stacks
    the per-token keys of rows alike, but raises ``ValueError`` for ``cu_seqlens`` as soon as two
    rows of a batch hold different numbers of segments (its shape differs); pass
    ``collate_fn=collate_packed`` instead, or drop ``cu_seqlens`` from the rows before batching.

    Raises:
        TypeError: ``rows`` is not a list or tuple of dicts (a single row: batch rows first, e.g.
            with the DataLoader's ``batch_size``).
        ValueError: no rows, rows without ``tokens`` or ``cu_seqlens``, rows of different keys or
            lengths (the default collate's messages), or a ``cu_seqlens`` unlike a row's.

    >>> import numpy as np
    >>> from datapipes.iter import IterableWrapper
    >>> docs = IterableWrapper([np.arange(1, 4), np.arange(4, 9), np.arange(9, 11)])
    >>> batch = collate_packed(list(TokenPacker(docs, 6, strategy="first_fit")))
    >>> batch["tokens"].shape, batch["cu_seqlens"].tolist(), batch["max_seqlen"]
    (torch.Size([2, 6]), [0, 3, 5, 6, 11, 12], 5)
    """
    if not isinstance(rows, (list, tuple)):
        hint = " (one row: collate a list of rows, e.g. with the DataLoader's batch_size)" if isinstance(
            rows, Mapping) else ""
        raise TypeError(f"collate_packed: takes a list of rows from pack_tokens, got {type(rows).__name__}{hint}")
    if not rows:
        raise ValueError("collate_packed: the batch is empty")
    cus = []
    per_token = []
    for b, row in enumerate(rows):
        if not isinstance(row, Mapping) or "tokens" not in row or "cu_seqlens" not in row:
            raise ValueError(f"collate_packed: row {b} is not a row from pack_tokens (a dict with 'tokens' and "
                             f"'cu_seqlens'), got {type(row).__name__}")
        cus.append(np.asarray(row["cu_seqlens"]))
        per_token.append({key: value for key, value in row.items() if key != "cu_seqlens"})
    batch = collate(per_token)
    seq_len = int(batch["tokens"].shape[1])
    if len(rows) * seq_len > _INT32_MAX:
        raise ValueError(f"collate_packed: {len(rows)} rows of {seq_len} tokens are more than int32 cu_seqlens count")
    ends = [np.zeros(1, np.int64)]
    for b, cu in enumerate(cus):
        if cu.ndim != 1 or len(cu) < 1 or cu[0] != 0 or np.any(np.diff(cu) < 1) or cu[-1] > seq_len:
            raise ValueError(f"collate_packed: row {b}'s cu_seqlens {cu.tolist()!r:.100} are not boundaries rising "
                             f"from 0 to at most seq_len={seq_len}")
        row_ends = cu[1:].astype(np.int64)
        if cu[-1] < seq_len:  # its padding: a sequence of its own
            row_ends = np.append(row_ends, seq_len)
        ends.append(row_ends + b * seq_len)
    flat = np.concatenate(ends)
    batch["cu_seqlens"] = torch.from_numpy(flat.astype(np.int32))
    batch["max_seqlen"] = int(np.diff(flat).max())
    return batch
