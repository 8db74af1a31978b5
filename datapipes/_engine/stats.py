"""Statistics of one pass of a concurrent stage: items in and out, failures, busy time, queue fill.

Each concurrent stage (concurrent ``map``, ``prefetch``) creates a :class:`StageStats` at the start of a
pass and keeps it as ``pipe.stats``. Counters live in local variables of the stage's loop and are
published when the pass ends (exhausted, closed or failed), so the hot loop pays nothing for them;
busy time is summed from per-worker slots that only their own worker writes.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["StageStats"]


class StageStats:
    """Figures of one pass of a concurrent stage.

    Attributes:
        label: the stage's label, e.g. ``Mapper(decode)``.
        kind: ``"thread"``, ``"async"``, ``"process"``, ``"executor"`` or ``"prefetch"``.
        workers: how many workers ran ``fn`` at once (the stage's ``concurrency``; 1 for prefetch).
        capacity: the size of the bounded window or buffer whose fill is sampled.
        items_in: items pulled from the source.
        items_out: items handed to the consumer.
        failures: items whose ``fn`` raised (skipped or raised).
        busy_s: seconds spent inside ``fn`` (or, for prefetch, inside the upstream), summed over workers.
        source_s: seconds spent pulling the source (on the consumer's thread for a concurrent map, on
            the producer thread for prefetch).
        wait_s: seconds the consumer spent blocked waiting for a result of this stage.
        fill_sum, fill_samples: the sum and number of samples of ready results waiting for the consumer,
            one sample each time the consumer takes an item.
        started, stopped: ``time.perf_counter()`` at the pass's first ``next()`` and at its end.
    """

    __slots__ = (
        "label", "kind", "workers", "capacity", "items_in", "items_out", "failures", "busy_s",
        "fill_sum", "fill_samples", "started", "stopped", "source_s", "wait_s", "_busy",
    )

    def __init__(self, label: str, kind: str, workers: int, capacity: int) -> None:
        self.label = label
        self.kind = kind
        self.workers = workers
        self.capacity = capacity
        self.items_in = 0
        self.items_out = 0
        self.failures = 0
        self.busy_s = 0.0
        self.fill_sum = 0
        self.fill_samples = 0
        self.source_s = 0.0
        self.wait_s = 0.0
        self.started: float | None = None
        self.stopped: float | None = None
        self._busy: list[float] = []

    def begin(self, busy_slots: list[float]) -> None:
        """Mark the pass as started; ``busy_slots`` are the per-worker busy-time accumulators."""
        self.started = time.perf_counter()
        self._busy = busy_slots

    def finish(self, items_in: int, items_out: int, failures: int, fill_sum: int, fill_samples: int,
               source_s: float = 0.0, wait_s: float = 0.0) -> None:
        """Publish the loop's counters at the end of the pass (idempotent: the first call wins)."""
        if self.stopped is not None:
            return
        self.source_s = source_s
        self.wait_s = wait_s
        self.stopped = time.perf_counter()
        self.items_in = items_in
        self.items_out = items_out
        self.failures = failures
        self.fill_sum = fill_sum
        self.fill_samples = fill_samples
        self.busy_s = sum(self._busy)

    @property
    def elapsed(self) -> float:
        """Seconds from the first ``next()`` to the end of the pass (or to now while it runs)."""
        if self.started is None:
            return 0.0
        end = self.stopped if self.stopped is not None else time.perf_counter()
        return max(end - self.started, 1e-9)

    @property
    def busy_fraction(self) -> float:
        """Busy time over (elapsed time x workers): 1.0 means every worker was always in ``fn``."""
        busy = self.busy_s if self.stopped is not None else sum(self._busy)
        return min(1.0, busy / (self.elapsed * self.workers)) if self.started is not None else 0.0

    @property
    def queue_fill(self) -> float:
        """Mean ready results waiting for the consumer, as a fraction of ``capacity``.

        Near 1: the consumer (downstream) is slower than this stage. Near 0: the consumer waits.
        """
        if not self.fill_samples or not self.capacity:
            return 0.0
        return min(1.0, self.fill_sum / self.fill_samples / self.capacity)

    @property
    def items_per_s(self) -> float:
        return self.items_out / self.elapsed if self.started is not None else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The figures as a plain dict."""
        return {
            "stage": self.label,
            "kind": self.kind,
            "workers": self.workers,
            "items_in": self.items_in,
            "items_out": self.items_out,
            "failures": self.failures,
            "seconds": self.elapsed,
            "items_per_s": self.items_per_s,
            "busy_s": self.busy_s,
            "busy_fraction": self.busy_fraction,
            "queue_fill": self.queue_fill,
            "source_s": self.source_s,
            "wait_s": self.wait_s,
        }

    def __repr__(self) -> str:
        return (
            f"StageStats({self.label}: {self.items_out} out, {self.failures} failed, "
            f"busy {self.busy_fraction:.0%}, fill {self.queue_fill:.0%})"
        )

    # Plain data: pickles as it is, with the live accumulators folded in.
    def __getstate__(self) -> dict[str, Any]:
        state = {k: getattr(self, k) for k in self.__slots__ if k != "_busy"}
        if self.stopped is None:
            state["busy_s"] = sum(self._busy)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)
        self._busy = []
