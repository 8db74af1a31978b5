"""Pipes in torch's DataLoader: shards found per worker, shared seeds upstream of sharding_filter,
len, and the warning for a pipe without sharding_filter in several workers.

``TestWorkerDiscovery`` runs the worker side in this process, with torch's worker info set as a
DataLoader worker has it (each simulated worker on its own copy of the pipe, as forked workers are);
``TestTorchDataLoader`` runs real DataLoader workers.
"""

import math
import pickle
import re
import sys
import warnings
from contextlib import contextmanager

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils import worker as torch_worker

from datapipes import IterDataPipe
from datapipes._runtime import worker as _worker
from datapipes.iter import IterableWrapper
from datapipes.iter.sharding import SHARDING_PRIORITIES

from helpers import plain_process  # noqa: F401 - an autouse fixture

N = 24

NO_SHARDING = "DataLoader workers but has no sharding_filter()"


@pytest.fixture(autouse=True)
def no_warning_given_yet():
    """Forget the no-sharding_filter warnings given so far in this process (and the workers it forks)."""
    _worker.forget_warnings()


@contextmanager
def as_worker(worker_id, num_workers, base_seed=1000, dataset=None):
    """Run the body as DataLoader worker ``worker_id`` of ``num_workers`` does: torch's worker info
    set, and torch's global generator seeded with ``base_seed + worker_id``."""
    info = torch_worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=base_seed + worker_id, dataset=dataset)
    saved = torch_worker._worker_info
    torch_worker._worker_info = info
    try:
        with torch.random.fork_rng():
            torch.manual_seed(base_seed + worker_id)
            yield info
    finally:
        torch_worker._worker_info = saved


def run_workers(pipe, num_workers=2, base_seed=1000, passes=1):
    """``out[w][k]``: pass ``k`` of simulated worker ``w``, each worker on its own copy of ``pipe``."""
    out = []
    for w in range(num_workers):
        clone = pickle.loads(pickle.dumps(pipe))
        with as_worker(w, num_workers, base_seed, clone):
            out.append([list(clone) for _ in range(passes)])
    return out


def union(parts):
    return sorted(x for p in parts for x in p)


def shuffled_then_sharded():
    return IterableWrapper(range(N)).shuffle().sharding_filter().map(lambda x: x * 10)


class Probe(IterDataPipe):
    """Yields ``"len=<len(source)>"`` first, then the source's items: shows len() where it runs."""

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        yield f"len={len(self.source)}"
        yield from self.source


