"""``profile(pipe, num_items=...)``: run a pipe and report each concurrent stage's figures and the bottleneck.

Every concurrent stage (concurrent ``map``, ``prefetch``) keeps :class:`~datapipes._engine.StageStats` of
its last pass. :func:`profile` runs the pipe for ``num_items`` items, collects the figures of the
stages that ran, prints a table and names the bottleneck:

- if the thread reading the pipe spends most of its time (>= 50%) neither waiting for the last
  concurrent stage nor pulling its source, the code consuming the pipe is the limit (``consumer``);
- otherwise, walking upstream from the last concurrent stage, the first stage whose workers are busy
  most of the time (busy fraction >= 50%) limits the pipe. The advice depends on what the process's
  CPU time says: if the process kept (nearly) every CPU busy, the pipe is CPU-bound and more
  ``concurrency`` cannot help; if a thread stage's workers were busy but the process used about one
  CPU, ``fn`` holds the GIL (use ``executor="process"``); otherwise raise its ``concurrency``. A thread
  stage whose workers *together* were busy most of the time while the process used about one CPU of
  several counts as GIL-bound even if each worker alone was busy less than half the time (threads
  taking turns on the GIL show each of n workers busy about 1/n of the time);
- otherwise, if the first concurrent stage spends most of its time pulling its source, the serial
  stages feeding it are the limit (``serial stages``).

>>> from datapipes.iter import IterableWrapper
>>> from datapipes.profiling import profile
>>> report = profile(IterableWrapper(range(100)).map(abs, concurrency=2).prefetch(4), show=False)
>>> report.items, [row["stage"] for row in report.stages]
(100, ['Mapper(abs)', 'Prefetcher(4)'])
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

from .graph import stages as _stages

__all__ = ["ProfileReport", "profile"]

_SATURATED = 0.5
_BACKED_UP = 0.5
_CPU_BOUND = 0.85  # share of the machine's CPUs the process used for the pipe to count as CPU-bound


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass
class ProfileReport:
    """What :func:`profile` measured.

    Attributes:
        items: items the pipe yielded.
        seconds: wall time of the run.
        items_per_s: the pipe's output rate.
        stages: one dict per concurrent stage that ran, in data-flow order (keys: ``stage``, ``kind``,
            ``workers``, ``items_in``, ``items_out``, ``failures``, ``seconds``, ``items_per_s``,
            ``busy_s``, ``busy_fraction``, ``queue_fill``).
        bottleneck: the label of the limiting stage, or ``"consumer"`` or ``"serial stages"``.
        reason: one sentence saying why.
        cpu_cores: CPU seconds this process used per wall second (all its threads; worker
            processes of ``executor="process"`` stages are not counted).
        cpus: CPUs the process may run on.
    """

    items: int
    seconds: float
    items_per_s: float
    stages: list[dict[str, Any]] = field(default_factory=list)
    bottleneck: str = ""
    reason: str = ""
    cpu_cores: float = 0.0
    cpus: int = 1

    def table(self) -> str:
        """The report as a text table."""
        head = f"{'stage':<32} {'kind':<9} {'workers':>7} {'items':>8} {'items/s':>10} {'busy':>6} {'queue fill':>10}"
        lines = [head, "-" * len(head)]
        for r in self.stages:
            lines.append(
                f"{r['stage'][:32]:<32} {r['kind']:<9} {r['workers']:>7} {r['items_out']:>8} "
                f"{r['items_per_s']:>10.1f} {r['busy_fraction']:>6.0%} {r['queue_fill']:>10.0%}"
            )
        lines.append(f"{'(pipe output)':<32} {'':<9} {'':>7} {self.items:>8} {self.items_per_s:>10.1f}")
        lines.append(f"process CPU: {self.cpu_cores:.2f} of {self.cpus} CPUs")
        lines.append(f"bottleneck: {self.bottleneck}: {self.reason}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _frac(seconds: float, row: dict[str, Any]) -> float:
    return seconds / row["seconds"] if row["seconds"] > 0 else 0.0


def _gil_bound(row: dict[str, Any], cpu_cores: float, cpus: int) -> bool:
    """A thread stage whose workers together were in ``fn`` most of the time while the whole process
    used about one CPU of several: Python code in ``fn`` holds the GIL and the threads take turns.

    The workers' summed busy time is the test, not each one's share: a ``fn`` shorter than the 5 ms
    switch interval runs to its end once it has the GIL, so each of n workers shows busy only about
    1/n of the time though the stage is the limit.
    """
    return (
        row["kind"] in ("thread", "executor")
        and cpus >= 2
        and row["workers"] >= 2
        and 0.75 <= cpu_cores < 1.25
        and row["busy_fraction"] * row["workers"] >= _SATURATED
        and _frac(row["source_s"], row) < _SATURATED
    )


def _saturated_advice(row: dict[str, Any], cpu_cores: float, cpus: int) -> str:
    busy = f"its workers were busy {row['busy_fraction']:.0%} of the time"
    if row["kind"] == "process":
        return f"{busy}; raise its concurrency (up to the number of CPUs, {cpus}) or speed up its fn"
    if cpu_cores >= _CPU_BOUND * cpus:
        return (
            f"{busy} and the process kept {cpu_cores:.1f} of {cpus} CPUs busy: the pipe is CPU-bound, so more "
            "concurrency will not help; make fn cheaper, or spread the work over more machines"
        )
    if _gil_bound(row, cpu_cores, cpus):
        return (
            f"{busy} but the process used only {cpu_cores:.1f} of {cpus} CPUs: fn most likely holds the GIL, so "
            "threads take turns; use executor=\"process\" (or a function that releases the GIL)"
        )
    return f"{busy}; raise its concurrency or speed up its fn"


def _diagnose(rows: list[dict[str, Any]], cpu_cores: float = 0.0, cpus: int = 1) -> tuple[str, str]:
    if not rows:
        return "serial stages", "the pipe has no concurrent stage: every stage runs on the consumer's thread"
    last = rows[-1]
    # Time of the thread reading the last stage: waiting for it, pulling its source (a concurrent map
    # pulls on that thread), and the rest, which is the consumer's own work.
    own = last["wait_s"] + (last["source_s"] if last["kind"] != "prefetch" else 0.0)
    consumer = 1.0 - _frac(own, last)
    if consumer >= _BACKED_UP:
        return "consumer", (
            f"the work after {last['stage']} on the consumer's thread (serial stages downstream of it, or the "
            f"code reading the pipe) took {consumer:.0%} of the time while its results were ready"
        )
    for row in reversed(rows):
        if row["kind"] != "prefetch" and (row["busy_fraction"] >= _SATURATED or _gil_bound(row, cpu_cores, cpus)):
            return row["stage"], _saturated_advice(row, cpu_cores, cpus)
        if _frac(row["source_s"], row) < _SATURATED:
            break
    first = rows[0]
    if _frac(first["source_s"], first) >= _SATURATED:
        return "serial stages", (
            f"{first['stage']} spent {_frac(first['source_s'], first):.0%} of the time pulling its source: the serial "
            "stages upstream of it (source, serial maps) limit the rate; make them concurrent or add a prefetch"
        )
    top = max(rows, key=lambda r: r["busy_fraction"])
    return "serial stages", (
        f"no concurrent stage was saturated (busiest: {top['stage']} at {top['busy_fraction']:.0%}): the serial "
        "stages between them limit the rate"
    )


def profile(pipe: Any, num_items: int | None = 1000, *, show: bool = True, file: IO[str] | None = None) -> ProfileReport:
    """Run ``pipe`` for ``num_items`` items (``None``: to the end) and report per-stage figures.

    Args:
        pipe: the pipe to run (one pass; the iterator is closed at the end).
        num_items: how many items to take.
        show: print the table (to ``file``, default ``sys.stdout``).
        file: where to print.

    Returns:
        A :class:`ProfileReport` with the same figures as data.
    """
    if num_items is not None and (isinstance(num_items, bool) or not isinstance(num_items, int) or num_items < 1):
        raise ValueError(f"profile: num_items must be an int >= 1 or None, got {num_items!r}")
    graph = _stages(pipe)
    t0 = time.perf_counter()
    c0 = time.process_time()
    n = 0
    it = iter(pipe)
    try:
        if num_items is None:
            for _ in it:
                n += 1
        else:
            for _ in it:
                n += 1
                if n >= num_items:
                    break
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    seconds = max(time.perf_counter() - t0, 1e-9)
    cpu_cores = (time.process_time() - c0) / seconds
    cpus = usable_cpus()
    rows = []
    for stage in graph:
        stats = getattr(stage, "stats", None)
        if stats is None or getattr(stats, "started", None) is None or stats.started < t0:
            continue
        rows.append(stats.as_dict())
    bottleneck, reason = _diagnose(rows, cpu_cores, cpus)
    report = ProfileReport(n, seconds, n / seconds, rows, bottleneck, reason, cpu_cores, cpus)
    if show:
        print(report.table(), file=file if file is not None else sys.stdout)
    return report
