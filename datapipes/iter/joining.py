"""torchdata's joining, splitting and per-item reshaping stages:
IterKeyZipper [zip_with_iter], MapKeyZipper [zip_with_map], UnZipper [unzip],
ZipperLongest [zip_longest], MultiplexerLongest [mux_longest],
RoundRobinDemultiplexer [round_robin_demux], SampleMultiplexer, IndexAdder [add_index],
Repeater [repeat], Slicer [slice], Flattener [flatten], Dropper [drop], LengthSetter [set_length].

Every ``__iter__`` creates its sources' iterators at once, as part of the pass being built
(:mod:`datapipes._pass`), and hands them to a module-level generator that does the work.

``unzip`` and ``round_robin_demux`` return child pipes that share one pass over their source, with
the machinery of ``fork`` and ``demux`` (:mod:`datapipes.iter.combining`, whose docstring says when
a shared pass starts, ends and restarts, how the buffer is bounded and how children pickle and
resume): an ``unzip`` child is a fork child that yields one column of each item; a
``round_robin_demux`` child is a demux child over the enumerated source, routed by position.

Checkpoint and resume (``it.state_dict()``): ``zip_longest``, ``slice``, ``flatten``, ``drop``,
``set_length`` and ``zip_with_map`` keep nothing of their own (their position is their sources');
``zip_with_iter`` saves the reference items waiting in its buffer; ``mux_longest`` which input
is next and which have ended; ``SampleMultiplexer`` its generator's state and the inputs not
ended; ``add_index`` the next index; ``repeat`` the item being repeated and the repetitions left.
"""

from __future__ import annotations

import copy as _copy
import itertools
import math
import random
import sys
from bisect import bisect
from collections import OrderedDict
from operator import length_hint
from typing import Any, Callable, Hashable, Iterator, Mapping, Sequence, TypeVar

from .. import _pass
from .._positions import Enumerated
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
from .combining import _check_buffer_size, _demux_child, _DemuxHub, _fork_child, _ForkHub, _HubChild, _warn
from .combinatorics import _rng_state, _set_rng_state
from .util import _STARTED, _EnumerateRun

__all__ = [
    "Dropper",
    "Flattener",
    "IndexAdder",
    "IterKeyZipper",
    "LengthSetter",
    "MapKeyZipper",
    "MultiplexerLongest",
    "Repeater",
    "RoundRobinDemultiplexer",
    "SampleMultiplexer",
    "Slicer",
    "UnZipper",
    "ZipperLongest",
]

T = TypeVar("T")
U = TypeVar("U")

_MISS = object()  # private sentinel: no such key / no more items (None is a valid item)


def _abandon_all(its: Sequence[Iterator[Any]]) -> None:
    for it in its:
        abandon(it)


def _output(merge_fn: Callable[[Any, Any], Any] | None, keep_key: bool) -> Callable[[Any, Any, Any], Any]:
    """What a key zipper yields for ``(key, item, matched)``, chosen once per pass."""
    if merge_fn is None:
        if keep_key:
            return lambda key, x, y: (key, (x, y))
        return lambda key, x, y: (x, y)
    if keep_key:
        return lambda key, x, y: (key, merge_fn(x, y))
    return lambda key, x, y: merge_fn(x, y)


def _check_inputs(stage: str, datapipes: tuple[Any, ...]) -> None:
    if not datapipes:
        raise ValueError(f"{stage}: Expected at least one DataPipe, but got nothing")
    for k, dp in enumerate(datapipes):
        if not isinstance(dp, IterDataPipe):
            raise TypeError(f"{stage}: datapipes[{k}] is of type {type(dp).__name__}: "
                            f"All inputs are required to be `IterDataPipe` for `{stage}IterDataPipe`.")


def _input_lengths(pipe: Any, datapipes: Sequence[Any]) -> list[int]:
    return [source_len(pipe, dp, f"datapipes[{k}]") for k, dp in enumerate(datapipes)]


# -- IterKeyZipper ---------------------------------------------------------------------------------


