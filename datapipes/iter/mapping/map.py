"""Mapper [map]: ``fn`` applied to every item, serially on the consumer's thread or concurrently on
the engine (:mod:`datapipes._engine`: threads, processes, an ``Executor`` or the event loop), with a
CUDA stream hand-over each way downstream of ``to_cuda`` (:mod:`.handover`); and torchdata's
concurrent maps under their own names and parameters, each a concurrent Mapper: ThreadPoolMapper
[threadpool_map] and BatchAsyncMapper [async_map_batches] (they follow torchdata 0.9; the
differences are listed in each docstring).

The form of a pass is chosen once at construction: the serial forms, bare generators with no
per-item branching on options, are in :mod:`.map_serial`; the concurrent forms, which run on the
engine, in :mod:`.map_concurrent`. This module holds the pipes and their arguments.

Checkpoint and resume (docs/howto/checkpoint.rst): a serial map keeps nothing of its own (its position
is its source's), except with ``rng=`` the pass seed and the item's position, and under a failure
budget the failures counted: its loop then writes the item's position to the pass's run before each
``yield`` (one store per item), and the run holds the pass seed and the pass's failures. A concurrent
map's pass (``threadpool_map`` and ``async_map_batches`` included) keeps the items in flight.
"""

from __future__ import annotations

import inspect
from typing import Any, Awaitable, Callable, Coroutine, Iterator, Literal, TypeVar, overload

from ..._checks import phrased, require_bool
from ..._engine import is_async_callable, is_async_gen_callable
from ..._runtime.passes import Pass
from ..._runtime.tuning import usable_cpus
from ...datapipe import IterDataPipe, functional_datapipe, require_callable, require_int, require_pipe, source_len
from ...errors import WARN_FAILURES, _OnError, policy_and_log
from .handover import _check_crossing
from ._shared import _Col, _Executor, _Rng, _check_cols, _check_concurrency, check_arity
from .map_concurrent import open_engine, open_flattening, open_handover
from .map_serial import open_raising, open_seeded, open_skipping

__all__ = ["BatchAsyncMapper", "Mapper", "ThreadPoolMapper"]

T = TypeVar("T")
U = TypeVar("U")


# -- Mapper ----------------------------------------------------------------------------------------


