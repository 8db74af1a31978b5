"""Stages that reorder or split a stream: Shuffler [shuffle], Sampler, RandomSplitter [random_split].

Randomness follows docs/concepts.rst ("Determinism and seeds"). A random stage builds one generator per pass from
its pass seed (``ctx.seed_for(self)``): a seeded pipe (``pipe.set_seed(s)``) gives the same order at every pass of an
epoch and a new order at every ``set_epoch(n)``; an unseeded pipe draws a fresh seed from torch's
global generator at every pass, so ``torch.manual_seed(n)`` reproduces a whole program. The pipe
object itself holds no random state, so passes are independent and a pipe pickles to its
description. Each ``_open(ctx)`` reads its seed and creates its source's iterator (``ctx.open``) at
once, as part of the pass it is handed (:mod:`datapipes._runtime.passes`).
"""

from __future__ import annotations

import copy
import math
import random
from bisect import bisect
from itertools import accumulate, islice
from operator import length_hint
from typing import Any, Callable, Hashable, Iterable, Iterator, Literal, Mapping, Sequence, TypeVar, cast, overload

import torch
from torch.utils.data import Sampler as TorchSampler
from torch.utils.data import SequentialSampler

from .._runtime.passes import Pass
from .._runtime.validate import check_dict, check_int, check_list, check_rng, check_str, invalid
from .._engine import abandon
from .._checks import ArgumentTypeError
from .._runtime.observe import Observed
from ..datapipe import IterDataPipe, functional_datapipe, lacks_len, len_root, len_unknown, require_callable, require_int, require_pipe, source_len, stage_label
from .util import _deferred, _SourceRun
from .._engine.lifecycle import Resumable

__all__ = ["Shuffler", "Sampler", "RandomSplitter"]

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

_MISSING = object()


# -- Shuffler --------------------------------------------------------------------------------------


