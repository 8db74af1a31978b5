"""Demultiplexer [demux] and RoundRobinDemultiplexer [round_robin_demux]: children that each yield
the items routed to them, read through one shared pass over the source (:mod:`.hub`). A child
looking for its next item reads the source and buffers the items meant for its siblings; a
``round_robin_demux`` child is a demux child over the enumerated source, routed by position.
"""

from __future__ import annotations

import operator
from collections import deque
from typing import Any, Callable, Iterator, TypeVar

from ..._runtime.passes import Pass
from ..._engine import close_iterator as _close_iterator
from ...datapipe import (
    NO_LEN,
    IterDataPipe,
    functional_datapipe,
    len_unknown,
    require_callable,
    require_int,
    require_pipe,
    source_len,
)
from ...errors import add_stage_note
from .hub import _END, _FAR, _MISS, _check_buffer_size, _ChildRun, _ended, _Hub, _HubChild, _Raising

__all__ = ["Demultiplexer", "RoundRobinDemultiplexer"]

T = TypeVar("T")

_DROP = object()  # private sentinel: route the item nowhere


# -- Demultiplexer ---------------------------------------------------------------------------------


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


class _DemuxPass:
    """One shared pass of a demux: ``queues[j]`` holds the items classified for child ``j`` that it
    has not read; ``table`` maps a classification to its queue (``_DROP`` once the child left);
    ``count`` is the number of items read from the source. A child pops its own queue without
    the lock; only the child that reads the source (and appends to the queues) holds it.
    ``usage`` counts the appends since it was last recomputed from the queues, so it never
    under-counts; it is recomputed exactly before a ``BufferError`` is raised."""

    __slots__ = (
        "it", "queues", "table", "usage", "count", "joined", "done", "stuck", "end", "joiners", "saved",
    )

    def __init__(self, it: Iterator[Any], n: int) -> None:
        self.it: Any = it
        self.queues: list[deque[Any]] = [deque() for _ in range(n)]
        self.table: dict[int, Any] = dict(enumerate(self.queues))
        self.usage = 0
        self.count = 0
        self.joined = [False] * n
        self.done = [False] * n
        self.stuck = [False] * n  # overflowed the buffer: keeps its queue once done (_Hub._overflow)
        self.end = False
        self.joiners: list[Any] = [None] * n  # the pipe pass each child joined from (weak)
        self.saved: Any = None  # (key, state) of the latest snapshot


