"""Stages that join several pipes into one or split one into several: Concater [concat],
Zipper [zip], Multiplexer [mux], Forker [fork], Demultiplexer [demux].

Joining stages (``concat``, ``zip``, ``mux``) are plain generators over their inputs: every pass
iterates each input afresh, errors pass through as the same object, and ``len()`` is computed from
the inputs' lengths at call time. ``zip`` and ``mux`` create their inputs' iterators in ``iter()``;
``concat`` creates the first input's there and each later one's when the previous input ends, in
the same pass (:mod:`datapipes._pass`).

Splitting stages (``fork``, ``demux``) return a list of *child* pipes that share ONE pass over
their source. How a shared pass lives and ends:

- A pass starts when a child's iterator is first advanced (``iter(child)`` alone does nothing), and
  every other child that starts reading afterwards joins that same pass. The source's iterator is
  created then, in the pass (:mod:`datapipes._pass`) that ``iter(child)`` was part of. A child that
  has not started yet keeps its items buffered: reading child A to the end and then child B works
  while the buffer holds what B has not read. A child that can never read (its pipe object was
  dropped before it started, e.g. ``a, _ = pipe.fork(2)``) stops holding items back once the buffer
  fills.
- A child whose iterator ends (exhausted, closed, dropped, or raising) leaves the pass; items are no
  longer kept for it. When every child has left, the pass is over: the source's iterator is closed
  and the buffers are freed.
- A child that starts reading *again* while it is already in the current pass starts a new pass:
  the source is iterated from the beginning and the children that have not started yet join the
  new pass. If another child is still in the middle of the old pass, this is the torch DataPipes
  behaviour: a ``UserWarning`` says the pass was reset, and the old iterators are invalidated
  (advancing one raises ``RuntimeError`` saying why) instead of silently missing items.
- The buffer is bounded by ``buffer_size`` (negative: unbounded, with a warning). Running past it
  raises ``BufferError`` naming the stage, the buffer size and the children involved; the item read
  last stays buffered, so the other children can still be drained.
- An exception from the source (or from ``classifier_fn``) reaches the child that was reading as
  the same object; every other child of that pass gets the same object when it reaches that point,
  so no child silently ends early.

Children pickle through their shared state: children pickled together (in one list, or inside one
pipe) still share one pass after unpickling; a child pickled alone gets its own copy of the source.
(Children that reach the pickler through different intermediate pipes, e.g. ``a.zip(b.map(f))``,
are split apart by the generic pipe pickling, which pickles each pipe separately; each part then
reads its own pass and the results stay correct.)
Checkpoint and resume (``it.state_dict()``, :mod:`datapipes._pass`): ``zip`` keeps nothing (every
input stands one item per tuple on); ``concat`` saves which input it reads (a resumed pass builds
that input at once and never reads the ones before it); ``mux`` saves the items of the current round
not yet yielded; a fork or demux child saves the state of the shared pass (the items buffered for the
children and where each child stands, one object for all the children, so a pickle holds it once),
and the resumed pass's first child to read starts the shared pass from it. A shared pass that another
pipe pass started or reads cannot be saved from this one: ``state_dict()`` raises ``TypeError``.

No threads are created here. Two children consumed alternately from one thread is the designed
use; consuming them from different threads is safe too: a child reads what is already buffered
without a lock, and reading the source (which also trims the buffer) happens under one lock, once
per source item whatever the number of children.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import copy as _copy
import itertools
import operator
import os
import sys
import threading
import warnings
import weakref
from collections import deque
from typing import Any, Callable, Iterator, Literal, NoReturn, TypeVar

from .. import _pass
from .._positions import remaining
from .._engine import abandon
from .._engine import close_iterator as _close_iterator
from ..datapipe import (
    NO_LEN,
    IterDataPipe,
    _ByValue,
    _by_reference,
    _new_instance,
    _portable,
    functional_datapipe,
    len_unknown,
    require_callable,
    require_int,
    require_pipe,
    source_len,
)
from ..errors import add_stage_note

__all__ = ["Concater", "Demultiplexer", "Forker", "Multiplexer", "Zipper"]

T = TypeVar("T")

_FAR = sys.maxsize  # the position of a child that has left the pass: it holds no items back
_END = object()  # private sentinel: no more items for this child in this pass
_DROP = object()  # private sentinel: route the item nowhere
_MISS = object()  # private sentinel: not in the routing table


# -- joining: Concater, Zipper, Multiplexer ---------------------------------------------------------


def _check_inputs(stage: str, datapipes: tuple[Any, ...]) -> None:
    # torch's phrases end the messages (code ported from torch DataPipes may match them)
    if not datapipes:
        raise ValueError(f"{stage}: Expected at least one DataPipe, but got nothing")
    for k, dp in enumerate(datapipes):
        if not isinstance(dp, IterDataPipe):
            expected = ("All inputs are required to be `IterDataPipe` for `ZipIterDataPipe`." if stage == "Zipper"
                        else "Expected all inputs to be `IterDataPipe`")
            raise TypeError(f"{stage}: datapipes[{k}] is of type {type(dp).__name__}: {expected}")


def _input_lengths(pipe: Any) -> list[int]:
    lengths = []
    for k, dp in enumerate(pipe.datapipes):
        lengths.append(source_len(pipe, dp, f"datapipes[{k}]"))
    return lengths


_STARTED = _pass.STARTED


def _build(dp: Any, pass_: _pass.Pass | None) -> Iterator[Any]:
    """``iter(dp)`` in ``pass_`` (the pass that built the stage asking), or plain outside any pass."""
    if pass_ is None:  # iterated outside any pass machinery
        return iter(dp)
    with pass_.building():
        return iter(dp)


class _ConcatRun:
    """Which input a concat pass reads, for checkpoint and resume. State: one int.

    The generator moves ``index`` on when an input ends (once per input, nothing per item); the
    input's own stages hold its position. :meth:`restore` builds the saved input's iterator at once,
    so the states of its stages, restored after this one (graph order), reach it; the inputs before
    it are built and dropped unread (their stages' states then land in runs of this pass, never
    pending for a later input that shares a stage).
    """

    __slots__ = ("datapipes", "pass_", "it", "index", "started")

    def __init__(self, datapipes: tuple[Any, ...], pass_: _pass.Pass | None, it: Iterator[Any]) -> None:
        self.datapipes = datapipes
        self.pass_ = _weak(pass_)  # the pass holds this run: no cycle back to it
        self.it: Iterator[Any] | None = it  # the current input's iterator, until the pass starts
        self.index = 0
        self.started = False

    def state(self) -> dict[str, Any]:
        return {"input": self.index}

    def restore(self, state: dict[str, Any]) -> None:
        if self.started:
            raise RuntimeError(_STARTED)
        index = state["input"]
        if type(index) is not int or not 0 <= index < len(self.datapipes):
            raise ValueError(
                f"load_state_dict: Concater has {len(self.datapipes)} inputs, the state names input {index!r}"
            )
        if index == self.index:
            return
        _close_iterator(self.it)
        pass_ = None if self.pass_ is None else self.pass_()
        for j in range(min(index, 1), index + 1):
            it = _build(self.datapipes[j], pass_)
            if j < index:
                _close_iterator(it)
        self.it, self.index = it, index


def _concat(run: _ConcatRun, pass_: _pass.Pass | None) -> Iterator[Any]:
    """The current input's items, then each later input's, whose iterator is created in ``pass_``
    (the pass that built this stage) only when the previous input ends."""
    run.started = True
    it, run.it = run.it, None  # the frame holds it from now on: a closed pass drops it
    datapipes = run.datapipes
    try:
        yield from it  # type: ignore[misc]
        for j in range(run.index + 1, len(datapipes)):
            it = _build(datapipes[j], pass_)
            run.index = j  # before its first item
            yield from it
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


def _zip(its: list[Iterator[Any]]) -> Iterator[tuple[Any, ...]]:
    try:
        yield from zip(*its)
    except BaseException:
        for it in its:
            abandon(it)
        raise


class _MuxRun:
    """Where a mux pass is in its round, for checkpoint and resume. State: the items of the current
    round pulled from the inputs (a round pulls one from each at once) and not yet yielded, at most
    ``len(datapipes) - 1`` items; the inputs' own stages hold their positions (each at the end of
    the round). Read lazily from the current round's iterator (one store per round)."""

    __slots__ = ("round", "saved", "started")

    def __init__(self) -> None:
        self.round: Iterator[Any] | None = None
        self.saved: list[Any] = []  # the round a resumed pass yields first
        self.started = False

    def state(self) -> dict[str, Any]:
        if self.round is not None:
            return {"round": remaining(self.round)}
        return {"round": list(self.saved)}

    def restore(self, state: dict[str, Any]) -> None:
        if self.started:
            raise RuntimeError(_STARTED)
        self.saved = list(state["round"])


