"""Worker processes: torch's DataLoader runs the pipe, each worker a shard.

:class:`WorkerProcesses` is the source stage of the pipe :class:`~datapipes.loader.DataLoader`
builds for ``num_workers > 0``. Each worker iterates a ``_WorkerFeed``: the pipe, seeded for the
pass with the loader's seed, the epoch (read from shared memory, so persistent workers see
``set_epoch``) and the worker's shard id.
"""

from __future__ import annotations

import pickle
import threading
import time
import traceback
from collections import deque
from typing import Any, Iterator

from torch.utils.data import IterableDataset

from .._runtime.worker import capture_rank, placement
from ..errors import noted_item
from ..datapipe import IterDataPipe, stage_label
from ..graph import sources_of, traverse
from ..iter.mapping import Mapper
from ..iter.sharding import SHARDING_PRIORITIES, ShardingFilter
from .._runtime import shares
from .._runtime.passes import PassConfig
from . import fdpass
from .distributed import _shard_id
from .shards import ShardsRun, ShardStream

__all__ = ["WorkerProcesses"]


def _identity(batch: Any) -> Any:
    """torch DataLoader's ``collate_fn`` for batches already collated in the worker."""
    return batch


class _WorkerFeed(IterableDataset):  # type: ignore[type-arg]
    """What each torch DataLoader worker iterates: its shard of the worker pipe, seeded for the
    current pass, as ``(worker, is_item, the shard's state after it, item)``, then
    ``(worker, False, final state, None)`` when the shard has run out.

    The seed travels with the object (fixed per loader); the epoch is read at the start of every
    pass from ``epoch.value``: shared memory that the loader sets as each pass of persistent workers
    starts (they serve one pass at a time), or the pass's own epoch for workers of one pass. ``resume``: the state of each
    worker's shard for a resumed pass (a loader gives such a pass workers of its own). ``channel``:
    the address the workers send their batches' descriptors to (:mod:`.fdpass`), or None.
    """

    def __init__(self, datapipe: IterDataPipe[Any], seed: int, epoch: Any, resume: list[Any] | None,
                 inherit: tuple[bool, Any] = (False, None), channel: str | None = None) -> None:
        self.datapipe = datapipe
        self.channel = channel
        self.seed = seed
        self.epoch = epoch
        self.resume = resume
        self.captured = capture_rank()  # a spawned worker is not in the process group
        #: (whether the loader's pass is observed, its budget), for each worker's passes: an
        #: observed worker pass keeps statistics and sends them back with its batches
        self.inherit = inherit

    def __iter__(self) -> Iterator[Any]:
        # The loader hands every pass its seed and epoch (a persistent worker's pass count does
        # not move the seeds on, as it does under a plain torch DataLoader, which cannot).
        config = PassConfig(self.seed, int(self.epoch.value), _shard_id(self.captured))
        where = placement(self.captured)
        worker = where.worker_id
        stream = ShardStream(self.datapipe, config, None if self.resume is None else self.resume[worker])
        watched, budget = self.inherit
        stream.inherit = (() if watched else None, budget)
        return _feed(stream, worker, where.num_workers, watched, self.channel)


#: the kind of a worker's record that carries the exception its pass raised (items: True; end: False)
_FAILED = "failed"

#: seconds between two statistics snapshots a watched worker sends with its batches
STATS_INTERVAL = 0.25


def _snapshot(stream: ShardStream) -> list[tuple[str, Any]]:
    """``(label, StageStats)`` of the worker's stages (plain data, pickled to the main process), in
    data-flow order, leaving out those the loader adds without changing any item."""
    return [(stage_label(stage), stats) for stage, stats in reversed(stream.stats())
            if not stage._unseen]


