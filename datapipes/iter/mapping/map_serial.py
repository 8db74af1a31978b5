"""The serial forms of ``map`` (:class:`~datapipes.iter.mapping.map.Mapper` with ``concurrency=1``):
bare generators on the consumer's thread, one chosen when the pipe is built, so that nothing
branches on options per item.

- failures raised (:func:`open_raising`): nothing saved (the position is the source's); over a
  source that tells its own position, nothing counted either (``_map_told``);
- ``on_error="skip"`` (:func:`open_skipping`): under a failure budget, the failures counted;
- ``rng=`` (:func:`open_seeded`): the pass seed and the position of the item last handed out, which
  the loop writes before each ``yield`` (one store per item), and the failures under a budget.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, cast

from ..._runtime.passes import Pass
from ..._runtime.validate import check_int, check_loop_state
from ..._engine import abandon
from ..._engine.rng import item_seed, make_rng
from ...errors import call_lines
from ._shared import (
    _budget_start,
    _BudgetRun,
    _column_rng_fn,
    _end_pass,
    _item_fail,
    _item_fn,
    _LoopRun,
    one_to_one,
    serial_failed,
    taken_reader,
)

__all__: list[str] = []  # the forms are the package's own: map.py imports them by name


def open_raising(pipe: Any, ctx: Pass, it: Iterator[Any]) -> Iterator[Any]:
    """A serial pass whose failures are raised: counted positions, or the source's own."""
    taken = taken_reader(it)
    if taken is not None:
        return one_to_one(_map_told(pipe, it, taken), taken)
    return _map_raise(pipe, it)


def open_skipping(pipe: Any, ctx: Pass, it: Iterator[Any]) -> Iterator[Any]:
    """A serial pass under ``on_error="skip"``: its run is saved only under a failure budget."""
    run = _BudgetRun()
    if pipe._policy.max_failures is not None:  # a budget: its count is saved
        ctx.track(pipe, run)
    return _map_skip(pipe, it, run)


def open_seeded(pipe: Any, ctx: Pass, it: Iterator[Any]) -> Iterator[Any]:
    """A serial ``rng=`` pass: its run saves the pass seed and the position."""
    run = _SeededRun(ctx.seed_for(pipe))
    ctx.track(pipe, run)
    return _map_seeded(pipe, it, run)


def _map_raise(pipe: Any, it: Iterator[Any]) -> Iterator[Any]:
    fn = _item_fn(pipe)
    # The position counter is a float: CPython keeps a free list of floats but allocates every int
    # above 256, so ``n += 1.0`` costs about half of ``n += 1`` here (exact up to 2**53 items). It
    # still costs about 12 ns per item, so a source that tells its own position gets _map_told.
    n = 0.0
    try:
        for x in it:
            yield fn(x)
            x = None  # let go of the input while the next one is made (a batch: see iter/batching.py)
            n += 1.0
    except BaseException as e:
        serial_failed(e, pipe, _MAP_FN_LINES, n)
        abandon(it)
        raise


def _map_told(pipe: Any, it: Iterator[Any], taken: Callable[[], int]) -> Iterator[Any]:
    """``_map_raise`` over a source that tells its own position (``taken_reader``): nothing counted."""
    fn = _item_fn(pipe)
    start = taken()
    try:
        for x in it:
            yield fn(x)
            x = None
    except BaseException as e:
        serial_failed(e, pipe, _MAP_TOLD_FN_LINES, lambda: taken() - start - 1)
        abandon(it)
        raise


def _map_skip(pipe: Any, it: Iterator[Any], run: _BudgetRun) -> Iterator[Any]:
    """The serial loop under ``on_error="skip"``: ``run`` is the pass's under a failure budget (its
    state saves the failures counted), else one that is not tracked (the pass saves nothing)."""
    fn = _item_fn(pipe)
    failures, n = _budget_start(pipe, run)
    try:
        for x in it:
            n += 1
            try:
                y = fn(x)
            except Exception as e:
                failures.skip(e, n)
                continue
            run.n = n
            yield y
            x = y = None
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise
    finally:
        run.ended = True
        failures.end(n + 1)  # the summary of what this pass skipped (see datapipes.errors)


class _SeededRun(_LoopRun):
    """The position of a serial ``rng=`` map's pass: the pass seed and the position of the item last
    handed out (``n``, which the loop writes before each ``yield``), each item's generator deriving
    from both, and under a failure budget the failures counted. A pass resumed from a state that
    has ended starts from its source's position with its own pass seed, as it always has."""

    __slots__ = ("seed", "n")

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed
        self.n = -1

    def position(self) -> dict[str, Any]:
        return {"seed": self.seed, "next": self.n + 1, **self.counted()}

    def load(self, state: dict[str, Any]) -> None:
        check_loop_state(state)
        if "next" in state:
            self.seed = check_int(state, "seed", None, default=self.seed)  # absent: this pass's
            self.n = state["next"] - 1
        self.loaded = state


def _map_seeded(pipe: Any, it: Iterator[Any], run: _SeededRun) -> Iterator[Any]:
    fn = _column_rng_fn(pipe.fn, pipe.input_col, pipe.output_col) if pipe.input_col is not None else pipe.fn
    kind = cast(str, pipe.rng)  # the seeded loop runs only with rng= set
    fail = _item_fail(pipe, run)
    run.started = True
    seed, n = run.seed, run.n
    try:
        for x in it:
            n += 1
            try:
                y = fn(x, rng=make_rng(kind, item_seed(seed, n)))
            except Exception as e:
                fail(e, n)
                continue
            run.n = n
            yield y
            x = y = None
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise
    finally:
        run.ended = True
        _end_pass(fail, n + 1)


_MAP_FN_LINES = call_lines(_map_raise)
_MAP_TOLD_FN_LINES = call_lines(_map_told)
