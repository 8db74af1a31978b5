"""Shuffler [shuffle], Sampler and RandomSplitter [random_split]: order, seeds, epochs, splits."""

import pickle
from collections import Counter

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, WeightedRandomSampler

from datapipes._runtime import passes as _pass
from datapipes.iter import IterableWrapper, RandomSplitter, Sampler, Shuffler
from datapipes.iter.combinatorics import SplitterIterator
from datapipes.testing import check_datapipe


class Counted:
    """A re-iterable source that counts its passes and the items pulled from it."""

    def __init__(self, data):
        self.data = list(data)
        self.passes = 0
        self.pulled = 0

    def __iter__(self):
        self.passes += 1
        for x in self.data:
            self.pulled += 1
            yield x

    def __len__(self):
        return len(self.data)


class Boom(Exception):
    pass


class TestShuffler:
    def test_contract_seeded(self):
        pipe = IterableWrapper(range(50)).map(lambda x: x * 2).shuffle(buffer_size=8).set_seed(3)
        out = check_datapipe(pipe, build=lambda src: src.shuffle(buffer_size=2))
        assert sorted(out) == [x * 2 for x in range(50)]
        assert out != sorted(out)

    def test_contract_unseeded_is_a_multiset_check(self):
        out = check_datapipe(IterableWrapper(range(30)).shuffle(), expected=range(30))
        assert sorted(out) == list(range(30))

    def test_class_and_functional_forms_agree(self):
        a = Shuffler(IterableWrapper(range(40)), buffer_size=5).set_seed(9)
        b = IterableWrapper(range(40)).shuffle(buffer_size=5).set_seed(9)
        assert list(a) == list(b)

    def test_same_seed_same_order_and_epochs_differ(self):
        pipe = IterableWrapper(range(100)).shuffle().set_seed(7)
        first = list(pipe)
        assert list(pipe) == first  # same epoch: the same order at every pass
        other = IterableWrapper(range(100)).shuffle().set_seed(7)
        assert list(other) == first  # same seed and graph: the same order
        epoch1 = list(pipe.set_epoch(1))
        assert sorted(epoch1) == list(range(100)) and epoch1 != first
        assert list(pipe.set_epoch(0)) == first  # back to epoch 0, back to its order
        assert list(IterableWrapper(range(100)).shuffle().set_seed(8)) != first

    def test_unseeded_passes_follow_torch_manual_seed(self):
        pipe = IterableWrapper(range(100)).shuffle()
        torch.manual_seed(0)
        a, b = list(pipe), list(pipe)
        torch.manual_seed(0)
        assert list(pipe) == a and list(pipe) == b
        assert a != b  # every unseeded pass draws a fresh seed

    def test_set_seed_none_goes_back_to_fresh_draws(self):
        pipe = IterableWrapper(range(50)).shuffle().set_seed(1)
        seeded = list(pipe)
        pipe.set_seed(None)
        torch.manual_seed(5)
        a = list(pipe)
        torch.manual_seed(5)
        assert list(pipe) == a and a != seeded

    @given(st.lists(st.integers(), max_size=60), st.integers(1, 70), st.integers(0, 2**32))
    def test_a_permutation_for_any_buffer(self, data, buffer_size, seed):
        out = list(IterableWrapper(data).shuffle(buffer_size=buffer_size).set_seed(seed))
        assert Counter(out) == Counter(data)

    def test_buffer_bound_holds(self):
        # Item i cannot come out before it is read: position j holds an item read at most
        # buffer_size - 1 places later, and the source is read only one item past the buffer.
        k = 6
        src = Counted(range(200))
        it = iter(IterableWrapper(src).shuffle(buffer_size=k).set_seed(2))
        next(it)
        assert src.pulled == k + 1
        out = [next(it) for _ in range(20)]
        assert src.pulled == k + 21
        rest = out + list(it)
        assert all(x <= j + 1 + k for j, x in enumerate(rest))

    def test_buffer_size_one_keeps_order_and_big_buffer_mixes_everything(self):
        assert list(IterableWrapper(range(20)).shuffle(buffer_size=1).set_seed(0)) == list(range(20))
        out = list(IterableWrapper(range(20)).shuffle(buffer_size=100).set_seed(0))
        assert sorted(out) == list(range(20)) and out != list(range(20))

    def test_every_position_reachable(self):
        # With a full buffer every item lands in the first slot for some seed.
        firsts = {list(IterableWrapper(range(5)).shuffle().set_seed(s))[0] for s in range(200)}
        assert firsts == set(range(5))

    def test_set_shuffle_off_and_on(self):
        pipe = IterableWrapper(range(30)).shuffle().set_seed(4)
        shuffled = list(pipe)
        assert pipe.set_shuffle(False) is pipe
        assert list(pipe) == list(range(30))
        assert list(pipe.set_shuffle(True)) == shuffled
        check_datapipe(IterableWrapper(range(5)).shuffle().set_shuffle(False), expected=range(5), ordered=True)

    def test_independent_interleaved_passes(self):
        pipe = IterableWrapper(range(40)).shuffle(buffer_size=4).set_seed(11)
        a, b = iter(pipe), iter(pipe)
        got_a, got_b = [], []
        for _ in range(40):
            got_a.append(next(a))
            got_b.append(next(b))
        assert got_a == got_b == list(pipe)

    def test_unbatch_level(self):
        pipe = IterableWrapper([[1, 2], [3, 4], [5]]).shuffle(unbatch_level=1).set_seed(0)
        assert sorted(pipe) == [1, 2, 3, 4, 5]
        assert repr(pipe) == "IterableWrapper -> Unbatcher(1) -> Shuffler(10000)"
        with pytest.raises(TypeError, match="Unbatcher"):
            len(pipe)  # the batch sizes are not known before iterating
        deep = IterableWrapper([[[1], [2]], [[3]]]).shuffle(unbatch_level=-1).set_seed(0)
        assert sorted(deep) == [1, 2, 3]

    def test_len_and_empty(self):
        assert len(IterableWrapper(range(9)).shuffle()) == 9
        check_datapipe(IterableWrapper([]).shuffle(), expected=[])
        with pytest.raises(TypeError, match="Filter"):
            len(IterableWrapper(range(3)).filter(bool).shuffle())

    def test_none_items(self):
        assert list(IterableWrapper([None, None, 1]).shuffle(buffer_size=1)) == [None, None, 1]
        assert Counter(IterableWrapper([None] * 5 + [0]).shuffle(buffer_size=2)) == Counter([None] * 5 + [0])

    def test_pickle_keeps_seed_and_lambda(self):
        pipe = IterableWrapper(range(30)).map(lambda x: x + 1).shuffle(buffer_size=5).set_seed(2).set_epoch(3)
        clone = pickle.loads(pickle.dumps(pipe))
        assert list(clone) == list(pipe)

    def test_source_error_passes_through(self):
        err = Boom("source")

        def gen():
            yield from range(10)
            raise err

        with pytest.raises(Boom) as info:
            list(IterableWrapper(gen()).shuffle(buffer_size=3))
        assert info.value is err

    def test_repr(self):
        assert repr(IterableWrapper([1]).shuffle(buffer_size=32)) == "IterableWrapper -> Shuffler(32)"

    def test_bad_arguments(self):
        src = IterableWrapper(range(3))
        with pytest.raises(ValueError, match="^Shuffler\\(buffer_size=0\\): buffer_size should be larger than 0$"):
            src.shuffle(buffer_size=0)
        with pytest.raises(TypeError, match="Shuffler: buffer_size must be an int, got str"):
            src.shuffle(buffer_size="8")
        with pytest.raises(TypeError, match="buffer_size must be an int, got bool"):
            src.shuffle(buffer_size=True)
        with pytest.raises(TypeError):
            src.shuffle(8)  # keyword only, as in torch
        with pytest.raises(ValueError, match="Shuffler: unbatch_level must be >= -1, got -2"):
            src.shuffle(unbatch_level=-2)
        with pytest.raises(TypeError, match="Shuffler: datapipe must be an IterDataPipe, got list"):
            Shuffler([1, 2, 3])
        with pytest.raises(TypeError, match="seed must be an int or None"):
            src.shuffle().set_seed("0")
        with pytest.raises(ValueError, match="epoch must be an int >= 0"):
            src.shuffle().set_epoch(-1)


