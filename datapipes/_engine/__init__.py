"""The concurrency engine, used by every concurrent pipe (concurrent ``map``, ``prefetch``, ...).

One stage runs a function on ``concurrency`` workers, chosen once per stage:

- threads (the default): :class:`~datapipes._engine.threads.ThreadWorkers`;
- ``async def`` functions: tasks on one event-loop thread shared by every async stage that is
  running (:mod:`datapipes._engine.aio`);
- ``executor="process"``: worker processes fed in chunks (:mod:`datapipes._engine.process`);
- an executor the user built: :class:`~datapipes._engine.threads.ExecutorWorkers`.

The consumer's thread pulls the source lazily, keeps a bounded window of items in flight and yields
in source order (``ordered=True``) or completion order (:mod:`datapipes._engine.core`).
:func:`background_iter` runs a whole upstream on a producer thread (``prefetch``);
:func:`iterate_async` drives an async iterable on the shared loop. Every stage keeps
:class:`StageStats` of its last pass.
"""

from __future__ import annotations

from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any, Callable, Iterable, Iterator

from ..errors import ErrorPolicy, FailureLog
from .aio import AsyncWorkers, LoopRef, is_async_callable, is_async_gen_callable, iterate_async, loop_running
from .background import BackgroundRun, background_iter
from .core import Backend, EngineRun, failure_handler, run_stage
from .lifecycle import abandon, close_iterator
from .process import ProcessWorkers, live_worker_pids, run_process_stage
from .rng import RNG_KINDS, item_seed
from .spec import StageSink, StageSpec
from .stats import StageStats
from .threads import ExecutorWorkers, InlineWorkers, ThreadWorkers

__all__ = [
    "AsyncWorkers",
    "BackgroundRun",
    "EngineRun",
    "abandon",
    "ExecutorWorkers",
    "LoopRef",
    "ProcessWorkers",
    "RNG_KINDS",
    "StageSink",
    "StageSpec",
    "StageStats",
    "ThreadWorkers",
    "background_iter",
    "close_iterator",
    "concurrent_map",
    "is_async_callable",
    "is_async_gen_callable",
    "item_seed",
    "iterate_async",
    "live_worker_pids",
    "loop_running",
    "new_stats",
]


def _kind(fn: Callable[[Any], Any], executor: str | Executor) -> str:
    if is_async_callable(fn):
        return "async"
    if isinstance(executor, Executor):
        return "executor"
    return executor


def window(concurrency: int) -> int:
    """How many items a thread, executor or async stage keeps pulled ahead of its consumer (running
    or queued for a worker), or chunks where its backend hands items over in chunks (a thread stage
    sizes them from ``fn``'s cost, an executor stage takes ``chunksize``); a process stage keeps as
    many chunks.

    ``2 * concurrency``: per worker, one item running and one queued, so a worker that finishes
    takes its next item at once instead of idling until the consumer's thread submits one; for an
    async stage, as many items queued on the loop's side as tasks run, enough to outlast the
    consumer's wait for the GIL. The measurements behind it are in docs/performance.rst ("Items in
    flight").
    """
    return 2 * concurrency


def new_stats(label: str, fn: Callable[[Any], Any], concurrency: int, executor: str | Executor,
              auto: bool = False) -> StageStats:
    """The statistics object of one pass of a concurrent map stage (``concurrency`` 0: inline)."""
    kind = "inline" if concurrency == 0 else _kind(fn, executor)
    return StageStats(label, kind, max(1, concurrency), window(max(1, concurrency)), auto)