class _KeyZipRun:
    """The position of a ``zip_with_iter`` pass besides its two sources': the reference items
    waiting in the buffer for their keys (at most ``buffer_size``), in arrival order, and whether
    the buffer-full warning was given. State: ``{"buffer": [[key, item], ...], "warned": bool}``,
    read when asked (the loop writes nothing extra per item)."""

    __slots__ = ("buffer", "warned", "started")

    def __init__(self) -> None:
        self.buffer: OrderedDict[Any, Any] = OrderedDict()
        self.warned = False
        self.started = False

    def state(self) -> dict[str, Any]:
        return {"buffer": [[k, v] for k, v in self.buffer.items()], "warned": self.warned}

    def restore(self, state: dict[str, Any]) -> None:
        if self.started:
            raise RuntimeError(_STARTED)
        self.buffer = OrderedDict((k, v) for k, v in state["buffer"])
        self.warned = bool(state["warned"])


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

    _repr_fields = ("key_fn",)

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

    def __iter__(self) -> Iterator[Any]:
        it, ref_it = iter(self.source_datapipe), iter(self.ref_datapipe)
        run = _KeyZipRun()
        _pass.track(self, run)
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

    _stateless = True  # one result per source item, nothing kept
    _repr_fields = ("key_fn",)

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

    def __iter__(self) -> Iterator[Any]:
        return _map_key_zip(self, iter(self.source_iterdatapipe))

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


def _unzip_child(hub: _UnzipHub, i: int, pass_: _pass.Pass | None, run: Any) -> Iterator[Any]:
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
        BufferError: (while iterating) a child ran more than ``buffer_size`` items ahead.
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

    #: at a tuple boundary every input not exhausted has yielded one item per tuple
    _stateless = True

    def __init__(self, *datapipes: IterDataPipe[Any], fill_value: Any = None) -> None:
        _check_inputs("ZipperLongest", datapipes)
        self.datapipes = datapipes
        self.fill_value = fill_value

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return _zip_longest([iter(dp) for dp in self.datapipes], self.fill_value)

    def __len__(self) -> int:
        return max(_input_lengths(self, self.datapipes))


# -- MultiplexerLongest ----------------------------------------------------------------------------


def _mux_longest_state(local: dict[str, Any], yielding_from: Any) -> dict[str, Any]:
    """Read from a ``mux_longest`` pass's generator: the input to read next, and which have ended."""
    return {"next": (local["i"] + 1) % local["n"], "done": list(local["done"])}


def _mux_longest(its: list[Iterator[Any]], run: _pass.FrameRun) -> Iterator[Any]:
    run.started = True
    n = len(its)
    done = [False] * n
    i = -1  # the input read last
    resume = run.resume
    if resume is not None:
        if "ended" in resume:
            return
        i = int(resume["next"]) - 1
        done = [bool(d) for d in resume.get("done", done)]
    live = n - sum(done)
    try:
        while live:
            i += 1
            if i == n:
                i = 0
            if done[i]:
                continue
            x = next(its[i], _MISS)
            if x is _MISS:
                done[i] = True
                live -= 1
                continue
            yield x
    except BaseException:
        _abandon_all(its)
        raise


@functional_datapipe("mux_longest")
class MultiplexerLongest(IterDataPipe[T]):
    """Yield one item from each input in turn, skipping the exhausted ones, until every input is
    exhausted (functional name: ``mux_longest``).

    Args:
        *datapipes: the pipes, at least one. ``a.mux_longest(b, c)`` is
            ``MultiplexerLongest(a, b, c)``.

    Yields:
        ``a[0], b[0], c[0], a[1], ...``; once an input is exhausted, the others go on in turn.

    Raises:
        TypeError: an input is not an ``IterDataPipe``.
        ValueError: no input.

    ``len()`` is the sum of the inputs' lengths; ``TypeError`` naming the input when one is unknown.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(3)).mux_longest(IterableWrapper("a"), IterableWrapper([10, 11])))
        [0, 'a', 10, 1, 11, 2]

    See also: :class:`Multiplexer`, which stops at the first exhausted input.
    """

    def __init__(self, *datapipes: IterDataPipe[T]) -> None:
        _check_inputs("MultiplexerLongest", datapipes)
        self.datapipes = datapipes

    def __iter__(self) -> Iterator[T]:
        its = [iter(dp) for dp in self.datapipes]
        run = _pass.FrameRun(_mux_longest_state)
        return _pass.track_generator(self, _mux_longest(its, run), run)

    def __len__(self) -> int:
        return sum(_input_lengths(self, self.datapipes))


# -- RoundRobinDemultiplexer: demux children over the enumerated source -----------------------------


