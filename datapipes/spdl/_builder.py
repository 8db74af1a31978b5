"""SPDL's :class:`PipelineBuilder`: records the stages, and :meth:`~PipelineBuilder.build` turns them
into an ordinary pipe wrapped in a :class:`~datapipes.spdl.Pipeline`.

Each SPDL stage becomes the pipes that behave as it does:

========================================  ==============================================================
SPDL                                      the pipe built
========================================  ==============================================================
``add_source(src)``                       ``IterableWrapper(src, deepcopy=False)``
``pipe(fn, concurrency=c)``               ``map(fn, concurrency=c, ordered=..., on_error="skip")`` and
                                          ``filter(not_none)`` (SPDL drops ``None`` results)
``pipe(gen_fn)`` (sync or async)          ``flatmap(gen_fn, on_error="skip")``; with ``concurrency > 1``
                                          or an executor, a concurrent ``map`` gathering each item's
                                          outputs, then a ``flatmap`` yielding them
``aggregate(n, drop_last=...)``           ``batch(n, drop_last=..., wrapper_class=list)``
``aggregate(aggregator)``                 a stage calling ``accumulate``/``flush``
``disaggregate()``                        ``unbatch()`` and ``filter(not_none)``
``add_sink(buffer_size)``                 ``prefetch(buffer_size)``
``build(num_threads=n)``                  ``set_budget(max_threads=n)`` on the pipe
``build(report_stats_interval=s)``        ``add_hook(StatsReporter(s))``
========================================  ==============================================================

A failing call of ``fn`` is logged (``datapipes.spdl`` logger, ERROR, with the traceback) and its item
dropped, as SPDL does; past ``max_failures`` the pass fails with :class:`PipelineFailure`.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
from concurrent.futures import Executor
from fractions import Fraction
from typing import Any, AsyncIterable, Callable, Generic, Iterable, Iterator, NamedTuple, TypeVar

from .._runtime.passes import Pass
from .._runtime.validate import check_loop_state
from .._engine import abandon, close_iterator, is_async_callable, is_async_gen_callable
from .._engine.lifecycle import Resumable
from ..datapipe import IterDataPipe
from ..errors import Failure, FailureLog, add_stage_note
from ..graph import stage_label
from ..hooks import StatsReporter
from ..iter import IterableWrapper
from ._pipeline import Pipeline

__all__ = ["Aggregator", "PipelineBuilder"]

T = TypeVar("T")
U = TypeVar("U")

_LG = logging.getLogger("datapipes.spdl")


def not_none(item: Any) -> bool:
    """The filter after each ``pipe()`` stage: SPDL passes on no ``None`` result."""
    return item is not None


def _is_gen_callable(fn: Any) -> bool:
    return inspect.isgeneratorfunction(fn) or inspect.isgeneratorfunction(getattr(fn, "__call__", None))


def _op_name(op: Any) -> str:
    """SPDL's name for ``op``: the function's ``__name__`` (through partials), else its class's."""
    if isinstance(op, functools.partial):
        return _op_name(op.func)
    return getattr(op, "__name__", None) or type(op).__name__


# -- failures: logged, as SPDL logs every failed task ---------------------------------------------


class LoggedFailures(FailureLog):
    """The failure log of a ``pipe()`` stage (``pipe.failures``): besides counting each failure the
    stage skips, it logs it to the ``datapipes.spdl`` logger at ERROR with its traceback, on the
    consumer's thread (so failures in worker processes reach this process's handlers too)."""

    __slots__ = ("task",)

    def __init__(self, task: str = "") -> None:
        super().__init__()
        self.task = task

    def record(self, failure: Failure) -> None:
        super().record(failure)
        _LG.error("Task [%s] failed.", self.task, exc_info=failure.exception)

    def __reduce__(self) -> Any:  # a pickled pipe starts with an empty log, named as this one
        return (LoggedFailures, (self.task,))


def _skipping(stage: Any, task: str) -> Any:
    """``stage`` (built with ``on_error="skip"``), its failures logged."""
    stage.failures = LoggedFailures(task)
    return stage


# -- the functions the stages call -----------------------------------------------------------------


