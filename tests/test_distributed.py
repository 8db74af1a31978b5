"""Sharding across distributed ranks: the rank found from the environment and from torch.distributed,
seeds the ranks must share, and two real gloo ranks each running a DataLoader with 2 workers.

The ranks of ``TestRanksInOneProcess`` are simulated with the ``RANK``/``WORLD_SIZE`` environment
variables (what ``torchrun`` sets); ``TestTwoGlooRanks`` starts two processes.
"""

import json
import pickle
from contextlib import contextmanager

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils import worker as torch_worker

from datapipes._runtime import worker as _worker
from datapipes.iter import IterableWrapper
from datapipes.iter.sharding import SHARDING_PRIORITIES

from helpers import plain_process, run_ranks  # noqa: F401 - plain_process: an autouse fixture

N = 40


@contextmanager
def as_rank(monkeypatch, rank, world_size):
    with monkeypatch.context() as m:
        m.setenv("RANK", str(rank))
        m.setenv("WORLD_SIZE", str(world_size))
        yield


@contextmanager
def as_worker(worker_id, num_workers, base_seed=1000):
    saved = torch_worker._worker_info
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=base_seed + worker_id, dataset=None
    )
    try:
        with torch.random.fork_rng():
            torch.manual_seed(base_seed + worker_id)
            yield
    finally:
        torch_worker._worker_info = saved


def times_ten(x):
    return x * 10


def seeded_pipe(n=N):
    return IterableWrapper(range(n)).shuffle().sharding_filter().map(times_ten).set_seed(3)


def unseeded_pipe(n=N):
    return IterableWrapper(range(n)).shuffle().sharding_filter()


