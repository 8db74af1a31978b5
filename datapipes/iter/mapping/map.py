"""Mapper [map]: ``fn`` applied to every item, serially on the consumer's thread or concurrently on
the engine (:mod:`datapipes._engine`: threads, processes, an ``Executor`` or the event loop), with a
CUDA stream hand-over each way downstream of ``to_cuda`` (:mod:`.handover`); and torchdata's
concurrent maps under their own names and parameters, each a concurrent Mapper: ThreadPoolMapper
[threadpool_map] and BatchAsyncMapper [async_map_batches] (they follow torchdata 0.9; the
differences are listed in each docstring).

The serial loops are bare generators chosen once at construction: no per-item branching on options.

Checkpoint and resume (docs/howto/checkpoint.rst): a serial map keeps nothing of its own (its position
is its source's), except with ``rng=`` the pass seed and the item's position, and under a failure
budget the failures counted: its loop then writes the item's position to the pass's run before each
``yield`` (one store per item), and the run holds the pass seed and the pass's failures. A concurrent
map's pass (``threadpool_map`` and ``async_map_batches`` included) keeps the items in flight.
"""

from __future__ import annotations

import inspect
from typing import Any, Awaitable, Callable, Coroutine, Iterable, Iterator, Literal, TypeVar, cast, overload

from ..._runtime import passes as _pass
from ..._runtime.validate import check_engine, check_int, check_loop_state
from ..._checks import phrased, require_bool
from ..._engine import EngineRun, StageSpec, abandon, concurrent_map, is_async_callable, is_async_gen_callable, new_stats
from ..._engine.rng import item_seed, make_rng, seeded_call, with_seeds
from ..._runtime.tuning import usable_cpus
from ...datapipe import IterDataPipe, functional_datapipe, require_callable, require_int, require_pipe, source_len, stage_label
from ...errors import WARN_FAILURES, _OnError, call_lines, policy_and_log
from .handover import _check_crossing, _handed_back, _handover_fn, _tagged
from ._shared import (
    _Col,
    _Executor,
    _Rng,
    _async_column_fn,
    _budget_start,
    _BudgetRun,
    _check_cols,
    _check_concurrency,
    _column_rng_fn,
    _end_pass,
    _item_fail,
    _item_fn,
    _LoopRun,
    _stage_concurrency,
    stage_sink,
    check_arity,
    one_to_one,
    serial_failed,
    taken_reader,
)
from .flatmap import _flat_engine, _listing_fn

__all__ = ["BatchAsyncMapper", "Mapper", "ThreadPoolMapper"]

T = TypeVar("T")
U = TypeVar("U")


# -- Mapper ----------------------------------------------------------------------------------------


def _map_raise(pipe: Mapper, it: Iterator[Any]) -> Iterator[Any]:
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


def _map_told(pipe: Mapper, it: Iterator[Any], taken: Callable[[], int]) -> Iterator[Any]:
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


def _map_skip(pipe: Mapper, it: Iterator[Any], run: _BudgetRun) -> Iterator[Any]:
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


def _map_seeded(pipe: Mapper, it: Iterator[Any], run: _SeededRun) -> Iterator[Any]:
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


def _engine_fn(pipe: Mapper) -> Callable[[Any], Any]:
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


def _map_engine(pipe: Mapper, it: Iterator[Any], seed: int | None = None) -> Iterator[Any]:
    label = stage_label(pipe)
    run = _MapRun(seed)
    _pass.track(pipe, run)
    source: Iterable[Any] = it if seed is None else _seeded(it, run)
    fn = _engine_fn(pipe)
    worker_rng = pipe.rng if pipe.executor == "process" and pipe.input_col is None else None
    concurrency, tune = _stage_concurrency(pipe)
    stats = _pass.stats_for(pipe, lambda: new_stats(label, fn, concurrency, pipe.executor, tune is not None))
    spec = StageSpec(label, concurrency, pipe.ordered, pipe.executor, pipe.timeout, pipe.chunksize, worker_rng)
    return concurrent_map(source, fn, spec, stage_sink(pipe, stats, run.engine, tune))


def _seeded(it: Iterator[Any], run: _MapRun) -> Iterator[tuple[Any, int]]:
    """``(item, its seed)`` pairs: seeds from the run's pass seed and positions, both read at the
    first ``next()`` (a resumed pass has restored them by then)."""
    yield from with_seeds(it, run.seed, lambda: run.engine.pulled)  # type: ignore[arg-type]


def _map_engine_handover(pipe: Mapper, it: Iterator[Any], seed: int | None = None) -> Iterator[Any]:
    """A concurrent pass downstream of a CUDA mover: items cross to the workers and results come
    back with a stream hand-over each way (:mod:`datapipes.iter.device`)."""
    ops = pipe._crossing_ops.bind()  # type: ignore[union-attr]
    label = stage_label(pipe)
    run = _MapRun(seed)
    _pass.track(pipe, run)
    source: Iterable[Any] = it if seed is None else _seeded(it, run)
    fn = _handover_fn(_engine_fn(pipe), ops, pipe._async)
    concurrency, tune = _stage_concurrency(pipe)
    stats = _pass.stats_for(pipe, lambda: new_stats(label, fn, concurrency, pipe.executor, tune is not None))
    spec = StageSpec(label, concurrency, pipe.ordered, pipe.executor, pipe.timeout, pipe.chunksize)
    out = concurrent_map(_tagged(source, ops.record), fn, spec, stage_sink(pipe, stats, run.engine, tune))
    return _handed_back(out, ops)


_MAP_FN_LINES = call_lines(_map_raise)
_MAP_TOLD_FN_LINES = call_lines(_map_told)


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
        self._run: Callable[..., Iterator[Any]]
        # Serial: nothing of its own to save (a pass's position is its source's), but with rng= the
        # pass seed and the item position. Concurrent: the pass tracks the items in flight (threads,
        # async, executors and processes alike).
        self._stateless = serial and rng is None
        if not serial:
            self._run = _map_engine if self._crossing_ops is None else _map_engine_handover
        elif rng is not None:
            self._run = _map_seeded
        else:
            self._run = _map_skip if self._policy.skips else _map_raise

    def _thread_demand(self) -> int | str | None:
        """What a pass's thread budget counts for this stage: its concurrency when it runs worker
        threads of its own, else None."""
        if self._stateless or self.rng is not None and self._run is _map_seeded:
            return None  # serial
        if self._async or self.executor != "thread":
            return None
        return self.concurrency

    def __iter__(self) -> Iterator[U]:
        it = iter(self.datapipe)
        if self._flattens:
            return _flat_engine(self, it, _listing_fn(self.fn, None))
        if self.rng is not None:
            if self._run is _map_seeded:  # serial: its run saves the pass seed and the position
                seeded = _SeededRun(self._pass_seed())
                _pass.track(self, seeded)
                return _map_seeded(self, it, seeded)
            return self._run(self, it, self._pass_seed())
        if self._run is _map_skip:
            run = _BudgetRun()
            if self._policy.max_failures is not None:  # a budget: its count is saved
                _pass.track(self, run)
            return _map_skip(self, it, run)
        if self._run is _map_raise:
            taken = taken_reader(it)
            if taken is not None:
                return one_to_one(_map_told(self, it, taken), taken)
        return self._run(self, it)

    def __len__(self) -> int:
        return source_len(self, self.datapipe)


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
