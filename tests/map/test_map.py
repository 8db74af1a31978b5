"""Map-style pipes: SequenceWrapper, Mapper, Batcher, Concater, Zipper, Shuffler, IterToMapConverter,
MapToIterConverter (``to_iter_datapipe``)."""

import copy
import pickle
import threading
import time
import traceback
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import datapipes.map as dmap
from datapipes import IterDataPipe, MapDataPipe
from datapipes._runtime import passes as _pass
from datapipes.iter import IterableWrapper
from datapipes.map import (
    Batcher,
    Concater,
    IterToMapConverter,
    Mapper,
    MapToIterConverter,
    SequenceWrapper,
    Shuffler,
    Zipper,
)
from datapipes.testing import check_datapipe

from helpers import Boom, fail_at


class Indexable:
    """A sequence-like object with only ``__getitem__`` and ``__len__`` (no ``__iter__``), whose
    ``__getitem__`` answers past its length too (like a dataset that wraps its index)."""

    def __init__(self, n):
        self.n = n

    def __getitem__(self, i):
        return (i % self.n) * 10

    def __len__(self):
        return self.n


class FailingMap(MapDataPipe):
    """A map-style source whose reads fail with the same Boom object."""

    def __init__(self):
        self.error = Boom(0, "source")

    def __getitem__(self, index):
        raise self.error

    def __len__(self):
        return 3


READS = {"count": 0}


class CountingIterable:
    """Re-iterable; counts its passes in READS (module level, so pickled copies count too)."""

    def __init__(self, pairs, delay=0.0):
        self.pairs = pairs
        self.delay = delay

    def __iter__(self):
        READS["count"] += 1
        for p in self.pairs:
            if self.delay:
                time.sleep(self.delay)
            yield p


def as_list_by_index(pipe):
    return [pipe[i] for i in range(len(pipe))]


class TestRegistry:
    def test_functional_names_on_each_base(self):
        assert {"map", "batch", "concat", "zip", "shuffle", "to_iter_datapipe"} <= set(MapDataPipe._functions)
        assert MapDataPipe._functions["map"] is Mapper
        assert MapDataPipe._functions["shuffle"] is Shuffler
        assert MapDataPipe._functions["to_iter_datapipe"] is MapToIterConverter
        assert IterDataPipe._functions["to_map_datapipe"] is IterToMapConverter
        assert "to_map_datapipe" not in MapDataPipe._functions
        assert "to_iter_datapipe" not in IterDataPipe._functions

    def test_functional_form_equals_constructor(self):
        s = SequenceWrapper(range(6))
        assert type(s.map(str)) is Mapper and list(s.map(str)) == list(Mapper(s, str))
        assert type(s.batch(2)) is Batcher and type(s.concat(s)) is Concater and type(s.zip(s)) is Zipper
        assert type(s.shuffle()) is Shuffler and type(s.to_iter_datapipe()) is MapToIterConverter
        assert type(IterableWrapper([(1, 2)]).to_map_datapipe()) is IterToMapConverter

    def test_all_exports(self):
        assert set(dmap.__all__) == {
            "Batcher", "Concater", "InMemoryCacheHolder", "IterToMapConverter", "MapDataPipe",
            "MapToIterConverter", "Mapper", "SequenceWrapper", "Shuffler", "UnZipper", "Zipper",
        }

    def test_repr_and_graph(self):
        s = SequenceWrapper(range(4))
        assert repr(s.map(abs).batch(2)) == "SequenceWrapper -> Mapper(abs) -> Batcher(2)"
        assert repr(s.concat(s.zip(s))) == "Concater[SequenceWrapper | Zipper[SequenceWrapper | SequenceWrapper]]"
        assert repr(IterableWrapper([]).to_map_datapipe().to_iter_datapipe()) == (
            "IterableWrapper -> IterToMapConverter -> MapToIterConverter"
        )

    def test_bool_never_calls_len(self):
        assert bool(FailingMap().map(str)) is True
        assert bool(IterableWrapper(iter([1])).to_map_datapipe()) is True


