"""Stages that reorder or split a stream: Shuffler [shuffle], Sampler, RandomSplitter [random_split].

Randomness follows DESIGN section 3. A random stage builds one generator per pass from
``self._pass_seed()``: a seeded pipe (``pipe.set_seed(s)``) gives the same order at every pass of an
epoch and a new order at every ``set_epoch(n)``; an unseeded pipe draws a fresh seed from torch's
global generator at every pass, so ``torch.manual_seed(n)`` reproduces a whole program. The pipe
object itself holds no random state, so passes are independent and a pipe pickles to its
description. Each ``__iter__`` reads its seed and creates its source's iterator at once, as part of
the pass being built (:mod:`datapipes._pass`).
"""

from __future__ import annotations

import copy
import math
import random
from bisect import bisect
from itertools import accumulate, islice
from typing import Any, Callable, Hashable, Iterator, Mapping, Sequence, TypeVar

import torch
from torch.utils.data import SequentialSampler

from .._engine import abandon
from ..datapipe import IterDataPipe, functional_datapipe, len_unknown, require_callable, require_int, require_pipe

__all__ = ["Shuffler", "Sampler", "RandomSplitter"]

T = TypeVar("T")

_MISSING = object()


# -- Shuffler --------------------------------------------------------------------------------------


def _buffer_shuffle(it: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    try:
        buf = list(islice(it, size))
        if len(buf) == size:
            rand = rng.random
            for x in it:
                # random() < 1, so int(random() * size) < size for any size below 2**53.
                i = int(rand() * size)
                yield buf[i]
                buf[i] = x
        rng.shuffle(buf)
        yield from buf
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


def _shuffle_on(pipe: Shuffler) -> Iterator[Any]:
    # The seed is drawn when the pass starts (at iter()), before the source's iterator is created,
    # so the order of iter() calls decides which draw from torch's global generator each pass gets.
    rng = random.Random(pipe._pass_seed())
    return _buffer_shuffle(iter(pipe.datapipe), pipe.buffer_size, rng)


def _shuffle_off(pipe: Shuffler) -> Iterator[Any]:
    return iter(pipe.datapipe)


@functional_datapipe("shuffle")
class Shuffler(IterDataPipe[T]):
    """Shuffle the items through a buffer of ``buffer_size`` items (functional name: ``shuffle``).

    The buffer is filled with the first ``buffer_size`` items; then each new item takes the place of
    a randomly chosen buffered one, which is yielded; when the source ends, the buffer is shuffled
    and drained. ``buffer_size=1`` keeps the source order; a buffer at least as large as the source
    gives a uniform permutation. At most ``buffer_size`` items are held.

    Args:
        datapipe: the source pipe.
        buffer_size: the number of items held for shuffling (keyword only, default 10000).
        unbatch_level: unbatch the source this many levels first (``-1``: flatten fully), as
            ``datapipe.unbatch(unbatch_level)`` does; 0 (default) leaves the items as they are.

    Yields:
        The source's items in a random order: every item exactly once.

    Seeds: same seed, same order; each ``set_epoch(n)`` reshuffles; unseeded passes draw their seed
    from torch's global generator (``torch.manual_seed`` reproduces them). ``set_shuffle(False)``
    turns shuffling off (the items pass in source order), as torch's ``set_shuffle`` does.

    ``len()`` is the source's length.

    >>> from datapipes.iter import IterableWrapper
    >>> pipe = IterableWrapper(range(10)).shuffle(buffer_size=4).set_seed(0)
    >>> list(pipe) == list(pipe), sorted(pipe) == list(range(10))
    (True, True)
    >>> list(pipe.set_shuffle(False))
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]

    See also: :class:`Sampler` for torch samplers, the map-style ``shuffle`` for a full permutation
    of an indexable dataset.
    """

    _is_random = True
    _repr_fields = ("buffer_size",)

    def __init__(self, datapipe: IterDataPipe[Any], *, buffer_size: int = 10000, unbatch_level: int = 0) -> None:
        require_pipe(datapipe, "Shuffler")
        require_int(buffer_size, "Shuffler", "buffer_size", minimum=1)
        require_int(unbatch_level, "Shuffler", "unbatch_level", minimum=-1)
        self.datapipe = datapipe if unbatch_level == 0 else datapipe.unbatch(unbatch_level=unbatch_level)  # type: ignore[attr-defined]
        self.buffer_size = buffer_size
        self._enabled = True
        self._run: Callable[[Shuffler[T]], Iterator[T]] = _shuffle_on

    def set_shuffle(self, shuffle: bool = True) -> Shuffler[T]:
        """Turn shuffling on or off (off: the items pass in source order); returns the pipe."""
        self._enabled = bool(shuffle)
        self._run = _shuffle_on if self._enabled else _shuffle_off
        return self

    def __iter__(self) -> Iterator[T]:
        return self._run(self)

    def __len__(self) -> int:
        return len(self.datapipe)  # type: ignore[arg-type]


# -- Sampler ---------------------------------------------------------------------------------------


def _sample_plain(pipe: Sampler) -> Iterator[Any]:
    return iter(pipe.sampler)


def _sample_seeded(pipe: Sampler) -> Iterator[Any]:
    generator = torch.Generator()
    generator.manual_seed(pipe._pass_seed())
    sampler = copy.copy(pipe.sampler)
    sampler.generator = generator
    return iter(sampler)


class Sampler(IterDataPipe[Any]):
    """Yield what a ``torch.utils.data.Sampler`` built over the source yields (no functional name,
    as in torch).

    As torch's ``SamplerIterDataPipe`` does, the sampler is built as
    ``sampler(*sampler_args, data_source=datapipe, **sampler_kwargs)`` and the pipe yields what
    iterating the sampler yields. torch's samplers (``SequentialSampler``, ``RandomSampler``, ...)
    yield *indices* ``0 .. len(datapipe) - 1``, not the items: over ``IterableWrapper(["a", "b"])``
    the default sampler yields ``0, 1``. To get items in the sampler's order, index an indexable
    dataset with them (``.map(dataset.__getitem__)``) or write a sampler that yields items.

    Args:
        datapipe: the source pipe; it must have a ``len()``, which the sampler reads.
        sampler: the sampler class (or any callable returning an iterable), default
            ``torch.utils.data.SequentialSampler``.
        sampler_args: positional arguments for ``sampler``. ``data_source`` goes by keyword, so
            these must not fill a leading ``data_source`` parameter (torch's samplers have one:
            give their options in ``sampler_kwargs``).
        sampler_kwargs: keyword arguments for ``sampler``; ``data_source`` is set to ``datapipe``.

    Yields:
        What the sampler yields, in its order.

    Raises:
        TypeError: ``datapipe`` has no ``len()``.
        TypeError / ValueError: the sampler cannot be built from these arguments (the message
            names the sampler; e.g. torch's ``RandomSampler`` refuses an empty source).

    Seeds: a sampler whose ``generator`` attribute is left ``None`` (torch's ``RandomSampler``)
    gets, at each pass, a copy with a ``torch.Generator`` seeded from the
    pipe's seed: same seed same order, ``set_epoch(n)`` reshuffles, unseeded passes draw from torch's
    global generator. A sampler given its own ``generator`` keeps it.

    ``len()`` is the sampler's ``len()``; ``TypeError`` where the sampler has none.

    >>> from torch.utils.data import RandomSampler
    >>> from datapipes.iter import IterableWrapper, Sampler
    >>> list(Sampler(IterableWrapper(["a", "b", "c"])))
    [0, 1, 2]
    >>> pipe = Sampler(IterableWrapper(range(5)), sampler=RandomSampler).set_seed(0)
    >>> list(pipe) == list(pipe), sorted(pipe)
    (True, [0, 1, 2, 3, 4])

    See also: :class:`Shuffler` for a buffer shuffle of the items themselves.
    """

    #: the sampler decides whether (and when) the source is iterated: torch's only take its len() (see datapipes._pass.unbuilt)
    _builds_sources_later = True

    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        sampler: Callable[..., Any] = SequentialSampler,
        sampler_args: Sequence[Any] | None = None,
        sampler_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        require_pipe(datapipe, "Sampler")
        require_callable(sampler, "Sampler", "sampler")
        if sampler_args is not None and not isinstance(sampler_args, (tuple, list)):
            raise TypeError(f"Sampler: sampler_args must be a tuple or None, got {type(sampler_args).__name__}")
        if sampler_kwargs is not None and not isinstance(sampler_kwargs, Mapping):
            raise TypeError(f"Sampler: sampler_kwargs must be a dict or None, got {type(sampler_kwargs).__name__}")
        if sampler_kwargs is not None and "data_source" in sampler_kwargs:
            raise ValueError("Sampler: sampler_kwargs must not hold data_source: the sampler samples from datapipe")
        try:
            len(datapipe)  # type: ignore[arg-type]
        except TypeError as e:
            raise TypeError(f"Sampler: datapipe must have a len(), which the sampler reads: {e}") from None
        self.datapipe = datapipe
        self.sampler_args = tuple(sampler_args or ())
        self.sampler_kwargs = dict(sampler_kwargs or {})
        name = getattr(sampler, "__qualname__", None) or type(sampler).__name__
        try:
            self.sampler = sampler(*self.sampler_args, data_source=datapipe, **self.sampler_kwargs)
        except (TypeError, ValueError) as e:
            what = f"Sampler: cannot build sampler {name}(*sampler_args, data_source=datapipe, **sampler_kwargs): {e}"
            raise (TypeError(what) if isinstance(e, TypeError) else ValueError(what)) from e
        if not hasattr(type(self.sampler), "__iter__"):
            raise TypeError(f"Sampler: sampler {name} built a {type(self.sampler).__name__}, which is not iterable")
        # A sampler drawing from its own unset generator takes one seeded from the pipe at each pass.
        self._is_random = getattr(self.sampler, "generator", _MISSING) is None
        self._run: Callable[[Sampler], Iterator[Any]] = _sample_seeded if self._is_random else _sample_plain

    def __iter__(self) -> Iterator[Any]:
        return self._run(self)

    def __len__(self) -> int:
        if not hasattr(type(self.sampler), "__len__"):
            raise len_unknown(self, f"its sampler, a {type(self.sampler).__name__}, has no len()")
        return len(self.sampler)


# -- RandomSplitter --------------------------------------------------------------------------------


class _Split:
    """What the children of one :class:`RandomSplitter` share: keys, weights, seed, total length.

    Plain data: each pass builds its own generator from it, so children never share runtime state.
    """

    def __init__(self, keys: list[Hashable], weights: list[float], seed: int, total_length: int | None) -> None:
        self.keys = keys
        self.weights = weights
        self.seed = seed
        self.total_length = total_length



def _normalize(weights: list[float], total: int) -> list[float]:
    wsum = sum(weights)
    return [float(w) * total / wsum for w in weights]


def _exact_sizes(weights: list[float], total: int) -> list[int] | None:
    """The group sizes when ``weights`` scale to whole numbers summing to ``total``, else None.

    Scaled weights within rounding error of whole numbers (``0.7 * 10 / 1.0`` is
    ``7.000000000000001``) count as whole: the draws then give exactly those sizes, short of a
    draw of probability ~1e-15 landing on the rounding residue.
    """
    sizes = _normalize(weights, total)
    rounded = [round(s) for s in sizes]
    if sum(rounded) != total or any(abs(s - r) > 1e-9 * max(1, total) for s, r in zip(sizes, rounded)):
        return None
    return rounded


def _split_run(pipe: SplitterIterator, it: Iterator[Any], seed: int) -> Iterator[Any]:
    split = pipe._split
    rand = random.Random(seed).random
    target = pipe._index
    try:
        total = pipe._total()
        weights = _normalize(split.weights, total)
        last = len(weights) - 1
        remaining = total
        for item in it:
            if remaining <= 0:
                raise ValueError(f"{_child_label(pipe)}: the source yielded more than total_length={total} items")
            # random.choices(range(n), weights) inlined: the same draws as torchdata's RandomSplitter,
            # so a seed splits the same way there and here.
            cum = list(accumulate(weights))
            k = bisect(cum, rand() * (cum[-1] + 0.0), 0, last)
            weights[k] -= 1
            remaining -= 1
            if weights[k] < 0:
                weights[k] = 0
                weights = _normalize(weights, remaining) if remaining > 0 else [0.0] * len(weights)
            if k == target:
                yield item
    except BaseException:
        abandon(it)
        raise


def _child_label(pipe: SplitterIterator) -> str:
    return f"SplitterIterator({pipe.target!r})"


def _check_weights(weights: Any) -> tuple[list[Hashable], list[float]]:
    if not isinstance(weights, Mapping):
        raise TypeError(f"RandomSplitter: weights must be a dict of split name -> weight, got {type(weights).__name__}")
    if not weights:
        raise ValueError("RandomSplitter: weights must name at least one split, got {}")
    keys, values = list(weights.keys()), []
    for k in keys:
        w = weights[k]
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            raise TypeError(f"RandomSplitter: weights[{k!r}] must be a number, got {type(w).__name__}")
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"RandomSplitter: weights[{k!r}] must be a finite number >= 0, got {w!r}")
        values.append(w)
    if sum(values) <= 0:
        raise ValueError(f"RandomSplitter: weights must not all be 0, got {dict(weights)!r}")
    return keys, values


