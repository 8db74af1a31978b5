"""Sources and small utilities: IterableWrapper."""

from __future__ import annotations

import copy
from collections.abc import Iterator as _IteratorABC
from typing import Any, Iterable, Iterator, TypeVar

from ..datapipe import IterDataPipe, len_unknown

__all__ = ["IterableWrapper"]

T = TypeVar("T")


class IterableWrapper(IterDataPipe[T]):
    """Wrap an iterable (a list, a range, a dataset, a generator) as the source of a pipe.

    Args:
        iterable: the items. A re-iterable (list, range, tuple, any object whose ``__iter__``
            returns a fresh iterator) gives a new pass at every ``iter()``. A one-shot iterator
            (a generator) can be iterated once: a second pass raises ``RuntimeError`` saying so;
            wrap a list, or a class whose ``__iter__`` builds the generator, to iterate again.
        deepcopy: copy the iterable at the start of each pass, so a pass that mutates items does
            not change the next one. Off by default (copying is slow and rarely needed).

    Yields:
        The items of ``iterable``, in order.

    Raises:
        TypeError: ``iterable`` is not iterable.

    ``len()`` is ``len(iterable)`` at call time; ``TypeError`` where the iterable has no length.

    >>> from datapipes.iter import IterableWrapper
    >>> list(IterableWrapper(range(3)))
    [0, 1, 2]
    >>> len(IterableWrapper([7, 8]))
    2
    """

    def __init__(self, iterable: Iterable[T], deepcopy: bool = False) -> None:
        if not (hasattr(type(iterable), "__iter__") or hasattr(type(iterable), "__getitem__")):
            raise TypeError(f"IterableWrapper: iterable must be iterable, got {type(iterable).__name__}")
        self.iterable = iterable
        self.deepcopy = bool(deepcopy)
        self._one_shot = isinstance(iterable, _IteratorABC)
        self._started = False

    def __iter__(self) -> Iterator[T]:
        if self._one_shot:
            if self._started:
                raise RuntimeError(
                    f"IterableWrapper over a one-shot {type(self.iterable).__name__} was already iterated; "
                    "wrap a list or a re-iterable object to iterate again"
                )
            self._started = True
            return iter(self.iterable)
        if self.deepcopy:
            return iter(copy.deepcopy(self.iterable))
        return iter(self.iterable)

    def __len__(self) -> int:
        try:
            return len(self.iterable)  # type: ignore[arg-type]
        except TypeError:
            raise len_unknown(self, f"its source, a {type(self.iterable).__name__}, has no len()") from None

    def __getstate__(self) -> dict[str, Any]:
        if self._one_shot:
            raise TypeError(
                f"IterableWrapper over a one-shot {type(self.iterable).__name__} cannot be pickled; "
                "wrap a list or a re-iterable object"
            )
        return self.__dict__
