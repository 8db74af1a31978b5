"""Forker [fork]: children that each yield every item of the source, read through one shared pass
(:mod:`.hub`): the items the leading child reads are buffered until the slowest child has read them
too. ``unzip`` (:mod:`datapipes.iter.zipping`) is such a fork, each child yielding one column.
"""

from __future__ import annotations

import copy as _copy
from typing import Any, Callable, Iterator, Literal, TypeVar, overload

from ..._runtime.passes import Pass
from ..._engine import close_iterator as _close_iterator
from ...datapipe import IterDataPipe, functional_datapipe, require_int, require_pipe, source_len
from .hub import _END, _FAR, _MISS, _check_buffer_size, _ChildRun, _ended, _Hub, _HubChild, _Raising

__all__ = ["Forker"]

T = TypeVar("T")


class _ForkPass:
    """One shared pass of a fork.

    ``store`` maps an item's position to the item for positions ``low .. next-1``: every item some
    child still needs, plus at most ``_TRIM_EVERY`` that all have read since the last trim.
    ``pos[j]`` is the position child ``j`` reads next (``_FAR`` once it left); ``end`` is the number
    of items once the source is exhausted. Children read ``store`` without the lock; only the child that reads the source
    (and trims) holds it. Positions only grow and a trim never passes ``min(pos)``, so a child never
    loses the item it is about to read.
    """

    __slots__ = ("it", "store", "low", "next", "pos", "joined", "done", "stuck", "end", "joiners", "saved")

    def __init__(self, it: Iterator[Any], n: int) -> None:
        self.it: Any = it
        self.store: dict[int, Any] = {}
        self.low = 0
        self.next = 0
        self.pos = [0] * n
        self.joined = [False] * n
        self.done = [False] * n
        self.stuck = [False] * n  # overflowed the buffer: keeps its place once done (_Hub._overflow)
        self.end: int | None = None
        self.joiners: list[Any] = [None] * n  # the pipe pass each child joined from (weak)
        self.saved: Any = None  # (key, state) of the latest snapshot


def _trim(p: _ForkPass) -> None:
    """Drop the items every child has read (call with the lock held)."""
    store = p.store
    high = min(min(p.pos), p.next)
    for j in range(p.low, high):
        del store[j]
    if high > p.low:
        p.low = high


#: A fork trims its buffer (a ``min`` over the children) once this many items accumulated, not at
#: every item: up to this many items every child has read may wait for the next trim.
_TRIM_EVERY = 32

_COPIES: dict[Any, Any] = {None: None, "shallow": _copy.copy, "deep": _copy.deepcopy}


