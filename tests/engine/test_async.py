"""Async: async fn on the shared event loop, async iterables, async generator functions in flatmap."""

import asyncio
import gc
import random
import threading
import time

import pytest

from datapipes._engine import AsyncWorkers, LoopRef, iterate_async, loop_running
from datapipes.iter import IterableWrapper
from datapipes.testing import check_datapipe, same_multiset

from engine_helpers import CountingSource


class Boom(Exception):
    pass


async def slow_double(x):
    await asyncio.sleep(random.random() * 0.002)
    return 2 * x


@pytest.fixture
def loop_stopped(no_thread_leak):
    yield
    # The last pass's handle on the loop is released by its finaliser: on a loaded machine that can
    # come a moment after the test body; wait for it (bounded) rather than fail on the timing.
    deadline = time.monotonic() + 5
    while loop_running() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert not loop_running()


@pytest.mark.usefixtures("loop_stopped")
class TestAsyncMapper:
    def test_contract(self):
        check_datapipe(IterableWrapper(range(30)).map(slow_double, concurrency=8), expected=[2 * x for x in range(30)],
                       build=lambda src: src.map(slow_double, concurrency=3))
        check_datapipe(IterableWrapper(range(30)).map(slow_double, concurrency=8, ordered=False),
                       expected=[2 * x for x in range(30)], ordered=False)

    def test_concurrency_one_still_uses_the_loop(self):
        pipe = IterableWrapper(range(5)).map(slow_double)
        assert list(pipe) == [0, 2, 4, 6, 8] and pipe.stats.kind == "async"

    def test_tasks_in_flight_reach_concurrency_and_never_exceed_it(self):
        state = {"now": 0, "max": 0}

        async def fn(x):
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
            await asyncio.sleep(0.005)
            state["now"] -= 1
            return x

        assert list(IterableWrapper(range(200)).map(fn, concurrency=16)) == list(range(200))
        assert state["max"] == 16

    def test_async_callable_object(self):
        class Add:
            async def __call__(self, x):
                return x + 1

        assert list(IterableWrapper(range(3)).map(Add(), concurrency=2)) == [1, 2, 3]

    def test_bounded_pulls(self):
        src = CountingSource()
        it = iter(IterableWrapper(src).map(slow_double, concurrency=8))
        for consumed in range(1, 301):
            next(it)
            assert consumed <= src.pulled <= consumed + 2 * 8  # 8 tasks + 8 items queued on the loop
        it.close()

    def test_error_same_object_and_skip(self):
        err = Boom("x")

        async def fn(x):
            if x == 4:
                raise err
            return x

        with pytest.raises(Boom) as info:
            list(IterableWrapper(range(10)).map(fn, concurrency=3))
        assert info.value is err and info.value.__notes__ == ["[datapipes] raised in stage Mapper(fn) at item 4"]
        pipe = IterableWrapper(range(10)).map(fn, concurrency=3, on_error="skip")
        assert list(pipe) == [0, 1, 2, 3, 5, 6, 7, 8, 9] and pipe.failures.count == 1

    def test_timeout(self):
        async def fn(x):
            await asyncio.sleep(60 if x == 3 else 0)
            return x

        t0 = time.monotonic()
        # timeout=1 s, not less: a plain item must never reach it on a loaded CI machine
        with pytest.raises(TimeoutError, match=r"stage Mapper\(fn\): item 3 did not finish within timeout=1.0 s"):
            list(IterableWrapper(range(10)).map(fn, concurrency=4, timeout=1.0))
        assert time.monotonic() - t0 < 30
        pipe = IterableWrapper(range(6)).map(fn, concurrency=4, timeout=1.0, on_error="skip")
        assert list(pipe) == [0, 1, 2, 4, 5]

    def test_fn_own_timeout_error_passes_unchanged(self):
        err = TimeoutError("mine")

        async def fn(x):
            raise err

        with pytest.raises(TimeoutError) as info:
            list(IterableWrapper([1]).map(fn, concurrency=2, timeout=5))
        assert info.value is err

    def test_fn_cancelling_itself_is_a_failure_not_a_hang(self):
        async def fn(x):
            raise asyncio.CancelledError()

        with pytest.raises(asyncio.CancelledError):
            list(IterableWrapper([1, 2]).map(fn, concurrency=2))

    def test_keyboard_interrupt_from_fn(self):
        async def fn(x):
            if x == 2:
                raise KeyboardInterrupt
            return x

        with pytest.raises(KeyboardInterrupt):
            list(IterableWrapper(range(5)).map(fn, concurrency=2))

    def test_early_break_cancels_tasks(self):
        cancelled = []

        async def fn(x):
            try:
                await asyncio.sleep(0 if x == 0 else 5)
            except asyncio.CancelledError:
                cancelled.append(x)
                raise
            return x

        t0 = time.monotonic()
        for _ in IterableWrapper(range(100)).map(fn, concurrency=8):
            break
        assert time.monotonic() - t0 < 2 and len(cancelled) >= 7

    def test_deleted_iterator(self):
        it = iter(IterableWrapper(CountingSource()).map(slow_double, concurrency=8))
        next(it)
        del it
        gc.collect()

    def test_two_async_stages_share_one_loop_thread_with_a_thread_stage_between(self):
        seen = []

        async def a(x):
            seen.append(threading.get_ident())
            await asyncio.sleep(0.001)
            return x + 1

        async def b(x):
            seen.append(threading.get_ident())
            return x * 2

        pipe = IterableWrapper(range(50)).map(a, concurrency=4).map(lambda x: x - 1, concurrency=3).map(b, concurrency=2)
        assert list(pipe) == [2 * x for x in range(50)]
        assert len(set(seen)) == 1 and seen[0] != threading.get_ident()

    def test_async_column(self):
        async def inc(v):
            return v + 1

        assert list(IterableWrapper([(1, "a"), (2, "b")]).map(inc, input_col=0, concurrency=2)) == [(2, "a"), (3, "b")]


