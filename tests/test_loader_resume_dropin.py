"""datapipes.DataLoader in the place of torch's DataLoader and torchdata's StatefulDataLoader: a
state taken after its pass was left (``break``, ``close()``, dropped, failed) resumes after the last
batch delivered; a loaded state reads back as it was loaded until the next pass; the workers' seeds
follow ``generator=`` / ``seed=``; a failing ``worker_init_fn`` surfaces where torch's does."""

import gc
import pickle
import random
import threading
import time
import weakref

import numpy as np
import pytest
import torch
from torch.utils.data import get_worker_info

from datapipes.iter import IterableWrapper
from datapipes.loader import DataLoader
from datapipes.testing import threads_started_since

from helpers import Boom, child_pids as process_children, plain_process  # noqa: F401 - an autouse fixture

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

WORKERS = [0, 2]
N = 100


def child_pids():
    """This process's live children, less multiprocessing's resource tracker (alive once started)."""
    from multiprocessing import resource_tracker

    pids = process_children()
    pids.discard(getattr(resource_tracker._resource_tracker, "_pid", None))
    return pids


def children_left(before, timeout=20.0):
    """The children started since ``before`` still alive after waiting up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while child_pids() - before and time.monotonic() < deadline:
        time.sleep(0.02)
    return child_pids() - before


def ints(batches):
    return [x for b in batches for x in b.tolist()]


def fail_at_30(x):
    if x == 30:
        raise Boom(x, "fails here")
    return x


def make(workers, data=None, **kw):
    return DataLoader(list(range(N)) if data is None else data, batch_size=1, num_workers=workers, **kw)


def resumed(state, workers, data=None, **kw):
    """What a loader built as ``make(workers, data, **kw)`` yields after loading ``state``."""
    again = make(workers, data, **kw)
    again.load_state_dict(pickle.loads(pickle.dumps(state)))
    return ints(again)


# -- 1. a state taken after the pass was left ------------------------------------------------------


class TestStateAfterThePass:
    @pytest.mark.parametrize("workers", WORKERS)
    def test_after_break_it_resumes_after_the_last_batch_delivered(self, workers):
        loader = make(workers)
        seen = []
        for step, batch in enumerate(loader):
            seen += batch.tolist()
            if step == 10:
                inside = loader.state_dict()
                break
        after = loader.state_dict()
        assert after == inside
        assert seen + resumed(after, workers) == list(range(N))

    @pytest.mark.parametrize("workers", WORKERS)
    def test_after_close(self, workers):
        loader = make(workers, shuffle=True, seed=3)
        full = ints(make(workers, shuffle=True, seed=3))
        it = iter(loader)
        head = [next(it).item() for _ in range(7)]
        inside = loader.state_dict()
        it.close()
        assert loader.state_dict() == inside
        assert head + resumed(loader.state_dict(), workers, shuffle=True, seed=3) == full

    @pytest.mark.parametrize("workers", WORKERS)
    def test_a_dropped_pass_stops_at_once_and_its_state_survives(self, workers):
        before_threads, before_children = set(threading.enumerate()), child_pids()
        pipe = IterableWrapper(range(N)).sharding_filter().map(abs, concurrency=2)  # threads of its own
        loader = DataLoader(pipe, batch_size=1, num_workers=workers, seed=0)
        it = iter(loader)
        head = [next(it).item() for _ in range(9)]
        inside = loader.state_dict()
        ref = weakref.ref(it)
        del it
        assert ref() is None  # the loader holds no strong reference to its pass
        assert not threads_started_since(before_threads, timeout=20.0)
        assert not children_left(before_children)
        assert loader.state_dict() == inside
        again = DataLoader(IterableWrapper(range(N)).sharding_filter().map(abs, concurrency=2), batch_size=1,
                           num_workers=workers, seed=0)
        again.load_state_dict(loader.state_dict())
        assert sorted(head + ints(again)) == list(range(N))

    # With workers, the state is the one a dropped pass keeps (above); torch's own iterator, collected
    # by the cyclic GC, then waits 5 s per worker for them to stop.
    @pytest.mark.parametrize("workers", [0])
    def test_a_pass_collected_in_a_reference_cycle(self, workers):
        loader = make(workers)
        it = iter(loader)
        head = [next(it).item() for _ in range(4)]
        inside = loader.state_dict()
        cycle = {"it": it}
        cycle["self"] = cycle
        del it, cycle
        gc.collect()
        after = loader.state_dict()
        if workers:
            assert after == inside
        else:  # the collector may have finalized the in-process shard's stages first: its start + skip
            assert after["pass"][0]["shards"][0] in (inside["pass"][0]["shards"][0],
                                                     {"tails": [], "main": None, "done": False, "skip": 4})
        assert head + resumed(after, workers) == list(range(N))

    @pytest.mark.parametrize("timeout", [None, 30])  # 30: a buffer reads ahead of the user
    @pytest.mark.parametrize("workers", WORKERS)
    def test_a_pass_that_raised_resumes_at_the_batch_that_failed(self, workers, timeout):
        # an iterable pipe ends its pass at an error (a map-style dataset's failed batch is counted
        # and the pass goes on: tests/test_loader_errors_continue.py)
        loader = make(workers, IterableWrapper(range(N)).sharding_filter().map(fail_at_30), timeout=timeout)
        seen = []
        with pytest.raises(Boom):
            for batch in loader:
                seen += batch.tolist()
                last = loader.state_dict()
        assert seen == list(range(30))
        after = loader.state_dict()
        if workers or timeout:  # the shards' states travel with the batches: the one of batch 29
            assert after == last
        # else the shard is read when asked, and its pass failed: its state is the pass's start
        # and the 30 batches to compute again and drop ("skip")
        again = IterableWrapper(range(N)).sharding_filter().map(abs)
        assert seen + resumed(after, workers, again, timeout=timeout) == list(range(N))

    def test_a_failed_pass_that_cannot_be_recomputed_says_so(self):
        # in process, read when asked: the failed pass cannot say where it stood, and a pipe in
        # completion order cannot be recomputed up to there
        pipe = IterableWrapper(range(N)).map(fail_at_30, concurrency=2, ordered=False)
        loader = DataLoader(pipe, batch_size=1, seed=0)
        with pytest.raises(Boom):
            for _ in loader:
                pass
        with pytest.raises(TypeError, match=r"shard 0 of this rank: its pass failed after \d+ batches.*"
                                            r"Mapper\(fail_at_30.*completion order"):
            loader.state_dict()

    @pytest.mark.parametrize("workers", WORKERS)
    def test_iter_without_a_batch_resumes_the_same_epoch_from_its_start(self, workers):
        first_epoch = ints(make(workers, shuffle=True, seed=3))
        loader = make(workers, shuffle=True, seed=3)
        it = iter(loader)
        inside = loader.state_dict()
        del it
        assert loader.state_dict() == inside
        assert resumed(loader.state_dict(), workers, shuffle=True, seed=3) == first_epoch

    @pytest.mark.parametrize("workers", WORKERS)
    def test_a_pass_run_to_its_end_gives_the_next_epoch(self, workers):
        loader = make(workers, shuffle=True, seed=3)
        ints(loader)
        state = loader.state_dict()
        assert state["pass"][0]["ended"] is True
        assert resumed(state, workers, shuffle=True, seed=3) == ints(loader)

    @pytest.mark.parametrize("workers", WORKERS)
    def test_set_epoch_after_the_pass_was_left_starts_that_epoch(self, workers):
        loader = make(workers, shuffle=True, seed=3)
        it = iter(loader)
        next(it)
        it.close()
        loader.set_epoch(5)
        state = loader.state_dict()
        assert state["pass"] is None and state["epoch"] == 5
        fresh = make(workers, shuffle=True, seed=3)
        fresh.set_epoch(5)
        assert resumed(state, workers, shuffle=True, seed=3) == ints(fresh)

    def test_persistent_workers(self):
        before = child_pids()
        with make(2, persistent_workers=True, seed=1) as loader:
            seen = []
            for step, batch in enumerate(loader):
                seen += batch.tolist()
                if step == 12:
                    inside = loader.state_dict()
                    break
            assert loader.state_dict() == inside
            assert seen + resumed(loader.state_dict(), 2, persistent_workers=True, seed=1) == list(range(N))
            assert sorted(ints(loader)) == list(range(N))  # the pass left is not live: a new one starts
        assert not children_left(before)

    @pytest.mark.parametrize("workers", WORKERS)
    def test_even_batches(self, workers):
        loader = make(workers, even_batches="drop")
        seen = []
        for step, batch in enumerate(loader):
            seen += batch.tolist()
            if step == 5:
                inside = loader.state_dict()
                break
        assert loader.state_dict() == inside
        assert seen + resumed(loader.state_dict(), workers, even_batches="drop") == list(range(N))


# -- 2. a loaded state reads back as loaded ---------------------------------------------------------


def saved_states(workers):
    """Loader states: before any pass, in the middle of one, after a break, at a pass's end."""
    loader = make(workers, shuffle=True, seed=4)
    states = {"fresh": loader.state_dict()}
    it = iter(loader)
    for _ in range(3):
        next(it)
    states["middle"] = loader.state_dict()
    it.close()
    states["closed"] = loader.state_dict()
    ints(loader)
    states["ended"] = loader.state_dict()
    return states


