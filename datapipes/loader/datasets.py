"""What a :class:`~datapipes.loader.DataLoader` reads, as a pipe: a map-style dataset by index, as
torch's DataLoader reads it, or any iterable wrapped.

A map-style dataset's indices are sharded (``sharding_filter``), so each worker and rank loads only
its own items; :class:`Fetch` and :class:`Indices` are classes, so that they pickle to the worker
processes.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy
import torch

from ..datapipe import IterDataPipe, MapDataPipe, index_ordered
from ..iter import IterableWrapper
from .distributed import _WHERE

__all__ = ["map_style", "as_pipe", "Fetch", "Indices"]


def map_style(data: Any) -> bool:
    """Whether ``data`` is read by index, ``data[0 .. len - 1]``, as torch's DataLoader reads a
    map-style dataset: a MapDataPipe iterated in index order, a list, a tuple, a numpy array or a
    tensor (by rows), or an object with
    ``__getitem__`` and ``__len__`` and no ``__iter__`` (torch's ``Dataset``, ``TensorDataset``;
    iterating one would go by the old sequence protocol, which runs on until ``__getitem__`` raises
    ``IndexError``: forever for a dataset that never does)."""
    if isinstance(data, MapDataPipe):
        return index_ordered(data)
    kind = type(data)
    if kind in (list, tuple) or isinstance(data, (numpy.ndarray, torch.Tensor)) and data.ndim > 0:
        return True
    return not hasattr(kind, "__iter__") and hasattr(kind, "__getitem__") and hasattr(kind, "__len__")


def as_pipe(data: Any, name: str) -> IterDataPipe[Any]:
    if isinstance(data, IterDataPipe):
        return data
    kind = type(data)
    if map_style(data):
        # read by index; the indices are sharded, so each worker and rank loads only its own items
        return IterableWrapper(Indices(data), deepcopy=False).sharding_filter().map(data.__getitem__)
    if isinstance(data, MapDataPipe):
        return data.to_iter_datapipe()  # its own order (a keyed pipe's values, a shuffle, ...)
    if not (hasattr(kind, "__iter__") or hasattr(kind, "__aiter__") or hasattr(kind, "__getitem__")):
        raise TypeError(f"{_WHERE}: {name} must be an IterDataPipe, an iterable or an async iterable, "
                        f"got {kind.__name__}")
    return IterableWrapper(data)


class Fetch:
    """The samples of a batch of indices of a map-style dataset: ``dataset.__getitems__(indices)``
    where the dataset has it (as torch's fetcher calls it), else ``[dataset[i] for i in indices]``.
    A class, so that it pickles to the worker processes."""

    __slots__ = ("dataset",)

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __call__(self, indices: list[int]) -> list[Any]:
        dataset = self.dataset
        many = getattr(dataset, "__getitems__", None)
        if many is not None:
            return list(many(indices))
        return [dataset[i] for i in indices]


class Indices:
    """``range(len(dataset))``, the length read at each pass (as torch's samplers read it)."""

    __slots__ = ("dataset",)

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.dataset)))

    def __len__(self) -> int:
        return len(self.dataset)
