"""Index checks shared by the positional map-style pipes (Batcher, Concater, Zipper)."""

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
