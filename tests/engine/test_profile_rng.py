"""Per-item random generators (rng=) and datapipes.profiling.profile."""

import asyncio
import io
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from datapipes.iter import IterableWrapper
from datapipes import profiling
from datapipes.profiling import ProfileReport, _cpu_times, _diagnose, profile, usable_cpus
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
        stage, why = _diagnose([row], cpu_cores=1.9, cpus=2, machine_cores=2.0)
        assert stage == "Mapper(f)" and "CPU-bound" in why and "1.9 of 2 CPUs" in why
        assert "more concurrency will not help" in why
        stage, why = _diagnose([self._row("thread", 4, 0.9)], cpu_cores=1.0, cpus=4, machine_cores=1.1)
        assert stage == "Mapper(f)" and "holds the GIL" in why and 'executor="process"' in why
        stage, why = _diagnose([self._row("thread", 32, 0.9)], cpu_cores=0.1, cpus=4, machine_cores=0.2)  # I/O
        assert "raise its concurrency" in why and "GIL" not in why and "CPU-bound" not in why
        stage, why = _diagnose([self._row("thread", 4, 0.9)], cpu_cores=1.0, cpus=1, machine_cores=1.0)  # one CPU
        assert "CPU-bound" in why
        stage, why = _diagnose([self._row("process", 2, 0.9)], cpu_cores=0.1, cpus=4, machine_cores=2.1)
        assert "up to the number of CPUs, 4" in why

    def test_threads_taking_turns_on_the_gil_are_the_bottleneck(self):
        # Two workers each busy 30% (together 60%) while the process used one of two CPUs and the
        # other CPU stayed idle: GIL-bound.
        stage, why = _diagnose([self._row("thread", 2, 0.3)], cpu_cores=1.0, cpus=2, machine_cores=1.05)
        assert stage == "Mapper(f)" and "holds the GIL" in why
        # The same shares with the process nearly idle: waiting on something else, not this stage.
        stage, why = _diagnose([self._row("thread", 2, 0.3)], cpu_cores=0.2, cpus=2, machine_cores=0.3)
        assert stage == "serial stages" and "no concurrent stage was saturated" in why
        # ... or with its source the limit: the serial stages upstream, not the GIL.
        stage, why = _diagnose([self._row("thread", 2, 0.3, source_s=0.8)], cpu_cores=1.0, cpus=2, machine_cores=1.0)
        assert stage == "serial stages" and "pulling its source" in why
        # Workers together idle most of the time: not the limit either.
        stage, why = _diagnose([self._row("thread", 4, 0.1)], cpu_cores=1.0, cpus=2, machine_cores=1.0)
        assert stage == "serial stages"

    def test_a_machine_saturated_by_other_processes_is_not_the_gil(self):
        # Pillow decoding on 2 threads beside a CPU hog: the process got one CPU of two because the
        # hog had the other, not because fn holds the GIL.
        for busy, cpu in ((0.95, 1.0), (0.3, 1.0), (0.9, 0.8)):
            stage, why = _diagnose([self._row("thread", 2, busy)], cpu_cores=cpu, cpus=2, machine_cores=1.97)
            assert stage == "Mapper(f)", (busy, cpu)
            assert "GIL" not in why and "CPU-starved" in why, why
            assert f"other processes used {1.97 - cpu:.1f} of 2 CPUs" in why
        # Four CPUs, others using almost three of them: starved as well.
        stage, why = _diagnose([self._row("thread", 4, 0.9)], cpu_cores=1.0, cpus=4, machine_cores=3.9)
        assert stage == "Mapper(f)" and "CPU-starved" in why and "2.9 of 4 CPUs" in why
        # A saturated stage that is not on one CPU is starved too: more concurrency would not help.
        stage, why = _diagnose([self._row("thread", 8, 0.9)], cpu_cores=2.0, cpus=4, machine_cores=3.95)
        assert "CPU-starved" in why and "raise its concurrency" not in why
        # Threads taking turns on the CPU the others leave them, the process below one CPU: named too.
        stage, why = _diagnose([self._row("thread", 2, 0.4)], cpu_cores=0.5, cpus=2, machine_cores=2.0)
        assert stage == "Mapper(f)" and "CPU-starved" in why
        # The process itself keeping the CPUs busy stays CPU-bound, whatever the others did.
        stage, why = _diagnose([self._row("thread", 2, 0.95)], cpu_cores=1.8, cpus=2, machine_cores=2.0)
        assert "CPU-bound" in why and "starved" not in why
        # Idle capacity left (half a CPU or more): the process could have used it, so the GIL.
        stage, why = _diagnose([self._row("thread", 2, 0.95)], cpu_cores=1.0, cpus=2, machine_cores=1.5)
        assert "holds the GIL" in why

    def test_unknown_machine_use_claims_no_gil(self):
        stage, why = _diagnose([self._row("thread", 2, 0.95)], cpu_cores=1.0, cpus=2, machine_cores=None)
        assert stage == "Mapper(f)" and "holds the GIL" not in why
        assert "may hold the GIL" in why and "could not be read" in why
        # The other verdicts need no machine figures.
        stage, why = _diagnose([self._row("thread", 2, 0.95)], cpu_cores=1.9, cpus=2)
        assert "CPU-bound" in why

    def test_cpu_times_reads_the_usable_cpus(self):
        text = (
            "cpu  300 0 100 500 20 0 0 0 0 0\n"
            "cpu0 100 0 50 200 10 0 0 0 0 0\n"
            "cpu1 150 0 30 150 10 0 5 5 7 0\n"
            "cpu2 50 0 20 150 0 0 0 0 0 0\n"
            "intr 1 2 3\n"
        )
        # busy = user + nice + system + irq + softirq + steal; idle = idle + iowait; guest is in user.
        assert _cpu_times(text, {0, 1}) == (150 + 190, 150 + 190 + 210 + 160, 2)
        assert _cpu_times(text, None) == (150 + 190 + 70, 150 + 190 + 70 + 210 + 160 + 150, 3)
        assert _cpu_times("intr 1\n", {0}) is None

    def test_report_shows_the_machine(self, monkeypatch):
        def nap(x):
            time.sleep(0.005)  # runs for a few of /proc/stat's 10 ms ticks
            return x

        report = profile(IterableWrapper(range(20)).map(nap, concurrency=2), num_items=None, show=False)
        if os.path.exists("/proc/stat"):
            assert report.machine_cores is not None and 0 <= report.machine_cores <= report.cpus + 0.01
            assert "all processes:" in report.table()
        monkeypatch.setattr(profiling, "_read_proc_stat", lambda: None)
        report = profile(IterableWrapper(range(20)).map(nap, concurrency=2), num_items=None, show=False)
        assert report.machine_cores is None and "all processes: unknown" in report.table()

    @pytest.mark.skipif(usable_cpus() < 2, reason="the GIL verdict needs two CPUs")
    def test_gil_bound_threads_are_named(self):
        def spin(x):
            total = 0
            for i in range(20_000):
                total += i * x
            return total

        report = profile(IterableWrapper(range(10_000)).map(spin, concurrency=2), num_items=300, show=False)
        assert report.bottleneck == "Mapper(spin)", report.table()
        assert report.cpu_cores < 1.25 and report.cpus == usable_cpus()
        assert f"process CPU: {report.cpu_cores:.2f} of {report.cpus} CPUs" in report.table()
        if report.machine_cores is not None and report.cpus - report.machine_cores < 0.5:
            # Other processes (a parallel test run) kept the machine busy: the GIL cannot be told apart.
            assert "CPU-starved" in report.reason, report.table()
        else:
            assert "holds the GIL" in report.reason, report.table()

    @pytest.mark.slow
    @pytest.mark.skipif(usable_cpus() < 2 or not os.path.exists("/proc/stat"),
                        reason="needs two CPUs and Linux's /proc/stat")
    def test_pillow_decoding_beside_a_cpu_hog_is_not_called_gil_bound(self):
        from PIL import Image

        buf = io.BytesIO()
        pixels = np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buf, "JPEG", quality=90)
        jpeg = buf.getvalue()

        def decode(data):  # Pillow releases the GIL while it decodes and resizes
            with Image.open(io.BytesIO(data)) as im:
                return im.convert("RGB").resize((64, 64)).size

        # One busy-looping process on each CPU but one: with the 2 decoding threads, more runnable
        # threads than CPUs, so the process gets about one CPU (what the old rule read as the GIL).
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable_cpus() - 1)]
        try:
            time.sleep(0.3)  # the hogs are spinning
            report = profile(IterableWrapper([jpeg] * 100_000).map(decode, concurrency=2), num_items=1500,
                             show=False)
        finally:
            for hog in hogs:
                hog.kill()
            for hog in hogs:
                hog.wait(timeout=10)
        assert report.bottleneck == "Mapper(decode)", report.reason
        assert "holds the GIL" not in report.reason, report.table()
        assert "CPU-starved" in report.reason, report.table()
