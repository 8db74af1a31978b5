"""A pass's thread budget, and the online tuning of its ``concurrency="auto"`` stages.

Budget. The thread stages of a pass (concurrent ``map``/``flatmap`` on worker threads) share the
pass's ``max_threads``, the tightest set with ``set_budget`` on any stage of its graph (or by the
loader). When the pass starts, the stages with a fixed ``concurrency`` keep theirs if the sum fits
next to one thread per auto stage; otherwise each is scaled down in proportion (largest remainders
first), and a stage scaled to nothing runs its ``fn`` on the consumer's thread (kind ``"inline"``).
Auto stages then share what is left: the tuner never gives one more than the budget minus what
every other thread stage runs at that moment.

Tuning. Each auto stage of a pass is tuned by a :class:`~datapipes._engine.tune.HillClimber` from
its live statistics, every :data:`INTERVAL` seconds on the pass's tuner thread (a
:class:`~datapipes._observe.Reporter`): items completed, busy time of its workers, time the
consumer spent pulling the stage's source (*starved*: the source is the limit) and time the
workers stood idle without the stage being starved (*blocked*: downstream is the limit), whether the process kept its
CPUs saturated, and whether RSS came within 10% of ``max_memory``. A new value takes effect at once:
threads are started, or stopped as they finish their item; async stages change their number of
running tasks; the window of items in flight follows (twice the concurrency). The choice and the
reason for it are in the stage's statistics (``stats.workers``, ``stats.tuning``) and in
``profile``. The tuner thread ends with the pass.

A process stage with ``concurrency="auto"`` runs one worker per usable CPU (work sent to processes
is CPU-bound: that is the tuned optimum), without online tuning.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any

from ._engine.tune import HillClimber, Observation
from ._observe import Reporter
from .hooks import Hook

__all__ = ["AUTO", "INTERVAL", "Budget", "Tuner", "auto_maximum", "rss_bytes", "thread_demand", "usable_cpus"]

AUTO = "auto"
#: seconds between two tuning decisions
INTERVAL = 0.25
#: the most tasks an async auto stage runs (tasks are cheap; this bounds memory)
ASYNC_MAXIMUM = 1024


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def auto_maximum() -> int:
    """The most threads an auto stage takes when no budget bounds it: ``max(32, 4 x CPUs)``."""
    return max(32, 4 * usable_cpus())


def rss_bytes() -> int | None:
    """This process's resident memory, or None where it cannot be read (Linux ``/proc``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def thread_demand(stage: Any) -> int | str | None:
    """What a stage asks of the thread budget: its fixed concurrency, ``"auto"``, or None (no
    worker threads of its own: serial, async, processes, an executor the user built)."""
    demand = getattr(stage, "_thread_demand", None)
    return None if demand is None else demand()  # type: ignore[no-any-return]


class Budget:
    """The thread budget of one pass (see the module): decided when the pass starts."""

    def __init__(self, graph: list[Any], max_threads: int | None, max_memory: int | None) -> None:
        self.max_threads = max_threads
        self.max_memory = max_memory
        self.lock = threading.Lock()
        self.current: dict[int, int] = {}  # id(stage) -> threads it runs now (auto stages included)
        demands = {id(s): (s, d) for s in graph if (d := thread_demand(s)) is not None}
        fixed = {k: d for k, (_, d) in demands.items() if d != AUTO}
        autos = [k for k, (_, d) in demands.items() if d == AUTO]
        self.allotted: dict[int, int] = dict(fixed)  # type: ignore[arg-type]
        if max_threads is not None and fixed:
            room = max(0, max_threads - len(autos))
            total = sum(fixed.values())  # type: ignore[arg-type]
            if total > room:
                self.allotted = _scaled(fixed, room)  # type: ignore[arg-type]
        self.autos = set(autos)

    def threads_for(self, stage: Any, requested: int) -> int:
        """The threads fixed stage ``stage`` runs in this pass (0: inline on the consumer's thread)."""
        n = self.allotted.get(id(stage), requested)
        with self.lock:
            self.current[id(stage)] = n
        return n

    def room_for(self, stage: Any) -> int:
        """The most threads auto stage ``stage`` may run now: the budget less every other stage's."""
        maximum = auto_maximum()
        if self.max_threads is None:
            return maximum
        with self.lock:
            others = sum(n for k, n in self.current.items() if k != id(stage))
        return max(1, min(maximum, self.max_threads - others))

    def set(self, stage: Any, n: int) -> None:
        with self.lock:
            self.current[id(stage)] = n

    def release(self, stage: Any) -> None:
        """The stage's pass ended: its threads are free for the others."""
        with self.lock:
            self.current.pop(id(stage), None)


def _scaled(fixed: dict[int, int], room: int) -> dict[int, int]:
    """``fixed`` (key -> threads) scaled to ``room`` threads in all, in proportion (largest
    remainders first)."""
    total = sum(fixed.values())
    shares = {k: v * room / total for k, v in fixed.items()}
    out = {k: int(s) for k, s in shares.items()}
    left = room - sum(out.values())
    for k in sorted(shares, key=lambda k: shares[k] - out[k], reverse=True)[:left]:
        out[k] += 1
    return out


class _Entry:
    """One auto stage being tuned: what it runs on, and its readings at the last decision."""

    __slots__ = ("stage", "stats", "run", "backend", "climber", "threads", "last")

    def __init__(self, stage: Any, stats: Any, run: Any, backend: Any, climber: HillClimber, threads: bool) -> None:
        self.stage = stage
        self.stats = stats
        self.run = run
        self.backend = backend
        self.climber = climber
        self.threads = threads
        self.last: tuple[float, int, float, float, float] | None = None  # time, out, busy, source, wait


