"""Zipper (datapipes/iter/zipping.py)."""

import pytest

from datapipes.iter import IterableWrapper, Zipper
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


# -- Zipper -----------------------------------------------------------------------------------------


class TestZipper:
    def test_contract(self):
        pipe = IterableWrapper(range(4)).zip(IterableWrapper("abcdef").map(lambda c: c.upper()))
        check_datapipe(pipe, expected=[(0, "A"), (1, "B"), (2, "C"), (3, "D")],
                       build=lambda src: src.zip(IterableWrapper(range(100))))
        check_datapipe(IterableWrapper(range(9)).zip(IterableWrapper(range(9))),
                       build=lambda src: IterableWrapper(range(100)).zip(src))

    @pytest.mark.parametrize("parts", [[[1, 2], [3, 4, 5]], [[], [1]], [[1]], [list(range(5)), list("xyz"), [0, 1]]])
    def test_equals_zip(self, parts):
        pipe = Zipper(*map(IterableWrapper, parts))
        assert list(pipe) == list(zip(*parts))
        assert len(pipe) == min(map(len, parts))

    def test_stops_at_shortest_without_reading_further(self):
        src = Counting(range(10))
        assert list(IterableWrapper([1]).zip(IterableWrapper(src))) == [(1, 0)]
        assert src.closed == 1  # the longer input's iterator was closed, not left hanging

    def test_len_unknown_names_input(self):
        pipe = IterableWrapper([1]).zip(IterableWrapper(iter([2])))
        with pytest.raises(TypeError, match=r"^Zipper: datapipes\[1\] has no len\(\)"):
            len(pipe)

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="Zipper: Expected at least one DataPipe"):
            Zipper()
        with pytest.raises(TypeError, match=r"Zipper: datapipes\[0\] is of type range: All inputs are required to be `IterDataPipe`"):
            Zipper(range(3))

    def test_empty(self):
        check_datapipe(IterableWrapper([]).zip(IterableWrapper([1, 2])), expected=[])
