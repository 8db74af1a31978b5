"""Prefetcher [prefetch]: run everything upstream on a background thread, so stages overlap."""

from __future__ import annotations

from typing import Any, Iterator, TypeVar

from .._runtime.passes import Pass
from .._checks import phrased
from .._engine import BackgroundRun, StageStats, background_iter
from ..datapipe import IterDataPipe, functional_datapipe, require_int, require_pipe, source_len, stage_label
from .device import _handover_unresumable, background_handover, handover_ops

__all__ = ["Prefetcher"]

T = TypeVar("T")


def _prefetch(pipe: Prefetcher[Any], ctx: Pass, it: Iterator[Any]) -> Iterator[Any]:
    label = stage_label(pipe)
    stats = ctx.stats_for(pipe, lambda: StageStats(label, "prefetch", 1, pipe.buffer_size))
    run = BackgroundRun(pipe.buffer_size)
    ctx.track(pipe, run)
    return background_iter(lambda: it, pipe.buffer_size, label, stats, run=run)


def _prefetch_handover(pipe: Prefetcher[Any], ctx: Pass, it: Iterator[Any]) -> Iterator[Any]:
    """Downstream of a CUDA mover: each item crosses from the producer thread's stream to the
    consumer's (an event recorded there, waited on here, its tensors marked as used here)."""
    label = stage_label(pipe)
    stats = ctx.stats_for(pipe, lambda: StageStats(label, "prefetch", 1, pipe.buffer_size))
    ctx.track(pipe, _handover_unresumable(label))
    return background_handover(pipe._crossing_ops, lambda: it, pipe.buffer_size, label, stats)  # type: ignore[arg-type]


@functional_datapipe("prefetch")
class Prefetcher(IterDataPipe[T]):
    """Run the upstream pipe on a background thread, up to ``buffer_size`` items ahead
    (functional name: ``prefetch``).

    Args:
        source_datapipe: the upstream pipe. Its iterator is created, pulled and closed on the
            background thread, so everything upstream (reading, decoding, serial maps) overlaps with
            the work downstream of the prefetch.
        buffer_size: how many items the background thread may produce ahead of the consumer.

    Yields:
        The upstream's items, in the same order.

    Raises:
        Whatever the upstream raises, as the same object, after the items before it.

    Memory bound: at most ``buffer_size`` items produced and not yet taken by the consumer, plus the
    one the background thread is producing; a slow consumer stops the upstream (backpressure). The
    thread starts at the first ``next()`` and stops when the pass is exhausted, closed (``close()``,
    ``break``), garbage collected or the consumer raises; ``close()`` waits up to 1 s for a thread
    that is inside the upstream (a daemon thread: it exits as soon as the upstream returns).
    Statistics of the most recent pass are in ``pipe.stats``.

    After ``to_cuda`` (a CUDA mover upstream, found when the pipe is built), the background thread
    first sets its CUDA device to the consumer's, and every item is handed over safely whatever
    stream the consumer uses: an event is recorded on the producer thread's current stream after the
    item is made, the consumer's current stream waits on it (no host synchronisation) and the item's
    CUDA tensors are marked as used by that stream (``record_stream``). Without a CUDA mover
    upstream none of this runs.

    ``len()`` is the upstream's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(5)).map(lambda x: x + 1).prefetch(2))
        [1, 2, 3, 4, 5]

    See also: :class:`~datapipes.iter.Mapper` with ``concurrency`` to run one function on several
    workers.
    """

    _saves = (
        "the items produced (pinned) and not yet taken (at most ``buffer_size``); ``pin_memory`` without CUDA "
        "(items pass through): nothing"
    )

    _repr_fields = ("buffer_size",)

    def __init__(self, source_datapipe: IterDataPipe[T], buffer_size: int = 10) -> None:
        require_pipe(source_datapipe, "Prefetcher", "source_datapipe")
        require_int(buffer_size, "Prefetcher", "buffer_size")
        if buffer_size <= 0:  # torchdata's words
            raise ValueError(phrased("Prefetcher", "'buffer_size' is required to be a positive integer.",
                                     buffer_size=buffer_size))
        self.source_datapipe = source_datapipe
        self.buffer_size = buffer_size
        self._crossing_ops = handover_ops(source_datapipe)

    def _open(self, ctx: Pass) -> Iterator[T]:
        it = ctx.open(self.source_datapipe)  # created here, as part of the pass; pulled on the thread
        return _prefetch(self, ctx, it) if self._crossing_ops is None else _prefetch_handover(self, ctx, it)

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")
