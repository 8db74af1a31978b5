"""torch's shuffle=, sampler=, batch_sampler= and generator= on datapipes.DataLoader (issue 20, finding 7).

The meanings are torch's (docs/from_dataloader.rst): one permutation per epoch, each index once
across workers, a seeded generator reproduces a run. The draws are not torch's own: each worker
draws the pass's indices itself from the pass seed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler
from torch.utils.data import Sampler as TorchSampler
from torch.utils.data import WeightedRandomSampler

from datapipes import DataLoader
from datapipes.iter import IterableWrapper, Sampler

DATA = list(range(24))


def batches(loader):
    return [batch.tolist() for batch in loader]


def flat(passes):
    return sorted(i for batch in passes for i in batch)


class TestShuffle:
    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_each_epoch_is_one_new_permutation(self, num_workers):
        loader = DataLoader(DATA, 4, shuffle=True, num_workers=num_workers, seed=0)
        first, second = batches(loader), batches(loader)
        assert flat(first) == flat(second) == DATA  # every index exactly once, across the workers
        assert first != second and flat([first[0]]) != DATA[:4]
        assert len(loader) == 6

    def test_the_order_does_not_depend_on_the_number_of_workers(self):
        alone = batches(DataLoader(DATA, 5, shuffle=True, seed=3))
        assert batches(DataLoader(DATA, 5, shuffle=True, seed=3, num_workers=2)) == alone

    def test_a_seeded_generator_reproduces_a_run(self):
        def run(seed):
            loader = DataLoader(DATA, 6, shuffle=True, generator=torch.Generator().manual_seed(seed))
            return [batches(loader) for _ in range(2)]

        assert run(7) == run(7) != run(8)

    def test_without_batch_size_the_samples_come_one_by_one(self):
        items = list(DataLoader(["a", "b", "c", "d"], batch_size=None, shuffle=True, seed=1))
        assert sorted(items) == ["a", "b", "c", "d"]

    def test_false_and_none_read_in_index_order(self):
        assert batches(DataLoader(DATA, 12, shuffle=False)) == [DATA[:12], DATA[12:]]

    def test_on_a_datapipe_it_turns_its_shuffles_on_and_off(self):
        pipe = IterableWrapper(range(20)).shuffle()
        assert list(DataLoader(pipe, batch_size=None, shuffle=False)) == list(range(20))
        shuffled = list(DataLoader(pipe, batch_size=None, shuffle=True, seed=2))
        assert sorted(shuffled) == list(range(20)) and shuffled != list(range(20))
        with pytest.warns(UserWarning, match="Shuffler"):  # none in the pipe: one is added at the end, as torch does
            added = list(DataLoader(IterableWrapper(range(20)), batch_size=None, shuffle=True, seed=2))
        assert sorted(added) == list(range(20)) and added != list(range(20))

    def test_on_another_iterable_it_is_refused_with_torchs_words(self):
        with pytest.raises(ValueError, match="DataLoader with IterableDataset: expected unspecified shuffle option"):
            DataLoader(iter(range(3)), shuffle=True)


class TestSamplers:
    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_a_weighted_sampler_draws_as_in_torch(self, num_workers):
        sampler = WeightedRandomSampler([0.0] * 12 + [1.0] * 12, num_samples=30)
        loader = DataLoader(DATA, 8, sampler=sampler, num_workers=num_workers, seed=5)
        drawn = [i for batch in batches(loader) for i in batch]
        assert len(drawn) == 30 and all(i >= 12 for i in drawn)
        assert len(loader) == 4
        assert len(set(drawn)) < 30  # with replacement

    def test_workers_read_the_indices_one_process_draws(self):
        def drawn(num_workers):
            sampler = WeightedRandomSampler([1.0] * 24, num_samples=24)
            return batches(DataLoader(DATA, 6, sampler=sampler, num_workers=num_workers, seed=9))

        assert drawn(2) == drawn(0)

    def test_a_batch_sampler_gives_the_batches(self):
        loader = DataLoader(DATA, batch_sampler=BatchSampler(RandomSampler(DATA), 5, drop_last=False),
                            num_workers=2, seed=4)
        got = batches(loader)
        assert [len(b) for b in got] == [5, 5, 5, 5, 4] and flat(got) == DATA
        assert len(loader) == 5

    def test_the_samplers_own_generator_seeds_the_run(self):
        def run():
            return batches(DataLoader(DATA, 8, sampler=RandomSampler(DATA, generator=torch.Generator().manual_seed(1))))

        assert run() == run()

    def test_a_sampler_from_the_global_generators_is_seeded_too(self):
        class NumpyShuffle(TorchSampler):
            def __iter__(self):
                return iter(np.random.permutation(24).tolist())

            def __len__(self):
                return 24

        got = batches(DataLoader(DATA, 6, sampler=NumpyShuffle(), num_workers=2, seed=0))
        assert flat(got) == DATA

    def test_a_sampler_the_loader_cannot_seed_is_refused_under_workers(self):
        class OwnState(TorchSampler):
            def __init__(self):
                self.rng = np.random.default_rng()

            def __iter__(self):
                return iter(self.rng.permutation(24).tolist())

        with pytest.raises(ValueError, match="sampler=OwnState draws different indices from the same seed"):
            DataLoader(DATA, 4, sampler=OwnState(), num_workers=2)
        assert len(flat(batches(DataLoader(DATA, 4, sampler=OwnState())))) == 24  # one process: as in torch

    def test_a_distributed_sampler_keeps_its_ranks_share(self):
        seen = []
        for rank in range(2):
            sampler = DistributedSampler(DATA, num_replicas=2, rank=rank, shuffle=True, seed=0)
            seen += [i for batch in batches(DataLoader(DATA, 3, sampler=sampler, num_workers=2)) for i in batch]
        assert sorted(seen) == DATA

    def test_a_distributed_sampler_gets_the_loaders_epoch(self):
        sampler = DistributedSampler(DATA, num_replicas=1, rank=0, shuffle=True, seed=0)
        loader = DataLoader(DATA, 24, sampler=sampler)
        loader.set_epoch(0)
        first = batches(loader)
        loader.set_epoch(1)
        second = batches(loader)
        expected = torch.randperm(24, generator=torch.Generator().manual_seed(1)).tolist()  # its seed + epoch
        assert second == [expected] and first != second
        assert sampler.epoch == 0  # the caller's sampler is left as it was

    def test_a_sequential_sampler_reads_in_order(self):
        assert batches(DataLoader(DATA, 12, sampler=SequentialSampler(DATA), num_workers=2)) == [DATA[:12], DATA[12:]]


class TestRules:
    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"sampler": SequentialSampler(DATA), "shuffle": True}, "sampler option is mutually exclusive with shuffle"),
            ({"batch_sampler": BatchSampler(SequentialSampler(DATA), 2, False), "batch_size": 2},
             "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last"),
            ({"batch_sampler": BatchSampler(SequentialSampler(DATA), 2, False), "shuffle": True},
             "batch_sampler option is mutually exclusive"),
            ({"seed": 1, "generator": torch.Generator()}, "give seed= or generator=, not both"),
        ],
    )
    def test_conflicts_are_refused(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            DataLoader(DATA, **kwargs)

    def test_bad_types_name_the_argument(self):
        with pytest.raises(TypeError, match="generator must be a torch.Generator or None, got int"):
            DataLoader(DATA, generator=3)
        with pytest.raises(TypeError, match="sampler must be an iterable of indices"):
            DataLoader(DATA, sampler=3)
        with pytest.raises(TypeError, match="shuffle must be a bool, got str"):
            DataLoader(DATA, shuffle="yes")

    def test_an_iterable_has_no_indices_to_sample(self):
        with pytest.raises(ValueError, match="expected unspecified sampler option"):
            DataLoader(IterableWrapper(range(3)), sampler=SequentialSampler(range(3)))

    def test_they_are_torch_only_arguments(self):
        with pytest.raises(TypeError, match="cannot mix the SPDL spelling"):
            DataLoader(DATA, shuffle=True, num_threads=2)

    def test_timeout_zero_means_none_as_in_torch(self):
        assert DataLoader(DATA, timeout=0).timeout is None

    def test_a_wrapped_random_sampler_is_refused_under_workers(self):
        pipe = IterableWrapper(RandomSampler(DATA)).sharding_filter().map(DATA.__getitem__)
        with pytest.raises(ValueError, match="IterableWrapper wraps a RandomSampler: each of the 2 worker processes"):
            DataLoader(pipe, 4, num_workers=2)
        assert flat(batches(DataLoader(pipe, 4))) == DATA  # one process: one permutation


class TestResume:
    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_a_shuffled_pass_resumes_where_it_stopped(self, num_workers):
        whole = batches(DataLoader(DATA, 4, shuffle=True, seed=0, num_workers=num_workers))
        loader = DataLoader(DATA, 4, shuffle=True, seed=0, num_workers=num_workers)
        it = iter(loader)
        head = [next(it).tolist() for _ in range(2)]
        state = loader.state_dict()
        it.close()
        again = DataLoader(DATA, 4, shuffle=True, seed=0, num_workers=num_workers)
        again.load_state_dict(state)
        assert head + batches(again) == whole


class TestSamplerPipe:
    def test_it_takes_a_sampler_already_built(self):
        pipe = Sampler(IterableWrapper(range(5)), WeightedRandomSampler([0.0, 1, 1, 0, 0], 6)).set_seed(1)
        assert list(pipe) == list(pipe) and set(pipe) <= {1, 2} and len(pipe) == 6

    def test_options_for_a_built_sampler_are_refused(self):
        with pytest.raises(TypeError, match="sampler is already built"):
            Sampler(IterableWrapper(range(5)), RandomSampler(range(5)), sampler_kwargs={"replacement": True})
