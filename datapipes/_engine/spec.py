"""What the engine is told about one concurrent stage: a :class:`StageSpec` (what the stage is,
fixed for its pass) and a :class:`StageSink` (where the pass reports: errors, statistics, its
position for a state, task hooks, the tuner).

A stage builds both when its pass starts and hands them to
:func:`datapipes._engine.concurrent_map`; nothing in the engine reads a pass or a pipe
(docs/architecture.rst, "Layers").
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ErrorPolicy, FailureLog
from .core import EngineRun
from .stats import StageStats

__all__ = ["StageSink", "StageSpec"]


@dataclass(frozen=True)
class StageSpec:
    """One concurrent stage, as its pass runs it.

    ``label``: the stage's name in errors and statistics. ``concurrency``: its workers (0: inline,
    on the consumer's thread). ``ordered``: results in source order (else in completion order).
    ``executor``: ``"thread"``, ``"process"`` or an :class:`~concurrent.futures.Executor` (an
    ``async def`` function runs on the event loop whatever this says). ``timeout``: seconds an item
    may take on a thread or async worker. ``chunksize``: items handed over at once (None: a thread
    stage sizes its chunks from ``fn``'s cost, a process stage from the items' size).
    ``rng_kind``: process stages only: the items are ``(x, seed)`` pairs and the worker builds
    ``fn``'s ``rng=`` of this kind (:data:`datapipes._engine.rng.RNG_KINDS`).
    """

    label: str
    concurrency: int
    ordered: bool = True
    executor: str | Executor = "thread"
    timeout: float | None = None
    chunksize: int | None = None
    rng_kind: str | None = None


@dataclass
class StageSink:
    """Where one pass of a concurrent stage reports.

    ``policy`` and ``log``: what a failed item does (raise, or skip and log). ``stats``: the pass's
    statistics (None: made from the spec). ``run``: the pass's position, read by a state and
    restored before the first ``next()``. ``hooks``: the task hooks called around each item
    (:class:`datapipes._runtime.observe.TaskHooks`). ``tune``: for an auto stage, registers the
    statistics, run and backend with the tuner. ``owner``: the stage, whose worker processes a
    process stage keeps warm across its passes (:mod:`datapipes._engine.process`).
    """

    policy: ErrorPolicy = field(default_factory=ErrorPolicy)
    log: FailureLog = field(default_factory=FailureLog)
    stats: StageStats | None = None
    run: EngineRun = field(default_factory=EngineRun)
    hooks: Any = None
    tune: Callable[[StageStats, EngineRun, Any], None] | None = None
    owner: Any = None
