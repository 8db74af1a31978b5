"""A pass's thread budget, and the online tuning of its ``concurrency="auto"`` stages.

Budget. The thread stages of a pass (concurrent ``map``/``flatmap`` on worker threads) share the
pass's ``max_threads``, the tightest set with ``set_budget`` on any stage of its graph (or by the
loader). When the pass starts, the stages with a fixed ``concurrency`` keep theirs if the sum fits
next to one thread per auto stage; otherwise each is scaled down in proportion (largest remainders
first), and a stage scaled to nothing runs its ``fn`` on the consumer's thread (kind ``"inline"``).
Every thread stage of the graph holds its share from the start of the pass (one thread per auto
stage; more auto stages than ``max_threads``: the first ``max_threads`` of them), whether its
threads have started yet or not, so a stage that starts first cannot take what a later one was
given. Auto stages then share what is left: the tuner never gives one more than the budget minus
what every other thread stage holds at that moment. A stage told to run fewer threads holds the
threads it had until they have stopped (each stops when the items queued before its stop have been
taken: the tuner waits until every item in flight at the change has finished), so another stage
cannot grow into them early. Whatever the CPU count, the worker threads running ``fn`` never
outnumber ``max_threads`` (a worker abandoned after a ``timeout`` aside: a thread cannot be killed).

Tuning. Each auto stage of a pass is tuned by a :class:`~datapipes._engine.tune.HillClimber` from
its live statistics, every :data:`INTERVAL` seconds on the pass's tuner thread (a
:class:`~datapipes._runtime.observe.Reporter`): items completed, busy time of its workers, time the
consumer spent pulling the stage's source (*starved*: the source is the limit) and time the
workers stood idle without the stage being starved (*blocked*: downstream is the limit), whether the process kept its
CPUs saturated, and whether RSS came within 10% of ``max_memory``. A new value takes effect at once:
threads are started, or stopped as they finish their item; async stages change their number of
running tasks; the window of items in flight follows (twice the concurrency). The choice and the
reason for it are in the stage's statistics (``stats.workers``, ``stats.tuning``) and in
``profile``. The tuner thread ends with the pass.

Processes. The process stages of a pass share its ``max_processes`` (none: no bound), first come
first served as they start, each one process at least. A process stage with ``concurrency="auto"``
starts one worker process per usable CPU, at most :data:`PROCESS_MAXIMUM` and what the budget left
it, and is tuned like a thread stage within them: the tuner sets how many of them are given chunks
(the others wait, started), so a consumer-bound or source-bound stage gives its CPUs back and a
stage near ``max_memory`` sheds work in flight. For ``max_memory`` the tuner counts this process's
RSS and the proportional share (PSS) of every worker process it started, read each interval.

CPUs. A pass reads the usable CPUs once, when its budget is decided (:attr:`Budget.cpus`), and
every decision of the pass uses that reading: the defaults below, and the tuner's CPU-saturation
test. Each default is capped so that a 128-CPU host gets sensible values, not 4 x 128 threads:

====================================  ===============================  ======  =======  ========
default                               formula                          2 CPUs  16 CPUs  128 CPUs
====================================  ===============================  ======  =======  ========
auto thread stage: first value        ``min(CPUs, 16)``                2       16       16
auto thread stage: most, no budget    ``min(128, max(32, 4 x CPUs))``  32      64       128
auto async stage: first value         ``max(2, min(CPUs, 16))``        2       16       16
auto process stage: processes         ``min(CPUs, 32)``                2       16       32
====================================  ===============================  ======  =======  ========
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any

from .._engine.process import live_worker_pids
from .._engine.tune import HillClimber, Observation
from .observe import Reporter
from .traits import traits_of
from ..hooks import Hook

__all__ = ["AUTO", "INTERVAL", "PROCESS_MAXIMUM", "START_MAXIMUM", "THREAD_MAXIMUM", "Budget", "Tuner", "auto_maximum",
           "auto_start", "process_workers", "rss_bytes", "thread_demand", "usable_cpus", "workers_memory"]

AUTO = "auto"
#: seconds between two tuning decisions
INTERVAL = 0.25
#: the most tasks an async auto stage runs (tasks are cheap; this bounds memory)
ASYNC_MAXIMUM = 1024
#: the most workers an auto stage starts with, whatever the CPU count (the tuner climbs from there
#: while more pay: three doublings reach :data:`THREAD_MAXIMUM`)
START_MAXIMUM = 16
#: the most threads an auto stage takes without a budget, whatever the CPU count (its threads share
#: one process: four per CPU of a 128-CPU host would be 512)
THREAD_MAXIMUM = 128
#: the most processes a process stage's ``"auto"`` starts (every rank of a multi-GPU host runs its
#: own pipe, and each would otherwise start one per CPU of the host)
PROCESS_MAXIMUM = 32


def usable_cpus() -> int:
    """CPUs this process may use: ``os.process_cpu_count()`` where Python has it (3.13: the affinity
    mask, and ``-X cpu_count``), else the affinity mask, else ``os.cpu_count()``; at least 1.

    A pass reads it once (:attr:`Budget.cpus`); the functions below take that reading."""
    count = getattr(os, "process_cpu_count", None)
    if count is not None:
        return count() or 1
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def auto_start(cpus: int) -> int:
    """Where an auto thread stage starts on ``cpus`` CPUs, before its budget: one worker per CPU
    (tf.data's guess), at most :data:`START_MAXIMUM`: ``min(CPUs, 16)``."""
    return max(1, min(cpus, START_MAXIMUM))


def auto_maximum(cpus: int | None = None) -> int:
    """The most threads an auto stage takes when no budget bounds it, on ``cpus`` CPUs (None: read
    now): ``min(128, max(32, 4 x CPUs))`` (:data:`THREAD_MAXIMUM`)."""
    return min(THREAD_MAXIMUM, max(32, 4 * (usable_cpus() if cpus is None else cpus)))


def process_workers(cpus: int | None = None) -> int:
    """The processes of a process stage with ``concurrency="auto"`` on ``cpus`` CPUs (None: read
    now): one per CPU, at most :data:`PROCESS_MAXIMUM`: ``min(CPUs, 32)``."""
    return max(1, min(usable_cpus() if cpus is None else cpus, PROCESS_MAXIMUM))


def rss_bytes() -> int | None:
    """This process's resident memory, or None where it cannot be read (Linux ``/proc``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def workers_memory() -> int:
    """The memory of the worker processes this process started (process stages' pools, parked ones
    included): each one's proportional share (PSS, so pages a forked worker shares with this process
    count once among them), or its RSS where PSS cannot be read; 0 without workers or ``/proc``."""
    total = 0
    for pid in live_worker_pids():
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:")) * 1024
            continue
        except (OSError, StopIteration, ValueError, IndexError):
            pass
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            pass
    return total


def thread_demand(stage: Any) -> int | str | None:
    """What a stage asks of the thread budget: its fixed concurrency, ``"auto"``, or None (no
    worker threads of its own: serial, async, processes, an executor the user built)."""
    return traits_of(stage)._thread_demand()


class Budget:
    """The thread budget of one pass (see the module): decided when the pass starts.

    Attributes:
        max_threads, max_memory: the pass's bounds (None: none).
        cpus: the usable CPUs, read once for the pass (:func:`usable_cpus`); every default of the
            pass is computed from it.
        maximum: the most threads an auto stage takes, budget aside (:func:`auto_maximum`).

    Invariant: the threads every stage holds (:meth:`held`) add up to ``max_threads`` at most, and a
    stage's worker threads never outnumber what it holds.
    """

    def __init__(self, graph: list[Any], max_threads: int | None, max_memory: int | None,
                 cpus: int | None = None, max_processes: int | None = None) -> None:
        self.max_threads = max_threads
        self.max_memory = max_memory
        self.max_processes = max_processes
        self.processes: dict[int, int] = {}  # id(stage) -> worker processes it runs in this pass
        self.cpus = usable_cpus() if cpus is None else cpus
        self.maximum = auto_maximum(self.cpus)
        self.lock = threading.Lock()
        self.current: dict[int, int] = {}  # id(stage) -> threads it holds now (auto stages included)
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
        # Held from the start of the pass, before the stages' threads start: a fixed stage its
        # allotment, an auto stage one thread (the first max_threads auto stages: the others find no
        # room and run inline). A stage that starts first takes only what is left of the rest.
        self.reserved: dict[int, int] = {}
        if max_threads is not None:
            self.reserved = {k: n for k, n in self.allotted.items() if n}
            self.reserved.update((k, 1) for k in autos[:max_threads])

    def held(self) -> dict[int, int]:
        """id(stage) -> the threads each stage holds now (reserved until it starts). Call under ``lock``."""
        return {**self.reserved, **self.current}

    def threads_for(self, stage: Any, requested: int) -> int:
        """The threads fixed stage ``stage`` runs in this pass (0: inline on the consumer's thread);
        a stage the pass did not see when it started gets what is left, at most ``requested``."""
        n = self.allotted.get(id(stage))
        if n is None:
            return self.take(stage, requested)
        with self.lock:
            self.current[id(stage)] = n
        return n

    def take(self, stage: Any, wanted: int) -> int:
        """Hold ``wanted`` threads for ``stage``, or what the budget has left for it (0: none); returns
        the number held. The check and the hold are one step (stages may start on several threads)."""
        with self.lock:
            n = wanted if self.max_threads is None else max(0, min(wanted, self._left(id(stage))))
            self.current[id(stage)] = n
        return n

    def room_for(self, stage: Any) -> int:
        """The most threads auto stage ``stage`` may run now: the budget less what every other stage
        holds, at most :attr:`maximum` (0: none left)."""
        if self.max_threads is None:
            return self.maximum
        with self.lock:
            return max(0, min(self.maximum, self._left(id(stage))))

    def _left(self, key: int) -> int:
        assert self.max_threads is not None
        return self.max_threads - sum(n for k, n in self.held().items() if k != key)

    def set(self, stage: Any, n: int) -> None:
        """``stage`` holds ``n`` threads from now on."""
        with self.lock:
            self.current[id(stage)] = n

    def take_processes(self, stage: Any, wanted: int) -> int:
        """The worker processes process stage ``stage`` runs in this pass: ``wanted``, or what
        ``max_processes`` has left for it, one at least (a process stage has no inline fallback)."""
        with self.lock:
            n = wanted
            if self.max_processes is not None:
                others = sum(v for k, v in self.processes.items() if k != id(stage))
                n = max(1, min(wanted, self.max_processes - others))
            self.processes[id(stage)] = n
        return n

    def release(self, stage: Any) -> None:
        """The stage's pass ended: its threads are free for the others."""
        with self.lock:
            self.current.pop(id(stage), None)
            self.reserved.pop(id(stage), None)


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
    """One auto stage being tuned: what it runs on, and its readings at the last decision.

    ``live``: the most worker threads the stage may have now (its setting, plus threads told to
    stop that may still be working), what it holds of the budget; ``drain``: after a step down,
    the newest position in flight when the surplus threads were told to stop (None: none pending).
    """

    __slots__ = ("stage", "stats", "run", "backend", "climber", "threads", "last", "live", "drain", "maximum")

    def __init__(self, stage: Any, stats: Any, run: Any, backend: Any, climber: HillClimber, threads: bool,
                 live: int, maximum: int = 0) -> None:
        self.maximum = maximum  # the most workers it may run (not threads: the budget bounds those)
        self.stage = stage
        self.stats = stats
        self.run = run
        self.backend = backend
        self.climber = climber
        self.threads = threads
        self.last: tuple[float, int, float, float, float] | None = None  # time, out, busy, source, wait
        self.live = live
        self.drain: int | None = None


def _in_flight(run: Any) -> list[int]:
    """The positions of a stage's items in flight now (pulled, not yet yielded): read from the
    consumer's thread's dict by copying it, one step that does not race its changes."""
    return list(run.inputs.copy())


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


def cpu_set() -> set[int] | None:
    """The CPUs this process may run on (its affinity mask), or None where the OS has none."""
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None


_READ = object()  # read_proc_stat's default: read the affinity mask now


def read_proc_stat(cpus: Any = _READ) -> tuple[int, int, int] | None:
    """The machine's CPU times now (:func:`cpu_times` of ``/proc/stat``) over ``cpus`` (a set of CPU
    numbers, None: every CPU; by default :func:`cpu_set` read now), or None where unreadable."""
    try:
        with open("/proc/stat") as f:
            text = f.read()
        return cpu_times(text, cpu_set() if cpus is _READ else cpus)
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
        self.cpus = budget.cpus  # the pass's reading
        self.cpu_set = cpu_set()  # the CPUs whose /proc/stat times count, read once for the pass

    def initial(self, threads: bool, stage: Any) -> int:
        """Where an auto thread or async stage starts: one worker per usable CPU (tf.data's guess), at
        most :data:`START_MAXIMUM`; a thread stage takes it from the budget (held from now on; 0:
        the budget has no thread left for it, it runs inline). (A process stage starts at its
        processes: :func:`datapipes._runtime.shares.processes_for`.)"""
        if not threads:
            return max(2, auto_start(self.cpus))
        return self.budget.take(stage, auto_start(self.cpus))

    def register(self, stage: Any, stats: Any, run: Any, backend: Any, threads: bool, start: int,
                 maximum: int | None = None) -> None:
        """Tune ``stage`` (its statistics, engine run and backend) from now on; a thread stage holds
        ``start`` threads of the budget (:meth:`initial`). ``maximum``: the most workers it may run
        (a process stage: its processes); by default the thread or async stages' own."""
        if maximum is None:
            maximum = self.budget.maximum if threads else ASYNC_MAXIMUM
        climber = HillClimber(initial=max(1, min(start, maximum)), minimum=1, maximum=maximum)
        stats.tuning = climber.reason
        entry = _Entry(stage, stats, run, backend, climber, threads, start, maximum)
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
        machine = read_proc_stat(self.cpu_set)
        busy = machine_cores(self.machine, machine)
        self.machine = machine
        return saturated or (busy is not None and machine is not None and busy >= SATURATED * machine[2])

    def periodic(self, _: Any) -> None:
        now = time.perf_counter()
        saturated = self.cpu_saturated(now)
        high = False
        if self.budget.max_memory is not None:
            rss = rss_bytes()
            if rss is not None:
                rss += workers_memory()
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
            with self.lock:
                current = e in self.entries  # not a run of the stage that a newer one replaced
            if e.threads and current:
                self.budget.release(e.stage)
            return
        if e.drain is not None:
            self._drained(e)
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
        # the budget less what the others hold, less this stage's own threads still stopping
        limit = self.budget.room_for(e.stage) - (e.live - c) if e.threads else e.maximum
        obs = Observation(concurrency=c, items=max(0, reading[1] - last[1]), seconds=dt, busy=busy, starved=starved,
                          blocked=blocked, cpu_saturated=saturated, memory_high=high, limit=max(1, limit))
        new = e.climber.update(obs)
        stats.tuning = e.climber.reason
        if new != c:
            self._resize(e, c, new)

    def _resize(self, e: _Entry, old: int, new: int) -> None:
        """Run ``new`` workers instead of ``old``. More threads are held before they start; fewer are
        held until the surplus has stopped (see :meth:`_drained`)."""
        if e.threads and new > old:
            e.live += new - old  # threads told to stop earlier may still be working beside the new ones
            self.budget.set(e.stage, e.live)
        resize = getattr(e.backend, "resize", None)
        if resize is not None:  # an executor the user built: only the window of items in flight changes
            resize(new)
        e.run.window = 2 * new
        e.stats.workers = new
        if e.threads and new < old:
            # each surplus thread stops on a sentinel queued behind the items submitted so far; every
            # position of those was in flight when the sentinels were queued (recorded before submit)
            e.drain = max(_in_flight(e.run), default=-1)
            self._drained(e)

    def _drained(self, e: _Entry) -> None:
        """After a step down: once every item in flight at the step has finished (left the run's
        positions in flight), the workers have taken their sentinels, and a thread that took none
        is one of the ``workers`` kept: the stage holds ``workers`` threads from then on."""
        assert e.drain is not None
        if min(_in_flight(e.run), default=e.drain + 1) > e.drain:
            e.drain = None
            e.live = e.stats.workers
            self.budget.set(e.stage, e.live)
