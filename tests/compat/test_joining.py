"""torchdata's joining, splitting and reshaping pipes (datapipes/iter/zipping.py, muxing.py,
broadcast/demux.py, reshaping.py): behaviour as torchdata 0.9 documents it, argument errors, len(),
the pipe contract, checkpoint and pickling."""

import pickle
import warnings
from collections import OrderedDict
from operator import itemgetter

import pytest

from datapipes.iter import (
    Dropper,
    Flattener,
    IndexAdder,
    IterableWrapper,
    IterKeyZipper,
    LengthSetter,
    MapKeyZipper,
    MultiplexerLongest,
    Repeater,
    RoundRobinDemultiplexer,
    SampleMultiplexer,
    Slicer,
    UnZipper,
    ZipperLongest,
)
from datapipes.iter.broadcast.demux import RoundRobinDemultiplexerChild
from datapipes.iter.zipping import UnZipperChild
from datapipes.map import SequenceWrapper
from datapipes.testing import check_datapipe, check_resume

W = IterableWrapper


class Boom(Exception):
    pass


def boom(*_):
    raise Boom("boom")


def collect_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught]


# -- IterKeyZipper ---------------------------------------------------------------------------------


class TestIterKeyZipper:
    def test_torchdata_example(self):
        dp1 = W([("a", 100), ("b", 200), ("c", 300)])
        dp2 = W([("a", 1), ("b", 2), ("c", 3), ("d", 4)])
        pipe = dp1.zip_with_iter(dp2, key_fn=itemgetter(0), ref_key_fn=itemgetter(0), keep_key=True,
                                 merge_fn=lambda t1, t2: t1[1] + t2[1])
        assert list(pipe) == [("a", 101), ("b", 202), ("c", 303)]
        assert len(pipe) == 3
        assert isinstance(pipe, IterKeyZipper)

    def test_default_tuple_and_ref_key_fn_defaults_to_key_fn(self):
        pipe = W(range(4)).zip_with_iter(W([3, 1, 0, 2]), key_fn=lambda x: x)
        assert list(pipe) == [(0, 0), (1, 1), (2, 2), (3, 3)]
        keyed = W(range(2)).zip_with_iter(W(["b", "a"]), key_fn=lambda x: "ab"[x], ref_key_fn=lambda s: s, keep_key=True)
        assert list(keyed) == [("a", (0, "a")), ("b", (1, "b"))]

    def test_buffer_just_big_enough(self):
        # torchdata's test: the match for 0 comes last; a buffer of 10 holds the nine before it
        pipe = W(range(10)).zip_with_iter(W([*range(1, 10), 0]), key_fn=lambda x: x, buffer_size=10)
        assert list(pipe) == [(i, i) for i in range(10)]
        unbounded = W(range(10)).zip_with_iter(W([*range(1, 10), 0]), key_fn=lambda x: x, buffer_size=None)
        assert list(unbounded) == [(i, i) for i in range(10)]

    def test_full_buffer_drops_oldest_with_one_warning_then_missing_key(self):
        pipe = W(range(10)).zip_with_iter(W([*range(1, 10), 0]), key_fn=lambda x: x, buffer_size=5)
        it = iter(pipe)
        first, caught = collect_warnings(lambda: next(it))
        assert first == (0, 0)
        assert len(caught) == 1 and "Buffer reaches the upper limit" in caught[0]
        with pytest.raises(BufferError, match=r"No matching key can be found from reference DataPipe") as info:
            next(it)
        assert "IterKeyZipper" in str(info.value) and "source item 1" in str(info.value)

    def test_missing_key_when_ref_ends(self):
        with pytest.raises(BufferError, match="No matching key can be found"):
            list(W([1, 2, 9]).zip_with_iter(W([1, 2]), key_fn=lambda x: x))

    def test_duplicate_key(self):
        with pytest.raises(ValueError, match="Duplicate key is found in reference DataPipe"):
            list(W([3]).zip_with_iter(W([1, 1, 3]), key_fn=lambda x: x))

    def test_user_error_gets_note(self):
        with pytest.raises(Boom) as info:
            list(W([1, 2]).zip_with_iter(W([1, 2]), key_fn=lambda x: x, merge_fn=boom))
        assert any("IterKeyZipper" in n and "item 0" in n for n in info.value.__notes__)

    def test_arguments(self):
        with pytest.raises(TypeError, match="ref_datapipe must be a IterDataPipe, but its type is <class 'list'>"):
            IterKeyZipper(W([1]), [1], key_fn=abs)
        with pytest.raises(TypeError, match="key_fn must be callable"):
            IterKeyZipper(W([1]), W([1]), key_fn=3)
        with pytest.raises(ValueError, match=r"^IterKeyZipper\(buffer_size=0\): 'buffer_size' is required to be "
                                             "either None or a positive integer.$"):
            IterKeyZipper(W([1]), W([1]), key_fn=abs, buffer_size=0)
        with pytest.raises(TypeError, match="keep_key"):
            IterKeyZipper(W([1]), W([1]), key_fn=abs, keep_key="yes")
        with pytest.raises(TypeError, match="merge_fn"):
            IterKeyZipper(W([1]), W([1]), key_fn=abs, merge_fn=1)

    def test_len_unknown(self):
        with pytest.raises(TypeError, match="IterKeyZipper"):
            len(W(x for x in [1]).zip_with_iter(W([1]), key_fn=abs))

    def test_contract_and_resume(self):
        ref = [5, 3, 1, 0, 2, 4, 7, 6]

        def build():
            return W(range(8)).zip_with_iter(W(ref), key_fn=lambda x: x, keep_key=True, buffer_size=4)

        expected = [(i, (i, i)) for i in range(8)]
        check_datapipe(build(), expected=expected, build=lambda src: src.zip_with_iter(W(range(10)), key_fn=lambda x: x))
        assert check_resume(build, ks=range(9)) == expected

    def test_state_holds_buffer(self):
        it = iter(W([2, 0, 1]).zip_with_iter(W([0, 1, 2]), key_fn=lambda x: x))
        assert next(it) == (2, 2)
        state = it.state_dict()
        buffered = [v for v in state["stages"].values() if isinstance(v, dict) and "buffer" in v]
        assert buffered == [{"buffer": [[0, 0], [1, 1]], "warned": False}]


