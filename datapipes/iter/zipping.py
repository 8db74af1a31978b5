"""Stages that pair up the items of several pipes, and the one that splits pairs apart:
Zipper [zip], ZipperLongest [zip_longest], IterKeyZipper [zip_with_iter],
MapKeyZipper [zip_with_map], UnZipper [unzip].

Every ``_open(ctx)`` creates its sources' iterators at once (``ctx.open``), as part of the pass it
is handed (:mod:`datapipes._runtime.passes`), and hands them to a module-level generator that does the work: every pass
iterates each input afresh, errors pass through as the same object, and ``len()`` is computed from
the inputs' lengths at call time.

``unzip`` returns child pipes that share one pass over their source, with the machinery of ``fork``
(:mod:`datapipes.iter.broadcast.hub`, whose docstring says when a shared pass starts, ends and
restarts, how the buffer is bounded and how children pickle and resume): an ``unzip`` child is a
fork child that yields one column of each item.

Checkpoint and resume (``it.state_dict()``): ``zip`` and ``zip_longest`` keep nothing of their own
(every input stands one item per tuple on), nor does ``zip_with_map`` (its position is its
source's); ``zip_with_iter`` saves the reference items waiting in its buffer; an ``unzip`` child
saves the state of the shared pass, as a fork child does.
"""

from __future__ import annotations

import itertools
import sys
from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterator, Literal, Sequence, TypeVar, overload

from .._runtime.passes import Pass
from .._runtime.validate import check_bool, check_list, invalid
from .._checks import phrased
from .._engine import abandon, close_iterator
from ..datapipe import (
    IterDataPipe,
    MapDataPipe,
    functional_datapipe,
    require_callable,
    require_int,
    require_pipe,
    source_len,
    stage_label,
)
from ..errors import add_stage_note, call_lines, raised_at
from ._shared import _abandon_all, _check_inputs, _check_torchdata_inputs, _input_lengths, _warn
from .broadcast.fork import _fork_child, _ForkHub
from .broadcast.hub import _check_buffer_size, _HubChild
from .._engine.lifecycle import Resumable

__all__ = ["IterKeyZipper", "MapKeyZipper", "UnZipper", "Zipper", "ZipperLongest"]

T = TypeVar("T")
T1 = TypeVar("T1")
T2 = TypeVar("T2")
T3 = TypeVar("T3")
T4 = TypeVar("T4")
U = TypeVar("U")
V = TypeVar("V")

_MISS = object()  # private sentinel: no such key / no more items (None is a valid item)


def _output(merge_fn: Callable[[Any, Any], Any] | None, keep_key: bool) -> Callable[[Any, Any, Any], Any]:
    """What a key zipper yields for ``(key, item, matched)``, chosen once per pass."""
    if merge_fn is None:
        if keep_key:
            return lambda key, x, y: (key, (x, y))
        return lambda key, x, y: (x, y)
    if keep_key:
        return lambda key, x, y: (key, merge_fn(x, y))
    return lambda key, x, y: merge_fn(x, y)


# -- Zipper ----------------------------------------------------------------------------------------


def _zip(its: list[Iterator[Any]]) -> Iterator[tuple[Any, ...]]:
    try:
        yield from zip(*its)
    except BaseException:
        for it in its:
            abandon(it)
        raise


