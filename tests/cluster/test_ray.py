"""datapipes.ray against a real local Ray runtime (2 CPUs): RayExecutor stages (order, errors,
cancellation, actors, resume, timeout), to_dataset and from_ray (issue 23)."""

from __future__ import annotations

import os
import pickle
import time

import pytest

from datapipes.iter import IterableWrapper
from datapipes.testing import check_resume, same_multiset
from helpers import fails_on_7, import_or_skip, square

ray = import_or_skip("ray", reason="Ray (requirements-test-gil.txt) runs the local cluster")
dray = pytest.importorskip("datapipes.ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(90), pytest.mark.usefixtures("ray_cluster")]

N = 60


def dies_on_2(x):
    if x == 2:
        os._exit(1)
    return x


def first_fast_then_stuck(x):
    if x:
        time.sleep(120)
    return x


def cpus_free():
    return ray.available_resources().get("CPU", 0.0)


def wait_for(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


class Loaded:
    """A function with a heavy setup at its first call (a model, say): each process that runs it
    does the setup once and counts its calls."""

    def __init__(self):
        self.model = None
        self.calls = 0

    def __call__(self, x):
        if self.model is None:
            self.model = os.getpid()
        self.calls += 1
        return self.model, self.calls


@pytest.fixture(scope="module")
def tasks():
    with dray.RayExecutor() as executor:
        yield executor


class TestRayExecutor:
    @pytest.mark.parametrize("chunksize", [None, 8])
    def test_ordered_gives_the_serial_result(self, tasks, chunksize):
        pipe = IterableWrapper(range(N)).map(square, concurrency=4, executor=tasks, chunksize=chunksize)
        assert list(pipe) == [x * x for x in range(N)]

    def test_completion_order_gives_the_same_items(self, tasks):
        pipe = IterableWrapper(range(N)).map(square, concurrency=4, executor=tasks, chunksize=4, ordered=False)
        assert same_multiset(pipe, [x * x for x in range(N)])

    def test_lambdas_travel(self, tasks):
        offset = 5
        pipe = IterableWrapper(range(10)).map(lambda x: x + offset, concurrency=2, executor=tasks, chunksize=4)
        assert list(pipe) == [x + 5 for x in range(10)]

    def test_a_failing_item_keeps_its_type_and_gets_the_stage_note(self, tasks):
        got = []
        with pytest.raises(KeyError) as info:
            for x in IterableWrapper(range(N)).map(fails_on_7, concurrency=2, executor=tasks, chunksize=4):
                got.append(x)
        assert got == list(range(7)) and info.value.args == ("item-7",)
        assert type(info.value) is KeyError  # not Ray's RayTaskError
        traceback_there, stage = info.value.__notes__
        assert traceback_there.startswith("[datapipes] traceback in worker process ")
        assert "in fails_on_7" in traceback_there and "KeyError: 'item-7'" in traceback_there
        assert stage == "[datapipes] raised in stage Mapper(fails_on_7) at item 7"

    def test_an_error_of_a_submitted_call_is_its_own_type_with_the_traceback_there(self, tasks):
        with pytest.raises(ValueError) as info:
            tasks.submit(int, "not a number").result(timeout=60)
        assert type(info.value) is ValueError and not isinstance(info.value, ray.exceptions.RayError)
        note = info.value.__notes__[0]
        assert note.startswith("raised on the Ray cluster, in ray::") and "invalid literal for int()" in note

    def test_a_worker_that_dies_fails_the_pass_with_rays_error_and_the_stage_note(self, tasks):
        with pytest.raises(ray.exceptions.RayError) as info:
            list(IterableWrapper(range(4)).map(dies_on_2, concurrency=2, executor=tasks))
        assert "WorkerCrashed" in type(info.value).__name__ or "died" in str(info.value).lower()
        assert info.value.__notes__[-1] == "[datapipes] raised in stage Mapper(dies_on_2) at item 2"

    def test_skipping_counts_the_item_and_keeps_its_chunk_mates(self, tasks):
        pipe = IterableWrapper(range(N)).map(fails_on_7, concurrency=2, executor=tasks, chunksize=4,
                                             on_error="skip", warn_failures=None)
        assert list(pipe) == [x for x in range(N) if x != 7]
        assert pipe.failures.count == 1 and pipe.failures.recent[0].position == 7

    def test_a_pass_resumes_exactly(self, tasks):
        check_resume(lambda: IterableWrapper(range(20)).map(square, concurrency=2, executor=tasks, chunksize=4),
                     ks=[0, 5, 13])

    def test_closing_a_pass_cancels_its_tasks_and_frees_the_cpus(self, tasks):
        assert wait_for(lambda: cpus_free() == 2)
        it = iter(IterableWrapper(range(3)).map(first_fast_then_stuck, concurrency=3, executor=tasks))
        assert next(it) == 0
        assert wait_for(lambda: cpus_free() == 0), "items 1 and 2 should be running on both CPUs"
        it.close()
        assert wait_for(lambda: cpus_free() == 2), f"the cancelled tasks still hold CPUs: {cpus_free()} free"

    def test_cancel_reaches_a_running_task(self, tasks):
        future = tasks.submit(time.sleep, 120)
        assert wait_for(lambda: cpus_free() < 2)
        assert future.cancel() and future.cancelled()
        assert wait_for(lambda: cpus_free() == 2)

    def test_submit_after_shutdown_is_refused(self):
        executor = dray.RayExecutor()
        executor.shutdown()
        executor.shutdown()  # idempotent
        with pytest.raises(RuntimeError, match="after shutdown"):
            executor.submit(square, 2)

    def test_a_copy_by_pickle_is_a_new_executor_with_the_settings(self):
        executor = dray.RayExecutor(num_cpus=0.5, actors=2, max_retries=1)
        copy = pickle.loads(pickle.dumps(executor))
        assert repr(copy) == repr(executor) == "RayExecutor(num_cpus=0.5, actors=2, max_retries=1)"
        assert copy is not executor and copy.submit(square, 3).result(timeout=60) == 9
        copy.shutdown()

    @pytest.mark.parametrize("kwargs, error, words", [
        ({"num_cpus": -1}, ValueError, "num_cpus must be a number >= 0, got -1"),
        ({"num_gpus": "1"}, ValueError, "num_gpus must be a number >= 0, got '1'"),
        ({"actors": 0}, ValueError, "actors"),
        ({"actors": 1.5}, TypeError, "actors"),
        ({"max_retries": -2}, ValueError, "max_retries"),
        ({"resources": ["a"]}, TypeError, "resources must be a mapping"),
        ({"resources": {"a": -1}}, ValueError, "resources['a'] must be a number >= 0"),
        ({"runtime_env": "pip"}, TypeError, "runtime_env must be a mapping"),
    ])
    def test_bad_settings_are_named(self, kwargs, error, words):
        with pytest.raises(error, match="RayExecutor") as info:
            dray.RayExecutor(**kwargs)
        assert words in str(info.value)


class TestActors:
    def test_each_actor_sets_up_once_and_shutdown_frees_its_cpus(self):
        assert wait_for(lambda: cpus_free() == 2)
        with dray.RayExecutor(actors=2) as executor:
            got = list(IterableWrapper(range(40)).map(Loaded(), concurrency=4, executor=executor, chunksize=2))
            pids = {pid for pid, _ in got}
            assert len(pids) == 2 and os.getpid() not in pids
            for pid in pids:  # each actor's calls count up from 1: its setup happened once
                calls = sorted(n for p, n in got if p == pid)
                assert calls == list(range(1, len(calls) + 1))
            assert wait_for(lambda: cpus_free() == 0)  # actors hold their CPUs while idle
        assert wait_for(lambda: cpus_free() == 2)

    def test_a_task_stage_waiting_for_cpus_held_by_actors_times_out(self):
        """Issue 23's measurement: an actor pool holding the cluster's CPUs made a task-based stage
        wait for minutes with no error. With a timeout the pass fails, naming the stage."""
        with dray.RayExecutor(actors=2) as holders, dray.RayExecutor() as tasks:
            assert holders.submit(square, 1).result(timeout=60) == 1
            assert wait_for(lambda: cpus_free() == 0)
            pipe = IterableWrapper(range(4)).map(square, concurrency=2, executor=tasks, timeout=2)
            started = time.monotonic()
            with pytest.raises(TimeoutError, match=r"stage Mapper\(square\): item 0 did not come back"):
                list(pipe)
            assert time.monotonic() - started < 30


class TestToDataset:
    def test_a_shuffle_before_the_filter_gives_every_item_once(self):
        pipe = IterableWrapper(range(100)).shuffle().sharding_filter().map(square)
        rows = dray.to_dataset(pipe, num_shards=4, seed=7).take_all()
        items = [row["item"] for row in rows]
        assert sorted(items) == sorted(x * x for x in range(100))
        assert items != sorted(items)  # shuffled
        again = [row["item"] for row in dray.to_dataset(pipe, num_shards=4, seed=7).take_all()]
        assert sorted(again) == sorted(items)

    def test_one_read_task_per_shard(self):
        pipe = IterableWrapper(range(10)).sharding_filter()
        source = dray._PipeDatasource(pipe, 3, seed=0)
        tasks = source.get_read_tasks(8)
        assert len(tasks) == 3
        shards = [[row for block in task() for row in ray.data.block.BlockAccessor.for_block(block).iter_rows(True)]
                  for task in tasks]
        assert shards == [[{"item": x} for x in range(k, 10, 3)] for k in range(3)]

    def test_mappings_are_rows_and_arrays_come_back(self):
        import numpy as np

        pipe = IterableWrapper(range(6)).sharding_filter().map(lambda x: {"id": x, "pixels": np.full(3, x)})
        rows = sorted(dray.to_dataset(pipe, num_shards=2).take_all(), key=lambda r: r["id"])
        assert [r["id"] for r in rows] == list(range(6))
        assert all((r["pixels"] == np.full(3, r["id"])).all() for r in rows)

    def test_a_pipe_without_sharding_filter_is_refused(self):
        with pytest.raises(ValueError, match=r"no sharding_filter\(\), so each of the 4 read tasks would read every item"):
            dray.to_dataset(IterableWrapper(range(5)).map(square), num_shards=4)

    def test_bad_arguments_are_named(self):
        pipe = IterableWrapper(range(5)).sharding_filter()
        with pytest.raises(ValueError, match="num_shards"):
            dray.to_dataset(pipe, num_shards=0)
        with pytest.raises(TypeError, match="seed"):
            dray.to_dataset(pipe, num_shards=2, seed="7")
        with pytest.raises(TypeError, match="IterDataPipe"):
            dray.to_dataset([1, 2], num_shards=2)


class TestFromRay:
    def test_rows_and_batches(self):
        ds = ray.data.range(10)
        assert [row["id"] for row in dray.from_ray(ds)] == list(range(10))
        batches = list(dray.from_ray(ds, batch_size=4))
        assert [b["id"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        frames = list(dray.from_ray(ds, batch_size=5, batch_format="pandas"))
        assert [len(f) for f in frames] == [5, 5]

    def test_a_data_iterator_reads_again_at_each_pass(self):
        pipe = dray.from_ray(ray.data.range(5).iterator()).map(lambda row: row["id"] * 10)
        assert list(pipe) == list(pipe) == [0, 10, 20, 30, 40]

    def test_state_dict_refuses_naming_the_source(self):
        it = iter(dray.from_ray(ray.data.range(5)).map(lambda row: row["id"]))
        assert next(it) == 0
        with pytest.raises(TypeError, match=r"RayDataReader.* cannot save its position: Ray cannot start a Dataset"):
            it.state_dict()

    def test_len_is_unknown(self):
        with pytest.raises(TypeError, match="has no len"):
            len(dray.from_ray(ray.data.range(5)))

    def test_streaming_split_read_together_gives_every_item_once(self):
        """What a Ray Train worker reads (get_dataset_shard is one split of streaming_split): every
        split read at once, each by its own pipe."""
        import threading

        pipe = IterableWrapper(range(40)).shuffle().sharding_filter()
        splits = dray.to_dataset(pipe, num_shards=2, seed=3).streaming_split(2, equal=False)
        got = [[], []]
        readers = [threading.Thread(target=lambda k=k: got[k].extend(row["item"] for row in dray.from_ray(splits[k])))
                   for k in range(2)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(60)
        assert not any(reader.is_alive() for reader in readers)
        assert sorted(got[0] + got[1]) == list(range(40))

    def test_the_pipe_to_dataset_and_back(self):
        pipe = IterableWrapper(range(20)).shuffle().sharding_filter()
        back = dray.from_ray(dray.to_dataset(pipe, num_shards=2, seed=1)).map(lambda row: row["item"])
        assert sorted(back) == list(range(20))

    @pytest.mark.parametrize("args, kwargs, error, words", [
        (([1, 2],), {}, TypeError, "must be a ray.data.Dataset or a ray.data.DataIterator, got list"),
        ((None,), {"batch_size": 0}, ValueError, "batch_size"),
        ((None,), {"batch_size": 2, "batch_format": "arrow"}, ValueError, "batch_format must be one of"),
        ((None,), {"batch_format": "pandas"}, ValueError, "give batch_size too"),
    ])
    def test_bad_arguments_are_named(self, args, kwargs, error, words):
        if args == (None,):
            args = (ray.data.range(3),)
        with pytest.raises(error, match="from_ray") as info:
            dray.from_ray(*args, **kwargs)
        assert words in str(info.value)
