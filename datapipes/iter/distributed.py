"""torchdata's distributed stages: FullSync [fullsync], ShardingRoundRobinDispatcher
[sharding_round_robin_dispatch].

``fullsync()`` makes every distributed rank yield the same number of items: the ranks agree, over a
gloo process group of their own, on how many items each has ready, and a pass stops on every rank
as soon as one rank's upstream has run out. Outside a distributed run it passes items through.

``sharding_round_robin_dispatch()`` shards the items among the DataLoader workers round-robin, item
``i`` to worker ``i % num_workers``, as torchdata's dispatching process hands them out. Here every
worker reads the graph upstream of it and keeps its own items (there is no dispatching process), as
with ``sharding_filter()``.

>>> from datapipes.iter import IterableWrapper
>>> list(IterableWrapper(range(4)).fullsync())  # one process: nothing to agree on
[0, 1, 2, 3]
"""

from __future__ import annotations

import datetime
import itertools
import queue
import threading
import weakref
from collections import deque
from typing import Any, Callable, Iterator, TypeVar, cast

import torch
import torch.distributed as dist
from torch.utils.data import get_worker_info

from .._runtime import passes as _pass
from .._runtime.passes import Pass
from .._engine import close_iterator
from .._engine.lifecycle import Closeable, Resumable
from .._runtime.worker import rank_placement
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_int, require_pipe, source_len, stage_label
from ..graph import traverse
from .sharding import SHARDING_PRIORITIES, ShardingFilter, _group, _group_name

__all__ = ["FullSync", "PrefetchTimeoutError", "ShardingRoundRobinDispatcher"]

T = TypeVar("T")

#: torchdata's default timeout for FullSync (torch.distributed's default too): 30 minutes
_DEFAULT_TIMEOUT = 30 * 60
#: how long closing a synced pass waits for its thread before leaving it (a daemon) to finish
_GRACE_S = 1.0

# What a rank contributes to each round of agreement is ``4 * position + code``, reduced with MIN
# over the ranks: the agreed position is the least position, and the code says whether a rank at
# that position has ended (an upstream error sorts before a normal end, which sorts before "going").
_FAILED, _ENDED, _GOING = 0, 1, 2
_BROKEN = 3  # not a round's code: the agreement itself failed on this rank (timeout, a rank gone)
_END = object()  # private sentinel: the upstream ran out


class PrefetchTimeoutError(RuntimeError, TimeoutError):
    """The ranks of a :class:`FullSync` pass did not agree within its ``timeout`` (torchdata's name;
    both a ``RuntimeError``, as torchdata's, and a ``TimeoutError``). ``timeout``: the seconds."""

    def __init__(self, message: str, timeout: float) -> None:
        super().__init__(message)
        self.timeout = timeout


# -- FullSync --------------------------------------------------------------------------------------


class _SyncRun(Resumable):
    """The position of one ``fullsync`` pass: how many items it has yielded and the items it has
    taken from its upstream but not yielded yet (``pending``, in order; at most ``buffer_size``).
    The thread that pulls the upstream holds ``lock`` while it takes an item and records it, so a
    state taken under the lock sees every item either pending or yielded.

    State: ``{"yielded": n, "pending": [items]}``; ``yielded`` is None for a pass that ran outside a
    distributed run (it counts nothing there). A resumed pass yields the pending items first; in a
    distributed run every rank's position is its ``yielded`` plus what it reads from then on, so a
    resumed pass still stops every rank at the least number of items over the ranks.
    """

    __slots__ = ("lock", "pending", "yielded", "resume", "prefix", "synced")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: deque[Any] = deque()
        self.yielded = 0
        self.resume: dict[str, Any] | None = None
        self.started = False
        self.prefix: Iterator[Any] | None = None  # outside a distributed run: the resumed pending items
        self.synced = False

    def state(self) -> dict[str, Any]:
        if not self.started:
            return self.resume if self.resume is not None else {"yielded": 0, "pending": []}
        if not self.synced:
            return {"yielded": None, "pending": [] if self.prefix is None else _pass.remaining(self.prefix)}
        return {"yielded": self.yielded, "pending": list(self.pending)}

    def load(self, state: dict[str, Any]) -> None:
        yielded = state.get("yielded")
        self.resume = {"yielded": None if yielded is None else int(yielded), "pending": list(state["pending"])}


