"""One local Ray runtime per test module (2 CPUs, no dashboard, no usage report), and the processes
it started killed by their PIDs at its end, should Ray leave any behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest


def _descendants(pid: int) -> set[int]:
    """The PIDs of every process below ``pid``, from /proc (Ray's raylet and GCS are children of the
    driver; its workers are the raylet's)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def ray_cluster():
    """``ray`` itself, initialised for the module with 2 CPUs."""
    from helpers import import_or_skip

    ray = import_or_skip("ray", reason="Ray (requirements-test-gil.txt) runs the local cluster")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    if ray.is_initialized():
        ray.shutdown()
    # Ray's worker processes import the tests' functions by module name, as a cluster imports an
    # installed package: the tests folder goes on their path.
    tests = str(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    env_vars = {"PYTHONPATH": tests if not path else f"{tests}{os.pathsep}{path}"}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="warning",
             runtime_env={"env_vars": env_vars})
    ray.data.DataContext.get_current().enable_progress_bars = False
    started = _descendants(os.getpid())
    try:
        yield ray
    finally:
        started |= _descendants(os.getpid())
        ray.shutdown()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in started:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