def _feed(stream: ShardStream, worker: int, workers: int, watched: bool = False,
          channel: str | None = None) -> Iterator[Any]:
    """The worker's records: ``(worker, kind, state, item, statistics)``, the statistics (see
    :func:`_snapshot`) sent every :data:`STATS_INTERVAL` seconds and with the last record when the
    pass is watched (profiled, or reported on), else None. With a ``channel``, an item's tensors
    travel as descriptors over it (:func:`.fdpass.send`)."""
    last = -STATS_INTERVAL
    try:
        for item, state in stream.items_with_states(pickle.dumps):
            stats = None
            if watched and time.monotonic() - last >= STATS_INTERVAL:
                stats, last = _snapshot(stream), time.monotonic()
            yield worker, True, state, item if channel is None else fdpass.send(channel, worker, item), stats
            item = state = stats = None  # sent: the worker lets go of it while it makes the next batch
    except Exception as e:  # noqa: BLE001 - every failure of the pass goes back to the main process as it is
        before = _position_before_sharding(stream, e)
        if before is not None:
            e.add_note(before)
        yield worker, _FAILED, None, _exported(e, worker, workers), _snapshot(stream) if watched else None
        return
    yield worker, False, stream.state(), None, _snapshot(stream) if watched else None


def _position_before_sharding(stream: ShardStream, exc: BaseException) -> str | None:
    """A note giving the failing item's position in the pipe *before* its ``sharding_filter``
    (what a single process would have named), where it can be told exactly: the stage that noted
    the item reads the sharding filter's items one for one (through maps that neither flatten nor
    skip), so the filter's ``k``-th item is the input's ``k * n + i`` for this worker's shard
    ``(n, i)``. None otherwise."""
    pass_ = stream.last_pass
    found = noted_item(exc)
    if pass_ is None or found is None:
        return None
    label, position = found
    named = [s for s in traverse(stream.pipe) if stage_label(s) == label]
    if len(named) != 1:
        return None
    stage = named[0]
    while True:
        upstream = sources_of(stage)
        if len(upstream) != 1:
            return None
        stage = upstream[0]
        if isinstance(stage, ShardingFilter):
            break
        if not isinstance(stage, Mapper) or stage._flattens or stage._policy.skips:
            return None
    n, i = pass_.shard_for(stage)
    return (f"[datapipes] that is item {position * n + i} of the pipe before its sharding_filter (this worker reads "
            f"items {i}, {i + n}, {i + 2 * n}, ...)")


def _exported(exc: Exception, worker: int, workers: int) -> bytes:
    """``exc``, raised by the pass of DataLoader worker ``worker``, pickled for the main process with
    its type, ``args`` and notes (the stage's, then the worker's and its traceback), so that the
    loader raises it as a single process would, rather than torch's rewrap (its message in
    ``args``, the notes lost). An exception that does not survive pickling becomes a
    ``RuntimeError`` that names its type and message, with the same notes."""
    exc.add_note(f"[datapipes] raised in DataLoader worker process {worker} of {workers} (the positions of the "
                 f"stages after its sharding_filter count that worker's share)")
    exc.add_note("worker process traceback (most recent call last):\n"
                 + "".join(traceback.format_tb(exc.__traceback__)).rstrip())
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)  # a type whose __init__ wants other arguments fails here, not in the loader
        return data
    except Exception as e:  # noqa: BLE001 - whatever pickling raised: send the substitute instead
        why = f"{type(e).__name__}: {e}"
    kind = type(exc)
    substitute = RuntimeError(f"{kind.__module__}.{kind.__qualname__} raised in DataLoader worker process {worker} "
                              f"(it cannot be pickled back to the main process: {why}): {exc}")
    for note in getattr(exc, "__notes__", ()):
        substitute.add_note(note)
    return pickle.dumps(substitute)


