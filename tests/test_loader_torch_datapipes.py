"""datapipes.DataLoader over torch's own DataPipes (``torch.utils.data.datapipes``), alone or mixed
with ours: as torch's DataLoader runs them, every item once per epoch, shuffles seeded from the
loader's seed and epoch (the same in every worker), torch's sharding_filter reading each worker's
shard, ``shuffle=`` turning torch's shuffles on and off."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch
import torch.utils.data.datapipes as tdp
from torch.utils.data import DataLoader as TorchDataLoader

from datapipes import DataLoader
from datapipes.iter import IterableWrapper

N = 60


def torch_pipe(n: int = N, sharded: bool = True) -> tdp.iter.IterDataPipe:
    pipe = tdp.iter.IterableWrapper(list(range(n))).shuffle(buffer_size=5)
    return pipe.sharding_filter() if sharded else pipe


def items(loader: DataLoader) -> list[int]:
    return [int(x) for x in loader]


def no_sharding_warning(caught: list[warnings.WarningMessage]) -> bool:
    return not any("sharding_filter" in str(w.message) for w in caught)


class TestTorchGraphInLoader:
    @pytest.mark.parametrize("workers", [0, 1, 2])
    def test_every_item_once_fork(self, workers: int) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = DataLoader(torch_pipe(), num_workers=workers, shuffle=True, seed=3)
            first, second = items(loader), items(loader)
        assert sorted(first) == list(range(N)) and sorted(second) == list(range(N))
        assert first != second  # a new order each epoch
        assert no_sharding_warning(caught)

    def test_every_item_once_spawn(self) -> None:
        # the reproduction of the bug: torch's seed drawn before the loader's first pass
        loader = DataLoader(torch_pipe(), num_workers=2, shuffle=True, multiprocessing_context="spawn")
        torch.manual_seed(123)
        first = items(loader)
        assert sorted(first) == list(range(N))
        again = DataLoader(torch_pipe(), num_workers=2, shuffle=True, multiprocessing_context="spawn")
        torch.manual_seed(123)
        assert items(again) == first  # torch.manual_seed reproduces the run

    def test_same_multiset_as_torch_loader(self) -> None:
        theirs = [int(x) for x in TorchDataLoader(torch_pipe(), num_workers=2, shuffle=True)]
        ours = items(DataLoader(torch_pipe(), num_workers=2, shuffle=True))
        assert Counter(ours) == Counter(theirs) == Counter(range(N))

    @pytest.mark.parametrize("workers", [0, 2])
    def test_seed_and_generator_reproduce(self, workers: int) -> None:
        a = items(DataLoader(torch_pipe(), num_workers=workers, seed=7))
        b = items(DataLoader(torch_pipe(), num_workers=workers, seed=7))
        c = items(DataLoader(torch_pipe(), num_workers=workers, seed=8))
        g = items(DataLoader(torch_pipe(), num_workers=workers, generator=torch.Generator().manual_seed(5)))
        h = items(DataLoader(torch_pipe(), num_workers=workers, generator=torch.Generator().manual_seed(5)))
        assert a == b and a != c and g == h
        assert sorted(a) == sorted(c) == sorted(g) == list(range(N))

    def test_worker_count_keeps_the_shuffle(self) -> None:
        # every worker draws the permutation of the pass's seed: 0 and 1 worker give the same order
        assert items(DataLoader(torch_pipe(), num_workers=0, seed=1)) == items(
            DataLoader(torch_pipe(), num_workers=1, seed=1))

    @pytest.mark.parametrize("workers", [0, 2])
    def test_shuffle_false_turns_torch_shuffles_off(self, workers: int) -> None:
        got = items(DataLoader(torch_pipe(), num_workers=workers, shuffle=False))
        assert sorted(got) == list(range(N))
        if workers == 0:
            assert got == list(range(N))
        else:  # the workers' shards, taken in turn
            assert got == [i for pair in zip(range(0, N, 2), range(1, N, 2)) for i in pair]

    def test_shuffle_true_adds_a_shuffle_where_torch_has_none(self) -> None:
        pipe = tdp.iter.IterableWrapper(list(range(N))).sharding_filter()
        with pytest.warns(UserWarning, match="does not contain a `Shuffler`"):
            loader = DataLoader(pipe, num_workers=2, shuffle=True, seed=0)
        got = items(loader)
        assert sorted(got) == list(range(N)) and got != sorted(got)

    def test_without_sharding_filter_warns_and_shards(self) -> None:
        with pytest.warns(UserWarning, match="has no sharding_filter"):
            loader = DataLoader(torch_pipe(sharded=False), num_workers=2, seed=0)
        assert sorted(items(loader)) == list(range(N))

    def test_len_with_workers(self) -> None:
        assert len(DataLoader(torch_pipe(), num_workers=2, seed=0)) == N
        # each worker batches its own 30 items: 8 batches each, as torch's loader counts them
        batched = DataLoader(torch_pipe(), num_workers=2, seed=0, batch_size=4)
        assert len(batched) == 16 == len(list(batched))

    @pytest.mark.parametrize("workers", [0, 2])
    def test_torch_stages_over_ours(self, workers: int) -> None:
        ours = IterableWrapper(range(N)).map(lambda x: x * 10)
        pipe = tdp.iter.Shuffler(ours, buffer_size=7).sharding_filter()
        got = items(DataLoader(pipe, num_workers=workers, seed=2))
        assert sorted(got) == [10 * i for i in range(N)]
        assert got == items(DataLoader(pipe, num_workers=workers, seed=2))

    @pytest.mark.parametrize("workers", [0, 2])
    def test_state_dict_resumes_the_same_order(self, workers: int) -> None:
        whole = [int(x) for batch in DataLoader(torch_pipe(), num_workers=workers, seed=4, batch_size=3)
                 for x in batch]
        loader = DataLoader(torch_pipe(), num_workers=workers, seed=4, batch_size=3)
        it = iter(loader)
        head = [int(x) for _ in range(5) for x in next(it)]
        # the graph's items are counted and replayed: the resumed pass's shuffles get the same seeds
        state = loader.state_dict()
        del it
        resumed = DataLoader(torch_pipe(), num_workers=workers, seed=4, batch_size=3)
        resumed.load_state_dict(state)
        rest = [int(x) for batch in resumed for x in batch]
        assert head + rest == whole