class TestLoadedStateReadsBack:
    @pytest.mark.parametrize("workers", WORKERS)
    def test_state_dict_right_after_load_state_dict_is_the_state_loaded(self, workers):
        for name, state in saved_states(workers).items():
            loader = make(workers, shuffle=True, seed=4)
            loader.load_state_dict(pickle.loads(pickle.dumps(state)))
            assert loader.state_dict() == state, name
            assert loader.state_dict() == state, name  # asking twice changes nothing
            again = make(workers, shuffle=True, seed=4)
            again.load_state_dict(loader.state_dict())  # a job that loads and saves at once loses nothing
            assert again.state_dict() == state, name

    @pytest.mark.parametrize("workers", WORKERS)
    def test_until_the_next_pass_starts(self, workers):
        state = saved_states(workers)["ended"]
        loader = make(workers, shuffle=True, seed=4)
        loader.load_state_dict(state)
        next(iter(loader))
        moved = loader.state_dict()
        assert moved != state and moved["epoch"] == state["epoch"] + 1


# -- 3. the workers' seeds ---------------------------------------------------------------------------


class SeedProbe:
    """A map-style dataset whose item ``i`` says what the worker that loads it was seeded with."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = get_worker_info()
        return (i, info.id, torch.initial_seed(), info.seed, random.random(), float(np.random.random()),
                float(torch.rand(())))


def first(batch):
    return batch[0]


def probe(**kw):
    return DataLoader(SeedProbe(), batch_size=1, num_workers=2, collate_fn=first, **kw)


def passes(loader, count=2):
    return [sorted(loader) for _ in range(count)]


def seeds(items):
    """index -> (worker id, torch.initial_seed(), get_worker_info().seed)."""
    return {i: (worker, initial, info) for i, worker, initial, info, *_ in items}


class TestWorkerSeeds:
    def test_generator_seeds_the_workers_alike_in_two_loaders(self):
        a = passes(probe(generator=torch.Generator().manual_seed(42)))
        b = passes(probe(generator=torch.Generator().manual_seed(42)))
        assert a == b  # the seeds, and what each worker's torch, random and NumPy draw
        for one in a:
            by_worker = {worker: (initial, info) for worker, initial, info in seeds(one).values()}
            assert by_worker[0][0] == by_worker[0][1] and by_worker[1][0] == by_worker[1][1]
            assert by_worker[1][0] == by_worker[0][0] + 1  # base seed + worker id, as torch's workers
        assert seeds(a[0]) != seeds(a[1])  # another epoch, other seeds
        c = passes(probe(generator=torch.Generator().manual_seed(43)), 1)
        assert seeds(c[0]) != seeds(a[0])

    def test_seed_and_torch_manual_seed(self):
        assert passes(probe(seed=7)) == passes(probe(seed=7))
        torch.manual_seed(3)
        a = passes(probe())
        torch.manual_seed(3)
        assert passes(probe()) == a

    def test_persistent_workers_are_seeded_for_every_epoch(self):
        with probe(seed=7, persistent_workers=True) as one, probe(seed=7, persistent_workers=True) as two:
            a, b = passes(one, 3), passes(two, 3)
        assert a == b
        assert len({tuple(sorted(seeds(p).values())) for p in a}) == 3
        assert all(initial == info for p in a for _, initial, info in seeds(p).values())
        # the workers of one pass are seeded as persistent workers are in that epoch
        assert seeds(passes(probe(seed=7), 1)[0]) == seeds(a[0])

    def test_a_resumed_pass_keeps_the_seeds_of_the_interrupted_one(self):
        full = passes(probe(generator=torch.Generator().manual_seed(42)), 1)[0]
        loader = probe(generator=torch.Generator().manual_seed(42))
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        state = loader.state_dict()
        it.close()
        again = probe()  # the seed comes with the state
        again.load_state_dict(state)
        rest = list(again)
        assert sorted(x[0] for x in head + rest) == list(range(8))
        assert seeds(rest) == {i: s for i, s in seeds(full).items() if i in seeds(rest)}

    @pytest.mark.parametrize("workers", WORKERS)
    def test_a_seeded_loader_leaves_torchs_global_generator_alone(self, workers):
        torch.manual_seed(0)
        expected = torch.rand(3)
        torch.manual_seed(0)
        ints(make(workers, seed=1))
        ints(make(workers, generator=torch.Generator().manual_seed(1)))
        assert torch.equal(torch.rand(3), expected)


# -- 4. a worker_init_fn that fails --------------------------------------------------------------


def init_fails_in_worker_1(worker_id):
    if worker_id == 1:
        raise ValueError(f"worker_init_fn refused worker {worker_id}")


def init_fails_in_worker_0(worker_id):
    if worker_id == 0:
        raise ValueError(f"worker_init_fn refused worker {worker_id}")


def where_it_raises(loader):
    """``(the index of the next() that raised, its exception's type and message)``: ``iter()``
    must not raise. The exception is not kept (its traceback would hold the pass)."""
    it = iter(loader)
    try:
        for k in range(30):
            try:
                next(it)
            except Exception as e:  # noqa: BLE001 - its type is compared
                return k, type(e), str(e)
    finally:
        if isinstance(loader, torch.utils.data.DataLoader):  # torch's: stopped now, not by the cyclic GC
            it._shutdown_workers()
    raise AssertionError("no exception")


class TestWorkerInitFailure:
    @pytest.mark.parametrize("init, worker", [(init_fails_in_worker_0, 0), (init_fails_in_worker_1, 1)])
    @pytest.mark.parametrize("persistent", [False, True])
    def test_raised_where_torch_raises_it_naming_the_worker(self, init, worker, persistent):
        before = child_pids()
        kw = dict(batch_size=2, num_workers=2, worker_init_fn=init, persistent_workers=persistent)
        theirs = torch.utils.data.DataLoader(list(range(20)), **kw)
        k_theirs, kind_theirs, _ = where_it_raises(theirs)
        del theirs
        gc.collect()
        assert not children_left(before)
        ours = DataLoader(list(range(20)), **kw)
        k, kind, message = where_it_raises(ours)
        assert k == k_theirs == worker  # at the failing worker's first batch, not at iter()
        assert kind is kind_theirs is ValueError
        assert f"DataLoader worker process {worker}" in message
        assert f"worker_init_fn refused worker {worker}" in message
        # the workers stop with the pass; persistent ones that failed are not kept for the next
        assert not children_left(before)
        ours.close()
