"""The concurrent forms of ``map`` (:class:`~datapipes.iter.mapping.map.Mapper` with workers: threads,
processes, an ``Executor`` or the event loop), chosen when the pipe is built: each pass builds the
engine's :class:`~datapipes._engine.spec.StageSpec` and sink and runs on the engine
(:mod:`datapipes._engine`). Downstream of ``to_cuda`` items cross with a CUDA stream hand-over each
way (:mod:`.handover`); a generator function run concurrently yields its items, as ``flatmap`` does.

A pass saves the engine's items in flight and, with ``rng=``, its pass seed (:class:`_MapRun`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from ..._runtime.passes import Pass
from ..._runtime.validate import check_engine, check_int
from ..._engine import EngineRun, StageSpec, concurrent_map, new_stats
from ..._engine.rng import make_rng, seeded_call, with_seeds
from ...datapipe import stage_label
from .handover import _handed_back, _handover_fn, _tagged
from ._shared import _async_column_fn, _column_rng_fn, _item_fn, _stage_concurrency, stage_sink
from .flatmap import _flat_engine, _listing_fn

__all__: list[str] = []  # the forms are the package's own: map.py imports them by name


def open_engine(pipe: Any, ctx: Pass, it: Iterator[Any]) -> Iterator[Any]:
    """A concurrent pass on the engine."""
    return _map_engine(pipe, ctx, it, None if pipe.rng is None else ctx.seed_for(pipe))


def open_handover(pipe: Any, ctx: Pass, it: Iterator[Any]) -> Iterator[Any]:
    """A concurrent pass downstream of a CUDA mover."""
    return _map_engine_handover(pipe, ctx, it, None if pipe.rng is None else ctx.seed_for(pipe))


def open_flattening(pipe: Any, ctx: Pass, it: Iterator[Any]) -> Iterator[Any]:
    """A generator function run concurrently (or an async generator function): its items, as
    ``flatmap`` yields them."""
    return _flat_engine(pipe, ctx, it, _listing_fn(pipe.fn, None))


def _engine_fn(pipe: Any) -> Callable[[Any], Any]:
    """The per-item function a concurrent pass runs (columns, async and rng taken into account)."""
    fn, in_col, out_col, kind = pipe.fn, pipe.input_col, pipe.output_col, pipe.rng
    if pipe._async:
        call = fn if in_col is None else _async_column_fn(fn, in_col, out_col)
        if kind is None:
            return call

        async def seeded(pair: Any) -> Any:
            return await call(pair[0], rng=make_rng(kind, pair[1]))

        return seeded
    if kind is None:
        return _item_fn(pipe)
    if in_col is not None:
        # one copy of the column wrapper per call keeps threads apart
        return lambda pair: _column_rng_fn(fn, in_col, out_col)(pair[0], make_rng(kind, pair[1]))
    if pipe.executor == "process":
        return fn  # the worker process wraps it (seeded_call) without importing datapipes
    return seeded_call(fn, kind)


class _MapRun:
    """The position of a concurrent map's pass: the engine's (inputs in flight) and the pass seed of
    a seeded map, whose items' seeds go on from the items already pulled."""

    __slots__ = ("engine", "seed")

    def __init__(self, seed: int | None) -> None:
        self.engine = EngineRun()
        self.seed = seed

    def state(self) -> dict[str, Any]:
        return {"seed": self.seed, **self.engine.state()}

    def restore(self, state: dict[str, Any]) -> None:
        check_int(state, "seed", None, optional=True)
        check_engine(state)
        self.engine.restore(state)
        self.seed = state["seed"]


def _map_engine(pipe: Any, ctx: Pass, it: Iterator[Any], seed: int | None = None) -> Iterator[Any]:
    label = stage_label(pipe)
    run = _MapRun(seed)
    ctx.track(pipe, run)
    source: Iterable[Any] = it if seed is None else _seeded(it, run)
    fn = _engine_fn(pipe)
    worker_rng = pipe.rng if pipe.executor == "process" and pipe.input_col is None else None
    concurrency, tune = _stage_concurrency(pipe, ctx)
    stats = ctx.stats_for(pipe, lambda: new_stats(label, fn, concurrency, pipe.executor, tune is not None))
    spec = StageSpec(label, concurrency, pipe.ordered, pipe.executor, pipe.timeout, pipe.chunksize, worker_rng)
    return concurrent_map(source, fn, spec, stage_sink(pipe, ctx, stats, run.engine, tune))


def _seeded(it: Iterator[Any], run: _MapRun) -> Iterator[tuple[Any, int]]:
    """``(item, its seed)`` pairs: seeds from the run's pass seed and positions, both read at the
    first ``next()`` (a resumed pass has restored them by then)."""
    yield from with_seeds(it, run.seed, lambda: run.engine.pulled)  # type: ignore[arg-type]


def _map_engine_handover(pipe: Any, ctx: Pass, it: Iterator[Any], seed: int | None = None) -> Iterator[Any]:
    """A concurrent pass downstream of a CUDA mover: items cross to the workers and results come
    back with a stream hand-over each way (:mod:`datapipes.iter.device`)."""
    ops = pipe._crossing_ops.bind()  # type: ignore[union-attr]
    label = stage_label(pipe)
    run = _MapRun(seed)
    ctx.track(pipe, run)
    source: Iterable[Any] = it if seed is None else _seeded(it, run)
    fn = _handover_fn(_engine_fn(pipe), ops, pipe._async)
    concurrency, tune = _stage_concurrency(pipe, ctx)
    stats = ctx.stats_for(pipe, lambda: new_stats(label, fn, concurrency, pipe.executor, tune is not None))
    spec = StageSpec(label, concurrency, pipe.ordered, pipe.executor, pipe.timeout, pipe.chunksize)
    out = concurrent_map(_tagged(source, ops.record), fn, spec, stage_sink(pipe, ctx, stats, run.engine, tune))
    return _handed_back(out, ops)
