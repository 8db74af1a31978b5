"""Shared test set-up: hypothesis profiles, thread-leak helpers, and how the suite spreads over
pytest-xdist's workers (scripts/test.sh runs it with ``-n <CPUs, at most 8> --dist loadgroup``)."""

import os
import sys
import threading

import pytest
from hypothesis import HealthCheck, settings

from helpers import FREE_THREADED

# Concurrency makes timings vary: no deadlines. CI replays a fixed set of examples.
settings.register_profile(
    "ci", deadline=None, derandomize=True, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_collection_modifyitems(config, items):
    """Tests that share a machine-wide resource run on one xdist worker, one after another, as they
    did before the suite ran in parallel:

    - the ones that start a cluster runtime (tests/cluster: Ray and Dask, each sized to the machine's
      CPUs; the cluster benchmark's smoke run): two Ray runtimes at once would each claim every CPU,
      and a module's runtime is shared by its tests;
    - the mypy runs of tests/test_typing.py, which share a cache folder (two mypy processes writing
      one cache at once end in mypy's internal error).

    Every other test goes to whichever worker is free."""
    cluster, mypy = pytest.mark.xdist_group("cluster"), pytest.mark.xdist_group("mypy")
    for item in items:
        if item.nodeid.startswith("tests/cluster/") or item.get_closest_marker("ray") is not None:
            item.add_marker(cluster)
        elif item.nodeid.startswith("tests/test_typing.py::"):
            item.add_marker(mypy)


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