class TestSequenceWrapper:
    def test_contract(self):
        check_datapipe(SequenceWrapper(range(5)), expected=[0, 1, 2, 3, 4])
        check_datapipe(SequenceWrapper(["a", "b"]), expected=["a", "b"])
        check_datapipe(SequenceWrapper((1, None, 3)), expected=[1, None, 3])

    def test_indexing_follows_the_sequence(self):
        pipe = SequenceWrapper([10, 20, 30])
        assert pipe[0] == 10 and pipe[2] == 30 and pipe[-1] == 30 and pipe[-3] == 10
        with pytest.raises(IndexError):
            pipe[3]
        with pytest.raises(IndexError):
            pipe[-4]

    @pytest.mark.parametrize("sequence", [[10, 20, 30], (10, 20, 30), range(3), np.arange(3), torch.arange(3)])
    @pytest.mark.parametrize("index", [7, -4])
    def test_out_of_range_keeps_the_sequences_error_and_names_the_stage(self, sequence, index):
        with pytest.raises(IndexError, match="out of") as info:  # "out of range" / numpy's "out of bounds"
            SequenceWrapper(sequence)[index]
        try:
            sequence[index]
        except IndexError as plain:
            assert info.value.args == plain.args  # the sequence's own message, as torch passes it on
        assert info.value.__notes__ == [f"[datapipes] raised in stage SequenceWrapper at index {index}"]
        assert traceback.extract_tb(info.value.__traceback__)[-1].name == "__getitem__"

    def test_missing_key_names_the_stage(self):
        with pytest.raises(KeyError) as info:
            SequenceWrapper({"x": 1})["w"]
        assert info.value.args == ("w",)
        assert info.value.__notes__ == ["[datapipes] raised in stage SequenceWrapper at index 'w'"]
        with pytest.raises(IndexError) as info:
            SequenceWrapper(np.arange(3))[np.int64(5)]
        assert info.value.__notes__ == ["[datapipes] raised in stage SequenceWrapper at index 5"]

    def test_len_at_call_time(self):
        data = [1, 2]
        pipe = SequenceWrapper(data, deepcopy=False)
        assert len(pipe) == 2
        data.append(3)
        assert len(pipe) == 3 and list(pipe) == [1, 2, 3] and pipe[2] == 3

    def test_deepcopy_detaches_from_the_original(self):
        data = [[1], [2]]
        copied = SequenceWrapper(data)  # deepcopy=True by default, as torch's
        shared = SequenceWrapper(data, deepcopy=False)
        data[0].append(99)
        data.append([3])
        assert list(copied) == [[1], [2]] and len(copied) == 2
        assert list(shared) == [[1, 99], [2], [3]]

    def test_deepcopy_failure_warns_and_shares(self):
        class NoCopy(Indexable):
            def __deepcopy__(self, memo):
                raise TypeError("no deep copies here")

        source = NoCopy(3)
        with pytest.warns(UserWarning, match="SequenceWrapper: the NoCopy cannot be deep-copied"):
            pipe = SequenceWrapper(source, deepcopy=True)
        assert pipe.sequence is source and list(pipe) == [0, 10, 20]

    def test_mapping_is_keyed(self):
        pipe = SequenceWrapper({"x": 1, "y": 2, "z": None})
        assert pipe["y"] == 2 and pipe["z"] is None and len(pipe) == 3
        with pytest.raises(KeyError):
            pipe["w"]
        check_datapipe(pipe, expected=[1, 2, None])

    def test_indexable_without_iter_stops_at_len(self):
        pipe = SequenceWrapper(Indexable(4))
        check_datapipe(pipe, expected=[0, 10, 20, 30])
        assert pipe[5] == 10  # the object's own rule, passed through

    def test_numpy_and_tensor(self):
        check_datapipe(SequenceWrapper(np.arange(4) * 2), expected=[0, 2, 4, 6])
        pipe = SequenceWrapper(torch.arange(3))
        assert [int(x) for x in pipe] == [0, 1, 2] and int(pipe[-1]) == 2

    def test_pickle_with_lambda_downstream(self):
        pipe = SequenceWrapper(list(range(5))).map(lambda x: x + 100)
        clone = pickle.loads(pickle.dumps(pipe))
        assert list(clone) == [100, 101, 102, 103, 104] and clone[4] == 104

    def test_torch_dataloader_reads_by_index(self):
        pipe = SequenceWrapper(list(range(10))).map(lambda x: x * 2)
        batches = list(torch.utils.data.DataLoader(pipe, batch_size=4))
        assert [b.tolist() for b in batches] == [[0, 2, 4, 6], [8, 10, 12, 14], [16, 18]]

    @pytest.mark.parametrize("bad", [5, None, (x for x in range(3)), {1, 2}])
    def test_bad_sequence(self, bad):
        with pytest.raises(TypeError, match=r"SequenceWrapper: sequence must support indexing and len\(\), got "):
            SequenceWrapper(bad)

    def test_empty(self):
        pipe = SequenceWrapper([])
        check_datapipe(pipe, expected=[])
        with pytest.raises(IndexError):
            pipe[0]


