"""datapipes.profile: every stage measured (serial ones included), the bottleneck named, the report
rendered as a table, as a Mermaid graph and as a Chrome trace (datapipes.profiling)."""

import io
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict

import numpy as np
import pytest

from datapipes import profiling
from datapipes._engine import StageStats
from datapipes.graph import stages, to_mermaid
from datapipes.iter import IterableWrapper
from datapipes.profiling import (ProfileReport, TraceRecorder, _bottleneck, _cpu_times, _diagnose, profile,
                                 usable_cpus)


def _others_kept_the_machine_busy(report):
    """Other processes (a parallel test run) left the machine under half a CPU idle while using half
    a CPU or more: timings on the consumer's thread then include waits for a CPU."""
    cores = report.machine_cores
    return cores is not None and report.cpus - cores < 0.5 and cores - report.cpu_cores >= 0.5


def spin(x):
    """A busy loop of about a millisecond: GIL-holding work that no amount of waiting explains."""
    total = 0
    for i in range(20_000):
        total += i
    return x


def nap(x):
    time.sleep(0.002)
    return x


def even(x):
    return x % 2 == 0


def labels(report):
    return [row["stage"] for row in report.stages]


@pytest.mark.usefixtures("no_thread_leak")
class TestEveryStage:
    def test_every_stage_appears_with_counts_that_match(self):
        pipe = IterableWrapper(range(100)).map(abs).filter(even).map(str, concurrency=2).batch(5).prefetch(2)
        report = profile(pipe, num_items=None, show=False)
        assert report.items == 10
        figures = [(r["stage"], r["kind"], r["items_in"], r["items_out"]) for r in report.stages]
        assert figures == [
            ("IterableWrapper", "serial", 100, 100),
            ("Mapper(abs)", "serial", 100, 100),
            ("Filter(even)", "serial", 100, 50),
            ("Mapper(str)", "thread", 50, 50),
            ("Batcher(5)", "serial", 50, 10),
            ("Prefetcher(2)", "prefetch", 10, 10),
        ]
        assert report.stage_objects == stages(pipe) and report.pipe is pipe
        for row in report.stages:
            assert 0.0 <= row["self_share"] <= 1.0 and row["self_s"] >= 0.0 and row["seconds"] > 0
            assert row["items_per_s"] > 0 and not row["auto"]
        assert report.stages[0]["source"] and not any(r["source"] for r in report.stages[1:])

    def test_the_table_lists_every_stage(self):
        out = io.StringIO()
        report = profile(IterableWrapper(range(40)).map(abs).map(str, concurrency=2), num_items=None, file=out)
        text = out.getvalue()
        assert text == report.table() + "\n"
        lines = text.splitlines()
        for word in ("stage", "kind", "workers", "items in", "items out", "items/s", "self", "waited", "busy",
                     "queue fill"):
            assert word in lines[0]
        rows = {line[2:].split()[0]: line[2:] for line in lines[2:5]}
        assert set(rows) == {"IterableWrapper", "Mapper(abs)", "Mapper(str)"}
        assert rows["Mapper(abs)"].split()[1:5] == ["serial", "-", "40", "40"]
        assert rows["Mapper(str)"].split()[1:5] == ["thread", "2", "40", "40"]
        assert sum(line.startswith("*") for line in lines) == (report.bottleneck_index is not None)

    def test_a_partial_run_counts_what_it_took(self):
        report = profile(IterableWrapper(range(1000)).map(abs).batch(10), num_items=3, show=False)
        assert report.items == 3
        assert [(r["items_in"], r["items_out"]) for r in report.stages][1:] == [(30, 30), (30, 3)]

    def test_serial_pipe_and_bad_arguments(self):
        report = profile(IterableWrapper(range(10)).map(abs), num_items=None, show=False)
        assert report.items == 10 and labels(report) == ["IterableWrapper", "Mapper(abs)"]
        assert report.bottleneck in ("IterableWrapper", "Mapper(abs)")
        assert report.stages[report.bottleneck_index]["stage"] == report.bottleneck
        with pytest.raises(ValueError, match="profile: num_items must be an int >= 1 or None, got 0"):
            profile(IterableWrapper([1]), num_items=0)
        with pytest.raises(ValueError, match="profile: trace must be True, False or a file path, got 3"):
            profile(IterableWrapper([1]), trace=3)
        with pytest.raises(ValueError, match="profile: max_trace_events must be an int >= 0, got -1"):
            profile(IterableWrapper([1]), trace=True, max_trace_events=-1)

    def test_auto_concurrency_is_shown(self):
        report = profile(IterableWrapper(range(60)).map(nap, concurrency="auto"), num_items=None, show=False)
        row = report.stages[-1]
        assert row["auto"] and row["concurrency"] >= 1
        text = report.table()
        assert f"{row['concurrency']} auto" in text
        assert f'Mapper(nap): concurrency="auto" chose {row["concurrency"]} workers' in text
        assert f"of {row['concurrency']} workers, auto" in report.to_mermaid()

    def test_two_concurrent_profiles_do_not_mix_figures(self):
        barrier = threading.Barrier(2, timeout=10)

        def gate(x):
            if x == 0:
                barrier.wait()  # both passes are running at once
            return x

        # items one by one: a window of 2 x 2 items, which the figures of each pass must show
        pipe = IterableWrapper(range(1000)).map(gate, concurrency=2, chunksize=1).map(abs)
        reports = {}

        def run(n):
            reports[n] = profile(pipe, num_items=n, show=False, trace=True)

        threads = [threading.Thread(target=run, args=(n,)) for n in (20, 70)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert sorted(reports) == [20, 70]
        for n, report in reports.items():
            source, gated, last = report.stages
            assert report.items == n and last["items_in"] == last["items_out"] == n
            assert n <= gated["items_out"] <= gated["items_in"] == source["items_out"] <= n + 8  # window: 2 x 2
            tasks = [e for e in report.trace["traceEvents"] if e.get("cat") == "task"]
            assert len(tasks) <= gated["items_in"] and {e["name"] for e in tasks} == {"Mapper(gate)"}


@pytest.fixture
def gil(monkeypatch):
    """The verdicts of an interpreter with a GIL, whatever this one runs with (on free-threaded CPython,
    importing an extension not marked free-threading safe turns the GIL back on for the process)."""
    monkeypatch.setattr(profiling, "_gil_enabled", lambda: True)


@pytest.mark.usefixtures("no_thread_leak")
class TestBottleneck:
    def test_names_the_saturated_stage(self):
        def run():
            out = io.StringIO()
            pipe = IterableWrapper(range(10_000)).map(nap, concurrency=2).map(abs, concurrency=2).prefetch(4)
            return profile(pipe, num_items=100, file=out), out

        report, out = run()
        if report.bottleneck != "Mapper(nap)" and report.stages[1]["busy_fraction"] < 0.5:
            # A machine loaded by a parallel test run (the 3.13t CI leg) can leave nap's workers idle
            # for a whole short profile while they wait for a CPU: profile once more.
            report, out = run()
        assert isinstance(report, ProfileReport) and report.items == 100
        assert labels(report) == ["IterableWrapper", "Mapper(nap)", "Mapper(abs)", "Prefetcher(4)"]
        assert report.bottleneck == "Mapper(nap)" and report.bottleneck_index == 1, report.table()
        text = out.getvalue()
        assert "bottleneck: Mapper(nap)" in text and "items/s" in text and "queue fill" in text
        assert "\n* Mapper(nap) " in text
        row = report.stages[1]
        assert row["busy_fraction"] > 0.5 and row["items_out"] >= 100 and row["workers"] == 2

    def test_a_serial_busy_loop_upstream_of_a_fast_concurrent_stage(self):
        report = profile(IterableWrapper(range(10_000)).map(spin).map(abs, concurrency=2), num_items=60, show=False)
        assert report.bottleneck == "Mapper(spin)" and report.bottleneck_index == 1, report.table()
        if not _others_kept_the_machine_busy(report):
            # With the CPUs taken by other processes, the consumer's thread waits for a CPU between
            # its pulls: the same stage is named, by its self time among all the stages.
            assert "serial stages upstream of Mapper(abs)" in report.reason, report.table()
        assert 'executor="process"' in report.reason

    def test_a_serial_stage_between_two_concurrent_ones(self):
        pipe = IterableWrapper(range(10_000)).map(abs, concurrency=2).map(spin).map(str, concurrency=2)
        report = profile(pipe, num_items=60, show=False)
        assert report.bottleneck == "Mapper(spin)", report.table()
        if not _others_kept_the_machine_busy(report):
            assert "between Mapper(abs) and Mapper(str)" in report.reason, report.table()

    def test_a_slow_serial_stage_downstream_of_the_concurrent_ones(self):
        report = profile(IterableWrapper(range(1000)).map(abs, concurrency=2).map(nap), num_items=50, show=False)
        assert report.bottleneck == "Mapper(nap)" and report.bottleneck_index == 2, report.table()
        assert "after Mapper(abs), on the consumer's thread" in report.reason

    def test_a_slow_source(self):
        def slow_source():
            for i in range(1000):
                time.sleep(0.001)
                yield i

        report = profile(IterableWrapper(slow_source()).map(abs, concurrency=2), num_items=50, show=False)
        assert report.bottleneck == "IterableWrapper" and "pulling its source" in report.reason, report.table()
        assert "it is a source" in report.reason and ".prefetch(n)" in report.reason

    def test_a_serial_pipe_names_its_slowest_stage(self):
        report = profile(IterableWrapper(range(1000)).map(abs).map(spin).map(str), num_items=40, show=False)
        assert report.bottleneck == "Mapper(spin)", report.table()
        assert "none is concurrent" in report.reason

    @staticmethod
    def _row(kind, workers, busy, source_s=0.0, wait_s=0.9):
        return {"stage": "Mapper(f)", "kind": kind, "workers": workers, "busy_fraction": busy,
                "seconds": 1.0, "source_s": source_s, "wait_s": wait_s}

    @staticmethod
    def _serial(label, self_s, source=False):
        return {"stage": label, "kind": "serial", "workers": 1, "busy_fraction": 0.0, "seconds": 1.0,
                "source_s": 0.0, "wait_s": 0.0, "self_s": self_s, "self_share": self_s, "source": source}

    def test_serial_rows_name_a_stage_where_the_concurrent_rows_name_none(self):
        waiting = self._row("thread", 2, 0.1, source_s=0.8, wait_s=0.1)
        rows = [self._serial("IterableWrapper", 0.05, source=True), self._serial("Mapper(g)", 0.7), waiting]
        assert _bottleneck(rows, cpu_cores=1.0, cpus=2, machine_cores=1.0)[:2] == (1, "Mapper(g)")
        # The same figures without serial rows (a pass that was not observed): the serial stages as a whole.
        assert _diagnose([waiting], cpu_cores=1.0, cpus=2, machine_cores=1.0)[0] == "serial stages"
        # Time spread over several serial stages, none with a fifth of the run: no single one is named.
        rows = [self._serial("IterableWrapper", 0.15, source=True), self._serial("Mapper(g)", 0.15),
                self._serial("Mapper(h)", 0.15), waiting]
        assert _bottleneck(rows, cpu_cores=1.0, cpus=2, machine_cores=1.0)[:2] == (None, "serial stages")
        # The consumer's own work, not a serial stage's: "consumer".
        idle = self._row("thread", 2, 0.1, source_s=0.0, wait_s=0.1)
        rows = [self._serial("IterableWrapper", 0.01, source=True), idle, self._serial("Mapper(g)", 0.1)]
        assert _bottleneck(rows)[:2] == (None, "consumer")
        rows[2] = self._serial("Mapper(g)", 0.8)
        assert _bottleneck(rows)[:2] == (2, "Mapper(g)")

    @pytest.mark.usefixtures("gil")
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

    @pytest.mark.usefixtures("gil")
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

    @pytest.mark.usefixtures("gil")
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
        # Waited on 99% of the time, its workers busy 18%, nothing upstream slow, the process given 0.4
        # of 2 CPUs (a 3.13t CI leg beside three test workers): its threads waited for a CPU.
        starved_row = self._row("thread", 2, 0.18, source_s=0.0, wait_s=0.99)
        rows = [self._serial("IterableWrapper", 0.0, source=True), starved_row]
        k, stage, why = _bottleneck(rows, cpu_cores=0.39, cpus=2, machine_cores=1.98)
        assert (k, stage) == (1, "Mapper(f)") and "CPU-starved" in why and "waited 99%" in why, why
        # The same figures on a machine with idle CPUs: no stage is named (nothing here is the limit).
        assert _bottleneck(rows, cpu_cores=0.39, cpus=2, machine_cores=0.5)[1] == "serial stages"
        # Starved, but not waited on: the verdict stays with the stages.
        idle = self._row("thread", 2, 0.18, source_s=0.3, wait_s=0.3)
        assert _bottleneck([idle], cpu_cores=0.39, cpus=2, machine_cores=1.98)[1] == "serial stages"
        # The process itself keeping the CPUs busy stays CPU-bound, whatever the others did.
        stage, why = _diagnose([self._row("thread", 2, 0.95)], cpu_cores=1.8, cpus=2, machine_cores=2.0)
        assert "CPU-bound" in why and "starved" not in why
        # Idle capacity left (half a CPU or more): the process could have used it, so the GIL.
        stage, why = _diagnose([self._row("thread", 2, 0.95)], cpu_cores=1.0, cpus=2, machine_cores=1.5)
        assert "holds the GIL" in why

    @pytest.mark.usefixtures("gil")
    def test_unknown_machine_use_claims_no_gil(self):
        stage, why = _diagnose([self._row("thread", 2, 0.95)], cpu_cores=1.0, cpus=2, machine_cores=None)
        assert stage == "Mapper(f)" and "holds the GIL" not in why
        assert "may hold the GIL" in why and "could not be read" in why
        # The other verdicts need no machine figures.
        stage, why = _diagnose([self._row("thread", 2, 0.95)], cpu_cores=1.9, cpus=2)
        assert "CPU-bound" in why

    def test_without_a_gil_threads_taking_turns_are_serialised_by_fn(self, monkeypatch):
        # Free-threaded CPython with the GIL disabled: one CPU of two used with the other idle cannot be
        # the GIL, so the advice names what can (a lock inside fn).
        monkeypatch.setattr(profiling, "_gil_enabled", lambda: False)
        stage, why = _diagnose([self._row("thread", 2, 0.95)], cpu_cores=1.0, cpus=2, machine_cores=1.05)
        assert stage == "Mapper(f)" and "holds the GIL" not in why
        assert "GIL is disabled" in why and "serialises the threads" in why and 'executor="process"' in why
        stage, why = _diagnose([self._row("thread", 2, 0.95)], cpu_cores=1.0, cpus=2, machine_cores=None)
        assert "may hold the GIL" not in why and "may serialise the threads" in why and "could not be read" in why

    def test_the_gil_state_is_read_when_the_verdict_is_given(self, monkeypatch):
        monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
        assert profiling._gil_enabled() is False
        monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True)
        assert profiling._gil_enabled() is True
        monkeypatch.delattr(sys, "_is_gil_enabled")  # CPython before 3.13: always a GIL
        assert profiling._gil_enabled() is True

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
        def tick(x):
            time.sleep(0.005)  # runs for a few of /proc/stat's 10 ms ticks
            return x

        report = profile(IterableWrapper(range(20)).map(tick, concurrency=2), num_items=None, show=False)
        if os.path.exists("/proc/stat"):
            assert report.machine_cores is not None and 0 <= report.machine_cores <= report.cpus + 0.01
            assert "all processes:" in report.table()
        monkeypatch.setattr(profiling, "_read_proc_stat", lambda: None)
        report = profile(IterableWrapper(range(20)).map(tick, concurrency=2), num_items=None, show=False)
        assert report.machine_cores is None and "all processes: unknown" in report.table()

    @pytest.mark.skipif(usable_cpus() < 2, reason="the GIL verdict needs two CPUs")
    def test_gil_bound_threads_are_named(self):
        report = profile(IterableWrapper(range(10_000)).map(spin, concurrency=2), num_items=300, show=False)
        assert report.bottleneck == "Mapper(spin)", report.table()
        if not profiling._gil_enabled():
            # Free-threaded CPython with the GIL off: spin runs on both CPUs at once; no GIL verdict.
            assert "GIL" not in report.reason or "GIL is disabled" in report.reason, report.table()
            return
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

        if not profiling._gil_enabled():
            # What this checks is a GIL build's verdict (starved CPUs must not read as the GIL). With
            # the GIL off no GIL verdict is given (see
            # test_without_a_gil_threads_taking_turns_are_serialised_by_fn), and on CI's loaded
            # free-threaded leg the rate of this pass was once set by its serial stages instead.
            pytest.skip("the GIL is disabled (free-threaded CPython): no GIL verdict to tell apart")

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


