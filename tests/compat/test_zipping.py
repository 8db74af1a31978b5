"""torchdata's zipping pipes (datapipes/iter/zipping.py): IterKeyZipper [zip_with_iter], MapKeyZipper
[zip_with_map], UnZipper [unzip] and ZipperLongest [zip_longest]: behaviour as torchdata 0.9 documents it,
argument errors, len(), the pipe contract, checkpoint and pickling."""

import pickle
import warnings
from operator import itemgetter

import pytest

from datapipes.iter import IterableWrapper, IterKeyZipper, MapKeyZipper, UnZipper, ZipperLongest
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
