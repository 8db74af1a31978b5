"""Hooks: watch a running pipe, stage by stage — the one extension point of a pass.

A :class:`Hook` is attached to a pipe (``pipe.add_hook(hook)``: that stage and every stage upstream
of it; ``stage_only=True``: that stage alone) and is called by every pass of a graph that holds the
pipe:

- ``stage_start(stats)`` when a stage's pass starts (its first ``next()``), ``stage_stop(stats)``
  when it ends (exhausted, failed, closed, or the pass it belongs to ended);
- ``task_start(stats, position)`` / ``task_end(stats, position, ok)`` around each item a concurrent
  stage's ``fn`` works on (``position``: the item's place in the stage's input; ``ok``: ``fn``
  returned rather than raised). They run where the work runs: on the worker thread (threads, a
  user's executor), on the event-loop thread (async), on the consumer's thread for processes (when
  the item is handed to the pool and when its result comes back). Serial stages run no tasks: their
  per-item cost is in their statistics (``self_s``, ``items_out``);
- ``periodic(stats)`` every ``interval`` seconds while the pass runs, and once more when it ends,
  with ``(stage, StageStats)`` for every stage the hook watches, on a reporter thread of the pass.

``stats`` is the stage's :class:`~datapipes._engine.StageStats` in this pass, live (each pass has its
own: two passes of one pipe never mix figures). Override only what you need: a pass calls only the
methods a hook overrides, and a pass with no hook attached pays nothing. A pass with a hook attached
is *observed*: every serial stage's iterator is wrapped to count its items and time spent in the
stage itself, which costs about a microsecond per item and stage.

What a hook raises is not caught: from ``task_start``/``task_end`` it is the item's failure (the
stage's ``on_error`` applies), from the others it reaches the consumer.

:class:`StatsReporter` logs a table of every stage's figures to the ``datapipes`` logger at an
interval (``datapipes.DataLoader(report_stats_interval=...)`` attaches one).

>>> import threading
>>> from datapipes.hooks import Hook
>>> from datapipes.iter import IterableWrapper
>>> class Count(Hook):
...     def __init__(self):
...         self.tasks = 0
...         self.lock = threading.Lock()  # task hooks run on the stage's worker threads at once
...     def task_end(self, stats, position, ok):
...         with self.lock:
...             self.tasks += 1
>>> count = Count()
>>> pipe = IterableWrapper(range(10)).map(abs, concurrency=2).add_hook(count)
>>> sum(pipe), count.tasks
(45, 10)
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from ._engine.stats import StageStats

__all__ = ["Hook", "StatsReporter", "format_stats"]

logger = logging.getLogger("datapipes")


class Hook:
    """Base class of hooks: every method does nothing; override those you need (see the module).

    Attributes:
        interval: seconds between two calls of :meth:`periodic` while a pass runs (``None``: never).
    """

    interval: float | None = None

    def stage_start(self, stats: StageStats) -> None:
        """A stage's pass started (its first ``next()``)."""

    def task_start(self, stats: StageStats, position: int) -> None:
        """A concurrent stage's ``fn`` starts on the item at ``position`` of the stage's input."""

    def task_end(self, stats: StageStats, position: int, ok: bool) -> None:
        """``fn`` finished the item at ``position``: returned (``ok``) or raised."""

    def stage_stop(self, stats: StageStats) -> None:
        """A stage's pass ended (exhausted, failed, closed, or its pass ended)."""

    def periodic(self, stats: list[tuple[Any, StageStats]]) -> None:
        """Every ``interval`` seconds and at the end of a pass: ``(stage, statistics)`` of the stages
        this hook watches, in graph order (the pipe itself first)."""


def overrides(hook: Any, name: str) -> bool:
    """Whether ``hook`` has its own ``name`` method (not :class:`Hook`'s, which does nothing)."""
    method = getattr(type(hook), name, None)
    return method is not None and method is not getattr(Hook, name)


