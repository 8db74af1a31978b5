"""Hooks, live statistics and periodic reports (datapipes.hooks, datapipes._runtime.observe)."""

from __future__ import annotations

import asyncio
import logging
import pickle
import threading
from collections import Counter

import pytest

from datapipes import DataLoader
from datapipes.hooks import Hook, StatsReporter, format_stats
from datapipes.iter import IterableWrapper
from datapipes.testing import check_resume

WAIT = 10.0  # seconds any blocking step of a test may take at most


class Recorder(Hook):
    """Records every call, thread-safely."""

    def __init__(self, interval: float | None = None) -> None:
        self.interval = interval
        self.events: list[tuple] = []
        self.lock = threading.Lock()

    def _add(self, *event) -> None:
        with self.lock:
            self.events.append(event)

    def stage_start(self, stats):
        self._add("start", stats.label)

    def stage_stop(self, stats):
        self._add("stop", stats.label, stats.items_out)

    def task_start(self, stats, position):
        self._add("task_start", stats.label, position)

    def task_end(self, stats, position, ok):
        self._add("task_end", stats.label, position, ok)

    def periodic(self, stats):
        self._add("periodic", [(s.label, s.items_out) for _, s in stats])

    def of(self, kind: str) -> list[tuple]:
        return [e for e in self.events if e[0] == kind]


def square(x):
    return x * x


async def async_square(x):
    await asyncio.sleep(0)
    return x * x


def fails_on_3(x):
    if x == 3:
        raise ValueError("three")
    return x


@pytest.mark.parametrize("kw", [
    dict(concurrency=3),
    dict(concurrency=3, ordered=False),
    dict(concurrency=2, executor="process"),
], ids=["threads", "threads-unordered", "processes"])
def test_task_hooks_fire_in_order_with_counts(kw):
    rec = Recorder()
    pipe = IterableWrapper(range(12)).map(square, **kw).add_hook(rec, stage_only=True)
    assert sorted(pipe) == [x * x for x in range(12)]
    events = rec.events
    assert events[0] == ("start", "Mapper(square)")
    assert events[-1] == ("stop", "Mapper(square)", 12)
    starts = {e[2] for e in rec.of("task_start")}
    ends = {e[2]: e[3] for e in rec.of("task_end")}
    assert starts == set(range(12)) and ends == {i: True for i in range(12)}
    for pos in range(12):  # each task starts before it ends
        assert events.index(("task_start", "Mapper(square)", pos)) < events.index(("task_end", "Mapper(square)", pos, True))


def test_task_hooks_async():
    rec = Recorder()
    assert sorted(IterableWrapper(range(10)).map(async_square, concurrency=4).add_hook(rec)) == [x * x for x in range(10)]
    assert len(rec.of("task_start")) == len(rec.of("task_end")) == 10
    assert [e[1] for e in rec.of("start")] == ["Mapper(async_square)", "IterableWrapper"]


def test_task_end_reports_failures():
    rec = Recorder()
    pipe = IterableWrapper(range(6)).map(fails_on_3, concurrency=2, on_error="skip").add_hook(rec)
    assert list(pipe) == [0, 1, 2, 4, 5]
    assert ("task_end", "Mapper(fails_on_3)", 3, False) in rec.events
    assert len(rec.of("task_end")) == 6


def test_serial_stages_start_and_stop_once_with_counts():
    rec = Recorder()
    pipe = IterableWrapper(range(10)).map(square).filter(lambda x: x % 2 == 0).add_hook(rec)
    assert list(pipe) == [0, 4, 16, 36, 64]
    assert Counter(e[1] for e in rec.of("start")) == {"Filter(<lambda>)": 1, "Mapper(square)": 1, "IterableWrapper": 1}
    stops = {e[1]: e[2] for e in rec.of("stop")}
    assert stops == {"IterableWrapper": 10, "Mapper(square)": 10, "Filter(<lambda>)": 5}
    assert not rec.of("task_start")  # serial stages run no tasks


def test_stage_only_hook_watches_one_stage():
    rec = Recorder()
    source = IterableWrapper(range(3))
    pipe = source.map(square).add_hook(rec, stage_only=True)
    list(pipe)
    assert {e[1] for e in rec.events} == {"Mapper(square)"}


def test_hook_on_an_upstream_stage_watches_it_and_its_sources_only():
    rec = Recorder()
    pipe = IterableWrapper(range(3)).map(square).add_hook(rec).filter(bool)
    list(pipe)
    assert {e[1] for e in rec.events} == {"Mapper(square)", "IterableWrapper"}


def test_closed_pass_stops_its_stages():
    rec = Recorder()
    it = iter(IterableWrapper(range(100)).map(square, concurrency=2).add_hook(rec))
    assert next(it) == 0
    it.close()
    assert {e[1] for e in rec.of("stop")} == {"Mapper(square)", "IterableWrapper"}


def test_hooks_travel_with_a_pickled_pipe():
    pipe = IterableWrapper(range(3)).add_hook(StatsReporter(5.0))
    copy = pickle.loads(pickle.dumps(pipe))
    assert isinstance(copy._hooks[0][0], StatsReporter) and copy._hooks[0][0].interval == 5.0


def test_add_hook_validates_and_remove_hook():
    pipe = IterableWrapper(range(3))
    with pytest.raises(TypeError, match="datapipes.hooks.Hook"):
        pipe.add_hook(print)
    rec = Recorder()
    assert pipe.add_hook(rec) is pipe and pipe.add_hook(rec) is pipe
    assert len(pipe._hooks) == 1
    pipe.remove_hook(rec)
    with pytest.raises(ValueError, match="not attached"):
        pipe.remove_hook(rec)
    with pytest.raises(ValueError, match="interval"):
        StatsReporter(0)


