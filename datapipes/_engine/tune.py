"""The tuner behind ``concurrency="auto"``: pure hill-climbing on a stage's measured throughput.

The engine measures an auto stage over successive intervals (its clock, its threads) and hands each
interval to :meth:`HillClimber.update` as an :class:`Observation`; the returned number is the
stage's concurrency for the next interval. This module has no threads and no clock: the same
observations always give the same decisions, which is what the tests feed it.

What it reads
    Per interval: the concurrency that ran, the items the stage completed and the interval's
    length (so its throughput, items/s), whether its pipe's limit seems to be elsewhere
    (``starved``: it waited for its source; ``blocked``: its consumer did not take its results;
    either for half of the interval or more), whether the process's CPUs were saturated, whether
    RSS neared ``max_memory``, and ``limit``, the most workers the stage may have now (its share
    of the thread budget). Intervals are summed into one measurement until there are ``samples``
    of them and ``min_items`` items, so a slow stage is judged over enough items for its rate to
    mean something. Throughput decides; starved and blocked are hints, believed only where the
    throughput does not contradict them.

How it decides (three phases)
    *climb*: double the concurrency (from ``initial``) while each step raises the throughput by at
    least ``gain`` (5%; twice that while the CPUs are saturated, where a step mostly takes CPU from
    other stages or processes). A step that did not pay is undone at once.
    *trim*: where the last step that paid gained less than in proportion (the knee lies below),
    bisect between the setting before it and the best one for the fewest workers whose throughput
    is within ``tolerance`` (3%) of the best measured; stop within 1/8 of the best setting. Where
    even the first step up did not pay and the hints put the limit elsewhere, or the step made
    things worse on saturated CPUs (more threads than cores for CPU-bound work), bisect downwards
    from the first setting to ``minimum`` the same way.
    *hold*: keep the setting while its throughput stays near the plateau (a moving average that
    follows changes up to half of ``retune``). When the last two intervals together moved by more
    than ``retune`` (25%), each by more than half of it, the bottleneck moved: the climber
    *re-tunes*. If the throughput fell and the CPUs are not saturated, the work per item got
    slower (an I/O latency grew): by Little's law the concurrency that restores the old throughput
    is the current one times old/new, so it jumps there (at most 8x, within the limit) and climbs
    on; if the hints put the limit elsewhere it trims downwards; otherwise it climbs from where
    it is. A change of the hints alone for two intervals (the limit moved to or away from this
    stage) re-tunes the same way, and so does a budget that grew under a stage held at it. Every
    ``probe_every`` intervals a hold probes a quarter up, or down from 4 workers or more
    (alternating); a probe up that pays becomes a climb, a probe down that keeps the throughput
    stays, and a probe that finds nothing doubles the wait for the next one (up to 8x).

Bounds, memory and CPU
    The result never exceeds ``limit``, ``maximum`` or the memory ceiling, and is never below
    ``minimum`` unless ``limit`` is (the budget is a hard bound). ``memory_high`` steps down at
    once by a quarter (at least one worker) and sets a ceiling one below the setting where memory
    was high, for the rest of the pass; the next interval is given time to show the step's effect
    before another, and a probe soon after looks for room between the two. ``cpu_saturated``
    doubles the gain a step must bring and turns an increase that hurt into a downward search
    (the back-off).

Known limits
    It optimises its own stage's throughput: two auto stages of one pipe each climb while they
    pay, which suits a chain (only the slowest stage's steps pay) but is not a joint optimum. A
    change smaller than ``retune`` is found only by the periodic probes, and the probes' growing
    wait makes that slow on a long-stable pipe. Noise of the order of ``gain`` can accept a step
    that did not really pay (a few workers too many) or refuse one that did; the trims and probes
    correct either over time. The Little's-law jump assumes the slowdown is in the work itself:
    a CPU-starved process whose ``cpu_saturated`` does not say so (where the machine's CPU use
    cannot be read: not Linux) jumps, finds the jump did not pay, and goes back. RSS rarely shrinks once grown (allocators
    keep freed memory), so the memory ceiling is conservative. An interval that ran at another
    concurrency than the one asked for (``Observation.concurrency``) is not measured, and
    ``settle`` more are skipped after each change, for engines whose change takes time to show.

>>> climber = HillClimber(initial=2, maximum=64)
>>> def io(c: int) -> Observation:  # 20 ms per item; the consumer takes at most 1,000 items/s
...     rate = min(c / 0.020, 1000.0)
...     blocked = 1.0 - rate / (c / 0.020)
...     return Observation(c, round(rate), 1.0, 1.0 - blocked, 0.0, blocked, False, False, limit=64)
>>> for _ in range(12):
...     _ = climber.update(io(climber.value))
>>> climber.value, climber.phase
(20, 'hold')
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["HillClimber", "Observation", "Step"]

#: the share of an interval spent starved or blocked from which the stage's limit is elsewhere
ELSEWHERE = 0.5


@dataclass(frozen=True)
class Observation:
    """What the engine measured of one auto stage over one interval.

    Attributes:
        concurrency: workers during the interval.
        items: items the stage completed in the interval.
        seconds: the interval's length (> 0).
        busy: the fraction of the interval the workers were inside ``fn``, averaged over workers (0..1).
        starved: the fraction of the interval the stage waited for its own source (0..1): upstream is the limit.
        blocked: the fraction of the interval the stage's output buffer was full, its consumer not taking
            results (0..1): downstream is the limit.
        cpu_saturated: the process, or every process together (Linux ``/proc/stat``), kept about
            90% or more of the usable CPUs busy over the interval.
        memory_high: RSS above about 90% of ``max_memory``.
        limit: the most workers this stage may have now (its share of the thread budget; >= 1).
    """

    concurrency: int
    items: int
    seconds: float
    busy: float
    starved: float
    blocked: float
    cpu_saturated: bool
    memory_high: bool
    limit: int

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"Observation: concurrency must be >= 1, got {self.concurrency!r}")
        if self.items < 0:
            raise ValueError(f"Observation: items must be >= 0, got {self.items!r}")
        if not self.seconds > 0:
            raise ValueError(f"Observation: seconds must be > 0, got {self.seconds!r}")
        for name in ("busy", "starved", "blocked"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"Observation: {name} must be between 0 and 1, got {v!r}")
        if self.limit < 1:
            raise ValueError(f"Observation: limit must be >= 1, got {self.limit!r}")

    @property
    def rate(self) -> float:
        """Items per second over the interval."""
        return self.items / self.seconds


class Step(NamedTuple):
    """One decision of a :class:`HillClimber`: the setting measured, its throughput, what came next and why."""

    concurrency: int
    rate: float
    value: int
    reason: str


@dataclass
class _Measure:
    concurrency: int
    rate: float
    starved: float
    blocked: float
    cpu_saturated: bool

    @property
    def elsewhere(self) -> bool:
        """The stage's pipe is limited by another stage (its source or its consumer)."""
        return self.starved >= ELSEWHERE or self.blocked >= ELSEWHERE


