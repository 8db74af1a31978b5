"""datapipes.DataLoader: the torch spelling, the SPDL spelling, seeds and epochs, workers, timeouts,
even batch counts across ranks, and the lifecycle of its threads and processes."""

import asyncio
import gc
import json
import logging
import pickle
import multiprocessing
import os
import random
import sys
import threading
import time
import warnings
from collections import Counter

import numpy as np
import pytest
import torch

from datapipes.iter import IterableWrapper
from datapipes.loader import DataLoader
from datapipes.map import SequenceWrapper

from helpers import child_pids as process_children


def child_pids():
    """Pids of this process's live children (from /proc: every thread's children list), but for
    multiprocessing's resource tracker, which lives as long as the process once started."""
    from multiprocessing import resource_tracker

    pids = process_children()
    pids.discard(getattr(resource_tracker._resource_tracker, "_pid", None))
    return pids


def wait_children_gone(before, timeout=10.0):
    deadline = time.monotonic() + timeout
    while child_pids() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    return child_pids() - before


def as_lists(batches):
    return [b.tolist() for b in batches]


def resumed_after(make, k):
    """The batches of a loader from ``make()`` stopped after ``k``, its state (through pickle)
    loaded into a new loader from ``make()``, followed by what that one yields."""
    first = make()
    it = iter(first)
    head = [next(it).tolist() for _ in range(k)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    it.close()
    again = make()
    again.load_state_dict(state)
    return head + as_lists(again)


def _print_warnings(worker_id):
    """A worker_init_fn: a worker prints every warning to stderr (pytest's recording of warnings,
    inherited by a forked worker, would keep them in the worker)."""

    def show(message, category, filename, lineno, file=None, line=None):
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    warnings.showwarning = show
    warnings.simplefilter("always")


class Gate:
    """A re-iterable source that yields ``first`` items, then waits on an event before the rest."""

    def __init__(self, first, rest, event):
        self.first, self.rest, self.event = first, rest, event

    def __iter__(self):
        yield from self.first
        self.event.wait(10)
        yield from self.rest


# -- the torch spelling ------------------------------------------------------------------------------


class TestTorchSpelling:
    def test_batches_are_collated_tensors(self):
        loader = DataLoader(IterableWrapper(range(10)), batch_size=4)
        batches = list(loader)
        assert all(isinstance(b, torch.Tensor) for b in batches)
        assert as_lists(batches) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        assert len(loader) == 3

    def test_a_map_style_dataset_is_read_by_index(self):
        # its __getitem__ never raises IndexError: iterating it (the sequence protocol) would never end
        class Squares(torch.utils.data.Dataset):
            def __len__(self):
                return 10

            def __getitem__(self, i):
                return i * i

        loader = DataLoader(Squares(), batch_size=4)
        assert as_lists(loader) == [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81]] and len(loader) == 3
        tensors = torch.utils.data.TensorDataset(torch.arange(6))
        assert [b[0].tolist() for b in DataLoader(tensors, batch_size=4)] == [[0, 1, 2, 3], [4, 5]]

    def test_a_map_style_dataset_is_sharded_by_index_and_resumes(self):
        calls = multiprocessing.get_context("fork").Value("i", 0)

        class Counted(torch.utils.data.Dataset):
            def __len__(self):
                return 20

            def __getitem__(self, i):
                with calls.get_lock():
                    calls.value += 1
                return i

        def loader():
            return DataLoader(Counted(), batch_size=3, num_workers=2, seed=0, multiprocessing_context="fork")

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "add sharding_filter()" warning: the loader shards the indices
            full = as_lists(loader())
        assert sorted(sum(full, [])) == list(range(20))
        assert calls.value == 20  # each item loaded once, by the worker whose shard it is
        assert resumed_after(loader, 3) == full

    @pytest.mark.parametrize("workers", [0, 2, 3])
    def test_a_map_style_dataset_gives_torch_loaders_batches_in_its_order(self, workers):
        # batches of consecutive indices, each fetched whole by one worker, taken in turn
        data = torch.utils.data.TensorDataset(torch.arange(11))
        kwargs = {"multiprocessing_context": "fork"} if workers else {}
        ours = [b[0].tolist() for b in DataLoader(data, batch_size=3, num_workers=workers, **kwargs)]
        assert ours == [b[0].tolist() for b in torch.utils.data.DataLoader(data, batch_size=3, num_workers=workers)]
        assert as_lists(DataLoader(list(range(7)), batch_size=2, num_workers=workers, **kwargs)) == [
            [0, 1], [2, 3], [4, 5], [6]]
        rows = np.arange(14).reshape(7, 2)
        assert as_lists(DataLoader(rows, batch_size=3, num_workers=workers, **kwargs)) == [
            b.tolist() for b in torch.utils.data.DataLoader(rows, batch_size=3, num_workers=workers)]

    def test_a_dataset_with_getitems_is_fetched_a_batch_at_a_time(self):
        class Batched(torch.utils.data.Dataset):
            def __len__(self):
                return 5

            def __getitem__(self, i):
                raise AssertionError("fetched one by one")

            def __getitems__(self, indices):
                return [i * 2 for i in indices]

        assert as_lists(DataLoader(Batched(), batch_size=2)) == [[0, 2], [4, 6], [8]]

    def test_a_map_style_pipe_in_index_order_is_sharded_by_index(self):
        calls = multiprocessing.get_context("fork").Value("i", 0)

        def load(x):
            with calls.get_lock():
                calls.value += 1
            return x * 10

        def loader(pipe):
            return DataLoader(pipe, batch_size=4, num_workers=2, multiprocessing_context="fork")

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # sharded by the loader: no warning
            got = as_lists(loader(SequenceWrapper(list(range(12))).map(load)))
        assert sorted(sum(got, [])) == [x * 10 for x in range(12)] and calls.value == 12
        # a pipe in an order of its own (a dict's keys) is read as it iterates, sharded at the end
        with pytest.warns(UserWarning, match="no sharding_filter"):
            keyed = as_lists(loader(SequenceWrapper({"a": 1, "b": 2, "c": 3}).map(load)))
        assert sorted(sum(keyed, [])) == [10, 20, 30]

    def test_a_torch_iterable_dataset_shards_itself_in_the_workers(self):
        # as with torch's DataLoader: each worker runs the dataset whole, which splits the work with
        # get_worker_info(); the loader adds no sharding_filter() (it would drop half of each half)
        class Split(torch.utils.data.IterableDataset):
            def __iter__(self):
                info = torch.utils.data.get_worker_info()
                n, i = (1, 0) if info is None else (info.num_workers, info.id)
                return iter(range(i, 20, n))

        def loader():
            return DataLoader(Split(), batch_size=3, num_workers=2, seed=0, multiprocessing_context="fork")

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            full = as_lists(loader())
        assert sorted(sum(full, [])) == list(range(20))
        assert resumed_after(loader, 3) == full

    def test_drop_last(self):
        loader = DataLoader(IterableWrapper(range(10)), batch_size=4, drop_last=True)
        assert as_lists(loader) == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert len(loader) == 2

    def test_nested_samples(self):
        data = [{"x": np.full((2, 3), i, np.float32), "y": i} for i in range(5)]
        batches = list(DataLoader(IterableWrapper(data), batch_size=2))
        assert [b["x"].shape for b in batches] == [(2, 2, 3), (2, 2, 3), (1, 2, 3)]
        assert batches[0]["x"].dtype == torch.float32
        assert [b["y"].tolist() for b in batches] == [[0, 1], [2, 3], [4]]

    def test_collate_fn(self):
        loader = DataLoader(IterableWrapper(range(7)), batch_size=3, collate_fn=lambda b: sum(b))
        assert list(loader) == [3, 12, 6]
        assert "Collator" in repr(loader.pipe)

    def test_collate_fn_without_batch_size_applies_to_each_item(self):
        assert list(DataLoader(IterableWrapper(range(3)), batch_size=None, collate_fn=lambda x: x * 10)) == [0, 10, 20]

    def test_no_batch_size_passes_items_as_they_are(self):
        loader = DataLoader(IterableWrapper(["a", None, 3]), batch_size=None)
        assert list(loader) == ["a", None, 3]
        assert len(loader) == 3

    def test_to_device_cpu(self):
        loader = DataLoader(IterableWrapper(range(5)), batch_size=2, device="cpu", pin_memory=True)
        batches = list(loader)
        assert all(b.device.type == "cpu" for b in batches)
        assert as_lists(batches) == [[0, 1], [2, 3], [4]]
        # pinning for the CPU is pointless: no pin_memory stage
        assert "PinMemory" not in repr(loader.pipe) and "DeviceMover" in repr(loader.pipe)

    def test_to_device_without_batch_size_moves_items_unstacked(self):
        # torch's loader does not stack items without a batch_size; nor does to_device then, and a
        # collate_fn whose batches are lists is not collated a second time on the way to the device.
        t = torch.arange(3)
        got = list(DataLoader(IterableWrapper([[t, t + 1]]), batch_size=None, device="cpu"))
        assert len(got) == 1 and isinstance(got[0], list) and [x.tolist() for x in got[0]] == [[0, 1, 2], [1, 2, 3]]
        got = list(DataLoader(IterableWrapper([t]), batch_size=None, collate_fn=lambda x: [x, x * 2], device="cpu"))
        assert isinstance(got[0], list) and [x.tolist() for x in got[0]] == [[0, 1, 2], [0, 2, 4]]

    def test_pin_memory_without_a_device(self):
        loader = DataLoader(IterableWrapper(range(4)), batch_size=2, pin_memory=True)
        assert "PinMemory" in repr(loader.pipe)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # no CUDA here: pinning is skipped
            assert as_lists(loader) == [[0, 1], [2, 3]]

    def test_plain_iterables_and_map_pipes(self):
        assert as_lists(DataLoader([1, 2, 3], batch_size=2)) == [[1, 2], [3]]
        assert as_lists(DataLoader(SequenceWrapper([5, 6, 7]), batch_size=2)) == [[5, 6], [7]]
        assert as_lists(DataLoader(range(3), batch_size=3)) == [[0, 1, 2]]

    def test_len_follows_the_pipe(self):
        data = list(range(5))
        loader = DataLoader(IterableWrapper(data), batch_size=2)
        assert len(loader) == 3
        data.extend(range(5))
        assert len(loader) == 5
        assert len(list(loader)) == 5

    def test_len_unknown_names_the_stage(self):
        loader = DataLoader(IterableWrapper(range(5)).filter(lambda x: x % 2 == 1), batch_size=2)
        with pytest.raises(TypeError, match="Filter"):
            len(loader)
        assert as_lists(loader) == [[1, 3]]  # list() still works

    def test_len_with_workers_counts_each_workers_batches(self):
        # no process starts for len(): each worker's shard is computed in this process
        pipe = IterableWrapper(range(23)).sharding_filter()
        assert len(DataLoader(pipe, batch_size=4, num_workers=2)) == 3 + 3  # shards of 12 and 11
        assert len(DataLoader(pipe, batch_size=4, drop_last=True, num_workers=2)) == 3 + 2
        assert len(DataLoader(pipe, batch_size=None, num_workers=3)) == 23
        assert pipe.groups == {}  # the shards lent for the count were taken back
        with pytest.raises(TypeError, match="Filter"):
            len(DataLoader(IterableWrapper(range(5)).filter(bool).sharding_filter(), batch_size=2, num_workers=2))

    def test_errors_pass_through(self):
        class Boom(Exception):
            pass

        def bad(x):
            if x == 3:
                raise Boom(x)
            return x

        loader = DataLoader(IterableWrapper(range(6)).map(bad), batch_size=2)
        it = iter(loader)
        assert next(it).tolist() == [0, 1]
        with pytest.raises(Boom) as info:
            next(it)
        assert info.value.args == (3,)

    def test_repr_and_bool(self):
        loader = DataLoader(IterableWrapper(range(3)).filter(bool), batch_size=2)
        assert bool(loader) is True  # never calls len
        assert repr(loader) == "DataLoader(IterableWrapper -> Filter(bool) -> Batcher(2) -> Collator(collate))"


