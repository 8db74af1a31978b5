"""Fault injection on the engine: a failing pass releases everything at once, shutdown is quiet
whenever it happens, async deadlines hold against a fn that ignores cancellation or blocks the loop,
and skipping one cached exception object costs the same every time."""

import asyncio
import gc
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from datapipes._engine import aio, live_worker_pids
from datapipes._engine.aio import AsyncWorkers, LoopRef
from datapipes.iter import IterableWrapper

from engine_helpers import no_child_left  # noqa: F401 - a fixture
from helpers import Guarded, error_of_pass, gc_off  # noqa: F401 - gc_off is a fixture


class Boom(Exception):
    pass


def fail_at(k):
    def fn(x):
        if x == k:
            raise Boom(x)
        return x

    return fn


def ident(x):
    return x


async def aident(x):
    return x


def _datapipes_threads():
    return [t for t in threading.enumerate() if t.name.startswith("datapipes") and t.is_alive()]


def _gone(threads, timeout=3.0):
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


UPSTREAMS = {
    "threads": lambda src: src.map(ident, concurrency=4),
    "async": lambda src: src.map(aident, concurrency=4),
    "prefetch": lambda src: src.map(ident, concurrency=3).prefetch(4),
    "batch-unbatch": lambda src: src.map(ident, concurrency=4).batch(3).unbatch(),
    "shuffle": lambda src: src.map(ident, concurrency=4).shuffle(buffer_size=8),
    "zip": lambda src: src.map(ident, concurrency=2).zip(IterableWrapper(range(10**6)).map(ident, concurrency=2))
    .map(lambda p: p[0]),
    "unordered": lambda src: src.map(ident, concurrency=4, ordered=False),
}


def _bad(x):
    if isinstance(x, list) or x >= 20:
        raise Boom(x)
    return x


def _bad_key(x):
    if x >= 20:
        raise Boom(x)
    return x % 3


FAILING_STAGES = {
    "filter": lambda p: p.filter(lambda x: _bad(x) != 0),
    "flatmap": lambda p: p.flatmap(lambda x: [_bad(x)]),
    "groupby": lambda p: p.groupby(_bad_key, group_size=2),
    "bucketbatch": lambda p: p.bucketbatch(batch_size=2, sort_key=lambda b: [_bad(x) for x in b]),
    "batch-wrapper": lambda p: p.batch(2, wrapper_class=_bad),
    "collate": lambda p: p.batch(2).collate(collate_fn=_bad),
    "mux": lambda p: p.mux(IterableWrapper(range(100)).map(_bad)),
    "fork": lambda p: p.fork(2)[0].map(_bad),
    "demux": lambda p: p.demux(2, lambda x: _bad(x) % 2)[0],
    "enumerate": lambda p: p.enumerate().map(lambda t: _bad(t[1])),
    "header": lambda p: p.header(1000).map(_bad),
    "cycle": lambda p: p.cycle(2).map(_bad),
    "sharding": lambda p: p.sharding_filter().map(_bad),
    "in_memory_cache": lambda p: p.in_memory_cache().map(_bad),
    "concat": lambda p: IterableWrapper(range(5)).concat(p).map(_bad),
    "zip": lambda p: p.zip(IterableWrapper(range(1000)).map(_bad)),
}


