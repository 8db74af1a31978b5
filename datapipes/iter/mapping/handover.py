"""The CUDA stream hand-over of a concurrent ``map`` downstream of ``to_cuda``/``to_device``: each
item crosses to a worker thread (or the event loop) with an event recorded on the consumer's stream,
and each result comes back with an event recorded on the worker's (:mod:`datapipes.iter.device`
holds the stream operations, :mod:`.map` the stage that uses these)."""

from __future__ import annotations

import threading
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Iterable, Iterator

from ..._engine import close_iterator
from ...datapipe import stage_label
from ..device import StreamOps, cuda_upstream

__all__: list[str] = []


def _tagged(source: Iterable[Any], record: Callable[[], Any]) -> Iterator[tuple[Any, Any]]:
    """``(item, event)`` for each item of ``source``, the event recorded on the consumer's thread."""
    it = iter(source)
    try:
        for x in it:
            yield x, record()
    finally:
        close_iterator(it)  # closing this pass closes the upstream's now


def _handover_fn(fn: Callable[[Any], Any], ops: StreamOps, is_async: bool) -> Callable[[Any], Any]:
    """``fn`` for a worker thread (or the event loop) receiving ``(item, event)`` pairs: its current
    stream waits on the consumer's event and marks the item as used before ``fn`` runs, and an event
    recorded after ``fn`` goes back with the result. A worker thread sets its CUDA device to the
    consumer's before its first item; the event loop thread, shared by every async stage, is left
    as it is."""
    record, wait, mark_used = ops.record, ops.wait, ops.mark_used
    if is_async:
        async def call_async(pair: tuple[Any, Any]) -> tuple[Any, Any]:
            x, event = pair
            wait(event)
            mark_used(x)
            y = await fn(x)
            return y, record()

        return call_async

    entered = threading.local()  # worker threads set their CUDA device once, before their first item

    def call(pair: tuple[Any, Any]) -> tuple[Any, Any]:
        if not getattr(entered, "done", False):
            ops.enter_thread()
            entered.done = True
        x, event = pair
        wait(event)
        mark_used(x)
        y = fn(x)
        return y, record()

    return call


def _handed_back(out: Iterator[tuple[Any, Any]], ops: Any) -> Iterator[Any]:
    """The results of a hand-over map, each waited on by the consumer's stream before it is yielded."""
    wait, mark_used = ops.wait, ops.mark_used
    try:
        for y, event in out:
            wait(event)
            mark_used(y)
            yield y
    finally:
        close_iterator(out)  # stops the workers now, also when our consumer closes us


def _check_crossing(datapipe: Any, executor: Any) -> StreamOps | None:
    """The stream hand-over a concurrent map needs: that of a CUDA mover upstream, or None."""
    mover = cuda_upstream(datapipe)
    if mover is None:
        return None
    if executor == "process" or isinstance(executor, ProcessPoolExecutor):
        raise ValueError(
            f"Mapper: executor={executor!r} cannot run downstream of {stage_label(mover)}: CUDA tensors are not "
            "sent to worker processes; put this map before to_cuda/to_device, or run it on threads "
            "(executor='thread')"
        )
    return mover._handover_ops  # type: ignore[no-any-return]
