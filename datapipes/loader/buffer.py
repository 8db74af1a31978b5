"""The timed buffer: a prefetch whose consumer waits at most ``timeout`` seconds for each item.

:class:`TimedBuffer` is the stage :class:`~datapipes.loader.DataLoader` puts in its pipe when
``timeout`` is set (SPDL spelling: the final buffer; torch spelling: a small buffer before
``pin_memory``). Past the timeout it raises :class:`LoaderTimeoutError`: torch's ``RuntimeError``
(with torch's ``DataLoader timed out after N seconds``) and a ``TimeoutError``.
"""

from __future__ import annotations

from typing import Any, Iterator

from .._runtime.passes import Pass
from .._engine import StageStats
from .._engine.background import background_iter
from ..datapipe import IterDataPipe, source_len
from ..graph import stage_label

__all__ = ["LoaderTimeoutError", "TimedBuffer"]


class LoaderTimeoutError(RuntimeError, TimeoutError):
    """A batch did not come within the loader's ``timeout``: a ``RuntimeError``, as torch's
    DataLoader raises (its message starts with torch's ``DataLoader timed out after N seconds``), and
    a ``TimeoutError``, as the loader raised before. ``timeout``: the seconds; ``batch``: the
    position of the late batch in the pass. Built from a message alone (``type(e)(message)``, as
    torch's loader rebuilds an error raised where it waits for a worker), both are None."""

    def __init__(self, message: str, timeout: float | None = None, batch: int | None = None) -> None:
        super().__init__(message)
        self.timeout = timeout
        self.batch = batch

    def __reduce__(self) -> Any:
        return type(self), (str(self), self.timeout, self.batch)


def _timed_buffer(stage: TimedBuffer, ctx: Pass) -> Iterator[Any]:
    label = stage_label(stage)
    stats = ctx.stats_for(stage, lambda: StageStats(label, "prefetch", 1, stage.buffer_size))
    source, timeout = stage.source_datapipe, stage.timeout
    it = ctx.open(source)  # created here, as part of the pass; pulled on the buffer's thread
    seconds = int(timeout) if float(timeout).is_integer() else timeout  # as torch says it: 5, not 5.0

    def late(n: int) -> LoaderTimeoutError:
        return LoaderTimeoutError(
            f"DataLoader timed out after {seconds} seconds ({stage.owner}: batch {n} did not arrive within "
            f"timeout={timeout} s; the pipe upstream ({source!r}) is stuck or slower than that. Raise timeout, "
            f"or find the slow stage with datapipes.profile(loader.pipe))",
            timeout, n,
        )

    return background_iter(lambda: it, stage.buffer_size, label, stats, timeout=timeout, on_timeout=late)


class TimedBuffer(IterDataPipe[Any]):
    """A stage of the pipe :class:`DataLoader` builds when ``timeout`` is set: the upstream runs on a
    background thread, up to ``buffer_size`` items ahead (as :class:`~datapipes.iter.Prefetcher`),
    and the consumer waits at most ``timeout`` seconds for each item, then raises a
    :class:`LoaderTimeoutError` (a ``RuntimeError`` and a ``TimeoutError``) naming ``owner``.
    ``len()`` is the upstream's."""

    _repr_fields = ("buffer_size", "timeout")

    def __init__(self, source_datapipe: IterDataPipe[Any], buffer_size: int, timeout: float, owner: str) -> None:
        self.source_datapipe = source_datapipe
        self.buffer_size = buffer_size
        self.timeout = timeout
        self.owner = owner

    def _open(self, ctx: Pass) -> Iterator[Any]:
        return _timed_buffer(self, ctx)

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")