@functional_datapipe("zip")
class Zipper(IterDataPipe[tuple[Any, ...]]):
    """Yield tuples of one item from each input (functional name: ``zip``), like :func:`zip`.

    Args:
        *datapipes: the pipes, at least one. ``a.zip(b)`` is ``Zipper(a, b)``.

    Yields:
        ``(item_of_a, item_of_b, ...)``, until the shortest input is exhausted.

    Raises:
        TypeError: an input is not an ``IterDataPipe``.
        ValueError: no input.

    ``len()`` is the shortest input's length; ``TypeError`` naming the input when one is unknown.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(3)).zip(IterableWrapper("abcd")))
        [(0, 'a'), (1, 'b'), (2, 'c')]

    See also: :class:`Multiplexer`, :class:`Concater`.
    """

    _saves = "nothing: at a boundary their position is their source's"

    #: at a boundary between two tuples every input has yielded exactly one item per tuple
    _stateless = True

    @overload
    def __init__(self: IterDataPipe[tuple[T]], datapipe: IterDataPipe[T], /) -> None: ...
    @overload
    def __init__(self: IterDataPipe[tuple[T, T1]], datapipe: IterDataPipe[T], dp1: IterDataPipe[T1], /) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[tuple[T, T1, T2]],
        datapipe: IterDataPipe[T],
        dp1: IterDataPipe[T1],
        dp2: IterDataPipe[T2],
        /,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[tuple[T, T1, T2, T3]],
        datapipe: IterDataPipe[T],
        dp1: IterDataPipe[T1],
        dp2: IterDataPipe[T2],
        dp3: IterDataPipe[T3],
        /,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[tuple[T, T1, T2, T3, T4]],
        datapipe: IterDataPipe[T],
        dp1: IterDataPipe[T1],
        dp2: IterDataPipe[T2],
        dp3: IterDataPipe[T3],
        dp4: IterDataPipe[T4],
        /,
    ) -> None: ...
    @overload
    def __init__(self: IterDataPipe[tuple[Any, ...]], *datapipes: IterDataPipe[Any]) -> None: ...
    def __init__(self, *datapipes: IterDataPipe[Any]) -> None:
        _check_inputs("Zipper", datapipes)
        self.datapipes = datapipes
        self._run = _zip

    def _open(self, ctx: Pass) -> Iterator[tuple[Any, ...]]:
        return self._run([ctx.open(dp) for dp in self.datapipes])

    def __len__(self) -> int:
        return min(_input_lengths(self))


# -- ZipperLongest ---------------------------------------------------------------------------------


def _zip_longest(its: list[Iterator[Any]], fill_value: Any) -> Iterator[tuple[Any, ...]]:
    try:
        yield from itertools.zip_longest(*its, fillvalue=fill_value)
    except BaseException:
        _abandon_all(its)
        raise


@functional_datapipe("zip_longest")
class ZipperLongest(IterDataPipe[tuple[Any, ...]]):
    """Yield tuples of one item from each input until every input is exhausted, filling in for
    the exhausted ones (functional name: ``zip_longest``), like :func:`itertools.zip_longest`.

    Args:
        *datapipes: the pipes, at least one. ``a.zip_longest(b, c)`` is ``ZipperLongest(a, b, c)``.
        fill_value: what stands for an exhausted input's item (keyword only, default ``None``).

    Yields:
        ``(a[i], b[i], ...)`` for ``i`` up to the longest input's length; an exhausted input is not
        read again.

    Raises:
        TypeError: an input is not an ``IterDataPipe``.
        ValueError: no input.

    ``len()`` is the longest input's length; ``TypeError`` naming the input when one is unknown.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(3)).zip_longest(IterableWrapper("abcd"), fill_value=-1))
        [(0, 'a'), (1, 'b'), (2, 'c'), (-1, 'd')]

    See also: :class:`Zipper`, which stops at the shortest input.
    """

    _saves = "nothing: at a boundary their position is their source's"

    #: at a tuple boundary every input not exhausted has yielded one item per tuple
    _stateless = True

    def __init__(self, *datapipes: IterDataPipe[Any], fill_value: Any = None) -> None:
        _check_torchdata_inputs("ZipperLongest", datapipes)
        self.datapipes = datapipes
        self.fill_value = fill_value

    def _open(self, ctx: Pass) -> Iterator[tuple[Any, ...]]:
        return _zip_longest([ctx.open(dp) for dp in self.datapipes], self.fill_value)

    def __len__(self) -> int:
        return max(_input_lengths(self))


# -- IterKeyZipper ---------------------------------------------------------------------------------


