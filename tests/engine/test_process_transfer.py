"""Process stages: how workers start (forked where the fork is clean) and how results come back
(large buffers in a memfd, mapped by the consumer, freed with the last item that views them)."""

import gc
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from datapipes._engine import _procworker
from datapipes._engine._start import start_method
from datapipes.iter import IterableWrapper

from engine_helpers import no_child_left  # noqa: F401 - a fixture
from helpers import FREE_THREADED

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
linux_only = pytest.mark.skipif(not _procworker.OOB_SUPPORTED, reason="memfds and fork checks are Linux's")


def run_script(body: str, env: dict[str, str] | None = None) -> dict:
    """Run ``body`` in a fresh interpreter (one thread, unlike this test process) with warnings as
    errors; return the JSON it prints last."""
    code = "import sys\nsys.path.insert(0, %r)\n" % ROOT + textwrap.dedent(body)
    full_env = {k: v for k, v in os.environ.items() if k != "DATAPIPES_PROCESS_START"}
    full_env.update(env or {})
    r = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True, text=True,
                       timeout=120, env=full_env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def memfd_mappings() -> int:
    """Mappings of result memfds in this process."""
    with open("/proc/self/maps") as f:
        return sum("datapipes-result" in line for line in f)


def memfd_descriptors() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += "datapipes-result" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return n


# Each worker's first call waits until every worker has made its first (or 60 s): a test that
# counts the workers that served a pass does not depend on how the OS schedules them (one worker
# and its writer thread can otherwise serve a whole short pass before the other gets a chunk). The
# marker files name the worker, so this holds for forked workers and fresh interpreters alike.
MEET = """
import atexit as _atexit, os as _os, shutil as _shutil, tempfile as _tempfile, time as _time
MEET_DIR = _tempfile.mkdtemp(prefix="datapipes-meet-")
_atexit.register(_shutil.rmtree, MEET_DIR, True)  # the script's process only: workers leave by os._exit

def meet(workers):
    mine = _os.path.join(MEET_DIR, str(_os.getpid()))
    if _os.path.exists(mine):
        return
    open(mine, "w").close()
    deadline = _time.monotonic() + 60
    while len(_os.listdir(MEET_DIR)) < workers and _time.monotonic() < deadline:
        _time.sleep(0.005)
"""

STAGE = MEET + """
import json, os, threading
from datapipes.iter import IterableWrapper

def where(x):
    meet(2)
    return os.getpid(), os.getppid(), "numpy" in sys.modules

pipe = IterableWrapper(range(40)).map(where, executor="process", concurrency=2, chunksize=2)
it = iter(pipe)
rows = list(it)
print(json.dumps({"me": os.getpid(), "rows": rows}))
"""


