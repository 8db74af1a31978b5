"""Concurrent map on threads and on an executor the user built (the thread engine)."""

import gc
import os
import random
import signal
import threading
import time
import traceback
from concurrent.futures import Executor, Future, ThreadPoolExecutor

import pytest

from datapipes._engine import StageSpec, ThreadWorkers, concurrent_map
from datapipes._engine.threads import CHUNK_TARGET_S, MAX_CHUNK, MAX_CHUNK_BYTES, approx_nbytes, chunk_for
from datapipes.iter import IterableWrapper, Mapper
from datapipes.testing import check_datapipe, same_multiset

from engine_helpers import CountingSource


class Boom(Exception):
    def __init__(self, code, detail):
        super().__init__(code, detail)
        self.code = code


def jitter(x):
    time.sleep(random.random() * 0.002)
    return x * 10


class SyncExecutor(Executor):
    """Runs each call at once on the caller's thread."""

    def submit(self, fn, /, *args, **kwargs):
        f = Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as e:
            f.set_exception(e)
        return f


@pytest.mark.usefixtures("no_thread_leak")
class TestConcurrentMapper:
    def test_contract(self):
        check_datapipe(IterableWrapper(range(40)).map(jitter, concurrency=4), expected=[x * 10 for x in range(40)],
                       build=lambda src: src.map(lambda x: x, concurrency=3))
        check_datapipe(IterableWrapper(range(40)).map(jitter, concurrency=4, ordered=False),
                       expected=[x * 10 for x in range(40)], ordered=False,
                       build=lambda src: src.map(lambda x: x, concurrency=3, ordered=False))

    def test_len_empty_and_none(self):
        assert len(IterableWrapper(range(7)).map(str, concurrency=3)) == 7
        check_datapipe(IterableWrapper([]).map(str, concurrency=3), expected=[])
        assert list(IterableWrapper([1, 2]).map(lambda x: None, concurrency=2)) == [None, None]

    def test_runs_on_workers_concurrently(self):
        barrier = threading.Barrier(4, timeout=5)

        def fn(x):
            barrier.wait()  # only passes when 4 items run at once
            return threading.current_thread().name

        names = list(IterableWrapper(range(8)).map(fn, concurrency=4))
        assert all("worker" in n for n in names) and len(set(names)) == 4

    def test_ordered_equals_serial_under_random_delays(self):
        out = list(IterableWrapper(range(200)).map(jitter, concurrency=8))
        assert out == [x * 10 for x in range(200)]

    def test_unordered_has_no_head_of_line_blocking(self):
        def fn(x):
            time.sleep(0.2 if x == 0 else 0.001)
            return x

        out = list(IterableWrapper(range(20)).map(fn, concurrency=4, ordered=False))
        assert sorted(out) == list(range(20)) and out[-1] == 0 and out[0] != 0

    @pytest.mark.parametrize("ordered", [True, False])
    @pytest.mark.parametrize("concurrency", [1, 3, 8])
    def test_bounded_pulls_from_unbounded_source(self, ordered, concurrency):
        src = CountingSource()
        it = iter(IterableWrapper(src).map(lambda x: x, concurrency=concurrency, ordered=ordered, timeout=5
                                           if concurrency == 1 else None, chunksize=1))
        for consumed in range(1, 1001):
            next(it)
            assert consumed <= src.pulled <= consumed + 2 * concurrency, (consumed, src.pulled)
        it.close()
        assert src.pulled <= 1000 + 2 * concurrency

    @pytest.mark.parametrize("ordered", [True, False])
    @pytest.mark.parametrize("chunksize", [None, 5])
    def test_bounded_pulls_in_chunks(self, ordered, chunksize):
        """A window of 2 * concurrency chunks: of MAX_CHUNK items at most when sized automatically."""
        src = CountingSource()
        it = iter(IterableWrapper(src).map(lambda x: x, concurrency=3, ordered=ordered, chunksize=chunksize))
        bound = 2 * 3 * (chunksize or MAX_CHUNK)
        for consumed in range(1, 3001):
            next(it)
            assert consumed <= src.pulled <= consumed + bound, (consumed, src.pulled)
        it.close()
        assert src.pulled <= 3000 + bound

    def test_backpressure_slow_consumer_stops_source(self):
        src = CountingSource()
        it = iter(IterableWrapper(src).map(lambda x: x, concurrency=4, chunksize=1))
        next(it)
        time.sleep(0.05)
        assert src.pulled == 1 + 2 * 4  # one item running and one queued per worker
        it.close()

    def test_backpressure_in_chunks_stops_source(self):
        src = CountingSource()
        it = iter(IterableWrapper(src).map(lambda x: x, concurrency=4, chunksize=3))
        next(it)
        time.sleep(0.05)
        assert src.pulled == 1 + 2 * 4 * 3  # two chunks of 3 per worker
        it.close()

    def test_chunks_are_sized_from_the_cost_of_fn(self):
        """Cheap items go in chunks (to MAX_CHUNK), items of a millisecond or more one by one, and
        large items one by one whatever their cost."""
        def slow(x):
            time.sleep(CHUNK_TARGET_S * 2)
            return x

        for fn, items, expected in [(lambda x: x, range(2000), MAX_CHUNK), (slow, range(30), 1),
                                    (len, [b"x" * MAX_CHUNK_BYTES] * 200, 1)]:
            w = ThreadWorkers(fn, 2, "S")
            w.start()
            try:
                sizes = []
                for i, x in enumerate(items):
                    w.submit((i, x))
                    sizes.append(w.chunk)
                    if i % 10 == 9:  # the consumer waits: what was buffered goes, and every result comes back
                        for _ in range(10):
                            w.get()
                assert sizes[0] == 1 and sizes[-1] == expected, (fn, sizes[-5:])
            finally:
                w.close()

    def test_a_stage_waiting_on_its_source_takes_items_one_by_one(self):
        """Downstream of a slow stage, a cheap fn's chunks would only pull ahead in bursts: the stage
        paces its chunks on its source, and keeps its window of items."""
        def nap(x):
            time.sleep(0.002)
            return x

        pulled = [0]

        def count(x):
            pulled[0] += 1
            return x

        it = iter(IterableWrapper(range(1000)).map(nap, concurrency=2).map(count).map(abs, concurrency=2))
        for consumed in range(1, 61):
            next(it)
            assert pulled[0] <= consumed + 1 + 2 * 2, (consumed, pulled[0])
        it.close()
        assert chunk_for(1e-6, 0, source_cost=1e-3) == 1 and chunk_for(1e-6, 0, source_cost=1e-7) == MAX_CHUNK

    def test_approx_nbytes(self):
        np = pytest.importorskip("numpy")
        assert approx_nbytes(np.zeros(1000, dtype=np.float64)) == 8000
        assert approx_nbytes(b"x" * 100) == 100
        assert approx_nbytes({"image": np.zeros(10, np.uint8), "label": 3}) >= 10
        assert approx_nbytes(("a" * 50, np.zeros(100, np.uint8))) >= 150

        class Hostile:
            @property
            def nbytes(self):
                raise RuntimeError("no")

        assert approx_nbytes(Hostile()) == 0

    def test_a_chunk_fails_item_by_item(self):
        def fn(x):
            if x % 7 == 3:
                raise KeyError(x)
            return x

        out = list(IterableWrapper(range(100)).map(fn, concurrency=2, chunksize=8, on_error="skip"))
        assert out == [x for x in range(100) if x % 7 != 3]
        with pytest.raises(KeyError) as info:
            list(IterableWrapper(range(100)).map(fn, concurrency=2, chunksize=8))
        assert "at item 3" in info.value.__notes__[0]

    def test_same_exception_object_with_note_and_traceback(self):
        made = []

        def fn(x):
            if x == 5:
                e = Boom(5, "custom")
                made.append(e)
                raise e
            return x

        with pytest.raises(Boom) as info:
            list(IterableWrapper(range(20)).map(fn, concurrency=4))
        e = info.value
        assert e is made[0] and e.args == (5, "custom") and e.code == 5
        assert e.__notes__ == ["[datapipes] raised in stage Mapper(fn) at item 5"]
        assert traceback.extract_tb(e.__traceback__)[-1].name == "fn"

    def test_fail_fast_first_failure_in_output_order(self):
        calls = []

        def fn(x):
            calls.append(x)
            if x == 3:
                time.sleep(0.05)
                raise Boom(3, "slow")
            if x == 6:
                raise Boom(6, "fast")
            time.sleep(0.001)
            return x

        got = []
        with pytest.raises(Boom) as info:
            for y in IterableWrapper(range(1000)).map(fn, concurrency=4):
                got.append(y)
        assert info.value.code == 3 and got == [0, 1, 2]
        assert len(calls) <= 3 + 1 + 2 * 4 + 1  # nothing much ran after the failure: in-flight work was cancelled

    def test_unordered_fails_fast_in_completion_order(self):
        def fn(x):
            if x == 0:
                time.sleep(0.2)
                raise Boom(0, "slow")
            if x == 2:
                raise Boom(2, "fast")
            return x

        with pytest.raises(Boom) as info:
            list(IterableWrapper(range(10)).map(fn, concurrency=4, ordered=False))
        assert info.value.code == 2 and "at item 2" in info.value.__notes__[0]

    @pytest.mark.parametrize("ordered", [True, False])
    def test_skip_counts_and_budget(self, ordered):
        bad = {3, 17, 29}

        def fn(x):
            time.sleep(random.random() * 0.001)
            if x in bad:
                raise Boom(x, "bad")
            return x

        pipe = IterableWrapper(range(40)).map(fn, concurrency=5, ordered=ordered, on_error="skip")
        out = list(pipe)
        assert same_multiset(out, [x for x in range(40) if x not in bad])
        assert pipe.failures.count == 3 and sorted(f.position for f in pipe.failures.recent) == sorted(bad)
        assert pipe.stats.failures == 3 and pipe.stats.items_out == 37
        budget = IterableWrapper(range(40)).map(fn, concurrency=5, ordered=ordered, on_error="skip", max_failures=2)
        with pytest.raises(ExceptionGroup, match=r"stage Mapper\(fn\): 3 failures, more than max_failures=2") as info:
            list(budget)
        assert sorted(e.code for e in info.value.exceptions) == sorted(bad)

    def test_timeout_names_stage_and_item_and_abandons_worker(self):
        release = threading.Event()

        def fn(x):
            if x == 2:
                release.wait(60)
            return x

        t0 = time.monotonic()
        got = []
        # timeout=1 s, not less: a plain item must never reach it on a loaded CI machine
        with pytest.raises(TimeoutError, match=r"stage Mapper\(fn\): item 2 did not finish within timeout=1.0 s"):
            for y in IterableWrapper(range(10)).map(fn, concurrency=2, timeout=1.0):
                got.append(y)
        assert time.monotonic() - t0 < 30 and got == [0, 1]
        release.set()  # the abandoned worker returns and exits on its own (no_thread_leak waits for it)

    def test_timeout_skip_replaces_the_stuck_worker(self):
        release = threading.Event()

        def fn(x):
            if x in (1, 4):
                release.wait(60)
            return x

        # A timeout of 1 s: a loaded free-threaded CI leg once took longer than 0.05 s for a plain
        # item. Two stuck items at 1 s each finish far below the 60 s they would block without
        # the replacement workers.
        pipe = IterableWrapper(range(10)).map(fn, concurrency=2, timeout=1.0, on_error="skip")
        t0 = time.monotonic()
        assert list(pipe) == [0, 2, 3, 5, 6, 7, 8, 9]
        assert time.monotonic() - t0 < 30
        assert {f.position for f in pipe.failures.recent} == {1, 4}
        assert all(isinstance(f.exception, TimeoutError) for f in pipe.failures.recent)
        release.set()

    def test_timeout_with_concurrency_one_uses_a_worker(self):
        assert list(IterableWrapper(range(5)).map(lambda x: -x, timeout=1)) == [0, -1, -2, -3, -4]

    def test_fn_timeout_error_passes_unchanged(self):
        err = TimeoutError("fn's own")

        def fn(x):
            raise err

        with pytest.raises(TimeoutError) as info:
            list(IterableWrapper([1]).map(fn, concurrency=2, timeout=5))
        assert info.value is err

    def test_source_error_after_preceding_items(self):
        err = Boom(0, "source")

        def gen():
            yield from range(6)
            raise err

        got = []
        with pytest.raises(Boom) as info:
            for y in IterableWrapper(gen()).map(lambda x: x, concurrency=4):
                got.append(y)
        assert info.value is err and got == list(range(6))
        assert not getattr(err, "__notes__", None)

    @pytest.mark.parametrize("ordered", [True, False])
    def test_consumer_breaks_early(self, ordered):
        for _ in IterableWrapper(CountingSource()).map(jitter, concurrency=6, ordered=ordered):
            break

    def test_iterator_deleted_mid_stream(self):
        it = iter(IterableWrapper(CountingSource()).map(jitter, concurrency=6))
        for _ in range(10):
            next(it)
        del it
        gc.collect()

    def test_consumer_raises(self):
        with pytest.raises(ZeroDivisionError):
            for y in IterableWrapper(CountingSource()).map(jitter, concurrency=4):
                if y > 50:
                    1 / 0

    def test_keyboard_interrupt_from_fn_and_from_source(self):
        def fn(x):
            if x == 3:
                raise KeyboardInterrupt
            return x

        with pytest.raises(KeyboardInterrupt):
            list(IterableWrapper(range(10)).map(fn, concurrency=3, on_error="skip"))

        def gen():
            yield from range(10)
            raise KeyboardInterrupt

        got = []
        with pytest.raises(KeyboardInterrupt):
            for y in IterableWrapper(gen()).map(lambda x: x, concurrency=3, chunksize=1):
                got.append(y)
        # Not deferred: the interrupt stops the pass when item 10 is pulled, which happens (6 items in
        # flight with 3 workers taking one item at a time) just before item 4 would be yielded.
        assert got == [0, 1, 2, 3]

    def test_keyboard_interrupt_delivered_while_consumer_waits(self):
        assert threading.current_thread() is threading.main_thread()

        release = threading.Event()

        def fn(x):
            if x == 1:  # the consumer waits for this one until the test releases it (10 s at most)
                release.wait(10)
            return x

        # a real SIGINT, as Ctrl-C sends (``_thread.interrupt_main`` only sets Python's flag, which a
        # thread blocked waiting for a lock sees once the lock is released), with Python's own
        # handler: a process started in the background by a shell (nohup ... &) ignores SIGINT
        timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        t0 = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt):
                it = iter(IterableWrapper(range(100)).map(fn, concurrency=2))
                timer.start()
                for _ in it:
                    pass
            waited = time.monotonic() - t0
        finally:
            release.set()
            signal.signal(signal.SIGINT, previous)
        timer.join(1)
        del it
        assert waited < 8  # delivered while the consumer waited, not once item 1 came back

    def test_nested_concurrent_stages_and_prefetch(self):
        pipe = (IterableWrapper(range(300)).map(jitter, concurrency=3).map(lambda x: x + 1, concurrency=2, ordered=True)
                .prefetch(4))
        check_datapipe(pipe, expected=[x * 10 + 1 for x in range(300)])
        for _ in pipe:
            break

    def test_stats(self):
        pipe = IterableWrapper(range(50)).map(jitter, concurrency=4)
        assert pipe.stats is None
        list(pipe)
        s = pipe.stats
        assert (s.label, s.kind, s.workers, s.items_in, s.items_out, s.failures) == ("Mapper(jitter)", "thread", 4, 50, 50, 0)
        assert s.busy_s > 0 and 0 < s.busy_fraction <= 1 and 0 <= s.queue_fill <= 1 and s.items_per_s > 0
        assert s.as_dict()["items_out"] == 50

    def test_user_executor_is_used_and_not_shut_down(self):
        with ThreadPoolExecutor(3, thread_name_prefix="user") as ex:
            names = list(IterableWrapper(range(20)).map(lambda x: threading.current_thread().name, concurrency=3,
                                                        executor=ex))
            assert all(n.startswith("user") for n in names)
            out = list(IterableWrapper(range(20)).map(jitter, concurrency=3, executor=ex, ordered=False))
            assert sorted(out) == [x * 10 for x in range(20)]
            assert ex.submit(lambda: 7).result(5) == 7  # still usable

    def test_synchronous_executor(self):
        pipe = IterableWrapper(range(10)).map(lambda x: x * 3, concurrency=4, executor=SyncExecutor())
        assert list(pipe) == [x * 3 for x in range(10)] and pipe.stats.kind == "executor"
        with pytest.raises(ZeroDivisionError) as info:
            list(IterableWrapper(range(5)).map(lambda x: 1 // 0 if x == 2 else x, concurrency=2,
                                               executor=SyncExecutor()))
        assert info.value.__notes__ == ["[datapipes] raised in stage Mapper(<lambda>) at item 2"]

    def test_broken_executor_reaches_consumer(self):
        class Broken(Executor):
            def submit(self, fn, /, *args, **kwargs):
                f = Future()
                f.set_exception(RuntimeError("pool broke"))
                return f

        with pytest.raises(RuntimeError, match="pool broke"):
            list(IterableWrapper(range(3)).map(str, concurrency=2, executor=Broken()))

    def test_columns(self):
        pipe = IterableWrapper([(1, 2), (3, 4)]).map(lambda a, b: a + b, input_col=[0, 1], concurrency=2)
        assert list(pipe) == [(3,), (7,)]

    @pytest.mark.parametrize(
        "kwargs, err, match",
        [
            ({"concurrency": 0}, ValueError, "Mapper: concurrency must be >= 1, got 0"),
            ({"concurrency": 2.0}, TypeError, "Mapper: concurrency must be an int, got float"),
            ({"ordered": 1}, TypeError, "Mapper: ordered must be a bool, got int"),
            ({"executor": "fiber"}, ValueError, "Mapper: executor must be 'thread', 'process' or a concurrent"),
            ({"executor": 3}, TypeError, "Mapper: executor must be 'thread', 'process' or a concurrent"),
            ({"timeout": 0}, ValueError, "Mapper: timeout must be > 0, got 0"),
            ({"timeout": "1"}, TypeError, "Mapper: timeout must be a number of seconds or None, got str"),
            ({"timeout": 1, "executor": "process"}, ValueError, "timeout needs executor='thread'"),
            ({"chunksize": 4, "timeout": 1}, ValueError, "a timeout applies to one item"),
            ({"chunksize": 0, "executor": "process"}, ValueError, "chunksize must be >= 1"),
            ({"rng": "mt"}, ValueError, "Mapper: rng must be None, 'python', 'numpy' or 'torch', got 'mt'"),
        ],
    )
    def test_bad_arguments(self, kwargs, err, match):
        with pytest.raises(err, match=match):
            Mapper(IterableWrapper([]), str, **kwargs)

    def test_construction_starts_nothing(self):
        before = threading.active_count()
        pipe = IterableWrapper(range(5)).map(str, concurrency=4)
        it = iter(pipe)
        assert threading.active_count() == before
        next(it)
        assert threading.active_count() >= before + 4
        it.close()


