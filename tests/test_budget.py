"""Thread budgets, concurrency="auto" and concurrent generator stages."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import pickle
import threading
import time

import pytest

from datapipes import DataLoader
from datapipes._runtime.tuning import Budget, _scaled
from datapipes.iter import IterableWrapper

WAIT = 10.0
BOUND = 3  # seconds: the most one test of the many-CPU section may take


class Counting:
    """A fn that records the most calls running at once (all stages sharing one counter)."""

    def __init__(self, delay: float = 0.002) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.threads: set[int] = set()

    def __call__(self, x):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.threads.add(threading.get_ident())
        try:
            time.sleep(self.delay)
            return x
        finally:
            with self.lock:
                self.running -= 1


def worker_threads(before: set[threading.Thread]) -> int:
    """Worker threads started since ``before`` and still alive (earlier tests' leftovers excluded)."""
    return sum(1 for t in threading.enumerate()
               if t not in before and t.name.startswith("datapipes ") and "worker" in t.name)


def test_fixed_stages_are_scaled_into_the_budget():
    count = Counting()
    pipe = IterableWrapper(range(60)).map(count, concurrency=8).map(count, concurrency=4).set_budget(max_threads=3)
    it = iter(pipe)
    assert list(it) == list(range(60))
    workers = [s.workers for _, s in it.stats()]
    assert sum(workers) == 3 and count.most <= 3


def test_a_stage_left_no_thread_runs_inline():
    count = Counting(0)
    pipe = (IterableWrapper(range(10)).map(count, concurrency=2).map(count, concurrency=2)
            .map(count, concurrency=2).set_budget(max_threads=2))
    it = iter(pipe)
    assert list(it) == list(range(10))
    kinds = sorted(s.kind for _, s in it.stats())
    assert kinds == ["inline", "thread", "thread"]


def test_budget_within_budget_changes_nothing():
    it = iter(IterableWrapper(range(10)).map(abs, concurrency=3).set_budget(max_threads=16))
    list(it)
    assert it.stats()[0][1].workers == 3


def test_scaling_keeps_the_total_and_proportions():
    assert _scaled({1: 8, 2: 4}, 3) == {1: 2, 2: 1}
    assert sum(_scaled({1: 5, 2: 5, 3: 5}, 7).values()) == 7


def test_auto_never_exceeds_the_thread_budget():
    count = Counting(0.003)
    pipe = (IterableWrapper(range(600)).map(count, concurrency="auto")
            .map(count, concurrency=2).set_budget(max_threads=5))
    before = set(threading.enumerate())
    it = iter(pipe)
    seen_threads = 0
    for i, _ in enumerate(it):
        if i % 50 == 0:
            seen_threads = max(seen_threads, worker_threads(before))
    assert count.most <= 5
    assert seen_threads <= 5 + 1  # a thread told to stop may still be finishing its last item


def test_auto_grows_an_io_stage():
    # A stage sleeping 5 ms per item starts at one worker per CPU and grows: decisions are made on
    # the tuner's clock, so the test waits for a decision instead of timing anything.
    gate = threading.Event()

    def io(x):
        time.sleep(0.005)
        return x

    it = iter(IterableWrapper(range(100_000)).map(io, concurrency="auto").set_budget(max_threads=16))
    (_, stats), = [pair for pair in it.stats()]
    start = stats.workers
    deadline = time.monotonic() + WAIT
    for _ in it:
        if stats.workers > start or time.monotonic() > deadline:
            gate.set()
            break
    it.close()
    assert gate.is_set() and stats.workers > start, stats.tuning
    assert stats.auto and stats.tuning


def test_auto_outside_a_budget_and_with_processes():
    it = iter(IterableWrapper(range(20)).map(abs, concurrency="auto"))
    assert list(it) == list(range(20))
    assert it.stats()[0][1].auto
    it = iter(IterableWrapper(range(20)).map(abs, concurrency="auto", executor="process"))
    assert list(it) == list(range(20))
    stats = it.stats()[0][1]
    assert stats.auto and stats.tuning and 1 <= stats.workers <= os.cpu_count()  # tuned within its processes


def test_bad_concurrency_and_budget_values():
    with pytest.raises(ValueError, match="auto"):
        IterableWrapper([1]).map(abs, concurrency="many")
    with pytest.raises(ValueError, match="max_threads"):
        IterableWrapper([1]).set_budget(max_threads=0)
    with pytest.raises(ValueError, match="max_memory"):
        IterableWrapper([1]).set_budget(max_memory=-5)
    with pytest.raises(ValueError, match="max_processes must be an int >= 1 or None, got 0"):
        IterableWrapper([1]).set_budget(max_processes=0)


def test_loader_budget():
    count = Counting()
    loader = DataLoader(IterableWrapper(range(40)).map(count, concurrency=8), batch_size=8, max_threads=2)
    assert len(list(loader)) == 5
    assert count.most <= 2


def test_budget_direct():
    budget = Budget([], max_threads=4, max_memory=None)
    assert budget.room_for(object()) == 4


# -- concurrent generator stages --------------------------------------------------------------------


def tiles(x):
    time.sleep(0.001)
    for i in range(x % 4):
        yield (x, i)


async def async_tiles(x):
    await asyncio.sleep(0.001)
    for i in range(x % 4):
        yield (x, i)


SERIAL = [(x, i) for x in range(30) for i in range(x % 4)]


@pytest.mark.parametrize("kw", [dict(concurrency=4), dict(concurrency=4, ordered=False),
                                dict(concurrency=2, executor="process"), dict(concurrency="auto")])
def test_concurrent_flatmap_of_a_generator(kw):
    out = list(IterableWrapper(range(30)).flatmap(tiles, **kw))
    assert (out == SERIAL) if kw.get("ordered", True) else (sorted(out) == SERIAL)


def test_concurrent_flatmap_keeps_each_items_outputs_together():
    out = list(IterableWrapper(range(30)).flatmap(tiles, concurrency=4, ordered=False))
    firsts = [pair for pair in out if pair[1] == 0]
    for x, _ in firsts:
        k = out.index((x, 0))
        assert out[k:k + x % 4] == [(x, i) for i in range(x % 4)]


def test_async_generator_runs_concurrently():
    assert list(IterableWrapper(range(30)).flatmap(async_tiles, concurrency=8)) == SERIAL
    assert sorted(IterableWrapper(range(30)).map(async_tiles, concurrency=8, ordered=False)) == SERIAL


def test_map_of_a_generator_function_flattens_when_concurrent():
    assert list(IterableWrapper(range(30)).map(tiles, concurrency=3)) == SERIAL
    serial = list(IterableWrapper(range(3)).map(tiles))  # torch's behaviour: the generator objects
    assert all(hasattr(g, "__next__") for g in serial)
    with pytest.raises(ValueError, match="flatmap"):
        IterableWrapper(range(3)).map(tiles, input_col=0, concurrency=2)


def test_concurrent_flatmap_resumes_exactly():
    pipe = IterableWrapper(range(30)).flatmap(tiles, concurrency=4)
    for k in (0, 1, 7, len(SERIAL) - 1):
        it = iter(pipe)
        first = [next(it) for _ in range(k)]
        state = pickle.loads(pickle.dumps(it.state_dict()))
        it.close()
        again = iter(pipe)
        again.load_state_dict(state)
        assert first + list(again) == SERIAL


def test_concurrent_flatmap_skips_failures():
    def bad(x):
        if x == 5:
            raise ValueError(x)
        return [x, x]

    out = list(IterableWrapper(range(8)).flatmap(bad, concurrency=2, on_error="skip"))
    assert out == [y for x in range(8) if x != 5 for y in (x, x)]
    with pytest.raises(ValueError, match="concurrency needs a fn"):
        IterableWrapper([[1]]).flatmap(concurrency=2)


def mapper_threads_here(x):
    """How many worker threads of Mapper stages run in this process now."""
    return sum(1 for t in threading.enumerate() if t.name.startswith("datapipes Mapper") and "worker" in t.name)


def test_loader_budget_reaches_worker_processes():
    pipe = IterableWrapper(range(40)).sharding_filter().map(mapper_threads_here, concurrency=8)
    loader = DataLoader(pipe, batch_size=None, num_workers=2, max_threads=3)
    seen = list(loader)
    assert len(seen) == 40 and 1 <= max(seen) <= 3


def test_the_tuner_counts_other_processes_cpu_use(monkeypatch):
    # /proc/stat readings (busy, total, cpus): the machine's 2 usable CPUs 95% busy over the
    # interval, while this process used next to none of them: the interval is CPU-saturated
    from datapipes._runtime import tuning as _tuning

    class Pass:
        pass

    readings = iter([(1000, 2000, 2), (1950, 3000, 2), (2000, 4000, 2)])
    monkeypatch.setattr(_tuning, "read_proc_stat", lambda cpus=None: next(readings))
    tuner = _tuning.Tuner(Pass(), Budget([], None, None))
    assert tuner.cpu_saturated(1.0) is False  # the first reading: nothing to compare yet
    assert tuner.cpu_saturated(2.0) is True  # 950 of 1000 jiffies busy
    assert tuner.cpu_saturated(3.0) is False  # 50 of 1000
    monkeypatch.setattr(_tuning, "read_proc_stat", lambda cpus=None: None)  # not Linux: this process only
    assert tuner.cpu_saturated(4.0) is False


# -- many CPUs: the budget is exact whatever the count, the count read once per pass ------------------

#: CPU counts simulated by reporting them to the process (see ``simulate_cpus``)
SIMULATED = [2, 16, 64, 128]


@pytest.fixture
def simulate_cpus(monkeypatch):
    """``simulate_cpus(n)``: the process reports ``n`` usable CPUs to everything the library may read
    (``os.process_cpu_count``, added where Python < 3.13 lacks it; ``os.sched_getaffinity``;
    ``os.cpu_count``). Returns ``reads``: ``reads["count"]`` counts the reads of a CPU count,
    ``reads["set"]`` those of the affinity set."""
    reads = {"count": 0, "set": 0}

    def simulate(n):
        def count():
            reads["count"] += 1
            return n

        def affinity(pid):
            reads["set"] += 1
            return set(range(n))

        monkeypatch.setattr(os, "process_cpu_count", count, raising=False)
        monkeypatch.setattr(os, "sched_getaffinity", affinity, raising=False)
        monkeypatch.setattr(os, "cpu_count", count)
        return reads

    return simulate


@pytest.fixture
def fast_tuner(monkeypatch):
    """The tuner decides every 10 ms: a short pass sees many of its decisions."""
    from datapipes._runtime import tuning as _tuning

    monkeypatch.setattr(_tuning.Tuner, "interval", 0.01)


@pytest.mark.timeout(BOUND)
@pytest.mark.parametrize("max_threads", [5, 6, 8])
@pytest.mark.parametrize("cpus", SIMULATED)
def test_an_auto_and_a_fixed_stage_hold_the_budget_on_many_cpus(simulate_cpus, fast_tuner, cpus, max_threads):
    # The issue: on 16 CPUs, max_threads 5 ran 7 calls at once (the auto stage started at 5 before
    # the fixed stage's 2 were counted)
    simulate_cpus(cpus)
    count = Counting(0.002)
    pipe = (IterableWrapper(range(300)).map(count, concurrency="auto").map(count, concurrency=2)
            .set_budget(max_threads=max_threads))
    it = iter(pipe)
    assert list(it) == list(range(300))
    assert count.most <= max_threads
    assert sum(s.workers for _, s in it.stats() if not s.auto) == 2


@pytest.mark.timeout(BOUND)
@pytest.mark.parametrize("max_threads", [3, 5, 8])
@pytest.mark.parametrize("cpus", SIMULATED)
def test_two_auto_stages_and_a_fixed_one_share_the_budget_on_many_cpus(simulate_cpus, fast_tuner, cpus,
                                                                       max_threads):
    simulate_cpus(cpus)
    count = Counting(0.002)
    pipe = (IterableWrapper(range(400)).map(count, concurrency="auto").map(count, concurrency=2)
            .map(count, concurrency="auto", ordered=False).set_budget(max_threads=max_threads))
    it = iter(pipe)
    assert sorted(it) == list(range(400))
    assert count.most <= max_threads
    assert all(s.kind == "thread" for _, s in it.stats())


@pytest.mark.timeout(BOUND)
@pytest.mark.parametrize("cpus", SIMULATED)
def test_more_auto_stages_than_threads_run_the_rest_inline(simulate_cpus, cpus):
    simulate_cpus(cpus)
    count = Counting(0.001)
    pipe = (IterableWrapper(range(60)).map(count, concurrency="auto").map(count, concurrency="auto")
            .map(count, concurrency=3).set_budget(max_threads=1))
    before = set(threading.enumerate())
    it = iter(pipe)
    seen = 0
    for _ in it:
        seen = max(seen, worker_threads(before))
    kinds = sorted(s.kind for _, s in it.stats())
    assert kinds == ["inline", "inline", "thread"] and seen <= 1
    assert count.most <= 2  # one worker thread, and the consumer's thread running the inline stages


@pytest.mark.timeout(BOUND)
@pytest.mark.parametrize("cpus", SIMULATED)
def test_the_cpu_count_is_read_once_per_pass(simulate_cpus, fast_tuner, cpus):
    reads = simulate_cpus(cpus)
    count = Counting(0.001)
    pipe = (IterableWrapper(range(200)).map(count, concurrency="auto").map(count, concurrency="auto")
            .map(count, concurrency="auto", executor=_SerialExecutor()).set_budget(max_threads=4))
    for passes in (1, 2):
        assert list(pipe) == list(range(200))
        assert reads["count"] == passes and reads["set"] <= passes


class _SerialExecutor(concurrent.futures.Executor):
    """Runs each call at once (an executor stage: neither threads nor processes of the engine's)."""

    def submit(self, fn, *args, **kwargs):
        f = concurrent.futures.Future()
        f.set_result(fn(*args, **kwargs))
        return f


@pytest.mark.parametrize("cpus, start, most, processes, threadpool", [
    (2, 2, 32, 2, 6), (16, 16, 64, 16, 20), (64, 16, 128, 32, 32), (128, 16, 128, 32, 32)])
def test_the_defaults_on_many_cpus(simulate_cpus, cpus, start, most, processes, threadpool):
    from datapipes._runtime import tuning as _tuning
    from datapipes.iter.mapping.map import _default_workers

    simulate_cpus(cpus)
    assert _tuning.usable_cpus() == cpus
    assert _tuning.auto_start(cpus) == start  # where an auto thread stage starts
    assert _tuning.auto_maximum(cpus) == most  # the most threads it takes without a budget
    assert _tuning.process_workers(cpus) == processes  # a process stage's "auto"
    assert _default_workers() == threadpool  # threadpool_map's max_workers=None
    budget = Budget([], None, None)
    assert budget.cpus == cpus and budget.room_for(object()) == most


@pytest.mark.parametrize("cpus", SIMULATED)
def test_an_auto_process_stage_runs_one_process_per_cpu_within_its_cap(simulate_cpus, cpus):
    # what the stage would start with (starting 32 processes here would take longer than the test may)
    from datapipes._runtime import tuning as _tuning
    from datapipes.iter.mapping._shared import _stage_concurrency

    simulate_cpus(cpus)
    pipe = IterableWrapper(range(4)).map(abs, concurrency="auto", executor="process")
    assert _stage_concurrency(pipe) == (min(cpus, _tuning.PROCESS_MAXIMUM), None)


class _AutoStage:
    """A stage as the budget sees it: ``concurrency="auto"`` on worker threads."""

    def _thread_demand(self):
        return "auto"


class _Scripted:
    """A climber whose decisions are given; it records the limit of each observation."""

    reason = "scripted"

    def __init__(self, *values):
        self.values = iter(values)
        self.limits = []

    def update(self, obs):
        self.limits.append(obs.limit)
        return next(self.values)


class _Backend:
    def __init__(self):
        self.sizes = []

    def resize(self, n):
        self.sizes.append(n)


@pytest.mark.parametrize("cpus", SIMULATED)
def test_a_stage_stepping_down_holds_its_threads_until_they_have_stopped(cpus):
    # Threads told to stop finish the items queued before their stop: until every item in flight at
    # the step down has finished, the stage holds the threads it had, and neither another stage nor
    # a step back up may use them. (The tuner's steps are called by hand, with scripted decisions.)
    from datapipes._engine.core import EngineRun
    from datapipes._engine.stats import StageStats
    from datapipes._runtime.tuning import Tuner, _Entry

    a, b = _AutoStage(), _AutoStage()
    budget = Budget([a, b], max_threads=6, max_memory=None, cpus=cpus)
    tuner = Tuner(a, budget)  # (its pass: any object; the tuner thread is never started here)
    first = tuner.initial(True, a)
    assert first == min(cpus, 5)  # b's thread is held for it from the start
    second = tuner.initial(True, b)
    assert second == min(cpus, 6 - first)
    room = 6 - second  # a's, while b holds its threads

    def entry(stage, climber, workers):
        stats = StageStats("stage", "thread", workers, 2 * workers, auto=True)
        run = EngineRun()
        stats.begin([0.0], lambda: (run.pulled, 0, 0))
        return _Entry(stage, stats, run, _Backend(), climber, True, workers)

    ea = entry(a, _Scripted(1, 1, 3, 1, 2), first)
    eb = entry(b, _Scripted(second, second, second), second)
    held = budget.held
    clock = iter(range(100))

    def step(e):
        tuner._step(e, next(clock) * 0.25, False, False)

    step(ea), step(eb)  # the first readings
    ea.run.inputs.update((k, k) for k in range(10, 10 + first))  # items in flight: positions 10..
    step(ea)  # a: first -> 1, its surplus still working
    assert ea.backend.sizes == [1] and held()[id(a)] == first
    step(eb)  # b may not grow into a's stopping threads
    assert eb.climber.limits == [6 - first]
    step(ea)  # nor may a itself
    assert ea.climber.limits[-1] == room - (first - 1)
    ea.run.inputs.clear()
    ea.run.inputs[20] = 20  # every item in flight at the step down has finished
    step(eb)
    assert eb.climber.limits[-1] == 6 - first  # (a's drain is seen on a's step)
    step(ea)  # a: drained, holds 1; 1 -> 3
    assert ea.climber.limits[-1] == room and held()[id(a)] == 3
    step(eb)
    assert eb.climber.limits[-1] == 6 - 3
    step(ea)  # a: 3 -> 1 with item 20 in flight: holds 3
    step(ea)  # a: 1 -> 2 while two threads may still be stopping: holds 3 + 1
    assert ea.climber.limits[-1] == room - 2 and held()[id(a)] == 4 and ea.backend.sizes == [1, 3, 1, 2]
    assert sum(held().values()) <= 6


# -- process stages: the process budget and the tuner ----------------------------------------------


def _pid(x):
    return os.getpid()


def test_budget_shares_max_processes_first_come_one_each_at_least():
    a, b, c = object(), object(), object()
    budget = Budget([], None, None, max_processes=5)
    assert budget.take_processes(a, 4) == 4
    assert budget.take_processes(b, 4) == 1  # what is left
    assert budget.take_processes(c, 2) == 1  # none left: one at least
    assert budget.take_processes(a, 4) == 3  # a again (a later pass of the same stage): the others hold 2
    assert Budget([], None, None).take_processes(a, 64) == 64  # no bound


@pytest.mark.slow
def test_max_processes_bounds_the_process_stages_of_a_pass(simulate_cpus):
    simulate_cpus(4)
    pipe = (IterableWrapper(range(60)).map(_pid, concurrency=2, executor="process", chunksize=1)
            .map(lambda pid: (pid, os.getpid()), concurrency=3, executor="process", chunksize=1)
            .set_budget(max_processes=3))
    it = iter(pipe)
    rows = list(it)
    workers = {s.label: s.workers for _, s in it.stats()}
    # the stage that starts first takes what it asks for; the other gets the rest, one at least
    assert sorted(workers.values()) in ([1, 2], [1, 3])
    assert len({a for a, _ in rows}) <= workers["Mapper(_pid)"] and len({b for _, b in rows}) <= workers["Mapper(<lambda>)"]
    auto = iter(IterableWrapper(range(20)).map(_pid, concurrency="auto", executor="process").set_budget(max_processes=1))
    assert len(set(auto)) == 1 and auto.stats()[0][1].workers == 1


@pytest.mark.slow
def test_an_auto_process_stage_backs_off_when_its_workers_memory_nears_max_memory(simulate_cpus, monkeypatch):
    from datapipes._runtime import tuning as _tuning

    simulate_cpus(4)
    # this process's own RSS counts for nothing here: only the worker processes' memory can be high
    monkeypatch.setattr(_tuning, "rss_bytes", lambda: 0)
    slow = Counting(delay=0.0)
    pipe = IterableWrapper(range(100_000)).map(_pid, concurrency="auto", executor="process", chunksize=1)
    pipe.set_budget(max_memory=1 << 20)  # 1 MB: a worker process alone is over it
    it = iter(pipe)
    stats = None
    deadline = time.monotonic() + WAIT
    for _ in it:
        stats = it.stats()[0][1]
        if stats.workers == 1 or time.monotonic() > deadline:
            break
        slow(0)
    it.close()
    assert stats is not None and stats.auto and stats.workers == 1, stats.tuning
    assert "memory" in stats.tuning


@pytest.mark.slow
def test_workers_memory_counts_live_worker_processes():
    from datapipes._runtime import tuning as _tuning

    before = _tuning.workers_memory()
    it = iter(IterableWrapper(range(10)).map(_pid, concurrency=2, executor="process"))
    next(it)
    assert _tuning.workers_memory() > before  # two more interpreters' pages
    it.close()