@functional_datapipe("map")
class Mapper(IterDataPipe[U]):
    """Apply ``fn`` to every item (functional name: ``map``), serially or concurrently.

    Args:
        datapipe: the source pipe.
        fn: the function, called once per item. With ``concurrency=1`` (the default) it runs on the
            consumer's thread; otherwise on the workers of ``executor``. An ``async def fn`` (or an
            object whose ``__call__`` is async) always runs as tasks on the engine's event-loop
            thread, shared by every async stage that is running.
        input_col: apply ``fn`` to this column (index or key) of each tuple/list/dict item, or to
            several columns as positional arguments. ``None``: to the whole item.
        output_col: where the result goes: ``None`` replaces the input column (several input
            columns collapse into the first), ``-1`` appends, any other index or key is written.
            Input items are never mutated; a changed copy is yielded.
        on_error: ``"raise"`` (default) or ``"skip"``, see :mod:`datapipes.errors`.
        max_failures: with ``on_error="skip"``, failures tolerated per pass: a number, or a float
            between 0 and 1 for a share of the items (``None``: any).
        warn_failures: with ``on_error="skip"``, past how many failures (a number, or a share:
            10% by default) a pass warns once (``None``: never); see :mod:`datapipes.errors`.
        concurrency: how many items ``fn`` works on at once (threads, tasks or processes). ``1`` with
            a plain ``fn``, no ``timeout``, no ``rng`` and ``executor="thread"`` is the serial loop.
            ``"auto"``: tuned online while the pass runs, within the pass's thread budget (see
            :meth:`~datapipes.iter.IterDataPipe.set_budget`); the value chosen, and why, are in the
            pass's statistics (``workers``, ``tuning``); a thread stage starts at one worker per
            usable CPU, at most 16, and takes at most ``min(128, max(32, 4 x CPUs))`` without a
            budget. With ``executor="process"``, ``"auto"`` starts one process per usable CPU, at
            most 32 (``min(CPUs, 32)``) and the pass's ``max_processes``, and is tuned within them.
            A thread stage's workers count against the pass's budget: beyond it the stage gets
            fewer (with none left, ``fn`` runs on the consumer's thread).
            A generator function run with ``concurrency`` above 1, or any async generator function,
            yields the items it generates, as :class:`FlatMapper` does (SPDL's ``pipe()``); serially
            a generator function's result is the generator object, as in torch.
        ordered: ``True`` yields in source order; ``False`` in completion order (no head-of-line
            blocking). Both yield the same items.
        executor: ``"thread"`` (daemon threads owned by the pass), ``"process"`` (worker processes for
            Python code that holds the GIL: ``fn`` and the items must pickle, lambdas included through
            cloudpickle; items travel in chunks) or a ``concurrent.futures.Executor`` you built (it is
            used, never shut down). With ``executor="process"`` the worker processes start at the
            first ``next()`` of the first pass and stay warm for the pipe's next passes (epochs);
            they stop when the pipe is garbage-collected, after 60 s unused, or at exit. A failing
            pass stops them. On Linux they are forked from this process where that is clean (no
            other thread running), so ``fn`` finds every module already imported; from 6 workers up
            a short-lived *zygote* process forks them while the first ones already work
            (``DATAPIPES_PROCESS_START=fork`` forks each from this process). Otherwise, or with
            ``DATAPIPES_PROCESS_START=spawn`` in the environment, they are fresh interpreters.
            Arrays and CPU tensors in the results come back through shared memory, not copied
            through a pipe (docs/architecture.rst, "Process stages").
        timeout: seconds one item may spend in ``fn`` (threads, async, an ``Executor``). An item past it fails
            with a ``TimeoutError`` naming the stage and its position; its worker thread is abandoned
            (a daemon: it ends when ``fn`` returns and never blocks interpreter exit). An async
            ``fn`` is cancelled at the deadline; one that ignores the cancellation (a catch-all
            ``except`` that retries) is abandoned a grace later (a quarter of ``timeout``, 0.05 to
            1 s), and one that blocks the event loop (``time.sleep``, blocking I/O) fails with a
            ``TimeoutError`` that says so, while later passes get a new loop; a late result is
            dropped, never delivered. With an ``Executor``, the time counts from the task's
            submission (its wait in the executor's queue included) and a late task is cancelled
            where it has not started: a stage whose tasks cannot be scheduled fails instead of
            hanging.
        chunksize: items a worker takes at once. On threads, ``None`` picks it from the measured
            cost of ``fn`` (about 1 ms of work per chunk, at most 64 items, one item where ``fn``
            takes a millisecond or more or the item holds 4 MiB or more); ``1`` hands items over
            one by one (a ``timeout`` always does). With ``executor="process"``, items per message;
            ``None`` picks it from the measured cost of ``fn`` (about 10 ms of work per chunk,
            ``N / 400`` seconds from five workers up). With an ``Executor``, items per task
            (``None``: one): one ``submit`` runs ``fn`` on up to ``chunksize`` items, for executors
            whose cost per task outweighs a cheap ``fn``; order, completion order, failure budgets
            and resume are the same, item by item.
        rng: ``None``, or ``"python"``, ``"numpy"``, ``"torch"``: ``fn`` is called as
            ``fn(item, rng=generator)`` with a ``random.Random`` / ``numpy.random.Generator`` /
            ``torch.Generator`` seeded from the pass seed (:meth:`set_seed`, :meth:`set_epoch`, or a
            fresh draw from torch's global generator) and the item's position, so random
            augmentations do not depend on which worker ran the item.

    Yields:
        ``fn(item)`` for each item, in source order (or completion order with ``ordered=False``).

    Raises:
        Whatever ``fn`` raises, as the same object, with a note naming the stage and the item's
            position (fail fast: the first failure in output order; in-flight work is cancelled); an
            ``ExceptionGroup`` once ``max_failures`` is exceeded; ``TimeoutError`` past ``timeout``. With
            ``executor="process"`` the exception is a pickled copy carrying the worker's traceback as a
            note.
        ValueError: at construction, ``executor="process"`` (or a ``ProcessPoolExecutor``) downstream
            of ``to_cuda``: CUDA tensors are not sent to worker processes.

    Concurrency: the consumer's thread pulls the source lazily and keeps at most ``2 * concurrency``
    items in flight (one running and one queued per worker; async: ``concurrency`` running tasks
    and as many items queued on the loop): when the consumer holds the item at position ``k``, at
    most ``k + 1 + 2 * concurrency`` items have been pulled (processes: ``2 * concurrency`` chunks
    plus the chunk being yielded). Workers start at the first ``next()`` and stop when the pass ends, is closed
    (``close()``, ``break``), is garbage collected, or the consumer raises or is interrupted. The
    statistics of the most recent pass are in ``pipe.stats`` (:class:`~datapipes._engine.StageStats`), each
    pass's own in ``it.stats()`` of its iterator.

    After ``to_cuda`` (a CUDA mover upstream, found when the pipe is built), a concurrent map hands
    each item over safely in both directions: an event recorded on the consumer's current stream is
    waited on by the worker's (or event loop's) current stream before ``fn`` runs, and an event
    recorded after ``fn`` is waited on by the consumer's current stream before the result is
    yielded; each receiving stream marks the item's CUDA tensors as used (``record_stream``). With
    ``executor="process"`` (or a ``ProcessPoolExecutor``) such a map raises ``ValueError`` when it
    is built.

    ``len()`` is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([1, 2, 3]).map(lambda x: x * 2))
        [2, 4, 6]
        >>> list(IterableWrapper([(1, "a"), (2, "b")]).map(str.upper, input_col=1))
        [(1, 'A'), (2, 'B')]
        >>> list(IterableWrapper(range(5)).map(lambda x: x * x, concurrency=4))
        [0, 1, 4, 9, 16]

    See also: :class:`FlatMapper` for one-to-many functions, :class:`Filter`,
    :class:`~datapipes.iter.Prefetcher`.
    """

    _saves: str | dict[str, str] = {  # subclasses declare a string
        "``map``": "nothing: at a boundary their position is their source's",
        "``map(fn, rng=...)`` (serial)": "the pass seed and the next item's position (two ints)",
        "``map(concurrency=N)`` (threads, async, executors, processes)": "same as threadpool_map",
    }

    _repr_fields = ("fn",)

    @overload
    def __init__(
        self: Mapper[U],
        datapipe: IterDataPipe[T],
        fn: Callable[[T], Coroutine[Any, Any, U]],
        input_col: None = ...,
        output_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal['auto'] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
        timeout: float | None = ...,
        chunksize: int | None = ...,
        rng: None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: Mapper[U],
        datapipe: IterDataPipe[T],
        fn: Callable[[T], U],
        input_col: None = ...,
        output_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal['auto'] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
        timeout: float | None = ...,
        chunksize: int | None = ...,
        rng: None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: Mapper[U],
        datapipe: IterDataPipe[T],
        fn: Callable[..., Coroutine[Any, Any, U]],
        input_col: None = ...,
        output_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal['auto'] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
        timeout: float | None = ...,
        chunksize: int | None = ...,
        rng: _Rng,
    ) -> None: ...
    @overload
    def __init__(
        self: Mapper[U],
        datapipe: IterDataPipe[T],
        fn: Callable[..., U],
        input_col: None = ...,
        output_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal['auto'] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
        timeout: float | None = ...,
        chunksize: int | None = ...,
        rng: _Rng,
    ) -> None: ...
    @overload
    def __init__(
        self: Mapper[Any],
        datapipe: IterDataPipe[T],
        fn: Callable[..., Any],
        input_col: _Col,
        output_col: _Col | None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal['auto'] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
        timeout: float | None = ...,
        chunksize: int | None = ...,
        rng: _Rng | None = ...,
    ) -> None: ...
    def __init__(
        self,
        datapipe: IterDataPipe[T],
        fn: Callable[..., Any],
        input_col: _Col = None,
        output_col: _Col = None,
        *,
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        concurrency: int | Literal["auto"] = 1,
        ordered: bool = True,
        executor: _Executor = "thread",
        timeout: float | None = None,
        chunksize: int | None = None,
        rng: _Rng | None = None,
    ) -> None:
        require_pipe(datapipe, "Mapper")
        require_callable(fn, "Mapper", "fn")
        _check_cols(input_col, output_col, "Mapper")
        check_arity(fn, input_col, "Mapper", ("rng",) if rng is not None else ())
        _check_concurrency("Mapper", fn, concurrency, ordered, executor, timeout, chunksize, rng)
        self.datapipe = datapipe
        self.fn = fn
        self.input_col = input_col
        self.output_col = output_col
        self.concurrency = concurrency
        self.ordered = ordered
        self.executor = executor
        self.timeout = timeout
        self.chunksize = chunksize
        self.rng = rng
        self._async = is_async_callable(fn) or is_async_gen_callable(fn)
        # SPDL's pipe(): a generator function run concurrently (or any async generator function)
        # yields the items it generates; serial, a generator function's result is the generator.
        self._flattens = is_async_gen_callable(fn) or (concurrency != 1 and inspect.isgeneratorfunction(fn))
        if self._flattens and (input_col is not None or rng is not None or timeout is not None):
            raise ValueError("Mapper: a generator function run concurrently yields its items, as flatmap does; "
                             "input_col, rng and timeout are not supported with it (use flatmap with input_col)")
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures)
        if rng is not None:
            self._is_random = True
        serial = concurrency == 1 and timeout is None and not self._async and executor == "thread"
        # Items that cross threads after to_cuda need a stream hand-over, decided here once.
        self._crossing_ops = None if serial else _check_crossing(datapipe, executor)
        # The form of every pass, chosen once (map_serial.py, map_concurrent.py). Serial: nothing of
        # its own to save (a pass's position is its source's), but with rng= the pass seed and the item
        # position. Concurrent: the pass tracks the items in flight (threads, async, executors and
        # processes alike).
        self._stateless = serial and rng is None
        self._run: Callable[[Mapper[Any], Pass, Iterator[Any]], Iterator[Any]]
        if self._flattens:
            self._run = open_flattening
        elif not serial:
            self._run = open_engine if self._crossing_ops is None else open_handover
        elif rng is not None:
            self._run = open_seeded
        else:
            self._run = open_skipping if self._policy.skips else open_raising

    def _thread_demand(self) -> int | str | None:
        """What a pass's thread budget counts for this stage: its concurrency when it runs worker
        threads of its own, else None."""
        if self._run in _SERIAL or self._async or self.executor != "thread":
            return None
        return self.concurrency

    def _open(self, ctx: Pass) -> Iterator[U]:
        return self._run(self, ctx, ctx.open(self.datapipe))

    def __len__(self) -> int:
        return source_len(self, self.datapipe)