class IdentitySampler:
    """A sampler that yields the items of its data source (not indices)."""

    def __init__(self, reverse=False, *, data_source):
        self.data_source = data_source
        self.reverse = reverse

    def __iter__(self):
        items = list(self.data_source)
        return iter(items[::-1] if self.reverse else items)

    def __len__(self):
        return len(self.data_source)


class RaisingSampler:
    def __init__(self, error, data_source):
        self.error = error

    def __iter__(self):
        yield 0
        raise self.error


class TestSampler:
    def test_default_yields_indices_as_torch(self):
        pipe = Sampler(IterableWrapper(["a", "b", "c"]))
        assert isinstance(pipe.sampler, SequentialSampler)
        assert check_datapipe(pipe, expected=[0, 1, 2]) == [0, 1, 2]
        assert len(pipe) == 3

    def test_no_functional_name_as_torch(self):
        assert not hasattr(IterableWrapper([1]), "sample")
        assert not hasattr(IterableWrapper([1]), "sampler")

    def test_sampler_built_over_the_datapipe(self):
        src = IterableWrapper(["x", "y", "z"]).map(str.upper)
        pipe = Sampler(src, sampler=IdentitySampler, sampler_kwargs={"reverse": True})
        assert pipe.sampler.data_source is src
        assert check_datapipe(pipe, expected=["Z", "Y", "X"]) == ["Z", "Y", "X"]
        assert list(Sampler(src, IdentitySampler, sampler_args=(False,))) == ["X", "Y", "Z"]

    def test_len_follows_the_sampler_at_call_time(self):
        data = [1, 2, 3]
        pipe = Sampler(IterableWrapper(data))
        assert len(pipe) == 3
        data.append(4)
        assert len(pipe) == 4 and list(pipe) == [0, 1, 2, 3]
        more = Sampler(IterableWrapper(range(3)), RandomSampler, sampler_kwargs={"replacement": True, "num_samples": 10})
        out = check_datapipe(more.set_seed(0))
        assert len(out) == len(more) == 10 and set(out) <= {0, 1, 2}

    def test_random_sampler_seeds_and_epochs(self):
        pipe = Sampler(IterableWrapper(range(50)), sampler=RandomSampler).set_seed(1)
        first = check_datapipe(pipe)
        assert sorted(first) == list(range(50)) and first != list(range(50))
        assert list(Sampler(IterableWrapper(range(50)), sampler=RandomSampler).set_seed(1)) == first
        second = list(pipe.set_epoch(1))
        assert sorted(second) == list(range(50)) and second != first
        assert list(pipe.set_epoch(0)) == first
        assert pipe.sampler.generator is None  # each pass seeds a copy; the pipe's sampler is untouched

    def test_random_sampler_unseeded_follows_torch_manual_seed(self):
        pipe = Sampler(IterableWrapper(range(50)), sampler=RandomSampler)
        torch.manual_seed(3)
        a, b = list(pipe), list(pipe)
        torch.manual_seed(3)
        assert list(pipe) == a and list(pipe) == b and a != b
        check_datapipe(pipe, expected=range(50))

    def test_any_sampler_with_an_unset_generator_is_seeded(self):
        class Coin:
            def __init__(self, data_source, generator=None):
                self.data_source, self.generator = data_source, generator

            def __iter__(self):
                g = self.generator if self.generator is not None else torch.Generator()
                return iter(torch.randint(0, 2, (len(self.data_source),), generator=g).tolist())

        pipe = Sampler(IterableWrapper(range(40)), Coin).set_seed(0)
        assert pipe._is_random
        first = list(pipe)
        assert list(pipe) == first and set(first) == {0, 1}
        assert list(pipe.set_epoch(1)) != first

    def test_user_generator_is_kept(self):
        gen = torch.Generator().manual_seed(0)
        pipe = Sampler(IterableWrapper(range(30)), RandomSampler, sampler_kwargs={"generator": gen})
        assert not pipe._is_random  # the user's generator decides, not the pipe's seed
        a = list(pipe)
        gen.manual_seed(0)
        assert list(pipe) == a

    def test_pickle(self):
        pipe = Sampler(IterableWrapper(range(20)).map(lambda x: x), sampler=RandomSampler).set_seed(5)
        clone = pickle.loads(pickle.dumps(pipe))
        assert list(clone) == list(pipe)
        assert clone.sampler.data_source is clone.datapipe

    def test_empty(self):
        check_datapipe(Sampler(IterableWrapper([])), expected=[])
        with pytest.raises(ValueError, match="Sampler: cannot build sampler RandomSampler.*num_samples"):
            Sampler(IterableWrapper([]), RandomSampler)  # torch's RandomSampler refuses an empty source

    def test_sampler_error_passes_through(self):
        err = Boom("sampler")
        pipe = Sampler(IterableWrapper([1, 2]), RaisingSampler, sampler_args=(err,))
        with pytest.raises(Boom) as info:
            list(pipe)
        assert info.value is err
        with pytest.raises(TypeError, match="^Sampler: its sampler, a RaisingSampler, has no length, so Sampler instance"):
            len(pipe)

    def test_bad_arguments(self):
        src = IterableWrapper(range(3))
        with pytest.raises(TypeError, match="Sampler: datapipe must be an IterDataPipe, got range"):
            Sampler(range(3))
        with pytest.raises(TypeError, match="Sampler: datapipe has no len\\(\\) \\(Filter.*: Sampler class requires"):
            Sampler(src.filter(bool))
        with pytest.raises(TypeError, match="Sampler: sampler must be callable, got int"):
            Sampler(src, sampler=3)
        with pytest.raises(TypeError, match="Sampler: sampler_args must be a tuple or None, got int"):
            Sampler(src, sampler_args=1)
        with pytest.raises(TypeError, match="Sampler: sampler_kwargs must be a dict or None, got list"):
            Sampler(src, sampler_kwargs=[1])
        with pytest.raises(ValueError, match="Sampler: sampler_kwargs must not hold data_source"):
            Sampler(src, sampler_kwargs={"data_source": [1]})
        with pytest.raises(TypeError, match="Sampler: cannot build sampler BatchSampler"):
            Sampler(src, sampler=BatchSampler, sampler_kwargs={"batch_size": 2, "drop_last": False})
        with pytest.raises(TypeError, match="Sampler: cannot build sampler WeightedRandomSampler"):
            Sampler(src, sampler=WeightedRandomSampler, sampler_kwargs={"num_samples": 2})  # no data_source
        with pytest.raises(TypeError, match="multiple values for argument 'data_source'"):
            Sampler(src, sampler=RandomSampler, sampler_args=(True,))  # as torch: data_source goes by keyword
        with pytest.raises(TypeError, match="Sampler: sampler .* built a int, which is not iterable"):
            Sampler(src, sampler=lambda data_source: 5)

    def test_user_kwargs_not_mutated(self):
        kwargs = {"replacement": False}
        Sampler(IterableWrapper(range(3)), RandomSampler, sampler_kwargs=kwargs)
        assert kwargs == {"replacement": False}


