"""Sources of map-style pipes and helpers: SequenceWrapper, InMemoryCacheHolder [in_memory_cache],
UnZipper [unzip]."""

from __future__ import annotations

import copy
import threading
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Sequence, TypeVar

from ..datapipe import MapDataPipe, functional_datapipe, require_callable, require_int, require_pipe, source_len, stage_label
from ..errors import add_stage_note
from ..iter.zipping import unzip_columns
from ..iter.util import _may_change
from ._index import index_text, position

__all__ = ["InMemoryCacheHolder", "SequenceWrapper", "UnZipper"]

T = TypeVar("T")

#: Built-in sequences whose own iterator yields exactly ``seq[0], ..., seq[len - 1]``.
_NATIVE = (list, tuple, range)


def _deep_copy(sequence: Any) -> Any:
    """``copy.deepcopy(sequence)``; a list or tuple of items that cannot change (numbers, strings,
    ...) is copied in C instead (the same result: a new list of the same items; the tuple itself)."""
    kind = type(sequence)
    if (kind is list or kind is tuple) and not _may_change(sequence):
        return list(sequence) if kind is list else sequence
    return copy.deepcopy(sequence)


def _iter_native(pipe: SequenceWrapper[Any]) -> Iterator[Any]:
    return iter(pipe.sequence)


def _iter_mapping(pipe: SequenceWrapper[Any]) -> Iterator[Any]:
    return iter(pipe.sequence.values())  # type: ignore[attr-defined]


def _iter_indexed(pipe: SequenceWrapper[Any]) -> Iterator[Any]:
    seq = pipe.sequence
    for i in range(len(seq)):
        yield seq[i]


class SequenceWrapper(MapDataPipe[T]):
    """Wrap an indexable object with a length (a list, a tuple, a range, a numpy array, a dict, a
    torch ``Dataset`` with ``__len__``) as the source of a map-style pipe.

    Args:
        sequence: the items. ``pipe[index]`` is ``sequence[index]``: the sequence decides which
            indices it accepts (a list takes negative indices and raises ``IndexError`` out of
            range; a dict takes its keys and raises ``KeyError``), as in torch.
        deepcopy: deep-copy ``sequence`` once, here (``True``, the default, as torch's), so that
            later changes to the original do not reach the pipe. The copy costs time and memory at
            construction, in proportion to the data: a list of a million tuples takes about a
            second, and is held twice until the original is dropped. A list or tuple holding only
            numbers, strings, bytes or ``None`` is copied in C (a tuple not at all, a million-item
            list in milliseconds). ``deepcopy=False`` uses ``sequence`` itself: for a large or
            read-only sequence (a numpy array, a dataset object), or one that cannot be copied. A
            sequence that cannot be deep-copied is used as it is, with a warning, as in torch.

    Yields:
        ``sequence[0], ..., sequence[len - 1]``; for a mapping (a dict), its values in key order.

    Raises:
        TypeError: ``sequence`` has no ``__getitem__`` or no ``__len__``.
        Whatever ``sequence[index]`` raises (``IndexError``, ``KeyError``, ...), as the same object
        with its message (``list index out of range``), and a note naming the stage and the index:
        ``[datapipes] raised in stage SequenceWrapper at index 7``.

    ``len()`` is ``len(sequence)`` at call time.

    >>> from datapipes.map import SequenceWrapper
    >>> pipe = SequenceWrapper(["a", "b", "c"])
    >>> pipe[1], pipe[-1], len(pipe)
    ('b', 'c', 3)
    >>> SequenceWrapper({"x": 1, "y": 2})["y"]
    2

    See also: :class:`datapipes.iter.IterableWrapper` for iterable-style sources.
    """

    _saves = (
        "nothing: a map-style pipe is read by index and has no position; the ``to_iter_datapipe`` reading it "
        "keeps the pass's"
    )

    def __init__(self, sequence: Sequence[T], deepcopy: bool = True) -> None:
        kind = type(sequence)
        if not (hasattr(kind, "__getitem__") and hasattr(kind, "__len__")):
            raise TypeError(
                f"SequenceWrapper: sequence must support indexing and len(), got {kind.__name__}"
            )
        if deepcopy:
            try:
                sequence = _deep_copy(sequence)
            except Exception as e:  # noqa: BLE001 - any failure to copy falls back, as torch does
                warnings.warn(
                    f"SequenceWrapper: the {kind.__name__} cannot be deep-copied ({e!r}); it is used as it "
                    "is, so changing it in place changes what the pipe returns",
                    stacklevel=2,
                )
        self.sequence = sequence
        self.deepcopy = bool(deepcopy)
        if kind in _NATIVE:
            self._run = _iter_native
        elif isinstance(sequence, Mapping):
            self._run = _iter_mapping
        else:
            self._run = _iter_indexed

    def __getitem__(self, index: Any) -> T:
        try:
            return self.sequence[index]
        except Exception as e:  # free unless raised (CPython 3.11+)
            add_stage_note(e, stage_label(self), index_text(index), "index")
            raise

    def __iter__(self) -> Iterator[T]:
        return self._run(self)

    def __len__(self) -> int:
        return len(self.sequence)

    def _index_ordered(self) -> bool:
        return not isinstance(self.sequence, Mapping)  # a mapping is iterated in its keys' order


