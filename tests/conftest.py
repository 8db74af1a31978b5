"""Shared test set-up: hypothesis profiles, thread-leak helpers, and how the suite spreads over
pytest-xdist's workers (scripts/test.sh runs it with ``-n <CPUs + 1, at most 8> --dist loadgroup``; the
groups and the scheduler are in tests/xdist_scheduling.py)."""

import os
import sys
import threading

import pytest
from hypothesis import HealthCheck, settings

from helpers import FREE_THREADED
from xdist_scheduling import group_of, make_scheduler

# Concurrency makes timings vary: no deadlines. CI replays a fixed set of examples.
settings.register_profile(
    "ci", deadline=None, derandomize=True, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_collection_modifyitems(config, items):
    """Every test that starts a Ray runtime is in the "cluster" group (tests/xdist_scheduling.py).

    Tests marked ``slow`` run first (a stable sort: the order among the others is the collection's):
    xdist hands out tests in collection order, so a 40-second test collected last would run alone
    at the end while the other workers idle; started first, the short tests fill in around it. Every
    worker sorts the same collection the same way, as xdist requires."""
    stray = [item.nodeid for item in items
             if item.get_closest_marker("ray") is not None and group_of(item.nodeid) != "cluster"]
    if stray:
        raise pytest.UsageError(f"tests marked 'ray' outside the 'cluster' group of tests/xdist_scheduling.py "
                                f"(GROUPS): {stray}")
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the suite's groups, and that ends when a test kills its worker
    (tests/xdist_scheduling.py)."""
    return make_scheduler(config, log)


def pytest_report_header(config):
    if FREE_THREADED:
        return f"free-threaded CPython: the GIL is {'ENABLED' if sys._is_gil_enabled() else 'disabled'} at collection"
    return None


@pytest.fixture
def no_thread_leak():
    """Fail the test if it leaves threads running (waits up to 5 s for them to end)."""
    from datapipes.testing import threads_started_since

    before = set(threading.enumerate())
    yield
    left = threads_started_since(before, timeout=5.0)
    assert not left, f"threads left running: {[t.name for t in left]}"
