"""IterableWrapper, Header [header], Cycler [cycle], Enumerator [enumerate],
InMemoryCacheHolder [in_memory_cache]."""

import copy
import gc
import pickle
import threading
import types
from collections import deque

import numpy as np
import pytest

from datapipes._runtime import passes as _pass
from datapipes.iter import Cycler, Enumerator, Header, InMemoryCacheHolder, IterableWrapper, IterDataPipe
from datapipes.testing import check_datapipe


class Counted:
    """A re-iterable source that counts its passes and the items pulled from it."""

    def __init__(self, data):
        self.data = list(data)
        self.passes = 0
        self.pulled = 0
        self.closed = 0

    def __iter__(self):
        self.passes += 1
        try:
            for x in self.data:
                self.pulled += 1
                yield x
        finally:
            self.closed += 1

    def __len__(self):
        return len(self.data)


class Failing:
    """A re-iterable source that yields ``data`` then raises ``error`` (on every pass)."""

    def __init__(self, data, error):
        self.data, self.error = list(data), error

    def __iter__(self):
        yield from self.data
        raise self.error


class Boom(Exception):
    pass


class TestIterableWrapper:
    def test_list_range_tuple_str(self):
        assert check_datapipe(IterableWrapper([3, 1, 2]), expected=[3, 1, 2]) == [3, 1, 2]
        check_datapipe(IterableWrapper(range(5)), expected=range(5))
        check_datapipe(IterableWrapper((1, None)), expected=[1, None])
        check_datapipe(IterableWrapper("ab"), expected=["a", "b"])

    def test_len(self):
        assert len(IterableWrapper([1, 2, 3])) == 3 and len(IterableWrapper(range(10))) == 10
        data = [1]
        pipe = IterableWrapper(data)
        data.append(2)
        assert len(pipe) == 2  # at call time

    def test_len_unknown_names_the_stage(self):
        with pytest.raises(TypeError, match="^IterableWrapper: its source, a generator, has no length, so IterableWrapper instance"):
            len(IterableWrapper(x for x in range(3)))

    def test_reiteration_gives_independent_passes(self):
        pipe = IterableWrapper(range(5))
        a, b = iter(pipe), iter(pipe)
        assert next(a) == 0 and next(a) == 1 and next(b) == 0
        assert list(a) == [2, 3, 4] and list(b) == [1, 2, 3, 4]

    def test_generator_is_one_shot(self):
        pipe = IterableWrapper(x * 2 for x in range(3))
        assert list(pipe) == [0, 2, 4]
        with pytest.raises(RuntimeError, match="one-shot generator was already iterated"):
            iter(pipe)

    def test_sequence_protocol_object(self):
        class Seq:
            def __getitem__(self, i):
                if i >= 3:
                    raise IndexError(i)
                return i * 10

        assert list(IterableWrapper(Seq())) == [0, 10, 20]

    def test_deepcopy_by_default_isolates_passes(self):
        def mutate(item):
            item.append("seen")
            return item

        copied = IterableWrapper([[1], [2]]).map(mutate)  # deepcopy=True, as torch's default
        assert list(copied) == [[1, "seen"], [2, "seen"]]
        assert list(copied) == [[1, "seen"], [2, "seen"]]
        assert copied.datapipe.iterable == [[1], [2]]
        plain = IterableWrapper([[1], [2]], deepcopy=False).map(mutate)
        list(plain)
        assert list(plain) == [[1, "seen", "seen"], [2, "seen", "seen"]]  # the same objects again

    @pytest.mark.parametrize("source", [
        [{"a": 1}, {"a": 2}],                  # a list of dicts
        ({"a": 1}, {"a": 2}),                  # a tuple
        {0: None, 1: None},                    # keys of a dict: immutable, nothing to copy
        deque([{"a": 1}, {"a": 2}]),           # another sequence
        [1, "x", {"a": 2}],                    # mostly immutable items, one dict
    ])
    def test_deepcopy_copies_what_could_change(self, source):
        pipe = IterableWrapper(source)
        items = list(pipe)
        for got, original in zip(items, source):
            assert got == original
            assert (got is original) == (not isinstance(original, dict))
        for item in items:  # mutating what a pass yielded leaves the source alone
            if isinstance(item, dict):
                item["a"] = "changed"
        assert list(pipe) == list(source)

    def test_deepcopy_costs_nothing_for_immutable_sources(self):
        items = [1, 2.5, "s", b"b", None, True, np.int64(3), np.float32(1.5)]
        for source in (items, tuple(items), range(5), "abc", b"xy"):
            pipe = IterableWrapper(source)
            it = iter(pipe)
            assert type(it) is not types.GeneratorType  # the sequence's own iterator: no copying stage
            assert list(it) == list(source)

    def test_deepcopy_of_an_uncopyable_item_warns_once_per_pass_and_yields_it(self):
        lock = threading.Lock()
        other = threading.Lock()
        pipe = IterableWrapper([lock, {"a": 1}, other])
        with pytest.warns(UserWarning, match=r"IterableWrapper.*type lock cannot be deep-copied.*"
                                              r"The input iterable can not be deepcopied") as record:
            items = list(pipe)
        assert items[0] is lock and items[2] is other and items[1] == {"a": 1}
        assert len([w for w in record if "deep-copied" in str(w.message)]) == 1

    def test_deepcopy_keeps_resume_exact(self):
        source = [{"i": i} for i in range(10)]
        it = iter(IterableWrapper(source))
        first = [next(it) for _ in range(4)]
        state = it.state_dict()
        it.close()
        resumed = iter(IterableWrapper(source))
        resumed.load_state_dict(state)
        assert first + list(resumed) == source

    def test_copy_deepcopy_of_the_pipe(self):
        data = [[1], [2]]
        pipe = IterableWrapper(data)
        clone = copy.deepcopy(pipe)
        assert list(clone) == data and clone.iterable is not data and clone.iterable[0] is not data[0]
        shallow = copy.copy(pipe)
        assert shallow.iterable is data

    def test_not_iterable(self):
        with pytest.raises(TypeError, match="IterableWrapper: iterable must be iterable, got int"):
            IterableWrapper(5)
        with pytest.raises(TypeError, match="got NoneType"):
            IterableWrapper(None)

    def test_pickle(self):
        pipe = IterableWrapper([1, 2, 3]).map(lambda x: x + 1)
        assert list(pickle.loads(pickle.dumps(pipe))) == [2, 3, 4]
        with pytest.raises(TypeError, match="IterableWrapper over a one-shot generator cannot be pickled"):
            pickle.dumps(IterableWrapper(x for x in range(3)))

    def test_bool_never_calls_len(self):
        assert bool(IterableWrapper(x for x in ())) is True
        assert bool(IterableWrapper([])) is True

    def test_source_error_passes_through(self):
        err = Boom("source")
        with pytest.raises(Boom) as info:
            list(IterableWrapper(Failing([1], err)))
        assert info.value is err


