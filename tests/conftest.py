"""Shared test set-up: hypothesis profiles and thread-leak helpers."""

import os
import threading

import pytest
from hypothesis import HealthCheck, settings

# Concurrency makes timings vary: no deadlines. CI replays a fixed set of examples.
settings.register_profile(
    "ci", deadline=None, derandomize=True, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@pytest.fixture
def no_thread_leak():
    """Fail the test if it leaves threads running (waits up to 5 s for them to end)."""
    from datapipes.testing import threads_started_since

    before = set(threading.enumerate())
    yield
    left = threads_started_since(before, timeout=5.0)
    assert not left, f"threads left running: {[t.name for t in left]}"