class _DemuxHub(_Hub):
    stage = "Demultiplexer"
    overflow_phrase = "demux"

    def _config(self) -> tuple[Any, ...]:
        return (self.datapipe, self.num_instances, self.classifier_fn, self.drop_none, self.buffer_size)

    def _configure(self, datapipe: Any, num_instances: int, classifier_fn: Any, drop_none: bool, buffer_size: int) -> None:
        self.datapipe = datapipe
        self.num_instances = num_instances
        self.classifier_fn = classifier_fn
        self.drop_none = drop_none
        self.buffer_size = buffer_size
        self._limit = _FAR if buffer_size < 0 else buffer_size
        self.label = f"Demultiplexer({_fn_name(classifier_fn)})"
        self._runtime()

    def _new_pass(self, it: Iterator[Any]) -> _DemuxPass:
        return _DemuxPass(it, self.num_instances)

    def _position(self, p: _DemuxPass) -> tuple[Any, dict[str, Any]]:
        # queue j holds the latest len(queue j) of the items routed to j among the first count read
        state = {
            "queues": [None if p.done[j] else list(q) for j, q in enumerate(p.queues)],
            "count": p.count,
            "end": p.end,
        }
        return (p.count, tuple(map(len, p.queues)), tuple(p.done), p.end), state

    def _resumed_pass(self, it: Iterator[Any], state: dict[str, Any]) -> _DemuxPass:
        p = _DemuxPass(it, self.num_instances)
        for j, items in enumerate(state["queues"]):
            if items is None:  # it had left: items are no longer kept for it
                p.table[j] = _DROP
                p.done[j] = p.joined[j] = True
            else:
                p.queues[j].extend(items)
        p.usage = sum(map(len, p.queues))
        p.count = state["count"]
        p.end = state["end"]
        return p

    def _busy(self, p: _DemuxPass, j: int) -> bool:
        return p.joined[j] and not p.done[j] and not (p.end and not p.queues[j])

    def _release(self, p: _DemuxPass, i: int) -> None:
        p.queues[i].clear()
        p.table[i] = _DROP

    def _retire(self, p: _DemuxPass, error: BaseException) -> None:
        it, p.it = p.it, _Raising(error)
        for q in p.queues:
            q.clear()
        p.end = False  # so a reader still holding this pass reaches ``p.it`` and raises
        _close_iterator(it)

    def route(self, p: _DemuxPass, c: Any, position: int) -> Any:
        """Where an item classified ``c`` goes, for the classifications off the fast path."""
        n = self.num_instances
        if c is None and self.drop_none:
            return _DROP
        try:
            k = operator.index(c)  # bool and numpy integers are ints here; floats are not
        except TypeError:
            k = -1
        if 0 <= k < n:
            return p.table[k]
        allowed = " (or None, dropped with drop_none=True)" if not self.drop_none else " or None"
        error = ValueError(
            f"{self.label}: classifier_fn returned {c!r} ({type(c).__name__}) for item {position}; "
            f"it must return an int in [0, {n - 1}]{allowed}, as num_instances={n}"
        )
        p.it = _Raising(error)  # the siblings get the same error rather than a silent gap
        raise error

    def pull(self, p: _DemuxPass, i: int) -> Any:
        """Read the source until an item for child ``i`` comes, buffering the siblings' items;
        ``_END`` when the source is exhausted."""
        fn = self.classifier_fn
        table = p.table
        mine = p.queues[i]
        limit = self._limit
        with self._lock:
            if mine:  # a sibling's read found one meanwhile
                return mine.popleft()
            while True:
                if p.end:
                    return _END
                try:
                    x = next(p.it)
                except StopIteration:
                    p.end = True
                    return _END
                except Exception as e:
                    p.it = _Raising(e)  # the siblings get the same object at this point
                    raise
                n = p.count
                p.count = n + 1
                try:
                    c = fn(x)
                except Exception as e:
                    add_stage_note(e, self.label, n)
                    p.it = _Raising(e)
                    raise
                q: Any = table.get(c, _MISS) if type(c) is int else _MISS
                if q is _MISS:
                    q = self.route(p, c, n)
                if q is mine:
                    return x
                if q is _DROP:
                    continue
                q.append(x)
                p.usage += 1
                if p.usage > limit:
                    self._relieve(p, i)

    def _relieve(self, p: _DemuxPass, i: int) -> None:
        """Maybe more than ``buffer_size`` items wait for other children: count them exactly, stop
        keeping items for slots that can never read, or raise ``BufferError``."""
        self._release_gone(p)
        p.usage = sum(map(len, p.queues))
        if p.usage <= self._limit:
            return
        most = max(range(self.num_instances), key=lambda j: len(p.queues[j]))
        if p.stuck[most]:
            state = ", which stopped with a BufferError"
        else:
            state = "" if p.joined[most] else ", which has not started reading"
        self._overflow(
            p, i, f"more than buffer_size={self.buffer_size} items are buffered for other children while child {i} "
            f"looks for its next item (child {most} holds {len(p.queues[most])}{state})"
        )


def _demux_child(hub: _DemuxHub, i: int, pass_: Pass | None, run: _ChildRun | None) -> Iterator[Any]:
    if _ended(run):
        return
    p = hub.join(i, pass_)
    if run is not None:
        run.p = p
    mine = p.queues[i]
    pull = hub.pull
    try:
        while True:
            if mine:
                try:
                    item = mine.popleft()  # only this child pops its queue
                except IndexError:  # emptied by a new pass started on another thread
                    continue
            else:
                item = pull(p, i)
                if item is _END:
                    return
            yield item
    finally:
        hub.leave(p, i)


class DemultiplexerChild(_HubChild[T]):
    """One child of :class:`Demultiplexer`: the items ``classifier_fn`` sends to it, in order.

    ``len()`` raises ``TypeError``. Its source in the pipe graph is the demux's source.
    """

    @staticmethod
    def _loop(hub: _DemuxHub) -> Callable[[Any, int, Any, Any], Iterator[Any]]:
        return _demux_child

    def __len__(self) -> int:
        raise len_unknown(self, "how many items classifier_fn sends to each child is known only after iterating",
                          NO_LEN)


