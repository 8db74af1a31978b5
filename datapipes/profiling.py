"""``profile(pipe, num_items=...)``: run a pipe and report each concurrent stage's figures and the bottleneck.

Every concurrent stage (concurrent ``map``, ``prefetch``) keeps :class:`~datapipes._engine.StageStats` of
its last pass. :func:`profile` runs the pipe for ``num_items`` items, collects the figures of the
stages that ran, prints a table and names the bottleneck:

- if the thread reading the pipe spends most of its time (>= 50%) neither waiting for the last
  concurrent stage nor pulling its source, the code consuming the pipe is the limit (``consumer``);
- otherwise, walking upstream from the last concurrent stage, the first stage whose workers are busy
  most of the time (busy fraction >= 50%) limits the pipe. The advice depends on what the process's
  CPU time and the machine's CPU use say:

  - the process kept (nearly) every CPU busy: the pipe is CPU-bound, more ``concurrency`` cannot help;
  - other processes kept the machine busy (less than half a CPU left idle, and others used half a CPU
    or more): the pipe is *CPU-starved*, and the report says how many CPUs the others took. A stage
    whose threads release the GIL (Pillow decoding) gets about one CPU of two beside a CPU hog, just
    as a GIL-bound one does on an idle machine, so no GIL verdict is given then. A thread stage whose
    workers *together* were busy most of the time is named the limit here too;
  - a thread stage's workers were busy while the process used about one CPU and the machine had idle
    CPU (half a CPU or more) that the process did not use: ``fn`` holds the GIL (use
    ``executor="process"``). A thread stage whose workers *together* were busy most of the time
    counts even if each worker alone was busy less than half the time (threads taking turns on the
    GIL show each of n workers busy about 1/n of the time). Where the machine's CPU use cannot be
    read, the advice says the GIL is one possible cause, not the cause;
  - otherwise raise its ``concurrency``;
- otherwise, if the first concurrent stage spends most of its time pulling its source, the serial
  stages feeding it are the limit (``serial stages``).

The machine's CPU use is read from Linux's ``/proc/stat`` (busy and idle time of the CPUs this
process may run on) when the run starts and ends; elsewhere it is unknown (``machine_cores`` None).

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
_IDLE = 0.5  # CPUs left idle on the machine for the process to have had room to use more


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_times(text: str, cpus: set[int] | None) -> tuple[int, int, int] | None:
    """``(busy, total, n)``: jiffies summed over the ``cpuN`` lines of ``/proc/stat`` text whose N is
    in ``cpus`` (every CPU when None), and how many lines that was; None when there is none.

    Busy is user + nice + system + irq + softirq + steal; idle + iowait is idle time (guest time is
    already counted in user).
    """
    busy = total = n = 0
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        user, nice, system, idle, iowait, irq, softirq, steal = (int(f) for f in fields[:8])
        work = user + nice + system + irq + softirq + steal
        busy += work
        total += work + idle + iowait
        n += 1
    return (busy, total, n) if n else None


def _read_proc_stat() -> tuple[int, int, int] | None:
    """The machine's CPU times now (:func:`_cpu_times` of ``/proc/stat``), or None where unreadable."""
    try:
        with open("/proc/stat") as f:
            text = f.read()
        try:
            cpus: set[int] | None = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            cpus = None
        return _cpu_times(text, cpus)
    except (OSError, ValueError):
        return None