class TestHeader:
    def test_contract(self):
        pipe = IterableWrapper(range(20)).map(lambda x: -x).header(4)
        assert check_datapipe(pipe, expected=[0, -1, -2, -3], build=lambda src: src.header(10)) == [0, -1, -2, -3]

    def test_class_form_and_default_limit(self):
        assert list(Header(IterableWrapper(range(50)))) == list(range(10))

    def test_len(self):
        assert len(IterableWrapper(range(20)).header(4)) == 4
        assert len(IterableWrapper(range(2)).header(4)) == 2
        assert len(IterableWrapper(range(7)).header(None)) == 7
        assert len(IterableWrapper(range(3)).filter(bool).header(0)) == 0
        check_datapipe(IterableWrapper(range(2)).header(4), expected=[0, 1])

    def test_len_unknown(self):
        # over a source without len(): unknown (torchdata guesses the limit; the source may be shorter)
        with pytest.raises(TypeError, match="^Header\\(3\\): its source may yield fewer than limit=3 items \\(Filter"):
            len(IterableWrapper(range(10)).filter(bool).header(3))
        with pytest.raises(TypeError, match="^Header\\(None\\): The length of this HeaderIterDataPipe cannot be "
                                            "determined, since source_datapipe has no len\\(\\) \\(Filter"):
            len(IterableWrapper(range(10)).filter(bool).header(None))

    def test_reads_no_further_than_the_limit_and_closes_the_source(self):
        src = Counted(range(100))
        assert list(IterableWrapper(src).header(3)) == [0, 1, 2]
        assert src.pulled == 3 and src.closed == 1
        assert list(IterableWrapper(src).header(0)) == [] and src.pulled == 3

    def test_limit_none_yields_everything(self):
        check_datapipe(IterableWrapper(range(5)).header(None), expected=range(5))

    def test_endless_source(self):
        assert list(IterableWrapper(range(3)).cycle().header(7)) == [0, 1, 2, 0, 1, 2, 0]

    def test_empty(self):
        check_datapipe(IterableWrapper([]).header(3), expected=[])

    def test_repr(self):
        assert repr(IterableWrapper([1]).header(5)) == "IterableWrapper -> Header(5)"

    def test_bad_arguments(self):
        src = IterableWrapper(range(3))
        with pytest.raises(ValueError, match="Header: limit must be >= 0, got -1"):
            src.header(-1)
        with pytest.raises(TypeError, match="Header: limit must be an int, got str"):
            src.header("3")
        with pytest.raises(TypeError, match="Header: limit must be an int, got bool"):
            src.header(True)
        with pytest.raises(TypeError, match="Header: source_datapipe must be an IterDataPipe, got list"):
            Header([1, 2])


