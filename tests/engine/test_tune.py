"""The ``concurrency="auto"`` tuner (datapipes/_engine/tune.py) on deterministic synthetic workloads.

Each workload is a model that turns a concurrency into one interval's :class:`Observation` (an I/O
stage whose consumer takes at most ``cap`` items/s, a CPU-bound stage on ``cores`` CPUs, a memory
bound, a thread budget, seeded noise). Time is counted in intervals (steps), never in seconds.
"""

import collections
import math
import os
import random
import statistics
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from datapipes._engine.tune import HillClimber, Observation, Step
from datapipes.iter import IterableWrapper

SECONDS = 0.5  # the length of one modelled interval
#: CPU counts simulated by reporting them to the process (see ``simulated_cpus``)
SIMULATED = [2, 16, 64, 128]


def simulate_cpus(monkeypatch, n):
    """The process reports ``n`` usable CPUs to everything the library may read."""
    monkeypatch.setattr(os, "process_cpu_count", lambda: n, raising=False)  # Python 3.13
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: n)



def _climb_together(first, second, budget, rounds):
    """Two climbers, each over its model, sharing ``budget``: each observation's limit is the budget
    minus what the other holds (at least 1); their total never goes over it."""
    (ma, ta), (mb, tb) = first, second
    for _ in range(rounds):
        ma.limit = max(1, budget - tb.value)
        ta.update(ma.observe(ta.value))
        mb.limit = max(1, budget - ta.value)
        tb.update(mb.observe(tb.value))
        assert ta.value + tb.value <= budget

class Model:
    """One auto stage and its pipe, as a function of the stage's concurrency.

    Workers take ``latency`` s per item (an I/O wait: the CPU stays free), or, with ``cores``, share
    ``cores`` CPUs at ``per_core`` items/s each (every worker beyond the cores costs ``penalty`` of the
    rate: contention) and the CPUs are saturated from ``cores`` workers on. The consumer takes at most
    ``cap`` items/s (``blocked`` beyond), the source gives at most ``source`` items/s (``starved``
    beyond). RSS is ``base_mb + per_worker_mb * c``; ``memory_high`` above 90% of ``max_mb``. ``noise``
    scales each interval's rate by a seeded uniform factor in ``1 +- noise``. Attributes may be changed
    between steps (the latency, the consumer's speed, the budget).

    ``blocked`` is the share of the time the workers sat idle on a full buffer, or, with
    ``consumer_busy``, the share of the time the consumer spent on its own work (``rate / cap``): a
    cruder reading that calls the consumer the limit long before it is.
    """

    def __init__(self, latency=0.02, cap=math.inf, source=math.inf, cores=None, per_core=100.0, penalty=0.02,
                 limit=64, base_mb=100.0, per_worker_mb=0.0, max_mb=None, noise=0.0, seed=0, consumer_busy=False):
        self.consumer_busy = consumer_busy
        self.latency, self.cap, self.source = latency, cap, source
        self.cores, self.per_core, self.penalty = cores, per_core, penalty
        self.limit = limit
        self.base_mb, self.per_worker_mb, self.max_mb = base_mb, per_worker_mb, max_mb
        self.noise, self.rng = noise, random.Random(seed)

    def potential(self, c):
        """What ``c`` workers could do if neither the source nor the consumer held them back."""
        if self.cores is None:
            return c / self.latency
        return min(c, self.cores) * self.per_core * max(0.1, 1 - self.penalty * max(0, c - self.cores))

    def rate(self, c):
        """The stage's true (noise-free) throughput at ``c`` workers."""
        return min(self.potential(c), self.cap, self.source)

    def best(self):
        return max(self.rate(c) for c in range(1, self.limit + 1))

    def knee(self):
        """The fewest workers that reach the best throughput."""
        best = self.best()
        return min(c for c in range(1, self.limit + 1) if self.rate(c) >= best * (1 - 1e-9))

    def observe(self, c):
        pot, rate = self.potential(c), self.rate(c)
        starved = max(0.0, 1 - self.source / pot) if self.source < self.cap else 0.0
        blocked = max(0.0, 1 - self.cap / pot) if self.cap <= self.source else 0.0
        busy = max(0.0, 1 - starved - blocked)
        if self.consumer_busy:
            blocked = min(1.0, rate / self.cap)
        if self.noise:
            rate *= 1 + self.rng.uniform(-self.noise, self.noise)
        high = self.max_mb is not None and self.base_mb + self.per_worker_mb * c > 0.9 * self.max_mb
        return Observation(c, round(rate * SECONDS), SECONDS, busy, starved, blocked,
                           self.cores is not None and c >= self.cores, high, self.limit)


