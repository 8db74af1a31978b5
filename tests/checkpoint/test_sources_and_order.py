"""Checkpoint and resume of the sources and the order stages: IterableWrapper, header, cycle,
enumerate, in_memory_cache, shuffle, Sampler, random_split and sharding_filter.

The law (docs/howto/checkpoint.rst): a pass stopped after k items and resumed from its state yields exactly
what the uninterrupted pass yields after its first k items.
"""

import asyncio
import pickle
import random
import time
from collections import deque

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import RandomSampler

from datapipes.iter import IterableWrapper, Sampler
from datapipes.testing import check_resume

from helpers import StatefulCursor, StatefulSource, resumed, saved_after

# -- sources ---------------------------------------------------------------------------------------


class Counted:
    """A re-iterable whose ``__iter__`` is a generator function; counts the items pulled."""

    def __init__(self, data):
        self.data = list(data)
        self.pulled = 0

    def __iter__(self):
        for x in self.data:
            self.pulled += 1
            yield x


class Opened:
    """A re-iterable whose ``__iter__`` is a plain function (IterableWrapper calls it at the first next())."""

    def __init__(self, data):
        self.data = list(data)

    def __iter__(self):
        return (x for x in self.data)


class Stateful:
    """A re-iterable whose iterator keeps its own state (the two-method protocol)."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return StatefulCursor(range(self.n))


class Seq:
    """An object with ``__getitem__`` (and optionally ``__len__``): counts the items read."""

    def __init__(self, n):
        self.n = n
        self.reads = 0

    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError(i)
        self.reads += 1
        return i * 10


class SizedSeq(Seq):
    def __len__(self):
        return self.n


# -- the helpers -------------------------------------------------------------------------------------


def points(n):
    return sorted({0, min(1, n), n // 2, max(n - 1, 0), n})


PLAIN = (dict, list, str, int, float, bool, type(None), bytes)


def plain(state):
    """Whether ``state`` is made of builtin containers and scalars only (items aside: ints here)."""
    if isinstance(state, dict):
        return all(isinstance(k, str) and plain(v) for k, v in state.items())
    if isinstance(state, (list, tuple)):
        return all(plain(v) for v in state)
    return isinstance(state, PLAIN)


def seeded_shuffle(src, size, seed=1):
    return src.shuffle(buffer_size=size).set_seed(seed)


# -- IterableWrapper ---------------------------------------------------------------------------------

SOURCES = {
    "list": lambda: IterableWrapper(list(range(30))),
    "tuple": lambda: IterableWrapper(tuple(range(30))),
    "range": lambda: IterableWrapper(range(5, 95, 3)),
    "huge range": lambda: IterableWrapper(range(1 << 64, (1 << 64) + 20)),
    "str": lambda: IterableWrapper("abcdefghijklmnop"),
    "non-ascii str": lambda: IterableWrapper("äbcdéfghij€"),
    "bytes": lambda: IterableWrapper(b"0123456789"),
    "dict": lambda: IterableWrapper({f"k{i}": i for i in range(12)}),
    "dict items": lambda: IterableWrapper({f"k{i}": i for i in range(12)}.items()),
    "set": lambda: IterableWrapper(set(range(0, 40, 3))),
    "deque": lambda: IterableWrapper(deque(range(15))),
    "numpy array": lambda: IterableWrapper(np.arange(12)),
    "empty list": lambda: IterableWrapper([]),
    "generator __iter__": lambda: IterableWrapper(Counted(range(25))),
    "plain __iter__": lambda: IterableWrapper(Opened(range(25))),
    "protocol iterator": lambda: IterableWrapper(Stateful(25)),
    "one-shot protocol iterator": lambda: IterableWrapper(StatefulCursor(range(25))),
    "getitem only": lambda: IterableWrapper(Seq(14)),
    "getitem and len": lambda: IterableWrapper(SizedSeq(14)),
    "deepcopy list": lambda: IterableWrapper([[i] for i in range(20)], deepcopy=True),
    "deepcopy range": lambda: IterableWrapper(range(20), deepcopy=True),
    "deepcopy custom": lambda: IterableWrapper(Counted(range(20)), deepcopy=True),
    "user source": lambda: StatefulSource(20),
}


class TestIterableWrapper:
    @pytest.mark.parametrize("name", sorted(SOURCES))
    def test_resume_equals_the_uninterrupted_pass(self, name):
        check_resume(SOURCES[name])

    @pytest.mark.parametrize("name", sorted(SOURCES))
    def test_resume_under_a_map(self, name):
        check_resume(lambda: SOURCES[name]().map(repr))

    def test_a_list_is_its_own_iterator_and_its_state_an_index(self):
        it = iter(IterableWrapper([5, 6, 7, 8]))
        assert type(it._it) is type(iter([]))  # no per-item cost: the list's own iterator
        next(it), next(it)
        assert it.state_dict()["stages"] == {"0:IterableWrapper": {"index": 2}}

    def test_a_sequence_is_moved_by_index_not_read_again(self):
        seq = SizedSeq(10)
        pipe = IterableWrapper(seq)
        it = iter(pipe)
        [next(it) for _ in range(6)]
        state = it.state_dict()
        it.close()
        seq.reads = 0
        again = iter(pipe)
        again.load_state_dict(state)
        assert list(again) == [60, 70, 80, 90]
        assert seq.reads == 4

    def test_a_custom_reiterable_is_replayed_without_yielding_again(self):
        src = Counted(range(10))
        pipe = IterableWrapper(src)
        it = iter(pipe)
        [next(it) for _ in range(6)]
        state = it.state_dict()
        it.close()
        src.pulled = 0
        again = iter(pipe)
        again.load_state_dict(state)
        assert list(again) == [6, 7, 8, 9]
        assert src.pulled == 10  # the first 6 skipped in C, the rest yielded

    def test_state_through_torch_save(self):
        check_resume(SOURCES["generator __iter__"], [9], through="torch")

    def test_one_shot_generator_names_the_stage_and_says_why(self):
        it = iter(IterableWrapper(x for x in range(5)).map(str))
        next(it)
        with pytest.raises(TypeError, match=r"IterableWrapper cannot save its position: it wraps a one-shot generator"):
            it.state_dict()
        it.close()

    def test_async_iterable_names_the_stage_and_says_why(self):
        class Agen:
            def __aiter__(self):
                return self.gen()

            async def gen(self):
                for i in range(5):
                    await asyncio.sleep(0)
                    yield i

        it = iter(IterableWrapper(Agen()))
        assert next(it) == 0
        with pytest.raises(TypeError, match=r"IterableWrapper cannot save its position: it wraps an async iterable"):
            it.state_dict()
        it.close()

    def test_load_after_the_first_item_is_refused(self):
        for name in ("list", "generator __iter__", "deepcopy list", "protocol iterator"):
            it = iter(SOURCES[name]())
            state = it.state_dict()
            next(it)
            with pytest.raises(RuntimeError, match="before the first next"):
                it.load_state_dict(state)
            it.close()

    def test_load_twice_before_the_first_item(self):
        pipe = IterableWrapper(list(range(10)))
        states = []
        for k in (7, 3):
            it = iter(pipe)
            [next(it) for _ in range(k)]
            states.append(it.state_dict())
        again = iter(pipe)
        again.load_state_dict(states[0])
        again.load_state_dict(states[1])
        assert list(again) == list(range(3, 10))

    def test_a_resumed_pass_saves_what_it_loaded(self):
        for name in ("list", "generator __iter__", "deepcopy list", "protocol iterator"):
            it = iter(SOURCES[name]())
            [next(it) for _ in range(4)]
            state = it.state_dict()
            again = iter(SOURCES[name]())
            again.load_state_dict(state)
            assert again.state_dict() == state, name


# -- header, cycle, enumerate, in_memory_cache ---------------------------------------------------------

UTIL = {
    "header": lambda: IterableWrapper(range(50)).header(17),
    "header 0": lambda: IterableWrapper(range(50)).header(0),
    "header None": lambda: IterableWrapper(range(12)).header(None),
    "header past the end": lambda: IterableWrapper(range(10)).header(100),
    "header over a filter": lambda: IterableWrapper(Counted(range(60))).filter(lambda x: x % 3 != 0).header(20),
    "header twice": lambda: IterableWrapper(range(60)).header(30).map(lambda x: x * 2).header(11),
    "cycle 3": lambda: IterableWrapper(range(7)).cycle(3),
    "cycle 0": lambda: IterableWrapper(range(7)).cycle(0),
    "cycle 1": lambda: IterableWrapper(range(7)).cycle(1),
    "cycle forever": lambda: IterableWrapper(range(4)).cycle().header(19),
    "cycle empty forever": lambda: IterableWrapper([]).cycle(),
    "cycle of a user source": lambda: StatefulSource(5).cycle(4),
    "cycle of a filter": lambda: IterableWrapper(Counted(range(9))).filter(lambda x: x % 2 == 1).cycle(3),
    "cycle of a shuffle": lambda: seeded_shuffle(IterableWrapper(range(8)), 3).cycle(3),
    "cycle of a cycle": lambda: IterableWrapper(range(3)).cycle(2).cycle(3),
    "enumerate": lambda: IterableWrapper("abcdefghij").enumerate(),
    "enumerate from 5": lambda: IterableWrapper(Counted("abcdefghij")).enumerate(starting_index=5),
    "enumerate of a cycle": lambda: IterableWrapper("abc").cycle(3).enumerate(),
    "in_memory_cache": lambda: IterableWrapper(range(15)).map(lambda x: x * x).in_memory_cache(),
    "in_memory_cache bounded": lambda: IterableWrapper(range(15)).in_memory_cache(size=1),
    "in_memory_cache over budget": lambda: IterableWrapper(range(15)).in_memory_cache(size=0.0002),
    "cycle of in_memory_cache": lambda: IterableWrapper(Counted(range(6))).in_memory_cache().cycle(3),
    "cycle of in_memory_cache over budget": lambda: IterableWrapper(range(6)).in_memory_cache(size=0.0001).cycle(3),
}


class TestUtilStages:
    @pytest.mark.parametrize("name", sorted(UTIL))
    def test_resume_equals_the_uninterrupted_pass(self, name):
        check_resume(UTIL[name])

    @pytest.mark.parametrize("name", ["cycle of a shuffle", "cycle forever", "cycle of in_memory_cache",
                                      "in_memory_cache over budget"])
    def test_every_k(self, name):
        check_resume(UTIL[name], lambda n: range(n + 1))

    def test_header_does_not_read_past_its_limit_when_resumed(self):
        src = Counted(range(100))
        pipe = IterableWrapper(src).header(5)
        it = iter(pipe)
        [next(it) for _ in range(5)]
        state = it.state_dict()
        it.close()
        src.pulled = 0
        again = iter(pipe)
        again.load_state_dict(state)
        assert list(again) == [] and src.pulled == 0  # at its limit: the source is not even opened

    def test_states_are_small_plain_data(self):
        for name, build in UTIL.items():
            it = iter(build())
            next(it, None)
            state = it.state_dict()
            assert plain(state), name
            assert len(pickle.dumps(state)) < 5000, name  # a shuffle's generator: 625 ints

    @pytest.mark.parametrize("name", ["header", "cycle 3", "enumerate", "in_memory_cache"])
    def test_load_after_the_first_item_is_refused(self, name):
        it = iter(UTIL[name]())
        state = it.state_dict()
        next(it)
        with pytest.raises(RuntimeError, match="before the first next"):
            it.load_state_dict(state)
        it.close()


class TestInMemoryCache:
    def build(self):
        return IterableWrapper(range(12)).map(lambda x: x + 100).in_memory_cache()

    def test_a_cached_pass_resumes_in_the_cache(self):
        pipe = self.build()
        full = list(pipe)
        assert pipe._cache == full
        for k in points(len(full)):
            it = iter(pipe)
            head = [next(it) for _ in range(k)]
            state = pickle.loads(pickle.dumps(it.state_dict()))
            assert state["stages"]["0:InMemoryCacheHolder"]["cached"]
            again = iter(pipe)
            again.load_state_dict(state)
            assert head + list(again) == full, k

    def test_a_cached_pass_resumed_in_a_new_process_replays_and_fills_the_cache(self):
        pipe = self.build()
        full = list(pipe)
        it = iter(pipe)
        [next(it) for _ in range(5)]
        state = pickle.loads(pickle.dumps(it.state_dict()))
        fresh = self.build()  # as rebuilt in another process: no cache
        again = iter(fresh)
        again.load_state_dict(state)
        assert list(again) == full[5:]
        assert fresh._cache == full

    def test_a_filling_pass_resumed_streams_without_filling(self):
        it = iter(self.build())
        [next(it) for _ in range(5)]
        state = it.state_dict()
        fresh = self.build()
        again = iter(fresh)
        again.load_state_dict(state)
        assert list(again) == [x + 100 for x in range(5, 12)]
        assert fresh._cache is None  # its first items were yielded by the saved pass
        assert list(fresh) == [x + 100 for x in range(12)] and fresh._cache is not None

    def test_a_filling_pass_resumed_where_the_cache_is_filled_reads_it(self):
        pipe = self.build()
        it = iter(pipe)
        [next(it) for _ in range(5)]
        state = it.state_dict()
        it.close()
        list(pipe)  # another pass filled the cache meanwhile
        again = iter(pipe)
        again.load_state_dict(state)
        assert list(again) == [x + 100 for x in range(5, 12)]


# -- shuffle, Sampler, random_split -------------------------------------------------------------------

ORDER = {
    "shuffle": lambda: seeded_shuffle(IterableWrapper(range(40)), 7),
    "shuffle buffer 1": lambda: seeded_shuffle(IterableWrapper(range(20)), 1),
    "shuffle buffer over the source": lambda: seeded_shuffle(IterableWrapper(range(20)), 50),
    "shuffle buffer the source": lambda: seeded_shuffle(IterableWrapper(range(20)), 20),
    "shuffle empty": lambda: seeded_shuffle(IterableWrapper([]), 5),
    "shuffle off": lambda: IterableWrapper(range(20)).shuffle(buffer_size=5).set_shuffle(False),
    "shuffle of a user source": lambda: seeded_shuffle(StatefulSource(30), 6),
    "shuffle of a generator source": lambda: seeded_shuffle(IterableWrapper(Counted(range(30))), 4),
    "shuffle twice": lambda: seeded_shuffle(seeded_shuffle(IterableWrapper(range(30)), 4, 2), 5, 3),
    "shuffle unbatch": lambda: IterableWrapper([[1, 2], [3, 4], [5, 6, 7]]).shuffle(buffer_size=3, unbatch_level=1).set_seed(4),
    "sampler sequential": lambda: Sampler(IterableWrapper(range(20))),
    "sampler random": lambda: Sampler(IterableWrapper(range(30)), sampler=RandomSampler).set_seed(2),
    "sampler random with replacement": lambda: Sampler(
        IterableWrapper(range(30)), sampler=RandomSampler, sampler_kwargs={"replacement": True, "num_samples": 70}
    ).set_seed(2),
    "sampler own generator": lambda: Sampler(
        IterableWrapper(range(30)), sampler=RandomSampler, sampler_kwargs={"generator": torch.Generator().manual_seed(7)}
    ),
    "random_split train": lambda: IterableWrapper(range(40)).random_split({"train": 0.7, "valid": 0.3}, seed=5, target="train"),
    "random_split valid": lambda: IterableWrapper(range(40)).random_split({"train": 0.7, "valid": 0.3}, seed=5, target="valid"),
    "random_split inexact": lambda: IterableWrapper(range(41)).random_split({"a": 1, "b": 1, "c": 1}, seed=1, target="b"),
    "random_split total_length": lambda: IterableWrapper(Counted(range(25))).random_split(
        {"a": 2, "b": 3}, seed=9, total_length=25, target="a"),
}


class TestOrderStages:
    @pytest.mark.parametrize("name", sorted(ORDER))
    def test_resume_equals_the_uninterrupted_pass(self, name):
        check_resume(ORDER[name])

    def test_every_k_of_a_shuffle(self):
        check_resume(ORDER["shuffle"], lambda n: range(0, n + 1, 2))
        check_resume(ORDER["shuffle"], lambda n: range(1, n + 1, 2), through="torch")

    def test_state_through_torch_save(self):
        for name in ("shuffle", "sampler random", "sampler own generator", "random_split train"):
            check_resume(ORDER[name], [6], through="torch")

    @pytest.mark.parametrize("build", [
        lambda: IterableWrapper(range(40)).shuffle(buffer_size=6),
        lambda: IterableWrapper(range(40)).shuffle(buffer_size=100),
        lambda: Sampler(IterableWrapper(range(40)), sampler=RandomSampler),
        lambda: IterableWrapper(range(40)).shuffle(buffer_size=6).shuffle(buffer_size=3),
    ], ids=["shuffle", "shuffle drain", "sampler", "shuffle twice"])
    def test_unseeded_pass_resumed_goes_on_with_its_own_order(self, build):
        for k in (0, 1, 17, 39, 40):
            it = iter(build())
            head = [next(it) for _ in range(k)]
            state = pickle.loads(pickle.dumps(it.state_dict()))
            own = list(it)  # what the uninterrupted pass yields after its first k items
            again = iter(build())  # draws another seed ...
            again.load_state_dict(state)  # ... replaced by the saved pass's generator
            assert list(again) == own, k
            assert sorted(head + own) == list(range(40))

    def test_shuffle_state_holds_the_buffer_and_the_generator(self):
        it = iter(seeded_shuffle(IterableWrapper(range(40)).map(abs), 7))  # a buffer of items it cannot recompute
        [next(it) for _ in range(10)]
        state = it.state_dict()["stages"]["0:Shuffler"]
        assert state["phase"] == "swap" and len(state["buffer"]) == 7
        assert len(state["rng"][1]) == 625
        assert plain(state)

    @pytest.mark.parametrize("kind", [list, tuple, range])
    def test_shuffle_over_a_sequence_saves_positions_not_items(self, kind):
        def build():
            return IterableWrapper(kind(range(200)) if kind is not range else range(200)).shuffle(buffer_size=50).set_seed(2)

        it = iter(build())
        [next(it) for _ in range(30)]
        state = it.state_dict()["stages"]["0:Shuffler"]
        assert state == {"phase": "swap", "read": 80, "rng": state["rng"]} and len(state["rng"][1]) == 625
        for _ in range(160):
            next(it)
        state = it.state_dict()["stages"]["0:Shuffler"]
        assert state["phase"] == "drain" and state["read"] == 200 and state["left"] == 10 and "buffer" not in state
        check_resume(build, lambda n: range(0, n + 1, 7))

    def test_a_state_of_positions_needs_a_sequence_source(self):
        it = iter(IterableWrapper(list(range(20))).shuffle(buffer_size=5).set_seed(2))
        next(it)
        state = it.state_dict()
        other = iter(IterableWrapper(list(range(20))).map(abs).shuffle(buffer_size=5).set_seed(2))
        with pytest.raises(ValueError, match="another shape"):
            other.load_state_dict(state)

    def test_sampler_own_generator_resumes_a_later_pass(self):
        build = ORDER["sampler own generator"]
        pipe = build()
        first = list(pipe)
        second = list(pipe)  # its generator has moved on: a new order
        assert second != first
        pipe = build()
        list(pipe)
        it = iter(pipe)  # the second pass
        head = [next(it) for _ in range(11)]
        state = pickle.loads(pickle.dumps(it.state_dict()))
        fresh = build()  # its generator at the start of its first pass
        again = iter(fresh)
        again.load_state_dict(state)
        assert head + list(again) == second

    def test_sampler_with_a_generator_it_cannot_read_names_the_stage(self):
        class NumpySampler:
            def __init__(self, data_source):
                self.n = len(data_source)
                self.generator = np.random.default_rng(0)

            def __iter__(self):
                return iter(self.generator.permutation(self.n).tolist())

            def __len__(self):
                return self.n

        it = iter(Sampler(IterableWrapper(range(5)), sampler=NumpySampler))
        next(it)
        with pytest.raises(TypeError, match=r"Sampler cannot save its position: its sampler draws from a Generator"):
            it.state_dict()

    @pytest.mark.parametrize("name", ["shuffle", "sampler random", "random_split train"])
    def test_load_after_the_first_item_is_refused(self, name):
        it = iter(ORDER[name]())
        state = it.state_dict()
        next(it)
        with pytest.raises(RuntimeError, match="before the first next"):
            it.load_state_dict(state)
        it.close()

    def test_random_split_children_resumed_still_partition_the_source(self):
        def child(target):
            return lambda: IterableWrapper(range(50)).random_split({"a": 3, "b": 2}, seed=4, target=target)

        a = check_resume(child("a"), [13])
        b = check_resume(child("b"), [7])
        assert sorted(a + b) == list(range(50))


# -- sharding_filter -----------------------------------------------------------------------------------


def sharded(num, instance, upstream=None):
    def build():
        src = upstream() if upstream else IterableWrapper(range(23))
        pipe = src.sharding_filter()
        pipe.apply_sharding(num, instance)
        return pipe.map(lambda x: x)

    return build


class TestShardingFilter:
    @pytest.mark.parametrize("num", [1, 2, 3, 5, 30])
    def test_resume_equals_the_uninterrupted_pass_for_every_shard(self, num):
        for instance in range(min(num, 6)):
            full = check_resume(sharded(num, instance))
            assert full == list(range(23))[instance::num]

    def test_every_k_over_a_filter_and_a_shuffle(self):
        def upstream():
            return seeded_shuffle(IterableWrapper(Counted(range(40))).filter(lambda x: x % 5 != 0), 6)

        for instance in range(3):
            check_resume(sharded(3, instance, upstream), lambda n: range(n + 1))

    def test_another_shard_is_refused(self):
        it = iter(sharded(3, 1)())
        next(it)
        state = it.state_dict()
        other = iter(sharded(3, 2)())
        with pytest.raises(ValueError, match=r"saved reading shard 1 of 3, this pass reads shard 2 of 3"):
            other.load_state_dict(state)

    def test_load_after_the_first_item_is_refused(self):
        it = iter(sharded(3, 1)())
        state = it.state_dict()
        next(it)
        with pytest.raises(RuntimeError, match="before the first next"):
            it.load_state_dict(state)


# -- every stage: a resumed pass saved and resumed again ------------------------------------------------

ALL = {**SOURCES, **UTIL, **ORDER}


@pytest.mark.parametrize("name", sorted(ALL))
def test_a_resumed_pass_resumed_again(name):
    build = ALL[name]
    full = list(build())
    n = len(full)
    for k1, k2 in sorted({(0, 0), (n // 3, n // 3), (min(1, n), max(n - 1, 0)), (n // 2, 0), (n, 0)}):
        head, state = saved_after(iter(build()), k1)
        more, state = saved_after(resumed(build(), state), k2)
        assert head + more + list(resumed(build(), state)) == full, (k1, k2)


# -- with the concurrent stages ------------------------------------------------------------------------


def jitter(x):
    time.sleep(random.random() * 0.0005)
    return x


class TestWithConcurrentStages:
    @pytest.mark.parametrize("build", [
        lambda: seeded_shuffle(IterableWrapper(Counted(range(50))), 5).map(jitter, concurrency=3).enumerate(),
        lambda: IterableWrapper(range(50)).prefetch(4).header(40).shuffle(buffer_size=6).set_seed(3),
        lambda: sharded(2, 1, lambda: seeded_shuffle(IterableWrapper(range(60)), 8).prefetch(3))().cycle(2).prefetch(2),
    ], ids=["shuffle-cmap-enumerate", "prefetch-header-shuffle", "shuffle-prefetch-shard-cycle-prefetch"])
    def test_resume_equals_the_uninterrupted_pass(self, build):
        check_resume(build)


# -- compositions (hypothesis) --------------------------------------------------------------------------

STAGES = ["header", "cycle", "enumerate", "shuffle", "shard", "cache", "split", "map", "filter"]


def _compose(source, n, stages):
    if source == "user":
        pipe = StatefulSource(n)
    elif source == "list":
        pipe = IterableWrapper(list(range(n)))
    elif source == "generator":
        pipe = IterableWrapper(Counted(range(n)))
    else:
        pipe = Sampler(IterableWrapper(range(max(n, 1))), sampler=RandomSampler).set_seed(n)
    for i, (stage, arg) in enumerate(stages):
        if stage == "header":
            pipe = pipe.header(arg * 3)
        elif stage == "cycle":
            pipe = pipe.cycle(arg % 3 + 1)
        elif stage == "enumerate":
            pipe = pipe.enumerate(starting_index=arg)
        elif stage == "shuffle":
            pipe = seeded_shuffle(pipe, arg + 1, seed=i)
        elif stage == "shard":
            pipe = pipe.sharding_filter()
            pipe.apply_sharding(arg % 3 + 1, arg % (arg % 3 + 1))
        elif stage == "cache":
            pipe = pipe.in_memory_cache(size=None if arg % 2 else 0.0003)
        elif stage == "split":
            pipe = pipe.random_split({"a": 1, "b": 1}, seed=arg, total_length=10**6, target="ab"[arg % 2])
        elif stage == "map":
            pipe = pipe.map(repr)
        else:
            pipe = pipe.filter(lambda x: hash(repr(x)) % 4 != 1)
    return pipe


def _valid(stages):
    # one sharding stage per path (apply_sharding refuses two)
    return sum(s == "shard" for s, _ in stages) <= 1


@given(
    source=st.sampled_from(["user", "list", "generator", "sampler"]),
    n=st.integers(0, 25),
    stages=st.lists(st.tuples(st.sampled_from(STAGES), st.integers(0, 8)), max_size=4).filter(_valid),
    k=st.integers(0, 60),
)
def test_law_resume_equals_the_uninterrupted_run(source, n, stages, k):
    def build():
        return _compose(source, n, stages)

    check_resume(build, lambda n: [min(k, n)])