class _Named:
    """``op`` under the name given to ``pipe(name=...)``, which names the stage: ``Mapper(name)``."""

    def __init__(self, op: Callable[[Any], Any], name: str) -> None:
        self.op = op
        self.__name__ = self.__qualname__ = name

    def __call__(self, item: Any) -> Any:
        return self.op(item)


class _NamedAsync(_Named):
    async def __call__(self, item: Any) -> Any:
        return await self.op(item)


def _not_none(gen: Iterable[Any]) -> Iterator[Any]:
    """The items of ``gen`` but ``None`` (SPDL passes no ``None`` on); ``gen`` closed at the end."""
    try:
        for y in gen:
            if y is not None:
                yield y
    finally:
        close_iterator(gen)


async def _anot_none(gen: Any) -> Any:
    """The items of the async generator ``gen`` but ``None``; ``gen`` closed at the end."""
    try:
        async for y in gen:
            if y is not None:
                yield y
    finally:
        aclose = getattr(gen, "aclose", None)
        if aclose is not None:
            await aclose()


class _DropNone(_Named):
    """The items of the generator ``op(item)`` but ``None``."""

    def __call__(self, item: Any) -> Iterator[Any]:
        return _not_none(self.op(item))


class _DropNoneAsync(_Named):
    """The items of the async generator ``op(item)`` but ``None`` (an async generator function
    itself, as ``flatmap`` drives those on the event loop)."""

    async def __call__(self, item: Any) -> Any:
        async for y in _anot_none(self.op(item)):
            yield y


class _Gathered(NamedTuple):
    """What a generator ``op`` gave for one item on a worker: its items (``None`` left out) and the
    exception that stopped it, if any."""

    items: list[Any]
    error: Exception | None


class _Gather(_Named):
    """Run the generator ``op(item)`` to its end on a worker: its items, and its failure."""

    def __call__(self, item: Any) -> _Gathered:
        items: list[Any] = []
        try:
            for y in _not_none(self.op(item)):
                items.append(y)
        except Exception as e:
            return _Gathered(items, e)
        return _Gathered(items, None)


class _GatherAsync(_Named):
    """Run the async generator ``op(item)`` to its end: its items, and its failure."""

    async def __call__(self, item: Any) -> _Gathered:
        items: list[Any] = []
        try:
            async for y in _anot_none(self.op(item)):
                items.append(y)
        except Exception as e:
            return _Gathered(items, e)
        return _Gathered(items, None)


class _Unpack:
    """The ``flatmap`` after a gathering ``map``: the items one generator call gave, then its
    failure, which the stage counts against its budget (its items before the failure stay, as SPDL
    passes on each item a generator yields at once)."""

    def __init__(self, name: str) -> None:
        self.__name__ = self.__qualname__ = name

    def __call__(self, gathered: _Gathered) -> Iterator[Any]:
        yield from gathered.items
        if gathered.error is not None:
            raise gathered.error


# -- aggregate(Aggregator) -------------------------------------------------------------------------


class Aggregator:
    """A custom aggregation for :meth:`PipelineBuilder.aggregate`, as SPDL's
    ``spdl.pipeline.defs.Aggregator``: :meth:`accumulate` is called with each item and returns an
    aggregate to pass on, or ``None`` to keep accumulating; :meth:`flush` is called at the end of
    the source (unless ``drop_last=True``) and returns the last aggregate or ``None``.

    Any object with ``accumulate`` and ``flush`` methods works (SPDL's own Aggregator subclasses
    too); subclassing this one is optional. Each pass of the built pipe works on its own deep copy of
    the aggregator, so passes do not share its buffer.

    Example:
        >>> from datapipes.spdl import Aggregator, PipelineBuilder
        >>> class Joined(Aggregator):
        ...     def __init__(self, size):
        ...         self.size, self.buffer = size, []
        ...     def accumulate(self, item):
        ...         self.buffer.append(item)
        ...         if len("".join(self.buffer)) >= self.size:
        ...             out, self.buffer = "".join(self.buffer), []
        ...             return out
        ...         return None
        ...     def flush(self):
        ...         return "".join(self.buffer) or None
        >>> pipeline = PipelineBuilder().add_source(["a", "bb", "ccc", "d"]).aggregate(Joined(3)).add_sink(3).build(num_threads=1)
        >>> list(pipeline)
        ['abb', 'ccc', 'd']
    """

    def accumulate(self, item: Any) -> Any | None:
        """Take ``item``; return an aggregate to pass on, or ``None`` to go on accumulating."""
        raise NotImplementedError(f"{type(self).__name__} must define accumulate()")

    def flush(self) -> Any | None:
        """The end of the source: return the last aggregate, or ``None``."""
        raise NotImplementedError(f"{type(self).__name__} must define flush()")


