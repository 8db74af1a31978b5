"""torchdata's mapping stages (datapipes/iter/mapping/): BatchMapper [map_batches], ThreadPoolMapper
[threadpool_map] and BatchAsyncMapper [async_map_batches]."""

import asyncio
import pickle
import random
import threading
import time

import pytest

from datapipes import DataChunk
from datapipes.iter import BatchAsyncMapper, IterableWrapper, Mapper, ThreadPoolMapper
from datapipes.testing import check_datapipe, check_resume

EVERY_K = lambda n: range(n + 1)  # noqa: E731 - check_resume's ks: stop after every number of items


class Boom(Exception):
    pass


def notes(e):
    return "\n".join(getattr(e, "__notes__", []))


# -- BatchMapper -----------------------------------------------------------------------------------


def plus_one(batch):
    return [x + 1 for x in batch]


def pairs_gen(batch):
    for x in batch:
        yield x
        yield -x


class TestBatchMapper:
    def test_torchdata_example(self):
        assert list(IterableWrapper(range(5)).map_batches(plus_one, batch_size=3)) == [1, 2, 3, 4, 5]

    def test_fn_sees_whole_batches_and_may_change_the_count(self):
        seen = []

        def fn(batch):
            seen.append(list(batch))
            return [sum(batch)]

        assert list(IterableWrapper(range(7)).map_batches(fn, 3)) == [3, 12, 6]
        assert seen == [[0, 1, 2], [3, 4, 5], [6]]
        assert list(IterableWrapper(range(3)).map_batches(pairs_gen, 2)) == [0, 0, 1, -1, 2, -2]
        assert list(IterableWrapper(range(4)).map_batches(lambda b: [], 2)) == []

    def test_input_col(self):
        rows = [(1, "a"), (2, "b"), (3, "c")]
        assert list(IterableWrapper(rows).map_batches(lambda xs: xs, 2, input_col=1)) == ["a", "b", "c"]
        assert list(IterableWrapper(rows).map_batches(lambda xs: xs, 2, input_col=[1, 0])) == [["a", 1], ["b", 2], ["c", 3]]
        dicts = [{"k": i} for i in range(3)]
        assert list(IterableWrapper(dicts).map_batches(plus_one, 5, input_col="k")) == [1, 2, 3]

    def test_arguments_and_len(self):
        with pytest.raises(ValueError, match=r"^BatchMapper\(batch_size=0\): Batch size is required to be larger than 0!$"):
            IterableWrapper([]).map_batches(plus_one, 0)
        with pytest.raises(TypeError, match="BatchMapper: fn must be callable"):
            IterableWrapper([]).map_batches(None, 2)
        with pytest.raises(ValueError, match="BatchMapper: The function"):
            IterableWrapper([]).map_batches(lambda a, b: a, 2)
        with pytest.raises(TypeError, match=r"^BatchMapper\(plus_one\): BatchMapper's length relies on the output of its function\.$"):
            len(IterableWrapper(range(3)).map_batches(plus_one, 2))

    def test_fn_errors_name_the_batch(self):
        def fn(batch):
            if 4 in batch:
                raise Boom(batch)
            return batch

        with pytest.raises(Boom) as info:
            list(IterableWrapper(range(9)).map_batches(fn, 2))
        assert "BatchMapper(" in notes(info.value) and "batch 2" in notes(info.value)
        with pytest.raises(TypeError) as info:
            list(IterableWrapper(range(3)).map_batches(lambda b: None, 2))
        assert "batch 0" in notes(info.value)

    def test_contract(self):
        check_datapipe(IterableWrapper(range(11)).map_batches(plus_one, 3),
                       build=lambda src: src.map_batches(pairs_gen, 3), probe_data=range(5))

    @pytest.mark.parametrize("fn", [plus_one, pairs_gen, tuple])
    def test_resume(self, fn):
        check_resume(lambda: IterableWrapper(range(11)).map_batches(fn, 3), EVERY_K)

    def test_pickles(self):
        pipe = IterableWrapper(range(7)).map_batches(lambda b: b[::-1], 3)
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe) == [2, 1, 0, 5, 4, 3, 6]


