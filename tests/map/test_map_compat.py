"""Map-style InMemoryCacheHolder (``in_memory_cache``) and UnZipper (``unzip``), as in torchdata 0.9."""

import copy
import inspect
import pickle
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from datapipes import MapDataPipe
from datapipes.iter import IterableWrapper
from datapipes.map import SequenceWrapper, Zipper
from datapipes.map.util import InMemoryCacheHolder, UnZipper, UnZipperChild
from datapipes.testing import check_datapipe

from helpers import Boom

TIMEOUT = 5.0


class Counting(MapDataPipe):
    """A map-style source that counts its reads per position and returns a new object each time
    (``[i]``), optionally after a delay; ``fail`` maps a position to how many of its reads raise."""

    def __init__(self, n, delay=0.0, fail=None):
        self.n = n
        self.delay = delay
        self.fail = dict(fail or {})
        self.reads = Counter()
        self.lock = threading.Lock()

    def __getitem__(self, index):
        with self.lock:
            self.reads[index] += 1
            failing = self.fail.get(index, 0) > 0
            if failing:
                self.fail[index] -= 1
        if self.delay:
            time.sleep(self.delay)
        if failing:
            raise Boom(index, "source")
        if not 0 <= index < self.n:
            raise IndexError(f"Counting: {index}")
        return [index]

    def __len__(self):
        return self.n

    def __getstate__(self):
        state = dict(self.__dict__)
        del state["lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.lock = threading.Lock()


class FailingMap(MapDataPipe):
    """Every read raises the same Boom object."""

    def __init__(self, n=3):
        self.n = n
        self.error = Boom(0, "source")

    def __getitem__(self, index):
        raise self.error

    def __len__(self):
        return self.n


def run_threads(target, n):
    """Run ``target(k)`` in ``n`` threads started together; return their results (bounded in time)."""
    results = [None] * n
    errors = []
    start = threading.Barrier(n, timeout=TIMEOUT)

    def work(k):
        try:
            start.wait()
            results[k] = target(k)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a reader thread hangs"
    return results, errors


def list_cache(n):
    return [None] * n


# -- InMemoryCacheHolder ---------------------------------------------------------------------------


class TestInMemoryCacheHolder:
    def test_registered_and_functional_form(self):
        assert MapDataPipe._functions["in_memory_cache"] is InMemoryCacheHolder
        s = SequenceWrapper(range(3))
        pipe = s.in_memory_cache()
        assert type(pipe) is InMemoryCacheHolder and pipe.source_dp is s and pipe.cache_fn is None
        assert list(inspect.signature(MapDataPipe.in_memory_cache).parameters) == ["self", "cache_fn"]
        assert repr(s.map(abs).in_memory_cache()) == "SequenceWrapper -> Mapper(abs) -> InMemoryCacheHolder"

    def test_contract(self):
        check_datapipe(SequenceWrapper(range(10)).in_memory_cache(), expected=range(10))
        check_datapipe(SequenceWrapper([None, 1, None]).in_memory_cache(), expected=[None, 1, None])
        check_datapipe(SequenceWrapper(range(6)).map(lambda x: x * x).in_memory_cache(list_cache),
                       expected=[0, 1, 4, 9, 16, 25])
        check_datapipe(SequenceWrapper([]).in_memory_cache(), expected=[])

    def test_torchdata_example(self):
        # torchdata's test: values unchanged, the same objects on every pass, len from the source
        source = SequenceWrapper([[i] for i in range(10)])
        pipe = InMemoryCacheHolder(source)
        first, second = list(pipe), list(pipe)
        assert first == [[i] for i in range(10)] and len(pipe) == 10
        assert all(a is b is c for a, b, c in zip(first, second, source.sequence))

    def test_each_position_read_once(self):
        src = Counting(5)
        pipe = src.in_memory_cache()
        a = pipe[2]
        assert pipe[2] is a and src.reads == {2: 1}
        items = list(pipe)
        assert items == [[i] for i in range(5)] and items[2] is a
        assert list(pipe) == items and all(x is y for x, y in zip(list(pipe), items))
        assert src.reads == {i: 1 for i in range(5)}

    def test_not_cached_before_a_read(self):
        src = Counting(3)
        pipe = src.in_memory_cache()
        assert len(pipe) == 3 and src.reads == {}  # building and len() read nothing

    def test_negative_indices_share_the_position(self):
        src = Counting(4)
        pipe = src.in_memory_cache()
        last = pipe[-1]
        assert last == [3] and pipe[3] is last and pipe[-4] is pipe[0]
        assert src.reads == {3: 1, 0: 1}  # the source is read at the position, never at -1
        assert pipe[np.int64(-1)] is last and pipe[torch.tensor(3)] is last  # anything with __index__

    def test_index_errors_name_the_stage(self):
        pipe = SequenceWrapper("abc").in_memory_cache()
        with pytest.raises(IndexError, match=r"^InMemoryCacheHolder \(length 3\): Index 3 is out of range\.$"):
            pipe[3]
        with pytest.raises(IndexError, match=r"Index -4 is out of range"):
            pipe[-4]
        with pytest.raises(TypeError, match="InMemoryCacheHolder: index must be an int, got slice"):
            pipe[0:2]
        with pytest.raises(TypeError, match="index must be an int, got str"):
            pipe["a"]
        with pytest.raises(IndexError):
            SequenceWrapper([]).in_memory_cache()[0]

    def test_source_error_passes_through_and_is_not_cached(self):
        src = Counting(3, fail={1: 1})
        pipe = src.in_memory_cache()
        with pytest.raises(Boom) as info:
            pipe[1]
        assert info.value.args == (1, "source")
        assert pipe[1] == [1] and src.reads[1] == 2  # read again after the failure, then kept
        assert pipe[1] == [1] and src.reads[1] == 2
        failing = FailingMap()
        with pytest.raises(Boom) as info:
            failing.in_memory_cache()[0]
        assert info.value is failing.error

    def test_len_delegates_at_call_time(self):
        data = [1, 2]
        pipe = SequenceWrapper(data, deepcopy=False).in_memory_cache()
        assert len(pipe) == 2 and pipe[1] == 2
        data.append(3)
        assert len(pipe) == 3 and pipe[2] == 3 and pipe[-1] == 3 and list(pipe) == [1, 2, 3]

    def test_cache_fn(self):
        calls = []

        def make(n):
            calls.append(n)
            return [None] * n

        src = Counting(4)
        pipe = InMemoryCacheHolder(src, cache_fn=make)
        assert calls == []  # made at the first read, not at construction
        assert pipe[1] == [1] and pipe[1] is pipe[-3]
        assert list(pipe) == [[i] for i in range(4)] and list(pipe) == [[i] for i in range(4)]
        assert calls == [4] and src.reads == {i: 1 for i in range(4)}
        assert pipe._cache.store[1] == [1]  # the items live in cache_fn's object
        # a numpy object array (torchdata's default cache) and a None item work too
        arr = SequenceWrapper([None, 5]).in_memory_cache(lambda n: np.empty(n, dtype=object))
        assert list(arr) == [None, 5] and list(arr) == [None, 5]

    def test_cache_fn_errors(self):
        with pytest.raises(TypeError, match="InMemoryCacheHolder: cache_fn must be callable, got int"):
            SequenceWrapper([1]).in_memory_cache(3)
        pipe = SequenceWrapper([1, 2]).in_memory_cache(lambda n: (None,) * n)
        with pytest.raises(TypeError, match=r"cache_fn\(2\) returned a tuple: .*'__getitem__' and '__setitem__'"):
            pipe[0]

        def broken(n):
            raise Boom(n, "cache_fn")

        pipe = SequenceWrapper([1, 2]).in_memory_cache(broken)
        with pytest.raises(Boom):
            pipe[0]
        with pytest.raises(Boom):  # nothing half made is kept: cache_fn is asked again
            pipe[0]

    def test_cache_fn_object_too_small(self):
        # cache_fn's object is sized at the first read; a source that grows later overflows it, and the
        # object's own error comes through without leaving the position stuck as "being read"
        data = [1]
        pipe = SequenceWrapper(data, deepcopy=False).in_memory_cache(list_cache)
        assert pipe[0] == 1
        data.append(2)
        with pytest.raises(IndexError, match="list assignment index out of range"):
            pipe[1]
        assert pipe._cache.loading == {}

    def test_source_must_be_a_map_pipe(self):
        with pytest.raises(TypeError, match="InMemoryCacheHolder: source_dp must be a MapDataPipe, got IterableWrapper"):
            InMemoryCacheHolder(IterableWrapper([1]))
        with pytest.raises(TypeError, match="source_dp must be a MapDataPipe, got list"):
            InMemoryCacheHolder([1, 2])

    def test_pickle_leaves_the_cache_behind(self):
        src = Counting(3)
        pipe = src.in_memory_cache()
        big = SequenceWrapper(range(3)).map(lambda i: bytes(100_000)).in_memory_cache()
        empty_size = len(pickle.dumps(big))
        list(big)
        assert len(pickle.dumps(big)) == empty_size  # the 300 kB held are not in the pickle
        list(pipe)
        clone = pickle.loads(pickle.dumps(pipe))
        assert clone._cache is not pipe._cache and clone._cache.filled == set()
        assert list(clone) == [[0], [1], [2]] and clone.source_dp.reads == {i: 2 for i in range(3)}
        assert pipe._cache.filled == {0, 1, 2}  # the original keeps its own
        with_lambda = SequenceWrapper([1, 2]).in_memory_cache(lambda n: [None] * n)
        assert list(pickle.loads(pickle.dumps(with_lambda))) == [1, 2]

    def test_copies(self):
        pipe = SequenceWrapper(range(2)).map(lambda i: [i]).in_memory_cache()
        first = pipe[0]
        deep = copy.deepcopy(pipe)
        assert deep._cache.filled == set() and deep[0] == first and deep[0] is not first
        shallow = copy.copy(pipe)
        assert shallow[0] is first  # a shallow copy shares the cache
        shallow[1]
        assert 1 in pipe._cache.filled

    def test_threads_read_each_position_once(self):
        src = Counting(3, delay=0.05)
        pipe = src.in_memory_cache()
        results, errors = run_threads(lambda k: pipe[k % 2], 8)
        assert not errors
        assert src.reads == {0: 1, 1: 1}
        assert all(r is results[0] for r in results[0::2]) and all(r is results[1] for r in results[1::2])
        assert pipe._cache.loading == {}

    def test_threads_retry_after_a_failed_read(self):
        # the first read of position 0 fails slowly; the threads waiting on it read it themselves
        src = Counting(1, delay=0.05, fail={0: 1})
        pipe = src.in_memory_cache()
        results, errors = run_threads(lambda k: pipe[0], 6)
        assert len(errors) == 1 and isinstance(errors[0], Boom)
        got = [r for r in results if r is not None]
        assert len(got) == 5 and all(r is got[0] for r in got) and got[0] == [0]
        assert src.reads[0] == 2  # the failed read, then one successful read for all the waiters

    def test_threads_conserve_items(self):
        src = Counting(50)
        pipe = src.in_memory_cache()
        results, errors = run_threads(lambda k: [pipe[i] for i in range(50)][::-1 if k % 2 else 1], 6)
        assert not errors
        assert src.reads == {i: 1 for i in range(50)}
        for k, r in enumerate(results):
            ordered = r[::-1] if k % 2 else r
            assert all(a is b for a, b in zip(ordered, results[0]))

    def test_torch_dataloader(self):
        pipe = SequenceWrapper(range(6)).map(lambda x: x * 2).in_memory_cache()
        loader = torch.utils.data.DataLoader(pipe, batch_size=4)
        assert [b.tolist() for b in loader] == [[0, 2, 4, 6], [8, 10]]
        assert pipe._cache.filled == set(range(6))


# -- UnZipper --------------------------------------------------------------------------------------


def triples(n):
    return SequenceWrapper([(i, i + 10, i + 20) for i in range(n)])


class TestUnZipper:
    def test_registered_and_functional_form(self):
        assert MapDataPipe._functions["unzip"] is UnZipper
        assert list(inspect.signature(MapDataPipe.unzip).parameters) == ["self", "sequence_length", "columns_to_skip"]
        a, b = SequenceWrapper([(1, 2)]).unzip(2)
        assert type(a) is UnZipperChild and isinstance(b, MapDataPipe)
        assert repr(b) == "SequenceWrapper -> UnZipperChild(1)"

    def test_torchdata_example(self):
        source = triples(10)
        dp1, dp2, dp3 = UnZipper(source, sequence_length=3)
        assert (list(dp1), list(dp2), list(dp3)) == (list(range(10)), list(range(10, 20)), list(range(20, 30)))
        dp2, dp3 = source.unzip(sequence_length=3, columns_to_skip=[0])
        assert (list(dp2), list(dp3)) == (list(range(10, 20)), list(range(20, 30)))
        (dp2,) = source.unzip(sequence_length=3, columns_to_skip=[0, 2])
        assert list(dp2) == list(range(10, 20))
        source4 = SequenceWrapper([(i, i + 10, i + 20, i + 30) for i in range(10)])
        dp2, dp3 = source4.unzip(sequence_length=4, columns_to_skip=[0, 3])
        assert (list(dp2), list(dp3)) == (list(range(10, 20)), list(range(20, 30)))
        assert (len(dp2), len(dp3)) == (10, 10)

    def test_contract(self):
        a, b, c = triples(5).unzip(3)
        check_datapipe(a, expected=range(5))
        check_datapipe(b, expected=range(10, 15))
        check_datapipe(c, expected=range(20, 25))
        (only,) = triples(0).unzip(3, columns_to_skip={0, 1})
        check_datapipe(only, expected=[])
        check_datapipe(SequenceWrapper([[1, None], [2, None]]).unzip(2)[1], expected=[None, None])

    def test_children_and_columns(self):
        kids = triples(2).unzip(3, columns_to_skip=(1,))
        assert [(k.instance_id, k.column) for k in kids] == [(0, 0), (1, 2)]
        assert kids[1][1] == 21 and kids[0][0] == 0

    def test_index_goes_to_the_source(self):
        a, b, c = triples(4).unzip(3)
        assert b[-1] == 13 and c[np.int64(2)] == 22
        with pytest.raises(IndexError, match="list index out of range") as info:
            b[4]
        assert "SequenceWrapper at index 4" in info.value.__notes__[-1]
        keyed = SequenceWrapper({"x": ("a", 1), "y": ("b", 2)})
        names, values = keyed.unzip(2)
        assert names["y"] == "b" and values["x"] == 1
        assert list(names) == ["a", "b"] and list(values) == [1, 2]  # iterates as the source does
        with pytest.raises(KeyError):
            names["z"]

    def test_reads_the_source_on_access(self):
        src = Counting(3)
        (a,) = src.unzip(1)
        assert a[1] == 1 and a[1] == 1 and src.reads == {1: 2}
        cached = src.in_memory_cache()
        (b,) = cached.unzip(1)
        b[2], b[2], b[-1]
        assert src.reads[2] == 1

    def test_short_item_error_names_the_child(self):
        a, b = SequenceWrapper([(1, 2), (3,), (4, 5)]).unzip(2)
        with pytest.raises(IndexError, match="tuple index out of range") as info:
            b[1]
        assert info.value.__notes__ == [
            "[datapipes] raised in stage UnZipper(sequence_length=2), child 1 (column 1) at index 1"
        ]
        with pytest.raises(IndexError) as info:
            list(b)
        assert info.value.__notes__ == [
            "[datapipes] raised in stage UnZipper(sequence_length=2), child 1 (column 1) at index 1"
        ]
        assert list(a) == [1, 3, 4]
        (d,) = SequenceWrapper([{"k": 1}]).unzip(1)
        with pytest.raises(KeyError) as info:
            d[0]
        assert "child 0 (column 0) at index 0" in info.value.__notes__[-1]

    def test_source_error_is_the_same_object(self):
        failing = FailingMap()
        (a,) = failing.unzip(1)
        with pytest.raises(Boom) as info:
            a[0]
        assert info.value is failing.error
        with pytest.raises(Boom) as info:
            list(a)
        assert info.value is failing.error

    @pytest.mark.parametrize(
        "kwargs, error, message",
        [
            ({"sequence_length": 0}, ValueError, "^UnZipper: Expected `sequence_length` larger than 0, but 0 is found$"),
            ({"sequence_length": -2}, ValueError, "Expected `sequence_length` larger than 0, but -2 is found"),
            ({"sequence_length": 2.0}, TypeError, "UnZipper: sequence_length must be an int, got float"),
            ({"sequence_length": True}, TypeError, "sequence_length must be an int, got bool"),
            ({"sequence_length": 3, "columns_to_skip": [3]}, ValueError,
             r"columns_to_skip holds 3, not a column of sequence_length=3 \(0 to 2\)"),
            ({"sequence_length": 3, "columns_to_skip": [-1]}, ValueError, "columns_to_skip holds -1"),
            ({"sequence_length": 3, "columns_to_skip": ["0"]}, TypeError,
             r"UnZipper: columns_to_skip\[...\] must be an int, got str"),
            ({"sequence_length": 3, "columns_to_skip": "0"}, TypeError,
             "UnZipper: columns_to_skip must be a sequence of ints or None, got str"),
            ({"sequence_length": 3, "columns_to_skip": 1}, TypeError, "columns_to_skip must be a sequence of ints"),
            ({"sequence_length": 2, "columns_to_skip": [0, 1]}, RuntimeError,
             r"^UnZipper\(sequence_length=2, columns_to_skip=\[0, 1\]\): All instances are being filtered out in "
             "UnZipperMapDataPipe"),
            ({"sequence_length": 1, "columns_to_skip": [0, 0]}, RuntimeError, "All instances are being filtered out"),
        ],
    )
    def test_argument_errors(self, kwargs, error, message):
        with pytest.raises(error, match=message):
            triples(2).unzip(**kwargs)

    def test_source_must_be_a_map_pipe(self):
        with pytest.raises(TypeError, match="UnZipper: source_datapipe must be a MapDataPipe, got IterableWrapper"):
            UnZipper(IterableWrapper([(1, 2)]), 2)
        with pytest.raises(TypeError, match="source_datapipe must be a MapDataPipe, got list"):
            UnZipper([(1, 2)], 2)

    def test_pickle(self):
        source = SequenceWrapper([(i, str(i)) for i in range(3)]).map(lambda t: (t[0] * 2, t[1]))
        kids = source.unzip(2)
        a, b = pickle.loads(pickle.dumps(kids))
        assert a.source_datapipe is b.source_datapipe  # pickled together, they keep one source
        assert (list(a), list(b)) == ([0, 2, 4], ["0", "1", "2"])
        alone = pickle.loads(pickle.dumps(kids[1]))
        assert alone[2] == "2" and len(alone) == 3
        assert repr(alone) == "SequenceWrapper -> Mapper(<lambda>) -> UnZipperChild(1)"

    def test_len_follows_the_source(self):
        data = [(1, 2)]
        a, b = SequenceWrapper(data, deepcopy=False).unzip(2)
        data.append((3, 4))
        assert len(a) == len(b) == 2 and list(b) == [2, 4]

    @settings(max_examples=25)
    @given(st.lists(st.tuples(st.integers(), st.text(max_size=3), st.none()), max_size=20))
    def test_zip_inverts_unzip(self, rows):
        source = SequenceWrapper(rows)
        kids = source.unzip(3)
        assert list(Zipper(*kids)) == rows
        kept = source.unzip(3, columns_to_skip=[1])
        assert [list(k) for k in kept] == [[r[0] for r in rows], [r[2] for r in rows]]