class TestRandomSplitter:
    def test_same_split_as_torchdata(self):
        # The example in torchdata's RandomSplitter docstring, same seed and weights.
        train, valid = IterableWrapper(range(10)).random_split(weights={"train": 0.5, "valid": 0.5}, seed=0)
        assert list(train) == [2, 3, 5, 7, 8]
        assert list(valid) == [0, 1, 4, 6, 9]
        only = IterableWrapper(range(10)).random_split(total_length=10, weights={"train": 0.5, "valid": 0.5},
                                                       seed=0, target="valid")
        assert isinstance(only, SplitterIterator) and list(only) == [0, 1, 4, 6, 9]

    def test_contract_and_class_form(self):
        children = RandomSplitter(IterableWrapper(range(40)).map(lambda x: -x), {"a": 3, "b": 1}, 5)
        assert isinstance(children, list) and [c.target for c in children] == ["a", "b"]
        a = check_datapipe(children[0])
        b = check_datapipe(children[1])
        assert len(a) == 30 and len(b) == 10
        assert sorted(a + b) == sorted(-x for x in range(40))
        check_datapipe(IterableWrapper(range(4)).random_split({"a": 1, "b": 1}, seed=0, target="a"),
                       build=lambda src: src.random_split({"a": 1, "b": 1}, seed=0, total_length=4, target="a"))

    @given(st.integers(0, 60), st.lists(st.integers(0, 5), min_size=1, max_size=4), st.integers(0, 2**31))
    def test_children_partition_the_source(self, n, weights, seed):
        if sum(weights) == 0:
            weights = weights[:-1] + [1]
        children = IterableWrapper(range(n)).random_split(dict(enumerate(weights)), seed=seed)
        parts = [list(c) for c in children]
        assert sorted(x for p in parts for x in p) == list(range(n))
        for part in parts:
            assert part == sorted(part)  # each child keeps source order

    @pytest.mark.parametrize("weights", [{"a": 7, "b": 3}, {"a": 0.7, "b": 0.3}, {"a": 0.8, "b": 0.1, "c": 0.1},
                                         {"a": 1, "b": 0}, {"a": 2, "b": 2, "c": 1}])
    def test_len_is_exact_when_weights_scale_to_whole_numbers(self, weights):
        total = 10
        for seed in range(30):
            children = IterableWrapper(range(total)).random_split(weights, seed=seed)
            assert [len(list(c)) for c in children] == [len(c) for c in children]
            assert sum(len(c) for c in children) == total

    def test_len_unknown_when_weights_do_not_scale_to_whole_numbers(self):
        a, _ = IterableWrapper(range(5)).random_split({"a": 1, "b": 1}, seed=0)
        with pytest.raises(TypeError, match="SplitterIterator\\('a'\\): Lengths of the split cannot be known in advance.*total_length=5"):
            len(a)

    def test_len_follows_the_source_at_call_time(self):
        data = list(range(10))
        a, b = IterableWrapper(data).random_split({"a": 1, "b": 1}, seed=0)
        assert len(a) == 5
        data.extend(range(10, 20))
        assert len(a) == 10 and len(list(a)) == 10

    def test_split_is_stable_across_passes_epochs_and_seeds_downstream(self):
        train, valid = IterableWrapper(range(30)).random_split({"train": 2, "valid": 1}, seed=4)
        first = list(train)
        downstream = train.shuffle().set_seed(1)
        downstream.set_epoch(3)
        assert sorted(downstream) == first  # set_seed/set_epoch do not move items between splits
        assert list(train) == first
        assert set(first).isdisjoint(valid)

    def test_override_seed_changes_every_child(self):
        train, valid = IterableWrapper(range(30)).random_split({"train": 1, "valid": 1}, seed=4)
        before = list(train)
        assert train.override_seed(99) is train
        after_train, after_valid = list(train), list(valid)
        assert after_train != before
        assert sorted(after_train + after_valid) == list(range(30))
        same = IterableWrapper(range(30)).random_split({"train": 1, "valid": 1}, seed=99, target="train")
        assert list(same) == after_train

    def test_children_iterate_at_the_same_time(self):
        src = Counted(range(20))
        a, b = IterableWrapper(src).random_split({"a": 1, "b": 1}, seed=2)
        want_a, want_b = list(a), list(b)
        ia, ib = iter(a), iter(b)
        got_a, got_b = [], []
        for x, y in zip(ia, ib):
            got_a.append(x)
            got_b.append(y)
        got_a += list(ia)
        got_b += list(ib)
        assert (got_a, got_b) == (want_a, want_b)

    def test_total_length_for_a_source_without_len(self):
        src = IterableWrapper(range(20)).filter(lambda x: x % 2 == 0)
        a, b = src.random_split({"a": 1, "b": 1}, seed=0, total_length=10)
        assert sorted(list(a) + list(b)) == list(range(0, 20, 2)) and len(a) == 5
        with pytest.raises(TypeError, match="RandomSplitter needs `total_length`.*Filter"):
            src.random_split({"a": 1, "b": 1}, seed=0)

    def test_source_longer_or_shorter_than_total_length(self):
        a, b = IterableWrapper(range(12)).random_split({"a": 1, "b": 1}, seed=0, total_length=10)
        with pytest.raises(ValueError, match="SplitterIterator\\('a'\\): the source yielded more than total_length=10"):
            list(a)
        short = IterableWrapper(range(6)).random_split({"a": 1, "b": 1}, seed=0, total_length=10)
        assert sorted(list(short[0]) + list(short[1])) == list(range(6))

    def test_empty_and_zero_weights(self):
        a, b = IterableWrapper([]).random_split({"a": 1, "b": 1}, seed=0)
        check_datapipe(a, expected=[])
        assert len(b) == 0
        keep, none = IterableWrapper(range(8)).random_split({"keep": 1, "none": 0}, seed=3)
        assert list(keep) == list(range(8)) and list(none) == [] and len(none) == 0

    def test_any_hashable_keys_and_repr(self):
        first, second = IterableWrapper(range(4)).random_split({0: 1, (1, 2): 1}, seed=0)
        assert second.target == (1, 2)
        assert repr(first) == "IterableWrapper -> SplitterIterator(0)"

    def test_pickle(self):
        a, b = IterableWrapper(range(20)).map(lambda x: x * 3).random_split({"a": 1, "b": 1}, seed=7)
        for child in (a, b):
            assert list(pickle.loads(pickle.dumps(child))) == list(child)

    def test_source_error_passes_through(self):
        err = Boom("source")

        def gen():
            yield from range(3)
            raise err

        with pytest.raises(Boom) as info:
            list(IterableWrapper(gen()).random_split({"a": 1}, seed=0, total_length=5, target="a"))
        assert info.value is err

    def test_bad_arguments(self):
        src = IterableWrapper(range(10))
        with pytest.raises(TypeError, match="RandomSplitter: source_datapipe must be an IterDataPipe, got list"):
            RandomSplitter([1], {"a": 1}, seed=0)
        with pytest.raises(TypeError, match="RandomSplitter: weights must be a dict.*got list"):
            src.random_split([0.5, 0.5], seed=0)
        with pytest.raises(ValueError, match="weights must name at least one split"):
            src.random_split({}, seed=0)
        with pytest.raises(TypeError, match="weights\\['a'\\] must be a number, got str"):
            src.random_split({"a": "1"}, seed=0)
        with pytest.raises(TypeError, match="weights\\['a'\\] must be a number, got bool"):
            src.random_split({"a": True}, seed=0)
        with pytest.raises(ValueError, match="weights\\['b'\\] must be a finite number >= 0, got -1"):
            src.random_split({"a": 1, "b": -1}, seed=0)
        with pytest.raises(ValueError, match="weights\\['a'\\] must be a finite number >= 0, got nan"):
            src.random_split({"a": float("nan")}, seed=0)
        with pytest.raises(ValueError, match="weights must not all be 0"):
            src.random_split({"a": 0, "b": 0.0}, seed=0)
        with pytest.raises(TypeError, match="RandomSplitter: seed must be an int, got NoneType"):
            src.random_split({"a": 1}, seed=None)
        with pytest.raises(TypeError):
            src.random_split({"a": 1})  # seed is required, as in torchdata
        with pytest.raises(ValueError, match="RandomSplitter: total_length must be >= 0, got -1"):
            src.random_split({"a": 1}, seed=0, total_length=-1)
        with pytest.raises(KeyError, match="RandomSplitter: `target=test` does not match any key in `weights` \\['a', 'b'\\]"):
            src.random_split({"a": 1, "b": 1}, seed=0, target="test")
        child = src.random_split({"a": 1}, seed=0, target="a")
        with pytest.raises(TypeError, match="SplitterIterator\\('a'\\): seed must be an int, got float"):
            child.override_seed(1.5)
        with pytest.raises(TypeError, match="built by RandomSplitter"):
            SplitterIterator(src, {"a": 1}, "a")