class TestMapper:
    def test_contract(self):
        check_datapipe(SequenceWrapper(range(20)).map(lambda x: x * x), expected=[x * x for x in range(20)])

    def test_indexing_and_iteration_agree(self):
        pipe = SequenceWrapper(range(7)).map(lambda x: -x)
        assert pipe[3] == -3 and pipe[-1] == -6
        assert list(pipe) == as_list_by_index(pipe) == [0, -1, -2, -3, -4, -5, -6]

    def test_fn_runs_on_every_access(self):
        calls = []
        pipe = SequenceWrapper([1, 2]).map(lambda x: calls.append(x) or x)
        pipe[0], pipe[0], list(pipe)
        assert calls == [1, 1, 1, 2]

    def test_none_is_a_valid_result(self):
        pipe = SequenceWrapper([1, 2]).map(lambda x: None)
        assert list(pipe) == [None, None] and pipe[1] is None

    def test_same_exception_object_with_index_note(self):
        pipe = SequenceWrapper(range(10)).map(fail_at(4))
        with pytest.raises(Boom) as info:
            pipe[4]
        e = info.value
        assert e.args == (4, "custom") and e.code == 4
        assert e.__notes__ == ["[datapipes] raised in stage Mapper(fn) at index 4"]
        assert traceback.extract_tb(e.__traceback__)[-1].name == "fn"

    def test_failure_while_iterating_names_the_index(self):
        pipe = SequenceWrapper(range(10)).map(fail_at(6))
        with pytest.raises(Boom) as info:
            list(pipe)
        assert info.value.__notes__ == ["[datapipes] raised in stage Mapper(fn) at index 6"]
        assert traceback.extract_tb(info.value.__traceback__)[-1].name == "fn"

    def test_keyed_source(self):
        pipe = SequenceWrapper({"a": 1, "b": 2}).map(lambda x: x * 10)
        assert pipe["b"] == 20 and list(pipe) == [10, 20]
        bad = SequenceWrapper({"a": 0}).map(lambda x: 1 // x)
        with pytest.raises(ZeroDivisionError) as info:
            bad["a"]
        assert info.value.__notes__ == ["[datapipes] raised in stage Mapper(<lambda>) at index 'a'"]

    def test_source_errors_pass_through_with_the_sources_note_only(self):
        source = FailingMap()
        with pytest.raises(Boom) as info:
            source.map(str)[1]
        assert info.value is source.error and not getattr(info.value, "__notes__", [])
        with pytest.raises(IndexError, match="list index out of range") as info2:
            SequenceWrapper([1]).map(str)[5]
        assert info2.value.__notes__ == ["[datapipes] raised in stage SequenceWrapper at index 5"]
        with pytest.raises(KeyError) as info3:
            SequenceWrapper({"a": 1}).map(str).map(str)["b"]
        assert info3.value.__notes__ == ["[datapipes] raised in stage SequenceWrapper at index 'b'"]

    def test_columns(self):
        rows = SequenceWrapper([(1, 2, 3), (4, 5, 6)])
        assert rows.map(lambda x: x * 10, input_col=1)[0] == (1, 20, 3)
        assert rows.map(lambda a, b: a + b, input_col=[0, 2])[1] == (10, 5)
        assert rows.map(lambda x: -x, input_col=0, output_col=-1)[0] == (1, 2, 3, -1)
        data = [{"a": 1, "b": 2}]
        dicts = SequenceWrapper(data).map(lambda x: x + 1, input_col="a", output_col="c")
        assert list(dicts) == [{"a": 1, "b": 2, "c": 2}]
        assert data == [{"a": 1, "b": 2}]  # not mutated
        check_datapipe(rows.map(lambda x: x * 10, input_col=1), expected=[(1, 20, 3), (4, 50, 6)])

    def test_len_at_call_time(self):
        data = [1]
        pipe = SequenceWrapper(data, deepcopy=False).map(str)
        data.extend([2, 3])
        assert len(pipe) == 3 and list(pipe) == ["1", "2", "3"]

    def test_keyword_call_as_torch(self):
        pipe = Mapper(datapipe=SequenceWrapper([1, 2]), fn=lambda x: x + 1, input_col=None, output_col=None)
        assert list(pipe) == [2, 3]

    def test_bad_arguments(self):
        with pytest.raises(TypeError, match="Mapper: datapipe must be a MapDataPipe, got IterableWrapper"):
            Mapper(IterableWrapper([1]), str)
        with pytest.raises(TypeError, match="Mapper: fn must be callable, got int"):
            SequenceWrapper([1]).map(3)
        with pytest.raises(ValueError, match=r"^Mapper\(output_col=1\): `output_col` must be None when `input_col` is None\.$"):
            SequenceWrapper([1]).map(str, output_col=1)
        with pytest.raises(ValueError, match="Mapper: input_col must name at least one column"):
            SequenceWrapper([1]).map(str, input_col=[])

    def test_empty(self):
        check_datapipe(SequenceWrapper([]).map(str), expected=[])
        assert len(SequenceWrapper([]).map(str)) == 0


class TestBatcher:
    def test_contract(self):
        check_datapipe(SequenceWrapper(range(7)).batch(3), expected=[[0, 1, 2], [3, 4, 5], [6]])
        check_datapipe(SequenceWrapper(range(7)).batch(3, drop_last=True), expected=[[0, 1, 2], [3, 4, 5]])
        check_datapipe(SequenceWrapper(range(5)).batch(2, wrapper_class=tuple), expected=[(0, 1), (2, 3), (4,)])

    def test_indexing(self):
        pipe = SequenceWrapper(range(10)).batch(4)
        assert pipe[0] == [0, 1, 2, 3] and pipe[2] == [8, 9] and pipe[-1] == [8, 9] and pipe[-3] == [0, 1, 2, 3]
        assert pipe[np.int64(1)] == [4, 5, 6, 7]
        with pytest.raises(IndexError) as info:
            pipe[3]
        assert str(info.value) == "Batcher(4) (length 3): Index 3 is out of bound."  # torch's words at the end
        with pytest.raises(IndexError, match=r"^Batcher\(4\) \(length 3\): Index -4 is out of bound\.$"):
            pipe[-4]
        with pytest.raises(TypeError, match=r"Batcher\(4\): index must be an int, got str"):
            pipe["1"]
        with pytest.raises(TypeError, match=r"Batcher\(4\): index must be an int, got slice"):
            pipe[0:2]
        dropped = SequenceWrapper(range(10)).batch(4, drop_last=True)
        assert dropped[-1] == [4, 5, 6, 7]
        with pytest.raises(IndexError, match=r"^Batcher\(4\) \(length 2\): Index 2 is out of bound\.$"):
            dropped[2]

    @pytest.mark.parametrize("n", [0, 1, 5, 8, 9])
    @pytest.mark.parametrize("bs", [1, 3, 4, 10])
    @pytest.mark.parametrize("drop_last", [False, True])
    @pytest.mark.parametrize("wrapper_class", [list, tuple])
    def test_iteration_equals_indexing_and_len(self, n, bs, drop_last, wrapper_class):
        pipe = SequenceWrapper(list(range(n))).batch(bs, drop_last=drop_last, wrapper_class=wrapper_class)
        items = list(pipe)
        assert items == as_list_by_index(pipe)
        assert len(pipe) == len(items) == (n // bs if drop_last else -(-n // bs))
        flat = [x for b in items for x in b]
        assert flat == list(range(len(flat))) and all(type(b) is wrapper_class for b in items)

    def test_default_batch_is_a_data_chunk_as_in_torch(self):
        from datapipes import DataChunk

        pipe = SequenceWrapper([1, 2, 3]).batch(2)
        assert type(pipe[0]) is DataChunk and type(next(iter(pipe))) is DataChunk and pipe[1] == [3]
        plain = SequenceWrapper([1, 2, 3]).batch(2, wrapper_class=list)
        assert type(plain[0]) is list and type(next(iter(plain))) is list

    def test_len_at_call_time(self):
        data = [1, 2, 3]
        pipe = SequenceWrapper(data, deepcopy=False).batch(2)
        assert len(pipe) == 2
        data.extend([4, 5])
        assert len(pipe) == 3 and pipe[2] == [5]

    def test_wrapper_failure_same_object_with_note(self):
        error = Boom(1, "wrap")

        def wrap(batch):
            if batch[0] == 2:
                raise error
            return tuple(batch)

        pipe = SequenceWrapper(range(5)).batch(2, wrapper_class=wrap)
        with pytest.raises(Boom) as info:
            pipe[1]
        assert info.value is error and "[datapipes] raised in stage Batcher(2) at index 1" in error.__notes__
        error.__notes__.clear()
        with pytest.raises(Boom) as info:
            list(pipe)
        assert info.value is error and error.__notes__ == ["[datapipes] raised in stage Batcher(2) at index 1"]

    def test_source_errors_pass_through(self):
        source = FailingMap()
        with pytest.raises(Boom) as info:
            source.batch(2)[0]
        assert info.value is source.error
        with pytest.raises(Boom) as info:
            list(SequenceWrapper(range(6)).map(fail_at(3)).batch(2))
        assert info.value.__notes__ == ["[datapipes] raised in stage Mapper(fn) at index 3"]

    def test_bad_arguments(self):
        s = SequenceWrapper([1])
        with pytest.raises(ValueError, match=r"^Batcher\(batch_size=0\): Batch size is required to be larger than 0!$"):
            s.batch(0)
        with pytest.raises(TypeError, match="Batcher: batch_size must be an int, got str"):
            s.batch("2")
        with pytest.raises(TypeError, match="Batcher: batch_size must be an int, got bool"):
            s.batch(True)
        with pytest.raises(TypeError, match="Batcher: drop_last must be a bool, got str"):
            s.batch(2, drop_last="yes")
        with pytest.raises(TypeError, match="Batcher: wrapper_class must be callable, got int"):
            s.batch(2, wrapper_class=3)
        with pytest.raises(TypeError, match="Batcher: datapipe must be a MapDataPipe, got list"):
            Batcher([1, 2], 2)

    def test_keyword_call_as_torch(self):
        pipe = Batcher(datapipe=SequenceWrapper(range(5)), batch_size=2, drop_last=True, wrapper_class=list)
        assert list(pipe) == [[0, 1], [2, 3]]

    def test_empty(self):
        pipe = SequenceWrapper([]).batch(3)
        check_datapipe(pipe, expected=[])
        with pytest.raises(IndexError):
            pipe[0]


class TestConcater:
    def test_contract(self):
        pipe = SequenceWrapper([1, 2]).concat(SequenceWrapper([]), SequenceWrapper([3, 4, 5]))
        check_datapipe(pipe, expected=[1, 2, 3, 4, 5])

    def test_indexing_across_sources(self):
        pipe = Concater(SequenceWrapper("ab"), SequenceWrapper(""), SequenceWrapper("cde"))
        assert [pipe[i] for i in range(5)] == list("abcde") == list(pipe)
        assert pipe[-1] == "e" and pipe[-5] == "a" and pipe[2] == "c"
        with pytest.raises(IndexError) as info:
            pipe[5]
        assert str(info.value) == "Concater (length 5): Index 5 is out of range."  # torch's words at the end
        with pytest.raises(IndexError, match=r"^Concater \(length 5\): Index -6 is out of range\.$"):
            pipe[-6]
        with pytest.raises(TypeError, match="Concater: index must be an int, got float"):
            pipe[1.0]

    def test_len_at_call_time(self):
        a, b = [1], [2]
        pipe = SequenceWrapper(a, deepcopy=False).concat(SequenceWrapper(b, deepcopy=False))
        a.append(10)
        b.append(20)
        assert len(pipe) == 4 and pipe[2] == 2 and list(pipe) == [1, 10, 2, 20]

    def test_single_source_and_nesting(self):
        s = SequenceWrapper([1, 2])
        assert list(Concater(s)) == [1, 2]
        nested = s.concat(s.map(lambda x: -x)).concat(s)
        check_datapipe(nested, expected=[1, 2, -1, -2, 1, 2])
        assert as_list_by_index(nested) == list(nested)

    def test_errors_pass_through(self):
        source = FailingMap()
        with pytest.raises(Boom) as info:
            SequenceWrapper([1]).concat(source)[1]
        assert info.value is source.error
        with pytest.raises(Boom) as info:
            list(SequenceWrapper([1]).concat(source))
        assert info.value is source.error

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="Concater: Expected at least one DataPipe, but got nothing"):
            Concater()
        with pytest.raises(TypeError, match=r"Concater: datapipes\[1\] is of type IterableWrapper: Expected all inputs to be `MapDataPipe`"):
            SequenceWrapper([1]).concat(IterableWrapper([2]))

    def test_empty(self):
        pipe = SequenceWrapper([]).concat(SequenceWrapper([]))
        check_datapipe(pipe, expected=[])
        with pytest.raises(IndexError):
            pipe[0]

    @given(st.lists(st.lists(st.integers(), max_size=5), min_size=1, max_size=4))
    def test_law_like_itertools_chain(self, parts):
        pipe = Concater(*[SequenceWrapper(p) for p in parts])
        flat = [x for p in parts for x in p]
        assert list(pipe) == flat == as_list_by_index(pipe) and len(pipe) == len(flat)


class TestZipper:
    def test_contract(self):
        pipe = SequenceWrapper([1, 2, 3]).zip(SequenceWrapper("abcd"), SequenceWrapper([None, None, None]))
        check_datapipe(pipe, expected=[(1, "a", None), (2, "b", None), (3, "c", None)])

    def test_indexing_uses_the_zipped_length(self):
        pipe = Zipper(SequenceWrapper([1, 2, 3]), SequenceWrapper("ab"))
        assert pipe[0] == (1, "a") and pipe[-1] == (2, "b") and pipe[-2] == (1, "a")
        with pytest.raises(IndexError) as info:
            pipe[2]
        # torch's words at the end, naming the shortest source as torch names the one that failed
        assert str(info.value) == ("Zipper (length 2): Index 2 is out of range for one of the input "
                                   "MapDataPipes SequenceWrapper.")
        with pytest.raises(IndexError, match=r"^Zipper \(length 2\): Index -3 is out of range for one"):
            pipe[-3]
        longer_last = Zipper(SequenceWrapper("ab"), SequenceWrapper([1, 2, 3]).map(str))
        with pytest.raises(IndexError, match=r"MapDataPipes SequenceWrapper\.$"):
            longer_last[5]
        shorter_last = Zipper(SequenceWrapper("abc"), SequenceWrapper([1]).map(str))
        with pytest.raises(IndexError, match=r"MapDataPipes SequenceWrapper -> Mapper\(str\)\.$"):
            shorter_last[5]
        with pytest.raises(TypeError, match="Zipper: index must be an int, got NoneType"):
            pipe[None]

    def test_iteration_reads_nothing_past_the_shortest(self):
        longer = SequenceWrapper(range(5)).map(fail_at(2))  # index 2 exists only in the longer source
        pipe = longer.zip(SequenceWrapper("ab"))
        assert list(pipe) == [(0, "a"), (1, "b")] == as_list_by_index(pipe)
        check_datapipe(pipe)
        assert list(SequenceWrapper("ab").zip(longer)) == [("a", 0), ("b", 1)]

    def test_len_at_call_time(self):
        a = [1]
        pipe = SequenceWrapper(a, deepcopy=False).zip(SequenceWrapper("xyz"))
        assert len(pipe) == 1
        a.extend([2, 3, 4])
        assert len(pipe) == 3 and pipe[2] == (3, "z")

    def test_single_source(self):
        assert list(SequenceWrapper([1, 2]).zip()) == [(1,), (2,)]

    def test_errors_pass_through(self):
        source = FailingMap()
        with pytest.raises(Boom) as info:
            SequenceWrapper([1, 2]).zip(source)[0]
        assert info.value is source.error
        with pytest.raises(Boom) as info:
            list(source.zip(SequenceWrapper([1, 2])))
        assert info.value is source.error

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="Zipper: Expected at least one DataPipe, but got nothing"):
            Zipper()
        with pytest.raises(TypeError, match=r"Zipper: datapipes\[0\] is of type list: Expected all inputs to be `MapDataPipe`"):
            Zipper([1], SequenceWrapper([1]))

    def test_empty(self):
        pipe = SequenceWrapper([]).zip(SequenceWrapper([1, 2]))
        check_datapipe(pipe, expected=[])
        with pytest.raises(IndexError):
            pipe[0]

    @given(st.lists(st.lists(st.integers(), max_size=5), min_size=1, max_size=4))
    def test_law_like_builtin_zip(self, parts):
        pipe = Zipper(*[SequenceWrapper(p) for p in parts])
        want = list(zip(*parts))
        assert list(pipe) == want == as_list_by_index(pipe) and len(pipe) == len(want)