class _KeyZipRun(Resumable):
    """The position of a ``zip_with_iter`` pass besides its two sources': the reference items
    waiting in the buffer for their keys (at most ``buffer_size``), in arrival order, and whether
    the buffer-full warning was given. State: ``{"buffer": [[key, item], ...], "warned": bool}``,
    read when asked (the loop writes nothing extra per item)."""

    __slots__ = ("buffer", "warned", "size")

    def __init__(self, size: int | None = None) -> None:
        self.size = size  # buffer_size: a loaded buffer holds no more (None: no limit)
        self.buffer: OrderedDict[Any, Any] = OrderedDict()
        self.warned = False
        self.started = False

    def state(self) -> dict[str, Any]:
        return {"buffer": [[k, v] for k, v in self.buffer.items()], "warned": self.warned}

    def load(self, state: dict[str, Any]) -> None:
        buffer = check_list(state, "buffer", max_len=self.size, limit=f"buffer_size={self.size}")
        if any(type(pair) not in (list, tuple) or len(pair) != 2 for pair in buffer):
            invalid(f"state['buffer'] must hold [key, item] pairs, got {buffer!r:.100}")
        self.warned = check_bool(state, "warned")
        self.buffer = OrderedDict((k, v) for k, v in buffer)


def _key_zip(pipe: IterKeyZipper, it: Iterator[Any], ref_it: Iterator[Any], run: _KeyZipRun) -> Iterator[Any]:
    run.started = True
    buffer = run.buffer
    key_fn, ref_key_fn = pipe.key_fn, pipe.ref_key_fn
    out = _output(pipe.merge_fn, pipe.keep_key)
    limit = sys.maxsize if pipe.buffer_size is None else pipe.buffer_size
    n = 0
    try:
        for data in it:
            key = key_fn(data)
            ref = buffer.pop(key, _MISS)
            while ref is _MISS:
                ref_data = next(ref_it, _MISS)
                if ref_data is _MISS:
                    raise _no_match(pipe, data, key, n)
                ref_key = ref_key_fn(ref_data)
                if ref_key in buffer:
                    raise ValueError(
                        f"{stage_label(pipe)}: ref_datapipe yielded the key {ref_key!r:.100} again while its first "
                        f"item still waits in the buffer: Duplicate key is found in reference DataPipe"
                    )
                if ref_key is key or ref_key == key:
                    ref = ref_data  # the match itself is never buffered
                    break
                if len(buffer) >= limit:
                    if not run.warned:
                        run.warned = True
                        _warn(
                            f"{stage_label(pipe)}, buffer_size={pipe.buffer_size}: Buffer reaches the upper limit, so "
                            "reference key-data pair begins to be removed from buffer in FIFO order. Please consider "
                            "increase buffer size."
                        )
                    buffer.popitem(last=False)
                buffer[ref_key] = ref_data
            yield out(key, data, ref)
            n += 1
    except Exception as e:
        if raised_at(e, _KEY_ZIP_LINES):
            add_stage_note(e, stage_label(pipe), n)
        _abandon_all((it, ref_it))
        raise
    except BaseException:
        _abandon_all((it, ref_it))
        raise
    finally:
        buffer.clear()  # the pass is over: nothing waits any more


_KEY_ZIP_LINES = call_lines(_key_zip, "key_fn") | call_lines(_key_zip, "ref_key_fn") | call_lines(_key_zip, "out")


def _no_match(pipe: IterKeyZipper, data: Any, key: Any, n: int) -> BufferError:
    return BufferError(
        f"{stage_label(pipe)}, source item {n} with key {key!r:.100}: No matching key can be found from reference "
        f"DataPipe for the data {data!r:.200} (ref_datapipe ended, or dropped it from its full buffer of "
        f"buffer_size={pipe.buffer_size}). Please consider increasing the buffer size."
    )


