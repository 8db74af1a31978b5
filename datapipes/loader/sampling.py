"""torch's ``shuffle=``, ``sampler=``, ``batch_sampler=`` and ``generator=`` for a map-style dataset.

torch's DataLoader runs the sampler in the main process and sends the indices to its workers. Here
every worker (and rank) runs the index pipe itself and keeps its share through ``sharding_filter``,
so each must draw the *same* indices: :class:`DrawnSampler` draws a pass's indices all at once
with every random generator a sampler may read seeded from the pass's seed (torch's global
generator, forked; Python's and NumPy's global ones, put back after; the sampler's own
``torch.Generator`` attributes, replaced in a copy). One permutation per epoch, each index once
across workers and ranks, and a resumed pass draws the same indices again from the saved seed.

A graph of torch's own DataPipes (``torch.utils.data.datapipes``) runs inside :class:`TorchGraph`,
which gives it, at every pass, what torch's DataLoader gives it: ``apply_sharding`` with the pass's
shard and ``apply_random_seed`` with a generator seeded from the pass's seed and epoch (the same in
every worker and rank), so its shuffles before ``sharding_filter`` agree across the shards.
"""

from __future__ import annotations

import copy
import random
from typing import Any, Iterator, cast

import numpy
import torch
from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler
from torch.utils.data import IterDataPipe as TorchIterDataPipe
from torch.utils.data import Sampler as TorchSampler
from torch.utils.data import graph_settings as _torch_settings

from .._runtime.passes import Pass
from .._runtime.seeds import derive_seed
from .._runtime.worker import capture_rank, placement
from ..datapipe import IterDataPipe
from ..graph import traverse
from ..graph_settings import apply_shuffle_settings
from ..iter.combinatorics import Sampler, _SamplerRun
from ..iter.util import IterableWrapper, _deferred
from .distributed import _WHERE

__all__ = ["DrawnSampler", "ShardedTorchGraph", "TorchGraph", "foreign", "torch_graph", "draw_indices", "check_drawn_alike", "own_generator", "random_samplers_wrapped",
           "refuse_wrapped_samplers", "shards_itself", "shuffled"]

#: how deep the attributes holding samplers are followed (a BatchSampler's ``sampler``, ...)
_DEPTH = 3
_NESTED = ("sampler", "batch_sampler")


def _reseeded(sampler: Any, seed: int, epoch: int, depth: int = 0) -> Any:
    """A shallow copy of ``sampler`` whose ``torch.Generator`` attributes are new generators seeded
    from ``seed``, whose ``set_epoch`` (``DistributedSampler``'s) was given ``epoch``, and whose
    nested samplers are treated alike. The caller's sampler is left as it was."""
    if depth > _DEPTH or not hasattr(sampler, "__dict__"):
        return sampler
    sampler = copy.copy(sampler)
    for name, value in list(vars(sampler).items()):
        if isinstance(value, torch.Generator):
            generator = torch.Generator()
            generator.manual_seed(derive_seed(seed, "generator", depth, name))
            setattr(sampler, name, generator)
        elif name in _NESTED and value is not None:
            setattr(sampler, name, _reseeded(value, seed, epoch, depth + 1))
    set_epoch = getattr(sampler, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)
    return sampler


def draw_indices(sampler: Any, seed: int, epoch: int) -> list[Any]:
    """Everything ``sampler`` yields in one pass, drawn with every generator it may read seeded
    from ``seed`` (see the module's docstring); the caller's generators are left as they were."""
    sampler = _reseeded(sampler, seed, epoch)
    py_state = random.getstate()
    np_state = numpy.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, "torch"))
            random.seed(derive_seed(seed, "random"))
            numpy.random.seed(derive_seed(seed, "numpy") % 2**32)
            return list(sampler)
    finally:
        random.setstate(py_state)
        numpy.random.set_state(np_state)


def check_drawn_alike(sampler: Any, what: str, where: str) -> None:
    """Refuse a sampler that draws different indices from the same seed: it keeps random state of
    its own that the loader cannot seed, so each worker process would draw another order (indices
    repeated, others missing). Draws twice; a ``SequentialSampler`` is not drawn."""
    if isinstance(sampler, SequentialSampler):
        return
    if draw_indices(sampler, 0, 0) != draw_indices(sampler, 0, 0):
        raise ValueError(
            f"{where}: {what}={type(sampler).__name__} draws different indices from the same seed: it keeps "
            f"random state the loader cannot seed (only torch's, Python's and NumPy's global generators and "
            f"its torch.Generator attributes are), so each of the worker processes would draw another order, "
            f"repeating some indices and missing others. Make it draw from one of those generators, or use "
            f"num_workers=0"
        )