class _RoundRobinKey:
    """The classifier of a round-robin demux over ``(index, item)`` pairs: ``index % n``."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, pair: tuple[int, Any]) -> int:
        return pair[0] % self.n

    def __reduce__(self) -> tuple[type, tuple[int]]:
        return _RoundRobinKey, (self.n,)


class _RoundRobinHub(_DemuxHub):
    """A demux hub over the enumerated source that sends item ``k`` to child ``k % n``."""

    stage = "RoundRobinDemultiplexer"

    def _config(self) -> tuple[Any, ...]:
        return (self.datapipe, self.num_instances, self.buffer_size)

    def _configure(self, datapipe: Any, num_instances: int, buffer_size: int) -> None:  # type: ignore[override]
        super()._configure(datapipe, num_instances, _RoundRobinKey(num_instances), False, buffer_size)
        self.label = f"RoundRobinDemultiplexer(num_instances={num_instances}, buffer_size={buffer_size})"


def _round_robin_child(hub: _RoundRobinHub, i: int, pass_: _pass.Pass | None, run: Any) -> Iterator[Any]:
    pairs = _demux_child(hub, i, pass_, run)
    try:
        for _, x in pairs:
            yield x
    finally:
        close_iterator(pairs)  # leaves the shared pass now


class RoundRobinDemultiplexerChild(_HubChild[T]):
    """One child of :class:`RoundRobinDemultiplexer`: items ``i, i + n, i + 2n, ...`` of the source,
    read through the pass it shares with its siblings. ``len()`` follows from the source's."""

    @staticmethod
    def _loop(hub: _RoundRobinHub) -> Callable[[Any, int, Any, Any], Iterator[Any]]:
        return _round_robin_child  # type: ignore[return-value]

    def __len__(self) -> int:
        total = source_len(self, self._hub.datapipe)
        k = self._hub.num_instances
        return total // k + (1 if self.instance_id < total % k else 0)


@functional_datapipe("round_robin_demux")
class RoundRobinDemultiplexer(IterDataPipe[Any]):
    """Split a pipe into ``num_instances`` children, dealing its items out in turn
    (functional name: ``round_robin_demux``). ``RoundRobinDemultiplexer(...)`` and
    ``pipe.round_robin_demux(...)`` return the list of children, not a pipe.

    Child ``i`` yields the source's items ``i, i + n, i + 2n, ...``. The children share one pass
    over the source, as :class:`Demultiplexer`'s do (same buffer, same rules for when a pass starts,
    ends and restarts, same checkpoint); the source is enumerated first (an ``enumerate`` stage
    stands between it and the children in the graph) and each child drops the index.

    Args:
        datapipe: the source pipe.
        num_instances: how many children, >= 1. ``1`` gives a list of one child (torchdata
            returns the source itself there, with a warning).
        buffer_size: how many items may wait in the children's buffers, all children together
            (default 1000); ``0``: none; negative (``-1``): unbounded, with a warning.

    Returns:
        A list of ``num_instances`` :class:`RoundRobinDemultiplexerChild` pipes.

    Yields:
        (each child) Its share of the source's items, in order.

    Raises:
        TypeError / ValueError: a bad argument, naming it.
        BufferError: (while iterating) more than ``buffer_size`` items wait for other children.

    ``len()`` of child ``i`` is ``len(source) // n``, plus one for the first ``len(source) % n``.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> a, b = IterableWrapper(range(5)).round_robin_demux(2)
        >>> list(a), list(b), len(a), len(b)
        ([0, 2, 4], [1, 3], 3, 2)

    See also: :class:`Demultiplexer` to route by a function, :class:`MultiplexerLongest` (its inverse).
    """

    def __new__(  # type: ignore[misc]
        cls, datapipe: IterDataPipe[T], num_instances: int, buffer_size: int = 1000
    ) -> list[RoundRobinDemultiplexerChild[T]]:
        require_pipe(datapipe, "RoundRobinDemultiplexer")
        require_int(num_instances, "RoundRobinDemultiplexer", "num_instances")
        if num_instances < 1:  # torchdata's words, its misspelling kept (code may match them)
            raise ValueError(f"RoundRobinDemultiplexer: Expected `num_instaces` larger than 0, "
                             f"but {num_instances} is found")
        _check_buffer_size("RoundRobinDemultiplexer", buffer_size)
        hub = _RoundRobinHub.__new__(_RoundRobinHub)
        hub._configure(datapipe.enumerate(), num_instances, buffer_size)  # type: ignore[attr-defined]
        return [RoundRobinDemultiplexerChild(hub, i) for i in range(num_instances)]


# -- SampleMultiplexer -----------------------------------------------------------------------------


class _SampleRun:
    """The position of a ``SampleMultiplexer`` pass besides its inputs': the generator's state
    (625 ints) and the inputs not exhausted. Read when asked; nothing is written per item."""

    __slots__ = ("rng", "live", "started")

    def __init__(self, rng: random.Random, n: int) -> None:
        self.rng = rng
        self.live = list(range(n))  # the inputs not exhausted, in input order (the loop mutates it)
        self.started = False

    def state(self) -> dict[str, Any]:
        return {"rng": _rng_state(self.rng), "live": list(self.live)}

    def restore(self, state: dict[str, Any]) -> None:
        if self.started:
            raise RuntimeError(_STARTED)
        _set_rng_state(self.rng, state["rng"])
        self.live = [int(j) for j in state["live"]]