def test_unobserved_pass_wraps_nothing():
    pipe = IterableWrapper(range(3)).map(square)
    it = iter(pipe)
    assert it.pass_.observer is None
    assert list(it) == [0, 1, 4] and it.stats() == []


# -- live statistics --------------------------------------------------------------------------------


def test_live_counters_increase_mid_pass():
    gate = threading.Event()

    def held(x):
        if x >= 20:
            gate.wait(WAIT)
        return x

    it = iter(IterableWrapper(range(40)).map(held, concurrency=2))
    for _ in range(10):
        next(it)
    (_, stats), = it.stats()
    assert stats.running and stats.items_out == 10 and stats.items_in >= 10
    for _ in range(5):
        next(it)
    assert stats.items_out == 15 and stats.stopped is None
    gate.set()
    assert len(list(it)) == 25
    assert stats.items_out == 40 and stats.stopped is not None


def test_live_serial_counters_in_an_observed_pass():
    pipe = IterableWrapper(range(10)).map(square).add_hook(Hook())
    it = iter(pipe)
    next(it), next(it), next(it)
    figures = {s.label: s.items_out for _, s in it.stats()}
    assert figures == {"Mapper(square)": 3, "IterableWrapper": 3}
    list(it)
    assert {s.label: (s.items_in, s.items_out) for _, s in it.stats()} == {
        "Mapper(square)": (10, 10), "IterableWrapper": (10, 10)}


def test_two_concurrent_passes_keep_separate_statistics():
    # items one by one (a window of 2 x 2 items): each pass has pulled only a few more than it yielded
    pipe = IterableWrapper(range(30)).map(square, concurrency=2, chunksize=1).add_hook(Hook())
    a, b = iter(pipe), iter(pipe)
    for _ in range(5):
        next(a)
    for _ in range(12):
        next(b)
    sa = {s.label: s for _, s in a.stats()}
    sb = {s.label: s for _, s in b.stats()}
    assert sa["Mapper(square)"] is not sb["Mapper(square)"]
    assert sa["Mapper(square)"].items_out == 5 and sb["Mapper(square)"].items_out == 12
    assert sa["IterableWrapper"].items_out < sb["IterableWrapper"].items_out
    a.close(), b.close()


def test_self_time_excludes_upstream():
    import time as _time

    def slow(x):
        _time.sleep(0.002)
        return x

    it = iter(IterableWrapper(range(20)).map(slow).map(square).add_hook(Hook()))
    list(it)
    figures = {s.label: s.self_s for _, s in it.stats()}
    assert figures["Mapper(slow)"] > 20 * 0.002 * 0.9
    assert figures["Mapper(square)"] < figures["Mapper(slow)"] / 4


# -- periodic reports --------------------------------------------------------------------------------


class Gate(Hook):
    """Releases the pipe after ``n`` periodic calls."""

    def __init__(self, n: int) -> None:
        self.interval = 0.01
        self.calls = 0
        self.n = n
        self.reached = threading.Event()
        self.seen: list[int] = []

    def periodic(self, stats):
        self.calls += 1
        self.seen.append(sum(s.items_out for _, s in stats))
        if self.calls >= self.n:
            self.reached.set()


def test_periodic_hook_runs_while_the_pass_runs_and_once_at_the_end():
    gate = Gate(3)

    def wait_for_reports(x):
        if x == 5:
            assert gate.reached.wait(WAIT)
        return x

    assert list(IterableWrapper(range(10)).map(wait_for_reports).add_hook(gate)) == list(range(10))
    assert gate.calls >= 4  # at least 3 while it ran, one at the end
    assert gate.seen[-1] == 20  # the end: both stages' 10 items


def test_stats_reporter_logs_a_table(caplog):
    gate = Gate(2)

    def wait(x):
        if x == 2:
            assert gate.reached.wait(WAIT)
        return x

    pipe = IterableWrapper(range(5)).map(wait).add_hook(gate).add_hook(StatsReporter(0.01))
    with caplog.at_level(logging.INFO, logger="datapipes"):
        list(pipe)
    tables = [r.getMessage() for r in caplog.records if "stage statistics" in r.getMessage()]
    assert len(tables) >= 2
    assert "Mapper(wait)" in tables[-1] and "IterableWrapper" in tables[-1]


def test_dataloader_report_stats_interval(caplog):
    loader = DataLoader(IterableWrapper(range(20)).map(square, concurrency=2), batch_size=5, report_stats_interval=30)
    with caplog.at_level(logging.INFO, logger="datapipes"):
        assert len(list(loader)) == 4
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "Mapper(square)" in text and "Batcher(5)" in text


def test_format_stats_lists_sources_first():
    rec = Recorder()
    it = iter(IterableWrapper(range(3)).map(square).add_hook(rec))
    list(it)
    lines = format_stats(it.stats()).splitlines()
    assert lines[1].startswith("IterableWrapper") and lines[2].startswith("Mapper(square)")


def test_an_observed_shuffle_over_a_list_saves_positions_and_resumes_exactly():
    # the hook wraps the source's iterator; the shuffle still reads its position, not a buffer of items
    class Quiet(Hook):
        def periodic(self, stats):
            pass

    def build():
        pipe = IterableWrapper(list(range(500))).shuffle(buffer_size=64).set_seed(1).map(abs)
        pipe.add_hook(Quiet())
        return pipe

    full = check_resume(build, [0, 1, 100, 499, 500])
    it = iter(build())
    [next(it) for _ in range(100)]
    assert sorted(it.state_dict()["stages"]["1:Shuffler"]) == ["phase", "read", "rng"]
    it.close()
    assert sorted(full) == list(range(500))
