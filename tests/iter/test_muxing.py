"""Concater and Multiplexer (datapipes/iter/muxing.py)."""

import itertools

import pytest

from datapipes.iter import Concater, IterableWrapper, Multiplexer
from datapipes.testing import check_datapipe


class Counting:
    """A re-iterable source that counts its passes and notices when a pass's iterator is closed."""

    def __init__(self, items):
        self.items = list(items)
        self.passes = 0
        self.closed = 0

    def __iter__(self):
        self.passes += 1
        try:
            yield from self.items
        finally:
            self.closed += 1


# -- Concater ---------------------------------------------------------------------------------------


class TestConcater:
    def test_contract(self):
        pipe = IterableWrapper(range(3)).map(lambda x: x * 2).concat(IterableWrapper("ab"), IterableWrapper([None]))
        check_datapipe(pipe, expected=[0, 2, 4, "a", "b", None], build=lambda src: src.concat(IterableWrapper([9])))
        check_datapipe(IterableWrapper([1]).concat(IterableWrapper([2])), build=lambda src: IterableWrapper([1]).concat(src))

    @pytest.mark.parametrize("parts", [[[1, 2], [3]], [[], [1], []], [[]], [list(range(5)), list("xyz"), [0]]])
    def test_equals_chain(self, parts):
        pipe = Concater(*map(IterableWrapper, parts))
        assert list(pipe) == list(itertools.chain(*parts))
        assert len(pipe) == sum(map(len, parts))

    def test_functional_equals_constructor(self):
        a, b = IterableWrapper([1]), IterableWrapper([2])
        pipe = a.concat(b)
        assert isinstance(pipe, Concater) and pipe.datapipes == (a, b)

    def test_len_unknown_names_input(self):
        pipe = IterableWrapper([1]).concat(IterableWrapper([2]).filter(bool))
        with pytest.raises(TypeError, match=r"^Concater: datapipes\[1\] has no len\(\) \(Filter.*\), so Concater instance"):
            len(pipe)
        assert list(pipe) == [1, 2]

    def test_inputs_iterated_lazily(self):
        second = Counting([3])
        it = iter(IterableWrapper([1, 2]).concat(IterableWrapper(second)))
        assert [next(it), next(it)] == [1, 2] and second.passes == 0
        assert list(it) == [3] and second.passes == 1

    def test_later_inputs_are_built_in_the_pass_when_reached(self):
        first, second = IterableWrapper([1]).map(abs), IterableWrapper([2]).map(abs)
        pipe = first.concat(second)
        it = iter(pipe)
        assert id(first) in it.pass_.built and id(second) not in it.pass_.built
        other = iter(pipe)  # started last: the pass a lazily created iterator would join by mistake
        assert list(it) == [1, 2]
        assert id(second) in it.pass_.built and id(second) not in other.pass_.built
        assert list(other) == [1, 2]

    def test_one_shot_later_input_is_not_touched_early(self):
        once = IterableWrapper(iter([3]))
        it = iter(IterableWrapper([1, 2]).concat(once))
        assert [next(it), next(it)] == [1, 2] and not once._started
        assert list(it) == [3]

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="Concater: Expected at least one DataPipe, but got nothing"):
            Concater()
        with pytest.raises(TypeError, match=r"Concater: datapipes\[1\] is of type list: Expected all inputs to be `IterDataPipe`"):
            Concater(IterableWrapper([1]), [2])
        with pytest.raises(TypeError, match=r"datapipes\[1\].*int"):
            IterableWrapper([1]).concat(5)

    def test_empty(self):
        check_datapipe(IterableWrapper([]).concat(IterableWrapper([])), expected=[])

    def test_repr(self):
        assert repr(IterableWrapper([1]).concat(IterableWrapper([2]))) == "Concater[IterableWrapper | IterableWrapper]"


# -- Multiplexer ------------------------------------------------------------------------------------


class TestMultiplexer:
    def test_contract(self):
        a, b, c = IterableWrapper(range(3)), IterableWrapper(range(10, 15)), IterableWrapper(range(20, 25))
        check_datapipe(a.mux(b, c), expected=[0, 10, 20, 1, 11, 21, 2, 12, 22],
                       build=lambda src: src.mux(IterableWrapper(range(100))))
        check_datapipe(a.map(lambda x: -x).mux(b), expected=[0, 10, -1, 11, -2, 12],
                       build=lambda src: IterableWrapper(range(100)).mux(src))

    def test_round_cut_short_is_dropped(self):
        # the second input ends mid-round: the first input's item of that round is not yielded
        pipe = IterableWrapper([1, 2, 3]).mux(IterableWrapper([10]))
        assert list(pipe) == [1, 10] and len(pipe) == 2

    @pytest.mark.parametrize("parts", [[[1, 2], [3, 4, 5]], [[], [1]], [[1, 2]], [list(range(5)), list("xyz"), [0, 1]]])
    def test_len_is_min_times_n(self, parts):
        pipe = Multiplexer(*map(IterableWrapper, parts))
        assert list(pipe) == [x for row in zip(*parts) for x in row]
        assert len(pipe) == min(map(len, parts)) * len(parts)

    def test_len_unknown(self):
        with pytest.raises(TypeError, match=r"^Multiplexer: datapipes\[0\] has no len\(\)"):
            len(IterableWrapper([1]).filter(bool).mux(IterableWrapper([2])))

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="Multiplexer: Expected at least one DataPipe"):
            Multiplexer()
        with pytest.raises(TypeError, match=r"Multiplexer: datapipes\[1\] is of type list: Expected all inputs to be `IterDataPipe`"):
            IterableWrapper([1]).mux([1])

    def test_empty(self):
        check_datapipe(IterableWrapper([]).mux(IterableWrapper([])), expected=[])