HAS_CUDA = torch.cuda.is_available()


class TestDevice:
    @pytest.mark.gpu
    @pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
    def test_cuda_batches_are_pinned_and_copied(self):
        data = [{"x": torch.full((3,), float(i)), "y": i} for i in range(10)]
        loader = DataLoader(IterableWrapper(data), batch_size=4, pin_memory=True, device="cuda")
        assert "PinMemory" in repr(loader.pipe)
        batches = list(loader)
        assert all(b["x"].is_cuda and b["y"].is_cuda for b in batches)
        assert [b["y"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]

    @pytest.mark.gpu
    @pytest.mark.slow
    @pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
    def test_cuda_with_workers(self):
        pipe = IterableWrapper(range(20)).sharding_filter().map(lambda x: torch.tensor(x))
        loader = DataLoader(pipe, batch_size=4, pin_memory=True, device="cuda", num_workers=2)
        batches = list(loader)
        assert all(b.is_cuda for b in batches)
        assert sorted(sum((b.tolist() for b in batches), [])) == list(range(20))

    @pytest.mark.skipif(HAS_CUDA, reason="checks the error raised where there is no CUDA")
    def test_cuda_without_cuda_raises_when_the_pass_starts(self):
        loader = DataLoader(IterableWrapper(range(4)), batch_size=2, device="cuda")  # builds anywhere
        with pytest.raises(RuntimeError, match="CUDA"):
            list(loader)


# -- seeds and epochs --------------------------------------------------------------------------------


def shuffled(seed=None, n=20):
    return DataLoader(IterableWrapper(range(n)).shuffle(), batch_size=None, seed=seed)


class TestSeeds:
    def test_same_seed_same_order(self):
        a, b = list(shuffled(3)), list(shuffled(3))
        assert a == b and sorted(a) == list(range(20)) and a != list(range(20))
        assert list(shuffled(4)) != a

    def test_each_pass_is_a_new_epoch(self):
        loader = shuffled(3)
        first, second, third = list(loader), list(loader), list(loader)
        assert first != second != third and sorted(second) == list(range(20))
        assert loader.epoch == 2
        other = shuffled(3)
        other.set_epoch(1)
        assert list(other) == second

    def test_set_epoch_reshuffles_deterministically(self):
        loader = shuffled(7)
        loader.set_epoch(5)
        a = list(loader)
        loader.set_epoch(5)
        assert list(loader) == a
        loader.set_epoch(0)
        assert list(loader) == list(shuffled(7))  # epoch 0, as a fresh loader's first pass
        fresh = shuffled(7)
        fresh.set_epoch(1)
        assert list(loader) == list(fresh)  # no set_epoch: counts on from 0 to 1
        assert loader.epoch == 1

    def test_no_seed_follows_torch_manual_seed(self):
        torch.manual_seed(11)
        a = shuffled()
        first, second = list(a), list(a)
        torch.manual_seed(11)
        b = shuffled()
        assert list(b) == first and list(b) == second
        assert first != second

    def test_set_epoch_rejects_bad_values(self):
        with pytest.raises(ValueError, match="epoch"):
            shuffled(1).set_epoch(-1)
        with pytest.raises(ValueError, match="epoch"):
            shuffled(1).set_epoch("1")

    def test_ranks_from_the_environment_share_upstream_order(self, monkeypatch):
        # RANK/WORLD_SIZE (as torchrun sets them), no process group: the seed comes from the user
        def rank_items(rank):
            with monkeypatch.context() as m:
                m.setenv("RANK", str(rank))
                m.setenv("WORLD_SIZE", "2")
                pipe = IterableWrapper(range(20)).shuffle().sharding_filter()
                return list(DataLoader(pipe, batch_size=None, seed=3))

        a, b = rank_items(0), rank_items(1)
        assert sorted(a + b) == list(range(20)) and len(a) == len(b) == 10

    def test_ranks_without_a_process_group_need_a_seed(self, monkeypatch):
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = DataLoader(IterableWrapper(range(8)).shuffle().sharding_filter(), batch_size=None)
        with pytest.raises(RuntimeError, match=r"Shuffler.*upstream of sharding_filter\(\).*Pass seed="):
            iter(loader)
        # a shuffle downstream of the sharding needs no agreement
        assert sorted(DataLoader(IterableWrapper(range(8)).sharding_filter().shuffle(),
                                 batch_size=None)) == [1, 3, 5, 7]

    def test_random_stages_downstream_of_sharding_differ_per_rank(self, monkeypatch):
        def draws(rank):
            with monkeypatch.context() as m:
                m.setenv("RANK", str(rank))
                m.setenv("WORLD_SIZE", "2")
                pipe = IterableWrapper(range(10)).sharding_filter().map(lambda x, rng: rng.random(), rng="python")
                return list(DataLoader(pipe, batch_size=None, seed=0))

        assert draws(0) != draws(1)
        assert draws(1) == draws(1)

    def test_seed_in_the_spdl_spelling(self):
        src = IterableWrapper(range(12)).shuffle()
        a = list(DataLoader(src, preprocessor=lambda x: x, batch_size=4, seed=2))
        b = list(DataLoader(src, preprocessor=lambda x: x, batch_size=4, seed=2))
        assert a == b and sorted(sum(a, [])) == list(range(12))


# -- the SPDL spelling -------------------------------------------------------------------------------


class TestSpdlSpelling:
    def test_preprocess_batch_aggregate_transfer(self):
        threads = set()
        active = [0, 0]
        lock = threading.Lock()

        def transfer(batch):
            with lock:
                active[0] += 1
                active[1] = max(active)
            time.sleep(0.002)
            threads.add(threading.get_ident())
            with lock:
                active[0] -= 1
            return ("moved", batch)

        loader = DataLoader(range(10), preprocessor=lambda x: x * 2, batch_size=4, aggregator=tuple,
                            transfer_fn=transfer, buffer_size=2, num_threads=4)
        assert list(loader) == [("moved", (0, 2, 4, 6)), ("moved", (8, 10, 12, 14)), ("moved", (16, 18))]
        assert len(threads) == 1 and threading.get_ident() not in threads  # one background thread
        assert active[1] == 1  # transfers never overlap
        assert len(loader) == 3
        assert repr(loader.pipe).endswith("Batcher(4) -> Mapper(tuple) -> Mapper(transfer) -> Prefetcher(2)")

    def test_src_keyword_and_no_batching(self):
        loader = DataLoader(src=[1, 2, 3], preprocessor=str)
        assert list(loader) == ["1", "2", "3"]
        # the SPDL spelling never collates: batches are lists
        assert list(DataLoader(src=range(5), batch_size=2)) == [[0, 1], [2, 3], [4]]

    def test_async_source_and_async_preprocessor(self):
        async def source():
            for i in range(9):
                await asyncio.sleep(0)
                yield i

        async def double(x):
            await asyncio.sleep(random.random() / 1000)
            return x * 2

        loader = DataLoader(source(), preprocessor=double, batch_size=4, num_threads=3)
        assert list(loader) == [[0, 2, 4, 6], [8, 10, 12, 14], [16]]
        with pytest.raises(TypeError, match="IterableWrapper"):
            len(loader)

    def test_async_aggregator(self):
        async def total(batch):
            await asyncio.sleep(0)
            return sum(batch)

        assert list(DataLoader(range(6), preprocessor=abs, batch_size=3, aggregator=total)) == [3, 12]

    @pytest.mark.parametrize("num_threads", [1, 4])
    def test_generator_preprocessor(self, num_threads):
        def repeat(x):
            for _ in range(x):
                yield x

        loader = DataLoader(range(5), preprocessor=repeat, batch_size=4, num_threads=num_threads)
        assert list(loader) == [[1, 2, 2, 3], [3, 3, 4, 4], [4, 4]]
        with pytest.raises(TypeError, match="FlatMapper"):
            len(loader)

    @pytest.mark.parametrize("num_threads", [1, 3])
    def test_async_generator_preprocessor(self, num_threads):
        async def pairs(x):
            for i in range(2):
                await asyncio.sleep(0)
                yield (x, i)

        loader = DataLoader(range(3), preprocessor=pairs, batch_size=4, num_threads=num_threads)
        assert list(loader) == [[(0, 0), (0, 1), (1, 0), (1, 1)], [(2, 0), (2, 1)]]

    def test_output_order(self):
        def jitter(x):
            time.sleep(random.random() / 200)
            return x

        ordered = DataLoader(range(40), preprocessor=jitter, num_threads=8)
        assert list(ordered) == list(range(40))  # our default: input order
        loader = DataLoader(range(40), preprocessor=jitter, num_threads=8, output_order="completion")
        assert Counter(loader) == Counter(range(40))

    def test_buffer_bounds_the_read_ahead(self):
        pulled = []

        def source():
            for i in range(100):
                pulled.append(i)
                yield i

        it = iter(DataLoader(source(), preprocessor=lambda x: x, num_threads=1, buffer_size=3))
        assert next(it) == 0
        time.sleep(0.05)
        assert len(pulled) <= 1 + 3 + 1  # the item taken, the buffer, the one being produced
        it.close()


# -- timeouts ----------------------------------------------------------------------------------------


class TestTimeout:
    @pytest.mark.parametrize("spelling", ["spdl", "torch"])
    def test_a_stuck_pipe_raises_timeout_error(self, spelling, no_thread_leak):
        event = threading.Event()  # holds the source after its first batch; set at the end, so its thread can end
        source = IterableWrapper(Gate([1, 2], [3], event))
        if spelling == "spdl":
            loader = DataLoader(source, preprocessor=lambda x: x, batch_size=2, num_threads=1, timeout=0.5)
        else:
            loader = DataLoader(source, batch_size=2, timeout=0.5)
        it = iter(loader)
        try:
            assert list(next(it)) == [1, 2]
            with pytest.raises(TimeoutError, match=r"DataLoader: batch 1 did not arrive within timeout=0.5 s"):
                next(it)
        finally:
            event.set()

    def test_no_timeout_when_batches_come_in_time(self):
        loader = DataLoader(range(6), preprocessor=lambda x: x, batch_size=2, timeout=5)
        assert list(loader) == [[0, 1], [2, 3], [4, 5]] and len(loader) == 3


# -- arguments ---------------------------------------------------------------------------------------


class TestArguments:
    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"batch_size": 0}, ValueError, "batch_size must be >= 1, got 0"),
            ({"batch_size": "8"}, TypeError, "batch_size must be an int"),
            ({"batch_size": None, "drop_last": True}, ValueError, "drop_last=True needs a batch_size"),
            ({"batch_size": 2, "drop_last": "yes"}, TypeError, "drop_last must be a bool"),
            ({"collate_fn": 3}, TypeError, "collate_fn must be callable"),
            ({"pin_memory": "yes"}, TypeError, "pin_memory must be a bool"),
            ({"device": "nodevice"}, ValueError, "device='nodevice'"),
            ({"device": 1.5}, TypeError, "device must be"),
            ({"num_workers": -1}, ValueError, "num_workers must be >= 0, got -1"),
            ({"num_workers": 1.0}, TypeError, "num_workers must be an int"),
            ({"persistent_workers": True}, ValueError, "persistent_workers needs num_workers > 0"),
            ({"prefetch_factor": 2}, ValueError, "prefetch_factor needs num_workers > 0"),
            ({"seed": 1.5}, TypeError, "seed must be an int or None"),
            ({"seed": True}, TypeError, "seed must be an int or None"),
            ({"even_batches": "trim"}, ValueError, "even_batches must be None, 'drop' or 'pad', got 'trim'"),
            ({"even_batches": True}, ValueError, "even_batches must be"),
            ({"timeout": -1}, ValueError, "timeout must be > 0 \\(or 0 or None: no timeout\\), got -1"),
            ({"timeout": "1"}, TypeError, "timeout must be a number"),
            ({"preprocessor": 3}, TypeError, "preprocessor must be callable"),
            ({"aggregator": "x"}, TypeError, "aggregator must be callable"),
            ({"transfer_fn": 1}, TypeError, "transfer_fn must be callable"),
            ({"buffer_size": 0}, ValueError, "buffer_size must be >= 1, got 0"),
            ({"num_threads": 0}, ValueError, "num_threads must be >= 1, got 0"),
            ({"output_order": "random"}, ValueError, "output_order must be 'input' or 'completion', got 'random'"),
        ],
    )
    def test_bad_arguments(self, kwargs, error, match):
        with pytest.raises(error, match=match) as info:
            DataLoader(IterableWrapper(range(3)), **kwargs)
        assert str(info.value).startswith("DataLoader: ")

    @pytest.mark.parametrize(
        "kwargs, names",
        [
            ({"preprocessor": abs, "collate_fn": list}, ["preprocessor=", "collate_fn="]),
            ({"transfer_fn": abs, "device": "cpu"}, ["transfer_fn=", "device="]),
            ({"num_threads": 2, "num_workers": 2}, ["num_threads=", "num_workers="]),
            ({"buffer_size": 2, "pin_memory": True}, ["buffer_size=", "pin_memory="]),
            ({"output_order": "input", "persistent_workers": True}, ["output_order=", "persistent_workers="]),
        ],
    )
    def test_mixing_the_spellings(self, kwargs, names):
        with pytest.raises(TypeError, match="cannot mix") as info:
            DataLoader(range(3), **kwargs)
        assert all(name in str(info.value) for name in names)

    def test_src_selects_the_spdl_spelling(self):
        with pytest.raises(TypeError, match=r"src=.*collate_fn="):
            DataLoader(src=range(3), batch_size=2, collate_fn=list)

    def test_data_given_once(self):
        with pytest.raises(TypeError, match="not both"):
            DataLoader([1], src=[2])
        with pytest.raises(TypeError, match="missing the data"):
            DataLoader(batch_size=2)
        with pytest.raises(TypeError, match="pipe must be an IterDataPipe, an iterable or an async iterable, got int"):
            DataLoader(3)

    def test_shared_arguments_do_not_select_a_spelling(self):
        loader = DataLoader(range(4), batch_size=2, drop_last=True, seed=1, timeout=5, even_batches="drop")
        assert as_lists(loader) == [[0, 1], [2, 3]]  # torch spelling: collated