def _sample_mux(its: list[Iterator[Any]], weights: tuple[float, ...], run: _SampleRun) -> Iterator[Any]:
    run.started = True
    live = run.live
    rand = run.rng.random
    try:
        while len(live) > 1:
            cumulative = list(itertools.accumulate(weights[j] for j in live))
            total = cumulative[-1]
            last = len(live) - 1
            while True:
                k = bisect(cumulative, rand() * total)
                if k > last:  # rounding at the top end
                    k = last
                x = next(its[live[k]], _MISS)
                if x is _MISS:
                    del live[k]  # the draw is spent; the others' weights are renormalised
                    break
                yield x
        if live:
            yield from its[live[0]]
    except BaseException:
        _abandon_all(its)
        raise


class SampleMultiplexer(IterDataPipe[T]):
    """Yield items drawn from several pipes at random, each draw picking a pipe with probability
    proportional to its weight (no functional name, as in torchdata).

    When a pipe is exhausted it is dropped and the draws go on among the others, their weights
    renormalised; the last one left is read to its end. To keep the proportions forever, ``cycle``
    the inputs.

    Args:
        pipes_to_weights_dict: ``{pipe: weight}``, at least one pipe; weights are numbers > 0.
        seed: the seed of the draws; ``None`` (default): the pipe's seed (``set_seed``, the
            DataLoader's), else a fresh one each pass. Same as ``set_seed(seed)`` on this stage.

    Yields:
        Every item of every input exactly once; each input's items in their order.

    Raises:
        TypeError / ValueError: a bad argument, naming it (a weight <= 0: torch's phrase
            "Expecting a positive and non-zero weight").

    Seeds: a seeded pass (``seed=``, ``set_seed``) draws the same sequence at every pass of an
    epoch and a new one at every ``set_epoch(n)`` (torchdata's ``seed`` starts one generator for
    all passes instead); an unseeded pass draws its seed from torch's global generator.

    ``len()`` is the sum of the inputs' lengths; ``TypeError`` naming the input when one is unknown.

    Checkpoint: the state holds the generator's state and the inputs not exhausted.

    >>> from datapipes.iter import IterableWrapper, SampleMultiplexer
    >>> pipe = SampleMultiplexer({IterableWrapper([0] * 4): 9.0, IterableWrapper([1] * 4): 1.0}, seed=0)
    >>> sorted(pipe), list(pipe) == list(pipe)
    ([0, 0, 0, 0, 1, 1, 1, 1], True)

    See also: :class:`Multiplexer` and :class:`MultiplexerLongest` to take the inputs in turn.
    """

    _is_random = True

    def __init__(self, pipes_to_weights_dict: Mapping[IterDataPipe[T], float], seed: int | None = None) -> None:
        if not isinstance(pipes_to_weights_dict, Mapping):
            raise TypeError(f"SampleMultiplexer: pipes_to_weights_dict must be a dict of pipes to weights, "
                            f"got {type(pipes_to_weights_dict).__name__}")
        if not pipes_to_weights_dict:
            raise ValueError("SampleMultiplexer: Empty dictionary passed to SampleMultiplexerDataPipe")
        for k, (dp, w) in enumerate(pipes_to_weights_dict.items()):
            require_pipe(dp, "SampleMultiplexer", f"pipes_to_weights_dict key {k}")
            if isinstance(w, bool) or not isinstance(w, (int, float)):
                raise TypeError(f"SampleMultiplexer: the weight of pipe {k} must be a number, got {type(w).__name__}")
            if not w > 0:  # torchdata's words
                raise ValueError(f"SampleMultiplexer: pipe {k}: Expecting a positive and non-zero weight, got {w}")
            if not math.isfinite(w):
                raise ValueError(f"SampleMultiplexer: pipe {k}: a weight must be finite, got {w}")
        require_int(seed, "SampleMultiplexer", "seed", optional=True)
        self.datapipes = tuple(pipes_to_weights_dict)
        self.weights = tuple(float(w) for w in pipes_to_weights_dict.values())
        if seed is not None:
            self._seed = seed

    def __iter__(self) -> Iterator[T]:
        rng = random.Random(self._pass_seed())
        its = [iter(dp) for dp in self.datapipes]
        run = _SampleRun(rng, len(its))
        _pass.track(self, run)
        return _sample_mux(its, self.weights, run)

    def __len__(self) -> int:
        return sum(_input_lengths(self, self.datapipes))