def _stats(label, kind, items_out, self_s, workers=1, capacity=0, busy=0.0, wait_s=0.0, auto=False):
    """A finished StageStats of a one-second pass, made by hand."""
    stats = StageStats(label, kind, workers, capacity, auto=auto)
    stats.begin([busy])
    stats.finish(items_out, items_out, 0, 0, 0, 0.0, wait_s)
    stats.started, stats.stopped = 100.0, 101.0
    stats.self_s = self_s
    return stats


def _report(pipe, stats, bottleneck="", index=None):
    """A ProfileReport of ``pipe`` from hand-made statistics (one per stage, sources first), as
    profile() builds it from a pass's."""
    rows = []
    for s in stats:
        row = s.as_dict()
        waited = 0.0 if s.kind == "serial" else row["wait_s"]
        row.update(self_share=row["self_s"] - waited, wait_share=waited, source=False)
        rows.append(row)
    return ProfileReport(rows[-1]["items_out"], 1.0, rows[-1]["items_out"], rows, bottleneck, "why", 1.0, 2, None,
                         index, pipe=pipe, stage_objects=stages(pipe))


class TestMermaid:
    def test_to_mermaid_without_annotate_is_unchanged(self):
        pipe = IterableWrapper([1, 2]).map(str).concat(IterableWrapper([3])).batch(2)
        assert to_mermaid(pipe) == to_mermaid(pipe, annotate=None) == (
            'flowchart LR\n'
            '    s0["IterableWrapper"] --> s1["Mapper(str)"]\n'
            '    s1 --> s3["Concater"]\n'
            '    s2["IterableWrapper"] --> s3\n'
            '    s3 --> s4["Batcher(2)"]'
        )
        notes = to_mermaid(pipe, annotate=lambda s: 'say "hi"' if type(s).__name__ == "Mapper" else None)
        assert notes.splitlines()[1] == '''    s0["IterableWrapper"] --> s1["Mapper(str)<br/>say 'hi'"]'''
        assert to_mermaid(IterableWrapper([]), annotate=lambda s: "x") == 'flowchart LR\n    s0["IterableWrapper<br/>x"]'

    def test_nodes_carry_their_figures_and_the_bottleneck_is_highlighted(self):
        pipe = IterableWrapper(range(10)).map(abs).map(str, concurrency=4).prefetch(2)
        report = _report(pipe, [
            _stats("IterableWrapper", "serial", 5000, 0.05),
            _stats("Mapper(abs)", "serial", 5000, 0.62),
            _stats("Mapper(str)", "thread", 5000, 0.31, workers=4, capacity=8, busy=0.4, wait_s=0.3, auto=True),
            _stats("Prefetcher(2)", "prefetch", 1234, 0.9, capacity=2, busy=0.5, wait_s=0.88),
        ], bottleneck="Mapper(abs)", index=1)
        assert report.to_mermaid() == (
            'flowchart LR\n'
            '    s0["IterableWrapper<br/>5,000 items/s<br/>self 5%"] --> s1["Mapper(abs)<br/>5,000 items/s<br/>self 62%"]\n'
            '    s1 --> s2["Mapper(str)<br/>5,000 items/s<br/>self 1%, waited 30%<br/>busy 10% of 4 workers, auto"]\n'
            '    s2 --> s3["Prefetcher(2)<br/>1,234 items/s<br/>self 2%, waited 88%<br/>busy 50%"]\n'
            f'    classDef bottleneck {profiling._HIGHLIGHT}\n'
            '    class s1 bottleneck'
        )

    def test_a_consumer_bottleneck_gets_a_node(self):
        pipe = IterableWrapper(range(10)).map(str, concurrency=2)
        report = _report(pipe, [_stats("IterableWrapper", "serial", 9.5, 0.0),
                                _stats("Mapper(str)", "thread", 9.5, 0.1, workers=2, capacity=4)], "consumer")
        chart = report.to_mermaid()
        assert '"IterableWrapper<br/>9.5 items/s<br/>self 0%"' in chart
        assert chart.endswith('    s1 --> consumer(["consumer: the code reading the pipe"])\n'
                              f'    classDef bottleneck {profiling._HIGHLIGHT}\n    class consumer bottleneck')
        with pytest.raises(ValueError, match="to_mermaid: this report holds no pipe"):
            ProfileReport(1, 1.0, 1.0).to_mermaid()

    @pytest.mark.usefixtures("no_thread_leak")
    def test_a_profiled_pipe_shows_every_stage_with_its_figures(self):
        pipe = IterableWrapper(range(60)).map(spin).batch(4).map(len, concurrency=2)
        report = profile(pipe, num_items=None, show=False)
        chart = report.to_mermaid()
        for k, row in enumerate(report.stages):
            node = f's{k}["{row["stage"]}<br/>{profiling._rate(row["items_per_s"])} items/s<br/>self ' \
                   f'{row["self_share"]:.0%}'
            assert node in chart, (node, chart)
        assert "busy" in chart and report.bottleneck == "Mapper(spin)", report.table()
        assert chart.endswith("\n    class s1 bottleneck")


