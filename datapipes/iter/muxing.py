"""Stages that merge several pipes into one stream of their items: Concater [concat],
Multiplexer [mux], MultiplexerLongest [mux_longest], SampleMultiplexer.

They are plain generators over their inputs: every pass iterates each input afresh, errors pass
through as the same object, and ``len()`` is computed from the inputs' lengths at call time.
``mux``, ``mux_longest`` and ``SampleMultiplexer`` create their inputs' iterators in ``_open(ctx)``
(``ctx.open``); ``concat`` creates the first input's there and each later one's when the previous
input ends, in the same pass (:mod:`datapipes._runtime.passes`).

Checkpoint and resume (``it.state_dict()``, :mod:`datapipes._runtime.passes`): ``concat`` saves which input
it reads (a resumed pass builds that input at once and never reads the ones before it); ``mux``
saves the items of the current round not yet yielded; ``mux_longest`` which input is next and which
have ended; ``SampleMultiplexer`` its generator's state and the inputs not ended.
"""

from __future__ import annotations

import itertools
import math
import random
from bisect import bisect
from typing import Any, Callable, Iterator, Mapping, TypeVar, overload

from .._runtime.passes import Pass
from .._runtime.validate import check_dict, check_int, check_list, check_rng, invalid
from .._positions import handed_out, remaining
from .._engine import abandon
from .._engine import close_iterator as _close_iterator
from ..datapipe import IterDataPipe, functional_datapipe, require_int, require_pipe
from ._shared import _abandon_all, _check_inputs, _check_torchdata_inputs, _input_lengths, _weak
from .combinatorics import _rng_state, _set_rng_state
from .._engine.lifecycle import Resumable

__all__ = ["Concater", "Multiplexer", "MultiplexerLongest", "SampleMultiplexer"]

T = TypeVar("T")
U = TypeVar("U")

_MISS = object()  # private sentinel: no more items (None is a valid item)


# -- Concater --------------------------------------------------------------------------------------


class _ConcatRun(Resumable):
    """Which input a concat pass reads, for checkpoint and resume. State: one int.

    The generator moves ``index`` on when an input ends (once per input, nothing per item); the
    input's own stages hold its position. :meth:`restore` builds the saved input's iterator at once,
    so the states of its stages, restored after this one (graph order), reach it; the inputs before
    it are built and dropped unread (their stages' states then land in runs of this pass, never
    pending for a later input that shares a stage).
    """

    __slots__ = ("datapipes", "pass_", "it", "index")

    def __init__(self, datapipes: tuple[Any, ...], pass_: Pass, it: Iterator[Any]) -> None:
        self.datapipes = datapipes
        self.pass_ = _weak(pass_)  # the pass holds this run: no cycle back to it
        self.it: Iterator[Any] | None = it  # the current input's iterator, until the pass starts
        self.index = 0
        self.started = False

    def state(self) -> dict[str, Any]:
        return {"input": self.index}

    def load(self, state: dict[str, Any]) -> None:
        index = state["input"]
        if type(index) is not int or not 0 <= index < len(self.datapipes):
            raise ValueError(
                f"load_state_dict: Concater has {len(self.datapipes)} inputs, the state names input {index!r}"
            )
        if index == self.index:
            return
        _close_iterator(self.it)
        pass_ = self.pass_()  # alive: it is restoring this run
        for j in range(min(index, 1), index + 1):
            it = pass_.open(self.datapipes[j])
            if j < index:
                _close_iterator(it)
        self.it, self.index = it, index


def _concat(run: _ConcatRun, ctx: Pass) -> Iterator[Any]:
    """The current input's items, then each later input's, whose iterator is created in ``ctx``
    (the pass that built this stage) only when the previous input ends."""
    run.started = True
    it, run.it = run.it, None  # the frame holds it from now on: a closed pass drops it
    datapipes = run.datapipes
    try:
        yield from it  # type: ignore[misc]
        for j in range(run.index + 1, len(datapipes)):
            it = ctx.open(datapipes[j])
            run.index = j  # before its first item
            yield from it
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