# -- MapKeyZipper ----------------------------------------------------------------------------------


class TestMapKeyZipper:
    def test_torchdata_example(self):
        def merge_fn(tuple_from_iter, value_from_map):
            return tuple_from_iter[0], tuple_from_iter[1] + value_from_map

        mapdp = SequenceWrapper({"a": 100, "b": 200, "c": 300, "d": 400})
        pipe = W([("a", 1), ("b", 2), ("c", 3)]).zip_with_map(map_datapipe=mapdp, key_fn=itemgetter(0), merge_fn=merge_fn)
        assert list(pipe) == [("a", 101), ("b", 202), ("c", 303)]
        assert len(pipe) == 3 and isinstance(pipe, MapKeyZipper)
        keyed = W([("a", 1)]).zip_with_map(mapdp, itemgetter(0), keep_key=True)
        assert list(keyed) == [("a", (("a", 1), 100))]

    def test_index_into_sequence(self):
        assert list(W([2, 0]).zip_with_map(SequenceWrapper("xyz"), key_fn=lambda i: i)) == [(2, "z"), (0, "x")]

    @pytest.mark.parametrize("mapdp, keys, cause", [(SequenceWrapper({"a": 1}), ["a", "zz"], KeyError),
                                                    (SequenceWrapper([1]), [0, 5], IndexError)])
    def test_missing_key_is_key_error(self, mapdp, keys, cause):
        with pytest.raises(KeyError, match="which is not a valid key in the given MapDataPipe") as info:
            list(W(keys).zip_with_map(mapdp, key_fn=lambda x: x))
        assert "MapKeyZipper" in str(info.value) and "source item 1" in str(info.value)
        assert isinstance(info.value.__cause__, cause)

    def test_user_error_gets_note(self):
        with pytest.raises(Boom) as info:
            list(W([1]).zip_with_map(SequenceWrapper([0, 1]), key_fn=boom))
        assert any("MapKeyZipper" in n for n in info.value.__notes__)

    def test_arguments(self):
        with pytest.raises(TypeError, match="map_datapipe must be a MapDataPipe"):
            MapKeyZipper(W([1]), W([1]), key_fn=abs)
        with pytest.raises(TypeError, match="key_fn"):
            MapKeyZipper(W([1]), SequenceWrapper([1]), key_fn=None)

    def test_contract_and_resume(self):
        mapdp = SequenceWrapper({i: i * 10 for i in range(6)})
        check_datapipe(W(range(6)).zip_with_map(mapdp, key_fn=lambda x: x, merge_fn=lambda a, b: a + b),
                       expected=[0, 11, 22, 33, 44, 55], build=lambda src: src.zip_with_map(mapdp, key_fn=lambda x: x))
        check_resume(lambda: W(range(6)).zip_with_map(SequenceWrapper(list(range(6))), key_fn=lambda x: 5 - x), ks=range(7))


