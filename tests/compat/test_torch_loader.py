"""Our pipes in torch's own DataLoader, as torch's DataPipes are there: torch treats them as its
``IterDataPipe``/``MapDataPipe`` (a virtual subclass), walks their graph with its own
``traverse_dps``, turns their shuffles on and off with ``shuffle=``, seeds them per epoch from one
shared seed (in every worker and rank) and shards them through ``sharding_filter``.

The behaviour reproduced is what PyTorch's test_datapipe.py and torch/utils/data/dataloader.py
describe for its DataPipes; the differences kept on purpose are tested as such (a stage the user
seeded keeps its seed).
"""

import warnings

import pytest
import torch
import torch.utils.data.graph
import torch.utils.data.graph_settings
from torch.utils.data import DataLoader
from torch.utils.data.datapipes import datapipe as torch_datapipe
from torch.utils.data.datapipes.iter import IterableWrapper as TorchIterableWrapper
from torch.utils.data.datapipes.iter import Zipper as TorchZipper

from datapipes import IterDataPipe, MapDataPipe
from datapipes.iter import IterableWrapper, Mapper, Shuffler
from datapipes.map import SequenceWrapper

N = 20


def times10(x):
    return x * 10


def pipe_with_shuffle():
    return IterableWrapper(range(N)).shuffle().sharding_filter().map(times10)


def flat(loader):
    return [int(x) for x in loader]


class TestTorchSeesOurPipes:
    def test_isinstance_of_torchs_base_classes(self):
        assert isinstance(IterableWrapper([1]), torch_datapipe.IterDataPipe)
        assert isinstance(SequenceWrapper([1]), torch_datapipe.MapDataPipe)
        assert issubclass(Mapper, torch_datapipe.IterDataPipe)
        assert not isinstance(IterableWrapper([1]), torch_datapipe.MapDataPipe)
        # torch's pipes are not ours: our registry and methods stay ours
        assert not isinstance(TorchIterableWrapper([1]), IterDataPipe)

    def test_torchs_traverse_dps_finds_every_stage(self):
        source = IterableWrapper(range(4))
        a, b = source.map(lambda x: x + 1).fork(2)
        top = a.zip(b.filter(lambda x: x % 2 == 1)).shuffle()
        graph = torch.utils.data.graph.traverse_dps(top)
        found = torch.utils.data.graph_settings.get_all_graph_pipes(graph)
        kinds = {type(p).__name__ for p in found}
        assert {"Shuffler", "Zipper", "Filter", "Mapper", "IterableWrapper"} <= kinds
        assert sum(p is source for p in found) == 1  # the shared source once
        assert list(top.set_seed(0))  # the walk left the pipe working (lambdas, forks)

    def test_torch_pipes_take_ours_as_input(self):
        zipped = TorchZipper(IterableWrapper(range(3)), TorchIterableWrapper("abc"))
        assert list(zipped) == [(0, "a"), (1, "b"), (2, "c")]


class TestShuffleArgument:
    def test_shuffle_false_turns_our_shuffles_off(self):
        pipe = pipe_with_shuffle()
        assert flat(DataLoader(pipe, shuffle=False, batch_size=None)) == [x * 10 for x in range(N)]

    def test_shuffle_true_turns_them_back_on(self):
        pipe = IterableWrapper(range(N)).shuffle().set_shuffle(False).map(times10)
        torch.manual_seed(0)
        first = flat(DataLoader(pipe, shuffle=True, batch_size=None))
        assert sorted(first) == [x * 10 for x in range(N)] and first != sorted(first)

    def test_shuffle_none_leaves_them_as_they_are(self):
        pipe = IterableWrapper(range(N)).shuffle().set_shuffle(False)
        assert flat(DataLoader(pipe, batch_size=None)) == list(range(N))

    def test_no_shuffler_and_shuffle_true_warns_as_torch(self):
        with pytest.warns(UserWarning, match="does not contain a `Shuffler`"):
            DataLoader(IterableWrapper(range(3)).map(times10), shuffle=True, batch_size=None)

    def test_map_style_pipe_shuffles_through_torchs_sampler(self):
        pipe = SequenceWrapper(list(range(N)))
        torch.manual_seed(0)
        got = flat(DataLoader(pipe, shuffle=True, batch_size=None))
        assert sorted(got) == list(range(N)) and got != list(range(N))

    def test_shuffle_is_deterministic_under_torch_manual_seed_and_new_each_epoch(self):
        pipe = pipe_with_shuffle()
        loader = DataLoader(pipe, shuffle=True, batch_size=None)
        torch.manual_seed(1)
        epochs = [flat(loader) for _ in range(3)]
        torch.manual_seed(1)
        again = [flat(loader) for _ in range(3)]
        assert epochs == again
        assert len({tuple(e) for e in epochs}) == 3
        for e in epochs:
            assert sorted(e) == [x * 10 for x in range(N)]

    def test_the_generator_argument_seeds_the_shuffle(self):
        def run(seed):
            return flat(DataLoader(pipe_with_shuffle(), batch_size=None, generator=torch.Generator().manual_seed(seed)))

        assert run(3) == run(3) != run(4)


