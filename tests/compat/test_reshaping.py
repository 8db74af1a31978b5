"""torchdata's reshaping pipes (datapipes/iter/reshaping.py): IndexAdder [add_index], Repeater [repeat],
Slicer [slice], Flattener [flatten], Dropper [drop], LengthSetter [set_length] and Rows2Columnar
[rows2columnar]: behaviour as torchdata 0.9 documents it, argument errors, len(), the pipe contract,
checkpoint and pickling."""

import warnings
from collections import OrderedDict, defaultdict

import pytest

from datapipes.iter import Dropper, Flattener, IndexAdder, IterableWrapper, LengthSetter, Repeater, Slicer
from datapipes.testing import check_datapipe, check_resume

W = IterableWrapper

EVERY_K = lambda n: range(n + 1)  # noqa: E731 - check_resume's ks: stop after every number of items


def collect_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught]


def notes(e):
    return "\n".join(getattr(e, "__notes__", []))


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


# -- Rows2Columnar ---------------------------------------------------------------------------------


class TestRows2Columnar:
    def test_torchdata_examples(self):
        dp = IterableWrapper([[{"a": 1}, {"b": 2, "a": 1}], [{"a": 1, "b": 200}, {"b": 2, "c": 3, "a": 100}]])
        out = list(dp.rows2columnar())
        assert all(type(d) is defaultdict for d in out)
        assert out == [{"a": [1, 1], "b": [2]}, {"a": [1, 100], "b": [200, 2], "c": [3]}]
        assert list(dp.rows2columnar(column_names=["a"])) == [{"a": [1, 1]}, {"a": [1, 100]}]
        names = ["1st_in_batch", "2nd_in_batch", "3rd_in_batch", "4th_in_batch"]
        assert list(IterableWrapper([[[0, 1, 2, 3], [4, 5, 6, 7]]]).rows2columnar(column_names=names)) == [
            {"1st_in_batch": [0, 4], "2nd_in_batch": [1, 5], "3rd_in_batch": [2, 6], "4th_in_batch": [3, 7]}]

    def test_missing_key_and_long_rows(self):
        with pytest.raises(KeyError) as info:
            list(IterableWrapper([[{"a": 1}], [{"b": 2}]]).rows2columnar(["a"]))
        assert "Rows2Columnar" in notes(info.value) and "batch 1" in notes(info.value)
        with pytest.raises(IndexError, match="row 1 has more than 2 values.*list index out of range"):
            list(IterableWrapper([[[1, 2], [3, 4, 5]]]).rows2columnar(["a", "b"]))
        with pytest.raises(IndexError, match="more than 0 values"):
            list(IterableWrapper([[[1]]]).rows2columnar())

    def test_arguments_and_len(self):
        with pytest.raises(TypeError, match="Rows2Columnar: column_names must be a list"):
            IterableWrapper([]).rows2columnar("ab")
        assert len(IterableWrapper([[{"a": 1}]] * 3).rows2columnar()) == 3

    def test_contract_and_resume(self):
        batches = [[{"a": i, "b": -i}, {"a": i + 1}] for i in range(6)]
        check_datapipe(IterableWrapper(batches).rows2columnar(), build=lambda src: src.batch(2).rows2columnar(["x", "y"]),
                       probe_data=[[1, 2], [3, 4], [5, 6]])
        check_resume(lambda: IterableWrapper(batches).rows2columnar(("a",)), EVERY_K)