# -- UnZipper --------------------------------------------------------------------------------------


class TestUnZipper:
    def test_torchdata_example(self):
        dp1, dp2, dp3 = W([(i, i + 10, i + 20) for i in range(3)]).unzip(sequence_length=3)
        assert (list(dp1), list(dp2), list(dp3)) == ([0, 1, 2], [10, 11, 12], [20, 21, 22])
        assert all(isinstance(c, UnZipperChild) for c in (dp1, dp2, dp3))
        assert (len(dp1), dp3.column) == (3, 2)

    def test_columns_to_skip(self):
        children = UnZipper(W([(i, i + 10, i + 20) for i in range(3)]), 3, columns_to_skip=[0, 2])
        assert len(children) == 1 and list(children[0]) == [10, 11, 12]

    def test_children_consumed_together_share_one_pass(self):
        passes = []

        class Source:
            def __iter__(self):
                passes.append(1)
                yield from [(1, "a"), (2, "b"), (3, "c")]

        a, b = W(Source()).unzip(2)
        assert list(a.zip(b)) == [(1, "a"), (2, "b"), (3, "c")]
        assert len(passes) == 1

    def test_buffer_bound(self):
        a, b = W([(i, i) for i in range(10)]).unzip(2, buffer_size=3)
        with pytest.raises(BufferError, match="UnZipper"):
            list(a)

    def test_short_item_error_gets_note(self):
        a, b = W([(1, 2), (3,)]).unzip(2)
        with pytest.raises(IndexError) as info:
            list(b)
        assert any("UnZipper" in n and "item 1" in n for n in info.value.__notes__)

    def test_arguments(self):
        with pytest.raises(RuntimeError, match="All instances are being filtered out"):
            UnZipper(W([(1, 2)]), 2, columns_to_skip=[0, 1])
        with pytest.raises(RuntimeError, match="All instances are being filtered out"):  # torchdata's type
            W([]).unzip(0)
        with pytest.raises(ValueError, match="columns_to_skip holds 5"):
            W([]).unzip(2, columns_to_skip=[5])
        with pytest.raises(TypeError, match="columns_to_skip"):
            W([]).unzip(2, columns_to_skip=3)
        with pytest.warns(UserWarning, match="Unlimited buffer size"):
            W([]).unzip(2, buffer_size=-1)

    def test_contract_pickle_and_resume(self):
        data = [(i, str(i), -i) for i in range(6)]
        a, b, c = W(data).unzip(3)
        check_datapipe(b, expected=[str(i) for i in range(6)],
                       build=lambda src: src.map(lambda x: (x, x)).unzip(2)[1])
        zipped = pickle.loads(pickle.dumps([a, b]))
        assert list(zipped[0].zip(zipped[1])) == [(i, str(i)) for i in range(6)]

        def build():
            x, _, z = W(data).unzip(3)
            return x.zip(z)

        assert check_resume(build, ks=range(7)) == [(i, -i) for i in range(6)]