@functional_datapipe("concat")
class Concater(IterDataPipe[T]):
    """Yield every item of the first pipe, then of the second, and so on
    (functional name: ``concat``), like :func:`itertools.chain`.

    Args:
        *datapipes: the pipes, at least one. ``a.concat(b, c)`` is ``Concater(a, b, c)``.

    Yields:
        The items of each input in turn; an input is iterated only when the previous one ends.

    Raises:
        TypeError: an input is not an ``IterDataPipe``.
        ValueError: no input.

    ``len()`` is the sum of the inputs' lengths; ``TypeError`` naming the input when one is unknown.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(3)).concat(IterableWrapper("ab")))
        [0, 1, 2, 'a', 'b']

    See also: :class:`Multiplexer` to interleave instead, :class:`Zipper`.
    """

    _saves = "the current input (one int)"

    #: later inputs are built under the pass when the earlier ones end (see datapipes._runtime.passes.unbuilt)
    _builds_sources_later = True

    @overload
    def __init__(
        self: Concater[T | U], datapipe: IterDataPipe[T], other: IterDataPipe[U], /, *datapipes: IterDataPipe[U]
    ) -> None: ...
    @overload
    def __init__(self, *datapipes: IterDataPipe[T]) -> None: ...
    def __init__(self, *datapipes: IterDataPipe[Any]) -> None:
        _check_inputs("Concater", datapipes)
        self.datapipes = datapipes
        self._run = _concat

    def _open(self, ctx: Pass) -> Iterator[T]:
        run = _ConcatRun(self.datapipes, ctx, ctx.open(self.datapipes[0]))
        ctx.track(self, run)
        return self._run(run, ctx)

    def __len__(self) -> int:
        return sum(_input_lengths(self))


# -- Multiplexer -----------------------------------------------------------------------------------


class _MuxRun(Resumable):
    """Where a mux pass is in its round, for checkpoint and resume. State: the items of the current
    round pulled from the inputs (a round pulls one from each at once) and not yet yielded, at most
    ``len(datapipes) - 1`` items; the inputs' own stages hold their positions (each at the end of
    the round). Read lazily from the current round's iterator (one store per round)."""

    __slots__ = ("round", "saved")

    def __init__(self) -> None:
        self.round: Iterator[Any] | None = None
        self.saved: list[Any] = []  # the round a resumed pass yields first
        self.started = False

    def state(self) -> dict[str, Any]:
        if self.round is not None:
            return {"round": remaining(self.round)}
        return {"round": list(self.saved)}

    def load(self, state: dict[str, Any]) -> None:
        self.saved = list(check_list(state, "round"))


def _rounds(its: list[Iterator[Any]], run: _MuxRun) -> Iterator[tuple[Any, ...]]:
    run.started = True
    rounds: Iterator[tuple[Any, ...]] = zip(*its)
    if run.saved:  # a resumed pass first yields the rest of the saved round
        rounds = itertools.chain([tuple(run.saved)], rounds)
    return rounds


def _mux(its: list[Iterator[Any]], run: _MuxRun) -> Iterator[Any]:
    """The items of ``its`` taken in rounds, one of each; ``run`` holds the round's iterator. ``zip``
    stops at the first exhausted input and drops the round it was building: torch semantics."""
    try:
        for run.round in map(iter, _rounds(its, run)):  # one store per round, before its first item
            yield from run.round
    except BaseException:
        for it in its:
            abandon(it)
        raise