@functional_datapipe("zip_with_iter")
class IterKeyZipper(IterDataPipe[Any]):
    """Pair each item of the source with the item of ``ref_datapipe`` that has the same key
    (functional name: ``zip_with_iter``).

    For each source item, in order, the reference pipe is read until an item with the same key
    comes; the reference items read on the way wait in a buffer for their own source items. When
    more than ``buffer_size`` would wait, the oldest is dropped (with one warning per pass).

    Args:
        source_datapipe: the pipe whose order the output follows.
        ref_datapipe: the pipe holding the matching items, one per key.
        key_fn: the key of a source item.
        ref_key_fn: the key of a reference item; ``None`` (default): ``key_fn``.
        keep_key: yield ``(key, result)`` instead of ``result``.
        buffer_size: how many reference items may wait for their keys, >= 1 (default 10000);
            ``None``: unbounded.
        merge_fn: ``merge_fn(source_item, ref_item)`` makes the result; ``None`` (default): the
            tuple ``(source_item, ref_item)``.

    Yields:
        One result per source item, in source order. Reference items whose key no source item
        asks for are never yielded.

    Raises:
        TypeError / ValueError: a bad argument, naming it.
        BufferError: (while iterating) ``ref_datapipe`` ended without the key of a source item
            (torch's phrase "No matching key can be found from reference DataPipe" ends the message).
        ValueError: (while iterating) ``ref_datapipe`` yielded a key that already waits in the
            buffer ("Duplicate key is found in reference DataPipe").
        Whatever ``key_fn``, ``ref_key_fn`` or ``merge_fn`` raise, as the same object, with a note
        naming the stage and the source item's position.

    ``len()`` is the source's length.

    Unlike torchdata, at most ``buffer_size`` items wait (torchdata holds one more), and the
    matching reference item is never counted against the buffer.

    Example:
        >>> from operator import itemgetter
        >>> from datapipes.iter import IterableWrapper
        >>> src = IterableWrapper([("a", 100), ("b", 200), ("c", 300)])
        >>> ref = IterableWrapper([("b", 2), ("a", 1), ("d", 4), ("c", 3)])
        >>> list(src.zip_with_iter(ref, key_fn=itemgetter(0), merge_fn=lambda s, r: s[1] + r[1], keep_key=True))
        [('a', 101), ('b', 202), ('c', 303)]

    See also: :class:`MapKeyZipper` to look items up in a map-style pipe, :class:`Zipper`.
    """

    _saves = "the reference items waiting for their keys (at most ``buffer_size``)"

    _repr_fields = ("key_fn",)

    @overload
    def __init__(
        self: IterDataPipe[tuple[T, U]],
        source_datapipe: IterDataPipe[T],
        ref_datapipe: IterDataPipe[U],
        key_fn: Callable[[T], Hashable],
        ref_key_fn: Callable[[U], Hashable] | None = ...,
        keep_key: Literal[False] = ...,
        buffer_size: int | None = ...,
        merge_fn: None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[V],
        source_datapipe: IterDataPipe[T],
        ref_datapipe: IterDataPipe[U],
        key_fn: Callable[[T], Hashable],
        ref_key_fn: Callable[[U], Hashable] | None = ...,
        keep_key: Literal[False] = ...,
        buffer_size: int | None = ...,
        *,
        merge_fn: Callable[[T, U], V],
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[Any],
        source_datapipe: IterDataPipe[T],
        ref_datapipe: IterDataPipe[U],
        key_fn: Callable[[T], Hashable],
        ref_key_fn: Callable[[U], Hashable] | None = ...,
        keep_key: bool = ...,
        buffer_size: int | None = ...,
        merge_fn: Callable[[T, U], Any] | None = ...,
    ) -> None: ...
    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        ref_datapipe: IterDataPipe[Any],
        key_fn: Callable[[Any], Hashable],
        ref_key_fn: Callable[[Any], Hashable] | None = None,
        keep_key: bool = False,
        buffer_size: int | None = 10000,
        merge_fn: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        require_pipe(source_datapipe, "IterKeyZipper", "source_datapipe")
        if not isinstance(ref_datapipe, IterDataPipe):  # torchdata's words
            raise TypeError(f"IterKeyZipper: ref_datapipe must be a IterDataPipe, but its type is {type(ref_datapipe)} "
                            "instead.")
        require_callable(key_fn, "IterKeyZipper", "key_fn")
        require_callable(ref_key_fn, "IterKeyZipper", "ref_key_fn", optional=True)
        if not isinstance(keep_key, bool):
            raise TypeError(f"IterKeyZipper: keep_key must be a bool, got {type(keep_key).__name__}")
        require_int(buffer_size, "IterKeyZipper", "buffer_size", optional=True)
        if buffer_size is not None and buffer_size <= 0:
            raise ValueError(phrased("IterKeyZipper", "'buffer_size' is required to be either None or a positive integer.",
                                     buffer_size=buffer_size))
        require_callable(merge_fn, "IterKeyZipper", "merge_fn", optional=True)
        self.source_datapipe = source_datapipe
        self.ref_datapipe = ref_datapipe
        self.key_fn = key_fn
        self.ref_key_fn = key_fn if ref_key_fn is None else ref_key_fn
        self.keep_key = keep_key
        self.buffer_size = buffer_size
        self.merge_fn = merge_fn

    def _open(self, ctx: Pass) -> Iterator[Any]:
        it, ref_it = ctx.open(self.source_datapipe), ctx.open(self.ref_datapipe)
        run = _KeyZipRun(self.buffer_size)
        ctx.track(self, run)
        return _key_zip(self, it, ref_it, run)

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")