# -- InMemoryCacheHolder ---------------------------------------------------------------------------


class _IndexCache:
    """What an :class:`InMemoryCacheHolder` has read, by position, and the reads in flight. Runtime
    state of one pipe object: it pickles, and deep-copies, as an empty cache."""

    __slots__ = ("lock", "store", "filled", "loading")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.store: Any = None  # made at the first read: a dict, or cache_fn(len(source_dp))
        self.filled: set[int] = set()  # the positions whose item is in store
        self.loading: dict[int, threading.Event] = {}  # the positions some thread is reading now

    def __reduce__(self) -> tuple[type[_IndexCache], tuple[()]]:
        return _IndexCache, ()


def _new_store(pipe: InMemoryCacheHolder[Any]) -> Any:
    make = pipe.cache_fn
    if make is None:
        return {}
    n = len(pipe.source_dp)
    store = make(n)
    kind = type(store)
    if not (hasattr(kind, "__getitem__") and hasattr(kind, "__setitem__")):
        raise TypeError(
            f"InMemoryCacheHolder: cache_fn({n}) returned a {kind.__name__}: the output of `cache_fn` must be "
            "an object with both '__getitem__' and '__setitem__'"
        )
    return store


def _cache_read(pipe: InMemoryCacheHolder[T], cache: _IndexCache, i: int) -> T:
    """Item ``i`` of ``pipe.source_dp``, read into ``cache`` once however many threads ask for it."""
    while True:
        with cache.lock:
            if i in cache.filled:
                return cache.store[i]  # type: ignore[no-any-return]
            if cache.store is None:
                cache.store = _new_store(pipe)
            reading = cache.loading.get(i)
            if reading is None:
                done = cache.loading[i] = threading.Event()
                break
        reading.wait()  # another thread reads i; if its read fails, this thread reads in turn
    try:
        item = pipe.source_dp[i]
        with cache.lock:
            cache.store[i] = item
            cache.filled.add(i)
    finally:
        with cache.lock:
            del cache.loading[i]
        done.set()
    return item


@functional_datapipe("in_memory_cache")
class InMemoryCacheHolder(MapDataPipe[T]):
    """Keep every item in memory once it has been read; later reads of its position return it
    without reading the source (functional name: ``in_memory_cache``).

    Args:
        source_dp: the source map-style pipe, read by position ``0 .. len - 1`` (torchdata's
            parameter name).
        cache_fn: ``cache_fn(n)`` makes the object the items are kept in: anything with
            ``__getitem__`` and ``__setitem__`` that takes the positions ``0 .. n - 1`` (a list
            ``[None] * n``, a numpy object array). It is called once, at the first read (not at
            construction), with the source's length then. ``None`` (default): a dict that holds
            only the positions read so far.

    Yields:
        ``pipe[0], ..., pipe[len - 1]``. ``pipe[i]`` reads ``source_dp[i]`` the first time; after
        that it returns the kept object itself (not a copy), so what a random stage upstream drew
        at the first read is repeated.

    Raises:
        TypeError: ``source_dp`` is not a ``MapDataPipe`` or ``cache_fn`` is not callable (at
            construction); an index is not an int; ``cache_fn``'s object lacks ``__getitem__`` or
            ``__setitem__`` (at the first read).
        IndexError: an index out of range (negative indices count from the end, as for a list,
            and share the cached item of their position), naming the stage and ending in torch's
            words: ``InMemoryCacheHolder (length 3): Index 7 is out of range.``
        Whatever the source raises, as the same object; nothing is kept for that position, so the
            next read of it reads the source again.

    The cache is by position: the source is read as ``source_dp[0 .. len - 1]`` (for a keyed
    source such as a dict, put the cache after a stage that reads it by position).

    Threads: reads may come from several threads at once. The source is read at most once per
    position: a thread asking for a position that another thread is reading waits for that read
    (and reads the source itself if that read failed).

    Whose cache: a map-style pipe read by index has no pass to own runtime state, so the cache
    belongs to the pipe object, and lasts as long as it (no size bound; unlike torchdata, whose
    cache never recorded what it held and read the source every time). It is never pickled: an
    unpickled copy (a DataLoader worker started by ``spawn``) and a deep copy start empty and fill
    their own; a worker started by ``fork`` starts from what the parent held then; a shallow copy
    (``copy.copy``) shares it. Nothing a copy reads comes back to the original.

    ``len()`` is the source's length at call time.

    Example:
        >>> from datapipes.map import SequenceWrapper
        >>> reads = []
        >>> pipe = SequenceWrapper(range(4)).map(lambda x: reads.append(x) or x * x).in_memory_cache()
        >>> pipe[3], pipe[-1], list(pipe), reads
        (9, 9, [0, 1, 4, 9], [3, 0, 1, 2])

    See also: :class:`datapipes.iter.InMemoryCacheHolder`, which keeps the items of a whole pass.
    """

    _saves = "same as SequenceWrapper"

    def __init__(self, source_dp: MapDataPipe[T], cache_fn: Callable[[int], Any] | None = None) -> None:
        require_pipe(source_dp, "InMemoryCacheHolder", "source_dp", kind=MapDataPipe)
        require_callable(cache_fn, "InMemoryCacheHolder", "cache_fn", optional=True)
        self.source_dp = source_dp
        self.cache_fn = cache_fn
        self._cache = _IndexCache()

    def __getitem__(self, index: int) -> T:
        i = position(self, index, len(self.source_dp))
        cache = self._cache
        if i in cache.filled:
            return cache.store[i]  # type: ignore[no-any-return]
        return _cache_read(self, cache, i)

    def __len__(self) -> int:
        return source_len(self, self.source_dp, "source_dp")