# -- ZipperLongest ---------------------------------------------------------------------------------


class TestZipperLongest:
    def test_torchdata_example(self):
        dp1, dp2, dp3 = W(range(3)), W(range(10, 15)), W(range(20, 25))
        assert list(dp1.zip_longest(dp2, dp3)) == [(0, 10, 20), (1, 11, 21), (2, 12, 22), (None, 13, 23), (None, 14, 24)]
        assert list(dp1.zip_longest(dp2, dp3, fill_value=-1))[-1] == (-1, 14, 24)
        assert len(ZipperLongest(dp1, dp2)) == 5

    def test_empty_inputs(self):
        assert list(W([]).zip_longest(W([]))) == []

    def test_exhausted_input_not_read_again(self):
        class OneItem:
            calls = 0

            def __iter__(self):
                return self

            def __next__(self):
                self.calls += 1
                if self.calls > 1:
                    raise StopIteration
                return 1

        source = OneItem()
        assert list(W(source).zip_longest(W([1, 2, 3]))) == [(1, 1), (None, 2), (None, 3)]
        assert source.calls == 2

    def test_arguments_and_len(self):
        with pytest.raises(ValueError, match="at least one"):
            ZipperLongest()
        with pytest.raises(TypeError, match="All inputs are required to be `IterDataPipe`"):
            ZipperLongest(W([1]), [2])
        with pytest.raises(TypeError, match=r"datapipes\[1\] has no len"):
            len(W([1]).zip_longest(W(x for x in [1])))

    def test_contract_and_resume(self):
        check_datapipe(W(range(2)).zip_longest(W("abc")), expected=[(0, "a"), (1, "b"), (None, "c")],
                       build=lambda src: src.zip_longest(W([1])))
        check_resume(lambda: W(range(3)).zip_longest(W("abcde"), W([1])), ks=range(6))


# -- MultiplexerLongest ----------------------------------------------------------------------------


class TestMultiplexerLongest:
    def test_torchdata_example(self):
        dp1, dp2, dp3 = W(range(5)), W(range(10, 15)), W(range(20, 25))
        assert list(dp1.mux_longest(dp2, dp3)) == [0, 10, 20, 1, 11, 21, 2, 12, 22, 3, 13, 23, 4, 14, 24]

    def test_uneven(self):
        pipe = MultiplexerLongest(W([1, 2, 3]), W([]), W(["a"]), W([None, None]))
        assert list(pipe) == [1, "a", None, 2, None, 3]
        assert len(pipe) == 6

    def test_arguments_and_len(self):
        with pytest.raises(ValueError):
            MultiplexerLongest()
        with pytest.raises(TypeError):
            MultiplexerLongest(W([1]), "ab")
        with pytest.raises(TypeError, match="MultiplexerLongest"):
            len(W([1]).mux_longest(W(x for x in [1])))

    def test_contract_and_resume(self):
        check_datapipe(W([1, 2, 3]).mux_longest(W("a")), expected=[1, "a", 2, 3], build=lambda src: src.mux_longest(W([9])))
        assert check_resume(lambda: W(range(3)).mux_longest(W("a"), W([10, 11, 12, 13])), ks=range(9)) == \
            [0, "a", 10, 1, 11, 2, 12, 13]


# -- RoundRobinDemultiplexer -----------------------------------------------------------------------