#: one small pipe per stage class and variant of this family, built over a source
STAGES = {
    "shuffle": lambda src: src.shuffle(buffer_size=4),
    "shuffle-unbatch_level": lambda src: src.batch(2).shuffle(buffer_size=4, unbatch_level=1),
    "shuffle-off": lambda src: src.shuffle().set_shuffle(False),
    "random_split-first": lambda src: src.random_split({"a": 0.5, "b": 0.5}, seed=0)[0],
    "random_split-target": lambda src: src.random_split({"a": 0.5, "b": 0.5}, seed=0, target="b"),
    "random_split-total_length": lambda src: src.random_split({"a": 3, "b": 7}, seed=1, total_length=10, target="b"),
}


class TestPassBuilding:
    """Every stage creates its source's iterator and reads its seed in ``iter()``, as part of the
    pass being built, while nothing is read before the first ``next()``."""

    @pytest.mark.parametrize("name", sorted(STAGES))
    def test_pass_is_built_at_iter(self, name):
        source = Counted(range(10))
        pipe = STAGES[name](IterableWrapper(source)).set_seed(0)
        it = iter(pipe)
        assert _pass.unbuilt(it) == [], _pass.unbuilt(it)
        assert source.pulled == 0  # built, not started
        assert list(it) == list(pipe)

    def test_item_sampler_joins_the_pass(self):
        # A sampler that iterates its data source when its iterator is created does so in the pass.
        pipe = Sampler(IterableWrapper(range(5)).map(str), IdentitySampler)
        it = iter(pipe)
        assert _pass.unbuilt(it) == [], _pass.unbuilt(it)
        assert list(it) == ["0", "1", "2", "3", "4"]

    @pytest.mark.parametrize("sampler", [SequentialSampler, RandomSampler])
    def test_index_samplers_never_iterate_the_source(self, sampler):
        source = Counted(range(6))
        assert sorted(Sampler(IterableWrapper(source), sampler)) == list(range(6))
        assert source.passes == 0  # torch's samplers read len() only

    @pytest.mark.parametrize("build", [
        lambda: IterableWrapper(range(40)).shuffle(buffer_size=8),
        lambda: Sampler(IterableWrapper(range(40)), RandomSampler),
        lambda: IterableWrapper(range(40)).batch(4).shuffle(buffer_size=8, unbatch_level=1),
    ], ids=["shuffle", "sampler", "shuffle-unbatch_level"])
    def test_interleaved_passes_keep_their_own_seeds(self, build):
        pipe = build().set_seed(0)
        epoch0, epoch1 = list(pipe.set_epoch(0)), list(pipe.set_epoch(1))
        assert epoch0 != epoch1
        a = iter(pipe.set_epoch(0))
        b = iter(pipe.set_epoch(1))  # a second pass starts before the first one is read
        assert list(a) == epoch0 and list(b) == epoch1

    def test_a_started_pass_keeps_its_split(self):
        train, valid = IterableWrapper(range(20)).random_split({"train": 0.5, "valid": 0.5}, seed=0)
        first = list(train)
        it = iter(train)
        train.override_seed(1)  # reaches the passes started from now on
        assert list(it) == first
        assert list(train) != first