class TestShuffler:
    def test_contract(self):
        pipe = SequenceWrapper(range(30)).shuffle()
        assert isinstance(pipe, IterDataPipe) and not isinstance(pipe, MapDataPipe)
        check_datapipe(pipe, expected=range(30), ordered=False)
        seeded = SequenceWrapper(range(30)).shuffle().set_seed(7)
        first = check_datapipe(seeded)
        assert sorted(first) == list(range(30)) and first != list(range(30))

    def test_same_seed_same_order_and_epochs_reshuffle(self):
        def make():
            return SequenceWrapper(list(range(50))).shuffle()

        a, b = make().set_seed(1), make().set_seed(1)
        assert list(a) == list(a) == list(b)
        assert list(make().set_seed(2)) != list(a)
        epoch0 = list(a)
        a.set_epoch(1)
        epoch1 = list(a)
        assert epoch1 != epoch0 and sorted(epoch1) == sorted(epoch0)
        a.set_epoch(0)
        assert list(a) == epoch0

    def test_unseeded_draws_from_torch(self):
        pipe = SequenceWrapper(list(range(50))).shuffle()
        torch.manual_seed(123)
        first = list(pipe)
        torch.manual_seed(123)
        assert list(pipe) == first
        assert list(pipe) != first  # a fresh draw per pass

    def test_order_is_drawn_when_the_pass_starts(self):
        pipe = SequenceWrapper(list(range(50))).shuffle()
        torch.manual_seed(5)
        it = iter(pipe)
        torch.manual_seed(6)
        started = list(it)
        torch.manual_seed(5)
        assert list(pipe) == started

    def test_seed_reaches_it_through_iter_stages(self):
        def make():
            return SequenceWrapper(list(range(40))).map(lambda x: x * 2).shuffle().map(lambda x: x + 1)

        assert list(make().set_seed(3)) == list(make().set_seed(3))

    def test_indices(self):
        keyed = SequenceWrapper({"a": 1, "b": 2, "c": 3})
        pipe = keyed.shuffle(indices=["a", "c"])
        assert sorted(pipe) == [1, 3] and len(pipe) == 2
        subset = SequenceWrapper("abcdef").shuffle(indices=range(0, 6, 2))
        assert sorted(subset) == ["a", "c", "e"] and len(subset) == 3
        check_datapipe(subset, expected=["a", "c", "e"], ordered=False)

    def test_len_at_call_time(self):
        data = [1, 2]
        pipe = SequenceWrapper(data, deepcopy=False).shuffle()
        data.append(3)
        assert len(pipe) == 3 and sorted(pipe) == [1, 2, 3]

    def test_errors_pass_through(self):
        pipe = SequenceWrapper(range(5)).map(fail_at(3)).shuffle()
        with pytest.raises(Boom) as info:
            list(pipe)
        assert info.value.__notes__ == ["[datapipes] raised in stage Mapper(fn) at index 3"]
        with pytest.raises(IndexError, match="list index out of range") as info2:
            list(SequenceWrapper([1]).shuffle(indices=[0, 5]))
        assert info2.value.__notes__ == ["[datapipes] raised in stage SequenceWrapper at index 5"]

    def test_bad_arguments(self):
        with pytest.raises(TypeError, match="Shuffler: datapipe must be a MapDataPipe, got IterableWrapper"):
            Shuffler(IterableWrapper([1]))
        with pytest.raises(TypeError, match="Shuffler: indices must be a sized iterable of indices"):
            SequenceWrapper([1]).shuffle(indices=3)
        with pytest.raises(TypeError, match="Shuffler: indices must be a sized iterable of indices"):
            SequenceWrapper([1]).shuffle(indices="ab")
        with pytest.raises(TypeError):
            Shuffler(SequenceWrapper([1]), [0])  # indices is keyword-only, as in torch

    def test_empty(self):
        check_datapipe(SequenceWrapper([]).shuffle(), expected=[])
        check_datapipe(SequenceWrapper([1, 2]).shuffle(indices=[]), expected=[])