def _rounds(its: list[Iterator[Any]], run: _MuxRun) -> Iterator[tuple[Any, ...]]:
    run.started = True
    rounds: Iterator[tuple[Any, ...]] = zip(*its)
    if run.saved:  # a resumed pass first yields the rest of the saved round
        rounds = itertools.chain([tuple(run.saved)], rounds)
    return rounds


def _mux(its: list[Iterator[Any]], run: _MuxRun) -> Iterator[Any]:
    """The items of ``its`` taken in rounds, one of each; ``run`` holds the round's iterator. ``zip``
    stops at the first exhausted input and drops the round it was building: torch semantics."""
    try:
        for run.round in map(iter, _rounds(its, run)):  # one store per round, before its first item
            yield from run.round
    except BaseException:
        for it in its:
            abandon(it)
        raise


@functional_datapipe("concat")
class Concater(IterDataPipe[T]):
    """Yield every item of the first pipe, then of the second, and so on
    (functional name: ``concat``), like :func:`itertools.chain`.

    Args:
        *datapipes: the pipes, at least one. ``a.concat(b, c)`` is ``Concater(a, b, c)``.

    Yields:
        The items of each input in turn; an input is iterated only when the previous one ends.

    Raises:
        TypeError: an input is not an ``IterDataPipe``.
        ValueError: no input.

    ``len()`` is the sum of the inputs' lengths; ``TypeError`` naming the input when one is unknown.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(3)).concat(IterableWrapper("ab")))
        [0, 1, 2, 'a', 'b']

    See also: :class:`Multiplexer` to interleave instead, :class:`Zipper`.
    """

    #: later inputs are built under the pass when the earlier ones end (see datapipes._pass.unbuilt)
    _builds_sources_later = True

    def __init__(self, *datapipes: IterDataPipe[T]) -> None:
        _check_inputs("Concater", datapipes)
        self.datapipes = datapipes
        self._run = _concat

    def __iter__(self) -> Iterator[T]:
        pass_ = _pass.current()
        run = _ConcatRun(self.datapipes, pass_, iter(self.datapipes[0]))
        _pass.track(self, run)
        return self._run(run, pass_)

    def __len__(self) -> int:
        return sum(_input_lengths(self))


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

    #: at a boundary between two tuples every input has yielded exactly one item per tuple
    _stateless = True

    def __init__(self, *datapipes: IterDataPipe[Any]) -> None:
        _check_inputs("Zipper", datapipes)
        self.datapipes = datapipes
        self._run = _zip

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return self._run([iter(dp) for dp in self.datapipes])

    def __len__(self) -> int:
        return min(_input_lengths(self))


