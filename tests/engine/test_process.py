"""Concurrent map on worker processes (executor="process")."""

import gc
import os
import threading
import time

import pytest

from datapipes._engine import ProcessWorkers, StageStats, live_worker_pids
from datapipes._engine.core import failure_handler
from datapipes._engine import process
from datapipes._engine.process import chunk_target_s, run_process_stage
from datapipes.errors import ErrorPolicy, FailureLog
from datapipes.iter import IterableWrapper
from datapipes.testing import check_datapipe

from engine_helpers import CountingSource, no_child_left  # noqa: F401 - a fixture


def make_failing():
    """A custom exception class and a function raising it, made locally so that cloudpickle sends
    them by value (a module-level function would make each worker import this test module, and torch)."""

    class Boom(Exception):
        def __init__(self, code, detail):
            super().__init__(code, detail)
            self.code = code

    def fail_at_7(x):
        if x == 7:
            raise Boom(7, "in a worker")
        return x + 1

    return Boom, fail_at_7


@pytest.fixture
def pools_released():
    """Collect what is unreachable before ``no_child_left`` looks (torn down first, as it is set up
    last): a stage caught in a reference cycle keeps its warm pool until the collector frees it."""
    yield
    gc.collect()


@pytest.mark.usefixtures("no_child_left", "pools_released")
class TestProcessMapper:
    def test_contract_lambda_and_chunks(self):
        check_datapipe(IterableWrapper(range(50)).map(lambda x: x * x, concurrency=2, executor="process", chunksize=4),
                       expected=[x * x for x in range(50)], check_close=False,
                       build=lambda src: src.map(lambda x: x, concurrency=2, executor="process"))

    def test_unordered_and_automatic_chunks(self):
        pipe = IterableWrapper(range(3000)).map(lambda x: -x, concurrency=2, executor="process", ordered=False)
        assert sorted(pipe) == sorted(-x for x in range(3000))
        assert pipe.stats.kind == "process" and pipe.stats.items_out == 3000

    def test_runs_in_other_processes_that_did_not_import_torch(self, monkeypatch, tmp_path):
        monkeypatch.setenv("DATAPIPES_PROCESS_START", "spawn")  # a forked worker has what the parent imported
        meeting = str(tmp_path)

        def pid_once_both_started(x):
            # each worker's first call waits (60 s at most) for the other's, so that both serve the
            # pass however the OS schedules them; made here, so that cloudpickle sends it by value
            mine = os.path.join(meeting, str(os.getpid()))
            if not os.path.exists(mine):
                open(mine, "w").close()
                deadline = time.monotonic() + 60
                while len(os.listdir(meeting)) < 2 and time.monotonic() < deadline:
                    time.sleep(0.005)
            return os.getpid()

        w = ProcessWorkers(pid_once_both_started, 2, "S")
        on_fail, count = failure_handler("S", ErrorPolicy(), FailureLog())
        stats = StageStats("S", "process", 2, 4)
        pids = set(run_process_stage(w, range(200), True, 10, on_fail, count, stats))
        assert os.getpid() not in pids and len(pids) == 2
        assert [info["torch_imported"] for info in w.infos] == [False, False]

    def test_error_copy_with_type_args_and_notes(self):
        Boom, fail_at_7 = make_failing()
        with pytest.raises(Boom) as info:
            list(IterableWrapper(range(20)).map(fail_at_7, concurrency=2, executor="process", chunksize=3))
        e = info.value
        assert e.args == (7, "in a worker") and e.code == 7
        assert e.__notes__[-1] == "[datapipes] raised in stage Mapper(fail_at_7) at item 7"
        assert "traceback in worker process" in e.__notes__[0] and "fail_at_7" in e.__notes__[0]

    def test_skip(self):
        _, fail_at_7 = make_failing()
        pipe = IterableWrapper(range(20)).map(fail_at_7, concurrency=2, executor="process", on_error="skip")
        assert list(pipe) == [x + 1 for x in range(20) if x != 7]
        assert pipe.failures.count == 1 and pipe.failures.recent[0].position == 7

    def test_several_failures_in_one_chunk_are_skipped_in_place(self):
        def every_third_fails(x):
            if x % 3 == 0:
                raise ValueError(x)
            return -x

        pipe = IterableWrapper(range(40)).map(every_third_fails, concurrency=2, executor="process", chunksize=10,
                                              on_error="skip")
        assert list(pipe) == [-x for x in range(40) if x % 3]
        assert pipe.failures.count == 14

    def test_source_error_comes_after_the_items_pulled_before_it(self):
        class SourceBroke(Exception):
            pass

        def source():
            yield from range(10)
            raise SourceBroke()

        got = []
        with pytest.raises(SourceBroke):
            for y in IterableWrapper(source(), deepcopy=False).map(lambda x: x * 2, concurrency=2, executor="process",
                                                                   chunksize=4):
                got.append(y)
        assert got == [x * 2 for x in range(10)]

    def test_unpicklable_item_names_stage_and_position(self):
        items = [1, 2, threading.Lock(), 4]
        with pytest.raises(TypeError, match=r"stage Mapper\(<lambda>\): item 2 cannot be pickled to go to a worker"):
            list(IterableWrapper(items).map(lambda x: x, concurrency=2, executor="process", chunksize=1))

    def test_unpicklable_fn(self):
        lock = threading.Lock()
        with pytest.raises(TypeError, match=r"stage Mapper\(<lambda>\): fn cannot be pickled"):
            list(IterableWrapper([1]).map(lambda x: lock, concurrency=2, executor="process"))

    def test_unpicklable_result_fails_that_item(self):
        with pytest.raises(TypeError, match="result of fn cannot be pickled"):
            list(IterableWrapper([1, 2]).map(lambda x: threading.Lock() if x == 2 else x, concurrency=1,
                                             executor="process"))

    def test_worker_that_dies_is_reported(self):
        with pytest.raises(RuntimeError, match=r"stage Mapper\(<lambda>\): worker process \d+ died unexpectedly"):
            list(IterableWrapper(range(10)).map(lambda x: os._exit(3) if x == 5 else x, concurrency=2,
                                                executor="process"))

    def test_a_result_that_does_not_unpickle_here_is_named(self):
        # it pickles in the worker, and its unpickling fails in the consumer's process: the pass
        # fails with the error and the worker's pid, and the pool stops (no child left)
        class FailsOnArrival:
            def __reduce__(self):
                return int, ("not a number",)

        with pytest.raises(RuntimeError, match=r"stage Mapper\(<lambda>\): the results of worker process \d+ could "
                                               r"not be unpickled in this process: ValueError\(\"invalid literal") as info:
            list(IterableWrapper(range(10)).map(lambda x: FailsOnArrival() if x == 5 else x, concurrency=3,
                                                executor="process", chunksize=1))
        assert isinstance(info.value.__cause__, ValueError)

    def test_one_reader_thread_reads_every_worker(self):
        # a writer per worker, one reader for the pool (a thread per worker cost a large pool's
        # first batch as many thread starts); the results of all of them arrive
        it = iter(IterableWrapper(range(60)).map(lambda x: (x, os.getpid()), concurrency=3, executor="process",
                                                 chunksize=1))
        rows = [next(it) for _ in range(30)]
        names = [t.name for t in threading.enumerate() if t.name.startswith("datapipes Mapper(<lambda>)")]
        rows += list(it)
        assert sorted(n for n in names if "reader" in n) == ["datapipes Mapper(<lambda>) reader"]
        assert sorted(n for n in names if "writer" in n) == [f"datapipes Mapper(<lambda>) writer {k}" for k in range(3)]
        assert [x for x, _ in rows] == list(range(60))

    def test_bounded_pulls(self):
        src = CountingSource()
        it = iter(IterableWrapper(src).map(lambda x: x, concurrency=2, executor="process", chunksize=5))
        for consumed in range(1, 301):
            next(it)
            assert src.pulled <= consumed + (2 * 2 + 1) * 5
        it.close()

    def test_early_break_and_deleted_iterator(self):
        for _ in IterableWrapper(CountingSource()).map(lambda x: x, concurrency=2, executor="process"):
            break
        it = iter(IterableWrapper(CountingSource()).map(lambda x: x, concurrency=2, executor="process"))
        next(it)
        del it
        gc.collect()

    def test_inside_dataloader_worker_is_a_clear_error(self, monkeypatch):
        import torch.utils.data

        monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
        with pytest.raises(RuntimeError, match="executor='process' cannot run inside a torch DataLoader worker"):
            list(IterableWrapper([1]).map(str, concurrency=2, executor="process"))

    def test_in_a_daemon_process_is_a_clear_error(self, monkeypatch):
        import multiprocessing

        class Daemon:
            daemon = True

        monkeypatch.setattr(multiprocessing, "current_process", lambda: Daemon())
        with pytest.raises(RuntimeError, match="a daemon process may not have children"):
            list(IterableWrapper([1]).map(str, concurrency=2, executor="process"))

    def test_close_is_idempotent(self):
        w = ProcessWorkers(lambda x: x, 1, "S")
        with w:
            w.start()
        w.close()

    def test_real_dataloader_worker(self):
        import torch.utils.data

        pipe = IterableWrapper([1, 2]).map(lambda x: x, concurrency=2, executor="process")
        it = iter(torch.utils.data.DataLoader(pipe, num_workers=1, batch_size=None, timeout=60))
        try:
            with pytest.raises(RuntimeError, match="executor='process' cannot run inside a torch DataLoader worker"):
                next(it)
        finally:
            it._shutdown_workers()  # the traceback keeps the loader's iterator (and its worker) alive


