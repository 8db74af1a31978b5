"""The timed buffer: a prefetch whose consumer waits at most ``timeout`` seconds for each item.

:class:`TimedBuffer` is the stage :class:`~datapipes.loader.DataLoader` puts in its pipe when
``timeout`` is set (SPDL spelling: the final buffer; torch spelling: a small buffer before
``pin_memory``).
"""

from __future__ import annotations

from typing import Any, Iterator

from .._runtime import passes as _pass
from .._engine import StageStats
from .._engine.background import background_iter
from ..datapipe import IterDataPipe, source_len
from ..graph import stage_label

__all__ = ["TimedBuffer"]


def _timed_buffer(stage: TimedBuffer) -> Iterator[Any]:
    label = stage_label(stage)
    stats = _pass.stats_for(stage, lambda: StageStats(label, "prefetch", 1, stage.buffer_size))
    source, timeout = stage.source_datapipe, stage.timeout
    it = iter(source)  # created here, as part of the pass; pulled on the buffer's thread

    def late(n: int) -> TimeoutError:
        return TimeoutError(
            f"{stage.owner}: batch {n} did not arrive within timeout={timeout} s; the pipe upstream "
            f"({source!r}) is stuck or slower than that. Raise timeout, or find the slow stage with "
            f"datapipes.profile(loader.pipe)"
        )

    return background_iter(lambda: it, stage.buffer_size, label, stats, timeout=timeout, on_timeout=late)


class TimedBuffer(IterDataPipe[Any]):
    """A stage of the pipe :class:`DataLoader` builds when ``timeout`` is set: the upstream runs on a
    background thread, up to ``buffer_size`` items ahead (as :class:`~datapipes.iter.Prefetcher`),
    and the consumer waits at most ``timeout`` seconds for each item, then raises a ``TimeoutError``
    naming ``owner``. ``len()`` is the upstream's."""

    _repr_fields = ("buffer_size", "timeout")

    def __init__(self, source_datapipe: IterDataPipe[Any], buffer_size: int, timeout: float, owner: str) -> None:
        self.source_datapipe = source_datapipe
        self.buffer_size = buffer_size
        self.timeout = timeout
        self.owner = owner

    def __iter__(self) -> Iterator[Any]:
        return _timed_buffer(self)

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")