@pytest.mark.usefixtures("gc_off")
class TestFailingPassReleasesUpstream:
    """Regression: with the cyclic GC off, a failing pass kept its upstream alive (threads, loop,
    source) for as long as the consumer held the exception."""

    @pytest.mark.parametrize("upstream", sorted(UPSTREAMS))
    @pytest.mark.parametrize("failing", ["threads", "async", "serial"])
    def test_upstream_released_while_the_error_is_held(self, upstream, failing):
        source = Guarded(range(10**6))
        before = set(_datapipes_threads())
        up = UPSTREAMS[upstream](IterableWrapper(source, deepcopy=False))
        if failing == "threads":
            pipe = up.map(fail_at(20), concurrency=2)
        elif failing == "async":
            bad = fail_at(20)

            async def abad(x):
                return bad(x)

            pipe = up.map(abad, concurrency=2)
        else:
            pipe = up.map(fail_at(20))
        held = error_of_pass(pipe, Boom)  # the consumer keeps the exception (and so its traceback)
        assert held.args == (20,)
        left = _gone([t for t in _datapipes_threads() if t not in before])
        assert not left, f"threads alive while the error is held: {left}"
        assert source.closed == [True], "the source's pass was not closed"

    @pytest.mark.parametrize("stage", sorted(FAILING_STAGES))
    def test_every_stage_kind_releases_a_threaded_upstream(self, stage):
        source = Guarded(range(10**6))
        before = set(_datapipes_threads())
        pipe = FAILING_STAGES[stage](IterableWrapper(source, deepcopy=False).map(ident, concurrency=4))
        held = error_of_pass(pipe, Boom)  # noqa: F841 - held on purpose
        assert not _gone([t for t in _datapipes_threads() if t not in before])
        assert source.closed == [True]

    @pytest.mark.usefixtures("no_child_left")
    def test_process_upstream_released(self):
        pipe = IterableWrapper(range(10**5)).map(ident, concurrency=2, executor="process").map(fail_at(50), concurrency=2)
        with pytest.raises(Boom) as info:
            list(pipe)
        assert info.value.args == (50,)
        assert not live_worker_pids()

    def test_failing_process_stage_releases_its_upstream(self):
        source = Guarded(range(10**5))
        before = set(_datapipes_threads())
        pipe = (IterableWrapper(source, deepcopy=False).map(ident, concurrency=3)
                .map(_proc_fail_at_30, concurrency=2, executor="process"))
        with pytest.raises(Boom):
            list(pipe)
        assert not _gone([t for t in _datapipes_threads() if t not in before])
        assert source.closed == [True]
        assert not live_worker_pids()


def _proc_fail_at_30(x):
    if x == 30:
        raise Boom(x)
    return x