# -- ThreadPoolMapper ------------------------------------------------------------------------------

_jitter = random.Random(0)


def slow_ten(x):
    time.sleep(_jitter.random() * 0.002)  # completion order differs from source order
    return x * 10


class TestThreadPoolMapper:
    def test_is_a_concurrent_ordered_map(self):
        pipe = IterableWrapper(range(40)).threadpool_map(slow_ten, max_workers=4)
        assert isinstance(pipe, Mapper) and pipe.concurrency == 4 and pipe.ordered
        assert list(pipe) == [x * 10 for x in range(40)]

    def test_runs_on_worker_threads(self):
        names = set()

        def fn(x):
            names.add(threading.current_thread().name)
            time.sleep(0.001)
            return x

        assert list(IterableWrapper(range(20)).threadpool_map(fn, max_workers=3)) == list(range(20))
        assert names and all("ThreadPoolMapper(fn)" in n for n in names)

    def test_workers_and_scheduled_tasks(self):
        src = IterableWrapper(range(3))
        assert src.threadpool_map(abs).concurrency == ThreadPoolMapper(src, abs).concurrency >= 5
        assert src.threadpool_map(abs, scheduled_tasks=2, max_workers=8).concurrency == 2
        assert src.threadpool_map(abs, max_workers=1).concurrency == 1
        assert list(src.threadpool_map(abs, max_workers=1)) == [0, 1, 2]

    def test_torchdata_columns_examples(self):
        rows = [(i, i) for i in range(5)]
        assert list(IterableWrapper(rows).threadpool_map(slow_ten, input_col=1)) == [(i, i * 10) for i in range(5)]
        assert list(IterableWrapper(rows).threadpool_map(slow_ten, input_col=1, output_col=-1)) == \
            [(i, i, i * 10) for i in range(5)]
        dicts = [{"a": 1}]
        assert list(IterableWrapper(dicts).threadpool_map(slow_ten, input_col="a", output_col="b")) == [{"a": 1, "b": 10}]
        assert dicts == [{"a": 1}]

    def test_fn_errors_pass_through(self):
        def fn(x):
            if x == 7:
                raise Boom(x)
            return x

        with pytest.raises(Boom) as info:
            list(IterableWrapper(range(20)).threadpool_map(fn, max_workers=3))
        assert info.value.args == (7,)
        assert "ThreadPoolMapper(fn)" in notes(info.value) and "item 7" in notes(info.value)

    def test_arguments(self):
        src = IterableWrapper([])
        with pytest.raises(ValueError, match=r"^ThreadPoolMapper\(scheduled_tasks=0\): 'scheduled_tasks' is required to be a"):
            src.threadpool_map(abs, scheduled_tasks=0)
        with pytest.raises(ValueError, match=r"^ThreadPoolMapper\(max_workers=0\): 'max_workers' is required to be a"):
            src.threadpool_map(abs, max_workers=0)
        with pytest.raises(TypeError, match=r"ThreadPoolMapper: threadpool_kwargs \['initializer'\] are not supported"):
            src.threadpool_map(abs, initializer=print)
        with pytest.raises(ValueError, match=r"^ThreadPoolMapper\(output_col=1\): `output_col` must be None when `input_col`"):
            src.threadpool_map(abs, output_col=1)
        with pytest.raises(ValueError, match="ThreadPoolMapper: The function"):
            src.threadpool_map(lambda a, b: a, input_col=0)
        with pytest.raises(TypeError, match="ThreadPoolMapper: source_datapipe must be an IterDataPipe"):
            ThreadPoolMapper([1], abs)
        assert src.threadpool_map(abs, thread_name_prefix="io").threadpool_kwargs == {"thread_name_prefix": "io"}

    def test_len_is_the_sources(self):
        assert len(IterableWrapper(range(6)).threadpool_map(abs)) == 6

    def test_contract_and_resume(self, no_thread_leak):
        check_datapipe(IterableWrapper(range(30)).threadpool_map(slow_ten, max_workers=3),
                       build=lambda src: src.threadpool_map(abs, max_workers=2))
        check_resume(lambda: IterableWrapper(range(30)).threadpool_map(slow_ten, max_workers=3), [0, 1, 13, 29, 30])

    def test_pickles(self):
        pipe = IterableWrapper(range(5)).threadpool_map(lambda x: -x, max_workers=2)
        assert list(pickle.loads(pickle.dumps(pipe))) == [0, -1, -2, -3, -4]