# -- UnZipper --------------------------------------------------------------------------------------


def _unzip_iter(child: UnZipperChild) -> Iterator[Any]:
    col = child.column
    n = 0
    for item in child.source_datapipe:
        try:
            value = item[col]
        except Exception as e:
            add_stage_note(e, child._stage(), n, "index")
            raise
        yield value
        n += 1


class UnZipperChild(MapDataPipe[Any]):
    """One child of :class:`UnZipper`: ``child[index]`` is ``source_datapipe[index][column]``,
    read on access. ``len()`` is the source's length."""

    _repr_fields = ("column",)

    def __init__(self, source_datapipe: MapDataPipe[Sequence[Any]], sequence_length: int, column: int,
                 instance_id: int) -> None:
        self.source_datapipe = source_datapipe
        self.sequence_length = sequence_length
        #: the column of the source's items this child holds
        self.column = column
        #: this child's place in the list UnZipper returned
        self.instance_id = instance_id

    def _stage(self) -> str:
        return f"UnZipper(sequence_length={self.sequence_length}), child {self.instance_id} (column {self.column})"

    def __getitem__(self, index: Any) -> Any:
        item = self.source_datapipe[index]
        try:
            return item[self.column]
        except Exception as e:  # free unless raised (CPython 3.11+)
            add_stage_note(e, self._stage(), index_text(index), "index")
            raise

    def __iter__(self) -> Iterator[Any]:
        return _unzip_iter(self)

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")


@functional_datapipe("unzip")
class UnZipper(MapDataPipe[Any]):
    """Split a map-style pipe of sequences into one child per column (functional name: ``unzip``).
    ``UnZipper(...)`` and ``pipe.unzip(...)`` return the list of children, not a pipe.

    Args:
        source_datapipe: a map-style pipe of sequences (tuples, lists, anything indexable by int),
            each of ``sequence_length`` elements.
        sequence_length: how many columns each item has, >= 1.
        columns_to_skip: columns to leave out (ints from 0 to ``sequence_length - 1``); no child
            is made for them.

    Returns:
        A list of :class:`UnZipperChild` map-style pipes, one per column kept, in column order.
        Child ``k`` holding column ``c`` reads ``source_datapipe[index][c]`` on access: nothing
        is buffered or cached, and the children never wait for one another (a map-style pipe has
        no shared pass), so each read of a child reads the source.

    Yields:
        (each child) Its column of each source item, in the source's order.

    Raises:
        TypeError / ValueError: a bad argument, naming it.
        RuntimeError: every column is skipped (torch's phrase "All instances are being filtered
            out").
        IndexError, TypeError, ...: (on a read) an item has no such column, as the same object,
            with a note naming the stage, the child and the index. The index is passed to the
            source as it is, as :class:`Mapper` passes it: the source's own ``IndexError`` or
            ``KeyError`` comes through as the source raised it.

    ``len()`` of each child is the source's length at call time.

    Example:
        >>> from datapipes.map import SequenceWrapper
        >>> a, b, c = SequenceWrapper([(i, i + 10, i + 20) for i in range(3)]).unzip(sequence_length=3)
        >>> list(a), b[-1], len(c)
        ([0, 1, 2], 12, 3)
        >>> b, = SequenceWrapper([(1, 2, 3)]).unzip(3, columns_to_skip=[0, 2])
        >>> list(b)
        [2]

    See also: :class:`Zipper` (its inverse), :class:`datapipes.iter.UnZipper`.
    """

    _saves = "same as SequenceWrapper"

    def __new__(  # type: ignore[misc]
        cls,
        source_datapipe: MapDataPipe[Sequence[Any]],
        sequence_length: int,
        columns_to_skip: Sequence[int] | None = None,
    ) -> list[UnZipperChild]:
        require_pipe(source_datapipe, "UnZipper", "source_datapipe", kind=MapDataPipe)
        require_int(sequence_length, "UnZipper", "sequence_length")
        if sequence_length < 1:  # torchdata's words
            raise ValueError(f"UnZipper: Expected `sequence_length` larger than 0, but {sequence_length} is found")
        columns = unzip_columns(sequence_length, columns_to_skip, "UnZipperMapDataPipe")
        return [UnZipperChild(source_datapipe, sequence_length, c, k) for k, c in enumerate(columns)]