class TestRoundRobinDemultiplexer:
    def test_torchdata_example(self):
        dp1, dp2 = W(range(5)).round_robin_demux(2)
        assert list(dp1) == [0, 2, 4] and len(dp1) == 3
        assert list(dp2) == [1, 3] and len(dp2) == 2
        assert isinstance(dp1, RoundRobinDemultiplexerChild)

    @pytest.mark.parametrize("n, k", [(0, 3), (7, 3), (9, 3), (2, 4)])
    def test_lengths_match_items(self, n, k):
        children = RoundRobinDemultiplexer(W(range(n)), k)
        for i, child in enumerate(children):
            assert list(child) == list(range(i, n, k)) == list(range(n))[i::k]
            assert len(child) == len(list(range(n))[i::k])

    def test_one_instance_is_one_child(self):
        (only,) = W("abc").round_robin_demux(1)
        assert list(only) == ["a", "b", "c"]

    def test_buffer_bound(self):
        a, b = W(range(10)).round_robin_demux(2, buffer_size=2)
        with pytest.raises(BufferError, match="RoundRobinDemultiplexer"):
            list(a)

    def test_arguments(self):
        with pytest.raises(ValueError, match="^RoundRobinDemultiplexer: Expected `num_instaces` larger than 0"):
            W([1]).round_robin_demux(0)
        with pytest.raises(TypeError):
            RoundRobinDemultiplexer([1, 2], 2)
        with pytest.raises(TypeError, match="has no len"):
            len(W(x for x in [1]).round_robin_demux(2)[0])

    def test_contract_pickle_and_resume(self):
        a, b, c = W(range(8)).round_robin_demux(3)
        check_datapipe(b, expected=[1, 4, 7], build=lambda src: src.round_robin_demux(1)[0])
        x, y = pickle.loads(pickle.dumps([a, c]))
        assert list(x.zip(y)) == [(0, 2), (3, 5)]

        def build():
            p, q, r = W(range(10)).round_robin_demux(3)
            return p.mux_longest(q, r)

        assert check_resume(build, ks=range(11)) == list(range(10))


# -- SampleMultiplexer -----------------------------------------------------------------------------


class TestSampleMultiplexer:
    def test_torchdata_example(self):
        d = {W([0] * 10): 99999999, W([1] * 10): 0.0000001}
        assert list(SampleMultiplexer(pipes_to_weights_dict=d, seed=0)) == [0] * 10 + [1] * 10

    def test_every_item_once_each_input_in_order(self):
        a, b, c = W(range(0, 20)), W(range(100, 110)), W(range(200, 230))
        out = list(SampleMultiplexer({a: 1, b: 2, c: 0.5}))
        assert sorted(out) == sorted([*range(20), *range(100, 110), *range(200, 230)])
        for lo in (0, 100, 200):
            mine = [x for x in out if lo <= x < lo + 100]
            assert mine == sorted(mine)
        assert len(SampleMultiplexer({a: 1, b: 2, c: 0.5})) == 60

    def test_weights_shape_the_mix(self):
        out = list(SampleMultiplexer({W([0] * 2000).cycle(): 3.0, W([1]).cycle(): 1.0}, seed=1).header(4000))
        assert 0.70 < out.count(0) / len(out) < 0.80

    def test_seeds(self):
        def make(seed=None):
            return SampleMultiplexer({W(range(10)): 1, W(range(10, 20)): 1}, seed=seed)

        seeded = make(seed=7)
        assert list(seeded) == list(seeded) == list(make(seed=7))
        assert list(make(seed=7)) != list(make(seed=8))
        pipe = make().set_seed(3)
        first = list(pipe)
        assert list(pipe) == first and list(pipe.set_epoch(1)) != first
        assert SampleMultiplexer._is_random

    def test_arguments(self):
        with pytest.raises(ValueError, match="Empty dictionary"):
            SampleMultiplexer({})
        with pytest.raises(ValueError, match="Expecting a positive and non-zero weight"):
            SampleMultiplexer({W([1]): 0})
        with pytest.raises(ValueError, match="finite"):
            SampleMultiplexer({W([1]): float("inf")})
        with pytest.raises(TypeError, match="must be a number"):
            SampleMultiplexer({W([1]): "1"})
        with pytest.raises(TypeError, match="IterDataPipe"):
            SampleMultiplexer({"ab": 1})
        with pytest.raises(TypeError, match="seed"):
            SampleMultiplexer({W([1]): 1}, seed=1.5)
        with pytest.raises(TypeError, match="dict"):
            SampleMultiplexer([W([1])])

    def test_contract_and_resume(self):
        check_datapipe(SampleMultiplexer({W(range(5)): 1, W("abc"): 2}, seed=4),
                       build=lambda src: SampleMultiplexer({src: 1, W([7]): 1}, seed=0))
        check_datapipe(SampleMultiplexer({W(range(5)): 1, W("abc"): 2}))  # unseeded: passes agree as multisets
        check_resume(lambda: SampleMultiplexer({W(range(6)): 1, W(range(10, 14)): 2, W([None]): 1}, seed=3), ks=range(12))


