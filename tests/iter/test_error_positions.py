"""The failing item's position in a serial map's and filter's error note, counted or told.

A serial ``map``/``filter`` over a source that tells its own position (the iterator of a list,
tuple, string, bytes or range, or another serial map over one) counts nothing and reads the position
only when an item fails; over any other source it counts. Both must name the same position, in a
whole pass, a resumed one, at the first and the last item, and through chains of maps.
"""

import collections

import pytest

from datapipes.iter import IterableWrapper
from datapipes.iter.mapping._shared import taken_reader

from helpers import Boom, fail_at

N = 12

#: sources of the ints 0..N-1 whose iterators tell their position, and one (a deque) whose does not
TOLD = {
    "list": lambda: list(range(N)),
    "tuple": lambda: tuple(range(N)),
    "range": lambda: range(N),
}
COUNTED = {"deque": lambda: collections.deque(range(N))}
SOURCES = {**TOLD, **COUNTED}


def identity(x):
    return x


def pass_but_fail_at(k):
    """A filter_fn (it must return a bool) that keeps every item and raises at item ``k``."""
    fail = fail_at(k)

    def fn(x):
        fail(x)
        return True

    return fn


def note_of(pipe, state=None):
    it = iter(pipe)
    if state is not None:
        it.load_state_dict(state)
    with pytest.raises(Boom) as info:
        for _ in it:
            pass
    return info.value.__notes__


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("k", [0, 5, N - 1])
class TestSamePosition:
    def test_map(self, source, k):
        pipe = IterableWrapper(SOURCES[source](), deepcopy=False).map(fail_at(k))
        assert note_of(pipe) == [f"[datapipes] raised in stage Mapper(fn) at item {k}"]

    def test_map_after_maps(self, source, k):
        pipe = IterableWrapper(SOURCES[source](), deepcopy=False).map(identity).map(identity).map(fail_at(k))
        assert note_of(pipe) == [f"[datapipes] raised in stage Mapper(fn) at item {k}"]

    def test_filter_after_map(self, source, k):
        pipe = IterableWrapper(SOURCES[source](), deepcopy=False).map(identity).filter(pass_but_fail_at(k))
        assert note_of(pipe) == [f"[datapipes] raised in stage Filter(fn) at item {k}"]

    def test_filter_with_column(self, source, k):
        pipe = IterableWrapper(SOURCES[source](), deepcopy=False).map(lambda x: (x, x)).filter(pass_but_fail_at(k), input_col=1)
        assert note_of(pipe) == [f"[datapipes] raised in stage Filter(fn) at item {k}"]

    def test_map_after_filter_counts_the_kept_items(self, source, k):
        # the filter hands out fewer items than it takes: the map after it counts its own
        pipe = IterableWrapper(SOURCES[source](), deepcopy=False).filter(lambda x: x % 2 == 0).map(fail_at(k - k % 2))
        assert note_of(pipe) == [f"[datapipes] raised in stage Mapper(fn) at item {k // 2}"]


@pytest.mark.parametrize("source", SOURCES)
def test_resumed_pass_counts_from_its_start(source):
    pipe = IterableWrapper(SOURCES[source](), deepcopy=False).map(fail_at(9))
    it = iter(pipe)
    assert [next(it) for _ in range(4)] == [0, 1, 2, 3]
    state = it.state_dict()
    assert note_of(pipe, state) == ["[datapipes] raised in stage Mapper(fn) at item 5"]


def test_the_default_source_tells_too():
    # IterableWrapper's default (deepcopy=True) hands a list of numbers over as it is
    assert note_of(IterableWrapper(list(range(N))).map(fail_at(7))) == ["[datapipes] raised in stage Mapper(fn) at item 7"]


def test_strings_bytes_and_huge_ranges():
    def bad_char(c):
        if c == "d":
            raise Boom(0, "char")
        return c

    assert note_of(IterableWrapper("abcdef", deepcopy=False).map(bad_char))[0].endswith("at item 3")
    assert note_of(IterableWrapper("ab€d", deepcopy=False).map(bad_char))[0].endswith("at item 3")
    assert note_of(IterableWrapper(b"\x00\x01\x02", deepcopy=False).map(fail_at(2)))[0].endswith("at item 2")
    big = range(2**64, 2**64 + 10)
    assert note_of(IterableWrapper(big, deepcopy=False).map(lambda x: fail_at(6)(x - 2**64)))[0].endswith(
        "Mapper(<lambda>) at item 6")


def test_which_sources_tell():
    for make in TOLD.values():
        assert taken_reader(iter(make())) is not None
    assert taken_reader(iter(collections.deque([1]))) is None
    assert taken_reader(x for x in [1]) is None  # a generator that is none of ours
    told_map = iter(IterableWrapper([1, 2], deepcopy=False).map(identity))._it
    assert taken_reader(told_map) is not None
    counted_map = iter(IterableWrapper(collections.deque([1, 2]), deepcopy=False).map(identity))._it
    assert taken_reader(counted_map) is None


def test_an_upstream_failure_gets_only_its_own_note():
    # a failing upstream map's note is its own; the told map after it adds none
    pipe = IterableWrapper([0, 1, 2], deepcopy=False).map(fail_at(1)).map(identity)
    assert note_of(pipe) == ["[datapipes] raised in stage Mapper(fn) at item 1"]