# -- MapKeyZipper ----------------------------------------------------------------------------------


def _map_key_zip(pipe: MapKeyZipper, it: Iterator[Any]) -> Iterator[Any]:
    key_fn = pipe.key_fn
    lookup = pipe.map_datapipe.__getitem__
    out = _output(pipe.merge_fn, pipe.keep_key)
    n = 0
    try:
        for item in it:
            key = key_fn(item)
            try:
                value = lookup(key)
            except (KeyError, IndexError) as e:
                raise KeyError(
                    f"{stage_label(pipe)}: source item {n}: key_fn maps {item!r:.200} to {key!r:.100}, which is not "
                    f"a valid key in the given MapDataPipe."
                ) from e
            yield out(key, item, value)
            n += 1
    except Exception as e:
        if raised_at(e, _MAP_KEY_ZIP_LINES):
            add_stage_note(e, stage_label(pipe), n)
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise


_MAP_KEY_ZIP_LINES = call_lines(_map_key_zip, "key_fn") | call_lines(_map_key_zip, "out")


@functional_datapipe("zip_with_map")
class MapKeyZipper(IterDataPipe[Any]):
    """Pair each item of the source with ``map_datapipe[key_fn(item)]``
    (functional name: ``zip_with_map``).

    Args:
        source_iterdatapipe: the source pipe.
        map_datapipe: a map-style pipe, read by key.
        key_fn: the key of a source item in ``map_datapipe``.
        merge_fn: ``merge_fn(source_item, map_item)`` makes the result; ``None`` (default): the
            tuple ``(source_item, map_item)``.
        keep_key: yield ``(key, result)`` instead of ``result``.

    Yields:
        One result per source item, in source order.

    Raises:
        TypeError: a bad argument, naming it.
        KeyError: (while iterating) ``map_datapipe`` has no such key (it raised ``KeyError`` or
            ``IndexError``, chained as the cause); the message names the stage, the item and the
            key, and ends with torch's phrase "which is not a valid key in the given MapDataPipe."
        Whatever ``key_fn`` or ``merge_fn`` raise, as the same object, with a note naming the stage
        and the item's position.

    ``len()`` is the source's length.

    Example:
        >>> from operator import itemgetter
        >>> from datapipes.iter import IterableWrapper
        >>> from datapipes.map import SequenceWrapper
        >>> prices = SequenceWrapper({"a": 100, "b": 200, "c": 300})
        >>> list(IterableWrapper([("a", 1), ("c", 3)]).zip_with_map(prices, key_fn=itemgetter(0)))
        [(('a', 1), 100), (('c', 3), 300)]

    See also: :class:`IterKeyZipper` to match against an iterable-style pipe.
    """

    _saves = "nothing: at a boundary their position is their source's"

    _stateless = True  # one result per source item, nothing kept
    _repr_fields = ("key_fn",)

    @overload
    def __init__(
        self: IterDataPipe[tuple[T, U]],
        source_iterdatapipe: IterDataPipe[T],
        map_datapipe: MapDataPipe[U],
        key_fn: Callable[[T], Any],
        merge_fn: None = ...,
        keep_key: Literal[False] = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[V],
        source_iterdatapipe: IterDataPipe[T],
        map_datapipe: MapDataPipe[U],
        key_fn: Callable[[T], Any],
        merge_fn: Callable[[T, U], V],
        keep_key: Literal[False] = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[Any],
        source_iterdatapipe: IterDataPipe[T],
        map_datapipe: MapDataPipe[U],
        key_fn: Callable[[T], Any],
        merge_fn: Callable[[T, U], Any] | None = ...,
        keep_key: bool = ...,
    ) -> None: ...
    def __init__(
        self,
        source_iterdatapipe: IterDataPipe[Any],
        map_datapipe: MapDataPipe[Any],
        key_fn: Callable[[Any], Any],
        merge_fn: Callable[[Any, Any], Any] | None = None,
        keep_key: bool = False,
    ) -> None:
        require_pipe(source_iterdatapipe, "MapKeyZipper", "source_iterdatapipe")
        if not isinstance(map_datapipe, MapDataPipe):  # torchdata's words
            raise TypeError(f"MapKeyZipper: map_datapipe must be a MapDataPipe, but its type is {type(map_datapipe)} "
                            "instead.")
        require_callable(key_fn, "MapKeyZipper", "key_fn")
        require_callable(merge_fn, "MapKeyZipper", "merge_fn", optional=True)
        if not isinstance(keep_key, bool):
            raise TypeError(f"MapKeyZipper: keep_key must be a bool, got {type(keep_key).__name__}")
        self.source_iterdatapipe = source_iterdatapipe
        self.map_datapipe = map_datapipe
        self.key_fn = key_fn
        self.merge_fn = merge_fn
        self.keep_key = keep_key

    def _open(self, ctx: Pass) -> Iterator[Any]:
        return _map_key_zip(self, ctx.open(self.source_iterdatapipe))

    def __len__(self) -> int:
        return source_len(self, self.source_iterdatapipe, "source_iterdatapipe")