# -- IndexAdder ------------------------------------------------------------------------------------


class TestIndexAdder:
    def test_torchdata_example(self):
        rows = [{"a": 1, "b": 2}, {"c": 3, "a": 1}]
        pipe = W(rows).add_index("order")
        assert list(pipe) == [{"a": 1, "b": 2, "order": 0}, {"c": 3, "a": 1, "order": 1}]
        assert rows == [{"a": 1, "b": 2}, {"c": 3, "a": 1}]  # the source's dicts are left as they were
        assert len(pipe) == 2 and isinstance(pipe, IndexAdder)
        assert list(W([{}]).add_index()) == [{"index": 0}]

    def test_dict_subclass_kept(self):
        (row,) = W([OrderedDict(a=1)]).add_index()
        assert type(row) is OrderedDict and row == OrderedDict(a=1, index=0)

    def test_not_a_dict(self):
        with pytest.raises(NotImplementedError, match="We only support adding index to row or batch in dict type") as info:
            list(W([{}, [1]]).add_index())
        assert "item 1" in str(info.value)

    def test_arguments(self):
        with pytest.raises(TypeError, match="index_name"):
            IndexAdder(W([]), index_name=["x"])

    def test_contract_and_resume(self):
        check_datapipe(W([{"x": i} for i in range(4)]).add_index(), expected=[{"x": i, "index": i} for i in range(4)],
                       build=lambda src: src.map(lambda x: {"x": x}).add_index())
        check_resume(lambda: W([{"x": i} for i in range(5)]).add_index("i"), ks=range(6))


# -- Repeater --------------------------------------------------------------------------------------


class TestRepeater:
    def test_torchdata_example(self):
        pipe = W(range(3)).repeat(2)
        assert list(pipe) == [0, 0, 1, 1, 2, 2] and len(pipe) == 6 and isinstance(pipe, Repeater)

    def test_same_object(self):
        item = [1]
        a, b, c = W([item], deepcopy=False).repeat(3)
        assert a is b is c is item

    def test_arguments(self):
        with pytest.raises(ValueError, match="The number of repetition must be > 1, got 1"):
            W([1]).repeat(1)
        with pytest.raises(TypeError, match="times must be an int"):
            W([1]).repeat(2.0)

    def test_contract_and_resume(self):
        check_datapipe(W("ab").repeat(3), expected=list("aaabbb"), build=lambda src: src.repeat(2))
        assert check_resume(lambda: W([[0], [1], [2]]).repeat(3), ks=range(10)) == [[i] for i in range(3) for _ in range(3)]


# -- Slicer, Flattener, Dropper --------------------------------------------------------------------