class _Through(itertools.chain):  # type: ignore[type-arg]
    """A pass outside a distributed run: the upstream's iterator, forwarded in C (after the pending
    items of a resumed state); ``close()`` closes the upstream."""

    __slots__ = ("source",)
    source: Iterator[Any]

    def close(self) -> None:
        close_iterator(self.source)


def _through(it: Iterator[Any], run: _SyncRun) -> Iterator[Iterator[Any]]:
    run.started = True
    resume, run.resume = run.resume, None
    if resume is not None and resume["pending"]:
        run.prefix = iter(resume["pending"])
        yield run.prefix
    yield it


class _Producer:
    """The thread of a synced pass: it pulls the upstream into ``run.pending`` and runs the rounds
    of agreement the consumer asks for, handing each round's result to the consumer."""

    def __init__(self, label: str, timeout: float, it: Iterator[Any], run: _SyncRun, group: Any,
                 slots: threading.Semaphore, requests: threading.Semaphore, stop: threading.Event,
                 put: Callable[[Any], None]) -> None:
        self.label = label
        self.timeout = timeout
        self.it = it
        self.run = run
        self.group = group
        self.slots = slots
        self.requests = requests
        self.stop = stop
        self.put = put
        self.requested = 0  # rounds the consumer asked for (written by the consumer only)
        self.fetched = run.yielded + len(run.pending)  # the rank's position: items known to its stream
        self.code = _GOING
        self.error: BaseException | None = None

    def ask(self) -> None:
        """The consumer asks for the next round (it has just started on the items of the last)."""
        self.requested += 1
        self.requests.release()

    def main(self) -> None:
        try:
            self._rounds()
        except BaseException as e:  # noqa: BLE001 - the consumer raises it
            self.put((-1, _BROKEN, e))
        finally:
            try:
                close_iterator(self.it)
            except Exception:  # noqa: BLE001 - an upstream error during close has nowhere to go
                pass
            _destroy(self.group)

    def _fetch(self) -> None:
        """Take one item from the upstream (a slot is held for it)."""
        run = self.run
        with run.lock:
            try:
                x = next(self.it, _END)
            except BaseException as e:  # noqa: BLE001 - raised by this rank's consumer, the same object
                self.code, self.error = _FAILED, e
                self.slots.release()
                return
            if x is _END:
                self.code = _ENDED
                self.slots.release()
                return
            run.pending.append(x)
            self.fetched += 1

    def _rounds(self) -> None:
        slots, requests, stop = self.slots, self.requests, self.stop
        agreed = self.run.yielded
        issued = 0
        box = _round_tensor(self.group)
        while True:
            # Until the consumer asks for the next round, read ahead (within the buffer).
            while not requests.acquire(blocking=False):
                if stop.is_set() or self.code != _GOING or not slots.acquire(blocking=False):
                    requests.acquire()  # a request, or close() waking this thread
                    break
                self._fetch()
            if issued >= self.requested:
                return  # woken by close() with no round asked for
            # A round asked for is run even after close(): the other ranks asked for it too.
            while self.code == _GOING and self.fetched <= agreed and not stop.is_set():
                slots.acquire()  # at least one item past the agreed ones, so the agreement moves on
                if not stop.is_set():
                    self._fetch()
            box[0] = 4 * self.fetched + self.code
            issued += 1
            try:
                work = dist.all_reduce(box, op=dist.ReduceOp.MIN, group=self.group, async_op=True)
                # Read ahead while the other ranks answer.
                while (self.code == _GOING and not stop.is_set() and not work.is_completed()
                       and slots.acquire(blocking=False)):
                    self._fetch()
                work.wait()
            except Exception as e:
                raise _agreement_failed(self.label, self.timeout, issued, agreed, e) from e
            agreed, code = divmod(int(box[0]), 4)
            failure: BaseException | None = None
            if code == _FAILED:
                if self.error is not None and self.fetched == agreed:
                    failure = self.error  # this rank's upstream raised right after the agreed items
                else:
                    failure = RuntimeError(
                        f"{self.label}: the upstream of another rank raised an exception after {agreed} items; "
                        f"this rank stops after the same {agreed} items (the rank that failed raises it)"
                    )
            self.put((agreed, code, failure))
            if code != _GOING:
                return  # (after close(), the loop's top runs any round asked for meanwhile, then returns)