def own_generator(sampler: Any, depth: int = 0) -> torch.Generator | None:
    """The ``torch.Generator`` a sampler (or a sampler it holds) was given, if any."""
    if sampler is None or depth > _DEPTH or not hasattr(sampler, "__dict__"):
        return None
    for name, value in vars(sampler).items():
        if isinstance(value, torch.Generator):
            return value
        if name in _NESTED:
            found = own_generator(value, depth + 1)
            if found is not None:
                return found
    return None


def _is_random(sampler: Any) -> bool:
    if isinstance(sampler, BatchSampler):
        return _is_random(sampler.sampler)
    return isinstance(sampler, TorchSampler) and not isinstance(sampler, SequentialSampler)


def random_samplers_wrapped(pipe: Any) -> Iterator[tuple[Any, Any]]:
    """``(stage, sampler)`` for each ``IterableWrapper`` of ``pipe``'s graph wrapping a random
    torch sampler (anything but a ``SequentialSampler``)."""
    for stage in traverse(pipe):
        if isinstance(stage, IterableWrapper) and _is_random(stage.iterable):
            yield stage, stage.iterable


def shards_itself(sampler: Any) -> bool:
    """Whether ``sampler`` already keeps one rank's share (a ``DistributedSampler``, also inside a
    ``BatchSampler``): the loader then shards its indices across worker processes only."""
    if isinstance(sampler, BatchSampler):
        sampler = sampler.sampler
    return isinstance(sampler, DistributedSampler)


def _sample_drawn(pipe: DrawnSampler, ctx: Pass) -> Iterator[Any]:
    run = _SamplerRun(seed=ctx.seed_for(pipe))
    config = ctx.config
    epoch = pipe._epoch if config is None else config.epoch

    def open_() -> Iterator[Any]:
        # the pass seed, or the saved pass's: the same indices as the pass that was saved
        return iter(draw_indices(pipe.sampler, run.seed, epoch))  # type: ignore[arg-type]

    ctx.track(pipe, run)
    return _deferred(open_, run.source)


class DrawnSampler(Sampler):
    """The index source :class:`~datapipes.loader.DataLoader` builds from ``shuffle=True``,
    ``sampler=`` or ``batch_sampler=``: a :class:`~datapipes.iter.Sampler` over a sampler already
    built whose every pass draws its indices from the pass seed (see the module's docstring), so
    that every worker process and rank draws the same ones."""

    def __init__(self, datapipe: Any, sampler: Any) -> None:
        super().__init__(datapipe, sampler)
        self._is_random = True  # its seed comes from the loader, every pass, whatever the sampler holds

    def _open(self, ctx: Pass) -> Iterator[Any]:
        return _sample_drawn(self, ctx)


def foreign(data: Any) -> bool:
    """Whether ``data`` is one of torch's own DataPipes (not one of ours)."""
    return isinstance(data, TorchIterDataPipe) and not isinstance(data, IterDataPipe)


def _torch_sharded(datapipe: Any) -> bool:
    """Whether torch's graph of ``datapipe`` holds a sharding stage (torch's or ours)."""
    graph = _torch_settings.traverse_dps(datapipe)
    return any(_torch_settings._is_sharding_datapipe(p) for p in _torch_settings.get_all_graph_pipes(graph))


class TorchGraph(IterDataPipe[Any]):
    """The stage :class:`~datapipes.loader.DataLoader` runs a graph of torch's own DataPipes in.

    As each pass starts, it does to ``datapipe``'s graph what torch's DataLoader does in each worker:
    torch's ``apply_random_seed`` with a generator seeded from the pass's seed and epoch (the same
    in every worker and rank, so every ``Shuffler`` draws the same permutation and a resumed pass
    draws it again), then, where the graph shards (:class:`ShardedTorchGraph`), torch's
    ``apply_sharding`` with the pass's shard. Outside a loader's pass the graph is left as it is.
    The graph's objects are torch's: as under torch's DataLoader, they are changed in the process
    that runs the pass (with ``num_workers=0``, the caller's).

    Yields the items of ``datapipe``, read through ``IterableWrapper(datapipe, deepcopy=False)``,
    whose count is the position a checkpoint saves (a resumed pass reads the graph again, with the
    same seeds, and skips that many items).
    """

    _saves = "nothing: its position is its source's (the items read, replayed with the same seeds)"
    _stateless = True

    def __init__(self, datapipe: Any) -> None:
        if not foreign(datapipe):
            raise TypeError(f"TorchGraph: datapipe must be one of torch's own IterDataPipes, got "
                            f"{type(datapipe).__name__}")
        self.datapipe = datapipe  # torch's: not a stage our graph walks (sources_of)
        self.source_datapipe: IterDataPipe[Any] = IterableWrapper(datapipe, deepcopy=False)

    def _open(self, ctx: Pass) -> Iterator[Any]:
        config = ctx.config
        if config is not None:
            seed = derive_seed(config.seed, "torch datapipes", config.epoch)
            _torch_settings.apply_random_seed(self.datapipe, torch.Generator().manual_seed(seed % 2**63))
        self._shard_graph(ctx)
        return ctx.open(self.source_datapipe)

    def _shard_graph(self, pass_: Any) -> None:
        """A graph without a sharding stage is sharded by no one here."""

    def __len__(self) -> int:
        return len(self.datapipe)