def _pids_of(pipe):
    """The worker pids a pass of ``pipe`` (whose fn returns ``(x, os.getpid())``) ran on, and its outputs."""
    out = list(pipe)
    return {pid for _, pid in out}, [x for x, _ in out]


def _with_pid():
    """``fn`` returning ``(x, worker pid)``, made locally so that cloudpickle sends it by value (by
    reference, each worker would import this test module, and torch with it)."""
    return lambda x: (x, os.getpid())


def _wait_reaped(pids, timeout=10.0):
    """Wait (bounded) until none of ``pids`` is a live worker of this process."""
    from datapipes._engine import live_worker_pids

    deadline = time.monotonic() + timeout
    while live_worker_pids() & pids and time.monotonic() < deadline:
        time.sleep(0.01)
    return live_worker_pids() & pids


@pytest.mark.usefixtures("no_child_left", "pools_released")
class TestWarmPool:
    """A stage keeps its worker processes across passes (its epochs): see datapipes._engine.process."""

    @staticmethod
    def run_pass(owner, items, fn=lambda x: (x, os.getpid()), **kw):
        w = ProcessWorkers(fn, 2, "S", owner=owner)
        on_fail, count = failure_handler("S", ErrorPolicy(), FailureLog())
        out = list(run_process_stage(w, items, kw.pop("ordered", True), kw.pop("chunksize", 5), on_fail, count,
                                     StageStats("S", "process", 2, 4)))
        return w, out

    def test_next_pass_of_the_owner_reuses_the_workers(self):
        owner = Owner()
        w1, out1 = self.run_pass(owner, range(100))
        w2, out2 = self.run_pass(owner, range(100, 200), fn=lambda x: (-x, os.getpid()))  # a new fn each pass
        assert [x for x, _ in out1] == list(range(100)) and [x for x, _ in out2] == [-x for x in range(100, 200)]
        pids = {info["pid"] for info in w1.infos}
        assert len(pids) == 2 and not w1.warm and w2.warm and {info["pid"] for info in w2.infos} == pids
        assert {p for _, p in out1 + out2} <= pids and live_worker_pids() == pids
        del owner
        gc.collect()
        assert not _wait_reaped(pids), "dropping the owner did not stop its workers"

    def test_without_owner_each_pass_starts_and_stops_its_workers(self):
        w, out = self.run_pass(None, range(50))
        assert not w.warm and not live_worker_pids() & {p for _, p in out}

    def test_early_close_drains_so_the_next_pass_sees_only_its_own_results(self):
        owner = Owner()
        w = ProcessWorkers(lambda x: (x, os.getpid()), 2, "S", owner=owner)
        on_fail, count = failure_handler("S", ErrorPolicy(), FailureLog())
        it = run_process_stage(w, range(10_000), True, 50, on_fail, count, StageStats("S", "process", 2, 4))
        first = [next(it) for _ in range(3)]  # four chunks of 50 in flight
        it.close()
        assert w.tally.in_flight >= 1 and not w.tally.failed  # closed with work in flight
        w2, out = self.run_pass(owner, range(30), fn=lambda x: (x * 10, os.getpid()))
        assert w2.warm and [x for x, _ in out] == [x * 10 for x in range(30)]
        assert {p for _, p in first + out} <= {info["pid"] for info in w.infos} and w2._outq.empty()

    def test_failed_pass_stops_the_pool(self):
        owner = Owner()
        Boom, fail_at_7 = make_failing()
        w = ProcessWorkers(fail_at_7, 2, "S", owner=owner)
        on_fail, count = failure_handler("S", ErrorPolicy(), FailureLog())
        with pytest.raises(Boom):
            list(run_process_stage(w, range(100), True, 3, on_fail, count, StageStats("S", "process", 2, 4)))
        assert not live_worker_pids(), "a failed pass left its workers"
        w2, out = self.run_pass(owner, range(10))
        assert not w2.warm and [x for x, _ in out] == list(range(10))

    def test_closed_by_a_failing_consumer_stops_the_pool(self):
        owner = Owner()
        w = ProcessWorkers(lambda x: x, 2, "S", owner=owner)
        on_fail, count = failure_handler("S", ErrorPolicy(), FailureLog())
        it = run_process_stage(w, range(10_000), True, 5, on_fail, count, StageStats("S", "process", 2, 4))
        next(it)
        try:
            raise KeyError("downstream failed")
        except KeyError:
            it.close()  # what lifecycle.abandon does on the way out of a failing consumer
        assert w.tally.failed and not live_worker_pids()

    def test_idle_pool_is_stopped_after_the_idle_timeout(self, monkeypatch):
        from datapipes._engine import process

        monkeypatch.setattr(process, "IDLE_S", 0.05)
        owner = Owner()
        _, out = self.run_pass(owner, range(20))
        assert not _wait_reaped({p for _, p in out}), "the idle pool outlived its timeout"
        w, _ = self.run_pass(owner, range(20))
        assert not w.warm

    def test_dead_parked_worker_is_not_reused(self):
        owner = Owner()
        _, out = self.run_pass(owner, range(20))
        victim = next(p for _, p in out)
        os.kill(victim, 9)
        deadline = time.monotonic() + 10
        while process_alive(victim) and time.monotonic() < deadline:
            time.sleep(0.01)
        w, out2 = self.run_pass(owner, range(20))
        assert not w.warm and victim not in {p for _, p in out2} and [x for x, _ in out2] == list(range(20))

    def test_pipe_passes_reuse_the_workers_and_dropping_the_pipe_stops_them(self):
        pipe = IterableWrapper(range(300)).map(_with_pid(), concurrency=2, executor="process")
        used1, out1 = _pids_of(pipe)
        pool = live_worker_pids()  # the pipe's parked pool
        used2, out2 = _pids_of(pipe)
        assert out1 == out2 == list(range(300)) and len(pool) == 2 and used1 | used2 <= pool
        assert live_worker_pids() == pool
        for _ in pipe:  # an early break leaves the pool clean for the next pass
            break
        used3, out3 = _pids_of(pipe)
        assert out3 == list(range(300)) and used3 <= pool and live_worker_pids() == pool
        del pipe
        gc.collect()
        assert not _wait_reaped(pool)

    def test_contract_with_close_check(self):
        # passes after the first one take the parked pool: an early close starts no thread and leaves none
        check_datapipe(IterableWrapper(range(40)).map(lambda x: -x, concurrency=2, executor="process"),
                       expected=[-x for x in range(40)])

    def test_pickled_pipe_gets_its_own_pool(self):
        import pickle

        pipe = IterableWrapper(range(50)).map(_with_pid(), concurrency=2, executor="process")
        _pids_of(pipe)
        pool = live_worker_pids()
        copy = pickle.loads(pickle.dumps(pipe))
        used, out = _pids_of(copy)
        pool_copy = live_worker_pids() - pool
        assert out == list(range(50)) and len(pool_copy) == 2 and used <= pool_copy
        assert _pids_of(pipe)[0] <= pool and _pids_of(copy)[0] <= pool_copy and live_worker_pids() == pool | pool_copy

    def test_forked_dataloader_worker_leaves_the_parked_pool_alone(self):
        import torch.utils.data

        pipe = IterableWrapper(range(40)).map(_with_pid(), concurrency=2, executor="process")
        _pids_of(pipe)
        pool = live_worker_pids()
        it = iter(torch.utils.data.DataLoader(pipe, num_workers=1, batch_size=None, timeout=60,
                                              multiprocessing_context="fork"))
        try:
            with pytest.raises(RuntimeError, match="cannot run inside a torch DataLoader worker"):
                next(it)
        finally:
            it._shutdown_workers()
        used, out = _pids_of(pipe)  # the forked worker (now gone) neither stopped nor used the pool
        assert out == list(range(40)) and used <= pool and live_worker_pids() == pool


