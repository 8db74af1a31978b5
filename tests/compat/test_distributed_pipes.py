"""torchdata's distributed pipes (datapipes/iter/distributed.py): FullSync [fullsync] and
ShardingRoundRobinDispatcher [sharding_round_robin_dispatch].

FullSync is tested in one process (where it passes items through) and with two real gloo ranks of
unequal lengths (``TestFullSyncTwoGlooRanks``, spawned processes: slow). The dispatcher is tested
with torch's DataLoader workers, ``apply_sharding`` and simulated workers and ranks.
"""

import itertools
import json
import pickle
import threading
import time
import traceback
from contextlib import contextmanager

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data import graph_settings as torch_graph_settings
from torch.utils.data._utils import worker as torch_worker
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES as TORCH_PRIORITIES

import datapipes
from datapipes import graph_settings
from datapipes.iter import IterableWrapper, ShardingFilter
from datapipes.iter.distributed import FullSync, PrefetchTimeoutError, ShardingRoundRobinDispatcher
from datapipes.iter.sharding import SHARDING_PRIORITIES, is_sharding_stage
from datapipes.testing import check_datapipe, check_resume

from helpers import Boom, fail_at, plain_process, run_ranks  # noqa: F401 - plain_process: an autouse fixture

W = IterableWrapper


def times_ten(x):
    return x * 10


@contextmanager
def as_worker(worker_id, num_workers, base_seed=1000):
    """Run as torch DataLoader worker ``worker_id`` of ``num_workers`` (what get_worker_info() sees)."""
    saved = torch_worker._worker_info
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=base_seed + worker_id, dataset=None
    )
    try:
        yield
    finally:
        torch_worker._worker_info = saved


@contextmanager
def as_rank(monkeypatch, rank, world_size):
    with monkeypatch.context() as m:
        m.setenv("RANK", str(rank))
        m.setenv("WORLD_SIZE", str(world_size))
        yield


# -- ShardingRoundRobinDispatcher ------------------------------------------------------------------