def concurrent_map(source: Iterable[Any], fn: Callable[[Any], Any], spec: StageSpec,
                   sink: StageSink | None = None) -> Iterator[Any]:
    """Yield ``fn(x)`` for each item of ``source``, computed by ``spec.concurrency`` workers.

    Nothing starts before the first ``next()``. ``spec`` says what the stage is (workers, order,
    executor, timeout, chunks; with ``rng_kind``, process executor only, the items are ``(x, seed)``
    pairs and ``fn`` takes ``rng=``: the worker builds the generator, where threads and async get an
    ``fn`` that already does); ``sink`` where its pass reports (:class:`StageSink`: the error policy
    and log, statistics, the run a state reads, task hooks, the tuner's registration, the owner
    whose worker processes stay warm across its passes).
    """
    sink = sink if sink is not None else StageSink()
    label, concurrency, executor = spec.label, spec.concurrency, spec.executor
    ordered, chunksize, timeout, hooks, tune = spec.ordered, spec.chunksize, spec.timeout, sink.hooks, sink.tune
    policy, run = sink.policy, sink.run
    stats = sink.stats if sink.stats is not None else new_stats(label, fn, concurrency, executor)
    on_fail, count = failure_handler(label, policy, sink.log)
    run.attach_budget(on_fail)
    kind = _kind(fn, executor)
    if kind == "process":
        workers = ProcessWorkers(fn, concurrency, label, spec.rng_kind, sink.owner)
        if tune is not None:  # the tuner sets how many of the processes get chunks (resize); registered
            # once the pool has started, since its thread would make forking the workers unclean
            workers.started = lambda: tune(stats, run, workers)
        if hooks:
            return _process_hooked(source, workers, ordered, chunksize, on_fail, count, stats, run, hooks)
        return run_process_stage(workers, source, ordered, chunksize, on_fail, count, stats, run)
    if hooks and isinstance(executor, ProcessPoolExecutor):
        hooks = None  # fn travels to the user's processes by pickle: the hooks stay here, uncalled
    if hooks:
        fn = _hooked_fn(fn, stats, hooks, kind == "async")
    backend: Backend
    if kind == "async":
        backend = AsyncWorkers(fn, concurrency, label, timeout)
    elif kind == "executor":
        backend = ExecutorWorkers(fn, executor, label, chunksize, timeout)  # type: ignore[arg-type]
    elif concurrency == 0:
        backend = InlineWorkers(fn)
    else:
        backend = ThreadWorkers(fn, concurrency, label, timeout, chunksize, fail_fast=not policy.skips)
    if hooks:
        backend = _Positioned(backend)
    if tune is not None:
        tune(stats, run, backend)
    return run_stage(backend, source, window(max(1, concurrency)), on_fail, count, stats, run, ordered)


def _hooked_fn(fn: Callable[[Any], Any], stats: StageStats, hooks: Any, is_async: bool) -> Callable[[Any], Any]:
    """``fn`` taking ``(position, item)`` and calling the task hooks around ``fn(item)``."""
    starts, ends = hooks.starts, hooks.ends

    def began(i: int) -> None:
        for f in starts:
            f(stats, i)

    def ended(i: int, ok: bool) -> None:
        for g in ends:
            g(stats, i, ok)

    if is_async:
        async def call_async(job: tuple[int, Any]) -> Any:
            began(job[0])
            try:
                y = await fn(job[1])
            except BaseException:
                ended(job[0], False)
                raise
            ended(job[0], True)
            return y

        return call_async

    def call(job: tuple[int, Any]) -> Any:
        began(job[0])
        try:
            y = fn(job[1])
        except BaseException:
            ended(job[0], False)
            raise
        ended(job[0], True)
        return y

    return call


class _Positioned:
    """A backend whose ``fn`` receives ``(position, item)``: each job ``(i, x)`` is submitted as
    ``(i, (i, x))`` (the task hooks need the position)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.busy = inner.busy

    def start(self) -> None:
        inner = self.inner
        inner.start()
        put = inner.submit
        self.submit: Callable[[tuple[int, Any]], None] = lambda job: put((job[0], job))
        self.get = inner.get
        self.ready = inner.ready

    @property
    def chunk(self) -> int:
        return self.inner.chunk  # type: ignore[no-any-return]

    @property
    def records(self) -> Any:
        return self.inner.records

    def pulled(self, seconds: float, items: int) -> None:
        pulled = getattr(self.inner, "pulled", None)
        if pulled is not None:
            pulled(seconds, items)

    def resize(self, n: int) -> None:
        self.inner.resize(n)

    def close(self) -> None:
        self.inner.close()


def _process_hooked(source: Iterable[Any], workers: ProcessWorkers, ordered: bool, chunksize: int | None,
                    on_fail: Any, count: Any, stats: StageStats, run: EngineRun, hooks: Any) -> Iterator[Any]:
    """A process stage with task hooks, called on the consumer's thread: ``task_start`` when an item
    is handed to the pool, ``task_end`` when its result (or failure) comes back."""
    starts, ends = hooks.starts, hooks.ends
    started: dict[int, None] = {}
    failed: set[int] = set()

    def pulled() -> Iterator[Any]:
        k = run.resume[0][0] if run.resume else run.pulled
        for x in source:
            started[k] = None
            for f in starts:
                f(stats, k)
            k += 1
            yield x

    def failing(exc: BaseException, position: int) -> None:
        failed.add(position)
        started.pop(position, None)
        for g in ends:
            g(stats, position, False)
        on_fail(exc, position)

    inputs = run.inputs
    out = run_process_stage(workers, pulled(), ordered, chunksize, failing, count, stats, run)
    try:
        for y in out:
            for k in [k for k in started if k not in inputs]:
                del started[k]
                for g in ends:
                    g(stats, k, True)
            yield y
    finally:
        close_iterator(out)
