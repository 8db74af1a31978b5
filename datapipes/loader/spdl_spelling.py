"""SPDL's spelling of the loader's stages (``DataLoader(src, preprocessor=..., aggregator=...,
transfer_fn=..., buffer_size=..., num_threads=..., output_order=...)``), translated into pipes:
``preprocessor`` as a concurrent map (a flatmap for a generator function), the batches, the
``aggregator`` as a concurrent map, the ``transfer_fn`` as a serial map. The loader then buffers
them (:class:`~datapipes.loader.DataLoader`, docs/howto/dataloader.rst).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable

from .._engine import is_async_callable, is_async_gen_callable
from ..datapipe import IterDataPipe

__all__ = ["SPDL_ONLY", "SPDL_BUFFER_SIZE", "SPDL_NUM_THREADS", "SPDL_OUTPUT_ORDER", "spdl_stages"]

#: Arguments only the SPDL spelling takes (in signature order).
SPDL_ONLY = ("src", "preprocessor", "aggregator", "transfer_fn", "buffer_size", "num_threads", "output_order")

#: SPDL's defaults where the loader's signature says None (so a call can tell what was given).
SPDL_BUFFER_SIZE = 3
SPDL_NUM_THREADS = 8
SPDL_OUTPUT_ORDER = "input"  # SPDL's is "completion"; ours is deterministic


def spdl_stages(pipe: IterDataPipe[Any], preprocessor: Any, batch_size: int | None, drop_last: bool,
                aggregator: Any, transfer_fn: Any, num_threads: int, ordered: bool) -> IterDataPipe[Any]:
    """``pipe`` through SPDL's stages: ``preprocessor`` on ``num_threads`` workers, ``batch_size``
    lists, ``aggregator`` on ``num_threads`` workers, then ``transfer_fn`` one batch at a time (it
    runs on the buffer's one background thread: device copies are never concurrent)."""
    if preprocessor is not None:
        pipe = _preprocess(pipe, preprocessor, num_threads, ordered)
    if batch_size is not None:
        pipe = pipe.batch(batch_size, drop_last=drop_last)
    if aggregator is not None:
        pipe = pipe.map(aggregator, concurrency=num_threads, ordered=ordered)
    if transfer_fn is not None:
        pipe = pipe.map(transfer_fn)
    return pipe


class _Gathered:
    """``fn`` (a generator function) run to the end on one item: ``list(fn(x))``, so a concurrent map
    can run generators on threads and a flatmap can flatten their lists."""

    def __init__(self, fn: Callable[[Any], Iterable[Any]]) -> None:
        self.fn = fn
        self.__qualname__ = getattr(fn, "__qualname__", type(fn).__name__)

    def __call__(self, x: Any) -> list[Any]:
        return list(self.fn(x))


class _AsyncGathered:
    """``fn`` (an async generator function) run to the end on one item, as a coroutine."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.__qualname__ = getattr(fn, "__qualname__", type(fn).__name__)

    async def __call__(self, x: Any) -> list[Any]:
        return [y async for y in self.fn(x)]


def _is_gen_callable(fn: Any) -> bool:
    return inspect.isgeneratorfunction(fn) or inspect.isgeneratorfunction(getattr(fn, "__call__", None))


def _preprocess(pipe: IterDataPipe[Any], fn: Any, num_threads: int, ordered: bool) -> IterDataPipe[Any]:
    """The SPDL preprocessor stage: a concurrent map, or a flatmap for a (async) generator function."""
    if is_async_gen_callable(fn):
        if num_threads == 1:
            return pipe.flatmap(fn)
        return pipe.map(_AsyncGathered(fn), concurrency=num_threads, ordered=ordered).flatmap()
    if _is_gen_callable(fn):
        if num_threads == 1:
            return pipe.flatmap(fn)
        return pipe.map(_Gathered(fn), concurrency=num_threads, ordered=ordered).flatmap()
    if is_async_callable(fn) or num_threads > 1:
        return pipe.map(fn, concurrency=num_threads, ordered=ordered)
    return pipe.map(fn)