@functional_datapipe("mux")
class Multiplexer(IterDataPipe[T]):
    """Yield one item from each input in turn (functional name: ``mux``).

    Rounds of one item per input, in input order, until any input is exhausted; the round that
    input cut short is dropped (torch DataPipes semantics), so every input contributes the same
    number of items.

    Args:
        *datapipes: the pipes, at least one. ``a.mux(b, c)`` is ``Multiplexer(a, b, c)``.

    Yields:
        ``a[0], b[0], c[0], a[1], b[1], c[1], ...``.

    Raises:
        TypeError: an input is not an ``IterDataPipe``.
        ValueError: no input.

    ``len()`` is the shortest input's length times the number of inputs; ``TypeError`` naming the
    input when one is unknown.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(3)).mux(IterableWrapper(range(10, 15))))
        [0, 10, 1, 11, 2, 12]

    See also: :class:`Zipper`, :class:`Concater`.
    """

    _saves = "the unyielded items of the current round (fewer than one per input)"

    @overload
    def __init__(
        self: Multiplexer[T | U], datapipe: IterDataPipe[T], other: IterDataPipe[U], /, *datapipes: IterDataPipe[U]
    ) -> None: ...
    @overload
    def __init__(self, *datapipes: IterDataPipe[T]) -> None: ...
    def __init__(self, *datapipes: IterDataPipe[Any]) -> None:
        _check_inputs("Multiplexer", datapipes)
        self.datapipes = datapipes
        self._run = _mux

    def _open(self, ctx: Pass) -> Iterator[T]:
        its = [ctx.open(dp) for dp in self.datapipes]
        run = _MuxRun()
        ctx.track(self, run)
        return self._run(its, run)

    def __len__(self) -> int:
        return min(_input_lengths(self)) * len(self.datapipes)


# -- MultiplexerLongest ----------------------------------------------------------------------------


#: the turns a ``mux_longest`` pass lays out at a time (whole rounds of the inputs not ended)
_TURNS = 1024


def _check_mux_longest_state(state: dict[str, Any], k: int) -> None:
    """The checks of a ``mux_longest`` pass's state over ``k`` inputs: ``ended`` (True), or the input
    read next and which inputs are done, one bool per input."""
    check_dict(state)
    if "ended" in state and state["ended"] is not True:
        invalid(f"state['ended'] must be True, got {state['ended']!r:.100}")
    if "next" in state:
        check_int(state, "next")  # an int >= 0, whatever else the state holds
    if "ended" in state:
        return
    check_int(state, "next", 0, k - 1)
    done = check_list(state, "done", default=[])
    if any(type(d) is not bool for d in done) or ("done" in state and len(done) != k):
        invalid(f"state['done'] must be a bool per input, got {done!r:.100}")


class _MuxLongestRun(Resumable):
    """The position of a ``mux_longest`` pass besides its inputs': the input read next and which
    inputs have ended (an int and a bool per input); a pass that has ended saves ``{"ended": True}``.

    The loop takes turns a block at a time (``turns``: the inputs not ended from the one read next
    to the end of the round, then whole rounds of them, about ``_TURNS`` turns) and marks an input
    that ends in ``done``, the list this run holds. The input read last is the turn the block's
    iterator handed out last (``_positions.handed_out``, read when asked): nothing per item."""

    __slots__ = ("k", "loaded", "ended", "next", "done", "turns", "taken")

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k  # the inputs
        self.loaded: dict[str, Any] | None = None  # the state loaded, saved as it is until the pass starts
        self.ended = False
        self.next = 0  # the input read next, as the pass starts
        self.done = [False] * k
        self.turns: list[int] = []
        self.taken: Callable[[], int] | None = None  # how many of the block's turns were handed out

    def state(self) -> dict[str, Any]:
        if not self.started:
            return {"next": 0} if self.loaded is None else dict(self.loaded)
        if self.ended:
            return {"ended": True}
        taken = self.taken
        at = self.next if taken is None else (self.turns[taken() - 1] + 1) % self.k  # after the input read last
        return {"next": at, "done": list(self.done)}

    def load(self, state: dict[str, Any]) -> None:
        _check_mux_longest_state(state, self.k)
        self.loaded, self.ended = state, "ended" in state
        if not self.ended:
            self.next = state["next"]
            self.done = [bool(d) for d in state.get("done", [False] * self.k)]


