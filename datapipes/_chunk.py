"""``DataChunk``: what ``batch`` yields, a ``list`` with torch's ``DataChunk`` methods.

A bottom module (it imports nothing of the package), so that the collate functions, the batching
stages and the base classes can all know it.
"""

from __future__ import annotations

from typing import Any, Iterator, TypeVar

__all__ = ["DataChunk"]

T = TypeVar("T")


class DataChunk(list[T]):
    """A batch: a ``list`` (equal to the list of its items, indexable, sliceable, picklable) with
    torch's ``DataChunk`` methods, so code written for ``torch.utils.data.datapipes`` that calls them
    keeps working. Unlike torch's, iterating it runs at a plain list's speed (no generator
    ``__iter__``), and it keeps no second copy of its items.

    Example:
        >>> chunk = DataChunk([1, 2, 3])
        >>> chunk == [1, 2, 3], chunk.as_str(indent="  ")
        (True, '  [1, 2, 3]')
        >>> list(chunk.raw_iterator())
        [1, 2, 3]
    """

    __slots__ = ()

    def as_str(self, indent: str = "") -> str:
        """``indent`` followed by the items' ``str()`` in brackets, as torch's."""
        return indent + "[" + ", ".join(str(i) for i in self) + "]"

    def raw_iterator(self) -> Iterator[T]:
        """An iterator over the items, as torch's."""
        return list.__iter__(self)

    @property
    def items(self) -> list[T]:
        """The items (torch keeps them in a second list; here they are the chunk itself)."""
        return self

    def __reduce_ex__(self, protocol: Any) -> Any:
        return DataChunk, (list(self),)
