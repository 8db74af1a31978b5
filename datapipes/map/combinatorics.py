"""Shuffler [shuffle on MapDataPipe]: a map-style pipe read in a random order, as an iterable-style pipe.

It returns an :class:`~datapipes.IterDataPipe` because order is what an iterable-style pipe is
about; the map-style pipe itself stays order-free, for random reads.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence, TypeVar

import numpy as np

from ..datapipe import IterDataPipe, MapDataPipe, functional_datapipe, require_pipe, source_len
from ._index import require_indices

__all__ = ["Shuffler"]

T = TypeVar("T")


@functional_datapipe("shuffle", source=MapDataPipe)
class Shuffler(IterDataPipe[T]):
    """Read a map-style pipe in a random permutation of its indices (functional name: ``shuffle``),
    on :class:`~datapipes.MapDataPipe`.

    Args:
        datapipe: the source map-style pipe.
        indices: the indices to permute (keyword only), e.g. the keys of a keyed pipe or a subset of
            positions. ``None``: ``range(len(datapipe))``, read at the start of each pass.

    Yields:
        ``datapipe[i]`` for every ``i`` of the indices, each once, in an order drawn per pass:
        from the pipe's seed and epoch (:meth:`set_seed`, :meth:`set_epoch`: same seed and epoch,
        same order; each epoch reshuffles), or with no seed from torch's global generator, so
        ``torch.manual_seed`` reproduces it. The order is drawn when the pass starts (``iter()``).
        After ``set_shuffle(False)``: the indices in their order, nothing drawn.

    Raises:
        TypeError: ``datapipe`` is not a ``MapDataPipe``, or ``indices`` is not a sized iterable.
        The source's errors (an ``IndexError`` for an index it lacks) pass through unchanged.

    ``len()`` is the number of indices (the source's length at call time when ``indices`` is
    ``None``).

    ``set_shuffle(False)`` turns shuffling off and ``set_shuffle(True)`` on again, as torch's: so
    ``graph_settings.apply_shuffle_settings`` and ``torch.utils.data.DataLoader(shuffle=...)``, which
    look for stages with ``set_shuffle`` and ``set_seed`` methods, find this one too (and do not add
    a shuffle of their own).

    Example:
        >>> from datapipes.map import SequenceWrapper
        >>> pipe = SequenceWrapper(range(10)).shuffle().set_seed(0)
        >>> sorted(pipe) == list(range(10)), list(pipe) == list(pipe), len(pipe)
        (True, True, 10)
        >>> sorted(SequenceWrapper({"a": 1, "b": 2}).shuffle(indices=["a", "b"]))
        [1, 2]
        >>> list(SequenceWrapper(range(5)).shuffle().set_shuffle(False))
        [0, 1, 2, 3, 4]

    See also: :class:`datapipes.iter.Shuffler`, the buffered shuffle of an iterable-style pipe.
    """

    _saves = "cannot save yet: ``state_dict()`` raises ``TypeError``"

    _is_random = True
    _enabled = True  # set_shuffle (a class default: pipes pickled before it existed shuffle)

    def __init__(self, datapipe: MapDataPipe[T], *, indices: Sequence[Any] | None = None) -> None:
        require_pipe(datapipe, "Shuffler", kind=MapDataPipe)
        require_indices(indices, "Shuffler")
        self.datapipe = datapipe
        self.indices = indices
        self._enabled = True

    def set_shuffle(self, shuffle: bool = True) -> Shuffler[T]:
        """Turn shuffling on or off (off: the indices in their order); returns the pipe."""
        self._enabled = bool(shuffle)
        return self

    def __iter__(self) -> Iterator[T]:
        dp = self.datapipe
        if not self._enabled:
            return map(dp.__getitem__, range(len(dp)) if self.indices is None else list(self.indices))
        # A numpy permutation costs ~50 ns per index against ~580 ns for random.Random.shuffle.
        rng = np.random.default_rng(self._pass_seed())
        if self.indices is None:
            order = rng.permutation(len(dp)).tolist()
        else:
            keys = list(self.indices)
            order = [keys[i] for i in rng.permutation(len(keys)).tolist()]
        return map(dp.__getitem__, order)

    def __len__(self) -> int:
        return source_len(self, self.datapipe) if self.indices is None else len(self.indices)
