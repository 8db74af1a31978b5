"""Mixer: several named pipes mixed into one stream in set proportions, exactly or at random.

With ``exact=True`` and shares counted in items, the order of the draws is Tijdeman's solution of
the chairman assignment problem (R. Tijdeman, "The chairman assignment problem", Discrete
Mathematics 32, 1980): with ``k`` sources of positive weight, every prefix of ``n`` items holds
``w_i * n`` items of source ``i`` within ``1 - 1/(2(k-1))``, less than one item. The rule, at the
``t``-th draw, with ``sigma = 1 - 1/(2(k-1))`` and ``s_i`` the items drawn from ``i`` so far: among the
sources *due* (``w_i * t - s_i >= 1 - sigma``: drawing one does not put it more than ``sigma``
ahead), draw the one whose deadline comes first (the first ``t`` at which ``w_i * t - s_i > sigma``,
which falls behind if not drawn by then). The rule of "the source lagging its share most"
(Megatron's ``build_blending_indices``) drifts further: 1.25 items with weights 1:17:2.

The arithmetic is exact: each weight is read as the simplest fraction that rounds to it (``0.3`` is
3/10; an int is itself), the weights are scaled to integers ``A_i`` of sum ``M``, and releases and
deadlines are integers computed with Python's ints. The schedule then repeats every ``M`` draws; a
period of at most ``PERIOD_LIMIT`` draws is computed once per weight vector and reused, otherwise
the draws are scheduled ``BLOCK`` at a time. Either way the loop per item only reads the next
source index from a list.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
import weakref
from fractions import Fraction
from typing import Any, Callable, Iterator, Mapping, TypeVar, Union

import numpy as np

from .._checks import require_bool, require_callable, require_int
from .._engine import abandon
from .._engine.lifecycle import Resumable
from .._positions import handed_out
from .._runtime.passes import Pass
from .._runtime.worker import is_sharding_stage
from .._runtime.validate import check_bool, check_dict, check_int, check_list, invalid
from ..datapipe import IterDataPipe, len_unknown, require_pipe, source_len
from ..graph import walk

__all__ = ["Mixer"]

T = TypeVar("T")

#: draws scheduled at a time (and the interval at which a weights schedule is called)
BLOCK = 4096
#: a schedule that repeats within this many draws is computed once per weight vector and reused
PERIOD_LIMIT = 1 << 16
#: a float weight is read as the simplest fraction with a denominator up to this that rounds to it
_DENOMINATOR = 1 << 20

STOPS = ("first_exhausted", "all_exhausted", "never")
BYS = ("items", "tokens")

Weights = Union[Mapping[str, float], Callable[[int], Mapping[str, float]]]

_MISS = object()  # private sentinel: the source ended (None is a valid item)

#: stage -> its most recent pass's run in this process (``Mixer.shares``; weak keys)
_latest: weakref.WeakKeyDictionary[Any, _MixRun] = weakref.WeakKeyDictionary()


# -- weights ---------------------------------------------------------------------------------------


def _fraction(w: Any) -> Fraction:
    if isinstance(w, numbers.Integral):
        return Fraction(int(w))
    f = Fraction(float(w))
    simple = f.limit_denominator(_DENOMINATOR)
    return simple if float(simple) == float(w) else f


def _integer_weights(where: str, names: tuple[str, ...], weights: Any) -> tuple[int, ...]:
    """``weights`` (a dict of ``names`` to numbers >= 0, not all 0) as integers in the same ratio,
    coprime; ``ValueError``/``TypeError`` starting with ``where`` and naming what is wrong."""
    if not isinstance(weights, Mapping):
        raise TypeError(f"{where} must be a dict of source names to weights, got {type(weights).__name__}")
    missing = [n for n in names if n not in weights]
    extra = [n for n in weights if n not in names]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"no weight for {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"weights for {', '.join(repr(n) for n in extra)}, which are no source")
        raise ValueError(f"{where} has {' and '.join(parts)} (the sources: {', '.join(map(repr, names))})")
    fractions = []
    for name in names:
        w = weights[name]
        if isinstance(w, bool) or not isinstance(w, numbers.Real):
            raise TypeError(f"{where}: the weight of {name!r} must be a number, got {type(w).__name__}")
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"{where}: the weight of {name!r} must be a finite number >= 0, got {w!r}")
        fractions.append(_fraction(w))
    if not any(fractions):
        raise ValueError(f"{where}: every weight is 0 ({', '.join(map(repr, names))}): nothing to draw")
    scale = math.lcm(*(f.denominator for f in fractions))
    ints = [int(f * scale) for f in fractions]
    common = math.gcd(*ints)
    return tuple(a // common for a in ints)


# -- the exact schedule ----------------------------------------------------------------------------


def _edf(a: tuple[int, ...], s: list[int], t: int, steps: int) -> list[int]:
    """The next ``steps`` sources of Tijdeman's schedule for integer weights ``a``, ``t`` draws into
    it with ``s[i]`` drawn from source ``i`` (``s`` is updated).

    Source ``i``'s next draw, its ``s_i + 1``-th, has an integer window of times: released at the
    first ``t`` with ``A_i t - M s_i >= M (1 - sigma)`` and due by the first ``t`` with
    ``A_i t - M s_i > M sigma``, ``c = 2(k-1)`` clearing the fractions of ``sigma = (c-1)/c``. At each
    time the released draw due first is made (earliest deadline first, ties to the source named
    first), which meets every deadline whenever some order does; Tijdeman proved one does."""
    m = sum(a)
    active = [i for i, w in enumerate(a) if w]
    if len(active) == 1:
        s[active[0]] += steps
        return [active[0]] * steps
    c = 2 * (len(active) - 1)
    scales = [c * a[i] for i in active]
    drawn = [s[i] for i in active]
    release = [-(-(c * x + 1) * m // scale) for x, scale in zip(drawn, scales)]
    due = [(c * x + c - 1) * m // scale + 1 for x, scale in zip(drawn, scales)]
    slots = range(len(active))
    picks = []
    for now in range(t + 1, t + steps + 1):
        best, first = -1, 0
        for q in slots:
            if release[q] <= now and (best < 0 or due[q] < first):
                best, first = q, due[q]
        picks.append(best)
        x = drawn[best] = drawn[best] + 1
        scale = scales[best]
        release[best] = -(-(c * x + 1) * m // scale)
        due[best] = (c * x + c - 1) * m // scale + 1
    for q, i in enumerate(active):
        s[i] = drawn[q]
    return [active[q] for q in picks]


@functools.lru_cache(maxsize=32)
def _period(a: tuple[int, ...]) -> tuple[list[int], np.ndarray]:
    """One period of the schedule of ``a`` (``sum(a)`` draws: every deviation is then back to 0, so
    it repeats), as a list and as an array."""
    order = _edf(a, [0] * len(a), 0, sum(a))
    return order, np.asarray(order, dtype=np.intp)


class _Schedule:
    """Tijdeman's schedule for one weight vector: ``block(t, s, size)``, the sources of draws
    ``t + 1 .. t + size`` of it and how many of each, given ``s`` drawn from each in the first ``t``."""

    __slots__ = ("a", "m", "period", "tiled")

    def __init__(self, a: tuple[int, ...]) -> None:
        self.a = a
        self.m = sum(a)
        self.period = _period(a) if self.m <= PERIOD_LIMIT else None
        # the period repeated to hold any BLOCK draws from any place in it in one slice
        self.tiled = [] if self.period is None else self.period[0] * (1 + -(-BLOCK // self.m))

    def block(self, t: int, s: list[int], size: int) -> tuple[list[int], list[int]]:
        if self.period is None:
            before = list(s)
            order = _edf(self.a, s, t, size)
            return order, [x - y for x, y in zip(s, before)]
        array = self.period[1]
        at = t % self.m
        out = self.tiled[at:at + size]
        q, r = divmod(at + size, self.m)  # the counts of the period's first at + size draws, less its first at
        counts = (q * np.asarray(self.a) + np.bincount(array[:r], minlength=len(self.a))
                  - np.bincount(array[:at], minlength=len(self.a)))
        return out, counts.tolist()

    def counts_at(self, t: int) -> list[int] | None:
        """How many of each source the first ``t`` draws hold, when the period is known."""
        if self.period is None:
            return None
        q, r = divmod(t, self.m)
        head = np.bincount(self.period[1][:r], minlength=len(self.a))
        return [q * w + int(h) for w, h in zip(self.a, head)]


def _token_len(item: Any) -> int:
    """The default ``len_fn``: ``len(item["tokens"])`` for a dict with ``"tokens"``, else ``len(item)``."""
    if isinstance(item, dict) and "tokens" in item:
        return len(item["tokens"])
    return len(item)


# -- the run of a pass -----------------------------------------------------------------------------


class _Settings:
    """What a pass reads of its ``Mixer``, copied: the run (kept in ``_latest`` under the stage's
    weak key) must not refer to the stage, or the stage would never be freed."""

    __slots__ = ("names", "datapipes", "weights", "_a", "by", "len_fn", "stop", "with_source")
    names: tuple[str, ...]
    datapipes: tuple[IterDataPipe[Any], ...]
    weights: Weights
    _a: tuple[int, ...] | None
    by: str
    len_fn: Callable[[Any], int]
    stop: str
    with_source: bool

    def __init__(self, pipe: Mixer[Any]) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(pipe, name))


class _MixRun(Resumable):
    """The position of a ``Mixer`` pass besides its sources': how many items (and tokens) it drew
    from each source, how often each was restarted, the weights in force since which draw (a
    weights schedule), the generator's state at the start of the current block (``exact=False``),
    and whether the pass has ended. Saved as ints, lists of ints and a bool (see
    :meth:`Mixer.__init__`'s ``_saves``).

    Shares in items: the loop only walks a block's list of source indices; ``n`` and the counts are
    those before the block, plus what the block's iterator handed out (read when asked). Shares in
    tokens: the loop updates the counts, which its rule reads at every draw."""

    __slots__ = ("pipe", "pass_", "its", "nexts", "k", "a", "schedule", "since", "gen", "origin", "origin_rng",
                 "skip", "n", "counts", "tokens", "total", "restarts", "done", "block", "block_counts", "it",
                 "taken", "uniforms", "first", "next_call", "cumulative", "drain")

    def __init__(self, pipe: Mixer[Any], pass_: Pass, its: list[Iterator[Any]], seed: int | None) -> None:
        self.pipe = _Settings(pipe)
        self.pass_ = weakref.ref(pass_)  # the pass holds this run: no cycle back to it
        self.its = its
        self.nexts = [it.__next__ for it in its]
        k = self.k = len(its)
        self.n = 0  # items drawn before the current block (shares in items), or in all (in tokens)
        self.counts = [0] * k
        self.tokens = [0] * k
        self.total = 0  # tokens drawn
        self.restarts = [0] * k
        self.done = False
        self.since: tuple[int, int, list[int], list[int]] = (0, 0, [0] * k, [0] * k)  # segment: n, arg, counts, tokens
        self.a: tuple[int, ...] = () if pipe._a is None else pipe._a
        self.schedule: _Schedule | None = None
        self.gen = None if seed is None else np.random.Generator(np.random.PCG64(seed))
        self.origin = 0  # the draw at which the current block of random numbers starts
        self.origin_rng: list[int] | None = None
        self.skip = 0  # a resumed pass: the random numbers of its first block already used
        self.block: list[int] | None = None
        self.block_counts: list[int] = []
        self.it: Iterator[int] | None = None
        self.taken: Callable[[], int] | None = None
        self.uniforms: list[float] = []  # shares in tokens, exact=False: the uniforms of draws first, first + 1, ...
        self.first = 0
        self.next_call = 0  # the draw at which a weights schedule is next called
        self.cumulative: list[Any] = []  # shares in tokens, exact: the segment's rule (see choose)
        #: in a tail (a pass finishing what a shard of another layout held, its sharding filters
        #: closed): which sources have ended; every source is read to its end, none restarted
        self.drain: list[bool] | None = None
        self.started = False

    # -- weights ---------------------------------------------------------------------------------
    def weigh(self, n: int, count: int) -> None:
        """Call the weights schedule with ``count`` (items or tokens drawn), at draw ``n``: new weights
        start a new segment of the exact schedule there."""
        pipe = self.pipe
        fn = pipe.weights
        a = _integer_weights(f"Mixer: weights({count})", pipe.names, fn(count))  # type: ignore[operator]
        if a != self.a:
            self.a = a
            self.schedule = None
            self.cumulative = []
            self.since = (n, count, list(self.counts), list(self.tokens))
        self.next_call = n + BLOCK

    def segment_schedule(self) -> _Schedule:
        if self.schedule is None:
            self.schedule = _Schedule(self.a)
        return self.schedule

    def random_block(self, size: int) -> np.ndarray:
        """``size`` uniforms from the generator, its state at their start kept for the state."""
        gen = self.gen
        assert gen is not None
        st = gen.bit_generator.state["state"]
        self.origin_rng = [st["state"], st["inc"]]
        return gen.random(size)

    def resumed_uniforms(self, n: int, size: int) -> np.ndarray:
        """The uniforms of draws ``n .. n + size - 1`` (``n + size`` a multiple of ``BLOCK``); in a
        resumed pass, the block of the saved generator state less the ``skip`` already used."""
        skip_ = self.skip
        self.skip = 0
        if skip_ == BLOCK:  # the saved block was used up: the next one starts here
            self.random_block(BLOCK)
            skip_ = 0
        self.origin = n - skip_
        return self.random_block(size + skip_)[skip_:]

    # -- shares in items -------------------------------------------------------------------------
    def next_block(self) -> bool:
        """Move to the next block of draws; ``False`` once the pass has ended."""
        if self.done:
            return False
        if self.block is not None:
            self.n += len(self.block)
            self.counts = [x + y for x, y in zip(self.counts, self.block_counts)]
        n = self.n
        if self.pipe._a is None and n == self.next_call:
            self.weigh(n, n)
        size = BLOCK - n % BLOCK
        if self.gen is None:
            since, _, base, _ = self.since
            s = [x - y for x, y in zip(self.counts, base)]
            block, counts = self.segment_schedule().block(n - since, s, size)
        else:
            u = self.resumed_uniforms(n, size)
            a = np.asarray(self.a, dtype=np.float64)
            cumulative = np.cumsum(a) / a.sum()
            picks = np.minimum(np.searchsorted(cumulative, u, side="right"), self.k - 1)
            while True:  # a pick past the last positive weight (rounding at the top): the last one
                zero = np.asarray(self.a)[picks] == 0
                if not zero.any():
                    break
                picks[zero] -= 1
            block, counts = picks.tolist(), np.bincount(picks, minlength=self.k).tolist()
        self.block, self.block_counts = block, counts
        self.it = iter(block)
        self.taken = handed_out(self.it)
        return True

    def position(self) -> tuple[int, list[int]]:
        """Items drawn, and drawn from each source, so far."""
        if self.pipe.by == "tokens" or self.block is None or self.taken is None or self.drain is not None:
            return self.n, list(self.counts)
        taken = self.taken()
        head = np.bincount(np.asarray(self.block[:taken], dtype=np.intp), minlength=self.k)
        return self.n + taken, [x + int(y) for x, y in zip(self.counts, head)]

    # -- shares in tokens ------------------------------------------------------------------------
    def choose(self) -> int:
        """The source of the next draw, shares counted in tokens."""
        n = self.n
        if self.pipe._a is None and n == self.next_call:
            self.weigh(n, self.total)
        a = self.a
        if self.gen is None:
            # the source furthest behind its share of the segment's tokens: max of A_i T - M t_i
            rule = self.cumulative
            if not rule:
                base = self.since[3]
                rule = self.cumulative = [sum(a), sum(base), [(i, w, base[i]) for i, w in enumerate(a) if w]]
            m, before, weights = rule
            total = self.total - before
            tokens = self.tokens
            best, lag = -1, 0
            for i, w, b in weights:
                behind = w * total - m * (tokens[i] - b)
                if best < 0 or behind > lag:
                    best, lag = i, behind
            return best
        at = n - self.first
        if at >= len(self.uniforms):
            self.uniforms = self.resumed_uniforms(n, BLOCK - n % BLOCK).tolist()
            self.first, at = n, 0
        # each source's weight over its mean item length so far, (tokens + 1) / (items + 1)
        rates = [w * (c + 1) / (t + 1) for w, c, t in zip(a, self.counts, self.tokens)]
        x = self.uniforms[at] * sum(rates)
        best = -1
        for i, rate in enumerate(rates):
            if rate:
                best = i
                if x < rate:
                    break
                x -= rate
        return best

    def measure(self, j: int, item: Any) -> None:
        size = self.pipe.len_fn(item)  # type: ignore[misc]
        try:
            size = operator.index(size)
        except TypeError:
            raise TypeError(f"Mixer: len_fn must return an int, got {type(size).__name__} for item {self.n} "
                            f"(from source {self.pipe.names[j]!r})") from None
        if size < 0:
            raise ValueError(f"Mixer: len_fn returned {size} for item {self.n} (from source "
                             f"{self.pipe.names[j]!r}): a length must be >= 0")
        self.counts[j] += 1
        self.tokens[j] += size
        self.total += size
        self.n += 1

    # -- sources ---------------------------------------------------------------------------------
    def restart(self, j: int) -> Any:
        """Source ``j`` has ended at a draw: its first item in a new pass of it, or ``_MISS`` where the
        pass ends (``stop``)."""
        self.restarts[j] += 1
        stop = self.pipe.stop
        if stop == "first_exhausted" or (
                stop == "all_exhausted" and all(r for r, w in zip(self.restarts, self.a) if w)):
            self.end(j)
            return _MISS
        source = self.pipe.datapipes[j]
        pass_ = self.pass_()
        if pass_ is None:  # the pass is gone (its iterator was dropped): a pass of the source's own
            it = iter(source)
        else:
            pass_.forget(source)  # its runs are now those of the new pass of it
            pass_.reseed(source, self.restarts[j])  # its shuffles draw a new order each round
            it = pass_.open(source)
        self.its[j] = it
        self.nexts[j] = it.__next__
        x = next(it, _MISS)
        if x is _MISS:
            raise ValueError(f"Mixer: source {self.pipe.names[j]!r} yields no item once restarted (stop={stop!r}): "
                             f"it cannot keep its share")
        return x

    def end(self, j: int) -> None:
        """The pass ends at a draw from source ``j``, which is not made."""
        if self.pipe.by == "items":
            n, counts = self.position()
            counts[j] -= 1
            self.n, self.counts, self.block, self.taken = n - 1, counts, None, None
        self.done = True

    # -- the state -------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        n, counts = self.position()
        state: dict[str, Any] = {"drawn": n, "counts": counts, "restarts": list(self.restarts), "done": self.done}
        if self.pipe.by == "tokens":
            state["tokens"] = list(self.tokens)
        if self.drain is not None:
            state["drain"] = list(self.drain)
            return state
        if self.pipe._a is None:
            since, arg, base, tokens = self.since
            state["since"] = {"drawn": since, "at": arg, "counts": list(base), "tokens": list(tokens)}
        if self.gen is not None:
            if self.origin_rng is None:  # no block drawn yet
                st = self.gen.bit_generator.state["state"]
                state["rng"], state["skip"] = [st["state"], st["inc"]], 0
            else:
                state["rng"], state["skip"] = list(self.origin_rng), n - self.origin
        return state

    def _ints(self, state: dict[str, Any], key: str, total: int | None) -> list[int]:
        values = check_list(state, key, self.k, limit=f"the {self.k} sources")
        if len(values) != self.k or any(type(v) is not int or v < 0 for v in values):
            invalid(f"state[{key!r}] must hold an int >= 0 per source ({self.k}), got {values!r:.100}")
        if total is not None and sum(values) != total:
            invalid(f"state[{key!r}] must add up to {total}, got {values!r:.100}")
        return list(values)

    @staticmethod
    def _pcg_state(pair: Any) -> dict[str, Any]:
        return {"bit_generator": "PCG64", "state": {"state": pair[0], "inc": pair[1]}, "has_uint32": 0, "uinteger": 0}

    def load(self, state: dict[str, Any]) -> None:
        pipe = self.pipe
        check_dict(state)
        n = check_int(state, "drawn")
        counts = self._ints(state, "counts", n)
        restarts = self._ints(state, "restarts", None)
        done = check_bool(state, "done")
        tokens = self._ints(state, "tokens", None) if pipe.by == "tokens" else [0] * self.k
        if "drain" in state:
            ended = check_list(state, "drain", self.k, limit=f"the {self.k} sources")
            if len(ended) != self.k or any(type(v) is not bool for v in ended):
                invalid(f"state['drain'] must hold a bool per source ({self.k}), got {ended!r:.100}")
            self.n, self.counts, self.tokens, self.restarts, self.done = n, counts, tokens, restarts, done
            self.total, self.drain = sum(tokens), list(ended)
            return
        since: tuple[int, int, list[int], list[int]] = (0, 0, [0] * self.k, [0] * self.k)
        a = pipe._a
        if a is None:
            seg = check_dict(state.get("since"), "state['since']", keys=("drawn", "at", "counts", "tokens"))
            at = check_int(seg, "drawn", 0, n)
            base = self._ints(seg, "counts", at)
            base_tokens = self._ints(seg, "tokens", None)
            arg = check_int(seg, "at", 0, at if pipe.by == "items" else sum(base_tokens))
            if any(x > y for x, y in zip(base, counts)) or any(x > y for x, y in zip(base_tokens, tokens)):
                invalid("state['since'] counts more than state['counts'] or state['tokens']")
            since = (at, arg, base, base_tokens)
            a = _integer_weights(f"Mixer: weights({arg})", pipe.names, pipe.weights(arg))  # type: ignore[operator]
        if any(c for c, w in zip([x - y for x, y in zip(counts, since[2])], a) if c and not w):
            invalid(f"state['counts'] draws from a source of weight 0, got {counts!r:.100}")
        if self.gen is not None:
            pair = check_list(state, "rng", 2)
            if len(pair) != 2 or any(type(v) is not int or not 0 <= v < 1 << 128 for v in pair):
                invalid(f"state['rng'] must be two ints from 0 to 2**128 - 1, got {pair!r:.100}")
            skip_ = check_int(state, "skip", 0, min(n, BLOCK))
            if (n - skip_) % BLOCK and pipe.by == "items":
                invalid(f"state['skip'] must be {n % BLOCK or BLOCK} or 0 at draw {n}, got {skip_}")
            self.gen.bit_generator.state = self._pcg_state(pair)
            self.origin_rng, self.skip, self.origin = list(pair), skip_, n - skip_
        elif pipe.by == "items":
            # the exact schedule is a function of the draw: the counts must be where it puts them
            schedule = _Schedule(a)
            t = n - since[0]
            s = [x - y for x, y in zip(counts, since[2])]
            expected = schedule.counts_at(t)
            if expected is None:
                m, c = schedule.m, 2 * max(1, sum(1 for w in a if w) - 1)
                if any(abs(c * (w * t - m * x)) > (c - 1) * m for w, x in zip(a, s)):
                    expected = [-1]
            if expected is not None and expected != s:
                invalid(f"state['counts'] are not the schedule's at draw {n}, got {counts!r:.100}")
        self.n, self.counts, self.tokens, self.restarts, self.done = n, counts, tokens, restarts, done
        self.total = sum(tokens)
        self.since, self.a, self.schedule, self.cumulative = since, a, None, []
        self.next_call = -(-n // BLOCK) * BLOCK


# -- the loops -------------------------------------------------------------------------------------


def _drain(run: _MixRun) -> Iterator[Any]:
    """A tail's mixture (``run.drain`` set): what each source still yields, its sharding filters
    closed, one source after another in turn, to the last; no source is restarted. The shares of a
    tail are not kept: it holds what the old shard had in flight, a few items per source."""
    ended = run.drain
    assert ended is not None
    nexts, names, named = run.nexts, run.pipe.names, run.pipe.with_source
    tokens = run.pipe.by == "tokens"
    while not run.done:
        for j in range(run.k):
            if ended[j]:
                continue
            try:
                x = nexts[j]()
            except StopIteration:
                ended[j] = True
                continue
            if tokens:
                run.measure(j, x)
            else:
                run.counts[j] += 1
                run.n += 1
            yield (names[j], x) if named else x
        run.done = all(ended)


def _mix_items(run: _MixRun) -> Iterator[Any]:
    """Shares in items: each block's list of sources, one draw per entry."""
    run.started = True
    nexts = run.nexts
    try:
        if run.drain is not None:  # known once the pass has loaded the run's state
            yield from _drain(run)
            return
        while run.next_block():
            it = run.it
            while True:
                try:
                    for j in it:  # type: ignore[union-attr]
                        yield nexts[j]()
                    break
                except StopIteration:
                    x = run.restart(j)
                    if x is _MISS:
                        return
                    yield x
    except BaseException:
        for it_ in run.its:
            abandon(it_)
        raise


def _mix_items_named(run: _MixRun) -> Iterator[tuple[str, Any]]:
    """As :func:`_mix_items`, yielding ``(name, item)``."""
    run.started = True
    nexts = run.nexts
    names = run.pipe.names
    try:
        if run.drain is not None:
            yield from _drain(run)
            return
        while run.next_block():
            it = run.it
            while True:
                try:
                    for j in it:  # type: ignore[union-attr]
                        yield names[j], nexts[j]()
                    break
                except StopIteration:
                    x = run.restart(j)
                    if x is _MISS:
                        return
                    yield names[j], x
    except BaseException:
        for it_ in run.its:
            abandon(it_)
        raise


def _mix_tokens(run: _MixRun) -> Iterator[Any]:
    """Shares in tokens: each draw chosen from the tokens drawn so far."""
    run.started = True
    nexts = run.nexts
    names = run.pipe.names
    named = run.pipe.with_source
    choose, measure = run.choose, run.measure
    try:
        if run.drain is not None:
            yield from _drain(run)
            return
        if run.done:
            return
        while True:
            j = choose()
            try:
                x = nexts[j]()
            except StopIteration:
                x = run.restart(j)
                if x is _MISS:
                    return
            measure(j, x)
            yield (names[j], x) if named else x
    except BaseException:
        for it_ in run.its:
            abandon(it_)
        raise


# -- the stage -------------------------------------------------------------------------------------


class Mixer(IterDataPipe[T]):
    """Yield items drawn from several named pipes in set proportions, exactly by default (no
    functional name: its sources are a dict, of which no one pipe is the receiver).

    Args:
        sources: ``{name: pipe}``, at least one; names are str.
        weights: ``{name: weight}`` with every name of ``sources`` and no other, weights numbers
            >= 0, not all 0 (normalised; a source of weight 0 is never drawn); or a function of the
            count drawn so far (items, or tokens with ``by="tokens"``) returning such a dict: a
            schedule, such as a curriculum. It is called at the start and every ``BLOCK`` (4096)
            draws, the weights holding in between, and must give the same weights for the same
            count (a resumed pass calls it again). New weights start a new exact schedule there.
        exact: ``True`` (default): the draws follow a fixed order that keeps every prefix within
            one item of its shares (below); ``False``: each draw picks a source at random with
            probability its weight (with ``by="tokens"``, its weight over its mean length so far).
        by: ``"items"`` (default) or ``"tokens"``: what the shares count.
        len_fn: with ``by="tokens"``, the tokens of an item; default ``len(item["tokens"])`` for a
            dict with ``"tokens"``, else ``len(item)``.
        stop: when a source ends: ``"all_exhausted"`` (default) restarts it (a new pass of that
            source, at the same place in the schedule, whose shuffles draw a new order: its random
            stages get seeds derived from their first ones and the round) until every source of
            positive weight has ended at least once, then ends; ``"first_exhausted"`` ends at once; ``"never"`` restarts
            forever. The draw that found the source ended is not made.
        seed: with ``exact=False``, the seed of the draws; ``None`` (default): the pipe's seed
            (``set_seed``, the DataLoader's), else a fresh one each pass.
        with_source: yield ``(name, item)`` pairs instead of items.

    Yields:
        Items of the sources, each source's in its order.

    Raises:
        TypeError / ValueError: a bad argument, naming it; a weights schedule's bad result, naming
            the count it was called with. ``ValueError`` at a restart that yields no item.

    Exactness (``exact=True``, ``by="items"``): with ``k`` sources of positive weight ``w_i`` (of sum
    1), every prefix of ``n`` items holds ``d_i`` items of each with ``|d_i - w_i n| <= 1 - 1/(2(k-1))``
    (Tijdeman's bound; see :mod:`datapipes.iter.mixing`). Weights are read as exact fractions (0.3 is
    3/10). With ``by="tokens"`` each draw is from the source furthest behind its share of the tokens
    drawn; with ``L`` the longest item drawn, every prefix holds ``t_i`` tokens of each with
    ``-(1 - w_i) L <= w_i T - t_i <= (k - 2 + w_i) L`` for ``T`` tokens in all: within ``(k - 1) L``
    whatever the length of the stream.

    ``len()``: with ``stop="first_exhausted"``, ``exact=True``, ``by="items"``, fixed weights and
    sources of known length, the number of draws before one finds its source ended; otherwise
    ``TypeError``.

    Checkpoint: the state holds the items drawn from each source (and tokens), its restarts, the
    segment of a weights schedule, the generator's state at the start of its block; the sources'
    positions are their own stages'. :attr:`shares` shows the latest pass's realised shares.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> from datapipes.iter.mixing import Mixer
        >>> pipe = Mixer({"a": IterableWrapper("abcdef"), "b": IterableWrapper("XYZ")}, {"a": 2, "b": 1},
        ...              stop="first_exhausted")
        >>> "".join(pipe), len(pipe)
        ('aXbcYdeZf', 9)

    See also: :class:`SampleMultiplexer` (random draws, each input read to its end),
    :class:`Multiplexer` (one of each in turn).
    """

    _saves = ("items (and tokens) drawn and restarts per source, a weights schedule's segment, "
              "the generator's state at its block's start (two ints)")

    _repr_fields = ("weights",)

    def __init__(
        self,
        sources: Mapping[str, IterDataPipe[T]],
        weights: Weights,
        *,
        exact: bool = True,
        by: str = "items",
        len_fn: Callable[[Any], int] | None = None,
        stop: str = "all_exhausted",
        seed: int | None = None,
        with_source: bool = False,
    ) -> None:
        if not isinstance(sources, Mapping):
            raise TypeError(f"Mixer: sources must be a dict of names to pipes, got {type(sources).__name__}")
        if not sources:
            raise ValueError("Mixer: sources is empty: give at least one pipe")
        for name, dp in sources.items():
            if type(name) is not str:
                raise TypeError(f"Mixer: the names of sources must be str, got {name!r:.60}")
            require_pipe(dp, "Mixer", f"sources[{name!r}]")
        self.datapipes = tuple(sources.values())
        self.names = tuple(sources)
        self._a: tuple[int, ...] | None
        if callable(weights) and not isinstance(weights, Mapping):
            self.weights: Weights = weights
            self._a = None
        else:
            self._a = _integer_weights("Mixer: weights", self.names, weights)
            self.weights = dict(weights)
        self.exact = require_bool(exact, "Mixer", "exact")
        if by not in BYS:
            raise ValueError(f"Mixer: by must be one of {', '.join(map(repr, BYS))}, got {by!r}")
        self.by = by
        require_callable(len_fn, "Mixer", "len_fn", optional=True)
        if len_fn is not None and by != "tokens":
            raise ValueError("Mixer: len_fn counts an item's tokens: it needs by='tokens'")
        self.len_fn = _token_len if len_fn is None else len_fn
        if stop not in STOPS:
            raise ValueError(f"Mixer: stop must be one of {', '.join(map(repr, STOPS))}, got {stop!r}")
        self.stop = stop
        require_int(seed, "Mixer", "seed", optional=True)
        if seed is not None and exact:
            raise ValueError("Mixer: seed seeds the random draws of exact=False; exact=True draws none")
        self.with_source = require_bool(with_source, "Mixer", "with_source")
        self._is_random = not exact
        if seed is not None:
            self._seed = seed

    # -- a change of loader layout (datapipes.loader.shards.redistribute) --------------------------
    #: each worker may mix its own shard of each source: the sources' sharding filters split again
    #: independently when a state resumes with another number of workers or ranks
    _splits_per_source = True

    def _sharded(self) -> list[bool]:
        """Whether each source's graph holds a sharding stage."""
        return [any(is_sharding_stage(s) for s in walk(dp)) for dp in self.datapipes]

    def _relayout_problem(self, state: Any) -> str | None:
        """Why this stage's ``state``, saved below sharding filters, cannot be split among another
        layout's shards: a restarted sharded source is in a later round than the epoch that the new
        shards' filters read again."""
        restarts = state.get("restarts") if type(state) is dict else None
        if self.stop == "first_exhausted":
            return None  # a source that ended ends the pass (counted as a restart): no new round
        if type(restarts) is not list or len(restarts) != len(self.names):
            return None  # the state's own checks name what is wrong when it loads
        again = [f"{name!r} ({r} time{'s' if r > 1 else ''})" for name, r, sharded in zip(self.names, restarts, self._sharded())
                 if sharded and r]
        if not again:
            return None
        return (f"restarted its sharded source(s) {', '.join(again)}: the new shards would read them again from "
                f"the epoch's first round. Resume with the same num_workers and world size, or mix before one "
                f"sharding_filter (Mixer(...).sharding_filter()), which splits again whatever the rounds")

    def _tail_state(self, state: Any) -> Any:
        """``state`` for a *tail*: a pass finishing what a shard of another layout held, its sharding
        filters closed. A tail reads every sharded source to its end (a mixture that stopped at the
        first would lose what the others hold) and no unsharded one (its items are the new shards')."""
        if type(state) is not dict:
            return state
        return {**state, "drain": [not sharded for sharded in self._sharded()]}

    def _open(self, ctx: Pass) -> Iterator[T]:
        seed = None if self.exact else ctx.seed_for(self)
        its = [ctx.open(dp) for dp in self.datapipes]
        run = _MixRun(self, ctx, its, seed)
        ctx.track(self, run)
        _latest[self] = run
        if self.by == "tokens":
            return _mix_tokens(run)
        return _mix_items_named(run) if self.with_source else _mix_items(run)  # type: ignore[return-value]

    def __len__(self) -> int:
        if self.stop != "first_exhausted" or not self.exact or self.by != "items" or self._a is None:
            why = ("it restarts ended sources" if self.stop != "first_exhausted" else
                   "its draws are random" if not self.exact else
                   "its shares count tokens" if self.by != "items" else "its weights follow a schedule")
            raise len_unknown(self, why)
        a = self._a
        lengths = {j: source_len(self, self.datapipes[j], f"sources[{self.names[j]!r}]")
                   for j, w in enumerate(a) if w}
        schedule = _Schedule(a)
        if schedule.period is not None:
            array = schedule.period[1]
            ends = []
            for j, length in lengths.items():
                q, r = divmod(length, a[j])
                ends.append(q * schedule.m + int(np.flatnonzero(array == j)[r]))
            return min(ends)
        # no period to reuse: walk the schedule until a source would need more than its length
        n, s = 0, [0] * len(a)
        while True:
            drawn = list(s)
            for j in _edf(a, s, n, BLOCK):
                if drawn[j] == lengths[j]:
                    return n
                drawn[j] += 1
                n += 1

    def _live_shares(self) -> dict[str, dict[str, float]] | None:
        """:attr:`shares`, for the statistics of an observed pass (``StageStats.shares``)."""
        return self.shares

    @property
    def shares(self) -> dict[str, dict[str, float]] | None:
        """The latest pass's shares in this process, live while it runs: for each source, ``drawn``
        (items) and ``tokens`` (with ``by="tokens"``) in the pass, ``share`` (of the items or tokens
        drawn since the weights in force took effect: the whole pass, unless a weights schedule
        changed them) and ``target`` (its weight in force, normalised); ``None`` before any pass."""
        run = _latest.get(self)
        if run is None:
            return None
        n, counts = run.position()
        a = run.a
        m = sum(a)
        at, _, base, base_tokens = run.since  # where the weights in force took effect
        since_n, since_tokens = n - at, run.total - sum(base_tokens)
        out: dict[str, dict[str, float]] = {}
        for j, name in enumerate(self.names):
            entry: dict[str, float] = {"drawn": counts[j]}
            if self.by == "tokens":
                entry["tokens"] = run.tokens[j]
                entry["share"] = (run.tokens[j] - base_tokens[j]) / since_tokens if since_tokens else 0.0
            else:
                entry["share"] = (counts[j] - base[j]) / since_n if since_n else 0.0
            entry["target"] = a[j] / m if m else 0.0
            out[name] = entry
        return out