def _agreement_failed(label: str, timeout: float, round_: int, agreed: int, e: Exception) -> RuntimeError:
    return _failed(f"{label}: the ranks did not agree on round {round_} (after {agreed} items each): a rank stopped "
                   f"iterating, failed, or is slower than timeout={timeout} s", timeout, e)


def _failed(detail: str, timeout: float, e: Exception) -> RuntimeError:
    """The error for a collective of a pass that failed with ``e``: a timeout (gloo's, or its
    store's) is a :class:`PrefetchTimeoutError`."""
    detail = f"{detail} ({type(e).__name__}: {e})"
    text = str(e).lower()
    if "timed out" in text or "timeout" in text:
        return PrefetchTimeoutError(detail, timeout)
    return RuntimeError(detail)


def _new_group(label: str, timeout: float) -> Any:
    """A gloo group of every rank for one pass, created (a collective) when the pass is created.

    A barrier follows, so that no rank destroys the group (a pass closed before its first item)
    while another is still connecting to it."""
    group = None
    try:
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
        dist.barrier(group=group)
    except Exception as e:
        if group is not None:
            _destroy(group)
        raise _failed(f"{label}: the ranks did not meet to create the pass's gloo process group within "
                      f"timeout={timeout} s (every rank must create its pass, iter(), at the same point)",
                      timeout, e) from e
    return group


def _round_tensor(group: Any) -> torch.Tensor:
    """The tensor the rounds of a pass reduce over ``group``, kept alive until the group itself is
    freed.

    torch 2.5's ``destroy_process_group`` shuts down NCCL groups only: a gloo group's worker
    threads are joined when its last reference goes, by the Python thread that drops it, holding
    the GIL. A worker that has just finished a round then frees that round's work and, with it,
    the tensor; when Python has let go of the tensor already, freeing it needs the GIL, which the
    joining thread holds: both wait forever. So the tensor lives until the group is gone (a weakref
    callback runs after the group's C++ object is freed), and the workers free nothing of Python's.
    """
    box = torch.zeros(1, dtype=torch.int64)
    # (the ignore: mypy 1.x's typeshed, on the free-threaded leg, leaves atexit out of finalize's slots)
    weakref.finalize(group, _keep, box).atexit = False  # type: ignore[misc]
    return box


def _keep(box: torch.Tensor) -> None:
    """The callback that holds a round tensor until its group is freed (it has nothing to do)."""


def _destroy(group: Any) -> None:
    try:
        dist.destroy_process_group(group)
    except Exception:  # noqa: BLE001 - the default group is gone already (destroyed or re-initialised)
        pass


def _shutdown(stop: threading.Event, requests: threading.Semaphore, slots: threading.Semaphore,
              thread_box: list[threading.Thread | None], group: Any) -> None:
    stop.set()
    requests.release()
    slots.release()
    thread = thread_box[0]
    if thread is None:
        _destroy(group)  # never started: the thread would have destroyed it
    elif thread is not threading.current_thread():
        thread.join(_GRACE_S)


class _SyncedPass(Closeable):
    """Owner of one synced pass: its gloo group and its thread. ``close()`` (idempotent, also run
    when the pass is collected) stops the thread, which closes the upstream and destroys the group
    (the group is destroyed here when the thread never started)."""

    def __init__(self, label: str, timeout: float, buffer_size: int, it: Iterator[Any], run: _SyncRun,
                 group: Any) -> None:
        self.label, self.timeout, self.buffer_size = label, timeout, buffer_size
        self.it, self.run, self.group = it, run, group
        self.queue: Any = queue.SimpleQueue()
        self.stop = threading.Event()
        self.requests = threading.Semaphore(0)
        self.slots = threading.Semaphore(0)
        self.thread_box: list[threading.Thread | None] = [None]
        self._finalizer = weakref.finalize(self, _shutdown, self.stop, self.requests, self.slots, self.thread_box,
                                           group)

    def start(self) -> _Producer:
        free = self.buffer_size - len(self.run.pending)
        if free > 0:
            self.slots.release(free)
        producer = _Producer(self.label, self.timeout, self.it, self.run, self.group, self.slots, self.requests,
                             self.stop, self.queue.put)
        self.it = None  # type: ignore[assignment]  # the thread owns (and closes) the upstream from now on
        thread = threading.Thread(target=producer.main, name=f"datapipes {self.label} sync", daemon=True)
        self.thread_box[0] = thread
        thread.start()
        return producer