_NO_AGGREGATOR: Any = object()  # private marker: a state that holds no aggregator (a fresh pass's copy)


class _AggregatedRun(Resumable):
    """The position of a pass of :class:`Aggregated` between two aggregates: its aggregator (a deep
    copy of it, with its buffer, is the state), which the loop hands the run as it starts; once it
    is flushed, or the pass has ended, ``{"ended": True}``."""

    __slots__ = ("loaded", "ended", "agg")

    def __init__(self) -> None:
        super().__init__()
        self.loaded: dict[str, Any] | None = None  # the state loaded, saved as it is until the pass starts
        self.ended = False  # flushed, or the pass has ended
        self.agg: Any = _NO_AGGREGATOR  # loaded: the aggregator a resumed pass copies; then the pass's own

    def state(self) -> dict[str, Any]:
        if not self.started:
            return {"next": 0} if self.loaded is None else dict(self.loaded)
        if self.ended:
            return {"ended": True}
        return {"aggregator": copy.deepcopy(self.agg)}

    def load(self, state: dict[str, Any]) -> None:
        check_loop_state(state, needs_next=False)
        self.loaded, self.ended = state, "ended" in state
        self.agg = state.get("aggregator", _NO_AGGREGATOR)


def _aggregate(stage: Aggregated, it: Iterator[Any], run: _AggregatedRun) -> Iterator[Any]:
    run.started = True
    try:
        if run.ended:
            return
        agg = copy.deepcopy(stage.aggregator if run.agg is _NO_AGGREGATOR else run.agg)
        run.agg = agg  # the run reads it when a state is taken (a deep copy): nothing per item
        accumulate = agg.accumulate
        n = 0
        try:
            for x in it:
                out = accumulate(x)
                if out is not None:
                    yield out
                n += 1
            if not stage.drop_last:
                run.ended = True  # flushed: a state taken at the last aggregate is the end
                out = agg.flush()
                if out is not None:
                    yield out
        except Exception as e:
            add_stage_note(e, stage_label(stage), n)
            abandon(it)
            raise
        except BaseException:
            abandon(it)
            raise
    finally:
        run.ended = True
        run.agg = None  # let go of the aggregator with the pass's frame


class Aggregated(IterDataPipe[Any]):
    """The stage ``aggregate(aggregator)`` builds: each item goes to ``aggregator.accumulate``,
    whose results but ``None`` are yielded; at the end ``aggregator.flush()`` (unless ``drop_last``).
    Each pass works on a deep copy of ``aggregator``. What it raises ends the pass (as in SPDL).

    A pass's ``state_dict()`` holds a deep copy of its aggregator (so the aggregator must pickle to
    write the state); the resumed pass goes on with it.

    ``len()`` raises ``TypeError``: how many aggregates come out is known only after iterating.
    """

    _repr_fields = ("accumulate",)

    def __init__(self, datapipe: IterDataPipe[Any], aggregator: Any, drop_last: bool = False) -> None:
        self.datapipe = datapipe
        self.aggregator = aggregator
        self.accumulate = aggregator.accumulate  # names the stage: Aggregated(MyAggregator.accumulate)
        self.drop_last = drop_last

    def _open(self, ctx: Pass) -> Iterator[Any]:
        it = ctx.open(self.datapipe)
        run = _AggregatedRun()
        ctx.track(self, run)
        return _aggregate(self, it, run)

    def __len__(self) -> int:
        raise TypeError(f"{stage_label(self)}: len() is unknown: how many aggregates come out is known only after "
                        f"iterating")