def _rng_state(rng: random.Random) -> list[Any]:
    """``rng.getstate()`` as plain data: ``[version, [625 ints], gauss_next]``."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _set_rng_state(rng: random.Random, state: list[Any]) -> None:
    rng.setstate((state[0], tuple(state[1]), state[2]))


#: iterators whose position, and the items they yielded, can be read back from their sequence
_RECOMPUTABLE = frozenset(type(iter(x)) for x in cast("tuple[Sequence[Any], ...]", ([], (), range(0))))


class _ShuffleRun(Resumable):
    """The position of a ``shuffle`` pass, read when the state is taken, at no per-item cost.
    Phases: ``"fill"`` (nothing read yet), ``"swap"`` (the buffer is full: each new item replaces
    the one yielded), ``"drain"`` (the source ended: the shuffled buffer is yielded), ``"end"``.

    Where the buffer can be recomputed, it is not saved: over a list, tuple or range read directly
    (``IterableWrapper(paths).shuffle()``) the state is the generator's state when the pass started
    (625 ints) and how far the source was read; a resumed pass replays the draws on positions (about
    0.1 µs per item read) and takes the buffered items from the sequence. Elsewhere the state holds
    the generator's state and the buffered items (at most ``buffer_size``: the state's cost)."""

    __slots__ = ("rng", "buf", "drain", "resume", "final", "sequence", "source", "origin", "size")

    def __init__(self, rng: random.Random, sequence: Any = None, source: Iterator[Any] | None = None,
                 size: int | None = None) -> None:
        self.rng = rng
        self.size = size  # buffer_size: a loaded buffer holds at most that many items
        self.buf: list[Any] | None = None  # the buffer, once filled
        self.drain: Iterator[Any] | None = None  # the buffer's iterator, once draining
        self.started = False
        self.resume: dict[str, Any] | None = None
        self.final: dict[str, Any] | None = None
        self.sequence = sequence  # the source's sequence, when the buffer can be recomputed from it
        self.source = source  # ... and the source's iterator over it
        self.origin: Any = None  # the generator's state when the pass (or the pass it resumes) started

    def state(self) -> dict[str, Any]:
        if self.final is not None:
            return self.final
        if self.resume is not None and not self.started:
            return self.resume
        buf, drain = self.buf, self.drain
        if buf is None:
            return {"phase": "fill", "buffer": [], "rng": _rng_state(self.rng)}
        if self.sequence is not None:  # positions, not items
            origin = self.origin
            if isinstance(origin, tuple):  # rng.getstate(): as plain data, once per pass
                origin = self.origin = [origin[0], list(origin[1]), origin[2]]
            rng = origin
            if drain is not None:
                return {"phase": "drain", "read": len(self.sequence), "left": length_hint(drain), "rng": rng}
            # how far the source was read: its length less what its iterator has left (exact for these)
            return {"phase": "swap", "read": len(self.sequence) - length_hint(self.source), "rng": rng}
        if drain is not None:
            return {"phase": "drain", "buffer": buf[len(buf) - length_hint(drain):], "rng": _rng_state(self.rng)}
        return {"phase": "swap", "buffer": list(buf), "rng": _rng_state(self.rng)}

    def load(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("phase") not in ("fill", "swap", "drain", "end"):
            raise ValueError(f"load_state_dict: not the state of a shuffle: {str(state)[:200]}")
        if "read" in state and self.sequence is None:
            raise ValueError("load_state_dict: this shuffle's state holds positions in a list, tuple or range read "
                             "directly, and this pipe's shuffle reads another kind of source")
        check_dict(state)
        check_str(state, "phase")
        check_rng(state)
        size = self.size
        if "read" in state:  # positions in the sequence, whose items the resumed pass takes
            read = check_int(state, "read", 0, len(self.sequence))
            if state["phase"] == "drain":
                check_int(state, "left", 0, read if size is None else min(size, read))
        else:
            check_list(state, "buffer", size, limit=f"buffer_size={size}")
        self.resume = state

    def release(self) -> None:
        """Keep the state and let go of the buffer (the pass ended, or was closed or dropped)."""
        self.final = {"phase": "end", "buffer": [], "rng": _rng_state(self.rng)}
        self.buf = self.drain = None


def _replayed(rng: random.Random, size: int, state: dict[str, Any], sequence: Any) -> list[Any]:
    """The buffer a pass over ``sequence`` held where ``state`` (positions) says, its draws replayed on
    positions with ``rng`` (left as the pass left it)."""
    read = int(state["read"])
    buf = list(range(min(size, read)))
    rand = rng.random
    for j in range(size, read):  # the swap phase's draws, as _buffer_shuffle makes them
        buf[int(rand() * size)] = j
    if state["phase"] == "drain":
        rng.shuffle(buf)
        buf = buf[len(buf) - int(state["left"]):]
    return [sequence[i] for i in buf]


def _buffer_shuffle(it: Iterator[Any], size: int, run: _ShuffleRun) -> Iterator[Any]:
    rng = run.rng
    run.started = True
    phase = "fill"
    resume = run.resume
    try:
        if resume is not None:  # a resumed pass goes on with the saved buffer and generator
            _set_rng_state(rng, resume["rng"])
            if "read" in resume:
                run.origin = rng.getstate()
                phase, buf = resume["phase"], _replayed(rng, size, resume, run.sequence)
            else:
                phase, buf = resume["phase"], list(resume["buffer"])
                if run.sequence is not None:  # saved before its first draw: the pass starts here
                    run.origin = rng.getstate()
        elif run.sequence is not None:
            run.origin = rng.getstate()
        if phase == "fill":
            buf = list(islice(it, size))
            phase = "swap" if len(buf) == size else "drain"
            if phase == "drain":
                rng.shuffle(buf)
        if phase == "swap":
            run.buf = buf
            rand = rng.random
            for x in it:
                # random() < 1, so int(random() * size) < size for any size below 2**53.
                i = int(rand() * size)
                y = buf[i]
                buf[i] = x  # before the yield: at every yield the buffer is the state
                yield y
            rng.shuffle(buf)
        if phase != "end":
            run.buf = buf
            run.drain = drain = iter(buf)
            yield from drain
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise
    finally:
        run.release()


def _shuffle_on(pipe: Shuffler, ctx: Pass) -> Iterator[Any]:
    # The seed is drawn when the pass starts (at iter()), before the source's iterator is created,
    # so the order of iter() calls decides which draw from torch's global generator each pass gets.
    rng = random.Random(ctx.seed_for(pipe))
    source = ctx.open(pipe.datapipe)
    sequence = getattr(pipe.datapipe, "iterable", None)
    # In an observed pass (a hook, profile) the source's iterator comes wrapped: its position is
    # the wrapped one's, which the wrapper only forwards.
    inner = source.it if type(source) is Observed else source
    if type(sequence) in (list, tuple, range) and type(inner) in _RECOMPUTABLE:
        # The source is the sequence's own iterator, which every pass starts at 0 (a resumed one
        # may have moved it already, where the shuffle is built late): positions are absolute.
        run = _ShuffleRun(rng, sequence, inner, pipe.buffer_size)
    else:
        run = _ShuffleRun(rng, size=pipe.buffer_size)
    it = _buffer_shuffle(source, pipe.buffer_size, run)
    ctx.track(pipe, run)
    return it


def _shuffle_off(pipe: Shuffler, ctx: Pass) -> Iterator[Any]:
    return ctx.open(pipe.datapipe)


@functional_datapipe("shuffle")
class Shuffler(IterDataPipe[T]):
    """Shuffle the items through a buffer of ``buffer_size`` items (functional name: ``shuffle``).

    The buffer is filled with the first ``buffer_size`` items; then each new item takes the place of
    a randomly chosen buffered one, which is yielded; when the source ends, the buffer is shuffled
    and drained. ``buffer_size=1`` keeps the source order; a buffer at least as large as the source
    gives a uniform permutation. At most ``buffer_size`` items are held.

    Args:
        datapipe: the source pipe.
        buffer_size: the number of items held for shuffling (keyword only, default 10000), at least 1
            (else a ``ValueError`` that is also the ``AssertionError`` torch DataPipes raise).
        unbatch_level: unbatch the source this many levels first (``-1``: flatten fully), as
            ``datapipe.unbatch(unbatch_level)`` does; 0 (default) leaves the items as they are.

    Yields:
        The source's items in a random order: every item exactly once.

    Seeds: same seed, same order; each ``set_epoch(n)`` reshuffles; unseeded passes draw their seed
    from torch's global generator (``torch.manual_seed`` reproduces them). ``set_shuffle(False)``
    turns shuffling off (the items pass in source order), as torch's ``set_shuffle`` does.

    ``len()`` is the source's length.

    Checkpoint: the state holds the buffered items and the generator's state, so a resumed pass,
    seeded or not, goes on with the order of the pass it resumes.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper(range(10)).shuffle(buffer_size=4).set_seed(0)
        >>> list(pipe) == list(pipe), sorted(pipe) == list(range(10))
        (True, True)
        >>> list(pipe.set_shuffle(False))
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]

    See also: :class:`Sampler` for torch samplers, the map-style ``shuffle`` for a full permutation
    of an indexable dataset.
    """

    _saves = (
        "over a list, tuple or range read directly (``IterableWrapper(paths).shuffle()``): the generator's "
        "state at the pass's start (625 ints) and how far the source was read; the resumed pass replays the "
        "draws on positions (about 0.1 µs per item read) and takes the buffered items from the sequence. Over "
        "any other source: the buffered items (at most ``buffer_size``) and the generator's state"
    )

    _is_random = True
    _repr_fields = ("buffer_size",)

    @overload
    def __init__(
        self: IterDataPipe[T],
        datapipe: IterDataPipe[T],
        *,
        buffer_size: int = ...,
        unbatch_level: Literal[0] = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[Any],
        datapipe: IterDataPipe[T],
        *,
        buffer_size: int = ...,
        unbatch_level: int = ...,
    ) -> None: ...
    def __init__(self, datapipe: IterDataPipe[Any], *, buffer_size: int = 10000, unbatch_level: int = 0) -> None:
        require_pipe(datapipe, "Shuffler")
        require_int(buffer_size, "Shuffler", "buffer_size", minimum=1, torch_assert="buffer_size should be larger than 0")
        require_int(unbatch_level, "Shuffler", "unbatch_level", minimum=-1)
        self.datapipe = datapipe if unbatch_level == 0 else datapipe.unbatch(unbatch_level=unbatch_level)  # type: ignore[attr-defined]
        self.buffer_size = buffer_size
        self._enabled = True
        self._stateless = False  # shuffling: its pass keeps a buffer and a generator (_ShuffleRun)
        self._run: Callable[[Shuffler[T], Pass], Iterator[T]] = _shuffle_on

    def set_shuffle(self, shuffle: bool = True) -> Shuffler[T]:
        """Turn shuffling on or off (off: the items pass in source order); returns the pipe."""
        self._enabled = bool(shuffle)
        self._stateless = not self._enabled  # off: the items pass through, its position is its source's
        self._run = _shuffle_on if self._enabled else _shuffle_off
        return self

    def _open(self, ctx: Pass) -> Iterator[T]:
        return self._run(self, ctx)

    def __len__(self) -> int:
        return source_len(self, self.datapipe)


# -- Sampler ---------------------------------------------------------------------------------------


class _SamplerRun:
    """The position of a ``Sampler`` pass: how many indices it has yielded (see
    :class:`~datapipes.iter.util._SourceRun`: read from a range's iterator, as
    ``SequentialSampler``'s, nothing counted; counted for a sampler written as a generator, as
    ``RandomSampler``), and what makes its draws: the pass seed (a sampler given a generator seeded
    from the pipe) or the state of the sampler's own ``torch.Generator`` when the pass began (5 KB).
    A resumed pass seeds the generator the same way and *replays* the sampler, skipping in C the
    indices already yielded (cheap: indices, not items), or moves a range's iterator to its index.
    A sampler without a generator is replayed as it is: exact for a sampler that draws the same
    indices at every pass."""

    __slots__ = ("source", "seed", "generator", "why")

    def __init__(self, seed: int | None = None, generator: Any = None, why: str = "") -> None:
        self.source = _SourceRun(True)
        self.seed = seed  # the pass seed of a seeded sampler
        self.generator = generator  # the sampler's own torch.Generator's state at the start of the pass (bytes)
        self.why = why  # why this pass cannot save its position ("": it can)

    def state(self) -> dict[str, Any]:
        if self.why:
            raise TypeError(self.why)
        return {"seed": self.seed, "generator": self.generator, **self.source.state()}

    def restore(self, state: dict[str, Any]) -> None:
        if self.why:
            raise TypeError(self.why)
        self.source.restore(state)
        check_int(state, "seed", None, optional=True, default=None)
        generator = state.get("generator")
        if generator is not None and (type(generator) not in (bytes, bytearray) or (
                self.generator is not None and len(generator) != len(self.generator))):
            invalid(f"state['generator'] must be the bytes of a torch.Generator's state, got {generator!r:.100}")
        if self.seed is not None and state.get("seed") is not None:
            self.seed = int(state["seed"])
        if generator is not None:
            self.generator = generator


def _sample_plain(pipe: Sampler, ctx: Pass) -> Iterator[Any]:
    sampler = pipe.sampler
    own = getattr(sampler, "generator", None)
    if own is not None and not isinstance(own, torch.Generator):
        run = _SamplerRun(why=f"{stage_label(pipe)} cannot save its position: its sampler draws from a "
                              f"{type(own).__name__}, whose state it cannot read (a torch.Generator's it can)")
    else:
        run = _SamplerRun()

    def open_() -> Iterator[Any]:
        if isinstance(own, torch.Generator):  # as it was when the saved pass began, or as it is now
            if run.generator is None:
                run.generator = own.get_state().numpy().tobytes()
            else:
                own.set_state(torch.frombuffer(bytearray(run.generator), dtype=torch.uint8))
        return iter(sampler)

    ctx.track(pipe, run)
    return _deferred(open_, run.source)


def _sample_seeded(pipe: Sampler, ctx: Pass) -> Iterator[Any]:
    run = _SamplerRun(seed=ctx.seed_for(pipe))
    generator = torch.Generator()
    sampler = copy.copy(pipe.sampler)
    sampler.generator = generator

    def open_() -> Iterator[Any]:
        generator.manual_seed(run.seed)  # type: ignore[arg-type]  # the pass seed, or the saved pass's
        return iter(sampler)

    ctx.track(pipe, run)
    return _deferred(open_, run.source)


def _is_sampler_instance(sampler: Any) -> bool:
    """Whether ``sampler`` is a sampler already built (a ``torch.utils.data.Sampler``, or any
    iterable that is not a class or factory), rather than what builds one."""
    if isinstance(sampler, type):
        return False
    return isinstance(sampler, TorchSampler) or not callable(sampler) and hasattr(type(sampler), "__iter__")


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
        datapipe: the source pipe; it must have a ``len()``, which the sampler reads (unless the
            sampler is given built).
        sampler: the sampler class (or any callable returning an iterable), default
            ``torch.utils.data.SequentialSampler``; or a sampler already built (a
            ``torch.utils.data.Sampler`` instance, such as ``WeightedRandomSampler(weights, 100)``,
            or any iterable that is not callable), used as it is, ``sampler_args`` and
            ``sampler_kwargs`` left out.
        sampler_args: positional arguments for ``sampler``. ``data_source`` goes by keyword, so
            these must not fill a leading ``data_source`` parameter (torch's samplers have one:
            give their options in ``sampler_kwargs``).
        sampler_kwargs: keyword arguments for ``sampler``; ``data_source`` is set to ``datapipe``.

    Yields:
        What the sampler yields, in its order.

    Raises:
        TypeError: ``datapipe`` has no ``len()``; also an ``AssertionError``, as torch DataPipes
            raise, its message ending with theirs.
        TypeError / ValueError: the sampler cannot be built from these arguments (the message
            names the sampler; e.g. torch's ``RandomSampler`` refuses an empty source).

    Seeds: a sampler whose ``generator`` attribute is left ``None`` (torch's ``RandomSampler``)
    gets, at each pass, a copy with a ``torch.Generator`` seeded from the
    pipe's seed: same seed same order, ``set_epoch(n)`` reshuffles, unseeded passes draw from torch's
    global generator. A sampler given its own ``generator`` keeps it.

    ``len()`` is the sampler's ``len()``; ``TypeError`` where the sampler has none.

    The sampler is iterated from the first ``next()`` of a pass. Checkpoint: a resumed pass
    replays the sampler with the saved pass's seed (or its own ``torch.Generator``'s saved state)
    and skips the indices already yielded; a sampler without a generator must draw the same
    indices at every pass for this to be exact.

    >>> from torch.utils.data import RandomSampler
    >>> from datapipes.iter import IterableWrapper, Sampler
    >>> list(Sampler(IterableWrapper(["a", "b", "c"])))
    [0, 1, 2]
    >>> pipe = Sampler(IterableWrapper(range(5)), sampler=RandomSampler).set_seed(0)
    >>> list(pipe) == list(pipe), sorted(pipe)
    (True, [0, 1, 2, 3, 4])

    See also: :class:`Shuffler` for a buffer shuffle of the items themselves.
    """

    _saves = (
        "the count of indices yielded and what draws them: the pass seed, or the state of the sampler's own "
        "``torch.Generator`` (5 KB); the stages above it keep nothing (the sampler is replayed, skipping the "
        "indices yielded). A sampler drawing from another generator cannot resume (``TypeError``)"
    )

    #: the sampler decides whether (and when) the source is iterated: torch's only take its len() (see datapipes._runtime.passes.unbuilt)
    _builds_sources_later = True
    #: a resumed pass replays the sampler from its start, and with it any reading of the source it
    #: does (a sampler yielding items): the source's stages save no position (datapipes._runtime.plan.Plan.replayed)
    _replays_sources = True

    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        sampler: Callable[..., Any] | Iterable[Any] = SequentialSampler,
        sampler_args: Sequence[Any] | None = None,
        sampler_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        require_pipe(datapipe, "Sampler")
        given = _is_sampler_instance(sampler)
        if not given:
            require_callable(sampler, "Sampler", "sampler")
        elif sampler_args or sampler_kwargs:
            raise TypeError(f"Sampler: sampler_args and sampler_kwargs build a sampler from a class; sampler is "
                            f"already built (a {type(sampler).__name__}): give its options to its constructor")
        if sampler_args is not None and not isinstance(sampler_args, (tuple, list)):
            raise TypeError(f"Sampler: sampler_args must be a tuple or None, got {type(sampler_args).__name__}")
        if sampler_kwargs is not None and not isinstance(sampler_kwargs, Mapping):
            raise TypeError(f"Sampler: sampler_kwargs must be a dict or None, got {type(sampler_kwargs).__name__}")
        if sampler_kwargs is not None and "data_source" in sampler_kwargs:
            raise ValueError("Sampler: sampler_kwargs must not hold data_source: the sampler samples from datapipe")
        try:
            if not given:  # a sampler built elsewhere read its data's length itself
                len(datapipe)  # type: ignore[arg-type]
        except TypeError as e:
            if not lacks_len(datapipe, e):
                raise
            # torch asserts here: the TypeError is also an AssertionError, ending with torch's words
            raise ArgumentTypeError(f"Sampler: datapipe has no len() ({len_root(e)}): Sampler class requires input "
                                    "datapipe implemented `__len__`") from None
        self.datapipe = datapipe
        self.sampler_args = tuple(sampler_args or ())
        self.sampler_kwargs = dict(sampler_kwargs or {})
        name = getattr(sampler, "__qualname__", None) or type(sampler).__name__
        self.sampler: Any
        if given:
            self.sampler = sampler
        else:
            assert callable(sampler)
            try:
                self.sampler = sampler(*self.sampler_args, data_source=datapipe, **self.sampler_kwargs)
            except (TypeError, ValueError) as e:
                what = f"Sampler: cannot build sampler {name}(*sampler_args, data_source=datapipe, **sampler_kwargs): {e}"
                raise (TypeError(what) if isinstance(e, TypeError) else ValueError(what)) from e
        if not hasattr(type(self.sampler), "__iter__"):
            raise TypeError(f"Sampler: sampler {name} built a {type(self.sampler).__name__}, which is not iterable")
        # A sampler drawing from its own unset generator takes one seeded from the pipe at each pass.
        self._is_random = getattr(self.sampler, "generator", _MISSING) is None
        self._run: Callable[[Sampler, Pass], Iterator[Any]] = _sample_seeded if self._is_random else _sample_plain

    def _open(self, ctx: Pass) -> Iterator[Any]:
        return self._run(self, ctx)

    def __len__(self) -> int:
        if not hasattr(type(self.sampler), "__len__"):
            raise len_unknown(self, f"its sampler, a {type(self.sampler).__name__}, has no length")
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


