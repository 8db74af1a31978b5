"""Helpers shared by the engine tests: a counting lazy source, the live children of this process, and
the ``no_child_left`` fixture (imported by the test modules that use it)."""

import itertools
import gc
import multiprocessing
import threading

import pytest

from helpers import child_pids


class CountingSource:
    """A re-iterable, lazy source (unbounded unless ``n``) that counts how many items were pulled."""

    def __init__(self, n=None):
        self.n = n
        self.pulled = 0
        self.lock = threading.Lock()

    def __iter__(self):
        for i in itertools.count() if self.n is None else range(self.n):
            with self.lock:
                self.pulled += 1
            yield i


@pytest.fixture
def no_child_left():
    """Fail the test if it leaves a child process behind (waits up to 5 s)."""
    from datapipes._engine import live_worker_pids
    from datapipes.testing import threads_started_since

    before_children = child_pids()
    before_threads = set(threading.enumerate())
    yield
    gc.collect()  # a pipe caught in a reference cycle keeps its warm process pool until collected
    threads_started_since(before_threads, timeout=5.0)
    assert not live_worker_pids(), f"worker processes not reaped: {live_worker_pids()}"
    assert not multiprocessing.active_children()
    assert child_pids() <= before_children, f"child processes left: {child_pids() - before_children}"