def _synced(owner: _SyncedPass, run: _SyncRun, label: str, timeout: float) -> Iterator[Any]:
    run.started = run.synced = True
    resume, run.resume = run.resume, None
    if resume is not None:
        run.pending.extend(resume["pending"])
        run.yielded = resume["yielded"] or 0
    try:
        producer = owner.start()
        popleft, release, get, ask = run.pending.popleft, owner.slots.release, owner.queue.get, producer.ask
        ask()
        while True:
            try:
                agreed, code, failure = get(True, timeout)
            except queue.Empty:
                raise PrefetchTimeoutError(
                    f"{label}: no agreement with the other ranks within timeout={timeout} s after {run.yielded} "
                    f"items: a rank stopped iterating or is stuck (its upstream, or before its next item)",
                    timeout,
                ) from None
            if code == _GOING:
                ask()  # every rank asks at this same point: when it starts on a new agreement's items
            while run.yielded < agreed:
                x = popleft()
                release()
                run.yielded += 1
                yield x
            if code != _GOING:
                if failure is not None:
                    raise failure
                return
    finally:
        owner.close()


def _sync_world(label: str) -> int:
    """How many ranks a pass starting here must agree with (1: pass items through)."""
    if get_worker_info() is not None:
        world = rank_placement()[1]
        if world > 1:
            raise RuntimeError(
                f"{label}: iterated inside a DataLoader worker of a distributed run of {world} ranks; a worker is "
                f"not a rank and cannot agree with the other ranks. Put fullsync() after the DataLoader, in each "
                f"rank's main process (e.g. IterableWrapper(loader).fullsync())"
            )
        return 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    world = rank_placement()[1]
    if world > 1:
        raise RuntimeError(
            f"{label}: RANK/WORLD_SIZE name {world} ranks but no torch.distributed process group is initialised, "
            f"so the ranks cannot agree on how many items to yield. Call torch.distributed.init_process_group() "
            f"before iterating"
        )
    return 1