class TestWorkerDiscovery:
    def test_each_worker_reads_its_shard(self):
        pipe = IterableWrapper(range(10)).sharding_filter()
        for w in range(3):
            with as_worker(w, 3):
                assert (pipe.num_of_instances, pipe.instance_id) == (3, w)
                assert list(pipe) == list(range(w, 10, 3))
                assert len(pipe) == len(range(w, 10, 3))
        assert (pipe.num_of_instances, pipe.instance_id) == (1, 0)  # back in the main process
        assert list(pipe) == list(range(10)) and len(pipe) == 10

    def test_explicit_apply_sharding_wins(self):
        pipe = IterableWrapper(range(10)).sharding_filter()
        pipe.apply_sharding(5, 4)
        with as_worker(1, 2):
            assert list(pipe) == [4, 9] and len(pipe) == 2

    def test_rank_filter_ignores_workers(self):
        pipe = IterableWrapper(range(6)).sharding_filter(SHARDING_PRIORITIES.DISTRIBUTED)
        with as_worker(1, 2):
            assert list(pipe) == list(range(6))

    def test_unseeded_upstream_shuffle_agrees_across_workers(self):
        out = run_workers(shuffled_then_sharded())
        assert union(p[0] for p in out) == [x * 10 for x in range(N)]
        assert out != run_workers(shuffled_then_sharded(), base_seed=2000)  # a new epoch's base seed
        assert out == run_workers(shuffled_then_sharded())  # same base seed, same order

    def test_unseeded_persistent_workers_reshuffle_each_pass(self):
        out = run_workers(shuffled_then_sharded(), passes=3)
        orders = []
        for k in range(3):
            assert union(out[w][k] for w in range(2)) == [x * 10 for x in range(N)]
            orders.append(out[0][k] + out[1][k])
        assert len({tuple(o) for o in orders}) == 3

    def test_user_seed_wins_and_epochs_count_passes_in_workers(self):
        pipe = shuffled_then_sharded().set_seed(3)
        out = run_workers(pipe, passes=2)
        assert run_workers(pipe, base_seed=2000, passes=2) == out  # the loader's seed plays no part
        for k in range(2):
            assert union(out[w][k] for w in range(2)) == [x * 10 for x in range(N)]
        assert out[0][0] != out[0][1]
        # Pass k of a worker is k epochs on: pass 1 at epoch 0 is pass 0 at epoch 1.
        assert [o[1] for o in out] == [o[0] for o in run_workers(pipe.set_epoch(1))]
        # Outside a worker, a seeded pipe repeats its order until set_epoch.
        main = shuffled_then_sharded().set_seed(3)
        assert list(main) == list(main)

    def test_a_seed_set_after_a_pass_is_the_users(self):
        pipe = shuffled_then_sharded()
        with as_worker(0, 2, dataset=pipe):
            list(pipe)  # lends a shared seed to the shuffle
            pipe.set_seed(5)
            second = list(pipe)  # the worker's second pass: epoch 0 + 1
        expected = shuffled_then_sharded().set_seed(5).set_epoch(1)
        expected.datapipe.apply_sharding(2, 0)
        assert second == list(expected)
        with as_worker(0, 2, dataset=pipe):
            pipe.set_seed(None)  # back to unseeded: the workers share a fresh seed again
            third = list(pipe)
        assert len(third) == N // 2 and third != second

    def test_downstream_shuffle_draws_per_worker(self):
        # Positions 2i and 2i+1 hold i: both workers' shards are 0..11, in their own orders.
        pipe = IterableWrapper([i // 2 for i in range(N)]).sharding_filter().shuffle()
        out = run_workers(pipe)
        assert sorted(out[0][0]) == sorted(out[1][0]) == list(range(N // 2))
        assert out[0][0] != out[1][0]

    def test_the_check_runs_per_pass_not_per_item(self, monkeypatch):
        calls = []
        monkeypatch.setattr(_worker, "worker_pass", calls.append)
        pipe = IterableWrapper(range(100)).map(abs).filter(bool)
        with as_worker(0, 2, dataset=pipe):
            assert len(list(pipe)) == 99
        assert calls == [pipe, pipe.datapipe, pipe.datapipe.datapipe]
        list(pipe)  # outside a worker: not called at all
        assert len(calls) == 3

    def test_warns_once_without_sharding_filter(self):
        pipe = IterableWrapper(range(4)).map(abs)
        with as_worker(0, 2, dataset=pipe):
            with pytest.warns(UserWarning, match=r"IterableWrapper -> Mapper\(abs\) is iterated by 2 DataLoader "
                              r"workers but has no sharding_filter\(\).*each item comes 2 times"):
                assert list(pipe) == [0, 1, 2, 3]
            with warnings_as_errors():
                list(pipe)  # once per process

    def test_only_worker_0_warns_and_a_later_worker_process_does_not_repeat_it(self):
        pipe = IterableWrapper(range(4)).map(neg)
        with warnings_as_errors():
            with as_worker(1, 2, dataset=pipe):
                assert list(pipe) == [0, -1, -2, -3]
        _worker._checked = False  # a fresh process: worker 0 of this epoch
        with as_worker(0, 2, dataset=pipe):
            with pytest.warns(UserWarning, match=r"Mapper\(neg\) is iterated by 2 DataLoader workers"):
                list(pipe)
        _worker._checked = False  # worker 0 of the next epoch, forked from the same main process
        with warnings_as_errors():
            with as_worker(0, 2, dataset=pipe):
                list(pipe)
        _worker.forget_warnings()  # as a new main process would
        _worker._checked = False
        with as_worker(0, 2, dataset=pipe):
            with pytest.warns(UserWarning, match=re.escape(NO_SHARDING)):
                list(pipe)

    def test_no_warning_with_sharding_or_one_worker_or_not_the_dataset(self):
        sharded = IterableWrapper(range(4)).sharding_filter()
        inner = IterableWrapper(range(4))
        with warnings_as_errors():
            with as_worker(0, 2, dataset=sharded):
                list(sharded)
            _worker._checked = False
            with as_worker(0, 1, dataset=inner):
                list(inner)
            _worker._checked = False
            with as_worker(0, 2, dataset=object()):
                list(inner)


def neg(x):
    return -x


def print_warnings(worker_id):
    """A worker_init_fn: print every warning to stderr (pytest's recording of warnings, inherited by a
    forked worker, would keep them in the worker; "always", so that Python's own once-per-place
    filter hides no repeat from the count)."""

    def show(message, category, filename, lineno, file=None, line=None):
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    warnings.showwarning = show
    warnings.simplefilter("always")


@contextmanager
def warnings_as_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.mark.slow
class TestTorchDataLoader:
    """Real DataLoader workers (forked from this process)."""

    def test_unseeded_each_item_once_per_epoch_and_epochs_reshuffle(self):
        loader = DataLoader(shuffled_then_sharded(), batch_size=4, num_workers=2)
        epochs = [[x for b in loader for x in b.tolist()] for _ in range(2)]
        for e in epochs:
            assert sorted(e) == [x * 10 for x in range(N)]
        assert epochs[0] != epochs[1]
        assert len(loader) == math.ceil(N / 4)  # shards of 12 in batches of 4: 3 per worker
        assert len(loader) == sum(1 for _ in loader)

    def test_unseeded_reproducible_with_torch_manual_seed(self):
        runs = []
        for _ in range(2):
            torch.manual_seed(7)
            loader = DataLoader(shuffled_then_sharded(), batch_size=None, num_workers=2)
            runs.append(list(loader))
        assert runs[0] == runs[1] and sorted(runs[0]) == [x * 10 for x in range(N)]

    def test_seeded_epochs_come_from_set_epoch(self):
        pipe = shuffled_then_sharded().set_seed(3)
        loader = DataLoader(pipe, batch_size=None, num_workers=2)
        first, again = list(loader), list(loader)
        pipe.set_epoch(1)
        third = list(loader)
        assert first == again != third
        assert sorted(first) == sorted(third) == [x * 10 for x in range(N)]

    def test_persistent_workers_reshuffle_each_epoch(self):
        for pipe in (shuffled_then_sharded(), shuffled_then_sharded().set_seed(3)):
            loader = DataLoader(pipe, batch_size=4, num_workers=2, persistent_workers=True)
            epochs = [[x for b in loader for x in b.tolist()] for _ in range(3)]
            for e in epochs:
                assert sorted(e) == [x * 10 for x in range(N)]
            assert len({tuple(e) for e in epochs}) == 3

    def test_len_is_the_shards(self):
        pipe = Probe(IterableWrapper(range(N)).sharding_filter().shuffle())
        loader = DataLoader(pipe, batch_size=None, num_workers=2)
        out = list(loader)
        assert [x for x in out if isinstance(x, str)] == [f"len={N // 2}"] * 2  # each worker's shard
        assert sorted(x for x in out if not isinstance(x, str)) == list(range(N))
        assert len(IterableWrapper(range(N)).sharding_filter()) == N == len(DataLoader(pipe.source, num_workers=2))

    @pytest.mark.parametrize("persistent", [False, True])
    def test_warns_once_per_loader_without_sharding_filter(self, capfd, persistent):
        # Workers print their warnings to stderr (see print_warnings): count them over 3 epochs, new
        # worker processes every epoch unless persistent.
        loader = DataLoader(IterableWrapper(range(5)).map(neg), batch_size=None, num_workers=2,
                            persistent_workers=persistent, worker_init_fn=print_warnings)
        for _ in range(3):
            assert sorted(x for x in loader) == sorted([-x for x in range(5)] * 2)  # what the warning is about
        err = capfd.readouterr().err
        assert err.count(NO_SHARDING) == 1, err
        assert "is iterated by 2 DataLoader workers" in err