class TestShardingRoundRobinDispatcher:
    def test_functional_form_and_a_sharding_stage(self):
        pipe = W(range(5)).sharding_round_robin_dispatch()
        assert isinstance(pipe, ShardingRoundRobinDispatcher) and isinstance(pipe, ShardingFilter)
        assert is_sharding_stage(pipe)
        assert pipe.sharding_group_filter == SHARDING_PRIORITIES.MULTIPROCESSING
        assert list(pipe) == [0, 1, 2, 3, 4] and len(pipe) == 5  # one process: one instance

    @pytest.mark.parametrize("apply", [graph_settings.apply_sharding, torch_graph_settings.apply_sharding])
    @pytest.mark.parametrize("n", [1, 2, 3, 5])
    def test_item_i_goes_to_instance_i_mod_n(self, apply, n):
        parts = []
        for instance in range(n):
            pipe = W(range(17)).sharding_round_robin_dispatch().map(times_ten)
            apply(pipe, n, instance)
            part = list(pipe)
            assert part == [x * 10 for x in range(instance, 17, n)]
            assert len(pipe) == len(part)
            parts.append(part)
        assert sorted(itertools.chain(*parts)) == [x * 10 for x in range(17)]

    def test_groups_counted(self):
        pipe = W(range(8)).sharding_round_robin_dispatch()
        pipe.apply_sharding(2, 1, SHARDING_PRIORITIES.MULTIPROCESSING)
        assert list(pipe) == [1, 3, 5, 7]
        pipe.apply_sharding(4, 0, SHARDING_PRIORITIES.DISTRIBUTED)  # not its group: ranks are upstream's
        assert list(pipe) == [1, 3, 5, 7]
        with pytest.raises(ValueError, match="cannot mix the DEFAULT sharding group"):
            pipe.apply_sharding(2, 0)

    def test_torch_dataloader_two_workers_each_item_once_round_robin(self):
        pipe = W(range(23)).sharding_round_robin_dispatch().map(times_ten)
        loader = DataLoader(pipe, batch_size=None, num_workers=2, multiprocessing_context="fork")
        out = [int(x) for x in loader]
        # torch's loader takes from worker 0, 1, 0, 1, ...: round-robin shards give back the source order
        assert out == [x * 10 for x in range(23)]

    def test_torch_dataloader_unseeded_shuffle_upstream(self):
        pipe = W(range(40)).shuffle().sharding_round_robin_dispatch()
        loader = DataLoader(pipe, batch_size=4, num_workers=2, multiprocessing_context="fork")
        out = [int(x) for batch in loader for x in batch]
        assert sorted(out) == list(range(40))  # the loader's seed agrees across workers: no overlap

    def test_our_dataloader_two_workers(self):
        pipe = W(range(21)).sharding_round_robin_dispatch().map(times_ten)
        loader = datapipes.DataLoader(pipe, batch_size=2, num_workers=2, multiprocessing_context="fork")
        batches = [b.tolist() for b in loader]
        assert sorted(x for b in batches for x in b) == [x * 10 for x in range(21)]
        assert batches[:2] == [[0, 20], [10, 30]]  # worker 0 has items 0, 2, ...; worker 1 items 1, 3, ...

    def test_found_worker_not_rank(self, monkeypatch):
        seen = []
        with as_rank(monkeypatch, 1, 2):
            for w in range(3):
                pipe = W(range(10)).sharding_round_robin_dispatch()
                with as_worker(w, 3):
                    assert (pipe.num_of_instances, pipe.instance_id) == (3, w)
                    part = list(pipe)
                    assert part == list(range(w, 10, 3)) and len(pipe) == len(part)
                seen += part
        assert sorted(seen) == list(range(10))  # every rank reads all the items, split among its workers

    def test_distributed_filter_upstream_splits_ranks_first(self, monkeypatch):
        seen = []
        for r in range(2):
            for w in range(3):
                pipe = W(range(30)).sharding_filter(SHARDING_PRIORITIES.DISTRIBUTED).sharding_round_robin_dispatch()
                with as_rank(monkeypatch, r, 2), as_worker(w, 3):
                    part = list(pipe)
                assert part == list(range(30))[r::2][w::3]
                seen += part
        assert sorted(seen) == list(range(30))

    def test_unrestricted_sharding_filter_upstream_raises_with_workers(self):
        pipe = W(range(12)).sharding_filter().sharding_round_robin_dispatch()
        with as_worker(0, 2), pytest.raises(
            RuntimeError,
            match=r"ShardingRoundRobinDispatcher: ShardingFilter upstream also splits the items among the 2 "
                  r"DataLoader workers.*sharding_filter\(SHARDING_PRIORITIES.DISTRIBUTED\)",
        ):
            iter(pipe)
        assert list(pipe) == list(range(12))  # one process: nothing is lost, no error

    @pytest.mark.parametrize("group", [None, SHARDING_PRIORITIES.MULTIPROCESSING, TORCH_PRIORITIES.MULTIPROCESSING, 3])
    def test_accepted_groups(self, group):
        pipe = ShardingRoundRobinDispatcher(W(range(3)), group)
        assert pipe.sharding_group_filter == SHARDING_PRIORITIES.MULTIPROCESSING

    @pytest.mark.parametrize("group", [SHARDING_PRIORITIES.DEFAULT, SHARDING_PRIORITIES.DISTRIBUTED,
                                       TORCH_PRIORITIES.DISTRIBUTED])
    def test_other_groups_refused(self, group):
        with pytest.raises(ValueError, match="ShardingRoundRobinDispatcher: sharding_group_filter must be "
                                             "SHARDING_PRIORITIES.MULTIPROCESSING"):
            W(range(3)).sharding_round_robin_dispatch(group)

    def test_bad_arguments(self):
        with pytest.raises(TypeError, match="ShardingRoundRobinDispatcher: sharding_group_filter must be a "
                                            "SHARDING_PRIORITIES member or an int .*, got str"):
            ShardingRoundRobinDispatcher(W(range(3)), "multiprocessing")
        with pytest.raises(ValueError, match="sharding_group_filter must be SHARDING_PRIORITIES.MULTIPROCESSING .*got 7"):
            ShardingRoundRobinDispatcher(W(range(3)), 7)  # a custom group: not the workers' group
        with pytest.raises(TypeError, match="ShardingRoundRobinDispatcher: source_datapipe must be an IterDataPipe"):
            ShardingRoundRobinDispatcher([1, 2])

    def test_contract_and_resume(self):
        def build():
            pipe = W(range(20)).sharding_round_robin_dispatch().map(times_ten)
            return graph_settings.apply_sharding(pipe, 3, 2)

        expected = [x * 10 for x in range(2, 20, 3)]
        assert check_datapipe(build(), expected=expected) == expected
        assert check_resume(build, ks=range(len(expected) + 1)) == expected
        assert check_resume(build, through="torch") == expected

    def test_resume_into_another_shard_refused(self):
        pipe = graph_settings.apply_sharding(W(range(10)).sharding_round_robin_dispatch(), 2, 0)
        it = iter(pipe)
        next(it)
        state = it.state_dict()
        other = graph_settings.apply_sharding(W(range(10)).sharding_round_robin_dispatch(), 2, 1)
        with pytest.raises(ValueError, match="was saved reading shard 0 of 2"):
            iter(other).load_state_dict(state)

    def test_pickle_keeps_the_shard(self):
        pipe = graph_settings.apply_sharding(W(range(9)).sharding_round_robin_dispatch(), 3, 1)
        assert list(pickle.loads(pickle.dumps(pipe))) == [1, 4, 7]