@functional_datapipe("fullsync")
class FullSync(IterDataPipe[T]):
    """Make every distributed rank yield the same number of items: a pass stops on every rank as
    soon as one rank's upstream runs out (functional name: ``fullsync``).

    Unevenly sharded data otherwise leaves the ranks with more items waiting in a collective (a
    gradient all-reduce) that the rank which ran out never joins. In a distributed run
    (``torch.distributed`` initialised, world size > 1) each rank yields its own items, in order,
    as many as the rank with the fewest has; outside one, the items pass through unchanged.

    Args:
        datapipe: the upstream pipe (each rank's own shard).
        timeout: seconds to wait for the other ranks (and this rank's upstream) at each agreement,
            a number > 0; default 30 minutes, as torchdata's.
        buffer_size: how many items may be taken from the upstream and not yet yielded, an int >= 1
            (an addition to torchdata's signature, where it is 1).

    Yields:
        The upstream's items, in order: in a distributed run, the first ``min`` of them, ``min``
        being the least number of items any rank's upstream yields.

    Raises:
        PrefetchTimeoutError: (a ``RuntimeError`` and a ``TimeoutError``, naming the stage) the
            other ranks did not answer within ``timeout``: one stopped iterating, failed or is stuck.
        RuntimeError: iterated inside a DataLoader worker of a distributed run (a worker is not a
            rank: put ``fullsync()`` after the loader), or ``RANK``/``WORLD_SIZE`` name several
            ranks but no process group is initialised; or another rank's upstream raised after the
            agreed items (that rank raises its own exception).
        Whatever this rank's upstream raises, as the same object, after the items before it (when
            no other rank ran out earlier).

    How the ranks agree: each pass creates a gloo process group of its own when it is created
    (``iter()``: every rank calls ``torch.distributed.new_group`` at the same point of its program,
    then the ranks meet at a barrier on it), so it works whatever the default backend is (NCCL
    included) and never interleaves with other collectives; the group is destroyed when the pass
    ends. A thread pulls the upstream
    and runs rounds of agreement: each rank contributes its position (items yielded plus items read
    ahead) and whether its upstream has ended, one ``all_reduce(MIN)`` of one int64 per round, and
    every rank may yield up to the least position. A round covers everything read ahead (up to
    ``buffer_size`` items), and the next round runs while the consumer takes the items of this one,
    so the collective costs once per chunk, not once per item (when the consumer is faster than
    the round trip, a round delivers about ``buffer_size / 2`` items: raise ``buffer_size`` for
    small, fast items). A rank asks for a round only when its consumer starts on the items of the
    previous one, so ranks that stop at the same item (a ``break`` on every rank) ask for the same
    rounds and none is left waiting.

    Memory bound: at most ``buffer_size`` items taken from the upstream and not yet yielded. The
    thread starts at the first ``next()`` and stops when the pass ends, is closed (``close()``,
    ``break``), collected or raises; ``close()`` waits up to 1 s for it (a daemon thread: a round
    asked for before the close still runs, so the other ranks are not left waiting). A rank that
    stops while the others go on (a ``break`` on one rank only) makes them raise at their next
    round: ``RuntimeError`` when its group is gone, ``PrefetchTimeoutError`` after ``timeout``.

    ``len()`` outside a distributed run is the upstream's; in one it is unknown (``TypeError``):
    the least length over the ranks is known only when a pass ends.

    Checkpoint: a state records how many items the pass yielded and the items it had read ahead
    (up to ``buffer_size`` items, which must be picklable); a resumed pass yields those first. In a
    distributed run a resumed pass starts with a round of agreement, so every rank must resume; each
    rank then yields exactly what the uninterrupted pass would have, its total again the least over
    the ranks (the ranks agree on positions counted from the start of the pass, so states taken
    after different numbers of items resume exactly too).

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper(range(5)).map(lambda x: x * 2).fullsync(timeout=60)
        >>> list(pipe), len(pipe)  # one process: the items pass through
        ([0, 2, 4, 6, 8], 5)

    See also: :class:`datapipes.DataLoader`, which can even out the batches of the ranks itself.
    """

    _saves = (
        "how many items it yielded and the items read ahead and not yet yielded (at most ``buffer_size``); "
        "outside a distributed run nothing"
    )

    _repr_fields = ("timeout",)

    def __init__(self, datapipe: IterDataPipe[T], timeout: float = _DEFAULT_TIMEOUT, buffer_size: int = 16) -> None:
        require_pipe(datapipe, "FullSync", "datapipe")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"FullSync: timeout must be a number of seconds, got {type(timeout).__name__}")
        if not timeout > 0:
            raise ValueError(f"FullSync: timeout must be > 0, got {timeout!r}")
        require_int(buffer_size, "FullSync", "buffer_size", minimum=1)
        self.datapipe = datapipe
        self.timeout = timeout
        self.buffer_size = buffer_size

    def _open(self, ctx: Pass) -> Iterator[T]:
        label = stage_label(self)
        world = _sync_world(label)
        it = ctx.open(self.datapipe)
        run = _SyncRun()
        ctx.track(self, run)
        if world == 1:
            chain = cast(_Through, _Through.from_iterable(_through(it, run)))
            chain.source = it
            return chain
        try:
            group = _new_group(label, self.timeout)
        except BaseException:
            close_iterator(it)
            raise
        owner = _SyncedPass(label, self.timeout, self.buffer_size, it, run, group)
        return _synced(owner, run, label, self.timeout)

    def __len__(self) -> int:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise len_unknown(self, "across distributed ranks it is the least number of items over the ranks, "
                                    "known only when a pass ends", NO_LEN)
        return source_len(self, self.datapipe)


# -- ShardingRoundRobinDispatcher ------------------------------------------------------------------


