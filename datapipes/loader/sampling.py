"""torch's ``shuffle=``, ``sampler=``, ``batch_sampler=`` and ``generator=`` for a map-style dataset.

torch's DataLoader runs the sampler in the main process and sends the indices to its workers. Here
every worker (and rank) runs the index pipe itself and keeps its share through ``sharding_filter``,
so each must draw the *same* indices: :class:`DrawnSampler` draws a pass's indices all at once
with every random generator a sampler may read seeded from the pass's seed (torch's global
generator, forked; Python's and NumPy's global ones, put back after; the sampler's own
``torch.Generator`` attributes, replaced in a copy). One permutation per epoch, each index once
across workers and ranks, and a resumed pass draws the same indices again from the saved seed.
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

from .._runtime import passes as _pass
from .._runtime.seeds import derive_seed
from ..datapipe import IterDataPipe
from ..graph import traverse
from ..graph_settings import apply_shuffle_settings
from ..iter.combinatorics import Sampler, _SamplerRun
from ..iter.util import IterableWrapper, _deferred
from .distributed import _WHERE

__all__ = ["DrawnSampler", "draw_indices", "check_drawn_alike", "own_generator", "random_samplers_wrapped",
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


def _sample_drawn(pipe: DrawnSampler) -> Iterator[Any]:
    run = _SamplerRun(seed=pipe._pass_seed())
    owner = _pass.current() or _pass.owner(pipe)
    config = None if owner is None else owner.config
    epoch = pipe._epoch if config is None else config.epoch

    def open_() -> Iterator[Any]:
        # the pass seed, or the saved pass's: the same indices as the pass that was saved
        return iter(draw_indices(pipe.sampler, run.seed, epoch))  # type: ignore[arg-type]

    _pass.track(pipe, run)
    return _deferred(open_, run.source)


class DrawnSampler(Sampler):
    """The index source :class:`~datapipes.loader.DataLoader` builds from ``shuffle=True``,
    ``sampler=`` or ``batch_sampler=``: a :class:`~datapipes.iter.Sampler` over a sampler already
    built whose every pass draws its indices from the pass seed (see the module's docstring), so
    that every worker process and rank draws the same ones."""

    def __init__(self, datapipe: Any, sampler: Any) -> None:
        super().__init__(datapipe, sampler)
        self._is_random = True  # its seed comes from the loader, every pass, whatever the sampler holds

    def __iter__(self) -> Iterator[Any]:
        return _sample_drawn(self)


def shuffled(pipe: IterDataPipe[Any], data: Any, shuffle: bool) -> IterDataPipe[Any]:
    """An iterable pipe's shuffles turned on or off, as torch's DataLoader does to a DataPipe's
    (with ``shuffle=True`` and no shuffle in the graph, one is added at the end, with a warning)."""
    if isinstance(data, TorchIterDataPipe) and not isinstance(data, IterDataPipe):  # one of torch's own
        from torch.utils.data.graph_settings import apply_shuffle_settings as torch_apply

        torch_apply(data, shuffle=shuffle)
        return pipe
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