@linux_only
class TestStart:
    def test_forks_where_the_fork_is_clean_with_numpy_loaded(self):
        # numpy's OpenBLAS runs a thread pool, and stops it at a fork: the fork is clean, no warning
        got = run_script("import numpy\n" + STAGE)
        pids = {pid for pid, _, _ in got["rows"]}
        assert len(pids) == 2 and got["me"] not in pids
        assert all(has_numpy for _, _, has_numpy in got["rows"])

    def test_forked_workers_draw_their_own_global_random_numbers(self):
        # a fork copies numpy's and torch's global generators: each worker gets fresh ones, as a fresh
        # interpreter would (else every worker repeats the same "random" augmentations)
        body = MEET + textwrap.dedent("""
        import json, os, random, sys
        import numpy as np, torch
        from datapipes.iter import IterableWrapper

        sys.modules["parent_only"] = type(sys)("parent_only")  # a forked worker has it, a fresh one not

        def draw(x):
            meet(2)
            forked = "parent_only" in sys.modules
            return os.getpid(), forked, float(np.random.random()), float(torch.rand(1)), random.random()

        rows = list(IterableWrapper(range(40)).map(draw, executor="process", concurrency=2, chunksize=1))
        print(json.dumps({"me": os.getpid(), "rows": rows, "parent": [float(np.random.random()), float(torch.rand(1))]}))
        """)
        got = run_script(body)
        firsts = {}
        for pid, forked, *draws in got["rows"]:
            assert forked
            firsts.setdefault(pid, draws)
        assert len(firsts) == 2
        a, b = firsts.values()
        assert all(x != y for x, y in zip(a, b))
        assert a[:2] != got["parent"] and b[:2] != got["parent"]

    @pytest.mark.slow
    def test_a_seeded_numpy_random_is_reseeded_in_each_worker(self):
        # the parent imported numpy.random and seeded it: workers must not repeat its sequence
        body = MEET + textwrap.dedent("""
        import json, os
        import numpy as np
        from datapipes.iter import IterableWrapper

        np.random.seed(0)

        def draw(x):
            meet(2)
            return os.getpid(), float(np.random.random())

        rows = list(IterableWrapper(range(40)).map(draw, executor="process", concurrency=2, chunksize=1))
        print(json.dumps({"rows": rows, "seeded": float(np.random.RandomState(0).random_sample())}))
        """)
        got = run_script(body)
        firsts = {}
        for pid, value in got["rows"]:
            firsts.setdefault(pid, value)
        assert len(firsts) == 2 and len(set(firsts.values())) == 2
        assert got["seeded"] not in firsts.values()

    def test_numpy_random_is_not_imported_in_a_worker_for_its_reseed(self):
        # numpy 2 imports numpy.random on first use; a parent that never used it leaves it to the
        # worker's own first use (importing it to reseed it cost each worker about 11 ms)
        body = """
        import json, os, sys
        import numpy
        from datapipes.iter import IterableWrapper

        def loaded(x):
            return "numpy.random" in sys.modules

        parent = "numpy.random" in sys.modules
        rows = list(IterableWrapper(range(8)).map(loaded, executor="process", concurrency=2, chunksize=1))
        print(json.dumps({"parent": parent, "rows": rows}))
        """
        got = run_script(body)
        assert got["rows"] == [got["parent"]] * 8

    def test_a_native_thread_running_at_the_fork_makes_fresh_interpreters(self):
        # a thread threading does not know of (as a C library's): the fork is not clean, the worker is
        # told to exit unused and a fresh interpreter runs instead; Python's fork warning is not raised
        body = "import _thread, time, numpy\n_thread.start_new_thread(time.sleep, (30,))\n" + STAGE
        got = run_script(body)
        assert all(ppid == got["me"] and not has_numpy for _, ppid, has_numpy in got["rows"])

    def test_a_python_thread_makes_fresh_interpreters_without_trying(self):
        body = "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n" + STAGE
        got = run_script(body)
        assert len({pid for pid, _, _ in got["rows"]}) == 2

    def test_spawn_asked_for(self):
        got = run_script("import numpy\n" + STAGE, env={"DATAPIPES_PROCESS_START": "spawn"})
        assert not any(has_numpy for _, _, has_numpy in got["rows"])

    def test_bad_setting_is_named(self, monkeypatch):
        monkeypatch.setenv("DATAPIPES_PROCESS_START", "forkserver")
        with pytest.raises(ValueError,
                           match="DATAPIPES_PROCESS_START must be one of auto, fork, spawn, got 'forkserver'"):
            start_method()

    @pytest.mark.parametrize("workers", [3, 6])  # forked by the consumer, then by a zygote
    def test_forked_workers_exit_when_their_parent_is_killed(self, workers):
        # each forked worker closes the parent's ends of the others' channels, so every one of them
        # sees the end of its input when the parent dies, not only the last one started
        code = "import sys\nsys.path.insert(0, %r)\n" % ROOT + MEET + textwrap.dedent("""
            import os, time
            import numpy
            from datapipes.iter import IterableWrapper
            it = iter(IterableWrapper(range(1000)).map(lambda x: (os.getpid(), meet(WORKERS)), executor="process",
                                                       concurrency=WORKERS, chunksize=1))
            pids = {next(it)[0] for _ in range(120)}
            print(" ".join(map(str, sorted(pids))), flush=True)
            time.sleep(60)
            """).replace("WORKERS", str(workers))
        env = {k: v for k, v in os.environ.items() if k != "DATAPIPES_PROCESS_START"}
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
        try:
            pids = [int(x) for x in p.stdout.readline().split()]
        finally:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            p.stdout.close()
        assert len(pids) == workers

        def alive(pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                return False

        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in pids if alive(pid)] == []