class TestRanksInOneProcess:
    def test_rank_from_the_environment(self, monkeypatch):
        pipe = IterableWrapper(range(10)).sharding_filter()
        with as_rank(monkeypatch, 1, 3):
            assert (pipe.num_of_instances, pipe.instance_id) == (3, 1)
            assert list(pipe) == [1, 4, 7] and len(pipe) == 3

    def test_rank_times_worker(self, monkeypatch):
        seen = []
        for r in range(2):
            for w in range(3):
                pipe = pickle.loads(pickle.dumps(seeded_pipe()))
                with as_rank(monkeypatch, r, 2), as_worker(w, 3):
                    assert (pipe.datapipe.num_of_instances, pipe.datapipe.instance_id) == (6, r * 3 + w)
                    part = list(pipe)
                    assert len(pipe) == len(part)
                seen.append(part)
        assert sorted(x for p in seen for x in p) == [x * 10 for x in range(N)]

    def test_one_variable_alone_is_ignored(self, monkeypatch):
        monkeypatch.setenv("RANK", "1")
        assert list(IterableWrapper(range(4)).sharding_filter()) == [0, 1, 2, 3]

    @pytest.mark.parametrize("rank, world", [("x", "2"), ("2", "2"), ("-1", "2"), ("0", "0")])
    def test_bad_environment(self, monkeypatch, rank, world):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", world)
        pipe = IterableWrapper(range(4)).sharding_filter()
        with pytest.raises(ValueError, match=rf"RANK and WORLD_SIZE .* got RANK='{rank}', WORLD_SIZE='{world}'"):
            list(pipe)

    def test_explicit_apply_sharding_wins(self, monkeypatch):
        pipe = IterableWrapper(range(10)).sharding_filter()
        pipe.apply_sharding(5, 0)
        with as_rank(monkeypatch, 1, 2):
            assert list(pipe) == [0, 5]

    def test_worker_filter_ignores_ranks(self, monkeypatch):
        pipe = IterableWrapper(range(6)).sharding_filter(SHARDING_PRIORITIES.MULTIPROCESSING)
        with as_rank(monkeypatch, 1, 2):
            assert list(pipe) == list(range(6))
        shuffled = IterableWrapper(range(6)).shuffle().sharding_filter(SHARDING_PRIORITIES.MULTIPROCESSING)
        with as_rank(monkeypatch, 1, 2), as_worker(0, 2):
            assert len(list(shuffled)) == 3  # workers of one rank share the loader's seed: no error

    def test_unseeded_upstream_shuffle_across_ranks_raises(self, monkeypatch):
        pipe = unseeded_pipe()
        message = (
            r"ShardingFilter: Shuffler\(10000\) upstream of sharding_filter\(\) has no seed, so each of the 2 "
            r"distributed ranks would draw its own order.*pipe.set_seed\(seed\) with the same seed on every rank"
        )
        with as_rank(monkeypatch, 0, 2):
            assert len(pipe) == N // 2  # len needs no seed
            with pytest.raises(RuntimeError, match=message):
                list(pipe)
            with as_worker(1, 2), pytest.raises(RuntimeError, match=message):
                list(pipe)  # a worker of the plain torch DataLoader cannot agree across ranks either

    def test_unseeded_downstream_shuffle_across_ranks_is_fine(self, monkeypatch):
        pipe = IterableWrapper(range(8)).sharding_filter().shuffle()
        with as_rank(monkeypatch, 1, 2):
            assert sorted(pipe) == [1, 3, 5, 7]

    def test_seeded_ranks_partition(self, monkeypatch):
        parts = []
        for r in range(2):
            with as_rank(monkeypatch, r, 2):
                parts.append(list(seeded_pipe()))
        assert sorted(parts[0] + parts[1]) == [x * 10 for x in range(N)]

    def test_loader_seed_is_agreed_by_the_ranks(self, monkeypatch):
        def ranks(seed, epoch):
            parts = []
            for r in range(2):
                pipe = _worker.set_loader_seed(unseeded_pipe(), seed, epoch)
                with as_rank(monkeypatch, r, 2):
                    parts.append(list(pipe))
                    assert list(pipe) == parts[-1]  # the same epoch, the same order
            assert sorted(parts[0] + parts[1]) == list(range(N))
            return parts

        assert ranks(7, 0) != ranks(7, 1)
        assert ranks(7, 0) == ranks(7, 0) != ranks(8, 0)
        pipe = _worker.set_loader_seed(unseeded_pipe(), 7, 0)
        _worker.set_loader_seed(pipe, None)
        with as_rank(monkeypatch, 0, 2), pytest.raises(RuntimeError, match="has no seed"):
            list(pipe)

    def test_loader_seed_leaves_user_seeds_alone(self, monkeypatch):
        with as_rank(monkeypatch, 0, 2):
            plain = list(seeded_pipe())
            assert list(_worker.set_loader_seed(seeded_pipe(), 99, 4)) == plain

    def test_set_loader_seed_bad_arguments(self):
        pipe = unseeded_pipe()
        with pytest.raises(TypeError, match="set_loader_seed: seed must be an int, got str"):
            _worker.set_loader_seed(pipe, "7")
        with pytest.raises(ValueError, match="set_loader_seed: epoch must be >= 0, got -1"):
            _worker.set_loader_seed(pipe, 7, -1)
        assert pipe._loader_seed is None

    def test_spawned_worker_gets_the_rank_seen_where_the_pipe_was_pickled(self, monkeypatch):
        pipe = IterableWrapper(range(12)).sharding_filter()
        with monkeypatch.context() as m:
            m.setattr(_worker, "_initialised_rank", lambda: (1, 2))  # a process group of 2, rank 1
            payload = pickle.dumps(pipe)
        clone = pickle.loads(payload)
        assert list(clone) == list(range(12))  # outside a worker, only this process's own rank counts
        with as_worker(1, 2):
            assert list(clone) == [3, 7, 11]  # shard 1 * 2 + 1 of 4
        assert list(pickle.loads(pickle.dumps(pipe))) == list(range(12))  # nothing captured without a group


