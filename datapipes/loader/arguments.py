"""The arguments both spellings of :class:`~datapipes.loader.DataLoader` share, checked with the
loader's messages. The SPDL translation (:mod:`.spdl_spelling`) checks them first, as the loader
does, so a call reports the same first error in either spelling.
"""

from __future__ import annotations

from typing import Any

from .._checks import require_bool
from ..datapipe import require_int
from .distributed import _WHERE

__all__ = ["check_shared", "check_timeout", "data_of"]

_EVEN = (None, "drop", "pad")


def data_of(pipe: Any, src: Any) -> tuple[Any, str]:
    """What the loader reads (given as ``pipe`` or SPDL's ``src``) and the name it was given by."""
    if pipe is not None and src is not None:
        raise TypeError(f"{_WHERE}: give the data once, as pipe or as src, not both")
    data = pipe if src is None else src
    if data is None:
        raise TypeError(f"{_WHERE}: missing the data: DataLoader(pipe, ...) or DataLoader(src=..., ...)")
    return data, "src" if src is not None else "pipe"


def check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{_WHERE}: timeout must be a number of seconds or None, got {type(timeout).__name__}")
    if timeout == 0:
        return None  # torch's default: no timeout
    if not timeout > 0:
        raise ValueError(f"{_WHERE}: timeout must be > 0 (or 0 or None: no timeout), got {timeout!r}")
    return float(timeout)


def check_shared(batch_size: Any, drop_last: Any, seed: Any, even_batches: Any,
                 timeout: Any) -> tuple[bool, float | None]:
    """Check the arguments of both spellings, in the loader's order; returns ``drop_last`` as a bool
    and ``timeout`` in seconds (``None``: no timeout)."""
    require_int(batch_size, _WHERE, "batch_size", minimum=1, optional=True)
    drop = require_bool(drop_last, _WHERE, "drop_last", ints=True)
    if drop and batch_size is None:
        raise ValueError(f"{_WHERE}: drop_last=True needs a batch_size, got batch_size=None")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"{_WHERE}: seed must be an int or None, got {type(seed).__name__}")
    if even_batches not in _EVEN or isinstance(even_batches, bool):
        raise ValueError(f"{_WHERE}: even_batches must be None, 'drop' or 'pad', got {even_batches!r}")
    return drop, check_timeout(timeout)
