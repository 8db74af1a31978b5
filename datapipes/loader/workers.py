"""Worker processes: torch's DataLoader runs the pipe, each worker a shard.

:class:`WorkerProcesses` is the source stage of the pipe :class:`~datapipes.loader.DataLoader`
builds for ``num_workers > 0``. Each worker iterates a ``_WorkerFeed``: the pipe, seeded for the
pass with the loader's seed, the epoch (read from shared memory, so persistent workers see
``set_epoch``) and the worker's shard id. Every batch comes with its worker's position, so the
loader knows where each shard stands whether it takes the batches in turn (torch's order) or as
they come (``in_order=False``).

The workers' own generators are seeded as torch's workers seed them, from a base seed torch draws
from the loader's ``generator`` (:func:`_seeds_generator`): worker ``i`` seeds torch and Python's
``random`` with ``base + i`` (``get_worker_info().seed``) and NumPy from both. Here that generator is
seeded from the loader's seed, the epoch and the rank, so the seeds follow ``generator=`` /
``seed=`` / ``torch.manual_seed``, differ per worker, epoch and rank, and a resumed pass has the
seeds of the one it resumes. Persistent workers are seeded again as each later pass starts.
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import random
import threading
import time
import traceback
import weakref
from collections import deque
from typing import Any, Generator, Iterator

import numpy
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import IterableDataset
from torch.utils.data._utils import worker as _torch_worker

from .._runtime.worker import capture_rank, placement
from ..errors import noted_item
from ..datapipe import IterDataPipe, stage_label
from ..graph import sources_of, traverse
from ..iter.mapping import Mapper
from ..iter.sharding import SHARDING_PRIORITIES, ShardingFilter
from .._runtime import shares
from .._runtime.passes import Pass, PassConfig
from .._runtime.seeds import derive_seed, draw_seed
from . import fdpass
from .distributed import _WHERE, _shard_id
from .sampling import ShardedTorchGraph
from .shards import ShardsRun, ShardStream, pickled

__all__ = ["WorkerProcesses"]


def _identity(batch: Any) -> Any:
    """torch DataLoader's ``collate_fn`` for batches already collated in the worker."""
    return batch


def _seeds_generator(seed: int, epoch: int, rank: int) -> torch.Generator:
    """The generator torch's DataLoader draws the base seed of a pass's workers from: seeded from
    the loader's ``seed``, the ``epoch`` and the ``rank``."""
    return torch.Generator().manual_seed(derive_seed(seed, "worker seeds", epoch, rank))


def _reseed(seed: int, epoch: int, rank: int) -> None:
    """Seed this worker's generators for a pass of ``epoch`` as torch seeds a new worker (torch's,
    Python's and NumPy's, and ``get_worker_info().seed``), from the base seed torch would draw from
    :func:`_seeds_generator`: what a persistent worker does as each pass after its first starts."""
    info: Any = _torch_worker._worker_info  # set: this runs in a worker
    generate_state: Any = _torch_worker._generate_state  # NumPy's seed from torch's, as its workers do
    base = draw_seed(_seeds_generator(seed, epoch, rank))
    mine = base + info.id
    random.seed(mine)
    torch.manual_seed(mine)
    numpy.random.seed(generate_state(base, info.id))
    if dataclasses.is_dataclass(type(info)):
        info = dataclasses.replace(info, seed=mine)
    else:  # older torch: a class whose attributes are frozen once __init__ has set them
        info = type(info)(id=info.id, num_workers=info.num_workers, seed=mine, dataset=info.dataset)
    _torch_worker._worker_info = info


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
        self.rank = placement().rank  # the rank the workers' seeds derive from (_seeds_generator)
        self.served = 0  # in a worker: the passes it has served (torch seeded it for the first)
        #: (whether the loader's pass is observed, its budget), for each worker's passes: an
        #: observed worker pass keeps statistics and sends them back with its batches
        self.inherit = inherit

    def __iter__(self) -> Iterator[Any]:
        # The loader hands every pass its seed and epoch (a persistent worker's pass count does
        # not move the seeds on, as it does under a plain torch DataLoader, which cannot).
        config = PassConfig(self.seed, int(self.epoch.value), _shard_id(self.captured))
        if self.served:  # a persistent worker's later pass: seeded for its epoch
            _reseed(self.seed, config.epoch, self.rank)
        self.served += 1
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
        for item, state in stream.items_with_states(pickled):
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


class _InnerLoader(TorchDataLoader):  # type: ignore[type-arg]
    """torch's DataLoader over the workers' feeds, built as a pass starts: silent about the number
    of workers, since the loader gives torch's warning where torch gives it (at its construction
    and at ``iter()``), never at the first batch."""

    def check_worker_number_rationality(self) -> None:
        return None