class TestSlicer:
    def test_torchdata_example(self):
        dp = W([(0, 10, 100), (1, 11, 111), (2, 12, 122), (3, 13, 133), (4, 14, 144)])
        assert list(dp.slice(0, 2)) == [(0, 10), (1, 11), (2, 12), (3, 13), (4, 14)]
        assert isinstance(dp.slice(0, 2), Slicer) and len(dp.slice(0, 2)) == 5

    def test_slices_and_index_lists(self):
        assert list(W([[0, 1, 2, 3, 4]]).slice(1, None, 2)) == [[1, 3]]
        assert list(W([(0, 1, 2)]).slice(1)) == [(1, 2)]
        assert list(W([(0, 1, 2, 3)]).slice([3, 0])) == [(0, 3)]  # in the item's order, as torchdata
        assert list(W([(0, 1, 2, 3)]).slice([-1])) == [(3,)]
        assert list(W([{"a": 1, "b": 2, "c": 3}]).slice(["a", "c"])) == [{"a": 1, "c": 3}]
        assert list(W([{"a": 1, "b": 2}]).slice("b")) == [{"b": 2}]

    def test_warnings(self):
        out, caught = collect_warnings(lambda: list(W([{"a": 1}]).slice("z")))
        assert out == [{"a": 1}] and "Dictionaries are not sliced by steps" in caught[0]
        out, caught = collect_warnings(lambda: list(W([5]).slice(0)))
        assert out == [5] and "not an iterable" in caught[0]
        out, caught = collect_warnings(lambda: list(W([(1, 2)]).slice([0, 5])))
        assert out == [(1,)] and "At least one index in the filter is not present" in caught[0]
        _, caught = collect_warnings(lambda: Slicer(W([]), [0], stop=2))
        assert "only the indices list will be used" in caught[0]

    def test_errors(self):
        with pytest.raises(TypeError, match="step"):
            W([]).slice(0, step="2")
        with pytest.raises(ValueError, match="step"):
            W([]).slice(0, step=0)
        with pytest.raises(TypeError) as info:
            list(W([(1, 2)]).slice("a"))
        assert any("Slicer" in n and "item 0" in n for n in info.value.__notes__)

    def test_contract(self):
        check_datapipe(W([(0, 1, 2), [3, 4, 5]]).slice(1, 3), expected=[(1, 2), [4, 5]],
                       build=lambda src: src.map(lambda x: (x, x)).slice([1]))
        check_resume(lambda: W([(i, i + 1, i + 2) for i in range(5)]).slice([0, 2]), ks=range(6))


class TestFlattener:
    def test_torchdata_examples(self):
        dp = W([(0, 10, (100, 1000)), (1, 11, (111, 1001)), (2, 12, (122, 1002))])
        assert list(dp.flatten(2)) == [(0, 10, 100, 1000), (1, 11, 111, 1001), (2, 12, 122, 1002)]
        dp = W([(0, (1, 2)), (3, (4, 5)), (6, (7, 8))])
        assert list(dp.flatten()) == [(0, 1, 2), (3, 4, 5), (6, 7, 8)]
        assert isinstance(dp.flatten(), Flattener) and len(dp.flatten()) == 3

    def test_kinds_and_indices(self):
        assert list(W([[0, [1, 2], (3,), [4, [5]]]]).flatten()) == [[0, 1, 2, 3, 4, [5]]]
        assert list(W([((1, 2), (3, 4))]).flatten(0)) == [(1, 2, (3, 4))]  # 0 is index 0, not "every"
        assert list(W([((1, 2), (3, 4))]).flatten([-1])) == [((1, 2), 3, 4)]
        assert list(W([{"a": 1, "b": {"c": 2}, "d": {"e": 3}}]).flatten("b")) == [{"a": 1, "c": 2, "d": {"e": 3}}]
        assert list(W([{"a": 1, "b": {"c": 2}, "d": {"e": 3}}]).flatten()) == [{"a": 1, "c": 2, "e": 3}]

    def test_same_key_twice_warns_and_keeps_first(self):
        out, caught = collect_warnings(lambda: list(W([{"a": 1, "b": {"a": 2, "c": 3}, "d": {"c": 4}}]).flatten()))
        assert out == [{"a": 1, "c": 3}]
        assert caught and all("insert the same key twice" in m for m in caught)

    def test_missing_index_warns(self):
        out, caught = collect_warnings(lambda: list(W([(1, (2,))]).flatten([1, 7])))
        assert out == [(1, 2)] and "At least one index in the filter is not present" in caught[0]

    def test_not_a_container(self):
        with pytest.raises(TypeError, match="flatten takes tuples, lists and dicts") as info:
            list(W([(1,), "ab"]).flatten())
        assert any("Flattener" in n and "item 1" in n for n in info.value.__notes__)
        with pytest.raises(TypeError, match="indices"):
            W([]).flatten([[0]])

    def test_contract(self):
        check_datapipe(W([(1, (2, 3)), [4, [5]]]).flatten(), expected=[(1, 2, 3), [4, 5]],
                       build=lambda src: src.map(lambda x: (x, (x,))).flatten())
        check_resume(lambda: W([(i, (i, i)) for i in range(4)]).flatten(1), ks=range(5))


