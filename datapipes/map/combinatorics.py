"""Shuffler [shuffle on MapDataPipe]: a map-style pipe read in a random order, as an iterable-style pipe.

It returns an :class:`~datapipes.IterDataPipe` because order is what an iterable-style pipe is
about; the map-style pipe itself stays order-free, for random reads. The order is a seeded
bijection of the positions (``datapipes/map/_bijection.py``), computed a block at a time: constant
memory at any length, and a pass resumes from its position and seed.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Callable, Iterator, Sequence, TypeVar

from .._engine.lifecycle import Resumable
from .._positions import handed_out
from .._runtime.passes import Pass
from .._runtime.validate import check_dict, check_int, invalid
from ..datapipe import IterDataPipe, MapDataPipe, functional_datapipe, require_pipe, source_len
from ._bijection import BLOCK, MAX_LENGTH, Permutation
from ._index import require_indices

__all__ = ["Shuffler"]

T = TypeVar("T")

_SEED_MASK = (1 << 64) - 1  # a pass seed is kept modulo 2**64, as the bijection takes it


class _ShuffleRun(Resumable):
    """The position of a map-style ``shuffle`` pass: how many indices it has handed out, the seed
    of its order (``None``: shuffling off, the indices in their order) and how many indices it
    permutes. Saved as three ints (see :class:`Shuffler`'s ``_saves``).

    The loop hands out a block of indices at a time; ``start`` is the block's first position, and
    :meth:`state` adds what the block's iterator has handed out (``_positions.handed_out``), so
    the loop counts nothing per item."""

    __slots__ = ("n", "seed", "start", "taken")

    def __init__(self, n: int, seed: int | None) -> None:
        super().__init__()
        self.n = n
        self.seed = seed
        self.start = 0  # the first position of the block being handed out
        self.taken: Callable[[], int] | None = None  # how many of the block were handed out

    def state(self) -> dict[str, Any]:
        taken = self.taken
        return {"position": self.start + (0 if taken is None else taken()), "seed": self.seed, "length": self.n}

    def load(self, state: dict[str, Any]) -> None:
        check_dict(state, keys=("position", "seed", "length"))
        n = check_int(state, "length", 0, MAX_LENGTH)
        if n != self.n:
            invalid(f"state['length'] is {n}: the state was saved by a pass over {n} indices, and this pass has "
                    f"{self.n}; a permutation of another length is another order")
        if self.seed is None:
            if state["seed"] is not None:
                invalid(f"state['seed'] must be None: this pipe's shuffle is off (set_shuffle(False)), and the state "
                        f"was saved by a shuffling pass (seed {state['seed']!r:.40})")
        elif state["seed"] is None:
            invalid("state['seed'] is None: the state was saved by a pass with shuffling off (set_shuffle(False)), "
                    "and this pipe shuffles")
        else:
            self.seed = check_int(state, "seed", 0, _SEED_MASK)
        self.start = check_int(state, "position", 0, n)


def _blocks(run: _ShuffleRun, keys: Sequence[Any] | None) -> Iterator[Iterator[Any]]:
    """The indices of the pass, a block at a time, from ``run``'s position on: the permuted
    positions (or, shuffling off, the positions in order), through ``keys`` where given."""
    run.started = True
    n, start = run.n, run.start
    if run.seed is None:
        positions: Iterator[Any] = (range(a, min(a + BLOCK, n)) for a in range(start, n, BLOCK))
    else:
        positions = (block.tolist() for block in Permutation(n, run.seed).blocks(start))
    for block in positions:
        if keys is not None:
            block = list(map(keys.__getitem__, block))
        it = iter(block)
        run.start, run.taken = start, handed_out(it)
        yield it
        start += len(block)


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
        ``torch.manual_seed`` reproduces it. The seed is drawn when the pass starts (``iter()``).
        After ``set_shuffle(False)``: the indices in their order, nothing drawn.

    Raises:
        TypeError: ``datapipe`` is not a ``MapDataPipe``, or ``indices`` is not a sized iterable.
        ValueError: at ``iter()``, more than ``2**62`` indices.
        The source's errors (an ``IndexError`` for an index it lacks) pass through unchanged.

    ``len()`` is the number of indices (the source's length at call time when ``indices`` is
    ``None``).

    Memory: constant, whatever the length: the order is a seeded bijection of the positions (a
    Feistel network with cycle-walking, ``datapipes/map/_bijection.py``), computed 4096 positions
    at a time, and no list of them is drawn. (``indices`` other than a ``range`` are copied into a
    list at ``iter()``, as the keys to read.)

    Checkpoint: the state holds the position, the pass's seed and the number of indices (three
    ints), so a resumed pass, seeded or not, goes on with the order of the pass it resumes; a state
    saved over another number of indices is refused. The map-style pipe above keeps nothing (it
    is read by index).

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

    _saves = ("the position, the pass's seed and the number of indices (three ints); the order is computed "
              "again from the seed, and the map-style pipe above keeps nothing (it is read by index)")

    _is_random = True
    _enabled = True  # set_shuffle (a class default: pipes pickled before it existed shuffle)

    #: its position is a place in an order of indices into the map-style pipe, which a resumed pass
    #: reads by index (a keyed pipe loads its source again): the stages above save no position
    _replays_sources = True

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

    def _open(self, ctx: Pass) -> Iterator[T]:
        dp = self.datapipe
        indices = self.indices
        keys: Sequence[Any] | None = None if indices is None else indices if type(indices) is range else list(indices)
        n = len(dp) if keys is None else len(keys)
        if n > MAX_LENGTH:
            raise ValueError(f"Shuffler: at most 2**62 ({MAX_LENGTH}) indices can be shuffled, got {n}")
        # The seed when the pass starts: unseeded passes draw from torch's generator in iter() order.
        run = _ShuffleRun(n, ctx.seed_for(self) & _SEED_MASK if self._enabled else None)
        ctx.track(self, run)
        return map(dp.__getitem__, chain.from_iterable(_blocks(run, keys)))

    def __len__(self) -> int:
        return source_len(self, self.datapipe) if self.indices is None else len(self.indices)
