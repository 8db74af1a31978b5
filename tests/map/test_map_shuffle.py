"""The map-style shuffle's order: a seeded bijection of the positions (datapipes/map/_bijection.py),
computed a block at a time in constant memory, and its exact resume (serial at every item, with
``indices=``, unseeded, and under the DataLoader with another number of workers)."""

import pickle
import random
import tracemalloc
from collections import Counter

import numpy as np
import pytest
import torch

from datapipes import DataLoader, MapDataPipe
from datapipes.iter import IterableWrapper
from datapipes.map import SequenceWrapper, Shuffler
from datapipes.map._bijection import BLOCK, MAX_LENGTH, Permutation
from datapipes.testing import check_resume

from helpers import plain_process  # noqa: F401 - an autouse fixture: no RANK/WORLD_SIZE from the environment

LENGTHS = [0, 1, 2, 3, 5, 7, 64, 65, 1000, 4097, 2**16 + 1] + [random.Random(i).randrange(2, 10**6) for i in range(3)]


class Virtual(MapDataPipe):
    """``n`` items, each its own index, held nowhere."""

    def __init__(self, n):
        self.n = n

    def __getitem__(self, index):
        return index

    def __len__(self):
        return self.n


def state_of(it):
    return it.state_dict()["stages"]["0:Shuffler"]


# -- the bijection ---------------------------------------------------------------------------------