@pytest.mark.usefixtures("no_thread_leak")
class TestThreadWorkers:
    def test_close_is_idempotent_and_context_manager(self):
        with ThreadWorkers(lambda x: x + 1, 3, "S") as w:
            w.start()
            w.submit((0, 1))
            assert w.get() == (0, True, 2)
            w.close()
        w.close()

    def test_finalize_backstop(self):
        w = ThreadWorkers(lambda x: x, 3, "S")
        w.start()
        threads = list(w._threads)
        del w
        gc.collect()
        for t in threads:
            t.join(2)
        assert not any(t.is_alive() for t in threads)

    def test_close_cancels_queued_work(self):
        calls = []
        gate = threading.Event()

        def fn(x):
            calls.append(x)
            gate.wait(2)
            return x

        w = ThreadWorkers(fn, 1, "S")
        w.start()
        for i in range(10):
            w.submit((i, i))
        time.sleep(0.02)
        gate.set()
        w.close()
        assert len(calls) <= 2

    def test_resize_after_close_starts_nothing(self):
        w = ThreadWorkers(lambda x: x, 2, "S")
        w.start()
        threads = list(w._threads)
        w.close()
        w.resize(6)
        assert w._threads == threads
        assert not any(t.is_alive() for t in threads)

    @pytest.mark.timeout(20)
    def test_resize_racing_with_close_leaves_no_thread(self):
        """The autotuner resizes from its own thread while the consumer closes the pass: close must
        neither join a thread that resize has not started yet nor miss one it started."""
        rng = random.Random(0)
        for _ in range(60):
            w = ThreadWorkers(lambda x: x, 2, "S")
            w.start()
            go = threading.Event()

            def tune():
                go.wait(2)
                for _ in range(20):
                    w.resize(rng.randint(1, 8))

            tuner = threading.Thread(target=tune)
            tuner.start()
            go.set()
            time.sleep(rng.random() * 0.002)
            w.close()  # raised "cannot join thread before it is started" when the race was lost
            tuner.join(5)
            threads = list(w._threads)
            for t in threads:
                t.join(2)
            assert not any(t.is_alive() for t in threads)

    def test_direct_engine_call(self):
        assert list(concurrent_map(range(5), lambda x: x - 1, StageSpec("L", 2))) == [-1, 0, 1, 2, 3]


def _square(x):
    return x * x


def _fails_on_2(x):
    if x == 2:
        raise KeyError(x)
    return x


class TestUserProcessPool:
    """An executor the user built may be a process pool: only fn and the item travel to it."""

    def test_results_busy_time_and_errors(self):
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(2) as pool:
            it = iter(IterableWrapper(range(10)).map(_square, executor=pool, concurrency=2))
            assert list(it) == [x * x for x in range(10)]
            assert it.stats()[0][1].busy_s > 0
            with pytest.raises(KeyError) as caught:
                list(IterableWrapper(range(5)).map(_fails_on_2, executor=pool, concurrency=2))
            traceback_there, stage = caught.value.__notes__  # the worker's traceback, then the stage
            assert "line" in traceback_there and "_fails_on_2" in traceback_there
            assert "Mapper(_fails_on_2)" in stage
