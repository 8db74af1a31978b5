"""What a stage takes from the pass building it: its threads or processes within the pass's budget
(and, for ``concurrency="auto"``, its place with the pass's tuner), the budget and hooks it hands to
a pass of its own, and the hooks watching it (docs/architecture.rst, "The pass").

Each is handed the pass (``pass_``: the ``ctx`` a stage's ``_open`` was given, docs/architecture.rst,
"The stage protocol"). Without one (``None``: a stage asked outside any pass, as for ``len()``),
each answers as the stage would run alone: the requested value, no budget, no hooks.
"""

from __future__ import annotations

from typing import Any, Callable

from .._engine.stats import StageStats
from .observe import TaskHooks
from .passes import Pass
from .tuning import AUTO, auto_start, process_workers, usable_cpus

__all__ = ["concurrency_for", "processes_for", "inherited", "task_hooks"]


def concurrency_for(stage: Any, requested: int | str, threads: bool, pass_: Pass | None = None) -> tuple[int, Callable[..., None] | None]:
    """``(workers, tune)`` for concurrent ``stage`` in the pass building it: its concurrency within
    the pass's thread budget (``threads``: it runs worker threads of its own; 0: inline), and for
    ``concurrency="auto"`` the function that registers its run with the pass's tuner,
    ``tune(stats, run, backend)`` (None where the budget left an auto thread stage no thread: it
    runs inline, untuned). Outside any pass: the requested value (auto: one worker per CPU, at
    least 2 and at most :data:`~datapipes._runtime.tuning.START_MAXIMUM`)."""
    if requested == AUTO:
        if pass_ is None:
            return max(2, auto_start(usable_cpus())), None
        tuner = pass_.tuner()
        start = tuner.initial(threads, stage)  # a thread stage's start is held in the budget from now on
        if start == 0:
            return 0, None

        def tune(stats: StageStats, run: Any, backend: Any) -> None:
            tuner.register(stage, stats, run, backend, threads, start)

        return start, tune
    assert isinstance(requested, int)
    if pass_ is None or not threads:
        return requested, None
    return pass_.budget().threads_for(stage, requested), None


def processes_for(stage: Any, requested: int | str, pass_: Pass | None = None) -> tuple[int, Callable[..., None] | None]:
    """``(processes, tune)`` for process ``stage`` in the pass building it: its worker processes within
    the pass's ``max_processes``, and for ``concurrency="auto"`` the function that registers it with
    the pass's tuner (which then runs from 1 to that many of them). Outside any pass: the requested
    value (auto: one process per CPU, at most :data:`~datapipes._runtime.tuning.PROCESS_MAXIMUM`), untuned."""
    if pass_ is None:
        return (process_workers(usable_cpus()) if requested == AUTO else requested), None  # type: ignore[return-value]
    budget = pass_.budget()
    wanted = process_workers(budget.cpus) if requested == AUTO else requested
    n = budget.take_processes(stage, wanted)  # type: ignore[arg-type]
    if requested != AUTO:
        return n, None
    tuner = pass_.tuner()

    def tune(stats: StageStats, run: Any, backend: Any) -> None:
        tuner.register(stage, stats, run, backend, False, n, maximum=n)

    return n, tune


def inherited(stage: Any, pass_: Pass | None = None) -> tuple[tuple[Any, ...] | None, tuple[int | None, ...] | None]:
    """``(hooks, budget)`` that a stage running its sources as a pass of their own in this process
    (the loader's ``InProcess``) hands to that pass: the hooks watching it (None: not observed) and
    the budget of the pass building it (None: none)."""
    if pass_ is None:
        return None, None
    hooks = None if pass_.observer is None else tuple(pass_.observer.watchers.get(id(stage), ()))
    budget = pass_.budget()
    limits = (budget.max_threads, budget.max_memory, budget.max_processes)
    return hooks, None if limits == (None, None, None) else limits


def task_hooks(stage: Any, pass_: Pass | None = None) -> TaskHooks | None:
    """The task hooks watching concurrent ``stage`` in the pass building it (None: none, the
    common case, where the engine runs ``fn`` bare)."""
    if pass_ is None or pass_.observer is None:
        return None
    return pass_.observer.task_hooks(stage)