ZYGOTE = """
import ctypes, json, os, sys, time
import numpy
from datapipes.iter import IterableWrapper
from datapipes._engine import live_worker_pids

libc = ctypes.CDLL(None)

def subreaper():
    flag = ctypes.c_int()
    libc.prctl(37, ctypes.byref(flag), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
    return flag.value

def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])

def children_left():
    time.sleep(0.2)  # a worker killed at the pool's shutdown is reaped there; nothing else may remain
    try:
        return os.waitpid(-1, os.WNOHANG) != (0, 0) or True
    except ChildProcessError:
        return False

def where(x):
    time.sleep(0.002)
    return os.getpid(), "numpy" in sys.modules

def report_failure(fn):  # a pass of 6 workers that must fail: its error, and what it left
    error = None
    try:
        list(IterableWrapper(range(200)).map(fn, executor="process", concurrency=6, chunksize=1))
    except RuntimeError as e:
        error = str(e)
    print(json.dumps({"error": error, "left": sorted(live_worker_pids()), "subreaper": subreaper(),
                      "children": children_left()}))
"""

#: a patched ``os.fork``: the zygote's forks from the ``n``-th call of the script on (the consumer's
#: fork of the zygote is call 1, the zygote's first fork call 2) do ``what`` first
SLOW_FORKS = """
_real_fork, _calls = os.fork, [0]

def _fork():
    _calls[0] += 1
    if _calls[0] >= FROM:
        WHAT
    return _real_fork()

os.fork = _fork
"""


def patched_fork(from_call: int, what: str) -> str:
    return SLOW_FORKS.replace("FROM", str(from_call)).replace("WHAT", what)


#: a patched ``os.fork``: the zygote is killed as its fork of call ``n`` (counted as in SLOW_FORKS)
#: returns, once that worker exists and before the zygote reports it (as the OOM killer may); that
#: worker says its hello 0.3 s late (after closing its copy of the zygote's report pipe: its first
#: ``gc.freeze``), so the consumer has seen the zygote die first
DYING_ZYGOTE = """
import gc
_real_fork, _calls = os.fork, [0]

def _fork():
    _calls[0] += 1
    pid = _real_fork()
    if pid and _calls[0] == CALL:
        os.kill(os.getpid(), 9)
    if pid == 0 and _calls[0] == CALL:
        _freeze = gc.freeze
        gc.freeze = lambda: (time.sleep(0.3), _freeze())
    return pid

os.fork = _fork
"""