class TestSeeds:
    def test_a_stage_the_user_seeded_keeps_its_seed(self):
        pipe = pipe_with_shuffle().set_seed(7)
        expected = list(pipe)
        for _ in range(2):
            assert flat(DataLoader(pipe, batch_size=None)) == expected

    def test_torchs_seed_is_lent_for_one_pass(self):
        # apply_random_seed (which torch's DataLoader runs before each epoch) seeds the next pass
        # of an unseeded random stage only, as torch's Shuffler.set_seed does.
        pipe = IterableWrapper(range(N)).shuffle()
        rng = torch.Generator().manual_seed(5)
        torch.utils.data.graph_settings.apply_random_seed(pipe, rng)
        first = list(pipe)
        torch.utils.data.graph_settings.apply_random_seed(pipe, torch.Generator().manual_seed(5))
        assert list(pipe) == first  # the same lent seed, the same order
        assert pipe._seed is None  # nothing persistent was written
        torch.manual_seed(0)
        unlent = [list(pipe) for _ in range(3)]
        assert len({tuple(u) for u in unlent}) == 3  # afterwards, fresh draws again

    def test_lent_seed_is_ignored_by_stages_that_draw_nothing(self):
        pipe = IterableWrapper(range(3)).map(times10)
        torch.utils.data.graph_settings.apply_random_seed(pipe, torch.Generator().manual_seed(0))
        assert "_lent_seed" not in pipe.__dict__ and "_lent_seed" not in pipe.datapipe.__dict__

    def test_our_set_seed_still_seeds_the_whole_graph(self):
        pipe = IterableWrapper(range(N)).shuffle().map(times10).shuffle()
        assert list(pipe.set_seed(1)) == list(pipe.set_seed(1))
        assert all(s._seed is not None for s in (pipe, pipe.datapipe.datapipe))


@pytest.mark.timeout(120)
class TestWorkers:
    def test_each_item_once_across_workers_shuffled_alike(self):
        torch.manual_seed(0)
        loader = DataLoader(pipe_with_shuffle(), shuffle=True, batch_size=None, num_workers=2)
        first, second = flat(loader), flat(loader)
        assert sorted(first) == sorted(second) == [x * 10 for x in range(N)]
        assert first != second  # each epoch a new shared seed
        torch.manual_seed(0)
        assert flat(DataLoader(pipe_with_shuffle(), shuffle=True, batch_size=None, num_workers=2)) == first

    def test_shuffle_false_in_workers_gives_source_order(self):
        loader = DataLoader(pipe_with_shuffle(), shuffle=False, batch_size=None, num_workers=2)
        assert flat(loader) == [x * 10 for x in range(N)]  # torch interleaves the two shards

    def test_sharding_twice_raises_torchs_error(self):
        pipe = IterableWrapper(range(N)).sharding_filter().sharding_filter()
        with pytest.raises(RuntimeError, match="Sharding twice on a single pipeline"):
            torch.utils.data.graph_settings.apply_sharding(pipe, 2, 0)

    def test_batches_collate_as_with_torchs_pipes(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no sharding warning: the pipe has a sharding_filter
            loader = DataLoader(pipe_with_shuffle(), shuffle=False, batch_size=5, num_workers=2)
            batches = list(loader)
        assert all(isinstance(b, torch.Tensor) and b.shape == (5,) for b in batches)
        assert sorted(int(x) for b in batches for x in b) == [x * 10 for x in range(N)]


def test_shuffler_type_is_what_torch_looks_for():
    # torch finds shuffles by their set_shuffle and set_seed methods
    assert torch.utils.data.graph_settings._is_shuffle_datapipe(Shuffler(IterableWrapper([1])))
    assert not torch.utils.data.graph_settings._is_shuffle_datapipe(IterableWrapper([1]))
    assert isinstance(SequenceWrapper([1]), MapDataPipe)