# -- FullSync in one process -----------------------------------------------------------------------


class TestFullSyncOneProcess:
    def test_passes_items_through(self):
        pipe = W(range(6)).map(times_ten).fullsync()
        assert isinstance(pipe, FullSync)
        assert pipe.timeout == 30 * 60 and pipe.buffer_size == 16  # torchdata's default timeout
        assert check_datapipe(pipe, expected=[x * 10 for x in range(6)], build=lambda src: src.fullsync())
        assert len(pipe) == 6
        assert repr(pipe) == "IterableWrapper -> Mapper(times_ten) -> FullSync(1800)"

    def test_no_length_without_a_source_length(self):
        pipe = W(range(3)).filter(bool).fullsync()
        with pytest.raises(TypeError, match="no len"):
            len(pipe)

    def test_source_error_passes_unchanged(self):
        pipe = W(range(6)).map(fail_at(3)).fullsync()
        it = iter(pipe)
        assert [next(it) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(Boom) as info:
            next(it)
        assert info.value.code == 3

    def test_resume(self):
        assert check_resume(lambda: W(range(7)).fullsync(timeout=5), ks=range(8)) == list(range(7))
        assert check_resume(lambda: W(range(7)).fullsync(), through="torch") == list(range(7))

    def test_resumes_the_items_a_distributed_pass_had_read_ahead(self):
        pipe = W(range(10)).fullsync()
        it = iter(pipe)
        assert [next(it) for _ in range(3)] == [0, 1, 2]
        state = it.state_dict()
        it.close()
        # A state saved on a rank: 3 items yielded, items 3 and 4 read ahead, the source past them.
        sync_key = next(k for k in state["stages"] if k.endswith("FullSync"))
        source_key = next(k for k in state["stages"] if not k.endswith("FullSync"))
        assert state["stages"][sync_key] == {"yielded": None, "pending": []}
        saved = pickle.loads(pickle.dumps(state))
        ahead = iter(W(range(10)))
        for _ in range(5):
            next(ahead)
        saved["stages"][source_key] = ahead.state_dict()["stages"]["0:IterableWrapper"]
        saved["stages"][sync_key] = {"yielded": 3, "pending": [3, 4]}
        again = iter(W(range(10)).fullsync())
        again.load_state_dict(saved)
        assert next(again) == 3
        assert again.state_dict()["stages"][sync_key] == {"yielded": None, "pending": [4]}
        assert list(again) == [4, 5, 6, 7, 8, 9]

    def test_load_after_start_refused(self):
        it = iter(W(range(3)).fullsync())
        state = it.state_dict()
        next(it)
        with pytest.raises(RuntimeError, match="already started"):
            it.load_state_dict(state)

    @pytest.mark.parametrize("timeout, error, match", [
        ("60", TypeError, "FullSync: timeout must be a number of seconds, got str"),
        (True, TypeError, "FullSync: timeout must be a number of seconds, got bool"),
        (0, ValueError, "FullSync: timeout must be > 0, got 0"),
        (-1.5, ValueError, "FullSync: timeout must be > 0, got -1.5"),
    ])
    def test_bad_timeout(self, timeout, error, match):
        with pytest.raises(error, match=match):
            W(range(3)).fullsync(timeout=timeout)

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="FullSync: buffer_size must be >= 1, got 0"):
            W(range(3)).fullsync(buffer_size=0)
        with pytest.raises(TypeError, match="FullSync: datapipe must be an IterDataPipe, got list"):
            FullSync([1, 2, 3])
        assert W(range(3)).fullsync(timeout=0.5).timeout == 0.5

    def test_ranks_named_without_a_process_group(self, monkeypatch):
        pipe = W(range(3)).fullsync()
        with as_rank(monkeypatch, 0, 2), pytest.raises(
            RuntimeError, match=r"FullSync\(1800\): RANK/WORLD_SIZE name 2 ranks but no torch.distributed process "
                                r"group is initialised"
        ):
            iter(pipe)
        with as_rank(monkeypatch, 0, 1):
            assert list(pipe) == [0, 1, 2]

    def test_inside_a_worker_of_a_distributed_run(self, monkeypatch):
        pipe = W(range(3)).fullsync()
        with as_rank(monkeypatch, 1, 2), as_worker(0, 2), pytest.raises(
            RuntimeError, match=r"inside a DataLoader worker of a distributed run of 2 ranks.*after the DataLoader"
        ):
            iter(pipe)
        with as_worker(0, 2):
            assert list(pipe) == [0, 1, 2]  # a worker of a single process: nothing to agree on

    def test_prefetch_timeout_error_is_both(self):
        error = PrefetchTimeoutError("FullSync: late", 3)
        assert isinstance(error, RuntimeError) and isinstance(error, TimeoutError) and error.timeout == 3