# -- the builder -----------------------------------------------------------------------------------


class _Pipe(NamedTuple):
    op: Callable[[Any], Any]
    concurrency: int
    executor: Executor | None
    name: str
    named: bool  # the name was given to pipe(name=...)
    output_order: str
    max_failures: int | None


class _Aggregate(NamedTuple):
    size: int | None
    aggregator: Any
    drop_last: bool


class _Disaggregate(NamedTuple):
    pass


def _check_failures(value: Any, where: str, allow_negative: bool) -> int | None:
    """A validated ``max_failures``: an int (negative: unlimited, where allowed) or None."""
    if value is None:
        return None
    if isinstance(value, Fraction):
        raise TypeError(f"{where}: max_failures as a Fraction (a failure rate) is not supported by datapipes.spdl; "
                        f"give a number of failures, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where}: max_failures must be an int, got {type(value).__name__}")
    if value < 0 and not allow_negative:
        raise ValueError(f"{where}: max_failures must be >= 0 or None, got {value!r}")
    return value


class PipelineBuilder(Generic[T, U]):
    """Build a :class:`~datapipes.spdl.Pipeline` step by step, as SPDL's
    ``spdl.pipeline.PipelineBuilder``: one source, processing stages, a sink, then
    :meth:`build`. Each method returns the builder.

    The built pipeline holds an ordinary pipe (``pipeline.pipe``), so profiling, checkpoints
    (``it.state_dict()``) and ``DataLoader`` work on it (the module :mod:`datapipes.spdl` lists how
    each step translates).

    Example:
        >>> from datapipes.spdl import PipelineBuilder
        >>> builder = PipelineBuilder().add_source("abc").pipe(str.upper, output_order="input").add_sink(2)
        >>> pipeline = builder.build(num_threads=2)
        >>> with pipeline.auto_stop():
        ...     print(list(pipeline.get_iterator(timeout=10)))
        ['A', 'B', 'C']
    """

    def __init__(self) -> None:
        self._src: Any = None
        self._has_src = False
        self._continuous = False
        self._steps: list[_Pipe | _Aggregate | _Disaggregate] = []
        self._sink: int | None = None

    def add_source(self, source: Iterable[T] | AsyncIterable[T], *, continuous: bool = False) -> PipelineBuilder[T, U]:
        """Set the source: an iterable or an async iterable (an async generator listing a bucket).

        Args:
            source: the items. Its own objects are passed on (no copies). A synchronous source is
                read on the thread running the stages after it; an async one on the engine's event
                loop.
            continuous: ``True``: every :meth:`Pipeline.get_iterator` runs one more epoch, a new
                pass over ``source`` (which must then be re-iterable: a list, a range, an object
                whose ``__iter__`` builds a new iterator).

        Raises:
            ValueError: the source is already set (``"Source already set."``).

        Example:
            >>> from datapipes.spdl import PipelineBuilder
            >>> pipeline = PipelineBuilder().add_source("abc").add_sink(3).build(num_threads=1)
            >>> list(pipeline)
            ['a', 'b', 'c']
        """
        if self._has_src:
            raise ValueError("Source already set.")
        kind = type(source)
        if not (hasattr(kind, "__iter__") or hasattr(kind, "__aiter__") or hasattr(kind, "__getitem__")):
            raise TypeError(f"PipelineBuilder.add_source: source must be an iterable or an async iterable, "
                            f"got {kind.__name__}")
        if not isinstance(continuous, bool):
            raise TypeError(f"PipelineBuilder.add_source: continuous must be a bool, got {type(continuous).__name__}")
        self._src = source
        self._has_src = True
        self._continuous = continuous
        return self

    def pipe(
        self,
        op: Any,
        /,
        *,
        concurrency: int = 1,
        executor: Executor | None = None,
        name: str | None = None,
        output_order: str = "completion",
        max_failures: int | None = None,
    ) -> PipelineBuilder[T, U]:
        """Apply ``op`` to every item.

        Args:
            op: a function, an ``async def`` function, a generator function or an async generator
                function (each item it yields is passed on), or a container (dict, list, ...):
                ``op[item]``. A ``None`` result (or yielded item) is dropped, as in SPDL. An item
                whose call fails is dropped and the failure logged to the ``datapipes.spdl``
                logger (ERROR, with the traceback).
            concurrency: how many items ``op`` works on at once: threads for a function (within
                the ``num_threads`` budget of :meth:`build`), tasks on the event loop for an async
                one.
            executor: a ``concurrent.futures.Executor`` to run ``op`` on (a
                ``ProcessPoolExecutor`` for Python code that holds the GIL); not with an async
                ``op``. It is used, never shut down.
            name: the stage's name (in ``repr(pipeline.pipe)``, logs and errors); default ``op``'s
                name.
            output_order: ``"completion"`` (SPDL's default: each result as soon as it is ready) or
                ``"input"`` (the source's order).
            max_failures: failures this stage tolerates before the pipeline fails; ``None`` takes
                :meth:`build`'s. A failure rate (``Fraction``) is not supported.

        Raises:
            ValueError: ``concurrency < 1``; ``output_order`` neither ``"completion"`` nor
                ``"input"``; an async generator ``op`` with ``output_order="input"``; an
                ``executor`` with an async ``op`` (the messages say which).
            TypeError: ``op`` is neither callable nor a container.

        Example:
            >>> import asyncio
            >>> from datapipes.spdl import PipelineBuilder
            >>> async def fetch(x):
            ...     await asyncio.sleep(0.001 * (5 - x))
            ...     return x * 10
            >>> def pieces(x):
            ...     yield x
            ...     yield -x
            >>> pipeline = (
            ...     PipelineBuilder()
            ...     .add_source(range(5))
            ...     .pipe(fetch, concurrency=5)
            ...     .pipe(pieces)
            ...     .pipe({0: "zero"}.get)
            ...     .add_sink(10)
            ...     .build(num_threads=2)
            ... )
            >>> list(pipeline)  # .get gives None for every key but 0: those items are dropped
            ['zero', 'zero']
        """
        where = "PipelineBuilder.pipe"
        if not callable(op):
            if not hasattr(op, "__getitem__"):
                raise TypeError(f"{where}: op must be a function or a container with __getitem__, "
                                f"got {type(op).__name__}")
            op = op.__getitem__
        if isinstance(concurrency, bool) or not isinstance(concurrency, int):
            raise TypeError(f"{where}: concurrency must be an int, got {type(concurrency).__name__}")
        if concurrency < 1:
            raise ValueError(f"{where}: `concurrency` value must be >= 1. Found: {concurrency}")
        if output_order not in ("completion", "input"):
            raise ValueError(f'{where}: `output_order` must be either "completion" or "input". Found: {output_order}')
        if is_async_gen_callable(op) and output_order == "input":
            raise ValueError(f"{where}: pipe does not support async generator function when `output_order` is 'input'.")
        if executor is not None:
            if not isinstance(executor, Executor):
                raise TypeError(f"{where}: executor must be a concurrent.futures.Executor, got {type(executor).__name__}")
            if is_async_callable(op) or is_async_gen_callable(op):
                raise ValueError(f"{where}: `executor` cannot be specified when op is async.")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{where}: name must be a str, got {type(name).__name__}")
        _check_failures(max_failures, where, allow_negative=True)
        self._steps.append(_Pipe(op, concurrency, executor, name or _op_name(op), name is not None, output_order,
                                 max_failures))
        return self

    def aggregate(self, input: int | Any, /, *, drop_last: bool = False) -> PipelineBuilder[T, U]:  # noqa: A002 - SPDL's name
        """Group items: ``input`` items into a list, or by an :class:`Aggregator`.

        Args:
            input: the number of items per list, or an aggregator (an object with ``accumulate``
                and ``flush``: :class:`Aggregator`).
            drop_last: drop the last, incomplete list (an aggregator's :meth:`~Aggregator.flush`
                is not called).

        Raises:
            TypeError: ``input`` is neither an int nor an aggregator.
            ValueError: ``input < 1``.

        Example:
            >>> from datapipes.spdl import PipelineBuilder
            >>> pipeline = PipelineBuilder().add_source(range(10)).aggregate(3, drop_last=True).add_sink(3).build(num_threads=1)
            >>> list(pipeline)
            [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
        """
        if not isinstance(drop_last, bool):
            raise TypeError(f"PipelineBuilder.aggregate: drop_last must be a bool, got {type(drop_last).__name__}")
        if isinstance(input, int) and not isinstance(input, bool):
            if input < 1:
                raise ValueError(f"PipelineBuilder.aggregate: the number of items must be >= 1, got {input}")
            self._steps.append(_Aggregate(input, None, drop_last))
        elif callable(getattr(input, "accumulate", None)) and callable(getattr(input, "flush", None)):
            self._steps.append(_Aggregate(None, input, drop_last))
        else:
            raise TypeError(f"The `input` must be either int or Aggregator. Found: {type(input)}")
        return self

    def disaggregate(self) -> PipelineBuilder[T, U]:
        """Split each item (a list) into its elements (``None`` elements dropped, as in SPDL).

        Example:
            >>> from datapipes.spdl import PipelineBuilder
            >>> pipeline = PipelineBuilder().add_source([[1, 2], [3]]).disaggregate().add_sink(3).build(num_threads=1)
            >>> list(pipeline)
            [1, 2, 3]
        """
        self._steps.append(_Disaggregate())
        return self

    def add_sink(self, buffer_size: int = 3) -> PipelineBuilder[T, U]:
        """Set the sink: a buffer of ``buffer_size`` items filled ahead of the reader by a
        background thread running the stages (``prefetch(buffer_size)``).

        Args:
            buffer_size: how many items may wait for the reader (>= 1).

        Raises:
            ValueError: the sink is already set, or ``buffer_size < 1``.

        Example:
            >>> from datapipes.spdl import PipelineBuilder
            >>> PipelineBuilder().add_source(range(3)).add_sink(2).build(num_threads=1).pipe
            IterableWrapper -> Prefetcher(2)
        """
        if self._sink is not None:
            raise ValueError("Sink is already set.")
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int):
            raise ValueError(f"`buffer_size` must be int. Found: {type(buffer_size)}.")
        if buffer_size < 1:
            raise ValueError(f"`buffer_size` must be greater than 0. Found: {buffer_size}")
        self._sink = buffer_size
        return self

    def build(
        self,
        *,
        num_threads: int,
        max_failures: int = -1,
        report_stats_interval: float = -1,
        queue_class: Any = None,
        task_hook_factory: Any = None,
        stage_id: int = 0,
        use_thread_output_queue: bool = False,
    ) -> Pipeline[U]:
        """Build the pipe and return the :class:`~datapipes.spdl.Pipeline` running it.

        Args:
            num_threads: the most worker threads the stages run together
                (``pipe.set_budget(max_threads=num_threads)``): stages whose ``concurrency`` add up
                to more are scaled down in proportion. SPDL's thread pool of that size, shared by
                the stages.
            max_failures: failures each ``pipe()`` stage tolerates (unless it sets its own); ``-1``
                (the default): any number. One more fails the pipeline with
                :class:`PipelineFailure`. SPDL counts the failures of all stages against this one
                budget; here each stage has it. A ``Fraction`` (a rate) is not supported.
            report_stats_interval: seconds between two logs of every stage's figures
                (:class:`datapipes.hooks.StatsReporter`, ``datapipes`` logger, INFO); ``<= 0``: none.
            queue_class: SPDL's custom queue class: not supported (must be ``None``).
            task_hook_factory: SPDL's task hooks: not supported (must be ``None``); attach a
                :class:`datapipes.hooks.Hook` with ``pipeline.pipe.add_hook(...)`` instead.
            stage_id: the number of the first stage in the task names of the failure logs.
            use_thread_output_queue: accepted for SPDL's sake: the sink is always a thread queue.

        Raises:
            RuntimeError: no source or no sink (``"Source is not set. Did you call `add_source`?"``).
            TypeError: ``queue_class`` or ``task_hook_factory`` given; a ``Fraction``
                ``max_failures``.

        Example:
            >>> from datapipes.spdl import PipelineBuilder
            >>> pipeline = (
            ...     PipelineBuilder()
            ...     .add_source(range(6))
            ...     .pipe(lambda x: x * x, concurrency=4, output_order="input")
            ...     .add_sink(3)
            ...     .build(num_threads=2)
            ... )
            >>> list(pipeline)
            [0, 1, 4, 9, 16, 25]
        """
        where = "PipelineBuilder.build"
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"{where}: num_threads must be an int >= 1, got {num_threads!r}")
        default = _check_failures(max_failures, where, allow_negative=True)
        if isinstance(report_stats_interval, bool) or not isinstance(report_stats_interval, (int, float)):
            raise TypeError(f"{where}: report_stats_interval must be a number of seconds, "
                            f"got {type(report_stats_interval).__name__}")
        if queue_class is not None:
            raise TypeError(f"{where}: queue_class (SPDL's AsyncQueue classes) is not supported; the stages here are "
                            f"connected by the engine's own bounded queues")
        if task_hook_factory is not None:
            raise TypeError(f"{where}: task_hook_factory (SPDL's TaskHook classes) is not supported; attach a "
                            f"datapipes.hooks.Hook with pipeline.pipe.add_hook(hook) instead")
        if isinstance(stage_id, bool) or not isinstance(stage_id, int):
            raise TypeError(f"{where}: stage_id must be an int, got {type(stage_id).__name__}")
        if not self._has_src:
            raise RuntimeError("Source is not set. Did you call `add_source`?")
        if self._sink is None:
            raise RuntimeError("Sink is not set. Did you call `add_sink`?")
        pipe = self._stages(default, stage_id).prefetch(self._sink)
        pipe.set_budget(max_threads=num_threads)
        if report_stats_interval > 0:
            pipe.add_hook(StatsReporter(report_stats_interval))
        return Pipeline(pipe, continuous=self._continuous)

    # -- building the pipe -------------------------------------------------------------------------

    def _stages(self, max_failures: int | None = -1, stage_id: int = 0) -> IterDataPipe[Any]:
        """The pipe of the source and the stages (the sink not included)."""
        pipe: IterDataPipe[Any] = IterableWrapper(self._src, deepcopy=False)
        for number, step in enumerate(self._steps, start=stage_id + 1):
            if isinstance(step, _Pipe):
                pipe = _pipe_stage(pipe, step, max_failures, f"{number}:{step.name}")
            elif isinstance(step, _Aggregate):
                if step.size is not None:
                    pipe = pipe.batch(step.size, drop_last=step.drop_last, wrapper_class=list)
                else:
                    pipe = Aggregated(pipe, step.aggregator, step.drop_last)
            else:
                pipe = pipe.unbatch().filter(not_none)
        return pipe