# -- IndexAdder ------------------------------------------------------------------------------------


def _add_index(pipe: IndexAdder, it: Iterator[Any], run: _EnumerateRun) -> Iterator[dict[Any, Any]]:
    name = pipe.index_name
    run.started = True
    run.counter = counter = Enumerated(it, run.start)
    try:
        for i, row in counter:
            if type(row) is dict:
                row = row.copy()
            elif isinstance(row, dict):
                row = _copy.copy(row)  # keeps the subclass (OrderedDict, defaultdict, ...)
            else:
                raise NotImplementedError(
                    f"{stage_label(pipe)}, item {i} ({type(row).__name__}): We only support adding index to row or "
                    "batch in dict type"
                )
            row[name] = i
            yield row
    except BaseException:
        abandon(it)
        raise
    finally:  # ended, closed or dropped: the run keeps the count and lets go of the source
        run.start = counter.count()
        run.counter = None


@functional_datapipe("add_index")
class IndexAdder(IterDataPipe[dict[Any, Any]]):
    """Add each item's position to it under the key ``index_name`` (functional name: ``add_index``).
    The items must be dicts (rows, or batches in dict form).

    Args:
        source_datapipe: a pipe of dicts.
        index_name: the key the position is stored under (default ``"index"``); an existing key of
            that name is overwritten.

    Yields:
        A shallow copy of each dict with ``copy[index_name] = position`` (0, 1, ...). Unlike
        torchdata, the source's dicts are not changed in place, so a second pass over a list or a
        cache sees them as they were.

    Raises:
        TypeError: ``index_name`` is not hashable.
        NotImplementedError: (while iterating) an item is not a dict (torch's type and phrase).

    ``len()`` is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([{"a": 1}, {"a": 2}]).add_index("order"))
        [{'a': 1, 'order': 0}, {'a': 2, 'order': 1}]

    See also: :class:`Enumerator` for ``(index, item)`` pairs.
    """

    _repr_fields = ("index_name",)

    def __init__(self, source_datapipe: IterDataPipe[dict[Any, Any]], index_name: Hashable = "index") -> None:
        require_pipe(source_datapipe, "IndexAdder", "source_datapipe")
        try:
            hash(index_name)
        except TypeError:
            raise TypeError(f"IndexAdder: index_name must be hashable (a dict key), got {type(index_name).__name__}") from None
        self.source_datapipe = source_datapipe
        self.index_name = index_name

    def __iter__(self) -> Iterator[dict[Any, Any]]:
        run = _EnumerateRun(0)
        it = _add_index(self, iter(self.source_datapipe), run)
        _pass.track(self, run)
        return it

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")


# -- Repeater --------------------------------------------------------------------------------------


def _repeat_state(local: dict[str, Any], yielding_from: Any) -> dict[str, Any]:
    """Read from a ``repeat`` pass's generator: the item being repeated and the repetitions left
    (from the ``itertools.repeat`` it yields from)."""
    left = 0 if yielding_from is None else length_hint(yielding_from)
    return {"item": local["x"], "left": left} if left else {"left": 0}


def _repeat(it: Iterator[Any], times: int, run: _pass.FrameRun) -> Iterator[Any]:
    run.started = True
    resume = run.resume
    try:
        if resume is not None:
            if "ended" in resume:
                return
            if resume.get("left"):
                x = resume["item"]
                yield from itertools.repeat(x, int(resume["left"]))
        for x in it:
            yield from itertools.repeat(x, times)
    except BaseException:
        abandon(it)
        raise


@functional_datapipe("repeat")
class Repeater(IterDataPipe[T]):
    """Yield each item ``times`` times before moving on to the next (functional name: ``repeat``).

    Args:
        source_datapipe: the source pipe.
        times: how many times each item is yielded, an int > 1.

    Yields:
        ``a, a, ..., b, b, ...``: the very same object each time (no copy is made).

    Raises:
        TypeError / ValueError: ``times`` is not an int > 1 (torch's phrase "The number of
            repetition must be > 1").

    ``len()`` is ``times * len(source)``.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(3)).repeat(2))
        [0, 0, 1, 1, 2, 2]

    See also: :class:`Cycler` to repeat the whole pass instead.
    """

    _repr_fields = ("times",)

    def __init__(self, source_datapipe: IterDataPipe[T], times: int) -> None:
        require_pipe(source_datapipe, "Repeater", "source_datapipe")
        require_int(times, "Repeater", "times")
        if times <= 1:
            raise ValueError(f"Repeater: The number of repetition must be > 1, got {times}")
        self.source_datapipe = source_datapipe
        self.times = times

    def __iter__(self) -> Iterator[T]:
        run = _pass.FrameRun(_repeat_state)
        return _pass.track_generator(self, _repeat(iter(self.source_datapipe), self.times, run), run)

    def __len__(self) -> int:
        return self.times * source_len(self, self.source_datapipe, "source_datapipe")


