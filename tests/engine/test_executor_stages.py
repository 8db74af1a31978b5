"""A stage on an Executor the user built: chunksize= (items per task) and timeout= (issue 23, items 2 and 5).

Executors such as Ray's or Dask's cost a millisecond or more per task, so a cheap fn needs several
items per submit; and a task that never comes back (an executor whose workers are all taken) must
fail the pass, naming the stage, instead of hanging it.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor

import pytest

from datapipes.iter import IterableWrapper
from datapipes.testing import check_resume, same_multiset
from helpers import fails_on_7, square

N = 50


class Unpicklable(Exception):
    def __init__(self, message, lock):
        super().__init__(message)
        self.lock = lock


def raises_unpicklable(x):
    if x == 2:
        raise Unpicklable("no pickling", threading.Lock())
    return x


class Counting(Executor):
    """A thread pool that counts its submits."""

    def __init__(self, workers=2):
        self.pool = ThreadPoolExecutor(workers)
        self.submits = 0

    def submit(self, fn, /, *args, **kwargs):
        self.submits += 1
        return self.pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait=True, *, cancel_futures=False):
        self.pool.shutdown(wait, cancel_futures=cancel_futures)


class Synchronous(Executor):
    """Runs each task inside submit."""

    def submit(self, fn, /, *args, **kwargs):
        f = Future()
        f.set_result(fn(*args, **kwargs))
        return f


@pytest.fixture
def pool():
    with ThreadPoolExecutor(2) as executor:
        yield executor


class TestChunks:
    @pytest.mark.parametrize("chunksize", [1, 3, 8, 64])
    def test_ordered_gives_the_serial_result_in_fewer_tasks(self, chunksize):
        executor = Counting()
        try:
            pipe = IterableWrapper(range(N)).map(square, concurrency=2, executor=executor, chunksize=chunksize)
            assert list(pipe) == [x * x for x in range(N)]
            assert executor.submits <= -(-N // chunksize) + 4  # a partial chunk is sent when the consumer waits
        finally:
            executor.shutdown()

    def test_completion_order_gives_the_same_items(self, pool):
        pipe = IterableWrapper(range(N)).map(square, concurrency=2, executor=pool, chunksize=4, ordered=False)
        assert same_multiset(pipe, [x * x for x in range(N)])

    def test_a_failing_item_is_raised_at_its_turn_with_its_note(self, pool):
        got = []
        with pytest.raises(KeyError) as info:
            for x in IterableWrapper(range(N)).map(fails_on_7, concurrency=2, executor=pool, chunksize=4):
                got.append(x)
        assert got == list(range(7)) and info.value.args == ("item-7",)
        assert info.value.__notes__ == ["[datapipes] raised in stage Mapper(fails_on_7) at item 7"]

    def test_skipping_counts_the_item_and_keeps_its_chunk_mates(self, pool):
        pipe = IterableWrapper(range(N)).map(fails_on_7, concurrency=2, executor=pool, chunksize=4,
                                             on_error="skip", warn_failures=None)
        assert list(pipe) == [x for x in range(N) if x != 7]
        assert pipe.failures.count == 1 and pipe.failures.recent[0].position == 7

    def test_a_pass_resumes_exactly(self, pool):
        check_resume(lambda: IterableWrapper(range(30)).map(square, concurrency=2, executor=pool, chunksize=4))

    def test_a_synchronous_executor_works_too(self):
        pipe = IterableWrapper(range(20)).map(square, concurrency=3, executor=Synchronous(), chunksize=4)
        assert list(pipe) == [x * x for x in range(20)]

    def test_a_process_pool(self):
        with ProcessPoolExecutor(2) as executor:
            pipe = IterableWrapper(range(N)).map(square, concurrency=2, executor=executor, chunksize=8)
            assert list(pipe) == [x * x for x in range(N)]

    def test_an_error_from_a_process_pool_carries_the_workers_traceback(self):
        with ProcessPoolExecutor(2) as executor:
            with pytest.raises(KeyError) as info:
                list(IterableWrapper(range(N)).map(fails_on_7, concurrency=2, executor=executor, chunksize=4))
        traceback_there, stage = info.value.__notes__
        assert traceback_there.startswith("[datapipes] traceback in worker process ") and "in fails_on_7" in traceback_there
        assert stage == "[datapipes] raised in stage Mapper(fails_on_7) at item 7"

    def test_an_exception_that_cannot_be_pickled_arrives_as_a_stand_in(self):
        with ProcessPoolExecutor(2) as executor:
            with pytest.raises(RuntimeError, match="Unpicklable: no pickling") as info:
                list(IterableWrapper(range(4)).map(raises_unpicklable, concurrency=2, executor=executor, chunksize=2))
        assert "the original exception could not be pickled" in info.value.__notes__[0]

    def test_threads_take_chunks_but_not_with_a_timeout(self):
        assert list(IterableWrapper(range(30)).map(square, concurrency=2, chunksize=4)) == [square(x) for x in range(30)]
        with pytest.raises(ValueError, match="Mapper: a timeout applies to one item"):
            IterableWrapper(range(3)).map(square, concurrency=2, chunksize=4, timeout=1)


@pytest.fixture
def stuck_on():
    """``stuck_on(k)``: a function that passes items through but blocks on item ``k`` (up to 10 s),
    named ``stuck_on_k``; released when the test ends."""
    release = threading.Event()

    def make(k):
        def fn(x):
            if x == k:
                release.wait(10)
            return x

        fn.__name__ = fn.__qualname__ = f"stuck_on_{k}"
        return fn

    yield make
    release.set()


class TestTimeout:
    def test_a_task_that_does_not_come_back_fails_the_pass_naming_the_stage(self, pool, stuck_on):
        got = []
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"stage Mapper\(stuck_on_5\): item 5 did not come back from the "
                                               r"executor within timeout=0.3 s") as info:
            for x in IterableWrapper(range(20)).map(stuck_on(5), concurrency=2, executor=pool, timeout=0.3):
                got.append(x)
        assert time.monotonic() - t0 < 5
        assert got == [0, 1, 2, 3, 4]
        assert "[datapipes] raised in stage Mapper(stuck_on_5) at item 5" in info.value.__notes__

    def test_tasks_that_cannot_be_scheduled_fail_instead_of_hanging(self):
        # every worker of the executor is taken by someone else: the stage's tasks wait in its queue
        release = threading.Event()
        with ThreadPoolExecutor(1) as executor:
            executor.submit(release.wait, 10)
            try:
                with pytest.raises(TimeoutError, match="item 0 did not come back"):
                    list(IterableWrapper(range(4)).map(square, concurrency=1, executor=executor, timeout=0.3))
            finally:
                release.set()

    def test_skipping_drops_the_late_items_and_goes_on(self, pool, stuck_on):
        pipe = IterableWrapper(range(10)).map(stuck_on(3), concurrency=2, executor=pool, timeout=0.3,
                                              on_error="skip", warn_failures=None)
        assert list(pipe) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
        assert pipe.failures.count == 1 and isinstance(pipe.failures.recent[0].exception, TimeoutError)

    def test_a_late_chunk_fails_each_of_its_items(self, pool, stuck_on):
        pipe = IterableWrapper(range(12)).map(stuck_on(4), concurrency=2, executor=pool, timeout=0.3, chunksize=4,
                                              on_error="skip", warn_failures=None)
        assert list(pipe) == [0, 1, 2, 3, 8, 9, 10, 11]  # items 4-7 shared the late task
        assert sorted(f.position for f in pipe.failures.recent) == [4, 5, 6, 7]

    def test_a_process_stage_takes_none(self):
        with pytest.raises(ValueError, match="timeout needs executor='thread' .* or an Executor"):
            IterableWrapper(range(3)).map(square, concurrency=2, executor="process", timeout=1)