@functional_datapipe("sharding_round_robin_dispatch")
class ShardingRoundRobinDispatcher(ShardingFilter[T]):
    """Hand the items round-robin to the DataLoader workers: item ``i`` to worker
    ``i % num_workers`` (functional name: ``sharding_round_robin_dispatch``).

    torchdata runs the graph upstream of this stage once, in a dispatching process of DataLoader2,
    and sends its items to the workers in turn. There is no DataLoader2 here: this is a sharding
    stage, like ``sharding_filter()``, and every worker reads the graph upstream of it and keeps
    the items the dispatcher would have sent it, in the same order. So the stages upstream of it run
    in every worker (their work is repeated ``num_workers`` times), and they must yield the same
    items in the same order in every worker: seed random stages (``set_seed``; torch's DataLoader
    and :class:`datapipes.DataLoader` agree on seeds for unseeded ones), and keep stages that cannot
    be read twice (a one-shot stream, completion-order maps) downstream.

    Which shard a pass reads: set with ``apply_sharding`` (``graph_settings.apply_sharding``, and
    torch's DataLoader, which applies the ``DEFAULT`` group over its workers and ranks: there the
    items are split among every worker of every rank), the ``DEFAULT`` and ``MULTIPROCESSING``
    groups count; otherwise the worker found from where the pass runs (worker ``w`` of ``W``,
    ``torch.utils.data.get_worker_info()``), not the rank: in a distributed run under
    :class:`datapipes.DataLoader`, put ``sharding_filter(SHARDING_PRIORITIES.DISTRIBUTED)`` upstream
    to split among the ranks first (torch's DataLoader refuses two sharding stages on one path, as
    ``graph_settings.apply_sharding`` does: use this stage alone there). An unrestricted
    ``sharding_filter()`` upstream would split among the workers too (each worker would keep
    ``1 / W**2`` of the items): a pass raises ``RuntimeError`` then.

    Args:
        source_datapipe: the upstream pipe.
        sharding_group_filter: the sharding group this stage serves: ``None`` (default) or
            ``SHARDING_PRIORITIES.MULTIPROCESSING``, the only one torchdata supports (it requires
            it explicitly).

    Yields:
        The items of this worker's turn: positions ``worker, worker + W, ...`` of the upstream.

    Raises:
        ValueError / TypeError: ``sharding_group_filter`` is another group, or not one.
        RuntimeError: at the start of a pass with several workers, an unrestricted
            ``sharding_filter()`` upstream.

    ``len()``, checkpoints (the shard and how many items were kept), seeds and ``apply_sharding``
    are those of :class:`~datapipes.iter.ShardingFilter`.

    Example:
        >>> from datapipes import graph_settings
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper(range(10)).sharding_round_robin_dispatch().map(lambda x: x * 10)
        >>> list(graph_settings.apply_sharding(pipe, 3, 1))  # instance 1 of 3: items 1, 4, 7
        [10, 40, 70]

    See also: :class:`~datapipes.iter.ShardingFilter`.
    """

    _saves = "same as sharding_filter"

    def __init__(self, source_datapipe: IterDataPipe[T], sharding_group_filter: Any = None) -> None:
        where = "ShardingRoundRobinDispatcher"
        require_pipe(source_datapipe, where, "source_datapipe")
        if sharding_group_filter is not None:
            group = _group(sharding_group_filter, where, "sharding_group_filter")
            if group != SHARDING_PRIORITIES.MULTIPROCESSING:
                raise ValueError(
                    f"{where}: sharding_group_filter must be SHARDING_PRIORITIES.MULTIPROCESSING (or None), as "
                    f"torchdata's, got {_group_name(group)}; to split among ranks, put "
                    f"sharding_filter(SHARDING_PRIORITIES.DISTRIBUTED) upstream"
                )
        self.source_datapipe = source_datapipe
        self.sharding_group_filter = SHARDING_PRIORITIES.MULTIPROCESSING
        self.groups: dict[int, tuple[int, int]] = {}  # as ShardingFilter's: a group's key is an int

    def _combine(self, groups: dict[int, tuple[int, int]]) -> tuple[int, int]:
        # The DEFAULT group (graph_settings.apply_sharding's and torch's DataLoader's) counts too.
        default = groups.get(SHARDING_PRIORITIES.DEFAULT)
        return default if default is not None else super()._combine(groups)

    def _pass_shard(self, placed: tuple[int, int] | None = None) -> tuple[int, int]:
        shard = super()._pass_shard(placed)
        if shard[0] > 1 and not self.groups:
            for stage in traverse(self.source_datapipe):
                if (isinstance(stage, ShardingFilter) and not stage.groups
                        and stage.sharding_group_filter in (None, SHARDING_PRIORITIES.MULTIPROCESSING)):
                    raise RuntimeError(
                        f"{stage_label(self)}: {stage_label(stage)} upstream also splits the items among the "
                        f"{shard[0]} DataLoader workers, so each worker would keep only 1/{shard[0] ** 2} of them. "
                        f"Use sharding_filter(SHARDING_PRIORITIES.DISTRIBUTED) upstream to split among the ranks "
                        f"only, or drop it"
                    )
        return shard