@functional_datapipe("demux")
class Demultiplexer(IterDataPipe[T]):
    """Split a pipe into ``num_instances`` children, sending each item to the child
    ``classifier_fn(item)`` names (functional name: ``demux``). ``Demultiplexer(...)`` and
    ``pipe.demux(...)`` return the list of children, not a pipe.

    The children share one pass over ``datapipe``: a child looking for its next item reads the
    source and buffers the items meant for its siblings. The docstring of
    :mod:`datapipes.iter.broadcast.hub` describes when a pass starts, ends and restarts.

    Args:
        datapipe: the source pipe.
        num_instances: how many children, >= 1.
        classifier_fn: called once per item (on the thread of the child reading); returns the index
            of the child, an int in ``[0, num_instances - 1]`` (bools and numpy integers count as
            ints), or ``None``.
        drop_none: drop the items classified ``None`` (otherwise ``None`` is an error).
        buffer_size: how many items may wait in the children's buffers, all children together.
            ``0``: none; negative (``-1``): unbounded, with a warning.

    Returns:
        A list of ``num_instances`` :class:`DemultiplexerChild` pipes.

    Yields:
        (each child) The items classified for it, in source order.

    Raises:
        TypeError / ValueError: a bad argument, naming it.
        ValueError: (while iterating) ``classifier_fn`` returned an out-of-range index or a
            non-int; the message names the stage, the value, ``num_instances`` and the item's
            position. The siblings get the same error when they reach that item.
        BufferError: (while iterating) more than ``buffer_size`` items wait for other children; the
            message ends with torch's phrase ("... buffer overflow ..."). As in torch, the child
            that raised keeps its place: the items classified for it still wait in the buffer, so
            a sibling may raise ``BufferError`` in turn.
        Whatever ``classifier_fn`` raises, as the same object, with a note naming the stage and the
        item's position.

    ``len()`` of a child raises ``TypeError``: the split is known only after iterating.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> evens, odds = IterableWrapper(range(7)).demux(2, lambda x: x % 2)
        >>> list(evens), list(odds)
        ([0, 2, 4, 6], [1, 3, 5])
        >>> small, = IterableWrapper(range(7)).demux(1, lambda x: 0 if x < 3 else None, drop_none=True)
        >>> list(small)
        [0, 1, 2]

    See also: :class:`Forker` to send every item to every child, :class:`Filter`.
    """

    _saves = (
        "the shared buffer and where each child stands (saved once): each child's queue (at most "
        "``buffer_size`` items in all)"
    )

    def __new__(  # type: ignore[misc]
        cls,
        datapipe: IterDataPipe[T],
        num_instances: int,
        classifier_fn: Callable[[T], int | None],
        drop_none: bool = False,
        buffer_size: int = 1000,
    ) -> list[DemultiplexerChild[T]]:
        require_pipe(datapipe, "Demultiplexer")
        require_int(num_instances, "Demultiplexer", "num_instances")
        if num_instances < 1:  # torch's words
            raise ValueError(f"Demultiplexer: Expected `num_instances` larger than 0, "
                             f"but {num_instances} is found")
        require_callable(classifier_fn, "Demultiplexer", "classifier_fn")
        if not isinstance(drop_none, bool):
            raise TypeError(f"Demultiplexer: drop_none must be a bool, got {type(drop_none).__name__}")
        _check_buffer_size("Demultiplexer", buffer_size)
        hub = _DemuxHub.__new__(_DemuxHub)
        hub._configure(datapipe, num_instances, classifier_fn, drop_none, buffer_size)
        return [DemultiplexerChild(hub, i) for i in range(num_instances)]


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


def _round_robin_child(hub: _RoundRobinHub, i: int, pass_: Pass | None, run: Any) -> Iterator[Any]:
    pairs = _demux_child(hub, i, pass_, run)
    try:
        for _, x in pairs:
            yield x
    finally:
        _close_iterator(pairs)  # leaves the shared pass now


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
        BufferError: (while iterating) more than ``buffer_size`` items wait for other children
            (as :class:`Demultiplexer`'s, torch's phrase ends the message).

    ``len()`` of child ``i`` is ``len(source) // n``, plus one for the first ``len(source) % n``.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> a, b = IterableWrapper(range(5)).round_robin_demux(2)
        >>> list(a), list(b), len(a), len(b)
        ([0, 2, 4], [1, 3], 3, 2)

    See also: :class:`Demultiplexer` to route by a function, :class:`MultiplexerLongest` (its inverse).
    """

    _saves = "same as demux"

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