@functional_datapipe("mux")
class Multiplexer(IterDataPipe[T]):
    """Yield one item from each input in turn (functional name: ``mux``).

    Rounds of one item per input, in input order, until any input is exhausted; the round that
    input cut short is dropped (torch DataPipes semantics), so every input contributes the same
    number of items.

    Args:
        *datapipes: the pipes, at least one. ``a.mux(b, c)`` is ``Multiplexer(a, b, c)``.

    Yields:
        ``a[0], b[0], c[0], a[1], b[1], c[1], ...``.

    Raises:
        TypeError: an input is not an ``IterDataPipe``.
        ValueError: no input.

    ``len()`` is the shortest input's length times the number of inputs; ``TypeError`` naming the
    input when one is unknown.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(3)).mux(IterableWrapper(range(10, 15))))
        [0, 10, 1, 11, 2, 12]

    See also: :class:`Zipper`, :class:`Concater`.
    """

    def __init__(self, *datapipes: IterDataPipe[T]) -> None:
        _check_inputs("Multiplexer", datapipes)
        self.datapipes = datapipes
        self._run = _mux

    def __iter__(self) -> Iterator[T]:
        its = [iter(dp) for dp in self.datapipes]
        run = _MuxRun()
        _pass.track(self, run)
        return self._run(its, run)

    def __len__(self) -> int:
        return min(_input_lengths(self)) * len(self.datapipes)