class TestPermutation:
    @pytest.mark.parametrize("n", LENGTHS)
    def test_a_permutation_for_every_length(self, n):
        order = Permutation(n, seed=n)
        values = order.block(0, n).tolist()
        assert sorted(values) == list(range(n))

    @pytest.mark.parametrize("n", [1, 2, 3, 10, 4097, 2 * BLOCK + 3, 10**6 + 7])
    def test_blocks_equal_the_scalar_at(self, n):
        order = Permutation(n, seed=11)
        whole = order.block(0, n).tolist()
        positions = range(n) if n <= 10_000 else random.Random(0).sample(range(n), 2000)
        assert all(order.at(p) == whole[p] for p in positions)
        blocks = list(order.blocks())
        assert [b.size for b in blocks[:-1]] == [BLOCK] * (len(blocks) - 1) and np.concatenate(blocks).tolist() == whole
        for start in {0, 1, n // 2, n - 1, n}:  # from any position, as a resumed pass starts
            assert np.concatenate([*order.blocks(start), np.empty(0, np.uint64)]).tolist() == whole[start:]

    def test_seeds_give_other_orders_and_the_same_seed_the_same(self):
        a = Permutation(1000, 1).block(0, 1000).tolist()
        assert Permutation(1000, 1).block(0, 1000).tolist() == a
        assert Permutation(1000, 2).block(0, 1000).tolist() != a
        assert Permutation(1000, 1 + 2**64).block(0, 1000).tolist() == a  # a seed is taken modulo 2**64
        assert a != list(range(1000))

    def test_up_to_2_62(self):
        order = Permutation(MAX_LENGTH, 5)
        first = order.block(0, 3).tolist()
        assert first == [order.at(0), order.at(1), order.at(2)] and all(0 <= x < MAX_LENGTH for x in first)
        assert 0 <= order.at(MAX_LENGTH - 1) < MAX_LENGTH
        with pytest.raises(ValueError, match=r"0 to 2\*\*62 \(4611686018427387904\) positions, got 4611686018427387905"):
            Permutation(MAX_LENGTH + 1, 0)
        with pytest.raises(ValueError, match="got -1"):
            Permutation(-1, 0)
        with pytest.raises(IndexError):
            Permutation(5, 0).at(5)
        with pytest.raises(IndexError):
            Permutation(5, 0).at(-1)

    def test_where_an_item_lands_is_close_to_uniform(self):
        # Where item 0 lands among 10 over 2000 seeds: chi-square with 9 degrees of freedom, whose
        # 99.99th percentile is 33.7 (the seeds are fixed: the figure is the same at every run).
        n, seeds = 10, 2000
        counts = Counter(Permutation(n, s).block(0, n).tolist().index(0) for s in range(seeds))
        expected = seeds / n
        chi2 = sum((counts[p] - expected) ** 2 / expected for p in range(n))
        assert chi2 < 33.7, (chi2, counts)
        # and over 6 rounds (n > 256): the item at position 0 of 5000, in 10 bins
        n = 5000
        bins = Counter(Permutation(n, s).at(0) * 10 // n for s in range(seeds))
        expected = seeds / 10
        chi2 = sum((bins[b] - expected) ** 2 / expected for b in range(10))
        assert chi2 < 33.7, (chi2, bins)


# -- the pipe --------------------------------------------------------------------------------------


class TestShuffler:
    def test_seeds_and_epochs(self):
        def make():
            return SequenceWrapper(range(100)).shuffle()

        a = list(make().set_seed(1))
        assert a == list(make().set_seed(1)) and sorted(a) == list(range(100)) and a != list(range(100))
        assert list(make().set_seed(2)) != a
        pipe = make().set_seed(1)
        assert list(pipe.set_epoch(1)) != a and list(pipe.set_epoch(0)) == a

    def test_a_billion_virtual_indices_in_constant_memory(self):
        pipe = Shuffler(Virtual(10**9)).set_seed(0)
        it = iter(pipe)
        next(it)  # imports and first-use caches, once per process
        del it
        tracemalloc.start()
        try:
            it = iter(pipe)
            first = [next(it) for _ in range(10)]
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, peak
        state = state_of(it)
        assert state["position"] == 10 and state["length"] == 10**9
        order = Permutation(10**9, state["seed"])
        assert first == [order.at(p) for p in range(10)]
        again = iter(Shuffler(Virtual(10**9)).set_seed(0))
        again.load_state_dict(it.state_dict())
        assert next(again) == order.at(10)

    def test_more_than_2_62_indices_is_refused(self):
        with pytest.raises(ValueError, match=r"Shuffler: at most 2\*\*62 \(4611686018427387904\) indices"):
            iter(Shuffler(Virtual(MAX_LENGTH + 1)))

    def test_the_order_is_the_bijection_of_the_pass_seed(self):
        it = iter(SequenceWrapper(range(5000)).shuffle().set_seed(4))
        got = list(it)
        assert got == Permutation(5000, state_of(it)["seed"]).block(0, 5000).tolist()

    def test_indices_map_the_permuted_positions(self):
        keys = ["k%d" % i for i in range(50)]
        pipe = SequenceWrapper({k: k.upper() for k in keys}).shuffle(indices=keys).set_seed(3)
        it = iter(pipe)
        got = list(it)
        order = Permutation(50, state_of(it)["seed"]).block(0, 50).tolist()
        assert got == [keys[p].upper() for p in order]
        subset = SequenceWrapper(range(100)).shuffle(indices=range(1, 100, 3)).set_seed(3)
        assert sorted(subset) == list(range(1, 100, 3))


# -- resume ----------------------------------------------------------------------------------------


def every(n):
    return range(n + 1)


class TestResume:
    @pytest.mark.parametrize("n", [0, 1, 2, 7, 40])
    def test_at_every_item_seeded(self, n):
        full = check_resume(lambda: SequenceWrapper(range(n)).shuffle().set_seed(n), ks=every)
        assert sorted(full) == list(range(n))

    def test_across_block_boundaries(self):
        n = 2 * BLOCK + 5
        ks = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, 2 * BLOCK + 1, n - 1, n]
        check_resume(lambda: SequenceWrapper(range(n)).shuffle().set_seed(1), ks=ks, through="torch")

    def test_unseeded_resumes_to_the_order_of_the_pass_it_resumes(self):
        pipe = SequenceWrapper(range(30)).shuffle()
        torch.manual_seed(0)
        full = list(pipe)
        for k in every(30):
            torch.manual_seed(0)
            it = iter(pipe)
            head = [next(it) for _ in range(k)]
            state = pickle.loads(pickle.dumps(it.state_dict()))
            torch.manual_seed(1000 + k)  # the resumed pass draws another seed, and takes the saved one
            again = iter(pipe)
            again.load_state_dict(state)
            assert head + list(again) == full, k

    def test_with_indices(self):
        keys = ["k%d" % i for i in range(25)]
        check_resume(lambda: SequenceWrapper({k: i for i, k in enumerate(keys)}).shuffle(indices=keys).set_seed(2),
                     ks=every)
        check_resume(lambda: SequenceWrapper(range(60)).shuffle(indices=range(0, 60, 3)).set_seed(2), ks=every)

    def test_a_keyed_pipe_above_saves_nothing(self):
        def build():
            keyed = IterableWrapper([(c, i) for i, c in enumerate("abcdefghij")]).to_map_datapipe()
            return keyed.shuffle(indices=list("jihgfedcba")).set_seed(5)

        check_resume(build, ks=every)
        it = iter(build())
        next(it)
        assert list(it.state_dict()["stages"]) == ["0:Shuffler"]

    def test_with_shuffling_off(self):
        assert check_resume(lambda: SequenceWrapper(range(12)).shuffle().set_shuffle(False), ks=every) == list(range(12))

    def test_stages_around_it(self):
        check_resume(lambda: SequenceWrapper(range(40)).map(lambda x: x * 2).shuffle().map(str).batch(3).set_seed(6),
                     ks=every)

    def test_a_resumed_pass_saves_and_resumes_again(self):
        def build():
            return SequenceWrapper(range(50)).shuffle().set_seed(8)

        full = list(build())
        it = iter(build())
        head = [next(it) for _ in range(7)]
        again = iter(build())
        again.load_state_dict(it.state_dict())
        assert state_of(again)["position"] == 7  # before its first next(): the state it was given
        middle = [next(again) for _ in range(20)]
        third = iter(build())
        third.load_state_dict(again.state_dict())
        assert head + middle + list(third) == full

    def test_the_state_is_three_ints(self):
        it = iter(SequenceWrapper(range(10)).shuffle().set_seed(0))
        assert state_of(it)["position"] == 0
        next(it)
        state = state_of(it)
        assert set(state) == {"position", "seed", "length"} and state["position"] == 1 and state["length"] == 10
        assert type(state["seed"]) is int and 0 <= state["seed"] < 2**64
        list(it)
        assert state_of(it)["position"] == 10
        off = iter(SequenceWrapper(range(10)).shuffle().set_shuffle(False))
        next(off)
        assert state_of(off) == {"position": 1, "seed": None, "length": 10}


HOSTILE = [
    ("position", -1, r"state\['position'\] must be an int from 0 to 10, got -1"),
    ("position", 11, r"state\['position'\] must be an int from 0 to 10, got 11"),
    ("position", "3", r"state\['position'\] must be an int from 0 to 10, got '3'"),
    ("position", True, r"state\['position'\] must be an int from 0 to 10, got True"),
    ("seed", -1, r"state\['seed'\] must be an int from 0 to 18446744073709551615, got -1"),
    ("seed", 2**64, r"state\['seed'\] must be an int from 0 to 18446744073709551615, got 18446744073709551616"),
    ("seed", 1.5, r"state\['seed'\] must be an int from 0 to 18446744073709551615, got 1.5"),
    ("seed", None, r"state\['seed'\] is None: the state was saved by a pass with shuffling off"),
    ("length", 11, r"state\['length'\] is 11: the state was saved by a pass over 11 indices, and this pass has 10"),
    ("length", -2, r"state\['length'\] must be an int from 0 to 4611686018427387904, got -2"),
    ("length", [10], r"state\['length'\] must be an int from 0 to 4611686018427387904, got \[10\]"),
]


class TestHostileStates:
    @staticmethod
    def saved():
        it = iter(SequenceWrapper(range(10)).shuffle().set_seed(0))
        next(it)
        return it.state_dict()

    @pytest.mark.parametrize("key, value, message", HOSTILE, ids=[f"{k}={v!r}" for k, v, _ in HOSTILE])
    def test_refused_naming_the_field(self, key, value, message):
        state = self.saved()
        state["stages"]["0:Shuffler"][key] = value
        it = iter(SequenceWrapper(range(10)).shuffle().set_seed(0))
        with pytest.raises(ValueError, match=r"load_state_dict: Shuffler \(state\['stages'\]\['0:Shuffler'\]\): " + message):
            it.load_state_dict(state)

    def test_a_missing_field_or_another_shape(self):
        state = self.saved()
        del state["stages"]["0:Shuffler"]["seed"]
        with pytest.raises(ValueError, match="the state has no 'seed'"):
            iter(SequenceWrapper(range(10)).shuffle()).load_state_dict(state)
        state["stages"]["0:Shuffler"] = [1, 2]
        with pytest.raises(ValueError, match="the state must be a dict, got list"):
            iter(SequenceWrapper(range(10)).shuffle()).load_state_dict(state)

    def test_a_shuffled_state_into_a_pipe_with_shuffling_off(self):
        with pytest.raises(ValueError, match=r"state\['seed'\] must be None: this pipe's shuffle is off"):
            iter(SequenceWrapper(range(10)).shuffle().set_shuffle(False)).load_state_dict(self.saved())

    def test_after_the_first_item(self):
        it = iter(SequenceWrapper(range(10)).shuffle().set_seed(0))
        next(it)
        with pytest.raises(RuntimeError, match="already started"):
            it.load_state_dict(self.saved())


# -- the DataLoader --------------------------------------------------------------------------------

N_LOADED = 120


def sharded():
    return SequenceWrapper(range(N_LOADED)).shuffle().sharding_filter()


def loader(workers):
    kw = {"multiprocessing_context": "fork"} if workers else {}
    return DataLoader(sharded(), batch_size=7, seed=5, num_workers=workers, collate_fn=list, **kw)


def stop_after(dl, k):
    it = iter(dl)
    head = [next(it) for _ in range(k)]
    state = pickle.loads(pickle.dumps(dl.state_dict()))
    it.close()
    return head, state


def flat(batches):
    return [x for b in batches for x in b]


class TestLoader:
    @pytest.mark.parametrize("workers", [0, 2])
    def test_resumes_exactly_with_the_same_workers(self, workers):
        full = list(loader(workers))
        assert sorted(flat(full)) == list(range(N_LOADED)) and flat(full) != list(range(N_LOADED))
        for k in (0, 3, len(full)):
            head, state = stop_after(loader(workers), k)
            again = loader(workers)
            again.load_state_dict(state)
            assert head + list(again) == full, k

    @pytest.mark.parametrize("before, after, k", [(2, 0, 5), (0, 2, 4), (2, 1, 3)])
    def test_resumes_with_another_number_of_workers(self, before, after, k):
        head, state = stop_after(loader(before), k)
        again = loader(after)
        again.load_state_dict(state)
        got = flat(head) + flat(again)
        assert sorted(got) == list(range(N_LOADED)), Counter(got).most_common(3)