class _ForkHub(_Hub):
    stage = "Forker"
    overflow_phrase = "fork"

    def _config(self) -> tuple[Any, ...]:
        return (self.datapipe, self.num_instances, self.buffer_size, self.copy)

    def _configure(self, datapipe: Any, num_instances: int, buffer_size: int, copy: Any) -> None:
        self.datapipe = datapipe
        self.num_instances = num_instances
        self.buffer_size = buffer_size
        self.copy = copy
        self.copy_fn = _COPIES[copy]
        self._limit = _FAR if buffer_size < 0 else buffer_size
        self._slack = min(self._limit, _TRIM_EVERY)
        self.label = f"Forker(num_instances={num_instances}, buffer_size={buffer_size})"
        self._runtime()

    def _new_pass(self, it: Iterator[Any]) -> _ForkPass:
        return _ForkPass(it, self.num_instances)

    def _position(self, p: _ForkPass) -> tuple[Any, dict[str, Any]]:
        # the items at positions first..next-1 are fixed once read: positions and end determine it
        first = min(min(p.pos), p.next)
        state = {
            "items": [p.store[k] for k in range(first, p.next)],
            "pos": [None if p.done[j] else p.pos[j] - first for j in range(self.num_instances)],
            "end": None if p.end is None else p.end - first,
        }
        return (p.next, tuple(p.pos), tuple(p.done), p.end), state

    def _resumed_pass(self, it: Iterator[Any], state: dict[str, Any]) -> _ForkPass:
        p = _ForkPass(it, self.num_instances)
        items = state["items"]
        p.store = dict(enumerate(items))
        p.next = len(items)
        for j, pos in enumerate(state["pos"]):
            if pos is None:  # it had left: it holds nothing back, and reading it again starts a new pass
                p.pos[j] = _FAR
                p.done[j] = p.joined[j] = True
            else:
                p.pos[j] = pos
        p.end = state["end"]
        return p

    def _busy(self, p: _ForkPass, j: int) -> bool:
        return p.joined[j] and not p.done[j] and (p.end is None or p.pos[j] < p.end)

    def _release(self, p: _ForkPass, i: int) -> None:
        p.pos[i] = _FAR
        _trim(p)

    def _retire(self, p: _ForkPass, error: BaseException) -> None:
        it, p.it = p.it, _Raising(error)
        p.store.clear()
        p.low, p.next = _FAR, 0  # nothing to read, nothing to trim
        p.end = None  # so a reader still holding this pass reaches ``p.it`` and raises
        _close_iterator(it)

    def pull(self, p: _ForkPass, i: int, k: int) -> Any:
        """Item ``k`` for child ``i``, read from the source unless a sibling just did; ``_END``
        when the source is exhausted."""
        with self._lock:
            if k < p.next:  # a sibling read it meanwhile
                return p.store[k]
            if p.end is not None:
                return _END
            if k - p.low >= self._slack:
                _trim(p)
            try:
                item = next(p.it)
            except StopIteration:
                p.end = k
                return _END
            except Exception as e:
                p.it = _Raising(e)  # the siblings get the same object at this point
                raise
            p.store[k] = item  # kept for the siblings even if this child stops below
            p.next = k + 1
            if k - p.low >= self._limit:
                self._relieve(p, i, k)
            return item

    def _relieve(self, p: _ForkPass, i: int, k: int) -> None:
        """Child ``i`` read item ``k``, more than ``buffer_size`` items ahead of the slowest: stop
        holding items for slots that can never read, or raise ``BufferError``."""
        self._release_gone(p)
        # how far child i (now past item k) leads the slowest of the others (torch's measure, so a
        # lone child reads freely even with buffer_size=0)
        low = min((p.pos[j] for j in range(self.num_instances) if j != i), default=_FAR)
        if k - low < self._limit:
            return
        slow = next((j for j in range(self.num_instances) if j != i and p.pos[j] == low), 0)
        if p.stuck[slow]:
            where = f"stopped with a BufferError at item {low - 1}"
        else:
            where = f"is at item {low}" if p.joined[slow] else "has not started reading"
        p.pos[i] = k + 1  # its place, as torch's pointer: past the item it overflowed on
        self._overflow(
            p, i, f"child {i} ran more than buffer_size={self.buffer_size} items ahead of child {slow}, which {where}"
        )


def _fork_child(hub: _ForkHub, i: int, pass_: Pass | None, run: _ChildRun | None) -> Iterator[Any]:
    if _ended(run):
        return
    p = hub.join(i, pass_)
    if run is not None:
        run.p = p
    get = p.store.get
    pos = p.pos
    pull = hub.pull
    try:
        while True:
            k = pos[i]
            item = get(k, _MISS)
            if item is _MISS:
                item = pull(p, i, k)
                if item is _END:
                    return
            pos[i] = k + 1
            yield item
    finally:
        hub.leave(p, i)


def _fork_child_copy(hub: _ForkHub, i: int, pass_: Pass | None, run: _ChildRun | None) -> Iterator[Any]:
    copy_fn = hub.copy_fn
    for item in _fork_child(hub, i, pass_, run):
        yield copy_fn(item)


class ForkerChild(_HubChild[T]):
    """One child of :class:`Forker`: the items of the fork's source, in order, read through the
    pass it shares with its siblings.

    ``len()`` is the source's length. Its source in the pipe graph is the fork's source.
    """

    @staticmethod
    def _loop(hub: _ForkHub) -> Callable[[Any, int, Any, Any], Iterator[Any]]:
        return _fork_child if hub.copy_fn is None else _fork_child_copy

    def __len__(self) -> int:
        return source_len(self, self._hub.datapipe)


