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

from concurrent.futures import Executor
from typing import Any, Callable, Iterable, Iterator

from ..errors import ErrorPolicy, FailureLog
from .aio import AsyncWorkers, LoopRef, is_async_callable, is_async_gen_callable, iterate_async, loop_running
from .background import BackgroundRun, background_iter
from .core import EngineRun, failure_handler, run_ordered, run_unordered
from .lifecycle import abandon, close_iterator
from .process import ProcessWorkers, live_worker_pids, run_process_stage
from .rng import RNG_KINDS, item_seed
from .stats import StageStats
from .threads import ExecutorWorkers, ThreadWorkers

__all__ = [
    "AsyncWorkers",
    "BackgroundRun",
    "EngineRun",
    "abandon",
    "ExecutorWorkers",
    "LoopRef",
    "ProcessWorkers",
    "RNG_KINDS",
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
    or queued for a worker); a process stage keeps as many chunks.

    Threads and executors: ``2 * concurrency``, one item running and one queued per worker, so a
    worker that finishes takes its next item at once instead of idling until the consumer's thread
    (busy batching, collating, opening the next file) submits one: with ``concurrency`` alone, 2
    decode threads kept 1.80 of 2 cores busy in benchmarks/end_to_end.py, with ``2 * concurrency``
    1.93-1.95 (+8-10% images/s). Async: ``concurrency`` tasks plus as many items queued on the loop's
    side, so a finished task is replaced at once on the loop thread. The loop thread holds the GIL
    while it runs callbacks, so the consumer's thread may wait up to the switch interval (5 ms) to
    take its results and submit more: the queue must outlast that wait. With ``concurrency // 4``
    queued, 256 tasks of ``asyncio.sleep(0.005)`` ran at 73-108% of plain asyncio's rate (the loop
    starved whenever the consumer waited for the GIL; 73% with a 20 ms switch interval); with
    ``concurrency`` queued, at 97-99% (99% with 20 ms).
    """
    return 2 * concurrency


def new_stats(label: str, fn: Callable[[Any], Any], concurrency: int, executor: str | Executor) -> StageStats:
    """The statistics object of one pass of a concurrent map stage."""
    kind = _kind(fn, executor)
    return StageStats(label, kind, concurrency, window(concurrency))


def concurrent_map(
    source: Iterable[Any],
    fn: Callable[[Any], Any],
    *,
    label: str,
    concurrency: int,
    ordered: bool = True,
    executor: str | Executor = "thread",
    timeout: float | None = None,
    chunksize: int | None = None,
    policy: ErrorPolicy | None = None,
    log: FailureLog | None = None,
    stats: StageStats | None = None,
    rng_kind: str | None = None,
    run: EngineRun | None = None,
) -> Iterator[Any]:
    """Yield ``fn(x)`` for each item of ``source``, computed by ``concurrency`` workers.

    Nothing starts before the first ``next()``. ``rng_kind`` (process executor only) means the items
    are ``(x, seed)`` pairs and ``fn`` takes ``rng=``: the worker builds the generator (threads and
    async get an ``fn`` that already does).
    """
    policy = policy if policy is not None else ErrorPolicy()
    log = log if log is not None else FailureLog()
    stats = stats if stats is not None else new_stats(label, fn, concurrency, executor)
    on_fail, count = failure_handler(label, policy, log)
    kind = _kind(fn, executor)
    if kind == "process":
        return run_process_stage(ProcessWorkers(fn, concurrency, label, rng_kind), source, ordered, chunksize,
                                 on_fail, count, stats, run)
    backend: Any
    if kind == "async":
        backend = AsyncWorkers(fn, concurrency, label, timeout)
    elif kind == "executor":
        backend = ExecutorWorkers(fn, executor, label)  # type: ignore[arg-type]
    else:
        backend = ThreadWorkers(fn, concurrency, label, timeout)
    loop = run_ordered if ordered else run_unordered
    return loop(backend, source, window(concurrency), on_fail, count, stats, run)
