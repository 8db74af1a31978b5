"""The suite's own xdist scheduling (tests/xdist_scheduling.py): a group's tests run on one worker,
and a run in which tests kill their worker ends, reports each of them once, and runs every other
test."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from xdist_scheduling import GROUPS, group_of

pytest.importorskip("xdist")

TESTS = Path(__file__).resolve().parent


def _run(folder, workers):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    env["GROUP_LOG"] = str(folder / "log")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers),
         "--dist", "loadgroup", "-o", "addopts=", str(folder)],
        cwd=folder, env={**env, "PYTHONPATH": str(TESTS)}, capture_output=True, text=True, timeout=90,
    )
    return done.returncode, done.stdout + done.stderr


def _conftest(folder):
    (folder / "conftest.py").write_text(textwrap.dedent("""\
        from xdist_scheduling import make_scheduler

        def pytest_xdist_make_scheduler(config, log):
            return make_scheduler(config, log, groups={"one": ("test_grouped.py::",)})
    """))


def test_a_groups_tests_run_on_one_worker_one_after_another(tmp_path):
    _conftest(tmp_path)
    (tmp_path / "test_grouped.py").write_text(textwrap.dedent("""\
        import os, time
        import pytest

        @pytest.mark.parametrize("i", range(8))
        def test_g(i):
            log = os.environ["GROUP_LOG"]
            with open(log, "a") as f:
                f.write(f"start {os.environ['PYTEST_XDIST_WORKER']}\\n")
            time.sleep(0.05)
            with open(log, "a") as f:
                f.write("end\\n")
    """))
    (tmp_path / "test_free.py").write_text("import pytest\n@pytest.mark.parametrize('i', range(8))\n"
                                           "def test_f(i): pass\n")
    rc, out = _run(tmp_path, 2)
    assert rc == 0 and "16 passed" in out, out
    lines = (tmp_path / "log").read_text().splitlines()
    workers = {line.split()[1] for line in lines if line.startswith("start")}
    assert len(workers) == 1, lines
    assert lines == ["start " + workers.pop(), "end"] * 8, lines  # never two at once


def test_a_run_whose_tests_kill_their_worker_ends_and_reports_them(tmp_path):
    _conftest(tmp_path)
    (tmp_path / "test_free.py").write_text(textwrap.dedent("""\
        import os
        def test_a(): pass
        def test_b(): pass
        def test_dies(): os._exit(1)
        def test_c(): pass
        def test_d(): pass
    """))
    (tmp_path / "test_grouped.py").write_text(textwrap.dedent("""\
        import os
        def test_g1(): pass
        def test_g2(): os._exit(3)
        def test_g3(): pass
        def test_g4(): pass
    """))
    (tmp_path / "test_z.py").write_text("import os\ndef test_last(): os._exit(2)\n")
    for workers in (1, 2):
        # Before the fix, xdist 3.8.0 ran each dying test again and then waited for ever.
        rc, out = _run(tmp_path, workers)
        assert rc == 1, out
        assert "3 failed, 7 passed" in out, out
        for name in ("test_free.py::test_dies", "test_grouped.py::test_g2", "test_z.py::test_last"):
            assert f"crashed while running '{name}'" in out, out
            assert [line for line in out.splitlines() if line.startswith(f"FAILED {name} ")] != [], out
            assert len([line for line in out.splitlines() if line.startswith(f"FAILED {name}")]) == 1, out


def test_the_suites_groups():
    assert group_of("tests/cluster/test_ray.py::TestRayExecutor::test_lambdas_travel") == "cluster"
    assert group_of("tests/test_benchmarks.py::test_cluster_benchmark_smoke_run") == "cluster"
    assert group_of("tests/test_typing.py::TestStubInSync::test_stub_matches_the_registry") == "mypy"
    assert group_of("tests/test_loader.py::test_x") is None
    assert set(GROUPS) == {"cluster", "mypy"}
