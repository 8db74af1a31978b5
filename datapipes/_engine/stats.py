"""Statistics of one pass of a stage: items in and out, failures, time, queue fill — readable live.

Each concurrent stage (concurrent ``map``/``flatmap``, ``prefetch``) creates a :class:`StageStats` at
the start of a pass, owned by the pass (``it.stats()``) and shown as ``pipe.stats`` until the stage's
next pass. Its figures are live: item counts are read from the stage's run while the pass goes on
(the loop's own position records, so the hot loop writes nothing extra for them), times and fill
samples are accumulated as the loop goes, and busy time is summed from per-worker slots that only
their own worker writes. In an *observed* pass (a hook attached, or ``profile``) every serial stage
gets one too, kind ``"serial"``, kept by the observer that wraps its iterator.
"""

from __future__ import annotations

import time
from typing import Any, Callable

__all__ = ["StageStats"]


class StageStats:
    """Figures of one pass of a stage, live while the pass runs.

    Attributes:
        label: the stage's label, e.g. ``Mapper(decode)``.
        kind: ``"thread"``, ``"async"``, ``"process"``, ``"executor"``, ``"inline"`` (a concurrent
            stage left no thread by its pass's thread budget), ``"prefetch"`` or ``"serial"``.
        workers: how many workers run ``fn`` at once now (the stage's ``concurrency``, or the value
            chosen by the autotuner; 1 for prefetch and serial stages). ``concurrency`` is the same.
        auto: the stage's concurrency is tuned online (``concurrency="auto"``).
        capacity: the size of the bounded window or buffer whose fill is sampled.
        items_in: items pulled from the source.
        items_out: items handed to the consumer.
        failures: items whose ``fn`` raised (skipped or raised).
        busy_s: seconds spent inside ``fn`` (or, for prefetch, inside the upstream), summed over workers.
        self_s: seconds the consumer's thread spent in the stage itself, its upstream excluded (an
            observed pass measures it for every stage; otherwise 0).
        source_s: seconds spent pulling the source (on the consumer's thread for a concurrent map, on
            the producer thread for prefetch).
        wait_s: seconds the consumer spent blocked waiting for a result of this stage.
        fill_sum, fill_samples: the sum and number of samples of ready results waiting for the consumer,
            one sample each time the consumer takes an item.
        started, stopped: ``time.perf_counter()`` at the pass's first ``next()`` and at its end.
        tuning: the autotuner's last decision, in words (``""`` for a stage that is not tuned).
        tokens: token ids handed out, for a stage that yields them (``tokenize``, which counts each
            batch as it arrives); 0 for every other stage.
    """

    __slots__ = (
        "label", "kind", "workers", "capacity", "_in", "_out", "_fail", "busy_s",
        "fill_sum", "fill_samples", "started", "stopped", "source_s", "wait_s", "_busy", "_live",
        "self_s", "auto", "tuning", "tokens", "shares_of", "_shares", "__weakref__",
    )

    def __init__(self, label: str, kind: str, workers: int, capacity: int, auto: bool = False) -> None:
        self.label = label
        self.kind = kind
        self.workers = workers
        self.capacity = capacity
        self.auto = auto
        self.tuning = ""
        self.tokens = 0
        #: a stage that mixes sources: a callable reading its shares (``shares``), set by the pass
        self.shares_of: Callable[[], dict[str, dict[str, float]] | None] | None = None
        self._shares: dict[str, dict[str, float]] | None = None  # as read when pickled
        self._in = 0
        self._out = 0
        self._fail = 0
        self.busy_s = 0.0
        self.self_s = 0.0
        self.fill_sum = 0
        self.fill_samples = 0
        self.source_s = 0.0
        self.wait_s = 0.0
        self.started: float | None = None
        self.stopped: float | None = None
        self._busy: list[float] = []
        self._live: Any = None

    def begin(self, busy_slots: list[float], live: Any = None) -> None:
        """Mark the pass as started; ``busy_slots`` are the per-worker busy-time accumulators and
        ``live`` (optional) a callable returning ``(items_in, items_out, failures)`` so far."""
        self.started = time.perf_counter()
        self._busy = busy_slots
        self._live = live

    def finish(self, items_in: int, items_out: int, failures: int, fill_sum: int, fill_samples: int,
               source_s: float = 0.0, wait_s: float = 0.0) -> None:
        """Publish the loop's counters at the end of the pass (idempotent: the first call wins)."""
        if self.stopped is not None:
            return
        self.source_s = source_s
        self.wait_s = wait_s
        self.stopped = time.perf_counter()
        self._in = items_in
        self._out = items_out
        self._fail = failures
        self._live = None
        self.fill_sum = fill_sum
        self.fill_samples = fill_samples
        self.busy_s = sum(self._busy)

    def end(self) -> None:
        """Mark the pass of a stage that publishes its counters as it goes (serial) as ended."""
        if self.stopped is None:
            self.stopped = time.perf_counter()
            if self.started is None:
                self.started = self.stopped

    def _counts(self) -> tuple[int, int, int]:
        live = self._live
        if live is not None and self.stopped is None:
            try:
                return live()  # type: ignore[no-any-return]
            except (RuntimeError, KeyError, IndexError):  # read while the loop changes it: the last figures
                pass
        return self._in, self._out, self._fail

    @property
    def items_in(self) -> int:
        return self._counts()[0]

    @items_in.setter
    def items_in(self, value: int) -> None:
        self._in = value

    @property
    def items_out(self) -> int:
        return self._counts()[1]

    @items_out.setter
    def items_out(self, value: int) -> None:
        self._out = value

    @property
    def failures(self) -> int:
        return self._counts()[2]

    @failures.setter
    def failures(self, value: int) -> None:
        self._fail = value

    @property
    def concurrency(self) -> int:
        """The number of workers now (``workers``)."""
        return self.workers

    @property
    def running(self) -> bool:
        """The pass has started and not ended."""
        return self.started is not None and self.stopped is None

    @property
    def elapsed(self) -> float:
        """Seconds from the first ``next()`` to the end of the pass (or to now while it runs)."""
        if self.started is None:
            return 0.0
        end = self.stopped if self.stopped is not None else time.perf_counter()
        return max(end - self.started, 1e-9)

    def busy(self) -> float:
        """Seconds spent inside ``fn`` so far, summed over workers (live)."""
        return self.busy_s if self.stopped is not None else sum(self._busy)

    @property
    def busy_fraction(self) -> float:
        """Busy time over (elapsed time x workers): 1.0 means every worker was always in ``fn``."""
        return min(1.0, self.busy() / (self.elapsed * max(1, self.workers))) if self.started is not None else 0.0

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

    @property
    def tokens_per_s(self) -> float:
        """``tokens`` per second of the pass (0 for a stage that counts none)."""
        return self.tokens / self.elapsed if self.started is not None else 0.0

    @property
    def shares(self) -> dict[str, dict[str, float]] | None:
        """For a stage that mixes sources (``Mixer``), each source's realised share beside its
        target, read live (:attr:`Mixer.shares <datapipes.iter.Mixer.shares>`'s dict); else None."""
        fn = self.shares_of
        return fn() if fn is not None else self._shares

    def as_dict(self) -> dict[str, Any]:
        """The figures as a plain dict (a consistent reading: the counts are read once)."""
        items_in, items_out, failures = self._counts()
        elapsed = self.elapsed
        return {
            "stage": self.label,
            "kind": self.kind,
            "workers": self.workers,
            "concurrency": self.workers,
            "auto": self.auto,
            "items_in": items_in,
            "items_out": items_out,
            "failures": failures,
            "seconds": elapsed,
            "items_per_s": items_out / elapsed if self.started is not None else 0.0,
            "busy_s": self.busy(),
            "busy_fraction": self.busy_fraction,
            "self_s": self.self_s,
            "queue_fill": self.queue_fill,
            "source_s": self.source_s,
            "wait_s": self.wait_s,
            "tuning": self.tuning,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens / elapsed if self.started is not None else 0.0,
            "shares": self.shares,
        }

    def __repr__(self) -> str:
        tokens = f", {self.tokens} tokens" if self.tokens else ""
        return (
            f"StageStats({self.label}: {self.items_out} out{tokens}, {self.failures} failed, "
            f"busy {self.busy_fraction:.0%}, fill {self.queue_fill:.0%})"
        )

    # Plain data: pickles as it is, with the live figures folded in.
    def __getstate__(self) -> dict[str, Any]:
        state = {k: getattr(self, k) for k in self.__slots__
                 if k not in ("_busy", "_live", "shares_of", "_shares", "__weakref__")}
        state["_shares"] = self.shares
        state["_in"], state["_out"], state["_fail"] = self._counts()
        state["busy_s"] = self.busy()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.self_s = 0.0
        self.auto = False
        self.tuning = ""
        self.tokens = 0
        self.shares_of = None
        self._shares = None
        for k, v in state.items():
            setattr(self, k, v)
        self._busy = []
        self._live = None
