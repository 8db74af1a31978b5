"""Positions in built-in iterators, counted and moved through public protocols only.

Checkpoint and resume need to know how far a pass has read its source, at no per-item cost in
Python. CPython's iterators used to be read through their pickle forms (``__reduce__`` and
``__setstate__``), which are private and change: a range iterator's form changed in Python 3.12
(it reduces to the range left and moves by an offset), and itertools objects stop reducing in 3.14.
Everything here goes through protocols every interpreter keeps, or through a form probed on this
interpreter at import (docs/platforms.rst):

- :class:`Counted` and :class:`Enumerated` count the items they pass with a range iterator zipped
  beside the source, read by :func:`operator.length_hint` (exact for a range iterator): the same C
  loop as ``enumerate``, no Python call per item.
- :func:`skip` moves an iterator forward by reading and dropping items in C
  (:func:`itertools.islice`).
- :func:`seek` moves a sequence's own iterator to an index without reading the items in between
  (a source whose ``__getitem__`` loads data must not load what it skips), through the iterator's
  ``__setstate__`` only where a probe at import has shown, on this interpreter, what it does for
  that type: to an absolute index (list, tuple, str, bytes), or by an offset (range from 3.12 on);
  any other iterator is moved by :func:`skip`.
- :func:`remaining` lists what a list or tuple iterator has left without advancing it, through
  :func:`copy.copy`.
- :func:`handed_out` tells how many items a built-in sequence's or range's iterator has handed out
  since it was asked, by :func:`operator.length_hint`, so a stage need not count them.

tests/test_positions.py checks each of these on every interpreter CI runs.
"""

from __future__ import annotations

import copy
import itertools
import sys
from operator import itemgetter, length_hint
from typing import Any, Callable, Iterable, Iterator

__all__ = ["Counted", "Enumerated", "handed_out", "remaining", "seek", "skip"]

_LIMIT = sys.maxsize  # the counting range stays within a C long: the fast range iterator
_FIRST = itemgetter(0)
_SWAP = itemgetter(1, 0)


class Counted(map):  # type: ignore[type-arg]
    """The items of ``iterable``, counted: ``count()`` is ``start`` plus the items yielded so far.

    The count advances only once ``iterable`` has given an item, so it is exact after the source
    ends or raises too. Costs what ``map(f, enumerate(...))`` costs: all in C.
    """

    __slots__ = ("_counter",)
    _counter: Iterator[int]

    def __new__(cls, iterable: Iterable[Any], start: int = 0) -> Counted:
        counter = iter(range(start, _LIMIT))
        self = super().__new__(cls, _FIRST, zip(iterable, counter))
        self._counter = counter
        return self

    def count(self) -> int:
        """``start`` plus the number of items taken from the source."""
        return _LIMIT - length_hint(self._counter)


class Enumerated(Counted):
    """``enumerate(iterable, start)``, whose next index ``count()`` tells: ``(i, item)`` pairs."""

    __slots__ = ()

    def __new__(cls, iterable: Iterable[Any], start: int = 0) -> Enumerated:
        counter = iter(range(start, _LIMIT))
        self = map.__new__(cls, _SWAP, zip(iterable, counter))
        self._counter = counter
        return self


def skip(it: Iterator[Any], n: int) -> None:
    """Read and drop the next ``n`` items of ``it`` (in C)."""
    if n > 0:
        next(itertools.islice(it, n, n), None)


def remaining(it: Iterator[Any]) -> list[Any]:
    """The items a list or tuple iterator has not yielded yet, as a new list; ``it`` stays where it
    stands (a copy of it is read)."""
    return list(copy.copy(it))


#: iterators whose ``length_hint`` is the exact number of items left (while the sequence keeps its
#: length), and which :func:`seek` moves to an index: those of list, tuple, range, str, bytes, bytearray
SEQUENCES: tuple[Any, ...] = ([], (), range(0), range(1 << 64), "", "\u20ac", b"", bytearray())
INDEXED = frozenset(type(iter(x)) for x in SEQUENCES)


def handed_out(it: Any) -> Callable[[], int] | None:
    """A function telling how many items ``it`` has handed out since this call, where ``it`` is
    the iterator of a list, tuple, string, bytes, bytearray or range (by :func:`length_hint`, read
    only when asked: nothing per item); ``None`` for any other iterator.

    Exact while the sequence keeps its length: items appended to a list during the pass shift the
    figure by as many.
    """
    if type(it) not in INDEXED:
        return None
    first = length_hint(it)
    return lambda: first - length_hint(it)


class _Probe:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < 4:
            raise IndexError(i)
        return i


def _moves(sample: Any) -> str:
    """How ``__setstate__`` moves the iterator of ``sample`` (4 items) on this interpreter:
    ``"absolute"``, ``"offset"`` or ``""`` (neither, or no such method: skip instead)."""
    try:
        it = iter(sample)
        it.__setstate__(1)
        it.__setstate__(1)
        left = length_hint(it)
        first = next(it)
    except Exception:  # noqa: BLE001 - whatever a future interpreter does: fall back to skipping
        return ""
    if left == 3 and first == sample[1]:
        return "absolute"
    if left == 2 and first == sample[2]:
        return "offset"
    return ""


#: how each sequence iterator type moves on this interpreter, probed once at import
_SAMPLES: tuple[Any, ...] = ([0, 1, 2, 3], (0, 1, 2, 3), range(4), range(1 << 64, (1 << 64) + 4), "abcd",
                             "\u20acbcd", b"abcd", bytearray(b"abcd"), _Probe())
MOVES: dict[type, str] = {type(iter(x)): _moves(x) for x in _SAMPLES}


def seek(it: Iterator[Any], at: int, index: int) -> None:
    """Move ``it``, a sequence's iterator standing at ``at``, to ``index`` without reading the items
    between where the interpreter allows it (:data:`MOVES`); otherwise forward by :func:`skip`."""
    how = MOVES.get(type(it), "")
    if how == "absolute":
        it.__setstate__(index)  # type: ignore[attr-defined]
        return
    if index < at:
        raise RuntimeError(f"load_state_dict: a {type(it).__name__} cannot move back from {at} to {index}; "
                           "load a state into a new pass")
    if how == "offset":
        it.__setstate__(index - at)  # type: ignore[attr-defined]
    else:
        skip(it, index - at)