class ShardedTorchGraph(TorchGraph):
    """A :class:`TorchGraph` whose graph holds a ``sharding_filter``: a sharding stage of ours
    (``apply_sharding``), so the loader adds none, and each pass shards the graph as the pass's
    ``sharding_filter`` stages are sharded (this worker and rank, unless ``apply_sharding`` set one)."""

    def __init__(self, datapipe: Any) -> None:
        super().__init__(datapipe)
        self.applied: tuple[int, int] | None = None  # set by apply_sharding (or lent for len())
        self._captured_rank = capture_rank()  # a spawned worker is not in the process group

    def apply_sharding(self, num_of_instances: int, instance_id: int, sharding_group: Any = None) -> None:
        """Read shard ``instance_id`` of ``num_of_instances`` from the next pass on, instead of the
        shard found from the DataLoader worker and distributed rank."""
        if not 0 <= instance_id < num_of_instances:
            raise ValueError(f"{type(self).__name__}.apply_sharding: instance_id({instance_id}) should be smaller "
                             f"than num_of_instances({num_of_instances})")
        self.applied = (num_of_instances, instance_id)

    def _pass_shard(self, placed: tuple[int, int] | None = None) -> tuple[int, int]:
        if self.applied is not None:
            return self.applied
        return placed if placed is not None else placement(self._captured_rank).shard

    def _pass_ranks(self) -> int:
        return 1 if self.applied is not None else placement(self._captured_rank).world_size

    def _shard_graph(self, pass_: Any) -> None:
        shard = self._pass_shard() if pass_ is None else pass_.shard_for(self)
        _torch_settings.apply_sharding(self.datapipe, *shard)

    def __len__(self) -> int:
        _torch_settings.apply_sharding(self.datapipe, *self._pass_shard())
        return len(self.datapipe)


def torch_graph(data: Any, shuffle: bool | None) -> TorchGraph:
    """The stage that runs ``data``, a graph of torch's own DataPipes, its shuffles turned on or off
    (``shuffle``; None: as they are) as torch's DataLoader turns them (``apply_shuffle_settings``:
    with ``shuffle=True`` and no shuffle in the graph, one is added at the end, with torch's warning)."""
    if shuffle is not None:
        data = _torch_settings.apply_shuffle_settings(data, shuffle=shuffle)
    return ShardedTorchGraph(data) if _torch_sharded(data) else TorchGraph(data)


def shuffled(pipe: IterDataPipe[Any], data: Any, shuffle: bool) -> IterDataPipe[Any]:
    """An iterable pipe's shuffles turned on or off, as torch's DataLoader does to a DataPipe's
    (with ``shuffle=True`` and no shuffle in the graph, one is added at the end, with a warning)."""
    return cast("IterDataPipe[Any]", apply_shuffle_settings(pipe, shuffle=shuffle))


def refuse_wrapped_samplers(pipe: IterDataPipe[Any], num_workers: int) -> None:
    """``IterableWrapper(RandomSampler(...))`` under worker processes: each worker iterates a copy
    and draws a permutation of its own, so its share repeats some indices and misses others."""
    for stage, sampler in random_samplers_wrapped(pipe):
        raise ValueError(
            f"{_WHERE}: {stage!r} wraps a {type(sampler).__name__}: each of the {num_workers} worker processes would "
            f"iterate its own copy and draw another order, repeating some indices and missing others. Give the "
            f"sampler to the loader over the dataset instead, DataLoader(dataset, sampler=...) (or batch_sampler=), "
            f"which draws the same indices in every worker and shards them; or use num_workers=0"
        )