@functional_datapipe("fork")
class Forker(IterDataPipe[T]):
    """Split a pipe into ``num_instances`` children that each yield every item
    (functional name: ``fork``). ``Forker(...)`` and ``pipe.fork(...)`` return the list of
    children, not a pipe; with ``num_instances=1`` they return ``datapipe`` itself, as torch's do.

    The children share one pass over ``datapipe``: items read by the leading child are buffered
    until the slowest child has read them too. The docstring of :mod:`datapipes.iter.broadcast.hub`
    describes when a pass starts, ends and restarts.

    Args:
        datapipe: the source pipe.
        num_instances: how many children, >= 1. ``1``: no child, no buffer: ``datapipe`` itself is
            returned (``copy`` and ``buffer_size`` are checked and do nothing), as torch's fork.
        buffer_size: how many items the leading child may read ahead of the slowest (a child that
            has not started counts as the slowest, at item 0, while its pipe object exists).
            ``0``: none (one child reads alone); negative (``-1``): unbounded, with a warning.
        copy: what each child yields: ``None`` the very object the source yielded (shared by all
            children: mutating it in one child shows in the others), ``"shallow"`` a
            :func:`copy.copy` of it, ``"deep"`` a :func:`copy.deepcopy` of it, made per child.

    Returns:
        A list of ``num_instances`` :class:`ForkerChild` pipes (``datapipe`` itself for one).

    Yields:
        (each child) The source's items, in order.

    Raises:
        TypeError / ValueError: a bad argument, naming it.
        BufferError: (while iterating) a child ran more than ``buffer_size`` items ahead of the
            slowest; the message names the children and ends with torch's phrase ("... buffer
            overflow ..."). The child keeps its place in the buffer, as in torch, so a sibling
            that reads more than ``buffer_size`` items past it raises ``BufferError`` too.

    ``len()`` of each child is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> a, b = IterableWrapper(range(3)).fork(2)
        >>> list(a.zip(b.map(lambda x: x * 10)))
        [(0, 0), (1, 10), (2, 20)]
        >>> list(a), list(b)
        ([0, 1, 2], [0, 1, 2])
        >>> source = IterableWrapper(range(3))
        >>> source.fork(1) is source
        True

    See also: :class:`Demultiplexer` to send each item to one child.
    """

    _saves = (
        "the shared buffer and where each child stands (saved once): the items some child has not read (at "
        "most ``buffer_size`` and a few)"
    )

    @overload
    def __new__(  # type: ignore[misc, overload-overlap]
        cls,
        datapipe: IterDataPipe[T],
        num_instances: Literal[1],
        buffer_size: int = ...,
        copy: Literal["shallow", "deep"] | None = ...,
    ) -> IterDataPipe[T]: ...
    @overload
    def __new__(  # type: ignore[misc]
        cls,
        datapipe: IterDataPipe[T],
        num_instances: int,
        buffer_size: int = ...,
        copy: Literal["shallow", "deep"] | None = ...,
    ) -> list[ForkerChild[T]]: ...
    def __new__(  # type: ignore[misc]
        cls,
        datapipe: IterDataPipe[T],
        num_instances: int,
        buffer_size: int = 1000,
        copy: Literal["shallow", "deep"] | None = None,
    ) -> Any:
        require_pipe(datapipe, "Forker")
        require_int(num_instances, "Forker", "num_instances")
        if num_instances < 1:  # torch's words
            raise ValueError(f"Forker: Expected `num_instances` larger than 0, "
                             f"but {num_instances} is found")
        if copy not in _COPIES:
            raise ValueError(f"Forker: copy must be None, 'shallow' or 'deep', got {copy!r}")
        require_int(buffer_size, "Forker", "buffer_size")
        if num_instances == 1:  # as torch's fork: the source itself (no buffer, so no warning about one)
            return datapipe
        _check_buffer_size("Forker", buffer_size)
        hub = _ForkHub.__new__(_ForkHub)
        hub._configure(datapipe, num_instances, buffer_size, copy)
        return [ForkerChild(hub, i) for i in range(num_instances)]