async def _times_ten(x):
    await asyncio.sleep(random.random() / 1000)  # completion order shuffled on purpose
    return x * 10


class TestBatchAsyncMapper:
    def test_source_order_flat_and_batched(self):
        pipe = IterableWrapper(range(23)).async_map_batches(_times_ten, batch_size=4)
        assert isinstance(pipe, BatchAsyncMapper) and pipe.concurrency == 4
        assert list(pipe) == [x * 10 for x in range(23)] and len(pipe) == 23
        batched = IterableWrapper(range(7)).async_map_batches(_times_ten, 3, flatten=False)
        out = list(batched)
        assert out == [[0, 10, 20], [30, 40, 50], [60]] and all(type(b) is DataChunk for b in out)
        assert len(batched) == 3

    def test_columns_as_torchdata(self):
        rows = [(i, i) for i in range(4)]
        assert list(IterableWrapper(rows).async_map_batches(_times_ten, 2, input_col=1)) == [(i, i * 10) for i in range(4)]
        assert list(IterableWrapper(rows).async_map_batches(_times_ten, 2, input_col=1, output_col=-1)) == [
            (i, i, i * 10) for i in range(4)]

    def test_concurrency_is_capped_by_max_concurrency(self):
        assert IterableWrapper(range(3)).async_map_batches(_times_ten, 64, max_concurrency=5).concurrency == 5

    def test_errors_pass_through_with_a_note(self):
        async def fails(x):
            if x == 3:
                raise KeyError(x)
            return x

        with pytest.raises(KeyError) as info:
            list(IterableWrapper(range(6)).async_map_batches(fails, 2))
        assert any("BatchAsyncMapper" in n for n in info.value.__notes__)

    def test_bad_arguments(self):
        src = IterableWrapper(range(3))
        with pytest.raises(TypeError, match="^BatchAsyncMapper: Expected a corotine function with an async def syntax"):
            src.async_map_batches(lambda x: x, 2)
        with pytest.raises(ValueError, match="batch_size"):
            src.async_map_batches(_times_ten, 0)
        with pytest.raises(ValueError, match="max_concurrency"):
            src.async_map_batches(_times_ten, 2, max_concurrency=0)
        with pytest.raises(TypeError, match="flatten must be a bool"):
            src.async_map_batches(_times_ten, 2, flatten="no")

    def test_contract_pickle_and_resume(self):
        check_datapipe(IterableWrapper(range(12)).async_map_batches(_times_ten, 4), expected=[x * 10 for x in range(12)])
        check_datapipe(IterableWrapper(range(5)).async_map_batches(_times_ten, 2, flatten=False),
                       expected=[[0, 10], [20, 30], [40]])
        clone = pickle.loads(pickle.dumps(IterableWrapper(range(4)).async_map_batches(_times_ten, 2)))
        assert list(clone) == [0, 10, 20, 30]


def test_async_map_batches_keeps_the_functional_methods():
    pipe = IterableWrapper([(1, (2, 3))]).async_map_batches(_times_ten_pair, 2)
    assert list(pipe.flatten()) == [(10, 2, 3)]


async def _times_ten_pair(item):
    return (item[0] * 10, item[1])