# -- FullSync with two gloo ranks ------------------------------------------------------------------

LENGTHS = (10, 7)


def _own(rank, n=None):
    """Rank ``rank``'s items: ``rank * 100 + i`` for ``i < n`` (its length by default)."""
    return list(range(rank * 100, rank * 100 + (LENGTHS[rank] if n is None else n)))


def _sync_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("datapipes FullSync")]


def _wait_no_sync_threads(seconds=5.0):
    deadline = time.monotonic() + seconds
    while _sync_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return _sync_threads()


def _fullsync_rank(rank, world_size, folder):
    """One rank: every FullSync scenario, the ranks meeting at a barrier between scenarios."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    result = {"rank": rank}
    try:
        pipe = W(_own(rank)).fullsync(timeout=30)
        result["epochs"] = [list(pipe), list(pipe)]
        try:
            len(pipe)
        except TypeError as e:
            result["len"] = str(e)

        # Many items in small rounds.
        long = W(list(range(200 if rank == 0 else 150))).fullsync(timeout=30, buffer_size=3)
        result["long"] = list(long)

        # The contract, run the same way on both ranks (closing early, pickling, re-iterating).
        result["contract"] = check_datapipe(pipe, expected=_own(rank, 7))
        result["resume"] = check_resume(lambda: W(_own(rank)).fullsync(timeout=30, buffer_size=2))

        # Closed early on both ranks: no thread left, no rank left waiting.
        it = iter(W(_own(rank)).fullsync(timeout=30, buffer_size=2))
        result["head"] = list(itertools.islice(it, 3))
        start = time.monotonic()
        it.close()
        result["close_s"] = time.monotonic() - start
        result["threads_after_close"] = _wait_no_sync_threads()
        dist.barrier()

        # Dropped without close.
        it = iter(W(_own(rank)).fullsync(timeout=30))
        next(it)
        del it
        result["threads_after_drop"] = _wait_no_sync_threads()
        dist.barrier()

        # Resumed from states saved after different numbers of items (both ranks took 2 items in one
        # pass, 5 in another; rank 0 resumes the first, rank 1 the second): each still ends at 7 in all.
        states = {}
        for k in (2, 5):
            it = iter(W(_own(rank)).fullsync(timeout=30, buffer_size=4))
            states[k] = ([next(it) for _ in range(k)], pickle.loads(pickle.dumps(it.state_dict())))
            it.close()
        head, state = states[2 if rank == 0 else 5]
        again = iter(W(_own(rank)).fullsync(timeout=30, buffer_size=4))
        again.load_state_dict(state)
        result["uneven_resume"] = head + list(again)

        # Rank 1's upstream raises after 4 items: it raises its own error, rank 0 a RuntimeError.
        fn = fail_at(104) if rank == 1 else times_ten
        got = []
        try:
            for x in W(_own(rank)).map(fn).fullsync(timeout=30):
                got.append(x)
        except Boom as e:
            result["error"] = ["Boom", e.code]
        except RuntimeError as e:
            result["error"] = ["RuntimeError", str(e)]
        result["before_error"] = got

        # Rank 0's upstream raises at its 9th item, past rank 1's length: never reached.
        fn = fail_at(8) if rank == 0 else times_ten
        result["error_past_the_end"] = list(W(_own(rank)).map(fn).fullsync(timeout=30))

        # Rank 1 never asks for an item: rank 0 times out.
        it = iter(W(_own(rank)).fullsync(timeout=1))
        if rank == 0:
            start = time.monotonic()
            try:
                next(it)
            except PrefetchTimeoutError as e:
                result["timeout"] = [str(e), time.monotonic() - start]
        dist.barrier()
        it.close()
        dist.barrier()
        result["threads_at_end"] = _wait_no_sync_threads()
    except BaseException:
        result["failed"] = traceback.format_exc()
        raise
    finally:
        with open(f"{folder}/rank{rank}.json", "w") as f:
            json.dump(result, f)
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(150)
class TestFullSyncTwoGlooRanks:
    def test_ranks_of_unequal_lengths(self, tmp_path):
        try:
            run_ranks(_fullsync_rank, (2, str(tmp_path)), 2, 120)
        finally:
            results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)
                       if (tmp_path / f"rank{r}.json").exists()]
            for r in results:
                assert "failed" not in r, r["failed"]
        assert len(results) == 2
        for rank, r in enumerate(results):
            mine = _own(rank, 7)
            assert r["epochs"] == [mine, mine]  # both yield 7: each its own items, in order
            assert "FullSync(30) has no len()" in r["len"]
            assert r["long"] == list(range(150))
            assert r["contract"] == mine
            assert r["resume"] == mine
            assert r["head"] == mine[:3] and r["close_s"] < 2
            assert r["threads_after_close"] == [] and r["threads_after_drop"] == [] and r["threads_at_end"] == []
            assert r["uneven_resume"] == mine
            assert r["before_error"] == ([0, 10, 20, 30] if rank == 0 else mine[:4])
            assert r["error_past_the_end"] == ([x * 10 for x in mine] if rank == 1 else mine)
        assert results[1]["error"] == ["Boom", 104]
        assert results[0]["error"][0] == "RuntimeError"
        assert "the upstream of another rank raised an exception after 4 items" in results[0]["error"][1]
        message, seconds = results[0]["timeout"]
        assert message.startswith("FullSync(1): no agreement with the other ranks within timeout=1 s after 0 items")
        assert 0.9 < seconds < 10