def run(climber, model, steps, change=None):
    """Feed ``steps`` intervals of ``model`` to ``climber``; ``change(step, model)`` may alter the model
    before each step. Returns the concurrency of every interval (``out[k]`` ran during step ``k``) and
    the value returned after each."""
    ran, chose = [], []
    for k in range(steps):
        if change is not None:
            change(k, model)
        c = climber.value
        obs = model.observe(c)
        ran.append(c)
        chose.append(climber.update(obs))
    return ran, chose


def settled(values):
    """The setting most used over the last 10 intervals (a probe's step aside)."""
    return collections.Counter(values[-10:]).most_common(1)[0][0]


def changes(values):
    return sum(1 for a, b in zip(values, values[1:]) if a != b)


class TestConvergence:
    def test_io_stage_climbs_to_the_knee_and_holds(self):
        model = Model(latency=0.020, cap=1000)  # 20 workers reach the consumer's 1,000 items/s
        t = HillClimber()
        ran, _ = run(t, model, 15)
        first = next(k for k, c in enumerate(ran) if model.rate(c) >= 0.97 * model.best())
        assert first <= 6, ran
        assert t.phase == "hold"
        assert model.knee() <= t.value <= model.knee() * 1.125, ran  # trimmed to within 1/8 of the knee
        assert ran[-5:] == [t.value] * 5

    @pytest.mark.parametrize("cores", [2, 4, 8, 16])
    def test_cpu_bound_stage_settles_at_the_core_count(self, cores):
        model = Model(cores=cores)
        t = HillClimber(initial=2)
        ran, _ = run(t, model, 20)
        assert t.value == cores, ran
        assert t.phase == "hold"
        # exploring costs at most one interval with too many workers (the step that did not pay) and
        # none with too few beyond the climb itself
        assert sum(1 for c in ran if c > cores) <= 1, ran
        assert sum(1 for c in ran[math.ceil(math.log2(cores)):] if c < cores) == 0, ran

    def test_oversubscribed_cpu_bound_stage_backs_off_to_the_cores(self):
        # Started with far too many threads for 2 CPUs (each one beyond costs 3%): the step up hurts
        # on saturated CPUs, so the climber searches downwards.
        model = Model(cores=2, penalty=0.03)
        t = HillClimber(initial=16)
        ran, _ = run(t, model, 20)
        assert settled(ran) == 2, ran
        assert "CPU saturated" in t.history[1].reason  # 16 -> 32 hurt: back to 16, then down

    def test_starved_stage_uses_the_fewest_workers_that_keep_up_with_its_source(self):
        model = Model(latency=0.020, source=200)  # 4 workers keep up with the source
        for initial in (2, 16, 64):
            t = HillClimber(initial=initial)
            ran, _ = run(t, model, 25)
            assert t.value == 4, (initial, ran)
            assert model.rate(t.value) == model.best()

    def test_consumer_limited_stage_trims_down(self):
        model = Model(latency=0.010, cap=300)  # 3 workers suffice
        t = HillClimber(initial=32)
        ran, _ = run(t, model, 25)
        assert t.value == 3, ran

    @pytest.mark.parametrize("latency", [0.003, 0.012, 0.020, 0.030])
    def test_a_consumer_busy_with_its_own_work_is_not_taken_for_the_limit(self, latency):
        # The consumer spends 1 ms of its own on each item: at half the knee it is already busy half
        # the time. The climb goes on while steps pay, and the hold does not oscillate.
        model = Model(latency=latency, cap=1000, consumer_busy=True)
        t = HillClimber()
        ran, _ = run(t, model, 60)
        assert model.knee() <= settled(ran) <= model.knee() * 1.125 + 1, ran
        assert changes(ran[20:]) <= 2, ran  # one probe at most
        assert sum(model.rate(c) for c in ran[20:]) / 40 >= 0.97 * model.best()

    def test_stage_at_the_maximum_holds_there(self):
        model = Model(latency=0.1)  # never enough workers
        t = HillClimber(maximum=24)
        ran, _ = run(t, model, 12)
        assert ran[-6:] == [24] * 6
        assert t.phase == "hold" and "24" in t.reason

    def test_doubling_reaches_a_far_knee_in_logarithmic_steps(self):
        model = Model(latency=0.064, cap=1000, limit=256)  # knee: 64 workers
        t = HillClimber(initial=1, maximum=256)
        ran, _ = run(t, model, 14)
        assert [c for k, c in enumerate(ran) if k == 0 or c != ran[k - 1]][:8] == [1, 2, 4, 8, 16, 32, 64, 128]
        assert t.value == 64