# -- UnZipper: fork children that yield one column each --------------------------------------------


class _UnzipHub(_ForkHub):
    """A fork hub whose child ``i`` yields column ``columns[i]`` of each item."""

    stage = "UnZipper"

    def _config(self) -> tuple[Any, ...]:
        return (self.datapipe, self.sequence_length, self.columns, self.buffer_size)

    def _configure(self, datapipe: Any, sequence_length: int, columns: tuple[int, ...], buffer_size: int) -> None:  # type: ignore[override]
        super()._configure(datapipe, len(columns), buffer_size, None)
        self.sequence_length = sequence_length
        self.columns = columns
        self.label = f"UnZipper(sequence_length={sequence_length}, buffer_size={buffer_size})"


def _unzip_child(hub: _UnzipHub, i: int, pass_: Pass | None, run: Any) -> Iterator[Any]:
    col = hub.columns[i]
    items = _fork_child(hub, i, pass_, run)
    n = 0
    try:
        for item in items:
            yield item[col]
            n += 1
    except Exception as e:
        if raised_at(e, _UNZIP_LINES):
            add_stage_note(e, f"{hub.label}, child {i} (column {col})", n)
        raise
    finally:
        close_iterator(items)  # leaves the shared pass now


_UNZIP_LINES = call_lines(_unzip_child, "col")


class UnZipperChild(_HubChild[T]):
    """One child of :class:`UnZipper`: one column of the source's items, read through the pass
    it shares with its siblings. ``len()`` is the source's length."""

    @staticmethod
    def _loop(hub: _UnzipHub) -> Callable[[Any, int, Any, Any], Iterator[Any]]:
        return _unzip_child  # type: ignore[return-value]

    @property
    def column(self) -> int:
        """The column of the source's items this child yields."""
        return self._hub.columns[self.instance_id]  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return source_len(self, self._hub.datapipe)