class _PassWorkers:
    """The worker processes of one pass: torch's iterator over them, started once, by :meth:`start`
    (the loader calls it at ``iter()``, where torch starts its workers) or by the pass's first batch
    (on a buffer's thread, maybe), whichever comes first; :meth:`stop` (idempotent) stops them as the
    pass ends, persistent ones excepted unless they broke."""

    __slots__ = ("stage", "run", "epoch", "lock", "started", "stopped", "__weakref__")

    def __init__(self, stage: WorkerProcesses, run: ShardsRun | None, epoch: int) -> None:
        self.stage = stage
        self.run = run
        self.epoch = epoch  # the one the pass was given at iter()
        self.lock = threading.Lock()
        self.started: tuple[Any, fdpass.Channel | None, Any] | None = None  # torch's loader, channel, iterator
        self.stopped = False

    def start(self) -> tuple[Any, fdpass.Channel | None, Any] | None:
        """``(torch's loader, the descriptor channel or None, its iterator)``, the workers started on
        the first call; None once the pass was stopped."""
        with self.lock:
            if self.started is None and not self.stopped:
                stage, run = self.stage, self.run
                with stage._lock:  # workers fork (or pickle the pipe) here: not while len() lends shards
                    loader, channel = stage._torch_loader(None if run is None else run.resume, self.epoch)
                    it = iter(loader)
                self.started = (loader, channel, it)
            return None if self.stopped else self.started

    @property
    def processes(self) -> list[Any] | None:
        """The workers (``multiprocessing.Process``: torch's iterator's ``_workers``) once started."""
        started = self.started
        return None if started is None else started[2]._workers

    def stop(self, broken: bool = False) -> None:
        """The pass ended (ran out, failed, closed or dropped): its workers stop, unless they are
        persistent and not ``broken`` (torch failed, not the pass: a worker that died, a
        ``worker_init_fn`` that raised). A pass resuming a state had workers of its own."""
        with self.lock:
            if self.stopped:
                return
            self.stopped = True
            if self.started is None:
                return
            loader, channel, it = self.started
        stage, run = self.stage, self.run
        if broken and loader is stage._loader:
            stage.close()
        elif not stage.persistent_workers or run is not None and run.resume is not None:
            it._shutdown_workers()
            if channel is not None and loader is not stage._loader:
                channel.close()


class _WorkerBatches:
    """The iterator of a :class:`WorkerProcesses` stage for one pass: ``gen``'s batches; :meth:`close`
    stops the workers, also before the first batch (a generator that never ran has nothing to
    stop with). Dropped unclosed, a pass's generator stops them as it is collected, or, if it never
    ran, torch's iterator does as it is (torch's own backstop)."""

    __slots__ = ("gen", "workers")

    def __init__(self, gen: Generator[Any, None, None], workers: _PassWorkers) -> None:
        self.gen = gen
        self.workers = workers

    def __iter__(self) -> _WorkerBatches:
        return self

    def __next__(self) -> Any:
        return next(self.gen)

    def close(self) -> None:
        try:
            self.gen.close()
        finally:
            self.workers.stop()


def _in_turn(stage: WorkerProcesses, run: ShardsRun | None, workers: _PassWorkers) -> Generator[Any, None, None]:
    """The workers' batches, one worker after the other (torch's order), each recorded in ``run``
    with its worker's state as it is handed on."""
    started = workers.start()
    if started is None:
        return
    _, channel, it = started
    count = stage.num_workers
    waiting: list[deque[Any]] = [deque() for _ in range(count)]
    running = [True] * count  # no end marker received yet
    turn = 0 if run is None else run.next
    broken = False
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
            try:
                worker, is_item, state, item, stats = next(it)
            except BaseException:
                # torch's own failure, not the pass's (which comes as a record): a worker_init_fn that
                # raised (torch raises it at that worker's first batch, naming the worker), a worker
                # that died. Persistent workers are then not kept for the next pass.
                broken = True
                raise
            if type(item) is fdpass.Exported:
                item = channel.receive(worker, item)  # type: ignore[union-attr]  # a channel sent it
            if stats is not None:
                stage._received(worker, stats)
            waiting[worker].append((is_item, state, item))
            if is_item is not True:  # its end, or its failure
                running[worker] = False
    finally:
        workers.stop(broken)


