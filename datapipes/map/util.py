"""Sources of map-style pipes: SequenceWrapper."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import Any, Iterator, Sequence, TypeVar

from ..datapipe import MapDataPipe, stage_label
from ..errors import add_stage_note
from ._index import index_text

__all__ = ["SequenceWrapper"]

T = TypeVar("T")

#: Built-in sequences whose own iterator yields exactly ``seq[0], ..., seq[len - 1]``.
_NATIVE = (list, tuple, range)


def _iter_native(pipe: SequenceWrapper[Any]) -> Iterator[Any]:
    return iter(pipe.sequence)


def _iter_mapping(pipe: SequenceWrapper[Any]) -> Iterator[Any]:
    return iter(pipe.sequence.values())  # type: ignore[attr-defined]


def _iter_indexed(pipe: SequenceWrapper[Any]) -> Iterator[Any]:
    seq = pipe.sequence
    for i in range(len(seq)):
        yield seq[i]


class SequenceWrapper(MapDataPipe[T]):
    """Wrap an indexable object with a length (a list, a tuple, a range, a numpy array, a dict, a
    torch ``Dataset`` with ``__len__``) as the source of a map-style pipe.

    Args:
        sequence: the items. ``pipe[index]`` is ``sequence[index]``: the sequence decides which
            indices it accepts (a list takes negative indices and raises ``IndexError`` out of
            range; a dict takes its keys and raises ``KeyError``), as in torch.
        deepcopy: copy ``sequence`` once, here, so that later changes to the original do not reach
            the pipe. Off by default (copying is slow and rarely needed). A sequence that cannot be
            deep-copied is used as it is, with a warning, as in torch DataPipes.

    Yields:
        ``sequence[0], ..., sequence[len - 1]``; for a mapping (a dict), its values in key order.

    Raises:
        TypeError: ``sequence`` has no ``__getitem__`` or no ``__len__``.
        Whatever ``sequence[index]`` raises (``IndexError``, ``KeyError``, ...), as the same object
        with its message (``list index out of range``), and a note naming the stage and the index:
        ``[datapipes] raised in stage SequenceWrapper at index 7``.

    ``len()`` is ``len(sequence)`` at call time.

    >>> from datapipes.map import SequenceWrapper
    >>> pipe = SequenceWrapper(["a", "b", "c"])
    >>> pipe[1], pipe[-1], len(pipe)
    ('b', 'c', 3)
    >>> SequenceWrapper({"x": 1, "y": 2})["y"]
    2

    See also: :class:`datapipes.iter.IterableWrapper` for iterable-style sources.
    """

    def __init__(self, sequence: Sequence[T], deepcopy: bool = False) -> None:
        kind = type(sequence)
        if not (hasattr(kind, "__getitem__") and hasattr(kind, "__len__")):
            raise TypeError(
                f"SequenceWrapper: sequence must support indexing and len(), got {kind.__name__}"
            )
        if deepcopy:
            try:
                sequence = copy.deepcopy(sequence)
            except Exception as e:  # noqa: BLE001 - any failure to copy falls back, as torch does
                warnings.warn(
                    f"SequenceWrapper: the {kind.__name__} cannot be deep-copied ({e!r}); it is used as it "
                    "is, so changing it in place changes what the pipe returns",
                    stacklevel=2,
                )
        self.sequence = sequence
        self.deepcopy = bool(deepcopy)
        if kind in _NATIVE:
            self._run = _iter_native
        elif isinstance(sequence, Mapping):
            self._run = _iter_mapping
        else:
            self._run = _iter_indexed

    def __getitem__(self, index: Any) -> T:
        try:
            return self.sequence[index]
        except Exception as e:  # free unless raised (CPython 3.11+)
            add_stage_note(e, stage_label(self), index_text(index), "index")
            raise

    def __iter__(self) -> Iterator[T]:
        return self._run(self)

    def __len__(self) -> int:
        return len(self.sequence)