# -- Slicer, Flattener, Dropper: reshaping each item ------------------------------------------------


def _each(pipe: Any, fn: Callable[[Any], Any], it: Iterator[Any]) -> Iterator[Any]:
    """``fn(item)`` for each item; an error from ``fn`` gets a note naming the stage and the item."""
    n = 0
    try:
        for x in it:
            yield fn(x)
            n += 1
    except Exception as e:
        if raised_at(e, _EACH_LINES):
            add_stage_note(e, stage_label(pipe), n)
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise


_EACH_LINES = call_lines(_each, "fn")


def _indices(value: Any) -> list[Any]:
    """torchdata's reading of an ``indices`` argument: a list is several, anything else one."""
    return list(value) if isinstance(value, list) else [value]


def _check_hashable(stage: str, name: str, values: list[Any]) -> None:
    for v in values:
        try:
            hash(v)
        except TypeError:
            raise TypeError(f"{stage}: {name} must hold indices or keys (hashable), got a {type(v).__name__}") from None


def _positions(indices: list[Any]) -> Callable[[int], frozenset[Any]]:
    """The positions ``indices`` name in a sequence of length ``n`` (negative ints count from the end)."""
    fixed = frozenset(indices)
    if not any(type(i) is int and i < 0 for i in indices):
        return lambda n: fixed
    return lambda n: frozenset(i + n if type(i) is int and i < 0 else i for i in indices)


def _missing(x: Any, indices: list[Any]) -> bool:
    """Whether an index or key of ``indices`` is absent from the item ``x`` (a sequence or a dict)."""
    if isinstance(x, dict):
        return any(i not in x for i in indices)
    n = len(x)
    return any(not (type(i) is int and -n <= i < n) for i in indices)


_MISSING_WARNING = ("At least one index in the filter is not present in the item being returned, "
                    "please be aware that expected columns/keys may be missing.")
_NOT_ITERABLE_WARNING = ("The next item was not an iterable and cannot be filtered, "
                         "please be aware that no filter was done or new item created.")


def _slicer_fn(pipe: Slicer[Any]) -> Callable[[Any], Any]:
    label = stage_label(pipe)
    index, stop, step = pipe.index, pipe.stop, pipe.step
    if isinstance(index, list):
        wanted = list(index)
        keys = frozenset(wanted)
        positions = _positions(wanted)

        def pick(x: Any) -> Any:
            if isinstance(x, (tuple, list)):
                keep = positions(len(x))
                picked = [v for j, v in enumerate(x) if j in keep]
                out: Any = tuple(picked) if isinstance(x, tuple) else picked
            elif isinstance(x, dict):
                out = {k: v for k, v in x.items() if k in keys}
            else:
                _warn(f"{label}: {_NOT_ITERABLE_WARNING}")
                return x
            if _missing(x, wanted):
                _warn(f"{label}: {_MISSING_WARNING}")
            return out

        return pick

    def cut(x: Any) -> Any:
        if isinstance(x, (tuple, list)):
            return x[index:stop:step]
        if isinstance(x, dict):
            if index in x:
                return {index: x[index]}
            _warn(f"{label}: Dictionaries are not sliced by steps, only direct index. "
                  "Please be aware that no filter was done or new item created.")
            return x
        _warn(f"{label}: {_NOT_ITERABLE_WARNING}")
        return x

    return cut