def _rank_main(rank, world_size, folder):
    """One rank: DataLoaders with 2 workers over a seeded pipe, then the unseeded error.

    A process started by spawn starts its DataLoader workers by spawn too (each importing torch):
    the loaders ask for fork (forked workers still see the process group), but one.
    """
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world_size)
    result = {"rank": rank}
    try:
        pipe = seeded_pipe()
        result["len"] = len(pipe)
        loader = DataLoader(pipe, batch_size=5, num_workers=2, multiprocessing_context="fork")
        result["len_loader"] = len(loader)
        result["epochs"], result["batches"] = [], []
        for epoch in range(2):
            pipe.set_epoch(epoch)
            batches = [b.tolist() for b in loader]
            result["batches"].append(len(batches))
            result["epochs"].append([x for b in batches for x in b])
        # One spawned worker (it imports torch): it reads the rank's shard from what was pickled.
        spawned = DataLoader(pipe, batch_size=None, num_workers=1, multiprocessing_context="spawn")
        result["spawned"] = [int(x) for x in spawned]
        result["in_process"] = list(pipe)
        # Unseeded: torch's DataLoader lends every rank and worker the seed it broadcasts per epoch.
        result["unseeded"] = [
            int(x) for x in DataLoader(unseeded_pipe(), batch_size=None, num_workers=2, multiprocessing_context="fork")
        ]
        try:  # iterated directly, nothing agrees on a seed across the ranks
            list(unseeded_pipe())
            result["error"] = None
        except RuntimeError as e:
            result["error"] = str(e)
        dist.barrier()
    finally:
        with open(f"{folder}/rank{rank}.json", "w") as f:
            json.dump(result, f)
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(150)
class TestTwoGlooRanks:
    def test_each_item_exactly_once_across_ranks_and_workers(self, tmp_path):
        run_ranks(_rank_main, (2, str(tmp_path)), 2)
        results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
        everything = [x * 10 for x in range(N)]
        for r in results:
            assert r["len"] == N // 2 and r["len_loader"] == N // 2 // 5 == r["batches"][0] == r["batches"][1]
            assert [len(e) for e in r["epochs"]] == [N // 2, N // 2]
            assert r["epochs"][0] != r["epochs"][1]  # set_epoch reshuffles
            assert "Shuffler(10000) upstream of sharding_filter() has no seed" in r["error"]
            assert "set_seed" in r["error"]
        assert sorted(results[0]["unseeded"] + results[1]["unseeded"]) == list(range(N))
        for key in ("in_process", "spawned"):
            assert sorted(results[0][key] + results[1][key]) == everything
        for epoch in range(2):
            assert sorted(results[0]["epochs"][epoch] + results[1]["epochs"][epoch]) == everything


# -- checkpoints: two gloo ranks of 2 workers save, other layouts resume ----------------------------

ELASTIC_N = 90


def _elastic_loader(workers):
    from datapipes import DataLoader as OurLoader

    return OurLoader(seeded_pipe(ELASTIC_N), batch_size=4, seed=11, num_workers=workers,
                     multiprocessing_context="fork")


def _flat(batches):
    return [x for b in batches for x in b.tolist()]


def _elastic_rank(rank, world_size, folder, mode):
    """One rank: ``save``: 2 workers, 3 batches, then every rank's state gathered (rank 0 writes it);
    ``resume``: 2 workers resume the state the test saved, and take this rank's share of the rest."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/store-{mode}", rank=rank, world_size=world_size)
    result = {"rank": rank}
    try:
        loader = _elastic_loader(2)
        if mode == "save":
            it = iter(loader)
            result["delivered"] = _flat(next(it) for _ in range(3))
            state = loader.state_dict(all_ranks=True)  # a collective: every rank gets every rank's state
            result["ranks_in_state"] = [p["layout"][1] for p in state["pass"]]
            if rank == 0:
                torch.save(state, f"{folder}/saved-by-2-ranks.pt")
            it.close()
        else:
            loader.load_state_dict(torch.load(f"{folder}/saved-by-1-rank.pt", weights_only=False))
            result["delivered"] = _flat(loader)
        dist.barrier()
    finally:
        with open(f"{folder}/{mode}{rank}.json", "w") as f:
            json.dump(result, f)
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
class TestElasticResumeAcrossGlooRanks:
    """The issue's scenario: 2 ranks x 2 workers save mid-epoch; 1 rank x 3 workers resumes; and a
    state saved by 1 rank resumes on 2 ranks. Every item is delivered exactly once in all."""

    @staticmethod
    def assert_exactly_once(delivered):
        everything = [x * 10 for x in range(ELASTIC_N)]
        assert sorted(delivered) == everything, sorted(set(everything) ^ set(delivered))
        assert len(delivered) == len(set(delivered))

    def test_two_ranks_to_one_rank_of_three_workers(self, tmp_path):
        run_ranks(_elastic_rank, (2, str(tmp_path), "save"), 2)
        saved = [json.loads((tmp_path / f"save{r}.json").read_text()) for r in range(2)]
        assert [s["ranks_in_state"] for s in saved] == [[0, 1], [0, 1]]
        before = saved[0]["delivered"] + saved[1]["delivered"]
        assert len(before) == 2 * 3 * 4
        loader = _elastic_loader(3)
        loader.load_state_dict(torch.load(tmp_path / "saved-by-2-ranks.pt", weights_only=False))
        self.assert_exactly_once(before + _flat(loader))

    def test_one_rank_to_two_ranks(self, tmp_path):
        loader = _elastic_loader(2)
        it = iter(loader)
        before = _flat(next(it) for _ in range(5))
        torch.save(loader.state_dict(), tmp_path / "saved-by-1-rank.pt")
        it.close()
        run_ranks(_elastic_rank, (2, str(tmp_path), "resume"), 2)
        after = [json.loads((tmp_path / f"resume{r}.json").read_text())["delivered"] for r in range(2)]
        assert all(after)  # both ranks got a share
        self.assert_exactly_once(before + after[0] + after[1])