def unzip_columns(sequence_length: int, columns_to_skip: Any, torch_class: str) -> tuple[int, ...]:
    """The columns ``unzip`` keeps: ``range(sequence_length)`` less ``columns_to_skip``, checked
    (shared by the iterable- and map-style ``UnZipper``; ``torch_class`` names torchdata's class in
    its phrase when every column is skipped).

    Raises:
        TypeError / ValueError: ``columns_to_skip`` is not a sequence of ints, or holds one outside
            ``[0, sequence_length)``.
        RuntimeError: every column is skipped (torchdata's phrase at the end).
    """
    skip: set[int] = set()
    if columns_to_skip is not None:
        if isinstance(columns_to_skip, (str, bytes)) or not isinstance(columns_to_skip, (Sequence, set, frozenset)):
            raise TypeError(
                f"UnZipper: columns_to_skip must be a sequence of ints or None, got {type(columns_to_skip).__name__}"
            )
        for c in columns_to_skip:
            require_int(c, "UnZipper", "columns_to_skip[...]")
            if not 0 <= c < sequence_length:
                raise ValueError(f"UnZipper: columns_to_skip holds {c}, not a column of "
                                 f"sequence_length={sequence_length} (0 to {sequence_length - 1})")
        skip = set(columns_to_skip)
    columns = tuple(c for c in range(sequence_length) if c not in skip)
    if not columns:
        raise RuntimeError(phrased(
            "UnZipper",
            f"All instances are being filtered out in {torch_class}. Please check the input `sequence_length` and "
            "`columns_to_skip`.",
            sequence_length=sequence_length, columns_to_skip=None if columns_to_skip is None else sorted(skip),
        ))
    return columns


@functional_datapipe("unzip")
class UnZipper(IterDataPipe[Any]):
    """Split a pipe of sequences into one child per column (functional name: ``unzip``).
    ``UnZipper(...)`` and ``pipe.unzip(...)`` return the list of children, not a pipe.

    The children share one pass over the source, as :class:`Forker`'s do (same buffer, same
    rules for when a pass starts, ends and restarts, same checkpoint), each yielding one column.

    Args:
        source_datapipe: a pipe of sequences (tuples, lists, anything indexable by int), each of
            ``sequence_length`` elements.
        sequence_length: how many columns each item has, >= 1.
        buffer_size: how many items the leading child may read ahead of the slowest (default
            1000); ``0``: none; negative (``-1``): unbounded, with a warning.
        columns_to_skip: columns to leave out (ints from 0 to ``sequence_length - 1``); no child
            is made for them.

    Returns:
        A list of :class:`UnZipperChild` pipes, one per column kept, in column order.

    Yields:
        (each child) Its column of each source item, in order.

    Raises:
        TypeError / ValueError: a bad argument, naming it.
        RuntimeError: no column is left: every column is skipped, or ``sequence_length`` is below
            1 (torchdata's type and phrase "All instances are being filtered out").
        BufferError: (while iterating) a child ran more than ``buffer_size`` items ahead (as
            :class:`Forker`'s: the message ends with torch's phrase, and the child keeps its place,
            so a sibling reading more than ``buffer_size`` items past it raises too).
        IndexError, TypeError, ...: (while iterating) an item has no such column, as the same
            object, with a note naming the stage, the child and the item's position.

    ``len()`` of each child is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> a, b, c = IterableWrapper([(i, i + 10, i + 20) for i in range(3)]).unzip(sequence_length=3)
        >>> list(a), list(b), list(c)
        ([0, 1, 2], [10, 11, 12], [20, 21, 22])
        >>> b, = IterableWrapper([(1, 2, 3)]).unzip(3, columns_to_skip=[0, 2])
        >>> list(b)
        [2]

    See also: :class:`Forker`, :class:`Zipper` (its inverse).
    """

    _saves = "same as fork"

    def __new__(  # type: ignore[misc]
        cls,
        source_datapipe: IterDataPipe[Sequence[Any]],
        sequence_length: int,
        buffer_size: int = 1000,
        columns_to_skip: Sequence[int] | None = None,
    ) -> list[UnZipperChild[Any]]:
        require_pipe(source_datapipe, "UnZipper", "source_datapipe")
        require_int(sequence_length, "UnZipper", "sequence_length")  # below 1: no column (RuntimeError below)
        _check_buffer_size("UnZipper", buffer_size)
        columns = unzip_columns(sequence_length, columns_to_skip, "UnZipperIterDataPipe")
        hub = _UnzipHub.__new__(_UnzipHub)
        hub._configure(source_datapipe, sequence_length, columns, buffer_size)
        return [UnZipperChild(hub, i) for i in range(len(columns))]