class TestRetuning:
    def test_latency_rising_from_2_to_20_ms_retunes_within_a_few_steps(self):
        model = Model(latency=0.002, cap=1000)
        t = HillClimber()
        ran, _ = run(t, model, 60, change=lambda k, m: setattr(m, "latency", 0.002 if k < 30 else 0.020))
        assert Model(latency=0.002, cap=1000).rate(ran[29]) == 1000  # tuned before the change
        back = next(k for k in range(30, 60) if model.rate(ran[k]) >= 0.9 * model.best())
        assert back - 30 <= 4, ran[28:45]  # detect (2 intervals), jump, climb
        assert settled(ran) == model.knee() == 20, ran

    def test_latency_falling_from_20_to_2_ms_gives_workers_back(self):
        model = Model(latency=0.020, cap=1000)
        t = HillClimber()
        ran, _ = run(t, model, 70, change=lambda k, m: setattr(m, "latency", 0.020 if k < 30 else 0.002))
        assert ran[29] >= 20
        assert sum(1 for c in ran[30:] if model.rate(c) < 1000) <= 1  # the bisection's one step too far
        assert settled(ran) <= 3, ran[28:]

    def test_faster_consumer_is_found_by_the_periodic_probe(self):
        # At the knee the stage is neither starved nor blocked and its rate does not change when the
        # consumer gets faster: only probing up finds the room.
        # Probes alternate up and down, each that finds nothing doubling the wait (10, 20, 40, 80).
        model = Model(latency=0.020, cap=1000)
        t = HillClimber(probe_every=10)
        ran, _ = run(t, model, 160, change=lambda k, m: setattr(m, "cap", 1000 if k < 20 else 2000))
        assert settled(ran[:20]) == 20
        assert model.rate(settled(ran)) >= 0.97 * 2000 and settled(ran) <= 45, ran

    def test_no_retune_without_probes_or_change(self):
        model = Model(latency=0.020, cap=1000)
        t = HillClimber(probe_every=None)
        ran, _ = run(t, model, 200)
        assert changes(ran[15:]) == 0

    def test_budget_rising_lets_a_capped_stage_climb(self):
        model = Model(latency=0.020, cap=1000, limit=4)
        t = HillClimber()
        ran, _ = run(t, model, 40, change=lambda k, m: setattr(m, "limit", 4 if k < 10 else 64))
        assert ran[5:10] == [4] * 5
        assert settled(ran) == 20, ran


class TestBounds:
    @given(limits=st.lists(st.integers(1, 80), min_size=1, max_size=60), seed=st.integers(0, 2**16),
           minimum=st.integers(1, 4), maximum=st.integers(4, 64))
    def test_never_above_the_limit_or_the_maximum(self, limits, seed, minimum, maximum):
        rng = random.Random(seed)
        model = Model(latency=rng.choice([0.002, 0.02, 0.2]), cap=rng.choice([300, 3000, math.inf]),
                      noise=0.1, seed=seed, per_worker_mb=rng.choice([0, 20]), max_mb=rng.choice([None, 600]))
        t = HillClimber(initial=rng.randint(minimum, maximum), minimum=minimum, maximum=maximum)
        for k in range(120):
            model.limit = limits[k % len(limits)]
            obs = model.observe(t.value)
            value = t.update(obs)
            assert value <= min(obs.limit, maximum)
            assert value >= min(minimum, obs.limit)
            assert value == t.value

    def test_counting_budget_shared_by_two_stages(self):
        # Two auto stages under max_threads=12: each observation's limit is the budget minus what the
        # other stage holds (at least 1). Counting the workers of every interval, the total never
        # goes over the budget.
        budget = 12
        a, b = Model(latency=0.020, cap=2000), Model(latency=0.050, cap=2000)
        ta, tb = HillClimber(), HillClimber()
        _climb_together((a, ta), (b, tb), budget, 80)

    def test_memory_high_steps_down_at_once_and_caps_later_climbs(self):
        # 40 MB a worker, 1 GB: from 21 workers RSS is above 90% of max_memory; the knee is 40.
        model = Model(latency=0.040, cap=1000, per_worker_mb=40, base_mb=100, max_mb=1000)
        t = HillClimber(initial=2)
        ran, chose = run(t, model, 60)
        highs = [k for k, c in enumerate(ran) if model.observe(c).memory_high]
        assert highs, ran
        k = highs[0]
        assert chose[k] < ran[k]  # stepped down on the first high interval
        assert max(ran[k + 1:]) < ran[k]
        assert not model.observe(settled(ran)).memory_high and settled(ran) >= 15, ran
        assert changes(ran[-20:]) <= 2  # at most one probe's step and back
        assert max(ran[k + 1:]) < ran[k]  # never back up to where memory was high

    def test_memory_high_waits_one_interval_for_a_step_to_show(self):
        t = HillClimber(initial=16, maximum=64)
        obs = lambda c: Observation(c, 100, 1.0, 1.0, 0.0, 0.0, False, True, 64)  # noqa: E731
        assert t.update(obs(16)) == 12
        assert t.update(obs(12)) == 12  # RSS lags behind a step down: one interval's grace
        assert t.update(obs(12)) == 9
        for _ in range(20):
            t.update(obs(t.value))
        assert t.value == 1 and "least" in t.reason

    def test_minimum_is_kept_unless_the_budget_is_lower(self):
        model = Model(latency=0.001, cap=100)  # one worker would do
        t = HillClimber(initial=8, minimum=3)
        ran, _ = run(t, model, 30)
        assert min(ran) == 3 and ran[-1] == 3
        model.limit = 2
        assert t.update(model.observe(3)) == 2


