"""torch's graph utilities under our names: ``datapipes.graph.traverse_dps`` /
``get_all_graph_pipes`` and ``datapipes.graph_settings`` (sharding, shuffle settings, random seeds),
checked against what torch's own functions do on torch DataPipes."""

import warnings

import pytest
import torch
from torch.utils.data import graph as torch_graph
from torch.utils.data import graph_settings as torch_settings
from torch.utils.data.datapipes.iter import IterableWrapper as TorchWrapper

from datapipes import graph_settings
from datapipes.graph import get_all_graph_pipes, traverse_dps
from datapipes.iter import IterableWrapper, UnBatcher, Unbatcher


def shapes(graph):
    """A graph from traverse_dps as nested (class name, [children]) tuples, comparable across libraries."""
    return sorted((type(p).__name__.removesuffix("IterDataPipe"), shapes(sub)) for p, sub in graph.values())


def both(build):
    return build(IterableWrapper), build(TorchWrapper)


class TestTraverse:
    @pytest.mark.parametrize("build", [
        lambda W: W(range(4)).map(abs).filter(bool),
        lambda W: W(range(4)).zip(W(range(3)).map(abs)),
        lambda W: W(range(4)).shuffle().sharding_filter().batch(2),
    ], ids=["chain", "zip", "shuffle-shard-batch"])
    def test_the_same_nested_graph_as_torch(self, build):
        ours, theirs = both(build)
        assert shapes(traverse_dps(ours)) == shapes(torch_graph.traverse_dps(theirs))

    def test_a_shared_source_appears_under_each_path_and_once_in_the_list(self):
        src = IterableWrapper(range(3))
        pipe = src.zip(src.map(abs))
        graph = traverse_dps(pipe)
        assert shapes(graph) == [("Zipper", [("IterableWrapper", []), ("Mapper", [("IterableWrapper", [])])])]
        assert [type(p).__name__ for p in get_all_graph_pipes(graph)].count("IterableWrapper") == 1

    def test_not_a_pipe(self):
        with pytest.raises(RuntimeError, match="Expected `IterDataPipe` or `MapDataPipe`"):
            traverse_dps([1, 2])


class TestShuffleSettings:
    def test_off_and_on(self):
        pipe = IterableWrapper(range(50)).shuffle().set_seed(1)
        assert list(graph_settings.apply_shuffle_settings(pipe, shuffle=False)) == list(range(50))
        assert list(graph_settings.apply_shuffle_settings(pipe, shuffle=True)) != list(range(50))
        assert graph_settings.apply_shuffle_settings(pipe, shuffle=None) is pipe

    def test_a_shuffle_is_added_at_the_end_with_torchs_warning(self):
        pipe = IterableWrapper(range(50))
        with pytest.warns(UserWarning, match="does not contain a `Shuffler`. Adding one at the end"):
            shuffled = graph_settings.apply_shuffle_settings(pipe, shuffle=True)
        assert type(shuffled).__name__ == "Shuffler" and sorted(shuffled) == list(range(50))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert graph_settings.apply_shuffle_settings(pipe, shuffle=False) is pipe  # nothing to turn off


class TestRandomSeed:
    def test_same_generator_seed_same_order_as_a_rule(self):
        def build():
            return IterableWrapper(range(40)).shuffle().map(abs).shuffle()

        orders = []
        for seed in (1, 1, 2):
            pipe = graph_settings.apply_random_seed(build(), torch.Generator().manual_seed(seed))
            orders.append(list(pipe))
        assert orders[0] == orders[1] != orders[2]

    def test_seeds_drawn_like_torchs(self):
        ours = IterableWrapper(range(5)).shuffle().shuffle()
        graph_settings.apply_random_seed(ours, torch.Generator().manual_seed(3))
        g = torch.Generator().manual_seed(3)
        expected = [int(torch.empty((), dtype=torch.int64).random_(generator=g).item()) for _ in range(2)]
        assert [ours._seed, ours.datapipe._seed] == expected

    def test_old_name_warns(self):
        with pytest.warns(FutureWarning, match="apply_shuffle_seed` is deprecated"):
            graph_settings.apply_shuffle_seed(IterableWrapper(range(3)).shuffle(), torch.Generator())

    def test_rng_must_be_a_generator(self):
        with pytest.raises(TypeError, match="torch.Generator"):
            graph_settings.apply_random_seed(IterableWrapper(range(3)), 5)


def test_sharding_as_torch():
    ours = graph_settings.apply_sharding(IterableWrapper(range(10)).sharding_filter(), 3, 2)
    theirs = torch_settings.apply_sharding(TorchWrapper(range(10)).sharding_filter(), 3, 2)
    assert list(ours) == list(theirs) == [2, 5, 8]
    assert graph_settings.SHARDING_PRIORITIES.MULTIPROCESSING.value == 3


def test_unbatcher_spelled_as_torch():
    assert UnBatcher is Unbatcher
    assert list(IterableWrapper([[1, 2], [3]]).unbatch()) == [1, 2, 3]