# -- lifecycle ---------------------------------------------------------------------------------------


class TestLifecycle:
    def test_break_stops_the_threads(self, no_thread_leak):
        loader = DataLoader(range(1000), preprocessor=lambda x: x, batch_size=4, num_threads=4)
        for i, _ in enumerate(loader):
            if i == 2:
                break

    def test_close_and_collect_stop_the_threads(self, no_thread_leak):
        loader = DataLoader(range(1000), preprocessor=lambda x: x, batch_size=4, num_threads=4, timeout=5)
        it = iter(loader)
        next(it)
        it.close()
        it = iter(loader)
        next(it)
        del it
        gc.collect()

    def test_each_iter_is_an_independent_pass(self):
        loader = DataLoader(IterableWrapper(range(6)), batch_size=2)
        a, b = iter(loader), iter(loader)
        assert next(a).tolist() == [0, 1] and next(b).tolist() == [0, 1]
        assert next(a).tolist() == [2, 3]
        a.close(), b.close()

    def test_context_manager(self):
        with DataLoader(IterableWrapper(range(3)), batch_size=3) as loader:
            assert as_lists(loader) == [[0, 1, 2]]


# -- worker processes --------------------------------------------------------------------------------


@pytest.mark.slow
class TestWorkers:
    def test_two_workers_cover_every_item_once(self, no_thread_leak):
        before = child_pids()
        pipe = IterableWrapper(range(23)).shuffle().sharding_filter().map(lambda x: x * 10)
        loader = DataLoader(pipe, batch_size=4, num_workers=2, seed=5)
        first = as_lists(loader)
        assert sorted(sum(first, [])) == [x * 10 for x in range(23)]
        # 23 items: the shards hold 12 and 11, in batches of 4 per worker: 3 + 3
        assert len(loader) == 6 == len(first)
        second = as_lists(loader)  # a new epoch: another order, every item once
        assert sorted(sum(second, [])) == sorted(sum(first, [])) and second != first
        loader.set_epoch(0)
        assert as_lists(loader) == first
        assert not wait_children_gone(before)

    def test_random_stages_downstream_of_sharding_differ_per_worker(self):
        pipe = IterableWrapper(range(8)).sharding_filter().map(lambda x, rng: (x, rng.random()), rng="python")
        got = dict(DataLoader(pipe, batch_size=None, num_workers=2, seed=0))
        assert sorted(got) == list(range(8))
        assert [got[x] for x in (0, 2, 4, 6)] != [got[x] for x in (1, 3, 5, 7)]  # worker 0 vs worker 1

    def test_no_sharding_filter_warns_and_still_yields_each_item_once(self):
        with pytest.warns(UserWarning, match="no sharding_filter"):
            loader = DataLoader(IterableWrapper(range(10)), batch_size=3, num_workers=2)
        assert sorted(sum(as_lists(loader), [])) == list(range(10))

    @pytest.mark.parametrize("persistent", [False, True])
    def test_no_sharding_filter_warns_once_per_loader(self, capfd, persistent):
        # Counted in this process and in the workers (which print theirs to stderr), over 3 epochs.
        with warnings.catch_warnings(record=True) as here:
            warnings.simplefilter("always")
            loader = DataLoader(IterableWrapper(range(6)).map(abs), batch_size=2, num_workers=2,
                                persistent_workers=persistent, worker_init_fn=_print_warnings)
            for _ in range(3):
                assert sorted(sum(as_lists(loader), [])) == list(range(6))
            loader.close()
        in_main = [w for w in here if "sharding_filter" in str(w.message)]
        assert len(in_main) == 1 and "has no sharding_filter()" in str(in_main[0].message)
        assert capfd.readouterr().err.count("sharding_filter") == 0  # none from the workers

    def test_persistent_spawned_workers_see_set_epoch_and_stop_on_close(self):
        # spawn: the pipe (lambda included), the seed and the shared epoch travel by pickle
        before = child_pids()
        pipe = IterableWrapper(range(12)).shuffle().sharding_filter().map(lambda x: x + 0)
        with DataLoader(pipe, batch_size=3, num_workers=2, seed=1, persistent_workers=True,
                        multiprocessing_context="spawn") as loader:
            first, second = as_lists(loader), as_lists(loader)
            assert sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(12))
            assert first != second
            loader.set_epoch(0)
            assert as_lists(loader) == first
            assert child_pids() - before  # the workers persist between passes
        assert not wait_children_gone(before)

    def test_persistent_workers_a_second_iter_ends_the_live_pass(self):
        # torch's loader resets its one iterator under the first pass, which then goes on with the
        # second pass's batches; here the first pass ends (its iterator is exhausted) and the second
        # is whole
        data = IterableWrapper(range(20)).sharding_filter()
        with DataLoader(data, batch_size=2, num_workers=2, persistent_workers=True) as loader:
            a = iter(loader)
            next(a)
            b = iter(loader)
            assert list(a) == []  # ended: it takes nothing of the second pass
            assert sorted(sum((x.tolist() for x in b), [])) == list(range(20))
            c = iter(loader)
            next(c)
            c.close()
            assert sorted(sum((x.tolist() for x in iter(loader)), [])) == list(range(20))
            for _ in loader:
                break  # a dropped iterator ends its pass
            assert sorted(sum((x.tolist() for x in loader), [])) == list(range(20))

    def test_persistent_workers_refuse_a_second_pass_from_another_thread(self):
        data = IterableWrapper(range(20)).sharding_filter()
        with DataLoader(data, batch_size=2, num_workers=2, persistent_workers=True) as loader:
            results, errors = [], []

            def consume():
                try:
                    results.append(sorted(sum((x.tolist() for x in loader), [])))
                except RuntimeError as e:
                    errors.append(str(e))

            threads = [threading.Thread(target=consume) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            # either the passes did not overlap (both whole) or one was refused: never mixed batches
            assert all(r == list(range(20)) for r in results)
            assert len(results) + len(errors) == 2
            assert all("already being iterated" in e for e in errors)

    def test_without_persistent_workers_two_iterators_are_two_passes(self):
        data = IterableWrapper(range(12)).sharding_filter()
        loader = DataLoader(data, batch_size=2, num_workers=2)
        a, b = iter(loader), iter(loader)
        assert sorted(sum((x.tolist() for x in a), [])) == sorted(sum((x.tolist() for x in b), [])) == list(range(12))

    def test_profile_of_the_worker_stage_before_the_loader_ran(self):
        # docs/howto/profile.rst recommends profile(loader.pipe): it failed on an epoch never set
        # ('NoneType' object has no attribute 'value') until the loader had been iterated once
        from datapipes import profile

        loader = DataLoader(IterableWrapper(range(100)).sharding_filter(), batch_size=10, num_workers=2)
        report = profile(loader.pipe, show=False)
        assert report.items == 10

    def test_profile_shows_the_stages_inside_the_workers_and_names_the_slow_one(self):
        # it showed one row, WorkerProcesses(2), and blamed it (issue 20, finding 1)
        from datapipes import profile

        pipe = IterableWrapper(range(40)).sharding_filter().map(_nap).map(abs)
        loader = DataLoader(pipe, batch_size=4, num_workers=2)
        report = profile(loader.pipe, num_items=None, show=False)
        labels = [row["stage"] for row in report.stages]
        assert labels == ["IterableWrapper [2 workers]", "ShardingFilter [2 workers]", "Mapper(_nap) [2 workers]",
                          "Mapper(abs) [2 workers]", "Batcher(4) [2 workers]", "Collator(collate) [2 workers]",
                          "WorkerProcesses(2)"]
        totals = {row["stage"]: row for row in report.stages}
        assert totals["Mapper(_nap) [2 workers]"]["items_out"] == 40  # both workers' shares, totalled
        assert report.bottleneck == "Mapper(_nap)" and "inside the 2 DataLoader worker processes" in report.reason
        assert report.stages[report.bottleneck_index]["stage"] == "Mapper(_nap) [2 workers]"
        assert "Mapper(_nap) [2 workers]" in report.table()

    def test_profile_per_worker_lists_each_workers_stages(self):
        from datapipes import profile

        loader = DataLoader(IterableWrapper(range(40)).sharding_filter().map(_nap), batch_size=4, num_workers=2)
        report = profile(loader.pipe, num_items=None, show=False, per_worker=True)
        per = {row["stage"]: row for row in report.stages if isinstance(row["worker"], int)}
        assert per["[worker 0] Mapper(_nap)"]["items_out"] == per["[worker 1] Mapper(_nap)"]["items_out"] == 20

    def test_reports_are_one_table_naming_each_worker(self, caplog):
        loader = DataLoader(IterableWrapper(range(20)).sharding_filter().map(abs), batch_size=5, num_workers=2,
                            report_stats_interval=60)
        with caplog.at_level(logging.INFO, logger="datapipes"):
            assert len(list(loader)) == 4
        tables = [r.getMessage() for r in caplog.records if "stage statistics" in r.getMessage()]
        assert len(tables) == 1  # the end of the pass, from the main process only
        assert "[worker 0] Mapper(abs)" in tables[0] and "[worker 1] Mapper(abs)" in tables[0]
        assert "WorkerProcesses(2)" in tables[0]

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_each_iter_is_the_next_epoch_even_before_either_is_read(self, num_workers):
        # the rule at every num_workers: an epoch is given when iter() is called. Worker processes
        # used to read the epoch from memory the second iter() had already moved on
        def make():
            return DataLoader(IterableWrapper(range(12)).shuffle().sharding_filter(), batch_size=None,
                              num_workers=num_workers, seed=3)

        ref = make()
        epochs = [[int(x) for x in ref] for _ in range(2)]
        assert epochs[0] != epochs[1]
        loader = make()
        a, b = iter(loader), iter(loader)
        assert [int(x) for x in a] == epochs[0]
        assert [int(x) for x in b] == epochs[1]

    def test_break_stops_the_workers(self):
        before = child_pids()
        loader = DataLoader(IterableWrapper(range(1000)).sharding_filter(), batch_size=2, num_workers=2)
        for i, _ in enumerate(loader):
            if i == 3:
                break
        assert not wait_children_gone(before)
        assert not multiprocessing.active_children()


def _fails_on_7(x):
    if x == 7:
        raise KeyError("label-7")
    return x


class NeedsTwo(Exception):
    """An exception whose pickle form cannot be loaded again (its __init__ wants two arguments)."""

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


def _fails_unpicklably(x):
    if x == 5:
        raise NeedsTwo("bad", x)
    return x


class TestWorkerErrors:
    """An exception in a worker's pass reaches the loop as in one process: its own type and args,
    our notes, the worker and its traceback as notes (torch rewraps it: its message in args)."""

    def test_type_args_and_notes_are_kept(self):
        before = child_pids()
        loader = DataLoader(IterableWrapper(range(20)).sharding_filter().map(_fails_on_7), batch_size=None,
                            num_workers=2)
        got = []
        with pytest.raises(KeyError) as info:
            for x in loader:
                got.append(int(x))
        e = info.value
        assert type(e) is KeyError and e.args == ("label-7",)
        notes = e.__notes__
        assert notes[0] == "[datapipes] raised in stage Mapper(_fails_on_7) at item 3"
        # item 3 of worker 1's share is item 7 of the pipe, what one process would have named
        assert notes[1] == ("[datapipes] that is item 7 of the pipe before its sharding_filter (this worker reads "
                            "items 1, 3, 5, ...)")
        assert notes[2].startswith("[datapipes] raised in DataLoader worker process 1 of 2")
        assert notes[3].startswith("worker process traceback") and "_fails_on_7" in notes[3]
        assert got == [0, 1, 2, 3, 4, 5, 6]  # raised at its turn, after what came before it
        assert not wait_children_gone(before)

    def test_the_position_before_sharding_is_left_out_where_it_cannot_be_told(self):
        # a filter between the sharding_filter and the failing stage: its k-th item is not the
        # sharding filter's k-th, so no position before sharding is claimed
        pipe = IterableWrapper(range(20)).sharding_filter().filter(lambda x: x % 3 != 0).map(_fails_on_7)
        with pytest.raises(KeyError) as info:
            list(DataLoader(pipe, batch_size=None, num_workers=2))
        assert not any("before its sharding_filter" in n for n in info.value.__notes__)
        assert "[datapipes] raised in stage Mapper(_fails_on_7) at item 2" in info.value.__notes__

    def test_an_exception_that_cannot_come_back_is_replaced_by_one_naming_it(self):
        loader = DataLoader(IterableWrapper(range(10)).sharding_filter().map(_fails_unpicklably), batch_size=None,
                            num_workers=2)
        with pytest.raises(RuntimeError, match=r"test_loader\.NeedsTwo raised in DataLoader worker process 1 "
                                               r"\(it cannot be pickled back.*\): bad/5") as info:
            list(loader)
        assert any("Mapper(_fails_unpicklably) at item 2" in n for n in info.value.__notes__)

    def test_persistent_workers_serve_the_next_pass_after_a_failed_one(self):
        loader = DataLoader(IterableWrapper(range(20)).sharding_filter().map(_fails_on_7), batch_size=None,
                            num_workers=2, persistent_workers=True)
        with loader:
            for _ in range(2):  # each pass fails the same way: neither hangs nor mixes the passes' batches
                got = []
                with pytest.raises(KeyError, match="label-7"):
                    for x in loader:
                        got.append(int(x))
                assert got == [0, 1, 2, 3, 4, 5, 6]


# -- even batch counts across ranks ------------------------------------------------------------------


class TestEvenBatches:
    @pytest.mark.parametrize("mode", ["drop", "pad"])
    def test_no_op_without_a_process_group(self, mode):
        loader = DataLoader(IterableWrapper(range(5)), batch_size=2, even_batches=mode)
        assert as_lists(loader) == [[0, 1], [2, 3], [4]]

    @pytest.mark.slow
    def test_two_ranks_resumed_from_a_state(self, tmp_path):
        # a resumed pass yields fewer batches than len() says: the ranks agree batch by batch
        torch.multiprocessing.spawn(_rank_resume, args=(2, str(tmp_path)), nprocs=2, join=True)
        got = [json.loads((tmp_path / f"resumed{r}.json").read_text()) for r in range(2)]
        assert got[0]["drop"] == [[0, 1], [2, 3]] and got[1]["drop"] == [[100, 101], [102]]
        assert got[0]["pad"] == [[0, 1], [2, 3], [4, 5], [6]]
        assert got[1]["pad"] == [[100, 101], [102], [102], [102]]

    @pytest.mark.slow
    def test_two_ranks(self, tmp_path):
        torch.multiprocessing.spawn(_rank_main, args=(2, str(tmp_path)), nprocs=2, join=True)
        got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
        # rank 0 has 7 items (4 batches of 2), rank 1 has 3 (2 batches)
        for r in range(2):
            assert got[r]["none"] == ([[0, 1], [2, 3], [4, 5], [6]] if r == 0 else [[100, 101], [102]])
        for key in ("drop", "drop_unknown_len"):
            assert got[0][key] == [[0, 1], [2, 3]] and got[1][key] == [[100, 101], [102]], key
        for key in ("pad", "pad_unknown_len"):
            assert got[0][key] == [[0, 1], [2, 3], [4, 5], [6]], key
            assert got[1][key] == [[100, 101], [102], [102], [102]], key
        for key in ("cannot_pad", "cannot_pad_unknown_len"):
            assert "rank yielded no batch" in got[0][key] and "rank yielded no batch" in got[1][key], key
        # no user seed: rank 0's seed is broadcast, though the ranks' torch generators differ
        assert got[0]["shuffled"] == got[1]["shuffled"]
        assert sorted(got[0]["shuffled"]) == list(range(16))
        # with workers: every item exactly once across all workers of all ranks; len per rank
        assert sorted(sum(got[0]["workers"] + got[1]["workers"], [])) == list(range(10))
        assert [len(got[r]["workers"]) for r in range(2)] == [got[0]["workers_len"], got[1]["workers_len"]] == [4, 2]


def _rank_resume(rank, world_size, folder):
    """One rank of the resume test: uneven data, a state saved after one batch, a new loader resumes."""
    import datetime

    import torch.distributed as dist

    store = os.path.join(folder, "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        data = list(range(7)) if rank == 0 else [100, 101, 102]
        out = {}
        for mode in ("drop", "pad"):
            loader = DataLoader(IterableWrapper(data), batch_size=2, even_batches=mode)
            it = iter(loader)
            head = [next(it).tolist()]
            state = pickle.loads(pickle.dumps(loader.state_dict()))
            it.close()
            again = DataLoader(IterableWrapper(data), batch_size=2, even_batches=mode)
            again.load_state_dict(state)
            out[mode] = head + as_lists(again)
        with open(os.path.join(folder, f"resumed{rank}.json"), "w") as f:
            json.dump(out, f)
    finally:
        dist.destroy_process_group()


def _rank_main(rank, world_size, folder):
    """One rank of the two-process test: the ranks hold uneven data; results go to a JSON file."""
    import datetime

    import torch.distributed as dist

    store = os.path.join(folder, "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        torch.manual_seed(rank)  # different generators: the seed must come from rank 0
        data = list(range(7)) if rank == 0 else [100, 101, 102]
        out = {}

        def run(key, pipe, **kwargs):
            out[key] = as_lists(DataLoader(pipe, batch_size=2, **kwargs))

        run("none", IterableWrapper(data))
        run("drop", IterableWrapper(data), even_batches="drop")
        run("drop_unknown_len", IterableWrapper(data).filter(lambda x: True), even_batches="drop")
        run("pad", IterableWrapper(data), even_batches="pad")
        run("pad_unknown_len", IterableWrapper(data).filter(lambda x: True), even_batches="pad")
        for key, pipe in (("cannot_pad", IterableWrapper(data if rank == 0 else [])),
                          ("cannot_pad_unknown_len", IterableWrapper(data if rank == 0 else []).filter(lambda x: True))):
            try:
                run(key, pipe, even_batches="pad")
            except ValueError as e:
                out[key] = str(e)
        loader = DataLoader(IterableWrapper(range(16)).shuffle(), batch_size=None)
        out["shuffled"] = list(loader)
        # 2 workers per rank, no seed: 10 items in 4 shards (rank * 2 + worker) of 3, 3, 2, 2
        loader = DataLoader(IterableWrapper(range(10)).shuffle().sharding_filter(), batch_size=2, num_workers=2,
                            multiprocessing_context="fork")  # a spawned rank would spawn its workers: slow
        out["workers"] = as_lists(loader)
        out["workers_len"] = len(loader)
        with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
    finally:
        dist.destroy_process_group()


def _nap(x):
    """A stage much slower than the others (10 ms an item), for the profile to name."""
    time.sleep(0.01)
    return x