#: the serial forms: no worker threads of their own
_SERIAL = (open_raising, open_skipping, open_seeded)


# -- ThreadPoolMapper ------------------------------------------------------------------------------

#: the ``threadpool_kwargs`` accepted: ThreadPoolExecutor's naming of its threads (the engine names
#: its own: ``datapipes ThreadPoolMapper(fn) worker k``)
_THREADPOOL_KWARGS = frozenset({"thread_name_prefix"})


def _default_workers() -> int:
    """``ThreadPoolExecutor``'s default number of threads (Python 3.13's, which counts the CPUs this
    process may use): ``min(32, CPUs + 4)``, 6 on 2 CPUs, 20 on 16, 32 from 28 on."""
    return min(32, usable_cpus() + 4)


@functional_datapipe("threadpool_map")
class ThreadPoolMapper(Mapper[U]):
    """Apply ``fn`` to every item on a pool of worker threads, yielding in source order
    (functional name: ``threadpool_map``).

    This is a concurrent :class:`~datapipes.iter.Mapper` (``concurrency=min(max_workers,
    scheduled_tasks)``, ``ordered=True``) under torchdata's name and parameters: it runs on the
    package's engine, which owns the threads of each pass, bounds the items in flight and passes
    ``fn``'s exceptions through unchanged.

    Args:
        source_datapipe: the source pipe.
        fn: the function, called once per item on a worker thread (on the consumer's thread when
            only one worker is allowed).
        input_col: apply ``fn`` to this column (or these columns) of each item, as in ``map``.
        output_col: where the result goes, as in ``map``: ``None`` replaces the input column,
            ``-1`` appends. Input items are not mutated (torchdata writes into list and dict items).
        scheduled_tasks: the most items scheduled at once, at least 1 (default 128). The engine
            keeps at most ``2 * min(max_workers, scheduled_tasks)`` items in flight (one running,
            one queued per worker) rather than ``scheduled_tasks``: the first item comes sooner
            and the memory bound is tighter; the output is the same.
        max_workers: the number of threads, at least 1; ``None``: ``ThreadPoolExecutor``'s default,
            ``min(32, CPUs + 4)`` with the CPUs this process may use (6 on 2 CPUs, 20 on 16, 32 on
            128), read when the pipe is built.
        threadpool_kwargs: ``thread_name_prefix`` is accepted and not applied (the engine names
            its threads after the stage). ``initializer``/``initargs`` are refused: the worker
            threads are the engine's; do per-thread set-up inside ``fn`` (a ``threading.local``).

    Yields:
        ``fn(item)`` for each item (or the item with ``fn``'s result in ``output_col``), in source
        order.

    Raises:
        Whatever ``fn`` raises, as the same object, with a note naming the stage and the item's
        position; the rest of the work in flight is cancelled.
        TypeError: at construction, an unsupported ``threadpool_kwargs`` name.

    ``len()`` is the source's length.

    Checkpoint: as a concurrent ``map``, a pass's state holds the items in flight.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(5)).threadpool_map(lambda x: x * 10, max_workers=4))
        [0, 10, 20, 30, 40]
        >>> list(IterableWrapper([(i, i) for i in range(3)]).threadpool_map(lambda x: x * 10, input_col=1, output_col=-1))
        [(0, 0, 0), (1, 1, 10), (2, 2, 20)]

    See also: :class:`~datapipes.iter.Mapper` (``concurrency=``, ``ordered=False``, ``on_error``,
    ``timeout`` ...), :class:`~datapipes.iter.Prefetcher`.
    """

    _saves = (
        "the inputs in flight (threads: at most ``2 * concurrency`` chunks, one item each where ``fn`` takes a "
        "millisecond or more; processes: the chunks in flight), "
        "the count pulled, the pass seed"
    )

    @overload
    def __init__(
        self: IterDataPipe[U],
        source_datapipe: IterDataPipe[T],
        fn: Callable[[T], U],
        input_col: None = ...,
        output_col: None = ...,
        scheduled_tasks: int = ...,
        max_workers: int | None = ...,
        **threadpool_kwargs: Any,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[Any],
        source_datapipe: IterDataPipe[T],
        fn: Callable[..., Any],
        input_col: _Col | None = ...,
        output_col: _Col | None = ...,
        scheduled_tasks: int = ...,
        max_workers: int | None = ...,
        **threadpool_kwargs: Any,
    ) -> None: ...
    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        fn: Callable[..., U],
        input_col: _Col = None,
        output_col: _Col = None,
        scheduled_tasks: int = 128,
        max_workers: int | None = None,
        **threadpool_kwargs: Any,
    ) -> None:
        stage = "ThreadPoolMapper"
        require_pipe(source_datapipe, stage, "source_datapipe")
        require_callable(fn, stage, "fn")
        require_int(scheduled_tasks, stage, "scheduled_tasks")
        if scheduled_tasks <= 0:
            raise ValueError(phrased(stage, "'scheduled_tasks' is required to be a positive integer.",
                                     scheduled_tasks=scheduled_tasks))
        require_int(max_workers, stage, "max_workers", optional=True)
        if max_workers is not None and max_workers <= 0:
            raise ValueError(phrased(stage, "'max_workers' is required to be a positive integer.",
                                     max_workers=max_workers))
        refused = sorted(set(threadpool_kwargs) - _THREADPOOL_KWARGS)
        if refused:
            raise TypeError(f"{stage}: threadpool_kwargs {refused} are not supported: fn runs on the engine's worker "
                            "threads, which take no initializer; do per-thread set-up inside fn")
        _check_cols(input_col, output_col, stage)
        check_arity(fn, input_col, stage)
        workers = _default_workers() if max_workers is None else max_workers
        super().__init__(source_datapipe, fn, input_col, output_col, concurrency=min(workers, scheduled_tasks))
        self.scheduled_tasks = scheduled_tasks
        self.max_workers = max_workers
        self.threadpool_kwargs = dict(threadpool_kwargs)