def _mux_longest(its: list[Iterator[Any]], run: _MuxLongestRun) -> Iterator[Any]:
    run.started = True
    if run.ended:
        return
    k = len(its)
    done = run.done
    start = run.next  # the input the next block starts at
    live = k - sum(done)
    try:
        while live:
            turns = [j for j in range(start, k) if not done[j]]
            turns += [j for j in range(k) if not done[j]] * (_TURNS // live)
            walk = iter(turns)
            run.turns, run.taken = turns, handed_out(walk)
            start = 0
            for j in walk:
                x = next(its[j], _MISS)
                if x is _MISS:
                    done[j] = True
                    live -= 1
                    start = (j + 1) % k  # a new block, from the input after it
                    break
                yield x
    except BaseException:
        _abandon_all(its)
        raise
    finally:
        run.ended = True


@functional_datapipe("mux_longest")
class MultiplexerLongest(IterDataPipe[T]):
    """Yield one item from each input in turn, skipping the exhausted ones, until every input is
    exhausted (functional name: ``mux_longest``).

    Args:
        *datapipes: the pipes, at least one. ``a.mux_longest(b, c)`` is
            ``MultiplexerLongest(a, b, c)``.

    Yields:
        ``a[0], b[0], c[0], a[1], ...``; once an input is exhausted, the others go on in turn.

    Raises:
        TypeError: an input is not an ``IterDataPipe``.
        ValueError: no input.

    ``len()`` is the sum of the inputs' lengths; ``TypeError`` naming the input when one is unknown.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(3)).mux_longest(IterableWrapper("a"), IterableWrapper([10, 11])))
        [0, 'a', 10, 1, 11, 2]

    See also: :class:`Multiplexer`, which stops at the first exhausted input.
    """

    _saves = "the input read next and which inputs have ended (an int and a flag per input)"

    @overload
    def __init__(
        self: MultiplexerLongest[T | U], datapipe: IterDataPipe[T], other: IterDataPipe[U], /, *datapipes: IterDataPipe[U]
    ) -> None: ...
    @overload
    def __init__(self, *datapipes: IterDataPipe[T]) -> None: ...
    def __init__(self, *datapipes: IterDataPipe[Any]) -> None:
        _check_torchdata_inputs("MultiplexerLongest", datapipes)
        self.datapipes = datapipes

    def _open(self, ctx: Pass) -> Iterator[T]:
        its = [ctx.open(dp) for dp in self.datapipes]
        run = _MuxLongestRun(len(its))
        ctx.track(self, run)
        return _mux_longest(its, run)

    def __len__(self) -> int:
        return sum(_input_lengths(self))


# -- SampleMultiplexer -----------------------------------------------------------------------------


class _SampleRun(Resumable):
    """The position of a ``SampleMultiplexer`` pass besides its inputs': the generator's state
    (625 ints) and the inputs not exhausted. Read when asked; nothing is written per item."""

    __slots__ = ("rng", "live")

    def __init__(self, rng: random.Random, n: int) -> None:
        self.rng = rng
        self.live = list(range(n))  # the inputs not exhausted, in input order (the loop mutates it)
        self.started = False

    def state(self) -> dict[str, Any]:
        return {"rng": _rng_state(self.rng), "live": list(self.live)}

    def load(self, state: dict[str, Any]) -> None:
        n = len(self.live)  # before the pass starts: every input
        live = check_list(state, "live", n, limit=f"the {n} inputs")
        if (any(type(j) is not int for j in live) or sorted(set(live)) != list(live)
                or (live and not 0 <= live[0] <= live[-1] < n)):
            invalid(f"state['live'] must list inputs from 0 to {n - 1} in order, each once, got {live!r:.100}")
        _set_rng_state(self.rng, check_rng(state))
        self.live = list(live)


def _sample_mux(its: list[Iterator[Any]], weights: tuple[float, ...], run: _SampleRun) -> Iterator[Any]:
    run.started = True
    live = run.live
    rand = run.rng.random
    try:
        while len(live) > 1:
            cumulative = list(itertools.accumulate(weights[j] for j in live))
            total = cumulative[-1]
            last = len(live) - 1
            while True:
                k = bisect(cumulative, rand() * total)
                if k > last:  # rounding at the top end
                    k = last
                x = next(its[live[k]], _MISS)
                if x is _MISS:
                    del live[k]  # the draw is spent; the others' weights are renormalised
                    break
                yield x
        if live:
            yield from its[live[0]]
    except BaseException:
        _abandon_all(its)
        raise


class SampleMultiplexer(IterDataPipe[T]):
    """Yield items drawn from several pipes at random, each draw picking a pipe with probability
    proportional to its weight (no functional name, as in torchdata).

    When a pipe is exhausted it is dropped and the draws go on among the others, their weights
    renormalised; the last one left is read to its end. To keep the proportions forever, ``cycle``
    the inputs.

    Args:
        pipes_to_weights_dict: ``{pipe: weight}``, at least one pipe; weights are numbers > 0.
        seed: the seed of the draws; ``None`` (default): the pipe's seed (``set_seed``, the
            DataLoader's), else a fresh one each pass. Same as ``set_seed(seed)`` on this stage.

    Yields:
        Every item of every input exactly once; each input's items in their order.

    Raises:
        TypeError / ValueError: a bad argument, naming it (a weight <= 0: torch's phrase
            "Expecting a positive and non-zero weight").

    Seeds: a seeded pass (``seed=``, ``set_seed``) draws the same sequence at every pass of an
    epoch and a new one at every ``set_epoch(n)`` (torchdata's ``seed`` starts one generator for
    all passes instead); an unseeded pass draws its seed from torch's global generator.

    ``len()`` is the sum of the inputs' lengths; ``TypeError`` naming the input when one is unknown.

    Checkpoint: the state holds the generator's state and the inputs not exhausted.

    >>> from datapipes.iter import IterableWrapper, SampleMultiplexer
    >>> pipe = SampleMultiplexer({IterableWrapper([0] * 4): 9.0, IterableWrapper([1] * 4): 1.0}, seed=0)
    >>> sorted(pipe), list(pipe) == list(pipe)
    ([0, 0, 0, 0, 1, 1, 1, 1], True)

    See also: :class:`Multiplexer` and :class:`MultiplexerLongest` to take the inputs in turn.
    """

    _saves = "the generator's state (625 ints) and which inputs are not exhausted"

    _is_random = True

    def __init__(self, pipes_to_weights_dict: Mapping[IterDataPipe[T], float], seed: int | None = None) -> None:
        if not isinstance(pipes_to_weights_dict, Mapping):
            raise TypeError(f"SampleMultiplexer: pipes_to_weights_dict must be a dict of pipes to weights, "
                            f"got {type(pipes_to_weights_dict).__name__}")
        if not pipes_to_weights_dict:
            raise ValueError("SampleMultiplexer: Empty dictionary passed to SampleMultiplexerDataPipe")
        for k, (dp, w) in enumerate(pipes_to_weights_dict.items()):
            require_pipe(dp, "SampleMultiplexer", f"pipes_to_weights_dict key {k}")
            if isinstance(w, bool) or not isinstance(w, (int, float)):
                raise TypeError(f"SampleMultiplexer: the weight of pipe {k} must be a number, got {type(w).__name__}")
            if not w > 0:  # torchdata's words
                raise ValueError(f"SampleMultiplexer: pipe {k}: Expecting a positive and non-zero weight, got {w}")
            if not math.isfinite(w):
                raise ValueError(f"SampleMultiplexer: pipe {k}: a weight must be finite, got {w}")
        require_int(seed, "SampleMultiplexer", "seed", optional=True)
        self.datapipes = tuple(pipes_to_weights_dict)
        self.weights = tuple(float(w) for w in pipes_to_weights_dict.values())
        if seed is not None:
            self._seed = seed

    def _open(self, ctx: Pass) -> Iterator[T]:
        rng = random.Random(ctx.seed_for(self))
        its = [ctx.open(dp) for dp in self.datapipes]
        run = _SampleRun(rng, len(its))
        ctx.track(self, run)
        return _sample_mux(its, self.weights, run)

    def __len__(self) -> int:
        return sum(_input_lengths(self))