class _SplitRun(Resumable):
    """The position of a ``random_split`` child's pass: its generator's state (625 ints), the
    weights left per group and the items left (a few numbers per group). The weights list is the
    loop's own, read when the state is taken; the count of items left is written per item (one
    attribute store beside the ~1 µs of the draw)."""

    __slots__ = ("rng", "weights", "remaining", "total", "resume")

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.weights: list[float] | None = None  # None: the pass has not begun
        self.remaining = 0
        self.total = 0
        self.started = False
        self.resume: dict[str, Any] | None = None

    def state(self) -> dict[str, Any]:
        if self.weights is None:
            if self.resume is not None:
                return self.resume
            return {"rng": _rng_state(self.rng), "weights": None, "remaining": 0, "total": 0}
        return {"rng": _rng_state(self.rng), "weights": list(self.weights), "remaining": self.remaining,
                "total": self.total}

    def load(self, state: dict[str, Any]) -> None:
        check_rng(state)
        weights = check_list(state, "weights", optional=True)
        if weights is not None and any(type(w) not in (int, float) for w in weights):
            invalid(f"state['weights'] must be a list of numbers or None, got {weights!r:.100}")
        check_int(state, "remaining", None if weights is None else 0)
        check_int(state, "total", None if weights is None else 0)
        self.resume = state


