"""Worker processes: torch's DataLoader runs the pipe, each worker a shard.

:class:`WorkerProcesses` is the source stage of the pipe :class:`~datapipes.loader.DataLoader`
builds for ``num_workers > 0``. Each worker iterates a ``_WorkerFeed``: the pipe, seeded for the
pass with the loader's seed, the epoch (read from shared memory, so persistent workers see
``set_epoch``) and the worker's shard id.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

from torch.utils.data import IterableDataset

from .._worker import capture_rank, placement
from ..datapipe import IterDataPipe
from ..graph import traverse
from ..iter.sharding import SHARDING_PRIORITIES, ShardingFilter
from .._pass import PassConfig, configured
from .distributed import _shard_id

__all__ = ["WorkerProcesses"]


def _identity(batch: Any) -> Any:
    """torch DataLoader's ``collate_fn`` for batches already collated in the worker."""
    return batch


class _WorkerFeed(IterableDataset):  # type: ignore[type-arg]
    """What each torch DataLoader worker iterates: the worker pipe, seeded for the current pass.

    The seed travels with the object (fixed per loader); the epoch is read from shared memory at the
    start of every pass, so persistent workers see ``set_epoch`` too.
    """

    def __init__(self, datapipe: IterDataPipe[Any], seed: int, epoch: Any) -> None:
        self.datapipe = datapipe
        self.seed = seed
        self.epoch = epoch
        self.captured = capture_rank()  # a spawned worker is not in the process group

    def __iter__(self) -> Iterator[Any]:
        # The loader hands every pass its seed and epoch (a persistent worker's pass count does
        # not move the seeds on, as it does under a plain torch DataLoader, which cannot).
        config = PassConfig(self.seed, int(self.epoch.value), _shard_id(self.captured))
        with configured(config):
            return iter(self.datapipe)


def _run_workers(stage: WorkerProcesses) -> Iterator[Any]:
    with stage._lock:  # workers fork (or pickle the pipe) here: not while len() lends shards
        it = iter(stage._torch_loader())
    try:
        yield from it
    finally:
        if not stage.persistent_workers:
            it._shutdown_workers()


class WorkerProcesses(IterDataPipe[Any]):
    """The source stage of the pipe :class:`DataLoader` builds for ``num_workers > 0``: torch's
    DataLoader runs ``datapipe`` in ``num_workers`` processes, each reading its own shard through
    ``sharding_filter``, and this stage yields what they produce, in torch's round-robin order.

    Each pass starts its workers (``persistent_workers``: the first pass) and stops them when it
    ends, is closed or collected; :meth:`close` stops persistent ones. ``len()`` is the sum of the
    workers' lengths, each computed as that worker will see its shard.
    """

    _repr_fields = ("num_workers",)
    #: the workers run the upstream graph, each in passes of its own (see datapipes._pass)
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
        self._epoch: Any = None
        self._loader: Any = None
        self._lock = threading.Lock()

    def prepare(self, seed: int, epoch: int) -> None:
        """Set the seed and epoch the workers of the next pass use."""
        if self._epoch is None:
            from multiprocessing.sharedctypes import RawValue

            self._epoch = RawValue("q", 0)
        self._epoch.value = epoch
        self.seed = seed  # fixed per loader: persistent workers keep the one they started with

    def _torch_loader(self) -> Any:
        if self._loader is not None:
            return self._loader
        from torch.utils.data import DataLoader as TorchDataLoader

        kwargs: dict[str, Any] = {}
        if self.prefetch_factor is not None:
            kwargs["prefetch_factor"] = self.prefetch_factor
        loader = TorchDataLoader(
            _WorkerFeed(self.datapipe, self.seed, self._epoch), batch_size=None, num_workers=self.num_workers,
            collate_fn=_identity, persistent_workers=self.persistent_workers, worker_init_fn=self.worker_init_fn,
            multiprocessing_context=self.multiprocessing_context, **kwargs,
        )
        if self.persistent_workers:
            self._loader = loader
        return loader

    def close(self) -> None:
        """Stop persistent workers (idempotent); the next pass starts new ones."""
        loader, self._loader = self._loader, None
        it = getattr(loader, "_iterator", None)
        if it is not None:
            it._shutdown_workers()

    def __iter__(self) -> Iterator[Any]:
        return _run_workers(self)

    def __len__(self) -> int:
        with self._lock:
            return _worker_len(self.datapipe, self.num_workers)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_loader"] = None
        state["_epoch"] = None
        state["_lock"] = None
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