# -- splitting: the shared state of fork and demux children ----------------------------------------


class _Raising:
    """The source iterator of a pass that failed or was invalidated: each ``next`` raises ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __iter__(self) -> _Raising:
        return self

    def __next__(self) -> Any:
        raise self.error


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# torch's sentences, which end our messages (code written for torch DataPipes matches on them)
_TORCH_RESET = ("Some child DataPipes are not exhausted when __iter__ is called. We are resetting the buffer and "
                "each child DataPipe will read from the start again.")
_TORCH_INVALIDATED = ("This iterator has been invalidated, because a new iterator has been created from one of the "
                      "ChildDataPipes of ")


def _warn(message: str) -> None:
    """A ``UserWarning`` attributed to the first caller outside this package."""
    frame = sys._getframe(1)
    level = 2  # stacklevel 1 is this function, 2 its caller
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, UserWarning, stacklevel=level)


def _check_buffer_size(stage: str, buffer_size: Any) -> None:
    """As torch's fork and demux (and torchdata's pipes built on them): any int; ``0`` holds no item
    for a sibling, a negative one (``-1``) does not bound the buffer, with torch's warning."""
    require_int(buffer_size, stage, "buffer_size")
    if buffer_size < 0:
        name = {"Forker": "fork", "Demultiplexer": "demux"}.get(stage, stage)
        _warn(f"{stage}(buffer_size={buffer_size}): Unlimited buffer size is set for `{name}`, please be aware of "
              "OOM at random places")


def _weak(pass_: _pass.Pass | None) -> Any:
    return None if pass_ is None else weakref.ref(pass_)


def _configure_hub(hub: Any, config: tuple[Any, ...]) -> None:
    hub._configure(*config)


def _init_child(child: Any, state: tuple[Any, int]) -> None:
    child.__init__(*state)