@functional_datapipe("random_split")
class RandomSplitter(IterDataPipe[T]):
    """Split the items at random into named groups, the same way at every pass (functional name:
    ``random_split``).

    Calling ``RandomSplitter(...)`` (or ``pipe.random_split(...)``) returns the children, not a
    ``RandomSplitter``: a list of pipes in the order of ``weights``, or the one pipe for ``target``.
    Each child reads the source in its own pass and keeps the items drawn for its group, so the
    children may be iterated one after the other or at the same time.

    Args:
        source_datapipe: the source pipe.
        weights: split name -> weight, e.g. ``{"train": 0.8, "valid": 0.2}``. Weights are scaled to
            ``total_length``; integer weights summing to ``total_length`` give exact split sizes.
        seed: an int deciding the split. The split is the same at every pass and epoch (train and
            valid never exchange items); ``override_seed`` on any child changes it for all children
            from their next pass. ``pipe.set_seed``/``set_epoch`` leave it alone on purpose: they
            reach only the children downstream of them, and differing seeds would make the
            children overlap.
        total_length: how many items the source yields; ``None`` (default): ``len(source_datapipe)``,
            read at each pass.
        target: return only the child for this split name; ``None`` (default): all children.

    Yields:
        Each child yields its group's items, in source order. For a seed, the split is the one
        torchdata's ``RandomSplitter`` draws.

    Raises:
        TypeError: ``total_length`` is None and the source has no ``len()``.
        ValueError: bad weights or ``target``; at iteration, a source yielding more than
            ``total_length`` items.

    A child's ``len()`` is its group's size when the weights scale to whole numbers summing to the
    total length (it assumes the source yields ``total_length`` items); ``TypeError`` otherwise.

    >>> from datapipes.iter import IterableWrapper
    >>> train, valid = IterableWrapper(range(10)).random_split(weights={"train": 0.5, "valid": 0.5}, seed=0)
    >>> list(train), list(valid)
    ([2, 3, 5, 7, 8], [0, 1, 4, 6, 9])
    >>> len(train)
    5
    >>> list(IterableWrapper(range(10)).random_split({"train": 0.5, "valid": 0.5}, seed=0, target="valid"))
    [0, 1, 4, 6, 9]

    See also: :class:`Shuffler`; ``demux`` for a split decided by a function of the item.
    """

    def __new__(  # type: ignore[misc]
        cls,
        source_datapipe: IterDataPipe[T],
        weights: Mapping[Hashable, float],
        seed: int,
        total_length: int | None = None,
        target: Hashable | None = None,
    ) -> Any:
        require_pipe(source_datapipe, "RandomSplitter", "source_datapipe")
        keys, values = _check_weights(weights)
        require_int(seed, "RandomSplitter", "seed")
        require_int(total_length, "RandomSplitter", "total_length", minimum=0, optional=True)
        if target is not None and target not in weights:
            raise ValueError(f"RandomSplitter: target={target!r} is not a key of weights {keys!r}")
        if total_length is None:
            try:
                len(source_datapipe)  # type: ignore[arg-type]
            except TypeError as e:
                raise TypeError(
                    f"RandomSplitter: total_length is needed: it cannot be taken from the source: {e}"
                ) from None
        split = _Split(keys, values, seed, total_length)
        if target is not None:
            return SplitterIterator(source_datapipe, split, target)
        return [SplitterIterator(source_datapipe, split, k) for k in keys]