class TestNoise:
    @pytest.mark.parametrize("seed", range(8))
    def test_io_with_noise_gets_near_the_optimum_and_stays(self, seed):
        model = Model(latency=0.020, cap=1000, noise=0.05, seed=seed)
        t = HillClimber()
        ran, _ = run(t, model, 120)
        late = ran[40:]
        mean = sum(model.rate(c) for c in late) / len(late)
        assert mean >= 0.95 * model.best(), ran
        assert changes(late) <= 8, ran  # probes (doubling apart) and the odd correction, no oscillation
        # noise of the order of the gain asked of a step can leave a few workers too many, not many
        assert statistics.median(late) <= 2 * model.knee(), ran

    @pytest.mark.parametrize("seed", range(8))
    def test_cpu_bound_with_noise_stays_at_the_cores(self, seed):
        model = Model(cores=4, noise=0.05, seed=seed)
        t = HillClimber()
        ran, _ = run(t, model, 120)
        late = ran[20:]
        assert sum(1 for c in late if c == 4) >= 0.9 * len(late), ran
        assert sum(model.rate(c) for c in late) / len(late) >= 0.95 * model.best()

    def test_plateau_without_probes_is_still_under_noise(self):
        model = Model(latency=0.020, cap=1000, noise=0.05, seed=3)
        t = HillClimber(probe_every=None)
        ran, _ = run(t, model, 200)
        assert changes(ran[30:]) == 0, ran

    def test_periodic_probes_back_off_when_they_find_nothing(self):
        model = Model(latency=0.020, cap=1000)
        t = HillClimber(probe_every=10)
        ran, _ = run(t, model, 400)
        out = [k for k in range(20, 400) if ran[k] != settled(ran)]
        assert 3 <= len(out) <= 12, out  # probes at growing gaps: 10, 20, 40, 80, 80, ...
        assert sum(1 for c in ran[20:] if c == settled(ran)) >= 0.97 * 380