# -- BatchAsyncMapper ------------------------------------------------------------------------------


class _NotCoroutine(TypeError, ValueError):
    """``async_map_batches`` given a plain function: a ``TypeError`` (the wrong kind of function)
    that is also the ``ValueError`` torchdata raises there."""


@functional_datapipe("async_map_batches")
class BatchAsyncMapper(Mapper[U]):
    """Apply a coroutine function to every item, up to ``max_concurrency`` at once on the engine's
    event loop, yielding in source order (functional name: ``async_map_batches``).

    torchdata's ``async_map_batches`` gathers ``batch_size`` items, awaits ``async_fn`` on all of
    them together (at most ``max_concurrency`` at a time), then moves to the next batch. Here it is
    a concurrent :class:`~datapipes.iter.Mapper` with ``concurrency=min(batch_size,
    max_concurrency)`` and ``ordered=True``: the same items in the same order, without the wait at
    every batch boundary (a slow item no longer holds back the start of the next batch).

    Args:
        source_datapipe: the source pipe.
        async_fn: an ``async def`` function (or an object whose ``__call__`` is one), awaited once
            per item on the engine's event-loop thread.
        batch_size: the items torchdata awaits together, at least 1; with ``flatten=False`` the
            size of the batches yielded.
        input_col: apply ``async_fn`` to this column (or these columns) of each item, as in ``map``.
        output_col: where the result goes, as in ``map``: ``None`` replaces the input column,
            ``-1`` appends. Input items are not mutated.
        max_concurrency: the most calls awaited at once, at least 1 (default 32).
        flatten: ``True`` (default) yields the results one by one; ``False`` yields them in
            batches of ``batch_size`` (:class:`~datapipes.DataChunk`), as torchdata does; the pipe
            is then ``Batcher(BatchAsyncMapper(...), batch_size)``.

    Yields:
        ``await async_fn(item)`` for each item (or the item with the result in ``output_col``), in
        source order; with ``flatten=False``, lists of them.

    Raises:
        TypeError: ``async_fn`` is not a coroutine function (also a ``ValueError``, as torchdata's,
            with its words: "Expected a corotine function ..."); bad ``batch_size``/``max_concurrency``.
        Whatever ``async_fn`` raises, as the same object, with a note naming the stage and the
        item's position; the calls in flight are cancelled.

    ``len()`` is the source's length (with ``flatten=False``, the number of batches).

    Checkpoint: as a concurrent ``map``, a pass's state holds the items in flight.

    Example:
        >>> import asyncio
        >>> from datapipes.iter import IterableWrapper
        >>> async def times_ten(x):
        ...     await asyncio.sleep(0.001)
        ...     return x * 10
        >>> list(IterableWrapper(range(5)).async_map_batches(times_ten, batch_size=2))
        [0, 10, 20, 30, 40]
        >>> list(IterableWrapper(range(5)).async_map_batches(times_ten, 2, flatten=False))
        [[0, 10], [20, 30], [40]]

    See also: :class:`~datapipes.iter.Mapper` with an ``async def fn`` and ``concurrency=``, which
    this is; ``ordered=False`` there yields in completion order.
    """

    _saves = "same as threadpool_map"

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # flatten=False: the flat stage batched again (torchdata's batches, in the same order).
        # Without arguments (unpickling) a bare instance, as for every pipe.
        flatten = kwargs.get("flatten", args[6] if len(args) > 6 else True)
        if (args or kwargs) and flatten is False:
            flat = dict(kwargs, flatten=True)
            pipe = cls(*args[:6], **flat)
            return pipe.batch(pipe.batch_size)
        return super().__new__(cls)

    @overload
    def __init__(
        self: IterDataPipe[U],
        source_datapipe: IterDataPipe[T],
        async_fn: Callable[[T], Awaitable[U]],
        batch_size: int,
        input_col: None = ...,
        output_col: None = ...,
        max_concurrency: int = ...,
        flatten: Literal[True] = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[Any],
        source_datapipe: IterDataPipe[T],
        async_fn: Callable[..., Awaitable[Any]],
        batch_size: int,
        input_col: _Col | None = ...,
        output_col: _Col | None = ...,
        max_concurrency: int = ...,
        flatten: bool = ...,
    ) -> None: ...
    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        async_fn: Callable[..., Any],
        batch_size: int,
        input_col: _Col = None,
        output_col: _Col = None,
        max_concurrency: int = 32,
        flatten: bool = True,
    ) -> None:
        stage = "BatchAsyncMapper"
        require_pipe(source_datapipe, stage, "source_datapipe")
        require_callable(async_fn, stage, "async_fn")
        if not is_async_callable(async_fn):
            raise _NotCoroutine(f"{stage}: Expected a corotine function with an async def syntax, but got a "
                               f"{type(async_fn)} (use map(fn, concurrency=n) or threadpool_map for a plain "
                               "function)")
        require_int(batch_size, stage, "batch_size", minimum=1)
        require_int(max_concurrency, stage, "max_concurrency", minimum=1)
        require_bool(flatten, stage, "flatten", ints=True)
        _check_cols(input_col, output_col, stage)
        check_arity(async_fn, input_col, stage)
        super().__init__(source_datapipe, async_fn, input_col, output_col, concurrency=min(batch_size, max_concurrency))
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency
        # kept as torchdata names it; on the instance it shadows the functional ``flatten`` (a bool here)


# What inspect (help(), IDEs, the stub check) shows: __init__'s parameters, not __new__'s *args.
BatchAsyncMapper.__signature__ = inspect.signature(BatchAsyncMapper.__init__).replace(  # type: ignore[attr-defined]
    parameters=list(inspect.signature(BatchAsyncMapper.__init__).parameters.values())[1:]
)