@linux_only
class TestZygote:
    """A pool of ``ZYGOTE_MIN_WORKERS`` or more is forked by a zygote, which this process adopts the
    workers of (docs/architecture.rst, "Process stages")."""

    def test_a_large_pool_is_forked_by_a_zygote_and_its_workers_adopted(self):
        body = ZYGOTE + textwrap.dedent("""
        it = iter(IterableWrapper(range(400)).map(where, executor="process", concurrency=6, chunksize=1))
        rows = [next(it) for _ in range(10)]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the zygote exits after its last fork; its workers are then ours
            pids = sorted(live_worker_pids())
            if len(pids) == 6 and all(parent_of(p) == os.getpid() for p in pids) and not subreaper():
                break
            time.sleep(0.01)
        parents = [parent_of(p) for p in pids]
        rows += list(it)
        del it  # its pipe, which keeps the pool warm for a next pass, goes with it
        print(json.dumps({"me": os.getpid(), "pids": pids, "parents": parents, "subreaper": subreaper(),
                          "rows": rows, "left": sorted(live_worker_pids()), "children": children_left()}))
        """)
        got = run_script(body)
        assert len(got["pids"]) == 6 and got["parents"] == [got["me"]] * 6
        assert got["subreaper"] == 0  # this process is a subreaper only while a zygote runs
        assert len(got["rows"]) == 400 and all(forked for _, forked in got["rows"])
        assert {pid for pid, _ in got["rows"]} <= set(got["pids"])
        assert got["left"] == [] and not got["children"]

    @pytest.mark.parametrize("setting, workers, forks_here", [("auto", 6, 1), ("fork", 6, 6), ("auto", 5, 5)])
    def test_who_forks_the_workers(self, setting, workers, forks_here):
        # the consumer forks a zygote for 6 workers or more, unless DATAPIPES_PROCESS_START=fork; each
        # worker itself below that
        body = ZYGOTE + patched_fork(10**6, "pass") + textwrap.dedent("""
        rows = list(IterableWrapper(range(60)).map(where, executor="process", concurrency=WORKERS, chunksize=1))
        print(json.dumps({"forks_here": _calls[0], "forked": all(forked for _, forked in rows), "rows": len(rows)}))
        """).replace("WORKERS", str(workers))
        got = run_script(body, env={"DATAPIPES_PROCESS_START": setting})
        assert got == {"forks_here": forks_here, "forked": True, "rows": 60}

    def test_a_consumer_that_was_a_subreaper_stays_one(self):
        body = ZYGOTE + textwrap.dedent("""
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER, as a process manager may have set it
        rows = list(IterableWrapper(range(50)).map(where, executor="process", concurrency=6, chunksize=1))
        print(json.dumps({"subreaper": subreaper(), "rows": len(rows), "children": children_left()}))
        """)
        got = run_script(body)
        assert got == {"subreaper": 1, "rows": 50, "children": False}

    def test_a_worker_the_zygote_cannot_fork_fails_the_pass_with_the_reason(self):
        # the third worker's fork fails (as under a container's pids limit): the pass fails at once,
        # naming it, and the two forked workers are stopped and reaped
        fail = 'raise BlockingIOError(11, "Resource temporarily unavailable (simulated)")'
        got = run_script(ZYGOTE + patched_fork(4, fail) + "report_failure(where)\n")
        assert got["error"].startswith(
            "stage Mapper(where): a worker process could not be started: the zygote could not fork it: "
            "BlockingIOError(11, 'Resource temporarily unavailable (simulated)')")
        assert got["left"] == [] and got["subreaper"] == 0 and not got["children"]

    def test_a_worker_its_dying_zygote_did_not_report_is_stopped_and_reaped(self):
        # the zygote is killed right after forking the third worker: the three it never forked fail
        # the pass, and the third, known only from its hello, is stopped and reaped with the others
        got = run_script(ZYGOTE + DYING_ZYGOTE.replace("CALL", "4") + "report_failure(where)\n")
        assert got["error"] == ("stage Mapper(where): a worker process could not be started: "
                                "the zygote that forks the pool's workers died")
        assert got["left"] == [] and got["subreaper"] == 0 and not got["children"]

    def test_a_pool_whose_zygote_died_after_its_last_fork_runs_whole(self):
        # killed after forking the last worker, before reporting it: every worker exists, so the
        # pass runs on all six, and the last one's pid comes from its hello
        body = ZYGOTE + DYING_ZYGOTE.replace("CALL", "7") + textwrap.dedent("""
        MEET
        def meet_where(x):
            meet(6)
            return where(x)

        it = iter(IterableWrapper(range(120)).map(meet_where, executor="process", concurrency=6, chunksize=1))
        rows = [next(it)]
        deadline = time.monotonic() + 10
        while len(live_worker_pids()) < 6 and time.monotonic() < deadline:  # the last one's hello
            time.sleep(0.01)
        known = sorted(live_worker_pids())
        rows += list(it)
        del it
        print(json.dumps({"rows": rows, "known": known, "left": sorted(live_worker_pids()),
                          "subreaper": subreaper(), "children": children_left()}))
        """).replace("MEET", MEET)
        got = run_script(body)
        assert len(got["rows"]) == 120
        assert len(got["known"]) == 6 and {pid for pid, _ in got["rows"]} == set(got["known"])
        assert got["left"] == [] and got["subreaper"] == 0 and not got["children"]

    def test_the_first_chunks_go_to_the_workers_that_exist(self):
        # the zygote's forks after the first take half a second each: the first worker does every
        # item of a short pass meanwhile; its end waits for the zygote and stops every worker
        body = ZYGOTE + patched_fork(3, "time.sleep(0.5)") + textwrap.dedent("""
        t0 = time.monotonic()
        rows = list(IterableWrapper(range(12)).map(where, executor="process", concurrency=6, chunksize=1))
        print(json.dumps({"rows": rows, "seconds": time.monotonic() - t0, "left": sorted(live_worker_pids()),
                          "subreaper": subreaper(), "children": children_left()}))
        """)
        got = run_script(body)
        assert len(got["rows"]) == 12 and len({pid for pid, _ in got["rows"]}) == 1
        assert got["left"] == [] and got["subreaper"] == 0 and not got["children"]
        assert got["seconds"] < 10

    def test_a_worker_killed_mid_pass_is_named_and_the_others_stopped(self):
        body = ZYGOTE + textwrap.dedent("""
        def die_at_30(x):
            if x == 30:
                os.kill(os.getpid(), 9)
            return where(x)

        report_failure(die_at_30)
        """)
        got = run_script(body)
        assert re.fullmatch(r"stage Mapper\(die_at_30\): worker process \d+ died unexpectedly", got["error"])
        assert got["left"] == [] and got["subreaper"] == 0 and not got["children"]

    def test_killing_the_consumer_while_the_zygote_forks_leaves_no_process(self):
        head = "import sys\nsys.path.insert(0, %r)\n" % ROOT + ZYGOTE + patched_fork(3, "time.sleep(0.3)")
        code = head + textwrap.dedent("""
            it = iter(IterableWrapper(range(1000)).map(where, executor="process", concurrency=8, chunksize=1))
            next(it)
            print("running", flush=True)
            time.sleep(60)
            """)
        env = {k: v for k, v in os.environ.items() if k != "DATAPIPES_PROCESS_START"}
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
        try:
            assert p.stdout.readline().strip() == "running"
        finally:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            p.stdout.close()

        def in_session(sid):  # live (not zombie) processes of the consumer's session: its zygote and workers
            found = []
            for name in os.listdir("/proc"):
                if name.isdigit():
                    try:
                        with open(f"/proc/{name}/stat") as f:
                            fields = f.read().rsplit(")", 1)[1].split()
                    except OSError:
                        continue
                    if int(fields[3]) == sid and fields[0] != "Z":
                        found.append(int(name))
            return found

        # A loaded machine: the workers notice the consumer's death late. One empty reading is not
        # enough: /proc is listed before each process is read, so a child forked while a parent
        # exits can be missed once (CI once saw it a reading later, already exiting).
        deadline = time.monotonic() + 30
        empty = 0
        while empty < 3 and time.monotonic() < deadline:
            empty = 0 if in_session(p.pid) else empty + 1
            time.sleep(0.05)
        left = [] if empty >= 3 else in_session(p.pid)

        def described(pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    line = f.read().replace(b"\0", b" ").decode(errors="replace")
                return f"{pid}: {line[:200]}"
            except OSError:
                return f"{pid}: gone"

        assert left == [], [described(pid) for pid in left]

def arrays(i):
    import numpy as np

    big = np.arange(50_000, dtype=np.float64) + i  # 400 KB: out of band
    return {"big": big, "small": np.full(4, i, np.int16), "view": big[::2], "pair": (big.reshape(100, 500), i)}


def tensors(i):
    import torch

    return [torch.full((256, 256), float(i)), torch.arange(10) + i, torch.ones(300, 300, dtype=torch.bfloat16) * i,
            torch.ones(200, 200, requires_grad=True)]


@linux_only
@pytest.mark.usefixtures("no_child_left")
class TestResults:
    def test_arrays_come_back_equal_writable_and_mapped(self):
        pipe = IterableWrapper(range(12)).map(arrays, executor="process", concurrency=2, chunksize=3)
        got = list(pipe)
        for i, out in enumerate(got):
            want = arrays(i)
            assert out["big"].dtype == np.float64 and np.array_equal(out["big"], want["big"])
            assert np.array_equal(out["small"], want["small"]) and np.array_equal(out["view"], want["view"])
            assert out["pair"][1] == i and np.array_equal(out["pair"][0], want["pair"][0])
            assert out["big"].flags.writeable and out["big"].ctypes.data % 64 == 0
            out["big"][0] = -1  # writable, and only this item's copy changes
            assert got[0]["big"][0] == -1 and (i == 0 or got[i - 1]["big"][0] == -1)
        assert memfd_mappings() > 0
        del got, out
        gc.collect()
        if FREE_THREADED:
            # The results were made on the pool's reader thread, which owns their reference counts
            # (biased reference counting): dropped here, they are freed when that thread next runs,
            # at the stage's next pass or when its pool closes (docs/platforms.rst, "Free-threaded").
            del pipe
            gc.collect()
        assert memfd_mappings() == 0 and memfd_descriptors() == 0

    def test_tensors(self):
        got = list(IterableWrapper(range(3)).map(tensors, executor="process", concurrency=2, chunksize=1))
        for i, out in enumerate(got):
            for have, want in zip(out, tensors(i)):
                assert type(have) is torch.Tensor and have.dtype == want.dtype and torch.equal(have, want)
                assert have.requires_grad == want.requires_grad
        del got, out
        gc.collect()
        assert memfd_mappings() == 0

    @pytest.mark.slow
    def test_an_early_close_or_a_failure_leaves_nothing_mapped(self):
        it = iter(IterableWrapper(range(100)).map(arrays, executor="process", concurrency=2, chunksize=2))
        first = next(it)
        it.close()
        del first, it
        gc.collect()
        assert memfd_mappings() == 0 and memfd_descriptors() == 0

        def boom(i):
            if i == 9:
                raise ValueError(i)
            return arrays(i)

        with pytest.raises(ValueError):
            list(IterableWrapper(range(100)).map(boom, executor="process", concurrency=2, chunksize=2))
        gc.collect()
        assert memfd_mappings() == 0 and memfd_descriptors() == 0

    def test_a_worker_killed_mid_pass_leaves_nothing_mapped(self):
        def die_at_20(i):
            if i == 20:
                os.kill(os.getpid(), 9)
            return arrays(i)

        with pytest.raises(RuntimeError, match="died unexpectedly"):
            list(IterableWrapper(range(100)).map(die_at_20, executor="process", concurrency=2, chunksize=2))
        gc.collect()
        assert memfd_mappings() == 0 and memfd_descriptors() == 0


class TestPayload:
    """The worker's side of a results message, run here."""

    def test_large_buffers_leave_the_message_small_ones_stay(self):
        values = [np.ones(100_000, np.uint8), np.ones(10, np.uint8), b"x" * 100]
        message, fd = _procworker._results_payload(3, 0.5, values, {}, oob=_procworker.OOB_SUPPORTED)
        if not _procworker.OOB_SUPPORTED:
            assert fd is None
            return
        assert message[:1] == b"B" and fd is not None and len(message) < 1000
        (chunk_id, seconds, back, failures), mapped = _procworker.load_out_of_band(message, fd)
        assert mapped >= 100_000
        assert (chunk_id, seconds, failures) == (3, 0.5, {})
        assert np.array_equal(back[0], values[0]) and np.array_equal(back[1], values[1]) and back[2] == values[2]

    @pytest.mark.skipif(not _procworker.OOB_SUPPORTED, reason="memfds are Linux's")
    def test_out_of_mappings_copies_the_buffers_instead(self, monkeypatch):
        import mmap

        values = [np.arange(100_000, dtype=np.int32)]
        message, fd = _procworker._results_payload(1, 0.0, values, {}, oob=True)

        def no_more(*args, **kwargs):
            raise OSError(12, "Cannot allocate memory")

        monkeypatch.setattr(mmap, "mmap", no_more)
        (_, _, back, _), size = _procworker.load_out_of_band(message, fd)
        assert np.array_equal(back[0], values[0]) and back[0].flags.writeable and size >= 400_000

    def test_no_large_buffer_is_an_ordinary_pickle(self):
        message, fd = _procworker._results_payload(1, 0.0, [np.ones(10), "a"], {}, oob=True)
        assert fd is None and pickle.loads(message)[2][1] == "a"

    def test_memory_full_sends_the_buffers_in_band(self, monkeypatch):
        def full(*args):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(_procworker.os, "memfd_create", full, raising=False)
        message, fd = _procworker._results_payload(1, 0.0, [np.ones(100_000)], {}, oob=True)
        assert fd is None and np.array_equal(pickle.loads(message)[2][0], np.ones(100_000))

    def test_failures_and_what_only_cloudpickle_takes_go_in_band(self):
        message, fd = _procworker._results_payload(1, 0.0, [None, np.ones(100_000)], {0: ValueError("x")}, oob=True)
        assert fd is None and isinstance(pickle.loads(message)[3][0], ValueError)
        message, fd = _procworker._results_payload(1, 0.0, [lambda: 1, np.ones(100_000)], {}, oob=True)
        assert fd is None and pickle.loads(message)[2][0]() == 1