def _collect_records(w, k, timeout=10.0):
    """``k`` result records from AsyncWorkers ``w``, read on a helper thread (bounded wait)."""
    out = []

    def read():
        for _ in range(k):
            out.append(w.get())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"only {len(out)} of {k} results within {timeout} s"
    return out


class _Gauge:
    """Counts the calls of fn running on the loop; records how many ran when each one started."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.now = 0
        self.at_start = {}

    async def __call__(self, x):
        self.now += 1
        self.at_start[x] = self.now
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.now -= 1
        return x


@pytest.mark.usefixtures("loop_stopped")
class TestAsyncResize:
    @pytest.mark.parametrize("timeout", [None, 5.0])
    def test_grow_from_another_thread_starts_queued_items_at_once(self, timeout):
        gauge = _Gauge(0.05)
        w = AsyncWorkers(gauge, 2, "S", timeout)
        with w:
            w.start()
            for i in range(20):
                w.submit((i, i))
            first = _collect_records(w, 2)
            resizer = threading.Thread(target=w.resize, args=(6,))
            resizer.start()
            resizer.join(10)
            rest = _collect_records(w, 18)
        assert sorted(r[0] for r in first + rest) == list(range(20)) and all(r[1] for r in first + rest)
        assert max(gauge.at_start.values()) == 6 and w.n == 6
        assert max(gauge.at_start[i] for i in range(4)) == 2  # before the resize: 2 at most

    @pytest.mark.parametrize("timeout", [None, 5.0])
    def test_shrink_lets_running_calls_finish_and_starts_fewer(self, timeout):
        gauge = _Gauge(0.02)
        w = AsyncWorkers(gauge, 6, "S", timeout)
        with w:
            w.start()
            for i in range(40):
                w.submit((i, i))
            got = _collect_records(w, 3)
            w.resize(2)
            got += _collect_records(w, 37)
            for i in range(40, 50):  # submitted after the shrink settled
                w.submit((i, i))
            got += _collect_records(w, 10)
        assert sorted(r[0] for r in got) == list(range(50))  # nothing lost, nothing repeated
        assert max(gauge.at_start[i] for i in range(6)) == 6
        assert max(gauge.at_start[i] for i in range(20, 50)) <= 2

    def test_resize_before_start_and_after_close(self):
        w = AsyncWorkers(slow_double, 8, "S")
        w.resize(3)
        assert w.n == 3
        with w:
            w.start()
            assert w._cap == 3
        w.resize(5)  # closed: nothing to apply, no error
        with pytest.raises(ValueError, match=r"stage S: resize\(n\) needs an int >= 1, got 0"):
            w.resize(0)
        with pytest.raises(ValueError, match="got 2.0"):
            w.resize(2.0)

    def test_fn_that_never_suspends_leaves_the_loop_turns(self):
        calls = {"n": 0, "when_probed": None}

        def probe():
            calls["when_probed"] = calls["n"]

        async def instant(x):  # never suspends: one runner could go through the whole inbox
            calls["n"] += 1
            if x == 0:
                asyncio.get_running_loop().call_soon(probe)
            return x

        w = AsyncWorkers(instant, 1, "S")
        with w:
            w.start()
            for i in range(1000):
                w.submit((i, i))
            got = _collect_records(w, 1000)
        assert [r[0] for r in got] == list(range(1000))
        assert calls["when_probed"] <= 64, "the runner held the loop for more than 64 calls"


@pytest.mark.usefixtures("loop_stopped")
class TestIterateAsync:
    def test_items_and_order(self):
        async def agen():
            for i in range(100):
                if i % 10 == 0:
                    await asyncio.sleep(0)
                yield i

        assert list(iterate_async(agen())) == list(range(100))

    def test_error_same_object_after_items(self):
        err = Boom("listing failed")

        async def agen():
            yield 1
            yield 2
            raise err

        got = []
        with pytest.raises(Boom) as info:
            for x in iterate_async(agen()):
                got.append(x)
        assert info.value is err and got == [1, 2]

    def test_close_runs_aclose_and_bounds_read_ahead(self):
        state = {"pulled": 0, "closed": False}

        async def agen():
            try:
                for i in range(10_000):
                    state["pulled"] += 1
                    yield i
            finally:
                state["closed"] = True

        it = iterate_async(agen(), buffer_size=8)
        for _ in range(20):
            next(it)
        time.sleep(0.02)
        assert state["pulled"] <= 20 + 8
        it.close()
        assert state["closed"]

    def test_async_iterable_object(self):
        class Bucket:
            def __aiter__(self):
                return self.gen()

            async def gen(self):
                for k in ("a", "b"):
                    yield k

        assert list(iterate_async(Bucket())) == ["a", "b"]

    def test_loop_ref_is_shared_and_released(self):
        with LoopRef() as a, LoopRef() as b:
            assert a.loop is b.loop and loop_running()
        assert not loop_running()


@pytest.mark.usefixtures("loop_stopped")
class TestAsyncFlatMapper:
    def test_async_generator_fn(self):
        async def expand(x):
            for i in range(x):
                await asyncio.sleep(0)
                yield (x, i)

        check_datapipe(IterableWrapper([1, 2, 3]).flatmap(expand), expected=[(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)],
                       build=lambda src: src.flatmap(expand))

    def test_errors_and_skip(self):
        async def expand(x):
            yield x
            if x == 2:
                raise Boom(x)
            yield -x

        with pytest.raises(Boom) as info:
            list(IterableWrapper([1, 2, 3]).flatmap(expand))
        assert info.value.__notes__ == ["[datapipes] raised in stage FlatMapper(expand) at item 1"]
        pipe = IterableWrapper([1, 2, 3]).flatmap(expand, on_error="skip")
        assert same_multiset(list(pipe), [1, -1, 2, 3, -3]) and pipe.failures.count == 1


def test_forked_child_starts_its_own_loop():
    """A child forked while the shared loop runs (a DataLoader worker) must not wait on the parent's."""
    import asyncio
    import multiprocessing

    from datapipes.iter import IterableWrapper

    async def double(x):
        await asyncio.sleep(0)
        return 2 * x

    def child(q):
        q.put(list(IterableWrapper(range(5)).map(double, concurrency=2)))

    it = iter(IterableWrapper(range(100)).map(double, concurrency=2))
    next(it)  # the parent's shared loop is running now
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=child, args=(q,))
    proc.start()
    try:
        assert q.get(timeout=20) == [0, 2, 4, 6, 8]
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
        it.close()
