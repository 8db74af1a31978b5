"""SPDL's spelling of the loader (``DataLoader(src, preprocessor=..., aggregator=...,
transfer_fn=..., buffer_size=..., num_threads=..., output_order=...)``), translated into torch's:
:func:`from_spdl` turns the SPDL keywords into a pipe (``preprocessor`` as a concurrent map, a
flatmap for a generator function, the batches, ``aggregator`` as a concurrent map, ``transfer_fn``
as a serial map) and the keywords of the loader's torch spelling (``buffer_size`` its final buffer),
so :class:`~datapipes.loader.DataLoader` builds one spelling (docs/howto/dataloader.rst).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .._checks import require_callable, require_int
from .._engine import is_async_callable, is_async_gen_callable
from ..datapipe import IterDataPipe
from .arguments import check_shared, data_of
from .datasets import as_pipe
from .distributed import _WHERE

__all__ = ["SPDL_ONLY", "SPDL_BUFFER_SIZE", "SPDL_NUM_THREADS", "SPDL_OUTPUT_ORDER", "TORCH_ONLY", "Translation",
           "from_spdl", "is_spdl_call", "spdl_stages"]

#: Arguments only the SPDL spelling takes (in signature order).
SPDL_ONLY = ("src", "preprocessor", "aggregator", "transfer_fn", "buffer_size", "num_threads", "output_order")

#: Arguments only the torch spelling takes (in signature order).
TORCH_ONLY = ("shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn", "pin_memory", "worker_init_fn",
              "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers", "pin_memory_device",
              "in_order", "snapshot_every_n_steps", "device")

#: SPDL's defaults where the loader's signature says None (so a call can tell what was given).
SPDL_BUFFER_SIZE = 3
SPDL_NUM_THREADS = 8
SPDL_OUTPUT_ORDER = "input"  # SPDL's is "completion"; ours is deterministic


def is_spdl_call(given: dict[str, Any]) -> bool:
    """Whether a call of the loader (its arguments by name) is in SPDL's spelling: an SPDL-only
    argument is given. ``TypeError`` where a torch-only one is given too (other than at its default)."""
    torch_args = [n for n in TORCH_ONLY if _is_set(n, given[n])]
    spdl_args = [n for n in SPDL_ONLY if given[n] is not None]
    if torch_args and spdl_args:
        raise TypeError(
            f"{_WHERE}: cannot mix the SPDL spelling ({', '.join(a + '=' for a in spdl_args)}) with torch-style "
            f"arguments ({', '.join(a + '=' for a in torch_args)}); SPDL's aggregator= takes the place of "
            f"collate_fn=, transfer_fn= of pin_memory=/device=, num_threads= of num_workers="
        )
    return bool(spdl_args)


def _is_set(name: str, value: Any) -> bool:
    """Whether a torch-only argument was given a value other than its default."""
    if name in ("pin_memory", "persistent_workers"):
        return value is not False
    if name == "num_workers":
        return isinstance(value, bool) or value != 0
    if name == "pin_memory_device":
        return bool(value != "")
    if name == "in_order":
        return value is not True
    if name == "snapshot_every_n_steps":
        return isinstance(value, bool) or bool(value != 1)
    return value is not None


@dataclass(frozen=True)
class Translation:
    """An SPDL call in torch's spelling: ``DataLoader._torch_spelling(pipe, **torch)`` builds it.
    The other fields are what the loader records of the SPDL call (its attributes of those names;
    ``source``, its ``datapipe``; ``data``, its ``dataset``: the object given): the batches are in
    ``pipe``, so torch's ``batch_size`` is None."""

    pipe: IterDataPipe[Any]
    torch: dict[str, Any]
    source: IterDataPipe[Any]
    batch_size: int | None
    drop_last: bool
    buffer_size: int
    num_threads: int
    output_order: str
    data: Any = None


def from_spdl(pipe: Any = None, batch_size: int | None = None, *, drop_last: bool = False, seed: int | None = None,
              even_batches: str | None = None, timeout: float | None = None,
              report_stats_interval: float | None = None, max_threads: int | None = None,
              max_memory: int | None = None, src: Any = None, preprocessor: Any = None, aggregator: Any = None,
              transfer_fn: Any = None, buffer_size: int | None = None, num_threads: int | None = None,
              output_order: str | None = None, dataset: Any = None) -> Translation:
    """The SPDL spelling of ``DataLoader`` (its arguments, ``None`` for SPDL's defaults) in torch's:

    - ``src`` (or ``pipe``, or ``dataset``): the data, read as torch's spelling reads it;
    - ``preprocessor``, ``batch_size``/``drop_last``, ``aggregator``, ``transfer_fn``: stages of the
      pipe (:func:`spdl_stages`); its batches stay lists, so torch's ``batch_size`` is None and
      nothing is collated;
    - ``num_threads``: the concurrency of the preprocessor and aggregator stages;
    - ``output_order``: whether those stages keep the input order;
    - ``buffer_size``: torch's ``buffer``, the batches buffered ahead of the consumer (a timed buffer
      with ``timeout``);
    - ``seed``, ``even_batches``, ``timeout``, ``report_stats_interval``, ``max_threads``,
      ``max_memory``: the same keywords.

    Raises:
        TypeError / ValueError: bad arguments, checked in the loader's order with its messages.
    """
    data, name = data_of({"dataset": dataset, "pipe": pipe, "src": src})
    drop, seconds = check_shared(batch_size, drop_last, seed, even_batches, timeout)
    source = as_pipe(data, name)
    require_callable(preprocessor, _WHERE, "preprocessor", optional=True)
    require_callable(aggregator, _WHERE, "aggregator", optional=True)
    require_callable(transfer_fn, _WHERE, "transfer_fn", optional=True)
    buffer_size = SPDL_BUFFER_SIZE if buffer_size is None else buffer_size
    require_int(buffer_size, _WHERE, "buffer_size", minimum=1)
    num_threads = SPDL_NUM_THREADS if num_threads is None else num_threads
    require_int(num_threads, _WHERE, "num_threads", minimum=1)
    output_order = SPDL_OUTPUT_ORDER if output_order is None else output_order
    if output_order not in ("input", "completion"):
        raise ValueError(f"{_WHERE}: output_order must be 'input' or 'completion', got {output_order!r}")
    stages = spdl_stages(source, preprocessor, batch_size, drop, aggregator, transfer_fn, num_threads,
                         output_order == "input")
    torch = {"batch_size": None, "seed": seed, "even_batches": even_batches, "timeout": seconds,
             "report_stats_interval": report_stats_interval, "max_threads": max_threads, "max_memory": max_memory,
             "buffer": buffer_size}
    return Translation(stages, torch, source, batch_size, drop, buffer_size, num_threads, output_order, data)


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