class TestCycler:
    def test_contract(self):
        pipe = IterableWrapper(range(3)).map(lambda x: x * 2).cycle(3)
        check_datapipe(pipe, expected=[0, 2, 4] * 3, build=lambda src: src.cycle(2))
        assert len(pipe) == 9

    def test_forever_with_limit(self):
        pipe = IterableWrapper("ab").cycle()
        check_datapipe(pipe, expected=list("ababa"), limit=5)
        with pytest.raises(TypeError, match="^Cycler\\(None\\): This Cycler instance cycles forever, and therefore doesn't "):
            len(pipe)

    def test_each_round_is_a_new_pass(self):
        src = Counted([1, 2])
        assert list(Cycler(IterableWrapper(src), 3)) == [1, 2] * 3
        assert src.passes == 3 and src.closed == 3

    def test_count_zero(self):
        src = Counted([1, 2])
        pipe = IterableWrapper(src).filter(bool).cycle(0)
        assert list(pipe) == [] and src.passes == 0
        assert len(pipe) == 0  # even though the filter's length is unknown

    def test_empty_source(self):
        check_datapipe(IterableWrapper([]).cycle(4), expected=[])
        # Cycling an empty source forever ends instead of spinning without yielding.
        check_datapipe(IterableWrapper([]).cycle(), expected=[])

    def test_len_follows_the_source(self):
        data = [1, 2]
        pipe = IterableWrapper(data).cycle(2)
        data.append(3)
        assert len(pipe) == 6 == len(list(pipe))

    def test_one_shot_source_says_so(self):
        pipe = IterableWrapper(x for x in [1, 2]).cycle(2)
        with pytest.raises(RuntimeError, match="one-shot"):
            list(pipe)

    def test_close_reaches_the_source(self):
        src = Counted(range(5))
        it = iter(IterableWrapper(src).cycle())
        assert [next(it) for _ in range(7)] == [0, 1, 2, 3, 4, 0, 1]
        it.close()
        assert src.closed == 2

    def test_none_items(self):
        assert list(IterableWrapper([None]).cycle(3)) == [None, None, None]
        assert list(IterableWrapper([None]).cycle().header(4)) == [None] * 4

    def test_pickle(self):
        pipe = IterableWrapper([1, 2]).map(lambda x: x * 10).cycle(2)
        assert list(pickle.loads(pickle.dumps(pipe))) == [10, 20, 10, 20]

    def test_bad_arguments(self):
        src = IterableWrapper(range(3))
        with pytest.raises(ValueError, match="^Cycler: Expected non-negative count, got -1$"):
            src.cycle(-1)
        with pytest.raises(TypeError, match="Cycler: count must be an int, got float"):
            src.cycle(2.0)
        with pytest.raises(TypeError, match="Cycler: source_datapipe must be an IterDataPipe, got range"):
            Cycler(range(3))


