"""Concurrent map on worker processes (executor="process")."""

import gc
import os
import threading

import pytest

from datapipes._engine import ProcessWorkers, StageStats
from datapipes._engine.core import failure_handler
from datapipes._engine.process import run_process_stage
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


@pytest.mark.usefixtures("no_child_left")
class TestProcessMapper:
    def test_contract_lambda_and_chunks(self):
        check_datapipe(IterableWrapper(range(50)).map(lambda x: x * x, concurrency=2, executor="process", chunksize=4),
                       expected=[x * x for x in range(50)], check_close=False,
                       build=lambda src: src.map(lambda x: x, concurrency=2, executor="process"))

    def test_unordered_and_automatic_chunks(self):
        pipe = IterableWrapper(range(3000)).map(lambda x: -x, concurrency=2, executor="process", ordered=False)
        assert sorted(pipe) == sorted(-x for x in range(3000))
        assert pipe.stats.kind == "process" and pipe.stats.items_out == 3000

    def test_runs_in_other_processes_that_did_not_import_torch(self):
        w = ProcessWorkers(lambda x: os.getpid(), 2, "S")
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