class TestMeasuring:
    def test_a_slow_stage_is_judged_over_enough_items(self):
        t = HillClimber(initial=2, min_items=16)
        obs = Observation(2, 3, 1.0, 1.0, 0.0, 0.0, False, False, 64)
        assert [t.update(obs) for _ in range(5)] == [2] * 5 and t.phase == "climb" and not t.history
        assert t.update(obs) == 4  # 18 items over 6 intervals: 3 items/s measured at 2 workers
        assert t.history[-1] == Step(2, 3.0, 4, t.reason)

    def test_samples_sum_several_intervals(self):
        t = HillClimber(samples=3, min_items=0)
        obs = Observation(2, 50, 0.5, 1.0, 0.0, 0.0, False, False, 64)
        assert [t.update(obs) for _ in range(3)] == [2, 2, 4]

    def test_an_interval_at_another_setting_is_not_measured(self):
        t = HillClimber(initial=2)
        t.update(Observation(2, 100, 1.0, 1.0, 0.0, 0.0, False, False, 64))
        assert t.value == 4
        # the engine still ran 2 workers (its change takes effect later): no verdict on 4 yet
        assert t.update(Observation(2, 100, 1.0, 1.0, 0.0, 0.0, False, False, 64)) == 4
        assert t.update(Observation(4, 200, 1.0, 1.0, 0.0, 0.0, False, False, 64)) == 8

    def test_settle_skips_intervals_after_a_change(self):
        t = HillClimber(initial=2, settle=2)
        obs = lambda c, n: Observation(c, n, 1.0, 1.0, 0.0, 0.0, False, False, 64)  # noqa: E731
        assert t.update(obs(2, 100)) == 4
        assert t.update(obs(4, 1)) == 4 and t.update(obs(4, 1)) == 4  # skipped: no verdict from them
        assert t.update(obs(4, 200)) == 8

    def test_history_and_reason_tell_the_story(self):
        t = HillClimber(keep=4)
        run(t, Model(latency=0.020, cap=1000), 15)
        assert len(t.history) == 4
        assert all(isinstance(s, Step) for s in t.history)
        assert t.history[-1].value == t.value
        assert "items/s" in t.reason
        assert repr(t).startswith("HillClimber(value=20, phase='hold'")

    def test_a_bottleneck_elsewhere_is_named_once_a_step_up_did_not_pay(self):
        for starved, blocked, where in ((0.8, 0.0, "source"), (0.0, 0.8, "consumer")):
            t = HillClimber(initial=1)
            assert t.update(Observation(1, 100, 1.0, 0.2, starved, blocked, False, False, 64)) == 2
            assert t.update(Observation(2, 100, 1.0, 0.1, starved, blocked, False, False, 64)) == 1
            assert where in t.reason and t.phase == "hold"


class TestValidation:
    @pytest.mark.parametrize("kwargs, name", [
        ({"minimum": 0}, "minimum"),
        ({"maximum": 0}, "maximum"),
        ({"initial": 100}, "initial"),
        ({"initial": 0}, "initial"),
        ({"gain": 1.0}, "gain"),
        ({"tolerance": -0.1}, "tolerance"),
        ({"retune": 2}, "retune"),
        ({"probe_every": 0}, "probe_every"),
        ({"samples": 0}, "samples"),
        ({"settle": -1}, "settle"),
        ({"keep": 0}, "keep"),
    ])
    def test_bad_options_name_themselves(self, kwargs, name):
        with pytest.raises(ValueError, match=name):
            HillClimber(**kwargs)

    @pytest.mark.parametrize("field, value", [
        ("concurrency", 0), ("items", -1), ("seconds", 0.0), ("busy", 1.5), ("starved", -0.1), ("blocked", 2.0),
        ("limit", 0),
    ])
    def test_bad_observations_name_the_field(self, field, value):
        args = dict(concurrency=2, items=10, seconds=1.0, busy=0.5, starved=0.0, blocked=0.0, cpu_saturated=False,
                    memory_high=False, limit=8)
        args[field] = value
        with pytest.raises(ValueError, match=field):
            Observation(**args)

    def test_observation_rate(self):
        assert Observation(2, 10, 0.5, 0.5, 0.0, 0.0, False, False, 8).rate == 20.0