def _change(rate: float, reference: float) -> float:
    """``rate`` relative to ``reference``, minus one (0.1: 10% faster)."""
    if reference > 0:
        return rate / reference - 1
    return math.inf if rate > 0 else 0.0


class HillClimber:
    """Tunes one stage's concurrency from its measured throughput, one interval at a time.

    Args:
        initial: the concurrency to start from.
        minimum, maximum: the bounds of the search (``limit`` of each observation bounds it too).
        gain: the relative throughput gain a step up must bring to be kept (0.05: 5%).
        tolerance: how much slower (relative) a smaller setting may be and still be preferred (0.03).
        retune: the relative change of a held setting's throughput that restarts the search (0.25).
        probe_every: intervals between probes while holding (None: never probe).
        samples: intervals summed into one measurement (at least).
        min_items: items a measurement needs (intervals are summed until there are this many).
        settle: intervals skipped after each change of concurrency.
        keep: how many decisions :attr:`history` keeps.

    Attributes:
        value: the concurrency to use now (what the last :meth:`update` returned).
        phase: ``"climb"``, ``"trim"`` or ``"hold"``.
        reason: why the last decision was taken, in words (shown in statistics and ``profile``).
        history: the last decisions, oldest first, as :class:`Step` records.

    Raises:
        ValueError: a bound or option out of range (naming it).
    """

    def __init__(self, initial: int = 2, minimum: int = 1, maximum: int = 64, *, gain: float = 0.05,
                 tolerance: float = 0.03, retune: float = 0.25, probe_every: int | None = 20, samples: int = 1,
                 min_items: int = 16, settle: int = 0, keep: int = 32) -> None:
        if minimum < 1:
            raise ValueError(f"HillClimber: minimum must be >= 1, got {minimum!r}")
        if maximum < minimum:
            raise ValueError(f"HillClimber: maximum must be >= minimum ({minimum}), got {maximum!r}")
        if not minimum <= initial <= maximum:
            raise ValueError(f"HillClimber: initial must be between minimum ({minimum}) and maximum ({maximum}), "
                             f"got {initial!r}")
        for name, v in (("gain", gain), ("tolerance", tolerance), ("retune", retune)):
            if not 0.0 <= v < 1.0:
                raise ValueError(f"HillClimber: {name} must be in [0, 1), got {v!r}")
        if probe_every is not None and probe_every < 1:
            raise ValueError(f"HillClimber: probe_every must be >= 1 or None, got {probe_every!r}")
        for name, n, least in (("samples", samples, 1), ("min_items", min_items, 0), ("settle", settle, 0),
                               ("keep", keep, 1)):
            if n < least:
                raise ValueError(f"HillClimber: {name} must be >= {least}, got {n!r}")
        self.minimum, self.maximum = minimum, maximum
        self.gain, self.tolerance, self.retune = gain, tolerance, retune
        self.probe_every, self.samples, self.min_items, self.settle = probe_every, samples, min_items, settle
        self.value = initial
        self.phase = "climb"
        self.reason = f"start at {initial}"
        self.history: collections.deque[Step] = collections.deque(maxlen=keep)
        # climb: the last setting kept and its rate; the kept one before it (known slower), if any
        self._base: tuple[int, float] | None = None
        self._below: int | None = None
        self._linear = False  # the step from below to base scaled (nearly) in proportion
        self._base_elsewhere = False  # the readings at the climb's first setting put the limit elsewhere
        # trim: bisection between lo (too slow) and hi (good enough), against the rate ref
        self._lo = self._hi = 0
        self._ref = 0.0
        self._trim_for = "plateau"
        # hold
        self._held_for = "plateau"
        self._plateau: float | None = None
        self._recent: list[float] = []  # the last two rates measured at the held setting
        self._was_elsewhere: bool | None = None  # the stage's limit was elsewhere when the hold began
        self._limit_streak = self._flip = 0
        self._held = 0
        self._period = probe_every or 0
        self._next_probe = "up"
        self._probing: str | None = None  # "up" or "down" while a probe's step is being measured
        self._ceiling: int | None = None  # memory
        self._mem_wait = 0
        self._cap = maximum
        # the measurement being summed
        self._skip = 0
        self._n = self._items = 0
        self._seconds = self._starved = self._blocked = 0.0
        self._cpu = 0

    def __repr__(self) -> str:
        return f"HillClimber(value={self.value}, phase={self.phase!r}, reason={self.reason!r})"

    # -- the one entry point -------------------------------------------------------------------------

    def update(self, obs: Observation) -> int:
        """Take one interval's observation; return the concurrency for the next interval."""
        cap = self._cap = max(1, min(self.maximum, obs.limit, self._ceiling or self.maximum))
        if obs.memory_high:
            return self._memory(obs, cap)
        self._mem_wait = 0
        if self.value > cap:
            return self._to_hold(cap, "limit", obs.concurrency, obs.rate,
                                 f"the budget allows {cap}: down from {self.value}")
        if self.value < min(self.minimum, cap):  # the budget had held it below the minimum
            return self._to_hold(min(self.minimum, cap), "limit", obs.concurrency, obs.rate,
                                 f"the budget allows {cap}: back up to the minimum, {min(self.minimum, cap)}")
        if obs.concurrency != self.value:  # this interval ran (partly) at another setting
            self._clear()
            return self.value
        if self._skip:
            self._skip -= 1
            return self.value
        m = self._measure(obs)
        if m is None:
            return self.value
        if self.phase == "climb":
            return self._climb(m, cap)
        if self.phase == "trim":
            return self._trim(m)
        return self._hold(m, cap)

    # -- measuring ------------------------------------------------------------------------------------

    def _clear(self) -> None:
        self._n = self._items = self._cpu = 0
        self._seconds = self._starved = self._blocked = 0.0

    def _measure(self, obs: Observation) -> _Measure | None:
        """Sum ``obs`` into the running measurement; return it once it has enough intervals and items."""
        self._n += 1
        self._items += obs.items
        self._seconds += obs.seconds
        self._starved += obs.starved * obs.seconds
        self._blocked += obs.blocked * obs.seconds
        self._cpu += obs.cpu_saturated
        if self._n < self.samples or self._items < self.min_items:
            return None
        s = self._seconds
        m = _Measure(obs.concurrency, self._items / s, self._starved / s, self._blocked / s, 2 * self._cpu > self._n)
        self._clear()
        return m

    # -- deciding -------------------------------------------------------------------------------------

    def _set(self, value: int, phase: str, measured: int, rate: float, reason: str) -> int:
        if value > self._cap:  # a search step back up to a setting the budget no longer allows
            return self._to_hold(self._cap, "limit", measured, rate, f"{reason}; the budget allows {self._cap}")
        if value != self.value:
            self._skip = self.settle
        self._clear()
        self.value, self.phase, self.reason = value, phase, reason
        self.history.append(Step(measured, rate, value, reason))
        return value

    def _to_hold(self, value: int, why: str, measured: int, rate: float, reason: str, resume: bool = False,
                 known: float | None = None) -> int:
        """Hold ``value``. ``known``: its throughput measured during the search, the plateau's first
        measure, so a change that happened during the search shows against it. ``resume``: back from
        a probe, the plateau measured before it still stands."""
        self._held_for = why
        if not resume:
            self._plateau = known
            self._recent = []
            self._flip = 0
            self._was_elsewhere = None
        self._limit_streak = 0
        self._held = 0
        self._probing = None
        return self._set(value, "hold", measured, rate, reason)

    def _to_trim(self, lo: int, hi: int, ref: float, m: _Measure, reason: str, why: str = "") -> int:
        """Bisect between ``lo`` (too slow) and ``hi`` (good), or hold at ``hi`` when they are close;
        ``why``: what the hold at the end is for (``"elsewhere"``: the limit is another stage)."""
        self._lo, self._hi, self._ref = lo, hi, ref
        self._trim_for = why or self._trim_for
        if hi - lo <= max(1, hi // 8):
            return self._to_hold(hi, self._trim_for, m.concurrency, m.rate, reason, known=self._ref)
        return self._set((lo + hi) // 2, "trim", m.concurrency, m.rate, f"{reason}; trying {(lo + hi) // 2}")

    def _trim_down(self, m: _Measure, reason: str) -> int:
        """More workers cannot help (the stage's limit is elsewhere, or the CPUs are saturated): look
        for the fewest workers that keep its throughput, down to ``minimum``."""
        if m.elsewhere:
            reason += "; the limit is " + ("its source" if m.starved >= m.blocked else "its consumer")
        if m.concurrency > self.minimum:
            return self._to_trim(self.minimum - 1, m.concurrency, m.rate, m, reason, "elsewhere")
        return self._to_hold(m.concurrency, "elsewhere", m.concurrency, m.rate, reason, known=m.rate)

    def _to_climb(self, m: _Measure, cap: int, reason: str, jump: int | None = None) -> int:
        """Climb from the measured setting (its rate is the base), or jump to ``jump`` first."""
        self._base, self._below, self._linear, self._base_elsewhere = (m.concurrency, m.rate), None, False, m.elsewhere
        if jump is not None and jump > m.concurrency:
            return self._set(jump, "climb", m.concurrency, m.rate, f"{reason}: jumping to {jump}")
        return self._grow(m, cap, reason)

    def _grow(self, m: _Measure, cap: int, reason: str, small: bool = False) -> int:
        """At a kept setting: try more workers (twice as many, or a quarter more when ``small``: a
        probe), or hold at the cap."""
        c = m.concurrency
        if c >= cap:
            if self._below is not None and not self._linear and not small:
                # the last step paid less than in proportion: fewer workers may do as well
                return self._to_trim(self._below, c, m.rate, m, f"{reason}; at the most allowed ({cap})", "plateau")
            return self._to_hold(c, "limit", c, m.rate, f"{reason}; at the most allowed ({cap})", known=m.rate)
        up = min(cap, c + max(1, c // 4) if small else max(c + 1, 2 * c))
        return self._set(up, "climb", c, m.rate, f"{reason}; trying {up}")

    def _climb(self, m: _Measure, cap: int) -> int:
        c, r = m.concurrency, m.rate
        if self._base is None or self._base[0] == c:  # the first measure of this climb
            self._base, self._below, self._linear, self._base_elsewhere = (c, r), None, False, m.elsewhere
            if m.elsewhere and c >= cap:
                return self._trim_down(m, f"{c}: {r:,.1f} items/s")
            return self._grow(m, cap, f"{c}: {r:,.1f} items/s")
        p, rp = self._base
        need = self.gain * (2 if m.cpu_saturated else 1)
        ratio = r / rp if rp > 0 else (math.inf if r > 0 else 1.0)
        if c > p and ratio >= 1 + need:
            if self._probing:
                self._note_probe(changed=True)
                self._probing = None
            self._below, self._base = p, (c, r)
            self._linear = ratio >= 1 + 0.8 * (c / p - 1)
            return self._grow(m, cap, f"{p} -> {c} gained {ratio - 1:.0%}")
        why = f"{p} -> {c} gained {ratio - 1:+.0%} (< {need:.0%}{', CPU saturated' if m.cpu_saturated else ''})"
        if self._probing:
            self._note_probe(changed=False)
            return self._to_hold(p, self._held_for, c, r, f"{why}: back to {p}", resume=True)
        if self._below is not None and not self._linear:
            return self._to_trim(self._below, p, rp, m, f"{why}: back below {c}", "plateau")
        if self._below is None and (self._base_elsewhere or (m.cpu_saturated and ratio < 1 - 2 * self.gain)):
            # more workers did not help where the readings said the limit was elsewhere (believe
            # them), or made things worse on saturated CPUs (fewer may do better): search downwards
            return self._trim_down(_Measure(p, rp, m.starved, m.blocked, m.cpu_saturated), f"{why}: back to {p}")
        # nothing to trim: no slower setting known, or the throughput grew in proportion up to p
        return self._to_hold(p, "plateau", c, r, f"{why}: back to {p}", known=rp)

    def _trim(self, m: _Measure) -> int:
        c, r = m.concurrency, m.rate
        if r >= self._ref * (1 - self.tolerance):
            self._hi = c
            self._ref = max(self._ref, r)  # compare with the best seen
            verdict = f"{c} keeps {r / self._ref:.0%} of {self._ref:,.1f} items/s"
        else:
            self._lo = c
            verdict = f"{c} is slower ({r / self._ref:.0%} of {self._ref:,.1f} items/s)"
        if self._probing:  # a single step down
            self._note_probe(changed=self._hi == c)
            # the plateau stands either way: the step kept the throughput, or it was undone
            return self._to_hold(self._hi, self._held_for, c, r, verdict, resume=True)
        return self._to_trim(self._lo, self._hi, self._ref, m, verdict)

    def _hold(self, m: _Measure, cap: int) -> int:
        c, r = m.concurrency, m.rate
        self._recent = [*self._recent[-1:], r]
        if self._was_elsewhere is None:
            self._was_elsewhere = m.elsewhere
        if self._plateau is None:
            self._plateau = r
            return self.value
        plateau = self._plateau
        level = sum(self._recent) / len(self._recent)
        moved, now = _change(level, plateau), _change(r, plateau)
        if (len(self._recent) == 2 and abs(moved) > self.retune
                and all(abs(_change(x, plateau)) > self.retune / 2 and _change(x, plateau) * moved > 0
                        for x in self._recent)):
            # the last two intervals together moved past the band, each one clearly: not one odd
            # interval. The last one alone is the new level (the one before may straddle the change).
            return self._retune(m, cap, plateau, r)
        if abs(now) <= self.retune / 2:  # ordinary noise (or a slow drift): follow it
            self._plateau = 0.75 * plateau + 0.25 * r
        if self._held_for == "limit" and c < cap and not m.elsewhere:
            self._limit_streak += 1
            if self._limit_streak >= 2:
                return self._to_climb(m, cap, f"{c}: the budget allows more")
        else:
            self._limit_streak = 0
        if m.elsewhere != self._was_elsewhere:  # the bottleneck moved to or from this stage
            self._flip += 1
            if self._flip >= 2:
                if m.elsewhere:
                    return self._trim_down(m, f"{c}: no longer its pipe's limit")
                return self._to_climb(m, cap, f"{c}: the stage became its pipe's limit")
        else:
            self._flip = 0
        self._held += 1
        if self._period and self._held >= self._period:
            return self._probe(m, cap)
        return self.value

    def _retune(self, m: _Measure, cap: int, old: float, new: float) -> int:
        c = m.concurrency
        why = f"{c}: throughput moved {new / old - 1:+.0%} ({old:,.1f} -> {new:,.1f} items/s)" if old > 0 else \
            f"{c}: throughput moved to {new:,.1f} items/s"
        self._period = self.probe_every or 0
        m = _Measure(c, new, m.starved, m.blocked, m.cpu_saturated)
        if m.elsewhere:
            return self._trim_down(m, f"{why}, re-tuning")
        if 0 < new < old and not m.cpu_saturated and c < cap:
            return self._to_climb(m, cap, f"{why}, re-tuning", jump=min(cap, 8 * c, math.ceil(c * old / new)))
        return self._to_climb(m, cap, f"{why}, re-tuning")

    def _probe(self, m: _Measure, cap: int) -> int:
        c = m.concurrency
        up = c < cap
        down = c >= 4 and c - max(1, c // 4) >= self.minimum
        self._held = 0
        if up and down:
            way = self._next_probe
            self._next_probe = "down" if way == "up" else "up"
        elif up or down:
            way = "up" if up else "down"
        else:
            self._note_probe(changed=False)
            return self.value
        self._probing = way
        plateau = self._plateau if self._plateau is not None else m.rate
        if way == "up":
            self._base, self._below, self._linear = (c, plateau), None, False
            return self._grow(_Measure(c, plateau, m.starved, m.blocked, m.cpu_saturated), cap, f"probing up from {c}",
                              small=True)
        step = c - max(1, c // 4)
        self._lo, self._hi, self._ref = step - 1, c, plateau
        return self._set(step, "trim", c, m.rate, f"probing down from {c}: trying {step}")

    def _note_probe(self, changed: bool) -> None:
        if self.probe_every:
            self._period = self.probe_every if changed else min(self._period * 2, self.probe_every * 8)

    def _memory(self, obs: Observation, cap: int) -> int:
        """RSS is near ``max_memory``: a quarter fewer workers now (one interval's grace after each step)."""
        c = self.value
        if self._mem_wait > 0:
            self._mem_wait -= 1
            if c > cap:
                return self._to_hold(cap, "memory", obs.concurrency, obs.rate, f"the budget allows {cap}")
            self._clear()
            self.reason = f"memory high: waiting for the step down to {c} to show"
            return c
        down = max(min(self.minimum, cap), min(cap, c - max(1, c // 4)))
        self._mem_wait = 1
        self._ceiling = max(down, c - 1)  # probes may try between the two
        if down == c:
            self._clear()
            self.reason = f"memory high at {c}, the least allowed"
            return c
        value = self._to_hold(down, "memory", obs.concurrency, obs.rate, f"memory high at {c}: down to {down}")
        if self._period and down < self._ceiling:  # a quarter down may be too far: probe back up soon
            self._held, self._next_probe = self._period - 1, "up"
        return value