class TestEnumerator:
    def test_contract(self):
        pipe = IterableWrapper("abc").map(str.upper).enumerate()
        check_datapipe(pipe, expected=[(0, "A"), (1, "B"), (2, "C")], build=lambda src: src.enumerate())

    def test_starting_index(self):
        assert list(Enumerator(IterableWrapper("ab"), starting_index=5)) == [(5, "a"), (6, "b")]
        assert list(IterableWrapper("ab").enumerate(-1)) == [(-1, "a"), (0, "b")]

    def test_len_and_empty(self):
        assert len(IterableWrapper(range(4)).enumerate()) == 4
        check_datapipe(IterableWrapper([]).enumerate(), expected=[])
        with pytest.raises(TypeError, match="Filter"):
            len(IterableWrapper(range(4)).filter(bool).enumerate())

    def test_close_reaches_the_source(self):
        src = Counted(range(5))
        it = iter(IterableWrapper(src).enumerate())
        next(it)
        it.close()
        assert src.closed == 1

    def test_pickle(self):
        pipe = IterableWrapper([1, 2]).map(lambda x: x + 1).enumerate(10)
        assert list(pickle.loads(pickle.dumps(pipe))) == [(10, 2), (11, 3)]

    def test_bad_arguments(self):
        with pytest.raises(TypeError, match="Enumerator: starting_index must be an int, got str"):
            IterableWrapper([1]).enumerate("0")
        with pytest.raises(TypeError, match="Enumerator: source_datapipe must be an IterDataPipe, got list"):
            Enumerator([1])