def with_worker_stats(stats: list[tuple[Any, StageStats]]) -> list[tuple[Any, StageStats]]:
    """``stats`` with, after each stage that runs its sources in DataLoader worker processes, the
    stages inside them, one row per worker and stage, labelled ``[worker k] stage`` (see
    ``WorkerProcesses.worker_stats``)."""
    out: list[tuple[Any, StageStats]] = []
    for stage, s in stats:
        out.append((stage, s))
        inside = getattr(stage, "worker_stats", None)
        if inside is not None:
            for worker, label, ws in reversed(inside()):  # stats are listed root first
                ws = copy.copy(ws)
                ws.label = f"[worker {worker}] {label}"
                out.append((None, ws))
    return out


def format_stats(stats: list[tuple[Any, StageStats]]) -> str:
    """A table of stage figures, one line per stage (data flow order: sources first), then a line
    per stage that mixes sources (``Mixer``) with their realised shares beside their targets.

    >>> from datapipes._engine import StageStats
    >>> s = StageStats("Mapper(f)", "thread", 4, 8)
    >>> print(format_stats([(None, s)]).splitlines()[0])  # doctest: +NORMALIZE_WHITESPACE
    stage  kind  workers  in  out  failed  items/s  busy  self s  fill
    """
    header = ("stage", "kind", "workers", "in", "out", "failed", "items/s", "busy", "self s", "fill")
    rows = [header]
    for _, s in reversed(stats):
        d = s.as_dict()
        workers = f"{d['workers']}{' (auto)' if d['auto'] else ''}"
        busy = f"{d['busy_fraction']:.0%}" if s.kind not in ("serial", "inline") else "-"
        fill = f"{d['queue_fill']:.0%}" if s.capacity else "-"
        rows.append((d["stage"], d["kind"], workers, str(d["items_in"]), str(d["items_out"]), str(d["failures"]),
                     f"{d['items_per_s']:.1f}", busy, f"{d['self_s']:.3f}", fill))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    for _, s in reversed(stats):
        shares = s.shares  # a stage mixing sources: each one's realised share beside its target
        if shares:
            parts = [f"{name} {v['share']:.1%} (target {v['target']:.1%})" for name, v in shares.items()]
            lines.append(f"{s.label}: shares {', '.join(parts)}")
    return "\n".join(lines)


class StatsReporter(Hook):
    """Log every watched stage's figures to the ``datapipes`` logger every ``interval`` seconds, and
    once when the pass ends.

    Args:
        interval: seconds between two reports (> 0).
        level: the logging level of the reports (default ``logging.INFO``).
        logger: the logger to write to (default: the ``datapipes`` logger).

    Example:
        >>> import logging
        >>> from datapipes.iter import IterableWrapper
        >>> from datapipes.hooks import StatsReporter
        >>> pipe = IterableWrapper(range(4)).map(abs).add_hook(StatsReporter(interval=60))
        >>> list(pipe)  # logs one table at the end of the pass
        [0, 1, 2, 3]
    """

    def __init__(self, interval: float, level: int = logging.INFO, logger: logging.Logger | None = None) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)):
            raise TypeError(f"StatsReporter: interval must be a number of seconds, got {type(interval).__name__}")
        if not interval > 0:
            raise ValueError(f"StatsReporter: interval must be > 0, got {interval!r}")
        self.interval = float(interval)
        self.level = level
        self.logger = logger

    def periodic(self, stats: list[tuple[Any, StageStats]]) -> None:
        log = self.logger if self.logger is not None else logger
        # Stages a loader adds without changing any item (the stage that runs the pipe as a pass of
        # its own, whose stages this hook reports from that pass) are left out.
        stats = with_worker_stats([(stage, s) for stage, s in stats if not stage._unseen])
        if stats and log.isEnabledFor(self.level):
            log.log(self.level, "datapipes stage statistics:\n%s", format_stats(stats))

    def __reduce__(self) -> Any:  # loggers pickle by name
        return (StatsReporter, (self.interval, self.level, self.logger))
