"""Serial Mapper, Filter and FlatMapper (the concurrent map is tested in tests/engine/)."""

import traceback

import pytest

from datapipes.iter import Filter, FlatMapper, IterableWrapper, Mapper
from datapipes.testing import check_datapipe

from helpers import Boom, fail_at


class TestMapper:
    def test_contract(self):
        check_datapipe(IterableWrapper(range(20)).map(lambda x: x * x), expected=[x * x for x in range(20)],
                       build=lambda src: src.map(lambda x: x))

    def test_len_and_empty(self):
        assert len(IterableWrapper(range(7)).map(str)) == 7
        check_datapipe(IterableWrapper([]).map(str), expected=[])

    def test_none_is_a_valid_result(self):
        assert list(IterableWrapper([1, 2]).map(lambda x: None)) == [None, None]

    def test_same_exception_object_with_note(self):
        pipe = IterableWrapper(range(10)).map(fail_at(4))
        with pytest.raises(Boom) as info:
            list(pipe)
        e = info.value
        assert e.args == (4, "custom") and e.code == 4
        assert e.__notes__ == ["[datapipes] raised in stage Mapper(fn) at item 4"]
        frames = [f.name for f in traceback.extract_tb(e.__traceback__)]
        assert frames[-1] == "fn"  # the traceback still reaches the user's function

    def test_source_error_gets_no_mapper_note(self):
        def gen():
            yield 1
            raise Boom(0, "source")

        with pytest.raises(Boom) as info:
            list(IterableWrapper(gen()).map(str))
        assert not getattr(info.value, "__notes__", [])

    def test_skip_counts(self):
        pipe = IterableWrapper(range(10)).map(fail_at(3), on_error="skip")
        assert list(pipe) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
        assert pipe.failures.count == 1 and pipe.failures.recent[0].position == 3
        list(pipe)
        assert pipe.failures.count == 2  # counted across passes

    def test_skip_budget(self):
        pipe = IterableWrapper([0, 1, 0, 0, 2]).map(lambda x: 1 // x, on_error="skip", max_failures=2)
        with pytest.raises(ExceptionGroup) as info:
            list(pipe)
        assert len(info.value.exceptions) == 3
        assert all(isinstance(e, ZeroDivisionError) for e in info.value.exceptions)
        assert "Mapper(<lambda>)" in str(info.value)

    def test_keyboard_interrupt_is_not_skipped(self):
        def fn(x):
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            list(IterableWrapper([1]).map(fn, on_error="skip"))

    def test_columns_tuple_and_dict(self):
        data = [(1, 2, 3), (4, 5, 6)]
        src = IterableWrapper(data)
        assert list(src.map(lambda x: -x, input_col=0)) == [(-1, 2, 3), (-4, 5, 6)]
        assert list(src.map(lambda a, b: a + b, input_col=[0, 2])) == [(4, 2), (10, 5)]
        assert list(src.map(lambda x: -x, input_col=1, output_col=-1)) == [(1, 2, 3, -2), (4, 5, 6, -5)]
        assert list(src.map(lambda x: -x, input_col=1, output_col=0)) == [(-2, 2, 3), (-5, 5, 6)]
        assert data == [(1, 2, 3), (4, 5, 6)]
        rows = [{"a": 1, "b": 2}]
        out = list(IterableWrapper(rows).map(str, input_col="a", output_col="s"))
        assert out == [{"a": 1, "b": 2, "s": "1"}] and rows == [{"a": 1, "b": 2}]
        assert list(IterableWrapper([[1, 2]]).map(str, input_col=[0])) == [["1", 2]]

    def test_missing_column_gets_note(self):
        with pytest.raises(KeyError) as info:
            list(IterableWrapper([{"a": 1}]).map(str, input_col="b"))
        assert "at item 0" in info.value.__notes__[0]

    @pytest.mark.parametrize(
        "kwargs, err, match",
        [
            ({"fn": 3}, TypeError, "Mapper: fn must be callable, got int"),
            ({"fn": str, "output_col": 1}, ValueError,
             r"^Mapper\(output_col=1\): `output_col` must be None when `input_col` is None\.$"),
            ({"fn": str, "input_col": 0, "output_col": [1, 2]}, ValueError,
             r"^Mapper\(output_col=\[1, 2\]\): `output_col` must be a single-element list or tuple$"),
            ({"fn": str, "input_col": 0, "output_col": []}, ValueError, "output_col must name one column"),
            ({"fn": str, "input_col": []}, ValueError, "input_col must name at least one column"),
            ({"fn": str, "on_error": "ignore"}, ValueError, "on_error must be 'raise' or 'skip'"),
        ],
    )
    def test_bad_arguments(self, kwargs, err, match):
        with pytest.raises(err, match=match):
            Mapper(IterableWrapper([]), **kwargs)

    def test_non_pipe_source(self):
        with pytest.raises(TypeError, match="Mapper: datapipe must be an IterDataPipe, got list"):
            Mapper([1, 2], str)

    def test_non_iterable_source(self):
        with pytest.raises(TypeError, match="IterableWrapper: iterable must be iterable, got int"):
            IterableWrapper(5)


class TestFilter:
    def test_contract(self):
        check_datapipe(IterableWrapper(range(20)).filter(lambda x: x % 3 == 0), expected=[0, 3, 6, 9, 12, 15, 18],
                       build=lambda src: src.filter(lambda x: True))

    def test_len_unknown(self):
        with pytest.raises(TypeError, match=r"Filter\(bool\) has no len\(\)"):
            len(IterableWrapper([1]).filter(bool))

    def test_input_col(self):
        assert list(IterableWrapper([(1, 0), (2, 1)]).filter(bool, input_col=1)) == [(2, 1)]
        # several columns go to filter_fn as positional arguments, as torch passes them
        pipe = IterableWrapper([(1, 0, 5), (2, 1, 0)]).filter(lambda a, c: a < c, input_col=[0, 2])
        assert list(pipe) == [(1, 0, 5)]
        with pytest.raises(ValueError, match="Filter: The function <lambda> takes 1 parameters, but 2 are required"):
            Filter(IterableWrapper([]), lambda a: True, input_col=[0, 1])

    def test_error_note_and_skip(self):
        failing = fail_at(2)

        def fn(x):
            return failing(x) != 0

        with pytest.raises(Boom) as info:
            list(IterableWrapper(range(5)).filter(fn))
        assert info.value.__notes__ == ["[datapipes] raised in stage Filter(fn) at item 2"]
        pipe = IterableWrapper(range(5)).filter(fn, on_error="skip")
        assert list(pipe) == [1, 3, 4] and pipe.failures.count == 1

    def test_bad_arguments(self):
        with pytest.raises(TypeError, match="Filter: filter_fn must be callable"):
            Filter(IterableWrapper([]), None)
        check_datapipe(IterableWrapper([]).filter(bool), expected=[])


class TestFlatMapper:
    def test_contract(self):
        check_datapipe(IterableWrapper([1, 2, 3]).flatmap(lambda x: range(x)), expected=[0, 0, 1, 0, 1, 2],
                       build=lambda src: src.flatmap(lambda x: [x, x]))

    def test_flatten_without_fn_and_columns(self):
        assert list(IterableWrapper([[1, 2], [], [3]]).flatmap()) == [1, 2, 3]
        assert list(IterableWrapper([("ab", 1)]).flatmap(list, input_col=0)) == ["a", "b"]
        # no fn: the column is flattened, several columns give their values in order (torchdata's no-op fn)
        assert list(IterableWrapper([("ab", 1)]).flatmap(input_col=0)) == ["a", "b"]
        assert list(FlatMapper(IterableWrapper([(1, 2, 3)]), None, input_col=[2, 0])) == [3, 1]
        with pytest.raises(ValueError, match="FlatMapper: input_col must name at least one column"):
            FlatMapper(IterableWrapper([]), None, input_col=[])

    def test_len_unknown(self):
        with pytest.raises(TypeError, match="FlatMapper"):
            len(IterableWrapper([[1]]).flatmap())

    def test_error_inside_result_iteration(self):
        def gen(x):
            yield x
            if x == 2:
                raise Boom(x, "mid")
            yield -x

        with pytest.raises(Boom) as info:
            list(IterableWrapper([1, 2, 3]).flatmap(gen))
        assert info.value.__notes__ == ["[datapipes] raised in stage FlatMapper(gen) at item 1"]
        pipe = IterableWrapper([1, 2, 3]).flatmap(gen, on_error="skip")
        assert list(pipe) == [1, -1, 2, 3, -3] and pipe.failures.count == 1

    def test_bad_fn(self):
        with pytest.raises(TypeError, match="FlatMapper: fn must be callable"):
            FlatMapper(IterableWrapper([]), 5)
        check_datapipe(IterableWrapper([]).flatmap(), expected=[])