class SplitterIterator(IterDataPipe[T]):
    """One group of a :class:`RandomSplitter` (the name torchdata gives it); built by
    ``random_split``, not directly.

    ``override_seed(seed)`` changes the split of every child of the same ``random_split`` call from
    their next pass, e.g. for a new split per epoch; returns this child.
    """

    _repr_fields = ("target",)

    def __init__(self, source_datapipe: IterDataPipe[T], split: _Split, target: Hashable) -> None:
        if not isinstance(split, _Split):
            raise TypeError("SplitterIterator is built by RandomSplitter / random_split, not directly")
        self.source_datapipe = source_datapipe
        self._split = split
        self.target = target
        self._index = split.keys.index(target)

    def override_seed(self, seed: int) -> SplitterIterator[T]:
        """Use ``seed`` for the split of every child of this ``random_split`` from the next pass on."""
        require_int(seed, _child_label(self), "seed")
        self._split.seed = seed
        return self

    def _total(self) -> int:
        total = self._split.total_length
        return len(self.source_datapipe) if total is None else total  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[T]:
        # The split's seed is plain data shared by the children (not a pass seed): read when the
        # pass starts, so an override_seed() reaches the passes started after it.
        return _split_run(self, iter(self.source_datapipe), self._split.seed)

    def __len__(self) -> int:
        total = self._total()
        sizes = _exact_sizes(self._split.weights, total)
        if sizes is None:
            raise len_unknown(
                self,
                f"the weights {dict(zip(self._split.keys, self._split.weights))!r} do not split "
                f"total_length={total} into whole numbers",
            )
        return sizes[self._index]