@pytest.mark.usefixtures("no_thread_leak")
class TestWithTheEngine:
    """``concurrency="auto"`` through the engine, its tuner deciding every 10 ms: whatever it decides,
    the workers inside ``fn`` at once never outnumber ``max_threads`` (counted by ``fn`` itself)."""

    @pytest.fixture(autouse=True)
    def fast_tuner(self, monkeypatch):
        from datapipes._runtime import tuning as _tuning

        monkeypatch.setattr(_tuning.Tuner, "interval", 0.01)

    @pytest.fixture(autouse=True, params=SIMULATED, ids=lambda n: f"{n}cpus")
    def cpus(self, request, monkeypatch):
        """Every test here runs on 2, 16, 64 and 128 simulated CPUs."""
        simulate_cpus(monkeypatch, request.param)
        return request.param

    @staticmethod
    def counting():
        """``fn(x, ms)`` sleeps ``ms`` (I/O-like: more workers would help, the budget says no) and
        counts the calls in progress; one counter for every stage, as the budget is the pass's."""
        lock = threading.Lock()
        state = {"running": 0, "peak": 0}

        def fn(x, ms=1):
            with lock:
                state["running"] += 1
                state["peak"] = max(state["peak"], state["running"])
            time.sleep(ms / 1000)
            with lock:
                state["running"] -= 1
            return x

        return fn, state

    def test_one_auto_stage_stays_within_max_threads(self):
        fn, state = self.counting()
        it = iter(IterableWrapper(range(400)).map(fn, concurrency="auto").set_budget(max_threads=3))
        assert list(it) == list(range(400))
        assert 1 <= state["peak"] <= 3
        stats = [s for _, s in it.stats() if s.auto]
        assert len(stats) == 1 and 1 <= stats[0].workers <= 3

    def test_two_auto_stages_share_max_threads(self):
        fn, state = self.counting()  # one counter for both stages: the budget is the pass's
        pipe = (IterableWrapper(range(500)).map(fn, concurrency="auto")
                .map(lambda x: fn(x, ms=3), concurrency="auto", ordered=False))
        it = iter(pipe.set_budget(max_threads=6))
        assert sorted(it) == list(range(500))
        assert 2 <= state["peak"] <= 6
        # (the stages' final ``workers`` may add up to more: the first stage to finish frees its
        # threads for the other)
        stats = [s for _, s in it.stats() if s.auto]
        assert len(stats) == 2 and all(1 <= s.workers <= 6 for s in stats)

    def test_a_fixed_stage_leaves_the_rest_to_the_auto_stage(self):
        fn, state = self.counting()
        pipe = IterableWrapper(range(300)).map(fn, concurrency=2).map(fn, concurrency="auto")
        it = iter(pipe.set_budget(max_threads=5))
        assert list(it) == list(range(300))
        assert state["peak"] <= 5
        auto = [s for _, s in it.stats() if s.auto]
        assert 1 <= auto[0].workers <= 5  # 3 while the fixed stage runs; all 5 once it has finished

    @pytest.mark.timeout(3)
    def test_a_fixed_stage_started_after_the_auto_one_still_gets_its_threads(self, cpus):
        # the auto stage (upstream) starts first; the fixed stage's threads are held for it from
        # the start of the pass, so the auto stage starts at max_threads - 4 at most
        fn, state = self.counting()
        pipe = IterableWrapper(range(300)).map(fn, concurrency="auto").map(fn, concurrency=4)
        it = iter(pipe.set_budget(max_threads=6))
        first = next(it)
        auto = [s for _, s in it.stats() if s.auto][0]
        assert first == 0 and auto.workers <= 2
        assert list(it) == list(range(1, 300))
        assert state["peak"] <= 6


class TestBudgetOnManyCpus:
    """The climbers of two auto stages sharing a budget, started where the pass starts them on
    2 to 128 CPUs: whatever they decide, their workers never add up to more than the budget."""

    @pytest.mark.timeout(3)
    @pytest.mark.parametrize("cpus", SIMULATED)
    def test_without_a_budget_an_auto_stage_starts_at_most_at_16(self, cpus, monkeypatch):
        # (at the tuner's own pace: the pass ends before its first decision)
        from datapipes._runtime import tuning as _tuning

        simulate_cpus(monkeypatch, cpus)
        fn, state = TestWithTheEngine.counting()
        it = iter(IterableWrapper(range(200)).map(fn, concurrency="auto"))
        stats = it.stats()[0][1]
        assert stats.workers == min(cpus, _tuning.START_MAXIMUM)
        assert list(it) == list(range(200))
        assert state["peak"] <= _tuning.auto_maximum(cpus) <= _tuning.THREAD_MAXIMUM

    @pytest.mark.parametrize("max_threads", [2, 5, 12])
    @pytest.mark.parametrize("cpus", SIMULATED)
    def test_starts_and_steps_stay_within_the_budget(self, cpus, max_threads):
        from datapipes._runtime.tuning import Budget, Tuner

        class Auto:
            def _thread_demand(self):
                return "auto"

        a, b = Auto(), Auto()
        budget = Budget([a, b], max_threads, None, cpus=cpus)
        tuner = Tuner(a, budget)
        starts = tuner.initial(True, a), tuner.initial(True, b)
        assert 1 <= min(starts) and sum(starts) <= max_threads
        ma, mb = Model(latency=0.020, cap=4000), Model(latency=0.050, cap=4000)
        ta = HillClimber(initial=starts[0], maximum=budget.maximum)
        tb = HillClimber(initial=starts[1], maximum=budget.maximum)
        _climb_together((ma, ta), (mb, tb), max_threads, 60)
