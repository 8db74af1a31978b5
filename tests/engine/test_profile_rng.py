"""Per-item random generators (rng=) and datapipes.profiling.profile."""

import asyncio
import io
import random
import time

import numpy as np
import pytest
import torch

from datapipes.iter import IterableWrapper
from datapipes.profiling import ProfileReport, _diagnose, profile, usable_cpus
from datapipes.testing import check_datapipe


def augment(x, rng):
    time.sleep(random.random() * 0.001)  # scheduling noise: results must not depend on it
    return (x, rng.random())


@pytest.mark.usefixtures("no_thread_leak")
class TestItemRng:
    @pytest.mark.parametrize("kwargs", [{}, {"concurrency": 4}, {"concurrency": 4, "ordered": False},
                                        {"concurrency": 2, "executor": "process", "chunksize": 3}])
    def test_same_seed_same_values_whatever_the_concurrency(self, kwargs):
        serial = IterableWrapper(range(30)).map(augment, rng="python").set_seed(7)
        other = IterableWrapper(range(30)).map(augment, rng="python", **kwargs).set_seed(7)
        assert sorted(other) == list(serial)
        assert list(serial) == list(serial)  # re-iteration with the seed repeats the values

    def test_epoch_and_seed_change_values(self):
        pipe = IterableWrapper(range(10)).map(augment, rng="python", concurrency=2).set_seed(1)
        a = list(pipe)
        pipe.set_epoch(1)
        b = list(pipe)
        pipe.set_seed(2).set_epoch(0)
        c = list(pipe)
        assert a != b and a != c and [x for x, _ in a] == [x for x, _ in b] == list(range(10))

    def test_unseeded_follows_torch_manual_seed(self):
        pipe = IterableWrapper(range(5)).map(augment, rng="python", concurrency=3)
        torch.manual_seed(3)
        a = list(pipe)
        torch.manual_seed(3)
        assert list(pipe) == a

    def test_kinds_and_columns(self):
        def draw(v, rng):
            if isinstance(rng, np.random.Generator):
                return float(rng.random())
            if isinstance(rng, torch.Generator):
                return float(torch.rand(1, generator=rng))
            return rng.random()

        for kind in ("python", "numpy", "torch"):
            serial = list(IterableWrapper([(1, "a"), (2, "b")]).map(draw, input_col=0, rng=kind).set_seed(5))
            conc = list(IterableWrapper([(1, "a"), (2, "b")]).map(draw, input_col=0, rng=kind, concurrency=2).set_seed(5))
            assert serial == conc and serial[0][1] == "a" and serial[0][0] != serial[1][0]

    def test_async_fn_gets_rng(self):
        async def fn(x, rng):
            await asyncio.sleep(0)
            return rng.random()

        a = list(IterableWrapper(range(5)).map(fn, rng="python", concurrency=3).set_seed(9))
        b = list(IterableWrapper(range(5)).map(lambda x, rng: rng.random(), rng="python").set_seed(9))
        assert a == b

    def test_contract_and_errors_keep_positions(self):
        check_datapipe(IterableWrapper(range(8)).map(augment, rng="python", concurrency=2).set_seed(0))

        def fail(x, rng):
            if x == 3:
                raise ValueError(x)
            return x

        with pytest.raises(ValueError) as info:
            list(IterableWrapper(range(6)).map(fail, rng="python").set_seed(0))
        assert info.value.__notes__ == ["[datapipes] raised in stage Mapper(fail) at item 3"]
        pipe = IterableWrapper(range(6)).map(fail, rng="python", concurrency=2, on_error="skip").set_seed(0)
        assert list(pipe) == [0, 1, 2, 4, 5] and pipe.failures.recent[0].position == 3