# -- the machine's CPU use (Linux /proc/stat), read by the tuner and by profile() -------------------


def cpu_times(text: str, cpus: set[int] | None) -> tuple[int, int, int] | None:
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


def read_proc_stat() -> tuple[int, int, int] | None:
    """The machine's CPU times now (:func:`cpu_times` of ``/proc/stat``), or None where unreadable."""
    try:
        with open("/proc/stat") as f:
            text = f.read()
        try:
            cpus: set[int] | None = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            cpus = None
        return cpu_times(text, cpus)
    except (OSError, ValueError):
        return None


def machine_cores(start: tuple[int, int, int] | None, end: tuple[int, int, int] | None) -> float | None:
    """CPUs kept busy by every process between two :func:`read_proc_stat` readings, or None."""
    if start is None or end is None or start[2] != end[2] or end[1] <= start[1]:
        return None
    return (end[0] - start[0]) / (end[1] - start[1]) * end[2]


#: the share of the usable CPUs busy (this process's, or the machine's) from which an interval counts
#: as CPU-saturated (Observation.cpu_saturated)
SATURATED = 0.9


class Tuner(Hook):
    """Tunes the auto stages of one pass (see the module): a periodic hook of the pass, called on
    the pass's tuner thread."""

    interval = INTERVAL

    def __init__(self, pass_: Any, budget: Budget) -> None:
        self.pass_ref = weakref.ref(pass_)
        self.budget = budget
        self.entries: list[_Entry] = []
        self.lock = threading.Lock()
        self.reporter: Reporter | None = None
        self.cpu: tuple[float, float] | None = None
        self.machine: tuple[int, int, int] | None = None  # /proc/stat at the last interval
        self.cpus = usable_cpus()

    def initial(self, threads: bool, stage: Any) -> int:
        """Where an auto stage starts: one worker per usable CPU (tf.data's guess), within budget."""
        if not threads:
            return max(2, self.cpus)
        return max(1, min(self.cpus, self.budget.room_for(stage)))

    def register(self, stage: Any, stats: Any, run: Any, backend: Any, threads: bool, start: int) -> None:
        """Tune ``stage`` (its statistics, engine run and backend) from now on."""
        maximum = auto_maximum() if threads else ASYNC_MAXIMUM
        climber = HillClimber(initial=max(1, min(start, maximum)), minimum=1, maximum=maximum)
        stats.tuning = climber.reason
        entry = _Entry(stage, stats, run, backend, climber, threads)
        with self.lock:
            self.entries = [e for e in self.entries if e.stage is not stage] + [entry]
            reporter = self.reporter
            if reporter is None or not reporter.thread.is_alive():
                reporter = self.reporter = Reporter(self.pass_ref, [(self, self.interval, lambda: None)], done=self.done)
                reporter.start()

    def close(self) -> None:
        """Stop tuning (the pass was closed)."""
        with self.lock:
            reporter = self.reporter
        if reporter is not None:
            reporter.close()

    def done(self) -> bool:
        """Every tuned stage's pass has ended (the tuner thread may end)."""
        with self.lock:
            return all(e.stats.stopped is not None for e in self.entries)

    def cpu_saturated(self, now: float) -> bool:
        """Whether the usable CPUs were busy (:data:`SATURATED`) since the last call: by this
        process, or by every process together. Other processes may keep the CPUs busy too: more
        workers then buy nothing CPU-bound, and the rates they are judged by move with the others'
        load, so the climber asks more of a step."""
        cpu_now = time.process_time()
        saturated = False
        if self.cpu is not None:
            wall, cpu = now - self.cpu[0], cpu_now - self.cpu[1]
            saturated = wall > 0 and cpu / (wall * self.cpus) >= SATURATED
        self.cpu = (now, cpu_now)
        machine = read_proc_stat()
        busy = machine_cores(self.machine, machine)
        self.machine = machine
        return saturated or (busy is not None and machine is not None and busy >= SATURATED * machine[2])

    def periodic(self, _: Any) -> None:
        now = time.perf_counter()
        saturated = self.cpu_saturated(now)
        high = False
        if self.budget.max_memory is not None:
            rss = rss_bytes()
            high = rss is not None and rss >= 0.9 * self.budget.max_memory
        with self.lock:
            entries = list(self.entries)
        for e in entries:
            self._step(e, now, saturated, high)

    def _step(self, e: _Entry, now: float, saturated: bool, high: bool) -> None:
        stats = e.stats
        if stats.started is None:
            return
        if stats.stopped is not None:
            if e.threads:
                self.budget.release(e.stage)
            return
        reading = (now, stats.items_out, stats.busy(), stats.source_s, stats.wait_s)
        last, e.last = e.last, reading
        if last is None:
            return
        dt = reading[0] - last[0]
        if dt <= 0:
            return
        c = stats.workers
        busy = min(1.0, max(0.0, (reading[2] - last[2]) / (dt * max(1, c))))
        starved = min(1.0, max(0.0, (reading[3] - last[3]) / dt))
        # Workers idle while the stage was not waiting for its source: with a window of twice the
        # workers, they idle only when the consumer does not take the results (downstream limits).
        blocked = min(1.0, max(0.0, 1.0 - busy - starved))
        limit = self.budget.room_for(e.stage) if e.threads else ASYNC_MAXIMUM
        obs = Observation(concurrency=c, items=max(0, reading[1] - last[1]), seconds=dt, busy=busy, starved=starved,
                          blocked=blocked, cpu_saturated=saturated, memory_high=high, limit=max(1, limit))
        new = e.climber.update(obs)
        stats.tuning = e.climber.reason
        if new != c:
            e.backend.resize(new)
            e.run.window = 2 * new
            stats.workers = new
            if e.threads:
                self.budget.set(e.stage, new)