class TestDropper:
    def test_torchdata_example(self):
        dp = W(range(5)).zip(W(range(10, 15)))
        assert list(dp.drop(1)) == [(0,), (1,), (2,), (3,), (4,)]
        assert isinstance(dp.drop(1), Dropper) and len(dp.drop(1)) == 5

    def test_kinds(self):
        assert list(W([[0, 1, 2, 3]]).drop([0, 2])) == [[1, 3]]
        assert list(W([(0, 1, 2)]).drop(-1)) == [(0, 1)]
        assert list(W([{"a": 1, "b": 2, "c": 3}]).drop(["a", "c"])) == [{"b": 2}]
        assert list(W([{("x", 1): 1, "b": 2}]).drop(("x", 1))) == [{"b": 2}]  # a tuple is one key

    def test_warnings(self):
        out, caught = collect_warnings(lambda: list(W([7]).drop(0)))
        assert out == [7] and "not an iterable" in caught[0]
        out, caught = collect_warnings(lambda: list(W([{"a": 1}]).drop("z")))
        assert out == [{"a": 1}] and "At least one index in the filter is not present" in caught[0]
        with pytest.raises(TypeError, match="indices"):
            W([]).drop([{}])

    def test_contract(self):
        check_datapipe(W([(0, 1), [2, 3]]).drop(0), expected=[(1,), [3]], build=lambda src: src.map(lambda x: [x, x]).drop(1))
        check_resume(lambda: W([(i, i + 1) for i in range(4)]).drop(0), ks=range(5))


# -- LengthSetter ----------------------------------------------------------------------------------


class TestLengthSetter:
    def test_torchdata_example(self):
        dp = W(range(10)).filter(lambda x: x < 5).set_length(3)
        assert list(dp) == [0, 1, 2, 3, 4] and len(dp) == 3 and isinstance(dp, LengthSetter)

    def test_arguments(self):
        with pytest.raises(ValueError, match="length must be >= 0"):
            W([]).set_length(-1)
        with pytest.raises(TypeError, match="length must be an int"):
            W([]).set_length("3")

    def test_contract(self):
        check_datapipe(W(range(4)).filter(lambda x: x % 2 == 1).set_length(2), expected=[1, 3],
                       build=lambda src: src.set_length(4))
        check_resume(lambda: W(range(6)).filter(lambda x: x % 2 == 1).set_length(3), ks=range(4))


# -- shared ----------------------------------------------------------------------------------------


def test_pickles_with_lambdas():
    pipes = [
        W(range(3)).zip_with_iter(W(range(3)), key_fn=lambda x: x, merge_fn=lambda a, b: a + b),
        W(range(3)).zip_with_map(SequenceWrapper([5, 6, 7]), key_fn=lambda x: x, merge_fn=lambda a, b: b),
        W(range(3)).map(lambda x: (x, (x,))).flatten().slice([0]).drop(0).set_length(3),
    ]
    for pipe in pipes:
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe)


def test_functional_names_registered():
    from datapipes import IterDataPipe

    names = {"zip_with_iter": IterKeyZipper, "zip_with_map": MapKeyZipper, "unzip": UnZipper,
             "zip_longest": ZipperLongest, "mux_longest": MultiplexerLongest,
             "round_robin_demux": RoundRobinDemultiplexer, "add_index": IndexAdder, "repeat": Repeater,
             "slice": Slicer, "flatten": Flattener, "drop": Dropper, "set_length": LengthSetter}
    for name, cls in names.items():
        assert IterDataPipe._functions[name] is cls
    assert not hasattr(SampleMultiplexer, "_functional_name")