def _run_workers(stage: WorkerProcesses, run: ShardsRun | None, epoch: int) -> Iterator[Any]:
    """The workers' batches, one worker after the other (torch's order), each recorded in ``run``
    with its worker's state as it is handed on. ``epoch``: the one the pass was given at ``iter()``."""
    with stage._lock:  # workers fork (or pickle the pipe) here: not while len() lends shards
        loader, channel = stage._torch_loader(None if run is None else run.resume, epoch)
        it = iter(loader)
    count = stage.num_workers
    waiting: list[deque[Any]] = [deque() for _ in range(count)]
    running = [True] * count  # no end marker received yet
    turn = 0 if run is None else run.next
    try:
        while True:
            queue = waiting[turn]
            if queue:
                is_item, state, item = queue.popleft()
                if is_item == _FAILED:  # at its turn, as the worker's next batch would have come
                    raise pickle.loads(item)
                following = (turn + 1) % count if is_item else turn
                if run is not None:
                    run.record(turn, state, following, is_item)
                turn = following
                if is_item:
                    yield item
                    item = None  # the user's now: not held here while the next batch is awaited
                continue
            if not running[turn]:
                if not any(running):
                    return
                turn = (turn + 1) % count
                continue
            worker, is_item, state, item, stats = next(it)
            if type(item) is fdpass.Exported:
                item = channel.receive(worker, item)  # type: ignore[union-attr]  # a channel sent it
            if stats is not None:
                stage._received(worker, stats)
            waiting[worker].append((is_item, state, item))
            if is_item is not True:  # its end, or its failure
                running[worker] = False
    finally:
        if not stage.persistent_workers or run is not None and run.resume is not None:
            it._shutdown_workers()
            if channel is not None and loader is not stage._loader:
                channel.close()