class _Hub(ABC):
    """What the children of one fork/demux share: the source, the options, and the current pass.

    Pickles as its configuration only (a pickled hub starts with no pass); pickle's memo keeps
    children pickled together on one hub. Joining, leaving and reading the source happen under
    ``_lock``, a re-entrant lock so that a child finalised by the garbage collector in the middle of
    another child's read cannot deadlock its own thread.
    """

    stage = ""
    datapipe: Any
    num_instances: int
    buffer_size: int
    label: str
    _limit: int
    _pass: Any
    _lock: Any

    @abstractmethod
    def _config(self) -> tuple[Any, ...]:
        ...

    @abstractmethod
    def _configure(self, *config: Any) -> None:
        ...

    @abstractmethod
    def _new_pass(self, it: Iterator[Any]) -> Any:
        ...

    @abstractmethod
    def _busy(self, p: Any, j: int) -> bool:
        """Whether child ``j`` is in the middle of pass ``p`` (started, not left, items left)."""
        ...

    @abstractmethod
    def _release(self, p: Any, i: int) -> None:
        """Child ``i`` left pass ``p``: stop keeping items for it."""
        ...

    @abstractmethod
    def _retire(self, p: Any, error: BaseException) -> None:
        """Pass ``p`` is over: close its source iterator and make every further read raise ``error``."""
        ...

    @abstractmethod
    def _position(self, p: Any) -> tuple[Any, dict[str, Any]]:
        """``(key, state)``: what pass ``p`` holds for its children, as plain data (``None`` for a
        slot that left), and a cheap key that determines it (so equal keys share one state)."""
        ...

    @abstractmethod
    def _resumed_pass(self, it: Iterator[Any], state: dict[str, Any]) -> Any:
        """A new pass over ``it`` (the source, restored to where the saved pass stood) holding what
        ``state`` (from :meth:`_position`) says."""
        ...

    def _runtime(self) -> None:
        self._lock = threading.RLock()
        self._pass = None
        # the live child objects of each slot: a slot with none, and no iterator in the pass, can
        # never read again, so it must not hold items back (a discarded child, or a sibling that
        # was pickled apart from this one)
        self._alive: list[weakref.WeakSet[Any]] = [weakref.WeakSet() for _ in range(self.num_instances)]
        # checkpoint and resume: the shared pass each pipe pass built (the latest), and the saved
        # shared pass a resumed pipe pass starts with at its first join
        self._built: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._plans: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()

    def register(self, child: Any, i: int) -> None:
        self._alive[i].add(child)

    def _gone(self, p: Any, j: int) -> bool:
        """Whether slot ``j`` can never read pass ``p``: not started and no child object left."""
        return not p.joined[j] and not self._alive[j]

    def _release_gone(self, p: Any) -> None:
        for j in range(self.num_instances):
            if not p.done[j] and self._gone(p, j):
                p.done[j] = True
                self._release(p, j)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Created first, then configured (pickle's state_setter): the pickler's memo holds the hub
        # before its source and functions are pickled, so a cycle through them (a classifier that
        # is a bound method of a pipe holding the children) closes, and a source shared with other
        # branches stays shared.
        cls = type(self)
        config = tuple(_portable(v) for v in self._config())
        return _new_instance, (cls if _by_reference(cls) else _ByValue(cls),), config, None, None, _configure_hub

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new._configure(*_copy.deepcopy(self._config(), memo))
        return new

    def join(self, i: int, pass_: _pass.Pass | None) -> Any:
        """The pass child ``i`` reads from: the current one, or a new one if ``i`` already read it.
        A new one's source iterator is created in ``pass_``, the pass that built child ``i``'s
        iterator; a pipe pass resumed from a state (:meth:`plan`) starts with the saved shared pass."""
        with self._lock:
            p = self._pass
            plan = self._plans.pop(pass_, None) if pass_ is not None and self._plans else None
            if plan is None and p is not None and not p.joined[i]:
                p.joined[i] = True
                p.joiners[i] = _weak(pass_)
                return p
            it = _build(self.datapipe, pass_)
            if p is not None:
                busy = [j for j in range(self.num_instances) if j != i and self._busy(p, j) and not _closed(p, j)]
                if busy:
                    _warn(
                        f"{self.label}: child {i} started a new pass while child(ren) {busy} were mid-pass (finish "
                        "or close every child's iterator before iterating a child again): " + _TORCH_RESET
                    )
                self._pass = None
                self._retire(
                    p,
                    RuntimeError(
                        f"{self.label}: child {i} started a new pass while this one was mid-pass (iterate this "
                        f"child again to read the new pass): {_TORCH_INVALIDATED}{self.label}."
                    ),
                )
            p = self._pass = self._new_pass(it) if plan is None else self._resumed_pass(it, plan)
            if pass_ is not None:
                self._built[pass_] = p
            p.joined[i] = True
            p.joiners[i] = _weak(pass_)
            return p

    def snapshot(self, i: int, pass_: _pass.Pass, joined: Any) -> dict[str, Any] | None:
        """The state of the shared pass that pipe pass ``pass_`` reads (``None``: it has not started
        one), for child ``i`` (``joined``: the shared pass it joined, if any). Raises ``TypeError``
        where that would not resume exactly: the shared pass was started by another pipe pass, a
        child still in it is read by another pipe pass, it was invalidated, or its source failed."""
        with self._lock:
            p = self._built.get(pass_)
            if p is None:
                if joined is None:  # not started: the state it was resumed from, if any, still holds
                    return self._plans.get(pass_) if pass_ is not None else None
                self._unsaveable(f"child {i} reads a shared pass that another pass started")
            if joined is not None and joined is not p:
                self._unsaveable(f"child {i} reads a shared pass that was invalidated by a newer one")
            if not all(p.done):
                if p is not self._pass:
                    self._unsaveable("its shared pass was invalidated by a newer one")
                if isinstance(p.it, _Raising):
                    self._unsaveable("its shared pass failed")
                other = [j for j in range(self.num_instances)
                         if p.joined[j] and not p.done[j]
                         and (p.joiners[j] is None or p.joiners[j]() is not pass_)]
                if other:
                    self._unsaveable(f"child(ren) {other} in the middle of its shared pass are read by another pass")
            self._release_gone(p)  # a slot that can never read needs nothing saved
            key, state = self._position(p)
            if p.saved is None or p.saved[0] != key:
                p.saved = (key, state)  # every child saves this same object: pickle writes it once
            return p.saved[1]

    def _unsaveable(self, why: str) -> NoReturn:
        raise TypeError(f"{self.label} cannot save its position: {why}")

    def plan(self, pass_: _pass.Pass, state: dict[str, Any]) -> None:
        """Resume pipe pass ``pass_`` from ``state`` (:meth:`snapshot`): its first child to read
        starts the shared pass from it."""
        slots = state.get("pos", state.get("queues"))
        if not isinstance(slots, list) or len(slots) != self.num_instances:
            raise ValueError(f"load_state_dict: {self.label} has {self.num_instances} children, the state does not")
        with self._lock:
            if pass_ not in self._built:  # a child built after the shared pass started: planned already
                self._plans[pass_] = state

    def forget(self, pass_: _pass.Pass) -> None:
        """Pipe pass ``pass_`` reads its source anew (``cycle``'s next round): the shared pass it
        started and a saved one not started yet belong to the previous round."""
        with self._lock:
            self._plans.pop(pass_, None)
            self._built.pop(pass_, None)

    def leave(self, p: Any, i: int) -> None:
        """Child ``i``'s iterator over pass ``p`` ended; end the pass when every child has left."""
        with self._lock:
            if self._pass is not p:
                return  # the pass was already retired
            p.done[i] = True
            self._release(p, i)
            self._release_gone(p)
            if all(p.done):
                self._pass = None
                self._retire(p, RuntimeError(f"{self.label}: this pass is over"))


class _ChildRun:
    """Where one fork/demux child stands, for checkpoint and resume.

    Its state is the state of the shared pass it reads (the same object for every child of the pass,
    so a pickle holds it once): what the shared pass holds for the children (fork: the items read
    from the source that some child has not read yet, at most ``buffer_size`` plus a few; demux:
    each child's queue, at most ``buffer_size`` items in all) and where each child is; the source's
    own stages hold its position. A resumed pipe pass starts the shared pass from it at its first
    read; a child that had left it ends at once. The child's loop keeps the positions it always
    kept: nothing is added per item.
    """

    __slots__ = ("hub", "i", "pass_", "p", "finished", "started")

    def __init__(self, hub: _Hub, i: int, pass_: _pass.Pass) -> None:
        self.hub = hub
        self.i = i
        self.pass_ = weakref.ref(pass_)
        self.p: Any = None  # the shared pass this child joined
        self.finished = False  # resumed after it had left the shared pass
        self.started = False

    def state(self) -> dict[str, Any]:
        return {"shared": self.hub.snapshot(self.i, self.pass_(), self.p)}

    def restore(self, state: dict[str, Any]) -> None:
        if self.started:
            raise RuntimeError(_STARTED)
        shared = state["shared"]
        if shared is None:
            return
        pass_ = self.pass_()
        if pass_ is not None:
            self.hub.plan(pass_, shared)
        slots = shared.get("pos", shared.get("queues"))
        self.finished = slots[self.i] is None


def _ended(run: _ChildRun | None) -> bool:
    """Called as a child's loop starts: whether it was resumed after it had left its shared pass."""
    if run is None:
        return False
    run.started = True
    return run.finished


class _HubChild(IterDataPipe[T]):
    """One child of a fork or demux: reads through the pass it shares with its siblings on ``hub``.

    A subclass picks, once at construction, the loop ``_loop(hub)`` that its passes run, and
    defines ``__len__``. Its source in the pipe graph is the hub's source. ``iter()`` takes the pass
    being built along: the child joins the hub at its first ``next()`` (see the module docstring),
    and a shared pass it starts then creates the source's iterator in that pass.
    """

    #: the shared source is built under the pass when a child first pulls (the hub's join)
    _builds_sources_later = True

    _repr_fields = ("instance_id",)

    def __init__(self, hub: Any, instance_id: int) -> None:
        self._hub = hub
        self.instance_id = instance_id
        self._run = self._loop(hub)
        hub.register(self, instance_id)

    @staticmethod
    @abstractmethod
    def _loop(hub: Any) -> Callable[[Any, int, Any, Any], Iterator[Any]]:
        ...

    @property
    def num_instances(self) -> int:
        return self._hub.num_instances

    @property
    def buffer_size(self) -> int:
        return self._hub.buffer_size

    def __iter__(self) -> Iterator[T]:
        pass_ = _pass.current()
        run = None
        if pass_ is not None:
            run = _ChildRun(self._hub, self.instance_id, pass_)
            _pass.track(self, run)
        return self._run(self._hub, self.instance_id, pass_, run)

    def _sources(self) -> list[Any]:
        return [self._hub.datapipe]

    def _pass_forgotten(self, pass_: _pass.Pass) -> None:
        """See :meth:`datapipes._pass.Pass.forget`."""
        self._hub.forget(pass_)

    def __reduce_ex__(self, protocol: Any) -> Any:
        reduced = self._torch_reduced()  # torch's graph walk (see IterDataPipe.__reduce_ex__)
        if reduced is not None:
            return reduced
        getstate_hook = self._torch_base.getstate_hook
        if getstate_hook is not None:  # what torch's walk follows: the shared source
            return _new_instance, (type(self),), getstate_hook({"datapipe": self._hub.datapipe})
        # Created first, then given its hub (see _Hub.__reduce_ex__): cycles through the hub close.
        return _new_instance, (type(self),), (self._hub, self.instance_id), None, None, _init_child

    def __copy__(self) -> Any:
        return type(self)(self._hub, self.instance_id)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return type(self)(_copy.deepcopy(self._hub, memo), self.instance_id)


# -- Forker ----------------------------------------------------------------------------------------


class _ForkPass:
    """One shared pass of a fork.

    ``store`` maps an item's position to the item for positions ``low .. next-1``: every item some
    child still needs, plus at most ``_TRIM_EVERY`` that all have read since the last trim.
    ``pos[j]`` is the position child ``j`` reads next (``_FAR`` once it left); ``end`` is the number
    of items once the source is exhausted. Children read ``store`` without the lock; only the child that reads the source
    (and trims) holds it. Positions only grow and a trim never passes ``min(pos)``, so a child never
    loses the item it is about to read.
    """

    __slots__ = ("it", "store", "low", "next", "pos", "joined", "done", "end", "joiners", "saved")

    def __init__(self, it: Iterator[Any], n: int) -> None:
        self.it: Any = it
        self.store: dict[int, Any] = {}
        self.low = 0
        self.next = 0
        self.pos = [0] * n
        self.joined = [False] * n
        self.done = [False] * n
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
        where = f"is at item {low}" if p.joined[slow] else "has not started reading"
        raise BufferError(
            f"{self.label}: child {i} ran more than buffer_size={self.buffer_size} items ahead of child {slow}, "
            f"which {where}. Consume the children together (zip or mux them), or raise buffer_size "
            "(-1: unbounded)"
        )


def _closed(p: Any, j: int) -> bool:
    """Whether the pipe pass child ``j`` of shared pass ``p`` joined from has been closed: its
    iterator, suspended mid-pass while the closed pass is still referenced, will not read again."""
    ref = p.joiners[j]
    joiner = None if ref is None else ref()
    return joiner is not None and joiner.ended


def _fork_child(hub: _ForkHub, i: int, pass_: _pass.Pass | None, run: _ChildRun | None) -> Iterator[Any]:
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


def _fork_child_copy(hub: _ForkHub, i: int, pass_: _pass.Pass | None, run: _ChildRun | None) -> Iterator[Any]:
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
    children, not a pipe.

    The children share one pass over ``datapipe``: items read by the leading child are buffered
    until the slowest child has read them too. The module docstring describes when a pass starts,
    ends and restarts.

    Args:
        datapipe: the source pipe.
        num_instances: how many children, >= 1. ``1`` gives a list of one child (torch returns the
            source itself there).
        buffer_size: how many items the leading child may read ahead of the slowest (a child that
            has not started counts as the slowest, at item 0, while its pipe object exists).
            ``0``: none (one child reads alone); negative (``-1``): unbounded, with a warning.
        copy: what each child yields: ``None`` the very object the source yielded (shared by all
            children: mutating it in one child shows in the others), ``"shallow"`` a
            :func:`copy.copy` of it, ``"deep"`` a :func:`copy.deepcopy` of it, made per child.

    Returns:
        A list of ``num_instances`` :class:`ForkerChild` pipes.

    Yields:
        (each child) The source's items, in order.

    Raises:
        TypeError / ValueError: a bad argument, naming it.
        BufferError: (while iterating) a child ran more than ``buffer_size`` items ahead of the
            slowest; the message names the children.

    ``len()`` of each child is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> a, b = IterableWrapper(range(3)).fork(2)
        >>> list(a.zip(b.map(lambda x: x * 10)))
        [(0, 0), (1, 10), (2, 20)]
        >>> list(a), list(b)
        ([0, 1, 2], [0, 1, 2])

    See also: :class:`Demultiplexer` to send each item to one child.
    """

    def __new__(  # type: ignore[misc]
        cls,
        datapipe: IterDataPipe[T],
        num_instances: int,
        buffer_size: int = 1000,
        copy: Literal["shallow", "deep"] | None = None,
    ) -> list[ForkerChild[T]]:
        require_pipe(datapipe, "Forker")
        require_int(num_instances, "Forker", "num_instances")
        if num_instances < 1:  # torch's words
            raise ValueError(f"Forker: Expected `num_instances` larger than 0, "
                             f"but {num_instances} is found")
        if copy not in _COPIES:
            raise ValueError(f"Forker: copy must be None, 'shallow' or 'deep', got {copy!r}")
        _check_buffer_size("Forker", buffer_size)
        hub = _ForkHub.__new__(_ForkHub)
        hub._configure(datapipe, num_instances, buffer_size, copy)
        return [ForkerChild(hub, i) for i in range(num_instances)]


# -- Demultiplexer ---------------------------------------------------------------------------------


class _DemuxPass:
    """One shared pass of a demux: ``queues[j]`` holds the items classified for child ``j`` that it
    has not read; ``table`` maps a classification to its queue (``_DROP`` once the child left);
    ``count`` is the number of items read from the source. A child pops its own queue without
    the lock; only the child that reads the source (and appends to the queues) holds it.
    ``usage`` counts the appends since it was last recomputed from the queues, so it never
    under-counts; it is recomputed exactly before a ``BufferError`` is raised."""

    __slots__ = ("it", "queues", "table", "usage", "count", "joined", "done", "end", "joiners", "saved")

    def __init__(self, it: Iterator[Any], n: int) -> None:
        self.it: Any = it
        self.queues: list[deque[Any]] = [deque() for _ in range(n)]
        self.table: dict[int, Any] = dict(enumerate(self.queues))
        self.usage = 0
        self.count = 0
        self.joined = [False] * n
        self.done = [False] * n
        self.end = False
        self.joiners: list[Any] = [None] * n  # the pipe pass each child joined from (weak)
        self.saved: Any = None  # (key, state) of the latest snapshot


class _DemuxHub(_Hub):
    stage = "Demultiplexer"

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
        state = "" if p.joined[most] else ", which has not started reading"
        raise BufferError(
            f"{self.label}: more than buffer_size={self.buffer_size} items are buffered for other children "
            f"while child {i} looks for its next item (child {most} holds {len(p.queues[most])}{state}). "
            "Consume the children together (zip or mux them), or raise buffer_size (-1: unbounded)"
        )


def _demux_child(hub: _DemuxHub, i: int, pass_: _pass.Pass | None, run: _ChildRun | None) -> Iterator[Any]:
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
    source and buffers the items meant for its siblings. The module docstring describes when a pass
    starts, ends and restarts.

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
        BufferError: (while iterating) more than ``buffer_size`` items wait for other children.
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