@pytest.mark.usefixtures("no_thread_leak")
class TestProfile:
    def test_names_the_saturated_stage(self):
        def slow(x):
            time.sleep(0.002)
            return x

        out = io.StringIO()
        report = profile(IterableWrapper(range(10_000)).map(slow, concurrency=2).map(abs, concurrency=2).prefetch(4),
                         num_items=100, file=out)
        assert isinstance(report, ProfileReport) and report.items == 100
        assert [r["stage"] for r in report.stages] == ["Mapper(slow)", "Mapper(abs)", "Prefetcher(4)"]
        assert report.bottleneck == "Mapper(slow)"
        text = out.getvalue()
        assert "bottleneck: Mapper(slow)" in text and "items/s" in text and "queue fill" in text
        row = report.stages[0]
        assert row["busy_fraction"] > 0.5 and row["items_out"] >= 100 and row["workers"] == 2

    def test_slow_source_and_slow_consumer(self):
        def slow_source():
            for i in range(1000):
                time.sleep(0.001)
                yield i

        report = profile(IterableWrapper(slow_source()).map(abs, concurrency=2), num_items=50, show=False)
        assert report.bottleneck == "serial stages" and "pulling its source" in report.reason

        def slow(x):
            time.sleep(0.002)
            return x

        report = profile(IterableWrapper(range(1000)).map(abs, concurrency=2).map(slow), num_items=50, show=False)
        assert report.bottleneck == "consumer"

    def test_serial_pipe_and_bad_arguments(self):
        report = profile(IterableWrapper(range(10)).map(abs), num_items=None, show=False)
        assert report.items == 10 and report.stages == [] and report.bottleneck == "serial stages"
        with pytest.raises(ValueError, match="profile: num_items must be an int >= 1 or None, got 0"):
            profile(IterableWrapper([1]), num_items=0)

    @staticmethod
    def _row(kind, workers, busy, source_s=0.0, wait_s=0.9):
        return {"stage": "Mapper(f)", "kind": kind, "workers": workers, "busy_fraction": busy,
                "seconds": 1.0, "source_s": source_s, "wait_s": wait_s}

    def test_advice_follows_the_process_cpu_time(self):
        row = self._row("thread", 8, 0.95)
        stage, why = _diagnose([row], cpu_cores=1.9, cpus=2)
        assert stage == "Mapper(f)" and "CPU-bound" in why and "1.9 of 2 CPUs" in why
        assert "more concurrency will not help" in why
        stage, why = _diagnose([self._row("thread", 4, 0.9)], cpu_cores=1.0, cpus=4)
        assert stage == "Mapper(f)" and "holds the GIL" in why and 'executor="process"' in why
        stage, why = _diagnose([self._row("thread", 32, 0.9)], cpu_cores=0.1, cpus=4)  # sleeping on I/O
        assert "raise its concurrency" in why and "GIL" not in why and "CPU-bound" not in why
        stage, why = _diagnose([self._row("thread", 4, 0.9)], cpu_cores=1.0, cpus=1)  # one CPU: no GIL verdict
        assert "CPU-bound" in why
        stage, why = _diagnose([self._row("process", 2, 0.9)], cpu_cores=0.1, cpus=4)
        assert "up to the number of CPUs, 4" in why

    def test_threads_taking_turns_on_the_gil_are_the_bottleneck(self):
        # Two workers each busy 30% (together 60%) while the process used one of two CPUs: GIL-bound.
        stage, why = _diagnose([self._row("thread", 2, 0.3)], cpu_cores=1.0, cpus=2)
        assert stage == "Mapper(f)" and "holds the GIL" in why
        # The same shares with the process nearly idle: waiting on something else, not this stage.
        stage, why = _diagnose([self._row("thread", 2, 0.3)], cpu_cores=0.2, cpus=2)
        assert stage == "serial stages" and "no concurrent stage was saturated" in why
        # ... or with its source the limit: the serial stages upstream, not the GIL.
        stage, why = _diagnose([self._row("thread", 2, 0.3, source_s=0.8)], cpu_cores=1.0, cpus=2)
        assert stage == "serial stages" and "pulling its source" in why
        # Workers together idle most of the time: not the limit either.
        stage, why = _diagnose([self._row("thread", 4, 0.1)], cpu_cores=1.0, cpus=2)
        assert stage == "serial stages"

    @pytest.mark.skipif(usable_cpus() < 2, reason="the GIL verdict needs two CPUs")
    def test_gil_bound_threads_are_named(self):
        def spin(x):
            total = 0
            for i in range(20_000):
                total += i * x
            return total

        report = profile(IterableWrapper(range(10_000)).map(spin, concurrency=2), num_items=300, show=False)
        assert report.bottleneck == "Mapper(spin)"
        assert report.cpu_cores < 1.25 and report.cpus == usable_cpus()
        assert "holds the GIL" in report.reason, report.reason
        assert f"process CPU: {report.cpu_cores:.2f} of {report.cpus} CPUs" in report.table()
