"""What a :class:`~datapipes.loader.DataLoader` reads, as a pipe: a map-style dataset by index, as
torch's DataLoader reads it, or any iterable wrapped.

A map-style dataset's indices are sharded (``sharding_filter``), so each worker and rank loads only
its own items; :class:`Fetch`, :class:`Collate` and :class:`Indices` are classes, so that they pickle
to the worker processes.

A batch of a map-style dataset is independent of the others, so, as with torch's DataLoader, one
whose loading or collate raises does not end the pass: :class:`Fetch` and :class:`Collate` put a
:class:`_FailedBatch` holding the exception in its place, the stages after them hand it on as it is,
and the loader raises the exception from ``next()`` and goes on with the next batch.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Iterator, cast

import numpy
import torch

from .._collate import collate
from .._runtime.worker import worker_placement
from ..datapipe import IterDataPipe, MapDataPipe, index_ordered
from ..iter import IterableWrapper
from .distributed import _WHERE
from .workers import _exported

__all__ = ["map_style", "as_pipe", "Collate", "Fetch", "Indices"]


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
        raise TypeError(f"{_WHERE}: {name} is neither a map-style dataset (__getitem__ and __len__) nor a pipe: a "
                        f"pipe must be an IterDataPipe, an iterable or an async iterable, got {kind.__name__}")
    return IterableWrapper(data)


class _FailedBatch:
    """A batch of a map-style dataset that could not be made: loading it (``__getitem__``,
    ``__getitems__``) or collating it raised. It travels down the loader's pipe in the batch's place
    (pickled from a worker process, through the buffers, ``pin_memory`` and ``to_device``, which hand
    it on as it is) and counts as a batch delivered; the loader's pass raises its exception from
    ``next()`` and goes on with the next batch, as torch's DataLoader does. Private to the loader.

    ``error``: the exception itself, in the process that raised it; ``exported``: the exception as a
    worker process sends it (``workers._exported``: pickled with its type, args and notes, which
    name the worker and hold its traceback)."""

    __slots__ = ("error", "exported")

    #: what ``to_device`` looks for to hand on an item that holds no tensor (datapipes/iter/device.py)
    _failed_batch = True

    def __init__(self, error: BaseException | None, exported: bytes | None = None) -> None:
        self.error = error
        self.exported = exported

    def exception(self) -> BaseException:
        """The exception to raise in the batch's place: the object raised, or, from a worker, its copy."""
        if self.exported is not None:
            return cast(BaseException, pickle.loads(self.exported))  # sent by this loader's own worker
        return cast(BaseException, self.error)

    def __repr__(self) -> str:
        return f"<failed batch: {type(self.error).__name__ if self.exported is None else 'from a worker'}>"


def _failed(error: Exception, note: str, workers: bool) -> _FailedBatch:
    """``error``, noted, in the place of the batch it spoiled; in a worker process (``workers``),
    exported for the main process as a failed pass's exception is."""
    error.add_note(note)
    if not workers:
        return _FailedBatch(error)
    worker, count = worker_placement()
    return _FailedBatch(None, _exported(error, worker, count))


def _shown(indices: list[Any]) -> str:
    if len(indices) <= 8:
        return repr(indices)
    return f"[{', '.join(map(repr, indices[:4]))}, ..., {', '.join(map(repr, indices[-2:]))}] ({len(indices)} indices)"


class Fetch:
    """The samples of one batch of indices of a map-style dataset, as torch's fetcher reads them
    (``batched``): ``dataset.__getitems__(indices)`` where the dataset has it, else
    ``[dataset[i] for i in indices]``; not ``batched`` (torch's ``batch_size=None``): ``dataset[index]``.

    An exception raised loading them is returned as a :class:`_FailedBatch` in their place, with a
    note naming the indices (in a worker process, ``workers``: exported as the worker sends a failed
    pass's exception): the loader raises it from ``next()`` and goes on. A class, so that it pickles
    to the worker processes."""

    __slots__ = ("dataset", "batched", "workers")

    def __init__(self, dataset: Any, batched: bool = True, workers: bool = False) -> None:
        self.dataset = dataset
        self.batched = batched
        self.workers = workers

    def __call__(self, indices: Any) -> Any:
        dataset = self.dataset
        try:
            if not self.batched:
                return dataset[indices]
            many = getattr(dataset, "__getitems__", None)
            if many is not None:
                return list(many(indices))
            return [dataset[i] for i in indices]
        except Exception as e:  # noqa: BLE001 - any failure of the user's dataset: raised in the batch's place
            what = f"indices {_shown(list(indices))}" if self.batched else f"index {indices!r}"
            return _failed(e, f"[datapipes] raised loading {what} of the map-style dataset "
                              f"({type(dataset).__name__}); the DataLoader raises it in the place of that "
                              f"batch and goes on with the next one", self.workers)


class Collate:
    """``collate_fn`` (``None``: :func:`datapipes.collate`) on each batch (or item) a :class:`Fetch`
    made: a :class:`_FailedBatch` is handed on as it is, and an exception ``collate_fn`` raises is
    returned as one (in a worker process, ``workers``: exported), as :class:`Fetch` does. Its
    ``__qualname__`` and ``__name__`` are ``collate_fn``'s, so the stage reads ``Collator(collate)``."""

    def __init__(self, collate_fn: Callable[[Any], Any] | None, workers: bool = False) -> None:
        fn = collate if collate_fn is None else collate_fn
        self.fn = fn
        self.workers = workers
        self.__qualname__ = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        self.__name__ = getattr(fn, "__name__", None) or type(fn).__name__

    def __call__(self, batch: Any) -> Any:
        if type(batch) is _FailedBatch:
            return batch
        try:
            return self.fn(batch)
        except Exception as e:  # noqa: BLE001 - any failure of the user's collate_fn: raised in the batch's place
            what = f"a batch of {len(batch)} samples" if type(batch) is list else "a sample"
            return _failed(e, f"[datapipes] raised collating {what} (collate_fn={self.__name__}); the DataLoader "
                              f"raises it in the place of that batch and goes on with the next one", self.workers)


class Indices:
    """``range(len(dataset))``, the length read at each pass (as torch's samplers read it)."""

    __slots__ = ("dataset",)

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.dataset)))

    def __len__(self) -> int:
        return len(self.dataset)
