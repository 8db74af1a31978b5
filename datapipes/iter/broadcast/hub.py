"""The shared pass behind the stages that split one pipe into several children: Forker [fork]
(:mod:`.fork`), Demultiplexer [demux] and RoundRobinDemultiplexer [round_robin_demux]
(:mod:`.demux`), and UnZipper [unzip] (:mod:`datapipes.iter.zipping`).

Each of them returns a list of *child* pipes that share ONE pass over their source. How a shared
pass lives and ends:

- A pass starts when a child's iterator is first advanced (``iter(child)`` alone does nothing), and
  every other child that starts reading afterwards joins that same pass. The source's iterator is
  created then, in the pass (:mod:`datapipes._runtime.passes`) that ``iter(child)`` was part of. A child that
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
  raises ``BufferError`` naming the stage, the buffer size and the children involved, and ending
  with torch's phrase; the item read last stays buffered, so the other children can still be
  drained. As in torch, the child that raised keeps its place in the pass: items read after it
  stopped are still held for it, so a sibling that reads more than ``buffer_size`` items past it
  raises ``BufferError`` too, rather than reading on as if the overflow had not happened. (A child
  whose iterator ends in any other way leaves the pass, as above.) Iterating the child again
  starts a new pass.
- An exception from the source (or from ``classifier_fn``) reaches the child that was reading as
  the same object; every other child of that pass gets the same object when it reaches that point,
  so no child silently ends early.

Children pickle through their shared state: children pickled together (in one list, or inside one
pipe) still share one pass after unpickling; a child pickled alone gets its own copy of the source.
(Children that reach the pickler through different intermediate pipes, e.g. ``a.zip(b.map(f))``,
are split apart by the generic pipe pickling, which pickles each pipe separately; each part then
reads its own pass and the results stay correct.)
Checkpoint and resume (``it.state_dict()``, :mod:`datapipes._runtime.passes`): a child saves the state of the
shared pass (the items buffered for the children and where each child stands, one object for all
the children, so a pickle holds it once), and the resumed pass's first child to read starts the
shared pass from it. A shared pass that another pipe pass started or reads cannot be saved from
this one: ``state_dict()`` raises ``TypeError``.

No threads are created here. Two children consumed alternately from one thread is the designed
use; consuming them from different threads is safe too: a child reads what is already buffered
without a lock, and reading the source (which also trims the buffer) happens under one lock, once
per source item whatever the number of children.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import copy as _copy
import sys
import threading
import weakref
from typing import Any, Callable, Iterator, NoReturn, TypeVar

from ..._runtime.passes import Pass
from ...datapipe import IterDataPipe, _ByValue, _by_reference, _new_instance, _portable, require_int
from .._shared import _warn, _weak
from ..._engine.lifecycle import Resumable

T = TypeVar("T")

_FAR = sys.maxsize  # the position of a child that has left the pass: it holds no items back
_END = object()  # private sentinel: no more items for this child in this pass
_MISS = object()  # private sentinel: not in the routing table (demux) or the store (fork)


class _Raising:
    """The source iterator of a pass that failed or was invalidated: each ``next`` raises ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __iter__(self) -> _Raising:
        return self

    def __next__(self) -> Any:
        raise self.error


# torch's sentences, which end our messages (code written for torch DataPipes matches on them)
_TORCH_OVERFLOW = {  # by hub: torchdata's UnZipper is a fork and its round-robin demux a demux
    "fork": "ForkerIterDataPipe buffer overflow,buffer size {} is insufficient.",  # torch's missing space kept
    "demux": "DemultiplexerIterDataPipe buffer overflow, buffer size {} is insufficient.",
}
_TORCH_RESET = ("Some child DataPipes are not exhausted when __iter__ is called. We are resetting the buffer and "
                "each child DataPipe will read from the start again.")
_TORCH_INVALIDATED = ("This iterator has been invalidated, because a new iterator has been created from one of the "
                      "ChildDataPipes of ")