class TestChunkSizing:
    """Automatically sized chunks aim at more work per chunk as the workers grow in number
    (``chunk_target_s``): a large pool's results cost the consumer fewer messages, and its ordered
    window holds enough work per worker to ride out a slow item."""

    def test_target_grows_with_the_active_workers(self):
        assert [chunk_target_s(n) for n in (1, 2, 3, 4)] == [0.010] * 4
        assert chunk_target_s(16) == pytest.approx(0.040)
        assert chunk_target_s(64) == pytest.approx(0.160)
        targets = [chunk_target_s(n) for n in range(1, 129)]
        assert targets == sorted(targets)

    @staticmethod
    def chunk_sizes(monkeypatch, workers):
        sizes = []
        real = _ENCODE  # the module's own (a second call must not wrap the first's wrapper)

        def encode(chunk_id, items, first, label):
            sizes.append(len(items))
            return real(chunk_id, items, first, label)

        monkeypatch.setattr(process, "_encode", encode)
        pipe = IterableWrapper(range(600)).map(_sleep_2ms, concurrency=workers, executor="process")
        assert list(pipe) == list(range(600))
        return sizes

    @pytest.mark.usefixtures("no_child_left", "pools_released")
    @pytest.mark.slow
    @pytest.mark.timeout(360)  # 16 worker processes on 2 CPUs: 20 s alone, past 120 s beside other heavy tests
    def test_sixteen_workers_take_larger_chunks_than_two(self, monkeypatch):
        # 2 ms an item (a sleep: no CPU, so 16 workers run side by side on any machine): 10 ms chunks
        # hold 5 items at most, 40 ms chunks up to 20 (fewer where the sleeps run long)
        two = self.chunk_sizes(monkeypatch, 2)
        sixteen = self.chunk_sizes(monkeypatch, 16)
        assert two[0] == sixteen[0] == 1  # the first chunk of a pass holds one item
        assert max(two) <= 5
        assert max(sixteen) >= 10


_ENCODE = process._encode


def _sleep_2ms(x):
    time.sleep(0.002)
    return x


class Owner:
    """A stand-in for the stage that owns a warm pool."""


def process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"
