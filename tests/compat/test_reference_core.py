"""Behaviours of torch DataPipes' base classes that PyTorch's test_datapipe.py relies on, written as
our own tests: a pipe that is its own iterator (``__iter__`` returns ``self``), and pickling a graph
that leads back to itself (TestCircularSerialization: a stage whose ``fn`` is a bound method of the
pipe that holds it, a demux classifier that is one)."""

import pickle
import threading

import pytest

from datapipes import IterDataPipe
from datapipes.iter import IterableWrapper


class SelfIterating(IterDataPipe):
    """torch's "iterator pipe" idiom: ``__iter__`` resets and returns ``self``; ``__next__`` reads."""

    def __init__(self, n):
        self.n = n
        self._it = None

    def __iter__(self):
        self._it = iter(range(self.n))
        return self

    def __next__(self):
        return next(self._it)

    def __len__(self):
        return self.n


class TestSelfIteratingPipe:
    @pytest.mark.timeout(20)
    def test_iterated_as_the_root(self):
        assert list(SelfIterating(4)) == [0, 1, 2, 3]

    def test_iterated_as_a_source(self):
        pipe = SelfIterating(4).map(lambda x: x * 10).filter(lambda x: x != 20)
        assert list(pipe) == [0, 10, 30]

    def test_iterated_again_starts_again(self):
        pipe = SelfIterating(3)
        assert list(pipe) == list(pipe) == [0, 1, 2]

    def test_next_after_the_end_keeps_raising(self):
        it = iter(SelfIterating(1))
        assert next(it) == 0
        for _ in range(2):
            with pytest.raises(StopIteration):
                next(it)

    def test_len_and_pickle(self):
        pipe = SelfIterating(3)
        assert len(pipe) == 3
        assert list(pickle.loads(pickle.dumps(pipe))) == [0, 1, 2]


class HoldsItsOwnMethod(IterDataPipe):
    """A pipe whose inner stage calls one of its methods: pipe -> Mapper -> bound method -> pipe."""

    def __init__(self):
        self.inner = IterableWrapper([1, 2, 3]).map(self.scale)
        self.factor = 10

    def scale(self, x):
        return x * self.factor

    def __iter__(self):
        yield from self.inner


class DemuxesWithItsOwnMethod(IterDataPipe):
    def __init__(self):
        self.even, self.odd = IterableWrapper(range(6)).demux(2, self.classify)

    def classify(self, x):
        return x % 2

    def __iter__(self):
        yield from self.even.zip(self.odd)


class ClosesOverItself(IterDataPipe):
    def __init__(self):
        self.inner = IterableWrapper([1, 2]).map(lambda x: (x, self.tag))
        self.tag = "t"

    def __iter__(self):
        yield from self.inner


def _round_trip_in_time(pipe, seconds=20):
    """``pickle.loads(pickle.dumps(pipe))`` on a thread, failing (not hanging) past ``seconds``."""
    out = {}

    def work():
        try:
            out["pipe"] = pickle.loads(pickle.dumps(pipe))
        except BaseException as e:  # noqa: BLE001 - reported below
            out["error"] = e

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"pickling {type(pipe).__name__} did not finish in {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["pipe"]


class TestCircularSerialization:
    def test_a_bound_method_of_the_pipe_as_fn(self):
        clone = _round_trip_in_time(HoldsItsOwnMethod())
        assert list(clone) == [10, 20, 30]
        assert clone.inner.fn.__self__ is clone  # the cycle is kept, not copied

    def test_a_bound_method_as_demux_classifier(self):
        clone = _round_trip_in_time(DemuxesWithItsOwnMethod())
        assert list(clone) == [(0, 1), (2, 3), (4, 5)]
        assert clone.even._hub is clone.odd._hub  # the children still share one hub

    def test_a_lambda_closing_over_its_pipe(self):
        clone = _round_trip_in_time(ClosesOverItself())
        assert list(clone) == [(1, "t"), (2, "t")]

    def test_a_source_shared_by_fork_children_and_another_branch_stays_shared(self):
        source = IterableWrapper(range(4)).map(lambda x: x + 1)
        a, b = source.fork(2)
        pipe = a.zip(b, source)
        clone = _round_trip_in_time(pipe)
        first, second, third = clone.datapipes
        assert first._hub is second._hub and first._hub.datapipe is third
        assert list(clone) == [(1, 1, 1), (2, 2, 2), (3, 3, 3), (4, 4, 4)]
