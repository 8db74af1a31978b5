"""Index checks shared by the map-style pipes: positions (Batcher, Concater, Zipper) and lists of
indices (Shuffler, MapToIterConverter)."""

from __future__ import annotations

import operator
from typing import Any

from ..datapipe import stage_label


def position(pipe: Any, index: Any, length: int) -> int:
    """``index`` as a position in ``range(length)``; negative indices count from the end, as for a
    list.

    Raises ``TypeError`` naming the stage for an index that is not an integer (slices included),
    ``IndexError`` naming the stage for one out of range.
    """
    try:
        i = operator.index(index)
    except TypeError:
        raise TypeError(f"{stage_label(pipe)}: index must be an int, got {type(index).__name__}") from None
    j = i + length if i < 0 else i
    if 0 <= j < length:
        return j
    raise IndexError(f"{stage_label(pipe)}: index {i} out of range for length {length}")


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