def _check_buffer_size(stage: str, buffer_size: Any) -> None:
    """As torch's fork and demux (and torchdata's pipes built on them): any int; ``0`` holds no item
    for a sibling, a negative one (``-1``) does not bound the buffer, with torch's warning."""
    require_int(buffer_size, stage, "buffer_size")
    if buffer_size < 0:
        name = {"Forker": "fork", "Demultiplexer": "demux"}.get(stage, stage)
        _warn(f"{stage}(buffer_size={buffer_size}): Unlimited buffer size is set for `{name}`, please be aware of "
              "OOM at random places")


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
    #: the key of torch's BufferError phrase (``_TORCH_OVERFLOW``) for this hub's kind
    overflow_phrase = ""
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

    @property
    def main_datapipe(self) -> Any:
        """The source the children share: torch's name for it on its fork and demux containers."""
        return self.datapipe

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

    def join(self, i: int, pass_: Pass | None) -> Any:
        """The pass child ``i`` reads from: the current one, or a new one if ``i`` already read it.
        A new one's source iterator is opened in ``pass_``, the pass that opened child ``i``'s
        iterator; a pipe pass resumed from a state (:meth:`plan`) starts with the saved shared pass."""
        with self._lock:
            p = self._pass
            plan = self._plans.pop(pass_, None) if pass_ is not None and self._plans else None
            if plan is None and p is not None and not p.joined[i]:
                p.joined[i] = True
                p.joiners[i] = _weak(pass_)
                return p
            # opened now, at the child's first next(), in the pass handed to the child's _open
            it = iter(self.datapipe) if pass_ is None else pass_.open(self.datapipe)
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

    def snapshot(self, i: int, pass_: Pass | None, joined: Any) -> dict[str, Any] | None:
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
                if any(p.stuck):
                    self._unsaveable(f"child {p.stuck.index(True)} overflowed its buffer (BufferError) and keeps "
                                     "its place in it")
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

    def _overflow(self, p: Any, i: int, why: str) -> NoReturn:
        """Raise the ``BufferError`` of child ``i``, whose read overflowed the buffer of pass ``p``
        (``why``: which children, how far). Called with the lock held.

        As torch's child does, child ``i`` keeps its place in the pass when its iterator ends with
        this error (:meth:`leave` does not release it): the items read after it are still held for
        it, so a sibling that reads more than ``buffer_size`` items past it raises too."""
        p.stuck[i] = True
        phrase = _TORCH_OVERFLOW[self.overflow_phrase].format(self.buffer_size)
        raise BufferError(
            f"{self.label}: {why}. Consume the children together (zip or mux them), or raise buffer_size "
            f"(-1: unbounded): {phrase}"
        )

    def _unsaveable(self, why: str) -> NoReturn:
        raise TypeError(f"{self.label} cannot save its position: {why}")

    def plan(self, pass_: Pass, state: dict[str, Any]) -> None:
        """Resume pipe pass ``pass_`` from ``state`` (:meth:`snapshot`): its first child to read
        starts the shared pass from it."""
        slots = state.get("pos", state.get("queues"))
        if not isinstance(slots, list) or len(slots) != self.num_instances:
            raise ValueError(f"load_state_dict: {self.label} has {self.num_instances} children, the state does not")
        with self._lock:
            if pass_ not in self._built:  # a child built after the shared pass started: planned already
                self._plans[pass_] = state

    def forget(self, pass_: Pass) -> None:
        """Pipe pass ``pass_`` reads its source anew (``cycle``'s next round): the shared pass it
        started and a saved one not started yet belong to the previous round."""
        with self._lock:
            self._plans.pop(pass_, None)
            self._built.pop(pass_, None)

    def leave(self, p: Any, i: int) -> None:
        """Child ``i``'s iterator over pass ``p`` ended; end the pass when every child has left. A
        child that overflowed the buffer (:meth:`_overflow`) keeps holding items back until then."""
        with self._lock:
            if self._pass is not p:
                return  # the pass was already retired
            p.done[i] = True
            if not p.stuck[i]:
                self._release(p, i)
            self._release_gone(p)
            if all(p.done):
                self._pass = None
                self._retire(p, RuntimeError(f"{self.label}: this pass is over"))


def _closed(p: Any, j: int) -> bool:
    """Whether the pipe pass child ``j`` of shared pass ``p`` joined from has been closed: its
    iterator, suspended mid-pass while the closed pass is still referenced, will not read again."""
    ref = p.joiners[j]
    joiner = None if ref is None else ref()
    return joiner is not None and joiner.ended


class _ChildRun(Resumable):
    """Where one fork/demux child stands, for checkpoint and resume.

    Its state is the state of the shared pass it reads (the same object for every child of the pass,
    so a pickle holds it once): what the shared pass holds for the children (fork: the items read
    from the source that some child has not read yet, at most ``buffer_size`` plus a few; demux:
    each child's queue, at most ``buffer_size`` items in all) and where each child is; the source's
    own stages hold its position. A resumed pipe pass starts the shared pass from it at its first
    read; a child that had left it ends at once. The child's loop keeps the positions it always
    kept: nothing is added per item.
    """

    __slots__ = ("hub", "i", "pass_", "p", "finished")

    def __init__(self, hub: _Hub, i: int, pass_: Pass) -> None:
        self.hub = hub
        self.i = i
        self.pass_ = weakref.ref(pass_)
        self.p: Any = None  # the shared pass this child joined
        self.finished = False  # resumed after it had left the shared pass
        self.started = False

    def state(self) -> dict[str, Any]:
        return {"shared": self.hub.snapshot(self.i, self.pass_(), self.p)}

    def load(self, state: dict[str, Any]) -> None:
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
    defines ``__len__``. Its source in the pipe graph is the hub's source. ``_open(ctx)`` takes the
    pass it is handed along: the child joins the hub at its first ``next()`` (see the module
    docstring), and a shared pass it starts then opens the source's iterator in that pass.
    """

    #: the shared source is built under the pass when a child first pulls (the hub's join)
    _builds_sources_later = True

    _repr_fields = ("instance_id",)

    def __init__(self, hub: Any, instance_id: int) -> None:
        self._hub = hub
        self.instance_id = instance_id
        self._run = self._loop(hub)
        hub.register(self, instance_id)

    @property
    def main_datapipe(self) -> Any:
        """The object the children share (torch's name: its container of the buffer): its
        ``main_datapipe`` is the source, ``num_instances`` and ``buffer_size`` its options. It is
        not a stage of the pipe graph: the child's source there is the shared source."""
        return self._hub

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

    def _open(self, ctx: Pass) -> Iterator[T]:
        run = _ChildRun(self._hub, self.instance_id, ctx)
        ctx.track(self, run)
        return self._run(self._hub, self.instance_id, ctx, run)

    def _sources(self) -> list[Any]:
        return [self._hub.datapipe]

    def _pass_forgotten(self, pass_: Pass) -> None:
        """See :meth:`datapipes._runtime.passes.Pass.forget`."""
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