class TestInMemoryCacheHolder:
    def test_contract(self):
        pipe = IterableWrapper(range(6)).map(lambda x: x * x).in_memory_cache()
        check_datapipe(pipe, expected=[x * x for x in range(6)], build=lambda src: src.in_memory_cache())
        check_datapipe(IterableWrapper(range(6)).in_memory_cache(size=1), expected=range(6),
                       build=lambda src: src.in_memory_cache(size=1))

    def test_later_passes_read_the_cache(self):
        src = Counted([[1], [2], [3]])
        pipe = InMemoryCacheHolder(IterableWrapper(src))
        first = list(pipe)
        second = list(pipe)
        assert src.passes == 1 and second == first
        assert all(a is b for a, b in zip(first, second))  # the very objects, not copies

    def test_freezes_a_random_upstream(self):
        pipe = IterableWrapper(range(20)).shuffle().in_memory_cache()
        assert list(pipe) == list(pipe)

    def test_partial_first_pass_leaves_no_cache(self):
        src = Counted(range(5))
        pipe = IterableWrapper(src).in_memory_cache()
        it = iter(pipe)
        assert [next(it), next(it)] == [0, 1]
        it.close()
        assert pipe._cache is None
        assert list(pipe) == list(range(5)) and src.passes == 2
        assert list(pipe) == list(range(5)) and src.passes == 2  # cached by the complete pass

    def test_failing_pass_leaves_no_cache(self):
        err = Boom("source")
        pipe = IterableWrapper(Failing([1, 2], err)).in_memory_cache()
        with pytest.raises(Boom) as info:
            list(pipe)
        assert info.value is err and pipe._cache is None
        with pytest.raises(Boom):
            list(pipe)  # the source is read again, not a truncated cache

    def test_size_limit(self):
        arrays = [np.zeros(100_000, dtype=np.uint8) for _ in range(5)]  # ~0.5 MB in all
        small = Counted(arrays)
        pipe = IterableWrapper(small).in_memory_cache(size=0.1)  # too small: nothing is cached
        assert len(list(pipe)) == 5 and len(list(pipe)) == 5
        assert small.passes == 2 and pipe._cache is None
        big = Counted(arrays)
        pipe = IterableWrapper(big).in_memory_cache(size=1)
        assert len(list(pipe)) == 5 and len(list(pipe)) == 5 and big.passes == 1

    def test_size_limit_counts_containers_and_closes_source(self):
        items = [{"img": np.zeros(60_000, dtype=np.uint8), "label": i} for i in range(3)]
        src = Counted(items)
        pipe = IterableWrapper(src).in_memory_cache(size=0.1)  # 0.1 MB < 3 x 60 kB
        assert [d["label"] for d in pipe] == [0, 1, 2] and pipe._cache is None and src.closed == 1

    def test_len(self):
        assert len(IterableWrapper(range(4)).in_memory_cache()) == 4
        pipe = IterableWrapper(range(10)).filter(lambda x: x % 3 == 0).in_memory_cache()
        with pytest.raises(TypeError, match="Filter"):
            len(pipe)
        assert list(pipe) == [0, 3, 6, 9]
        assert len(pipe) == 4  # known once cached

    def test_cache_is_not_pickled(self):
        pipe = IterableWrapper(range(4)).map(lambda x: x + 1).in_memory_cache()
        list(pipe)
        assert pipe._cache is not None
        clone = pickle.loads(pickle.dumps(pipe))
        assert clone._cache is None and list(clone) == [1, 2, 3, 4] and clone._cache == [1, 2, 3, 4]
        assert pipe._cache == [1, 2, 3, 4]

    def test_empty(self):
        pipe = IterableWrapper([]).in_memory_cache()
        check_datapipe(pipe, expected=[])
        assert pipe._cache == []

    def test_bad_arguments(self):
        src = IterableWrapper(range(3))
        with pytest.raises(ValueError, match="InMemoryCacheHolder: size must be a finite number of megabytes > 0, got 0"):
            src.in_memory_cache(size=0)
        with pytest.raises(ValueError, match="got -1"):
            src.in_memory_cache(size=-1)
        with pytest.raises(ValueError, match="got nan"):
            src.in_memory_cache(size=float("nan"))
        with pytest.raises(TypeError, match="InMemoryCacheHolder: size must be a number of megabytes or None, got str"):
            src.in_memory_cache(size="1")
        with pytest.raises(TypeError, match="InMemoryCacheHolder: source_dp must be an IterDataPipe, got list"):
            InMemoryCacheHolder([1])


class TestUpstreamCloseRule:
    """Stages close their upstream only when their own pass is abandoned, never on normal ends."""

    def test_header_and_enumerate_keep_yielded_streams_valid(self, tmp_path):
        from datapipes.iter import FileLister

        for name in "abc":
            (tmp_path / f"{name}.txt").write_text(name * 2)
        files = FileLister(str(tmp_path)).open_files()
        assert [s.read() for _, s in list(files.header(2))] == ["aa", "bb"]
        assert [s.read() for _, (_, s) in list(files.enumerate())] == ["aa", "bb", "cc"]

    def test_consumer_close_closes_upstream(self):
        closed = []

        class Src(IterDataPipe):
            def __iter__(self):
                try:
                    yield from range(10)
                finally:
                    closed.append(True)

        it = iter(Src().enumerate())
        next(it)
        it.close()
        assert closed == [True]