def _check_trace(trace):
    """Assert ``trace`` is valid Chrome trace-event JSON as we write it; returns its events."""
    assert set(trace) == {"traceEvents", "displayTimeUnit", "otherData"} and trace["displayTimeUnit"] == "ms"
    events = json.loads(json.dumps(trace))["traceEvents"]
    named = set()
    last = {}
    for e in events:
        assert {"name", "ph", "pid", "tid", "ts"} <= set(e), e
        assert e["ph"] in ("X", "C", "M") and isinstance(e["ts"], (int, float)) and isinstance(e["tid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "thread_sort_index") and "args" in e
            if e["name"] == "thread_name":
                named.add(e["tid"])
            continue
        assert e["ts"] >= last.get(e["tid"], 0.0), ("ts goes back on a thread", e)
        last[e["tid"]] = e["ts"]
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["tid"] in named
        else:
            assert all(isinstance(v, (int, float)) for v in e["args"].values()) and e["args"]
    # Spans on one track nest or follow each other (never overlap partly).
    spans = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            spans[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for track in spans.values():
        open_ends = []
        for start, end in track:
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + 1e-3, "spans overlap on one track"
            open_ends.append(end)
    return events


@pytest.mark.usefixtures("no_thread_leak")
class TestTrace:
    def test_the_trace_file_is_valid_trace_event_json(self, tmp_path):
        path = tmp_path / "trace.json"
        pipe = IterableWrapper(range(60)).map(abs).map(nap, concurrency=3).batch(6)
        report = profile(pipe, num_items=None, show=False, trace=str(path))
        with open(path) as f:
            trace = json.load(f)
        assert trace == report.trace
        events = _check_trace(trace)
        stage_spans = {e["name"]: e for e in events if e.get("cat") == "stage"}
        assert set(stage_spans) == {"IterableWrapper", "Mapper(abs)", "Mapper(nap)", "Batcher(6)"}
        assert stage_spans["Batcher(6)"]["args"] == {"kind": "serial", "items_in": 60, "items_out": 10,
                                                     "failures": 0}
        tasks = [e for e in events if e.get("cat") == "task"]
        assert sorted(e["args"]["item"] for e in tasks) == list(range(60))
        assert {e["name"] for e in tasks} == {"Mapper(nap)"}
        threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
        assert {threads[e["tid"]] for e in tasks} <= {f"datapipes Mapper(nap) worker {i}" for i in range(3)}
        counters = {e["name"] for e in events if e["ph"] == "C"}
        assert {"Mapper(nap) items/s", "Batcher(6) items/s", "Mapper(nap) workers"} <= counters
        assert trace["otherData"]["dropped_events"] == 0
        assert [e for e in events if e["name"] == "process_name"][0]["args"]["name"].startswith(
            "datapipes.profile: IterableWrapper -> Mapper(abs)")

    def test_save_trace_and_its_errors(self, tmp_path):
        report = profile(IterableWrapper(range(10)).map(abs, concurrency=2), num_items=None, show=False, trace=True)
        report.save_trace(tmp_path / "t.json")
        _check_trace(json.loads((tmp_path / "t.json").read_text()))
        with pytest.raises(ValueError, match=r"save_trace: this report holds no trace; run profile\(pipe, trace=True\)"):
            profile(IterableWrapper([1]), show=False).save_trace(tmp_path / "u.json")
        assert not (tmp_path / "u.json").exists()

    def test_the_trace_is_bounded(self):
        report = profile(IterableWrapper(range(100)).map(abs, concurrency=2), num_items=None, show=False,
                         trace=True, max_trace_events=5)
        events = _check_trace(report.trace)
        assert len([e for e in events if e.get("cat") in ("task", "counter")]) == 5
        assert len([e for e in events if e.get("cat") == "stage"]) == 2  # stage spans are always kept
        assert report.trace["otherData"]["max_events"] == 5
        assert report.trace["otherData"]["dropped_events"] >= 100 - 5

    def test_overlapping_async_tasks_get_lanes(self):
        import asyncio

        async def fetch(x):
            await asyncio.sleep(0.002)
            return x

        recorder = TraceRecorder(interval=None)
        pipe = IterableWrapper(range(40)).map(fetch, concurrency=4).add_hook(recorder)
        assert list(pipe) == list(range(40))
        events = _check_trace(recorder.trace())
        tasks = [e for e in events if e.get("cat") == "task"]
        assert len(tasks) == 40
        names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
        lanes = {names[e["tid"]] for e in tasks}
        assert 2 <= len(lanes) <= 8 and all(n.startswith("Mapper(fetch) tasks on ") for n in lanes), lanes

    def test_recorder_by_hand(self):
        """The hooks called directly, as a pass calls them, with hand-made statistics."""
        recorder = TraceRecorder(interval=None, max_events=100)
        threaded = StageStats("Mapper(f)", "thread", 2, 4)
        looped = StageStats("Mapper(f)", "async", 1, 2)  # the same label: numbered in the trace
        for s in (threaded, looped):
            s.begin([0.0])
            recorder.stage_start(s)
        recorder.task_start(threaded, 0)
        recorder.task_end(threaded, 0, False)
        recorder.task_end(threaded, 7, True)  # started before the recorder was attached: ignored
        for position in range(3):  # three tasks at once on one thread (an event loop)
            recorder.task_start(looped, position)
        for position in range(3):
            recorder.task_end(looped, position, True)
        for s in (threaded, looped):
            s.finish(1, 1, 0, 0, 0)
            recorder.stage_stop(s)
        recorder.periodic([(None, threaded), (None, looped)])
        events = _check_trace(recorder.trace(title="by hand"))
        me = threading.get_native_id()
        tasks = [e for e in events if e.get("cat") == "task"]
        assert [(e["name"], e["tid"] == me, e["args"]) for e in tasks[:1]] == [
            ("Mapper(f)", True, {"item": 0, "failed": True})]
        assert len({e["tid"] for e in tasks[1:]}) == 3 and {e["name"] for e in tasks[1:]} == {"Mapper(f) #2"}
        assert {e["name"] for e in events if e.get("cat") == "stage"} == {"Mapper(f)", "Mapper(f) #2"}
        running = [e["args"]["tasks running"] for e in events if e["name"].endswith("tasks running")]
        assert running == [0.0, 0.0]
        assert recorder.trace(stats=[looped])["traceEvents"][0]["args"] == {"name": "datapipes"}
        assert {e["name"] for e in recorder.events(stats=[threaded]) if e["ph"] == "X"} == {"Mapper(f)"}

    def test_lanes_are_bounded_by_the_stage_workers(self):
        recorder = TraceRecorder(interval=None)
        stats = StageStats("Mapper(g)", "process", 2, 4)
        for position in range(20):  # a process stage hands many items over before the first result
            recorder.task_start(stats, position)
        for position in range(20):
            recorder.task_end(stats, position, True)
        assert len([e for e in recorder.events() if e.get("cat") == "task"]) == 8 and recorder.dropped == 12

    def test_recorder_arguments(self):
        with pytest.raises(TypeError, match="TraceRecorder: interval must be a number of seconds or None, got str"):
            TraceRecorder(interval="1")
        with pytest.raises(ValueError, match=r"TraceRecorder: interval must be > 0 \(or None\), got 0"):
            TraceRecorder(interval=0)
        with pytest.raises(ValueError, match="TraceRecorder: max_events must be an int >= 0, got 1.5"):
            TraceRecorder(max_events=1.5)
