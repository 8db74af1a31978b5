"""Map-style Concater [concat] and Zipper [zip]: several sources read by position."""

from __future__ import annotations

from itertools import chain, islice
from typing import Any, Iterator, TypeVar, overload

from ..datapipe import MapDataPipe, functional_datapipe, index_ordered, source_len
from ._index import position

__all__ = ["Concater", "Zipper"]

T = TypeVar("T")
T1 = TypeVar("T1")
T2 = TypeVar("T2")
T3 = TypeVar("T3")
U = TypeVar("U")


def _require_map_pipes(datapipes: tuple[Any, ...], stage: str) -> None:
    # torch's phrases end the messages (code ported from torch DataPipes may match them)
    if not datapipes:
        raise ValueError(f"{stage}: Expected at least one DataPipe, but got nothing")
    for i, dp in enumerate(datapipes):
        if not isinstance(dp, MapDataPipe):
            raise TypeError(f"{stage}: datapipes[{i}] is of type {type(dp).__name__}: Expected all inputs to be `MapDataPipe`")


@functional_datapipe("concat")
class Concater(MapDataPipe[T]):
    """Join sources end to end: the items of the first, then of the second, ...
    (functional name: ``concat``).

    Args:
        *datapipes: one or more map-style pipes, read by position ``0 .. len - 1``.

    Yields:
        Every item of ``datapipes[0]``, then of ``datapipes[1]``, and so on. ``pipe[i]`` is item
        ``i - len(datapipes[0]) - ...`` of the source that position falls into.

    Raises:
        ValueError: no datapipes. TypeError: one is not a ``MapDataPipe``, or an index is not an
        int. IndexError: an index out of range (negative indices count from the end), naming the
        stage and ending in torch's words: ``Concater (length 5): Index 7 is out of range.``

    ``len()`` is the sum of the sources' lengths at call time.

    Example:
        >>> from datapipes.map import SequenceWrapper
        >>> pipe = SequenceWrapper([1, 2]).concat(SequenceWrapper([3]), SequenceWrapper([4, 5]))
        >>> list(pipe), pipe[2], pipe[-1], len(pipe)
        ([1, 2, 3, 4, 5], 3, 5, 5)

    See also: :class:`Zipper`, :class:`datapipes.iter.Concater`.
    """

    _saves = "same as SequenceWrapper"

    @overload
    def __init__(
        self: Concater[T | U], datapipe: MapDataPipe[T], other: MapDataPipe[U], /, *datapipes: MapDataPipe[U]
    ) -> None: ...
    @overload
    def __init__(self, *datapipes: MapDataPipe[T]) -> None: ...
    def __init__(self, *datapipes: MapDataPipe[Any]) -> None:
        _require_map_pipes(datapipes, "Concater")
        self.datapipes = datapipes

    def __getitem__(self, index: int) -> T:
        lengths = [len(dp) for dp in self.datapipes]
        i = position(self, index, sum(lengths))
        k = 0
        while i >= lengths[k]:  # ends inside the sources: position() checked i < sum(lengths)
            i -= lengths[k]
            k += 1
        return self.datapipes[k][i]

    def __iter__(self) -> Iterator[T]:
        return chain.from_iterable(self.datapipes)

    def __len__(self) -> int:
        return sum(source_len(self, dp, f"datapipes[{k}]") for k, dp in enumerate(self.datapipes))

    def _index_ordered(self) -> bool:
        return all(index_ordered(dp) for dp in self.datapipes)


@functional_datapipe("zip")
class Zipper(MapDataPipe[tuple[Any, ...]]):
    """Pair up the sources' items by position (functional name: ``zip``).

    Args:
        *datapipes: one or more map-style pipes, read by position ``0 .. len - 1``.

    Yields:
        ``(datapipes[0][i], datapipes[1][i], ...)`` for ``i`` up to the shortest source's length.

    Raises:
        ValueError: no datapipes. TypeError: one is not a ``MapDataPipe``, or an index is not an
            int. IndexError: an index out of range of the shortest source (negative indices count
            from the end of the zipped pipe), naming the stage and ending in torch's words, with the
            shortest source: ``Zipper (length 2): Index 7 is out of range for one of the input
            MapDataPipes SequenceWrapper.``

    ``len()`` is the shortest source's length at call time.

    Example:
        >>> from datapipes.map import SequenceWrapper
        >>> pipe = SequenceWrapper([1, 2, 3]).zip(SequenceWrapper("ab"))
        >>> list(pipe), pipe[-1], len(pipe)
        ([(1, 'a'), (2, 'b')], (2, 'b'), 2)

    See also: :class:`Concater`, :class:`datapipes.iter.Zipper`.
    """

    _saves = "same as SequenceWrapper"

    @overload
    def __init__(self: MapDataPipe[tuple[T]], datapipe: MapDataPipe[T], /) -> None: ...
    @overload
    def __init__(self: MapDataPipe[tuple[T, T1]], datapipe: MapDataPipe[T], dp1: MapDataPipe[T1], /) -> None: ...
    @overload
    def __init__(
        self: MapDataPipe[tuple[T, T1, T2]],
        datapipe: MapDataPipe[T],
        dp1: MapDataPipe[T1],
        dp2: MapDataPipe[T2],
        /,
    ) -> None: ...
    @overload
    def __init__(
        self: MapDataPipe[tuple[T, T1, T2, T3]],
        datapipe: MapDataPipe[T],
        dp1: MapDataPipe[T1],
        dp2: MapDataPipe[T2],
        dp3: MapDataPipe[T3],
        /,
    ) -> None: ...
    @overload
    def __init__(self: MapDataPipe[tuple[Any, ...]], *datapipes: MapDataPipe[Any]) -> None: ...
    def __init__(self, *datapipes: MapDataPipe[Any]) -> None:
        _require_map_pipes(datapipes, "Zipper")
        self.datapipes = datapipes

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        lengths = [len(dp) for dp in self.datapipes]
        n = min(lengths)
        shortest = self.datapipes[lengths.index(n)]  # named in the IndexError, as torch names it
        i = position(self, index, n, "is out of range for one of the input MapDataPipes", shortest)
        return tuple([dp[i] for dp in self.datapipes])

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        # islice stops at len(self) without asking a longer source for one item more.
        return islice(zip(*self.datapipes), len(self))

    def __len__(self) -> int:
        return min(source_len(self, dp, f"datapipes[{k}]") for k, dp in enumerate(self.datapipes))

    def _index_ordered(self) -> bool:
        return all(index_ordered(dp) for dp in self.datapipes)
