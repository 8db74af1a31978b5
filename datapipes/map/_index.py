"""Index checks shared by the map-style pipes: positions (Batcher, Concater, Zipper), lists of
indices (Shuffler, MapToIterConverter), and how an index is named in an error note."""

from __future__ import annotations

import operator
from typing import Any

from ..datapipe import stage_label


def position(pipe: Any, index: Any, length: int, torch_phrase: str = "is out of range", source: Any = None) -> int:
    """``index`` as a position in ``range(length)``; negative indices count from the end, as for a
    list.

    Raises ``TypeError`` naming the stage for an index that is not an integer (slices included), and
    ``IndexError`` for one out of range: the stage and its length first, then torch's own message
    for that stage intact (``Index 7 <torch_phrase> <source>.``), so ``except IndexError`` and a
    match on torch's words keep working, e.g. ``Concater (length 5): Index 7 is out of range.``
    """
    try:
        i = operator.index(index)
    except TypeError:
        raise TypeError(f"{stage_label(pipe)}: index must be an int, got {type(index).__name__}") from None
    j = i + length if i < 0 else i
    if 0 <= j < length:
        return j
    named = "" if source is None else f" {source!r}"
    raise IndexError(f"{stage_label(pipe)} (length {length}): Index {i} {torch_phrase}{named}.")


def index_text(index: Any) -> Any:
    """How an error note names ``index``: ``at index 3`` for a position (an int, a numpy integer),
    ``at index 'cat'`` for a key."""
    try:
        return operator.index(index)
    except TypeError:
        return repr(index)


def require_indices(indices: Any, stage: str) -> None:
    """``TypeError`` naming ``stage`` unless ``indices`` is ``None`` or a sized iterable that is not a
    str or bytes."""
    if indices is not None:
        kind = type(indices)
        if not (hasattr(kind, "__len__") and hasattr(kind, "__iter__")) or isinstance(indices, (str, bytes)):
            raise TypeError(
                f"{stage}: indices must be a sized iterable of indices (a list, a range) or None, "
                f"got {kind.__name__}"
            )