def _machine_cores(start: tuple[int, int, int] | None, end: tuple[int, int, int] | None) -> float | None:
    """CPUs kept busy by every process between two :func:`_read_proc_stat` readings, or None."""
    if start is None or end is None or start[2] != end[2] or end[1] <= start[1]:
        return None
    return (end[0] - start[0]) / (end[1] - start[1]) * end[2]


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
        machine_cores: CPUs kept busy by all processes together during the run, on the CPUs this
            process may run on (from ``/proc/stat``); None where it cannot be read.
    """

    items: int
    seconds: float
    items_per_s: float
    stages: list[dict[str, Any]] = field(default_factory=list)
    bottleneck: str = ""
    reason: str = ""
    cpu_cores: float = 0.0
    cpus: int = 1
    machine_cores: float | None = None

    @property
    def other_cores(self) -> float | None:
        """CPUs kept busy by other processes during the run (None where unknown)."""
        return None if self.machine_cores is None else max(self.machine_cores - self.cpu_cores, 0.0)

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
        if self.machine_cores is None:
            machine = "all processes: unknown"
        else:
            machine = f"all processes: {self.machine_cores:.2f} (others {self.other_cores:.2f})"
        lines.append(f"process CPU: {self.cpu_cores:.2f} of {self.cpus} CPUs; {machine}")
        lines.append(f"bottleneck: {self.bottleneck}: {self.reason}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _frac(seconds: float, row: dict[str, Any]) -> float:
    return seconds / row["seconds"] if row["seconds"] > 0 else 0.0


def _taking_turns(row: dict[str, Any]) -> bool:
    """A thread stage whose workers *together* were in ``fn`` most of the time (not pulling its source).

    The workers' summed busy time is the test, not each one's share: a ``fn`` shorter than the 5 ms
    switch interval runs to its end once it has the GIL, so each of n workers shows busy only about
    1/n of the time though the stage is the limit.
    """
    return (
        row["kind"] in ("thread", "executor")
        and row["workers"] >= 2
        and row["busy_fraction"] * row["workers"] >= _SATURATED
        and _frac(row["source_s"], row) < _SATURATED
    )


def _on_one_cpu(row: dict[str, Any], cpu_cores: float, cpus: int) -> bool:
    """:func:`_taking_turns` while the whole process used about one CPU of several: the threads take
    turns, on the GIL or on a CPU that other processes leave them (see :func:`_gil_bound`)."""
    return cpus >= 2 and 0.75 <= cpu_cores < 1.25 and _taking_turns(row)


def _starved(cpu_cores: float, cpus: int, machine_cores: float) -> bool:
    """Other processes kept the machine busy: under half a CPU idle, and half a CPU or more theirs."""
    return cpus - machine_cores < _IDLE and machine_cores - cpu_cores >= _IDLE


def _gil_bound(row: dict[str, Any], cpu_cores: float, cpus: int, machine_cores: float) -> bool:
    """:func:`_on_one_cpu`, and the machine had idle CPU (half a CPU or more) that the process did not
    use: its threads could not run though a CPU was free, so ``fn`` holds the GIL.

    Without the idle CPU the same figures come from a machine saturated by other processes (a
    GIL-free decode on two threads beside a CPU hog gets about one CPU of two), so no verdict.
    """
    return _on_one_cpu(row, cpu_cores, cpus) and cpus - machine_cores >= _IDLE


def _saturated_advice(row: dict[str, Any], cpu_cores: float, cpus: int, machine_cores: float | None) -> str:
    busy = f"its workers were busy {row['busy_fraction']:.0%} of the time"
    if row["kind"] == "process":
        return f"{busy}; raise its concurrency (up to the number of CPUs, {cpus}) or speed up its fn"
    if cpu_cores >= _CPU_BOUND * cpus:
        return (
            f"{busy} and the process kept {cpu_cores:.1f} of {cpus} CPUs busy: the pipe is CPU-bound, so more "
            "concurrency will not help; make fn cheaper, or spread the work over more machines"
        )
    if machine_cores is not None and _starved(cpu_cores, cpus, machine_cores):
        return (
            f"{busy} but the process got only {cpu_cores:.1f} of {cpus} CPUs. CPU-starved: other processes used "
            f"{machine_cores - cpu_cores:.1f} of {cpus} CPUs, leaving none idle, so more concurrency will not help "
            "while they run; profile again on a quieter machine to see what limits the stage itself"
        )
    if machine_cores is not None and _gil_bound(row, cpu_cores, cpus, machine_cores):
        return (
            f"{busy} but the process used only {cpu_cores:.1f} of {cpus} CPUs while {cpus - machine_cores:.1f} stayed "
            "idle: fn most likely holds the GIL, so threads take turns; use executor=\"process\" (or a function "
            "that releases the GIL)"
        )
    if machine_cores is None and _on_one_cpu(row, cpu_cores, cpus):
        return (
            f"{busy} but the process used only {cpu_cores:.1f} of {cpus} CPUs: fn may hold the GIL (then use "
            "executor=\"process\"), or other processes took the CPUs; this machine's CPU use could not be read "
            "to tell which"
        )
    return f"{busy}; raise its concurrency or speed up its fn"


def _diagnose(
    rows: list[dict[str, Any]], cpu_cores: float = 0.0, cpus: int = 1, machine_cores: float | None = None
) -> tuple[str, str]:
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
        if row["kind"] != "prefetch" and (
            row["busy_fraction"] >= _SATURATED
            or _on_one_cpu(row, cpu_cores, cpus)
            or (machine_cores is not None and _starved(cpu_cores, cpus, machine_cores) and _taking_turns(row))
        ):
            return row["stage"], _saturated_advice(row, cpu_cores, cpus, machine_cores)
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
    m0 = _read_proc_stat()
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
    machine_cores = _machine_cores(m0, _read_proc_stat())
    cpus = usable_cpus()
    rows = []
    for stage in graph:
        stats = getattr(stage, "stats", None)
        if stats is None or getattr(stats, "started", None) is None or stats.started < t0:
            continue
        rows.append(stats.as_dict())
    bottleneck, reason = _diagnose(rows, cpu_cores, cpus, machine_cores)
    report = ProfileReport(n, seconds, n / seconds, rows, bottleneck, reason, cpu_cores, cpus, machine_cores)
    if show:
        print(report.table(), file=file if file is not None else sys.stdout)
    return report
