"""datapipes._positions: positions in built-in iterators through public protocols only.

CI runs this file on every interpreter it supports (3.11, 3.12, 3.13): each protocol the resume
machinery leans on is checked here on the interpreter at hand, so a change in a new CPython shows
up as one named failure rather than as a silently wrong resume.
"""

import itertools
import sys
from operator import length_hint

import pytest

from datapipes._positions import MOVES, Counted, Enumerated, _Probe, handed_out, remaining, seek, skip
from datapipes.iter import IterableWrapper


def _gen(n):
    yield from range(n)


def _failing(n):
    yield from range(n)
    raise KeyError("source failed")


class TestCounted:
    def test_yields_the_items_and_counts_them(self):
        c = Counted(_gen(5))
        assert c.count() == 0
        assert [next(c), next(c)] == [0, 1]
        assert c.count() == 2
        assert list(c) == [2, 3, 4]
        assert c.count() == 5

    def test_start(self):
        c = Counted("abc", 10)
        assert list(c) == ["a", "b", "c"] and c.count() == 13

    def test_count_is_exact_after_the_end_and_after_a_failure(self):
        c = Counted(_gen(3))
        list(c)
        list(c)  # exhausted: asking again counts nothing more
        assert c.count() == 3
        c = Counted(_failing(2))
        with pytest.raises(KeyError):
            list(c)
        assert c.count() == 2  # the failed pull is not an item

    def test_none_and_falsy_items_are_items(self):
        c = Counted([None, 0, "", ()])
        assert list(c) == [None, 0, "", ()] and c.count() == 4

    def test_counts_past_a_small_int(self):
        c = Counted(range(100_000), 2**40)
        for _ in c:
            pass
        assert c.count() == 2**40 + 100_000


class TestEnumerated:
    @pytest.mark.parametrize("start", [0, 7])
    def test_is_enumerate(self, start):
        e = Enumerated("abcd", start)
        assert list(e) == list(enumerate("abcd", start))
        assert e.count() == start + 4

    def test_count_between_items(self):
        e = Enumerated(_gen(10), 3)
        assert next(e) == (3, 0)
        assert next(e) == (4, 1)
        assert e.count() == 5  # the next index


class TestSkipAndRemaining:
    def test_skip_moves_forward_in_c(self):
        it = iter(range(10))
        skip(it, 4)
        assert next(it) == 4
        skip(it, 0)
        skip(it, -1)
        assert next(it) == 5
        skip(it, 100)  # past the end: exhausted, no error
        assert list(it) == []

    @pytest.mark.parametrize("seq", [[1, 2, 3, 4], (1, 2, 3, 4), "abcd"], ids=["list", "tuple", "str"])
    def test_remaining_reads_without_advancing(self, seq):
        it = iter(seq)
        next(it)
        assert remaining(it) == list(seq[1:])
        assert next(it) == seq[1]  # not moved by the read
        list(it)
        assert remaining(it) == []


@pytest.mark.parametrize("seq", [list(range(6)), tuple(range(6)), range(6), range(2**64, 2**64 + 6), "abcdef",
                                 b"abcdef", bytearray(b"abcdef")],
                         ids=["list", "tuple", "range", "long range", "str", "bytes", "bytearray"])
def test_a_sequence_iterator_tells_what_it_has_left(seq):
    """What every sequence source's position is read from (``len - length_hint``), on this Python."""
    it = iter(seq)
    assert length_hint(it) == 6
    next(it)
    next(it)
    assert len(seq) - length_hint(it) == 2
    list(it)
    assert length_hint(it) == 0


@pytest.mark.parametrize("seq", [list(range(6)), tuple(range(6)), range(6), range(2**64, 2**64 + 6), "abcdef",
                                 "\u20acbcdef", b"abcdef", bytearray(b"abcdef")],
                         ids=["list", "tuple", "range", "long range", "str", "non-ascii str", "bytes", "bytearray"])
def test_handed_out_counts_from_when_it_was_asked(seq):
    it = iter(seq)
    next(it)
    taken = handed_out(it)
    assert taken() == 0
    next(it)
    next(it)
    assert taken() == 2
    list(it)
    assert taken() == 5  # to the end: what was left when asked


def test_handed_out_is_none_for_iterators_that_cannot_tell():
    import collections

    assert handed_out(iter(collections.deque([1, 2]))) is None
    assert handed_out(x for x in [1, 2]) is None
    assert handed_out(iter(_Probe())) is None  # a __getitem__ source: its __len__ may do work
    assert handed_out(itertools.chain([1, 2])) is None


def test_a_resumed_range_source_on_this_interpreter():
    """Python 3.12 changed a range iterator's pickle form (it reduces to the range left and its
    ``__setstate__`` moves by an offset); positions no longer depend on it."""
    pipe = IterableWrapper(range(10)).shuffle(buffer_size=4)
    pipe.set_seed(3)
    whole = list(pipe)
    it = iter(pipe)
    head = [next(it) for _ in range(6)]
    state = it.state_dict()
    resumed = iter(pipe)
    resumed.load_state_dict(state)
    assert head + list(resumed) == whole, sys.version


class _Indexed:
    """A source read through ``__getitem__`` that counts its reads (a dataset that loads items)."""

    def __init__(self, n):
        self.n, self.reads = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        self.reads += 1
        return i * 10


@pytest.mark.parametrize("make", [lambda: list(range(8)), lambda: tuple(range(8)), lambda: range(8),
                                  lambda: range(2**64, 2**64 + 8), lambda: "abcdefgh", lambda: "\u20acbcdefgh",
                                  lambda: b"abcdefgh", lambda: bytearray(b"abcdefgh"), lambda: _Indexed(8)],
                         ids=["list", "tuple", "range", "long range", "str", "str (not ascii)", "bytes", "bytearray",
                              "__getitem__"])
def test_seek_on_this_interpreter(make):
    seq = make()
    want = [seq[i] for i in range(len(seq))]
    it = iter(seq)
    seek(it, 0, 5)
    assert list(it) == want[5:]
    it = iter(seq)
    next(it)
    seek(it, 1, 3)
    assert next(it) == want[3]
    if MOVES.get(type(it)) == "absolute":
        seek(it, 4, 2)  # back, where the interpreter allows it
        assert list(it) == want[2:]
    else:
        with pytest.raises(RuntimeError, match="cannot move back"):
            seek(it, 4, 2)


def test_the_probe_found_the_forms_every_supported_interpreter_has():
    """Lists, tuples, strings and __getitem__ sequences move to an absolute index on 3.11-3.13; a
    range moves to an absolute index before 3.12 and by an offset from 3.12 on. A future interpreter
    that changes one falls back to skipping (correct, slower); this test names the change."""
    absolute = {type(iter(x)) for x in ([], (), "", "\u20ac", b"", bytearray())} | {type(iter(_Indexed(0)))}
    assert {t for t in absolute if MOVES[t] != "absolute"} == set()
    assert MOVES[type(iter(range(4)))] == ("offset" if sys.version_info >= (3, 12) else "absolute")


def test_seek_does_not_read_a_getitem_source():
    seq = _Indexed(100)
    it = iter(seq)
    seek(it, 0, 90)
    assert seq.reads == 0
    assert next(it) == 900