class _Epoch:
    """The epoch of the one pass a set of (not persistent) workers serves, read as ``epoch.value``
    as the shared memory of persistent workers is."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self) -> tuple[type[_Epoch], tuple[int]]:
        return _Epoch, (self.value,)


class WorkerProcesses(IterDataPipe[Any]):
    """The source stage of the pipe :class:`DataLoader` builds for ``num_workers > 0``: torch's
    DataLoader runs ``datapipe`` in ``num_workers`` processes, each reading its own shard through
    ``sharding_filter``, and this stage yields what they produce, in torch's round-robin order.

    Each pass starts its workers (``persistent_workers``: the first pass) and stops them when it
    ends, is closed or collected; :meth:`close` stops persistent ones. ``len()`` is the sum of the
    workers' lengths, each computed as that worker will see its shard.
    """

    _repr_fields = ("num_workers",)
    #: the workers run the upstream graph, each in passes of its own (see datapipes._runtime.passes)
    _runs_sources_elsewhere = True

    def __init__(self, datapipe: IterDataPipe[Any], num_workers: int, persistent_workers: bool,
                 prefetch_factor: int | None, multiprocessing_context: Any, worker_init_fn: Any) -> None:
        self.datapipe = datapipe
        self.num_workers = num_workers
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self.multiprocessing_context = multiprocessing_context
        self.worker_init_fn = worker_init_fn
        self.seed = 0
        self._epoch: Any = None  # shared memory the persistent workers read their pass's epoch from
        self._next_epoch = 0  # the epoch prepare() gave the next pass
        self._loader: Any = None
        self._channel: fdpass.Channel | None = None  # the persistent workers' descriptor channel
        self._next_run: ShardsRun | None = None
        self._lock = threading.Lock()
        self._inherit: tuple[bool, Any] = (False, None)
        #: worker id -> the latest statistics of its pass's stages, [(label, StageStats)]
        self._worker_stats: dict[int, list[tuple[str, Any]]] = {}

    def prepare(self, seed: int, epoch: int, run: ShardsRun | None = None) -> None:
        """Set the seed and epoch the workers of the next pass use, and where it keeps their
        positions (``run``, with the states to resume from, if any)."""
        self._next_run = run
        self._next_epoch = epoch
        self.seed = seed  # fixed per loader: persistent workers keep the one they started with

    def _torch_loader(self, resume: list[Any] | None, epoch: int) -> tuple[Any, fdpass.Channel | None]:
        """torch's DataLoader over the workers' shards for a pass of epoch ``epoch``, and the channel
        its workers send their batches' descriptors over (None: torch's queue carries them); a pass
        resuming ``resume`` (the states of the workers' shards) gets workers of its own, persistent
        or not. Persistent workers read the epoch from shared memory, set here as their pass
        starts; workers of one pass get that pass's epoch with the feed, so two passes started
        before either is read keep the epochs their ``iter()`` calls were given."""
        persistent = self.persistent_workers and resume is None
        if persistent:
            if self._epoch is None:
                from multiprocessing.sharedctypes import RawValue

                self._epoch = RawValue("q", 0)
            self._epoch.value = epoch
        if resume is not None:
            self.close()
        elif self._loader is not None:
            return self._loader, self._channel
        from torch.utils.data import DataLoader as TorchDataLoader

        channel = fdpass.Channel() if fdpass.enabled() else None

        kwargs: dict[str, Any] = {}
        if self.prefetch_factor is not None:
            kwargs["prefetch_factor"] = self.prefetch_factor
        loader = TorchDataLoader(
            _WorkerFeed(self.datapipe, self.seed, self._epoch if persistent else _Epoch(epoch), resume,
                        self._inherit, None if channel is None else channel.address), batch_size=None,
            num_workers=self.num_workers, collate_fn=_identity,
            persistent_workers=persistent, worker_init_fn=self.worker_init_fn,
            multiprocessing_context=self.multiprocessing_context, **kwargs,
        )
        if persistent:
            self._loader, self._channel = loader, channel
        return loader, channel

    def close(self) -> None:
        """Stop persistent workers (idempotent); the next pass starts new ones."""
        loader, self._loader = self._loader, None
        channel, self._channel = self._channel, None
        it = getattr(loader, "_iterator", None)
        if it is not None:
            it._shutdown_workers()
        if channel is not None:
            channel.close()

    def __iter__(self) -> Iterator[Any]:
        run, self._next_run = self._next_run, None
        epoch = self._next_epoch
        # The loader's thread budget reaches the workers' passes; an observed pass (profile, the
        # loader's reports) has its workers keep statistics and send them back (worker_stats).
        hooks, budget = shares.inherited(self)
        self._inherit = (hooks is not None, budget)
        self._worker_stats = {}
        return _run_workers(self, run, epoch)

    def _received(self, worker: int, stats: list[tuple[str, Any]]) -> None:
        self._worker_stats[worker] = stats

    def worker_stats(self) -> list[tuple[int, str, Any]]:
        """``(worker id, stage label, StageStats)`` of every stage inside the worker processes, as
        each worker last sent them (every 0.25 s and at its end) during an observed pass: one
        :func:`datapipes.profile` ran, or a loader with ``report_stats_interval``. Empty otherwise."""
        return [(worker, label, stats) for worker, rows in sorted(self._worker_stats.items())
                for label, stats in rows]

    def __len__(self) -> int:
        with self._lock:
            return _worker_len(self.datapipe, self.num_workers)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_loader"] = None
        state["_channel"] = None
        state["_epoch"] = None
        state["_lock"] = None
        state["_next_run"] = None
        state["_worker_stats"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def _worker_len(pipe: IterDataPipe[Any], num_workers: int) -> int:
    """How many items the ``num_workers`` workers of one rank yield together: ``len(pipe)`` as each
    worker will see it, its ``sharding_filter`` stages reading that worker's shard.

    The discovering ``sharding_filter`` stages of the main process's copy are given each worker's
    shard explicitly for the call (the caller holds the loader's lock, so no pass forks or pickles
    the pipe meanwhile), then put back.
    """
    found = [s for s in traverse(pipe) if isinstance(s, ShardingFilter) and not s.groups]
    where = placement()
    saved = [s.groups for s in found]
    total = 0
    try:
        for worker in range(num_workers):
            for stage in found:
                stage.groups = {
                    SHARDING_PRIORITIES.DISTRIBUTED: (where.world_size, where.rank),
                    SHARDING_PRIORITIES.MULTIPROCESSING: (num_workers, worker),
                }
            total += len(pipe)  # type: ignore[arg-type]
    finally:
        for stage, groups in zip(found, saved):
            stage.groups = groups
    return total