def _split_run(pipe: SplitterIterator, it: Iterator[Any], run: _SplitRun) -> Iterator[Any]:
    split = pipe._split
    rng = run.rng
    rand = rng.random
    target = pipe._index
    run.started = True
    try:
        resume = run.resume
        if resume is not None and resume["weights"] is not None:  # a resumed pass: go on with the split
            _set_rng_state(rng, resume["rng"])
            total, weights, remaining = int(resume["total"]), list(resume["weights"]), int(resume["remaining"])
        else:
            if resume is not None:
                _set_rng_state(rng, resume["rng"])
            total = pipe._total()
            weights = _normalize(split.weights, total)
            remaining = total
        run.total, run.weights, run.remaining = total, weights, remaining
        last = len(weights) - 1
        for item in it:
            if remaining <= 0:
                raise ValueError(f"{_child_label(pipe)}: the source yielded more than total_length={total} items")
            # random.choices(range(n), weights) inlined: the same draws as torchdata's RandomSplitter,
            # so a seed splits the same way there and here.
            cum = list(accumulate(weights))
            k = bisect(cum, rand() * (cum[-1] + 0.0), 0, last)
            weights[k] -= 1
            remaining -= 1
            run.remaining = remaining
            if weights[k] < 0:
                weights[k] = 0
                weights = _normalize(weights, remaining) if remaining > 0 else [0.0] * len(weights)
                run.weights = weights
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
    """Split the items at random into named groups, the same way at every pass
    (functional name: ``random_split``).

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

    Example:
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

    _saves = "the generator's state (625 ints), the weights left per group and the items left"

    @overload
    def __new__(  # type: ignore[misc, overload-overlap]
        cls,
        source_datapipe: IterDataPipe[T],
        weights: Mapping[K, float],
        seed: int,
        total_length: int | None = ...,
        target: None = ...,
    ) -> list[IterDataPipe[T]]: ...
    @overload
    def __new__(  # type: ignore[misc]
        cls,
        source_datapipe: IterDataPipe[T],
        weights: Mapping[K, float],
        seed: int,
        total_length: int | None = ...,
        *,
        target: K,
    ) -> IterDataPipe[T]: ...
    @overload
    def __new__(  # type: ignore[misc]
        cls,
        source_datapipe: IterDataPipe[T],
        weights: Mapping[K, float],
        seed: int,
        total_length: int | None,
        target: K,
    ) -> IterDataPipe[T]: ...
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
        if total_length is None:
            try:
                len(source_datapipe)  # type: ignore[arg-type]
            except TypeError as e:
                raise TypeError("RandomSplitter needs `total_length`, but it is unable to infer it from the "
                                f"`source_datapipe` ({len_root(e)})") from None
        if target is not None and target not in weights:
            # torchdata's type and words (weights' keys are looked up), after the length as there
            raise KeyError(f"RandomSplitter: `target={target}` does not match any key in `weights` {keys!r}")
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
        return source_len(self, self.source_datapipe, "source_datapipe") if total is None else total

    def _open(self, ctx: Pass) -> Iterator[T]:
        # The split's seed is plain data shared by the children (not a pass seed): read when the
        # pass starts, so an override_seed() reaches the passes started after it.
        run = _SplitRun(self._split.seed)
        it = _split_run(self, ctx.open(self.source_datapipe), run)
        ctx.track(self, run)
        return it

    def __len__(self) -> int:
        total = self._total()
        sizes = _exact_sizes(self._split.weights, total)
        if sizes is None:
            weights = dict(zip(self._split.keys, self._split.weights))
            raise len_unknown(
                self,
                f"Lengths of the split cannot be known in advance, since the weights {weights!r} do not split "
                f"total_length={total} into whole numbers (give weights that do, or set the length with set_length)",
                "cannot be known in advance",
            )
        return sizes[self._index]