class TestIterToMapConverter:
    def test_contract(self):
        pipe = IterableWrapper([("a", 1), ("b", 2), ("c", None)]).to_map_datapipe()
        check_datapipe(pipe, expected=[1, 2, None])
        check_datapipe(pipe, build=lambda src: src.to_map_datapipe(), probe_data=[(0, "x"), (1, "y")])

    def test_lookup(self):
        pipe = IterableWrapper([(3, "c"), (1, "a")]).to_map_datapipe()
        assert pipe[1] == "a" and pipe[3] == "c" and len(pipe) == 2 and list(pipe) == ["c", "a"]
        with pytest.raises(IndexError, match=r"^IterToMapConverter \(2 keys\): Index 2 is invalid for IterToMapConverter\.$"):
            pipe[2]
        with pytest.raises(TypeError):
            pipe[[1]]
        none_key = IterableWrapper([(None, "n")]).to_map_datapipe()
        assert none_key[None] == "n"

    def test_key_value_fn(self):
        pipe = IterableWrapper(["apple", "kiwi"]).to_map_datapipe(lambda s: (s[0], len(s)))
        assert pipe["a"] == 5 and pipe["k"] == 4
        check_datapipe(pipe, expected=[5, 4])

    def test_lazy_and_loaded_once(self):
        READS["count"] = 0
        pipe = IterableWrapper(CountingIterable([("a", 1), ("b", 2)])).to_map_datapipe()
        assert READS["count"] == 0
        assert pipe["a"] == 1 and pipe["b"] == 2 and len(pipe) == 2 and list(pipe) == [1, 2]
        assert READS["count"] == 1

    def test_concurrent_first_reads_load_once(self):
        READS["count"] = 0
        pipe = IterableWrapper(CountingIterable([(i, i * i) for i in range(20)], delay=0.002)).to_map_datapipe()
        barrier = threading.Barrier(6, timeout=10)
        results = []

        def read(k):
            barrier.wait()
            results.append(pipe[k])

        threads = [threading.Thread(target=read, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        assert not any(t.is_alive() for t in threads)
        assert sorted(results) == [k * k for k in range(6)] and READS["count"] == 1

    def test_pickle_carries_the_loaded_map(self):
        READS["count"] = 0
        pipe = IterableWrapper(CountingIterable([("a", 1)])).to_map_datapipe(lambda kv: (kv[0], lambda: kv[1]))
        clone = pickle.loads(pickle.dumps(pipe))
        assert READS["count"] == 1  # loaded once, before pickling
        assert clone["a"]() == 1 and READS["count"] == 1
        twin = copy.deepcopy(pipe)
        assert twin["a"]() == 1 and READS["count"] == 1

    def test_duplicate_key_warns_and_later_value_wins(self):
        pipe = IterableWrapper([("a", 1), ("b", 2), ("a", 3)]).to_map_datapipe()
        with pytest.warns(UserWarning, match="^IterToMapConverter: Found duplicate key a at item 2, whose value replaces"):
            assert pipe["a"] == 3
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(pipe) == 2 and list(pipe) == [3, 2]  # loaded: no second warning

    def test_item_not_a_pair(self):
        with pytest.raises(TypeError, match="^IterToMapConverter: item 1: Cannot convert dictionary update element <class 'int'>"):
            IterableWrapper([("a", 1), 5]).to_map_datapipe()["a"]
        with pytest.raises(ValueError, match="^IterToMapConverter: item 0: dictionary update sequence element has length 3, "
                                             "2 is required$"):
            len(IterableWrapper([(1, 2, 3)]).to_map_datapipe())
        with pytest.raises(ValueError, match="key_value_fn's result for item 1: dictionary update sequence element has "
                                             "length 3"):
            list(IterableWrapper([1, 2]).to_map_datapipe(lambda x: (x,) * (x + 1)))
        with pytest.raises(TypeError, match="IterToMapConverter: the key of item 0 is unhashable: list"):
            IterableWrapper([([1], 2)]).to_map_datapipe()[0]

    def test_key_value_fn_failure_same_object_with_note(self):
        pipe = IterableWrapper(range(5)).to_map_datapipe(lambda x: (x, fail_at(3)(x)))
        with pytest.raises(Boom) as info:
            pipe[0]
        assert info.value.args == (3, "custom")
        assert info.value.__notes__ == ["[datapipes] raised in stage IterToMapConverter at item 3"]
        assert traceback.extract_tb(info.value.__traceback__)[-1].name == "fn"

    def test_source_error_passes_through_and_load_retries(self):
        error = Boom(0, "source")
        state = {"fail": True}

        class Flaky:
            def __iter__(self):
                yield ("a", 1)
                if state["fail"]:
                    state["fail"] = False
                    raise error
                yield ("b", 2)

        pipe = IterableWrapper(Flaky()).to_map_datapipe()
        with pytest.raises(Boom) as info:
            pipe["a"]
        assert info.value is error and not getattr(error, "__notes__", [])
        assert pipe["b"] == 2 and len(pipe) == 2

    def test_round_trip_through_to_iter_datapipe(self):
        pipe = IterableWrapper([("x", 1), ("y", 2)]).to_map_datapipe().map(lambda v: v * 10).to_iter_datapipe()
        check_datapipe(pipe, expected=[10, 20])
        keyed = IterableWrapper([("x", 1), ("y", 2)]).to_map_datapipe()
        assert list(keyed.to_iter_datapipe(indices=["y", "x"])) == [2, 1]

    def test_bad_arguments(self):
        with pytest.raises(TypeError, match="^IterToMapConverter can only apply on IterDataPipe, but found <class '.*SequenceWrapper'>$"):
            IterToMapConverter(SequenceWrapper([(1, 2)]))
        with pytest.raises(TypeError, match="IterToMapConverter: key_value_fn must be callable, got str"):
            IterableWrapper([(1, 2)]).to_map_datapipe("key")

    def test_empty(self):
        pipe = IterableWrapper([]).to_map_datapipe()
        check_datapipe(pipe, expected=[])
        with pytest.raises(IndexError):
            pipe[0]


class TestMapToIterConverter:
    def test_contract(self):
        pipe = SequenceWrapper(range(6)).to_iter_datapipe()
        assert isinstance(pipe, IterDataPipe) and not isinstance(pipe, MapDataPipe)
        check_datapipe(pipe, expected=range(6))
        check_datapipe(pipe, build=lambda src: src.to_map_datapipe().to_iter_datapipe(),
                       probe_data=[(0, "a"), (1, "b")])

    def test_chains_into_iter_stages(self):
        pipe = SequenceWrapper(range(10)).map(lambda x: x * 3).to_iter_datapipe().filter(lambda x: x % 2 == 0)
        assert list(pipe) == [0, 6, 12, 18, 24]

    def test_indices(self):
        pipe = SequenceWrapper("abcdef").to_iter_datapipe(indices=[5, 0, 0, -1])
        check_datapipe(pipe, expected=["f", "a", "a", "f"])
        assert len(SequenceWrapper("abc").to_iter_datapipe(indices=range(2))) == 2

    def test_len_at_call_time(self):
        data = [1]
        pipe = SequenceWrapper(data, deepcopy=False).to_iter_datapipe()
        data.append(2)
        assert len(pipe) == 2 and list(pipe) == [1, 2]

    def test_errors_pass_through(self):
        pipe = SequenceWrapper(range(5)).map(fail_at(2)).to_iter_datapipe()
        with pytest.raises(Boom) as info:
            list(pipe)
        assert info.value.__notes__ == ["[datapipes] raised in stage Mapper(fn) at index 2"]
        with pytest.raises(IndexError, match="list index out of range") as info2:
            list(SequenceWrapper([1]).to_iter_datapipe(indices=[3]))
        assert info2.value.__notes__ == ["[datapipes] raised in stage SequenceWrapper at index 3"]

    def test_bad_arguments(self):
        with pytest.raises(TypeError, match="^MapToIterConverter can only apply on MapDataPipe, but found <class '.*IterableWrapper'>$"):
            MapToIterConverter(IterableWrapper([1]))
        with pytest.raises(TypeError, match="MapToIterConverter: indices must be a sized iterable"):
            SequenceWrapper([1]).to_iter_datapipe(indices=iter([0]))

    def test_empty(self):
        check_datapipe(SequenceWrapper([]).to_iter_datapipe(), expected=[])
        check_datapipe(SequenceWrapper([1]).to_iter_datapipe(indices=[]), expected=[])


class TestPassBuilding:
    """The stages that turn a map-style pipe into an iterable-style one read their source by index,
    outside passes; a random one reads its seed when its pass starts (``iter()``)."""

    @pytest.mark.parametrize("build", [
        lambda: SequenceWrapper(range(6)).to_iter_datapipe().batch(2),
        lambda: SequenceWrapper(range(6)).to_iter_datapipe(indices=[5, 1, 3]).batch(2),
        lambda: SequenceWrapper(range(6)).map(str).shuffle().batch(2).set_seed(0),
        lambda: SequenceWrapper({"a": 1, "b": 2}).shuffle(indices=["b", "a"]).batch(2).set_seed(0),
    ], ids=["to_iter_datapipe", "to_iter_datapipe-indices", "shuffle", "shuffle-indices"])
    def test_pass_is_built_at_iter(self, build):
        pipe = build()
        it = iter(pipe)
        assert _pass.unbuilt(it) == [], _pass.unbuilt(it)
        assert list(it) == list(pipe)

    def test_interleaved_passes_keep_their_own_seeds(self):
        pipe = SequenceWrapper(range(40)).shuffle().set_seed(0)
        epoch0, epoch1 = list(pipe.set_epoch(0)), list(pipe.set_epoch(1))
        assert epoch0 != epoch1
        a = iter(pipe.set_epoch(0))
        b = iter(pipe.set_epoch(1))  # a second pass starts before the first one is read
        assert list(a) == epoch0 and list(b) == epoch1