class TestQuietShutdown:
    def test_closing_after_the_loop_stopped_is_quiet(self, recwarn):
        # What a late garbage collection did: the loop reference was released (and the loop
        # closed) before the stage's own close ran.
        async def slow(x):
            await asyncio.sleep(10)

        w = AsyncWorkers(slow, 2, "Mapper(slow)")
        w.start()
        for i in range(4):
            w.submit((i, i))
        w._kick()
        time.sleep(0.05)
        w._ref.close()  # the loop stops and closes underneath the stage
        w.close()  # used to raise RuntimeError('Event loop is closed') and leak a coroutine
        w.close()
        gc.collect()
        assert not [str(r.message) for r in recwarn if issubclass(r.category, RuntimeWarning)]

    def test_release_inside_acquire_does_not_deadlock(self):
        # A collection that runs inside _acquire (it allocates under the module lock) may finalize
        # an unreachable LoopRef on the same thread, which takes the lock again.
        done = threading.Event()

        def run():
            with aio._lock:
                ref = LoopRef()
                ref.close()
            done.set()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        assert done.wait(10), "releasing a loop reference under the module lock deadlocked"

    def test_collected_failing_passes_print_nothing(self, tmp_path):
        # The repro of the fault report: the failing passes are left to the collector (or to
        # interpreter exit); nothing may be printed on the way out.
        script = textwrap.dedent("""
            import asyncio, gc
            gc.disable()
            from datapipes.iter import IterableWrapper

            def bad(x):
                if x == 20:
                    raise ValueError(x)
                return x

            async def abad(x):
                await asyncio.sleep(0)
                return bad(x)

            async def aid(x):
                return x

            held = []
            for build in (
                lambda: IterableWrapper(range(10**5)).map(aid, concurrency=4).map(bad, concurrency=2),
                lambda: IterableWrapper(range(10**5)).map(lambda x: x, concurrency=4).map(abad, concurrency=2),
                lambda: IterableWrapper(range(10**5)).map(aid, concurrency=4).prefetch().map(abad, concurrency=3),
            ):
                it = iter(build())
                try:
                    for _ in it:
                        pass
                except ValueError as e:
                    held.append((e, it))
            # abandoned mid-pass, never closed: left to the collector and to interpreter exit
            for _ in range(3):
                it = iter(IterableWrapper(range(10**5)).map(aid, concurrency=8))
                next(it)
                held.append(it)
            held.append(held)  # a cycle: only the collector frees it
            del held, it
            gc.collect()
            for _ in range(2):
                it = iter(IterableWrapper(range(100)).map(aid, concurrency=4))
                next(it)
                c = [it]
                c.append(c)
            del it, c
        """)
        path = tmp_path / "late_gc.py"
        path.write_text(script)
        proc = subprocess.run([sys.executable, "-W", "always::RuntimeWarning", str(path)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == "", proc.stderr


class TestAsyncDeadlines:
    """Regression: an async fn that swallowed its cancellation or blocked the loop was delivered
    late as a success, or hung the pipe for good."""

    @staticmethod
    def _run_bounded(fn, limit=20.0):
        """Run ``fn`` on a thread; fail (not hang) if it takes longer than ``limit`` seconds."""
        out = {}

        def target():
            t = time.monotonic()
            try:
                out["value"] = fn()
            except BaseException as e:  # noqa: BLE001
                out["error"] = e
            out["elapsed"] = time.monotonic() - t

        th = threading.Thread(target=target, daemon=True)
        th.start()
        th.join(limit)
        assert not th.is_alive(), f"still running after {limit} s"
        return out

    def test_fn_that_swallows_cancellation_times_out(self):
        release = threading.Event()

        async def stubborn(x):
            if x == 2:
                while not release.is_set():  # a catch-all retry loop: cancellation is ignored
                    try:
                        await asyncio.sleep(0.01)
                    except asyncio.CancelledError:
                        pass
            return x

        try:
            out = self._run_bounded(lambda: list(IterableWrapper(range(6)).map(stubborn, concurrency=2, timeout=0.2)))
        finally:
            release.set()
        err = out.get("error")
        assert isinstance(err, TimeoutError), out
        assert "stage Mapper(stubborn): item 2 did not finish within timeout=0.2 s" in str(err)
        assert "did not stop when cancelled" in str(err)

    def test_swallowing_fn_skipped_keeps_every_other_item(self):
        release = threading.Event()

        async def stubborn(x):
            if x == 2:
                while not release.is_set():
                    try:
                        await asyncio.sleep(0.01)
                    except asyncio.CancelledError:
                        pass
                return "late"
            await asyncio.sleep(0.001)
            return x

        pipe = IterableWrapper(range(8)).map(stubborn, concurrency=2, timeout=0.2, on_error="skip")
        try:
            out = self._run_bounded(lambda: list(pipe))
        finally:
            release.set()
        assert out.get("value") == [0, 1, 3, 4, 5, 6, 7], out  # the late result is dropped, not delivered
        assert pipe.failures.count == 1
        assert isinstance(pipe.failures.recent[0].exception, TimeoutError)

    def test_fn_that_blocks_the_loop_is_reported(self):
        async def blocking(x):
            if x == 1:
                time.sleep(3)  # a synchronous call inside async def: the loop cannot run
            return x

        out = self._run_bounded(lambda: list(IterableWrapper(range(4)).map(blocking, concurrency=2, timeout=0.2)))
        err = out.get("error")
        assert isinstance(err, TimeoutError), out
        assert "stage Mapper(blocking): item 1" in str(err)
        assert "blocks the event loop" in str(err)
        # the consumer is told at the deadline plus a grace, not when the blocking call returns
        assert out["elapsed"] < 2.5, out["elapsed"]
        # and a new pass does not wait for the blocked loop: it gets a loop of its own
        out2 = self._run_bounded(lambda: list(IterableWrapper(range(20)).map(aident, concurrency=4)), limit=2.0)
        assert out2.get("value") == list(range(20)), out2

    def test_blocked_loop_under_skip_loses_nothing(self):
        async def blocking(x):
            if x == 3:
                time.sleep(1.0)
            await asyncio.sleep(0.001)
            return x

        pipe = IterableWrapper(range(12)).map(blocking, concurrency=3, timeout=0.3, on_error="skip")
        out = self._run_bounded(lambda: list(pipe))
        got = out.get("value")
        assert got is not None, out
        assert 3 not in got
        assert len(got) == len(set(got))  # nothing twice
        failed = {f.position for f in pipe.failures.recent}
        assert len(got) + pipe.failures.count == 12  # every item delivered or counted as failed
        assert failed.isdisjoint(got)
        assert all(isinstance(f.exception, TimeoutError) for f in pipe.failures.recent)

    def test_fast_items_are_unaffected_by_the_watch(self):
        async def quick(x):
            await asyncio.sleep(0.001)
            return x * 2

        assert list(IterableWrapper(range(200)).map(quick, concurrency=16, timeout=5)) == [2 * x for x in range(200)]
        got = list(IterableWrapper(range(200)).map(quick, concurrency=16, timeout=5, ordered=False))
        assert sorted(got) == [2 * x for x in range(200)]


class TestCachedExceptionSkips:
    """Regression: skipping one cached exception object appended a note per skip after scanning
    all earlier notes (quadratic time, unbounded memory)."""

    @pytest.mark.parametrize("concurrency", [1, 2])
    def test_notes_stay_bounded(self, concurrency):
        cached = ValueError("always the same object")

        def fn(x):
            raise cached

        pipe = IterableWrapper(range(30_000)).map(fn, on_error="skip", concurrency=concurrency)
        assert list(pipe) == []
        assert pipe.failures.count == 30_000
        assert cached.__notes__ == ["[datapipes] raised in stage Mapper(fn) at item 29999"]

    def test_user_notes_are_kept_and_stages_kept_apart(self):
        from datapipes.errors import add_stage_note

        e = ValueError("x")
        e.add_note("user note")
        add_stage_note(e, "Mapper(f)", 1)
        add_stage_note(e, "Mapper(f)x", 2)  # another stage whose name starts the same way
        add_stage_note(e, "Mapper(f)", 3)
        add_stage_note(e, "Mapper(f)", 3)
        assert e.__notes__ == [
            "user note",
            "[datapipes] raised in stage Mapper(f) at item 3",
            "[datapipes] raised in stage Mapper(f)x at item 2",
        ]


class TestDroppedPassKeepsItsStreams:
    """Closing upstreams on the way out of a failing pass must not close, when a pass is merely
    dropped or closed, the streams an opener upstream handed out (fileio.py's lifecycle rules)."""

    @pytest.mark.parametrize("stage", ["map", "threads", "filter", "header"])
    def test_streams_handed_out_stay_open(self, tmp_path, stage):
        from datapipes.iter import FileLister

        (tmp_path / "a.txt").write_text("A")
        (tmp_path / "b.txt").write_text("B")
        pipe = FileLister(str(tmp_path)).open_files()
        pipe = {
            "map": lambda p: p.map(ident),
            "threads": lambda p: p.map(ident, concurrency=2),
            "filter": lambda p: p.filter(bool),
            "header": lambda p: p.map(ident).header(1),
        }[stage](pipe)
        _, stream = next(iter(pipe))  # the pass is dropped at once
        gc.collect()
        assert not stream.closed
        assert stream.read() in ("A", "B")
        stream.close()