@functional_datapipe("slice")
class Slicer(IterDataPipe[T]):
    """Slice each item, or pick some of its columns (functional name: ``slice``).

    Args:
        datapipe: a pipe of tuples, lists or dicts.
        index: an int: the start of the slice ``item[index:stop:step]`` of a tuple or list, or the
            one key kept of a dict; a list: the positions (of a tuple or list; negative ones count
            from the end) or keys (of a dict) kept, in the item's order.
        stop: the end of the slice (ignored with a list ``index``, or for dicts).
        step: the step of the slice (ignored with a list ``index``, or for dicts).

    Yields:
        A new tuple, list or dict per item (a tuple for a tuple, a list for a list). An item of
        another type, or a dict without the key ``index``, passes unchanged with a warning, as in
        torchdata; a list ``index`` naming a column an item lacks gives a warning too.

    Raises:
        TypeError: ``stop`` or ``step`` is not an int or None; ``index`` holds unhashable values.
        Whatever slicing an item raises (``TypeError`` for a non-int ``index`` on a tuple), as the
        same object, with a note naming the stage and the item's position.

    A list ``index`` with a ``stop`` or ``step`` warns at construction that they are ignored.

    ``len()`` is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([(0, 10, 100), (1, 11, 111)]).slice(0, 2))
        [(0, 10), (1, 11)]
        >>> list(IterableWrapper([(0, 10, 100), (1, 11, 111)]).slice([0, -1]))
        [(0, 100), (1, 111)]
        >>> list(IterableWrapper([{"a": 1, "b": 2}]).slice(["a"]))
        [{'a': 1}]

    See also: :class:`Dropper` to drop columns, :class:`Flattener`.
    """

    _stateless = True  # one item per item
    _repr_fields = ("index",)

    def __init__(
        self, datapipe: IterDataPipe[T], index: int | list[Hashable], stop: int | None = None, step: int | None = None
    ) -> None:
        require_pipe(datapipe, "Slicer")
        require_int(stop, "Slicer", "stop", optional=True)
        require_int(step, "Slicer", "step", optional=True)
        if step == 0:
            raise ValueError("Slicer: step must not be 0 (slice step cannot be zero)")
        _check_hashable("Slicer", "index", _indices(index))
        if isinstance(index, list) and (stop is not None or step is not None):
            _warn("Slicer: A list of indices was passed as well as a stop or step for the slice, these arguments "
                  "can't be used together so only the indices list will be used.")
        self.datapipe = datapipe
        self.index = index
        self.stop = stop
        self.step = step

    def __iter__(self) -> Iterator[T]:
        return _each(self, _slicer_fn(self), iter(self.datapipe))

    def __len__(self) -> int:
        return source_len(self, self.datapipe)


_SAME_KEY_WARNING = ("Flattener tried to insert the same key twice into the dict item, "
                     "the second key,value pair has been dropped.")


def _flattener_fn(pipe: Flattener[Any]) -> Callable[[Any], Any]:
    label = stage_label(pipe)
    wanted = None if pipe.indices is None else _indices(pipe.indices)
    if wanted == []:
        wanted = None
    keys = frozenset(wanted or ())
    positions = _positions(wanted or [])
    every = wanted is None

    def flatten(x: Any) -> Any:
        if isinstance(x, dict):
            out: Any = {}
            for k, v in x.items():
                if (every or k in keys) and isinstance(v, dict):
                    for k_sub, v_sub in v.items():
                        if k_sub in x or k_sub in out:
                            _warn(f"{label}: {_SAME_KEY_WARNING}")
                        else:
                            out[k_sub] = v_sub
                elif k in out:
                    _warn(f"{label}: {_SAME_KEY_WARNING}")
                else:
                    out[k] = v
        elif isinstance(x, (tuple, list)):
            keep = positions(len(x))
            out = []
            for j, v in enumerate(x):
                if (every or j in keep) and isinstance(v, (tuple, list)):
                    out.extend(v)
                else:
                    out.append(v)
            if isinstance(x, tuple):
                out = tuple(out)
        else:
            raise TypeError(f"{label}: the item is a {type(x).__name__}; flatten takes tuples, lists and dicts")
        if wanted is not None and _missing(x, wanted):
            _warn(f"{label}: {_MISSING_WARNING}")
        return out

    return flatten


@functional_datapipe("flatten")
class Flattener(IterDataPipe[T]):
    """Flatten one level of nesting inside each item (functional name: ``flatten``).

    Args:
        datapipe: a pipe of tuples, lists or dicts.
        indices: which elements to flatten: a position of a tuple or list (negative ones count from
            the end) or a key of a dict, or a list of them; ``None`` (default): every element.

    Yields:
        Per item, a new item of its kind: in a tuple or list, each selected element that is a
        tuple or list is replaced by its elements; in a dict, each selected value that is a dict
        is replaced by its key-value pairs. A key already in the item is kept and the nested pair
        dropped, with a warning; so is a key that an earlier nested dict brought in (torchdata
        lets the later one overwrite it). An index an item lacks gives a warning.

    Raises:
        TypeError: ``indices`` holds unhashable values; (while iterating) an item is not a tuple,
            list or dict, with a note naming the stage and its position (torchdata turns a string
            into a list of its characters, and fails on other types).

    ``indices=0`` flattens element 0 (torchdata reads a falsy ``indices`` as every element).

    ``len()`` is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([(0, 10, (100, 1000)), (1, 11, (111, 1001))]).flatten(2))
        [(0, 10, 100, 1000), (1, 11, 111, 1001)]
        >>> list(IterableWrapper([{"a": 1, "b": {"c": 2, "d": 3}}]).flatten())
        [{'a': 1, 'c': 2, 'd': 3}]

    See also: :class:`Slicer`, :class:`Dropper`, :class:`Unbatcher` to flatten the stream itself.
    """

    _stateless = True  # one item per item
    _repr_fields = ("indices",)

    def __init__(self, datapipe: IterDataPipe[T], indices: Hashable | list[Hashable] | None = None) -> None:
        require_pipe(datapipe, "Flattener")
        if indices is not None:
            _check_hashable("Flattener", "indices", _indices(indices))
        self.datapipe = datapipe
        self.indices = indices

    def __iter__(self) -> Iterator[T]:
        return _each(self, _flattener_fn(self), iter(self.datapipe))

    def __len__(self) -> int:
        return source_len(self, self.datapipe)