class TestAsyncSource:
    def test_async_generator_and_async_iterable(self, no_thread_leak):
        import asyncio

        async def agen(n):
            for i in range(n):
                await asyncio.sleep(0)
                yield i

        class Listing:
            def __aiter__(self):
                return agen(4)

        one_shot = IterableWrapper(agen(3)).map(lambda x: x * 10)
        assert list(one_shot) == [0, 10, 20]
        with pytest.raises(RuntimeError, match="already iterated"):
            list(one_shot)
        check_datapipe(IterableWrapper(Listing()), expected=[0, 1, 2, 3], check_pickle=False)


class OpensWhenIterated:
    """A re-iterable source whose ``__iter__`` is a plain function doing work when called (as one
    that opens a file does): it counts the calls, and the closes of the generators it returns."""

    def __init__(self, data):
        self.data = list(data)
        self.opened = 0
        self.closed = 0

    def __iter__(self):
        self.opened += 1
        return self._items()

    def _items(self):
        try:
            yield from self.data
        finally:
            self.closed += 1


def _bad(x):
    if x >= 3:
        raise Boom(x)
    return x


#: one small pipe per stage class and variant of this module, built over a source
STAGES = {
    "IterableWrapper": lambda src: src,
    "header": lambda src: src.header(3),
    "header-None": lambda src: src.header(None),
    "header-0": lambda src: src.header(0),
    "cycle": lambda src: src.cycle(2),
    "cycle-forever": lambda src: src.cycle().header(25),
    "enumerate": lambda src: src.enumerate(starting_index=1),
    "in_memory_cache": lambda src: src.in_memory_cache(),
    "in_memory_cache-size": lambda src: src.in_memory_cache(size=1),
}


class TestPassBuilding:
    """Every stage creates its source's iterator in ``iter()``, as part of the pass being built
    (``Cycler`` its later rounds' in the same pass), while nothing is read before the first
    ``next()``."""

    @pytest.mark.parametrize("name", sorted(STAGES))
    def test_pass_is_built_at_iter(self, name):
        source = Counted(range(10))
        pipe = STAGES[name](IterableWrapper(source))
        it = iter(pipe)
        assert _pass.unbuilt(it) == [], _pass.unbuilt(it)
        assert source.passes == 0  # built, not started
        assert list(it) == list(STAGES[name](IterableWrapper(range(10))))

    def test_cycled_rounds_join_their_own_pass(self):
        pipe = IterableWrapper(range(30)).shuffle(buffer_size=30).cycle(2).set_seed(0)
        epoch0, epoch1 = list(pipe.set_epoch(0)), list(pipe.set_epoch(1))
        assert epoch0 != epoch1
        a = iter(pipe.set_epoch(0))
        b = iter(pipe.set_epoch(1))  # a second pass starts before the first one's second round
        assert list(a) == epoch0 and list(b) == epoch1

    def test_a_plain_iter_method_is_called_at_the_first_next(self):
        src = OpensWhenIterated(range(4))
        it = iter(IterableWrapper(src).map(lambda x: x * 10))
        assert src.opened == 0
        assert next(it) == 0 and src.opened == 1
        it.close()
        assert src.closed == 1
        it = iter(IterableWrapper(src))
        it.close()  # closed before it started: nothing is opened
        assert list(it) == [] and src.opened == 1

    def test_deepcopy_is_taken_at_the_first_next(self):
        data = [[1], [2]]
        it = iter(IterableWrapper(data, deepcopy=True))
        data[0].append("later")
        assert next(it) == [1, "later"] and list(it) == [[2]]

    def test_a_failing_pass_closes_a_deferred_source(self):
        src = OpensWhenIterated(range(10))
        gc.disable()
        try:
            with pytest.raises(Boom) as info:
                list(IterableWrapper(src).enumerate().map(lambda t: _bad(t[1])))
            assert info.value.__traceback__ is not None  # held: it names every frame of the pass
            assert src.closed == 1
        finally:
            gc.enable()