def _as_completed(stage: WorkerProcesses, run: ShardsRun | None,
                  workers: _PassWorkers) -> Generator[Any, None, None]:
    """The workers' batches as they come (``in_order=False``: torch's loader gives a worker with
    room new work, so a slow one holds back only its own batches), each recorded in ``run`` with
    its worker's state as it is handed on. Each worker's batches still come in its own order, so
    every shard's recorded state is the one after its last batch delivered, and a state saved
    mid-pass resumes exactly: each batch not yet delivered, once."""
    started = workers.start()
    if started is None:
        return
    _, channel, it = started
    count = stage.num_workers
    running = count  # workers whose end (or failure) has not come yet
    broken = False
    try:
        while running:
            try:
                worker, is_item, state, item, stats = next(it)
            except BaseException:  # torch's own failure, not the pass's: see _in_turn
                broken = True
                raise
            if type(item) is fdpass.Exported:
                item = channel.receive(worker, item)  # type: ignore[union-attr]  # a channel sent it
            if stats is not None:
                stage._received(worker, stats)
            if is_item == _FAILED:
                raise pickle.loads(item)
            if run is not None:
                run.record(worker, state, (worker + 1) % count, is_item)
            if is_item:
                yield item
                item = None  # the user's now: not held here while the next batch is awaited
            else:
                running -= 1
    finally:
        workers.stop(broken)


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
    ``sharding_filter``, and this stage yields what they produce: in torch's round-robin order, or
    with ``in_order=False`` as the batches come (torch's ``in_order=False``: a worker with room gets
    new work), each worker's own batches in their order.

    Each pass starts its workers (``persistent_workers``: the first pass) as the loader starts it, or
    at its first batch, and stops them when it ends, is closed or collected; :meth:`close` stops
    persistent ones. ``len()`` is the sum of the workers' lengths, each computed as that worker
    will see its shard.
    """

    _repr_fields = ("num_workers",)
    #: the workers run the upstream graph, each in passes of its own (see datapipes._runtime.passes)
    _runs_sources_elsewhere = True

    def __init__(self, datapipe: IterDataPipe[Any], num_workers: int, persistent_workers: bool,
                 prefetch_factor: int | None, multiprocessing_context: Any, worker_init_fn: Any,
                 in_order: bool = True) -> None:
        if not in_order and "in_order" not in inspect.signature(TorchDataLoader.__init__).parameters:
            raise ValueError(f"{_WHERE}: in_order=False with num_workers > 0 needs torch 2.6 or later (its "
                             f"DataLoader's in_order takes the workers' batches as they come); this is torch "
                             f"{torch.__version__}")
        self.datapipe = datapipe
        self.num_workers = num_workers
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self.multiprocessing_context = multiprocessing_context
        self.worker_init_fn = worker_init_fn
        self.in_order = in_order
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
        channel = fdpass.Channel() if fdpass.enabled() else None

        kwargs: dict[str, Any] = {}
        if self.prefetch_factor is not None:
            kwargs["prefetch_factor"] = self.prefetch_factor
        if not self.in_order:
            kwargs["in_order"] = False  # (torch 2.6+; the default, True, is what older releases do)
        feed = _WorkerFeed(self.datapipe, self.seed, self._epoch if persistent else _Epoch(epoch), resume,
                           self._inherit, None if channel is None else channel.address)
        loader = _InnerLoader(
            feed, batch_size=None, num_workers=self.num_workers, collate_fn=_identity,
            generator=_seeds_generator(self.seed, epoch, feed.rank),  # the workers' seeds (not torch's global)
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

    def _open(self, ctx: Pass) -> Iterator[Any]:
        run, self._next_run = self._next_run, None
        epoch = self._next_epoch
        # The loader's thread budget reaches the workers' passes; an observed pass (profile, the
        # loader's reports) has its workers keep statistics and send them back (worker_stats).
        hooks, budget = shares.inherited(self, ctx)
        self._inherit = (hooks is not None, budget)
        self._worker_stats = {}
        workers = _PassWorkers(self, run, epoch)
        if run is not None:
            run.workers = weakref.ref(workers)  # the loader starts them at iter(), as torch does
        return _WorkerBatches((_in_turn if self.in_order else _as_completed)(self, run, workers), workers)

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

    The discovering ``sharding_filter`` stages of the main process's copy (and graphs of torch's
    DataPipes that shard) are given each worker's shard explicitly for the call (the caller holds the loader's lock, so no pass forks or pickles
    the pipe meanwhile), then put back.
    """
    found = [s for s in traverse(pipe) if isinstance(s, ShardingFilter) and not s.groups]
    graphs = [s for s in traverse(pipe) if isinstance(s, ShardedTorchGraph) and s.applied is None]
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
            for graph in graphs:  # a graph of torch's DataPipes: the same shard, as torch numbers them
                graph.applied = (where.world_size * num_workers, where.rank * num_workers + worker)
            total += len(pipe)  # type: ignore[arg-type]
    finally:
        for stage, groups in zip(found, saved):
            stage.groups = groups
        for graph in graphs:
            graph.applied = None
    return total