def _dropper_fn(pipe: Dropper[Any]) -> Callable[[Any], Any]:
    label = stage_label(pipe)
    wanted = _indices(pipe.indices)
    keys = frozenset(wanted)
    positions = _positions(wanted)

    def drop(x: Any) -> Any:
        if isinstance(x, (tuple, list)):
            gone = positions(len(x))
            kept = [v for j, v in enumerate(x) if j not in gone]
            out: Any = tuple(kept) if isinstance(x, tuple) else kept
        elif isinstance(x, dict):
            out = {k: v for k, v in x.items() if k not in keys}
        else:
            _warn(f"{label}: {_NOT_ITERABLE_WARNING}")
            return x
        if _missing(x, wanted):
            _warn(f"{label}: {_MISSING_WARNING}")
        return out

    return drop


@functional_datapipe("drop")
class Dropper(IterDataPipe[T]):
    """Drop some columns of each item (functional name: ``drop``).

    Args:
        datapipe: a pipe of tuples, lists or dicts.
        indices: a position (of a tuple or list; negative ones count from the end) or a key (of a
            dict), or a list of them.

    Yields:
        Per item, a new item of its kind without those columns. An item of another type passes
        unchanged with a warning, as in torchdata; so does an index an item lacks.

    Raises:
        TypeError: ``indices`` holds unhashable values.

    ``len()`` is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([(0, 10, 100), (1, 11, 111)]).drop([0, -1]))
        [(10,), (11,)]
        >>> list(IterableWrapper([{"a": 1, "b": 2}]).drop("a"))
        [{'b': 2}]

    See also: :class:`Slicer` to keep columns instead.
    """

    _stateless = True  # one item per item
    _repr_fields = ("indices",)

    def __init__(self, datapipe: IterDataPipe[T], indices: Hashable | list[Hashable]) -> None:
        require_pipe(datapipe, "Dropper")
        _check_hashable("Dropper", "indices", _indices(indices))
        self.datapipe = datapipe
        self.indices = indices

    def __iter__(self) -> Iterator[T]:
        return _each(self, _dropper_fn(self), iter(self.datapipe))

    def __len__(self) -> int:
        return source_len(self, self.datapipe)


# -- LengthSetter ----------------------------------------------------------------------------------


@functional_datapipe("set_length")
class LengthSetter(IterDataPipe[T]):
    """Give the pipe a ``len()`` of your choosing (functional name: ``set_length``), for stages
    whose length cannot be known in advance (``filter``, ``flatmap``) when you know it.

    Args:
        source_datapipe: the source pipe.
        length: what ``len()`` returns, an int >= 0.

    Yields:
        The source's items, all of them: unlike :class:`Header`, nothing is cut at ``length``.

    Raises:
        TypeError / ValueError: ``length`` is not an int >= 0.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper(range(10)).filter(lambda x: x < 5).set_length(5)
        >>> list(pipe), len(pipe)
        ([0, 1, 2, 3, 4], 5)

    See also: :class:`Header` to also cut the pass at a length.
    """

    _stateless = True  # the source's own iterator: its position is the source's
    _repr_fields = ("length",)

    def __init__(self, source_datapipe: IterDataPipe[T], length: int) -> None:
        require_pipe(source_datapipe, "LengthSetter", "source_datapipe")
        require_int(length, "LengthSetter", "length", minimum=0, torch_assert="length must be >= 0")  # torchdata asserts
        self.source_datapipe = source_datapipe
        self.length = length

    def __iter__(self) -> Iterator[T]:
        return iter(self.source_datapipe)

    def __len__(self) -> int:
        return self.length