def _pipe_stage(pipe: IterDataPipe[Any], step: _Pipe, default: int | None, task: str) -> IterDataPipe[Any]:
    """The pipes of one ``pipe()`` step (see the module's table)."""
    budget = step.max_failures if step.max_failures is not None else default
    if budget is not None and budget < 0:
        budget = None  # SPDL's -1: any number of failures
    op, name, concurrency = step.op, step.name, step.concurrency
    ordered = step.output_order == "input"
    executor: Any = "thread" if step.executor is None else step.executor
    if is_async_gen_callable(op) or _is_gen_callable(op):
        is_async = is_async_gen_callable(op)
        if concurrency == 1 and step.executor is None:
            fn: Any = (_DropNoneAsync if is_async else _DropNone)(op, name)
            return _skipping(pipe.flatmap(fn, on_error="skip", max_failures=budget), task)
        gather: Any = (_GatherAsync if is_async else _Gather)(op, name)
        gathered = pipe.map(gather, concurrency=concurrency, ordered=ordered, executor=executor)
        return _skipping(gathered.flatmap(_Unpack(name), on_error="skip", max_failures=budget), task)
    if step.named:
        op = (_NamedAsync if is_async_callable(op) else _Named)(op, name)
    mapped = pipe.map(op, on_error="skip", max_failures=budget, concurrency=concurrency, ordered=ordered,
                      executor=executor)
    return _skipping(mapped, task).filter(not_none)
