"""FlatMapper [flatmap]: ``fn`` applied to every item and each element of what it returns yielded,
serially, or concurrently on the engine (each item's outputs gathered into a list on its worker). The
concurrent pass also runs a ``map`` of a generator function (:mod:`.map`).

Checkpoint and resume (docs/howto/checkpoint.rst): a serial pass saved between two outputs of one item
resumes inside that item (its outputs left, or the item and the count of outputs yielded): its loop
hands the pass's run a function that reads its position (the item, what ``fn`` returned for it and
the count of outputs yielded), so that it writes nothing per item or per output. A concurrent pass
keeps the items in flight and the outputs of the current item not yet yielded.
"""

from __future__ import annotations

from itertools import islice
from typing import Any, AsyncIterable, Callable, Iterable, Iterator, Literal, TypeVar, cast, overload

from ..._runtime import passes as _pass
from ..._runtime.passes import Pass
from ..._runtime.validate import check_engine, check_int, check_list, check_loop_state
from ..._positions import remaining
from ..._engine import EngineRun, LoopRef, StageSpec, abandon, close_iterator, concurrent_map, is_async_callable, is_async_gen_callable, iterate_async, new_stats
from ...datapipe import IterDataPipe, functional_datapipe, len_unknown, require_callable, require_pipe, stage_label
from ...errors import WARN_FAILURES, _OnError, policy_and_log
from ._shared import (
    _Col,
    _Executor,
    _check_cols,
    _check_concurrency,
    _end_pass,
    _item_fail,
    _LoopRun,
    _no_op,
    _selected_fn,
    _stage_concurrency,
    stage_sink,
    check_arity,
)

__all__ = ["FlatMapper"]

T = TypeVar("T")
U = TypeVar("U")


# -- FlatMapper ------------------------------------------------------------------------------------


_LIST_ITERATORS: tuple[type, ...] = (type(iter([])), type(iter(())))


class _FlatmapRun(_LoopRun):
    """The position of a serial flatmap pass: the item whose outputs it yields (``n``, its position;
    ``x``, the item; ``out``, what ``fn`` returned for it) and the outputs yielded (``done``), read
    through ``where``, a function of the loop's that gives them (a closure over the loop's own
    variables: nothing is written per item or per output; a store on the run for each would cost
    the loop 10-15% of its time with a function that does little). The state holds the position of
    the source's next item (``next``), the failures counted under a failure budget, and what is
    left inside the item:

    - ``fn`` returned a list or tuple (or, with ``fn=None``, the item is one): the outputs left
      (``rest``: ``out[done:]``), which a resumed pass yields first;
    - any other iterable (a generator, an async generator, ...): its outputs can only be computed
      again. The item and the count of its outputs yielded are kept (``input``, ``done``); a
      resumed pass calls ``fn`` on the item again and skips that many, so ``fn`` must give the same
      outputs for the same item.

    Costs the outputs left of one item, or one item. The loops count every output (``done += 1``:
    about 6 ns); telling lists from other iterables per item instead (a type check and an ``iter()``
    call) costs about 20 ns per item, more than the count up to about four outputs per item and for
    every generator.
    """

    __slots__ = ("where",)

    def __init__(self) -> None:
        super().__init__()
        self.where: Callable[[], tuple[int, Any, Any, int]] | None = None  # set as the loop starts

    def position(self) -> dict[str, Any]:
        n, x, out, done = self.where()  # type: ignore[misc]
        state: dict[str, Any] = {"next": n + 1, **self.counted()}
        if type(out) is list or type(out) is tuple:
            state["rest"] = list(out[done:])
        elif type(out) in _LIST_ITERATORS:
            state["rest"] = remaining(out)
        else:
            state.update(input=x, done=done)
        return state

    def load(self, state: dict[str, Any]) -> None:
        check_loop_state(state)
        if "input" in state and "rest" not in state and "ended" not in state:
            check_int(state, "done")
        self.loaded = state


def _flatmap_resumed(loaded: dict[str, Any], call: Callable[[Any], Iterable[Any]]) -> tuple[Any, Any, int]:
    """The item a resumed pass stopped inside: ``(item, its outputs left, the count yielded before)``."""
    if "rest" in loaded:
        return None, list(loaded["rest"]), 0
    x, done = loaded["input"], loaded["done"]
    out = iter(call(x))
    next(islice(out, done, done), None)  # skip the outputs yielded before the state was taken
    return x, out, done


# Each loop hands its run ``where``, which reads its position (see _FlatmapRun): ``n``, the position
# of the item whose outputs it yields; ``x``, that item; ``out``, what fn returned for it; ``done``,
# the outputs yielded. A resumed pass first yields what was left of its item.


def _flatmap(pipe: FlatMapper, it: Iterator[Any], run: _FlatmapRun) -> Iterator[Any]:
    if pipe.fn is not None:
        fn = _selected_fn(pipe.fn, pipe.input_col)
    else:  # the item, or its column(s), is the iterable (torchdata's no-op fn)
        fn = iter if pipe.input_col is None else _selected_fn(_no_op, pipe.input_col)
    fail = _item_fail(pipe, run)
    loaded = run.loaded
    n, x, out, done = -1, None, (), 0

    def where() -> tuple[int, Any, Any, int]:
        return n, x, out, done

    run.where = where
    run.started = True
    try:
        if loaded is not None:
            if "ended" in loaded:
                return
            n = loaded["next"] - 1
            if "rest" in loaded or "input" in loaded:
                try:
                    x, out, done = _flatmap_resumed(loaded, fn)
                    for y in out:
                        done += 1
                        yield y
                except Exception as e:
                    fail(e, n)
        for x in it:
            n += 1
            try:
                out = fn(x)
                done = 0
                for y in out:
                    done += 1
                    yield y
            except Exception as e:
                fail(e, n)
    except BaseException:
        abandon(it)
        raise
    finally:
        run.ended = True
        run.where = None  # let go of the item and its outputs with the pass
        _end_pass(fail, n + 1)


def _async_outputs(fn: Callable[[Any], Any]) -> Callable[[Any], Iterator[Any]]:
    return lambda x: iterate_async(fn(x))


def _flatmap_async(pipe: FlatMapper, it: Iterator[Any], run: _FlatmapRun) -> Iterator[Any]:
    fn = _selected_fn(cast("Callable[..., Any]", pipe.fn), pipe.input_col)  # the async loop runs only with a fn
    fail = _item_fail(pipe, run)
    loaded = run.loaded
    n, x, out, done = -1, None, None, 0

    def where() -> tuple[int, Any, Any, int]:
        return n, x, out, done

    run.where = where
    run.started = True
    try:
        with LoopRef():  # one loop reference for the pass: each item's generator reuses the running loop
            if loaded is not None:
                if "ended" in loaded:
                    return
                n = loaded["next"] - 1
                if "input" in loaded:
                    try:
                        x, out, done = _flatmap_resumed(loaded, _async_outputs(fn))
                        for y in out:
                            done += 1
                            yield y
                    except Exception as e:
                        fail(e, n)
                    finally:
                        close_iterator(out)
            for x in it:
                n += 1
                out = None
                try:
                    out = iterate_async(fn(x))
                    done = 0
                    for y in out:
                        done += 1
                        yield y
                except Exception as e:
                    fail(e, n)
                finally:
                    close_iterator(out)  # also when the pass stops early: aclose now, inside the loop reference
    except BaseException:
        abandon(it)
        raise
    finally:
        run.ended = True
        run.where = None  # let go of the item and its outputs with the pass
        _end_pass(fail, n + 1)


class _Listed:
    """``fn`` whose result (any iterable: a list, a generator) is made a list on the worker that
    runs it, so a concurrent flatmap hands each item's outputs over at once. A class, not a
    closure, so that it pickles to worker processes."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any], Iterable[Any]]) -> None:
        self.fn = fn

    def __call__(self, x: Any) -> list[Any]:
        return list(self.fn(x))


def _listing_fn(fn: Any, input_col: Any) -> Callable[[Any], Any]:
    """The per-item function of a concurrent flatmap: ``fn``'s outputs for one item, as a list
    (an async generator's or an async function's collected on the event loop)."""
    if is_async_gen_callable(fn):
        async def collect(x: Any) -> list[Any]:
            out = fn(x) if input_col is None else _selected_fn(fn, input_col)(x)
            return [y async for y in out]

        return collect
    if is_async_callable(fn):
        async def await_list(x: Any) -> list[Any]:
            out = await (fn(x) if input_col is None else _selected_fn(fn, input_col)(x))
            return list(out)

        return await_list
    return _Listed(fn if input_col is None else _selected_fn(fn, input_col))


class _FlatRun:
    """The position of a concurrent flatmap's (or generator map's) pass: the engine's (items in
    flight, computed again on resume) and the outputs of the current item not yet yielded."""

    __slots__ = ("engine", "rest", "resume")

    def __init__(self) -> None:
        self.engine = EngineRun()
        self.rest: Any = iter(())
        self.resume: list[Any] | None = None

    def state(self) -> dict[str, Any]:
        # loaded and not started: the outputs it was given (with the engine's inputs, waiting while
        # the pass yields those outputs first; see EngineRun)
        rest = list(self.resume) if self.resume is not None else _pass.remaining(self.rest)
        return {**self.engine.state(), "rest": rest}

    def restore(self, state: dict[str, Any]) -> None:
        check_list(state, "rest")
        check_engine(state)
        self.engine.restore(state)
        self.resume = list(state["rest"])


def _flat_engine(pipe: Any, ctx: Pass, it: Iterator[Any], fn: Callable[[Any], Any]) -> Iterator[Any]:
    """The pass of a concurrent flatmap (or a map of a generator function): ``fn`` gives each
    item's outputs as a list on a worker; they are yielded one by one, in input order or in
    completion order."""
    label = stage_label(pipe)
    run = _FlatRun()
    ctx.track(pipe, run)
    concurrency, tune = _stage_concurrency(pipe, ctx)
    stats = ctx.stats_for(pipe, lambda: new_stats(label, fn, concurrency, pipe.executor, tune is not None))
    spec = StageSpec(label, concurrency, pipe.ordered, pipe.executor)
    lists = concurrent_map(it, fn, spec, stage_sink(pipe, ctx, stats, run.engine, tune))
    return _flattened(lists, run)


def _flattened(lists: Iterator[list[Any]], run: _FlatRun) -> Iterator[Any]:
    try:
        if run.resume is not None:
            run.rest = iter(run.resume)
            run.resume = None
            yield from run.rest
        for out in lists:
            run.rest = rest = iter(out)
            yield from rest
    finally:
        close_iterator(lists)


# The lines that call fn or iterate what it returned: an exception passing through one of them is fn's.


@functional_datapipe("flatmap")
class FlatMapper(IterDataPipe[U]):
    """Apply ``fn`` to every item and yield each element of the iterable it returns
    (functional name: ``flatmap``).

    Args:
        datapipe: the source pipe.
        fn: a function returning an iterable (a list, a generator, ...). ``None``: each item is
            itself an iterable and is flattened one level; with ``input_col``, its column is (or
            its columns are, in order), as in torchdata. An async generator function (``async def``
            with ``yield``) works too: each item's async generator is driven on the engine's
            event-loop thread, a few elements ahead of the consumer, and closed (``aclose``) when
            the pass stops early.
        input_col: apply ``fn`` to this column (or these columns) of each item, as in
            :class:`Mapper`; ``fn`` then returns the iterable.
        on_error: ``"raise"`` (default) or ``"skip"``. When skipping, a failure while iterating
            ``fn``'s result drops the rest of that item's outputs; what it already yielded stays.
        max_failures: with ``on_error="skip"``, failures tolerated per pass: a number, or a float
            between 0 and 1 for a share of the items (``None``: any).
        warn_failures: with ``on_error="skip"``, past how many failures (a number, or a share:
            10% by default) a pass warns once (``None``: never); see :mod:`datapipes.errors`.
        concurrency: how many items ``fn`` works on at once: above 1 (or ``"auto"``, tuned online as in
            :class:`Mapper`) the calls run on ``executor``'s workers, each item's outputs collected
            into a list on its worker (a sync or async generator is driven to its end there), then
            yielded one by one. A failure then drops all of the item's outputs. Memory: the window of
            ``2 * concurrency`` items in flight, each with all of its outputs.
        ordered: with ``concurrency``: ``True`` yields the items' outputs in source order,
            ``False`` in completion order (each item's outputs stay together and in order).
        executor: ``"thread"``, ``"process"`` or a ``concurrent.futures.Executor``, as in :class:`Mapper`.

    Yields:
        The elements of ``fn(item)`` for each item, in order.

    ``len()`` raises ``TypeError``: the number of outputs per item is not known in advance.

    A pass saved between two outputs of one item resumes inside that item: when ``fn`` returned a
    list or tuple, the state holds the outputs left; for any other iterable (a generator, ...) it
    holds the item and the count of outputs yielded, and the resumed pass calls ``fn`` on the item
    again and skips them, which is exact for a ``fn`` that gives the same outputs for the same item.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([1, 2, 3]).flatmap(lambda x: [x] * x))
        [1, 2, 2, 3, 3, 3]
        >>> def tiles(x):
        ...     yield from range(x)
        >>> list(IterableWrapper([1, 2, 3]).flatmap(tiles, concurrency=3))
        [0, 0, 1, 0, 1, 2]
    """

    _saves = (
        "the outputs left of the current input (batch) where ``fn`` returned a list or tuple; else the input "
        "and how many of its outputs were yielded (``fn`` runs on it again). Concurrent ``flatmap``: also the "
        "inputs in flight, as ``map(concurrency=N)``"
    )

    _repr_fields = ("fn",)

    @overload
    def __init__(
        self: FlatMapper[U],
        datapipe: IterDataPipe[Iterable[U]],
        fn: None = ...,
        input_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal['auto'] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: FlatMapper[U],
        datapipe: IterDataPipe[T],
        fn: Callable[[T], AsyncIterable[U]],
        input_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal['auto'] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: FlatMapper[U],
        datapipe: IterDataPipe[T],
        fn: Callable[[T], Iterable[U]],
        input_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal['auto'] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: FlatMapper[U],
        datapipe: IterDataPipe[T],
        fn: Callable[..., Iterable[U] | AsyncIterable[U]],
        input_col: _Col,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal['auto'] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
    ) -> None: ...
    def __init__(
        self,
        datapipe: IterDataPipe[T],
        fn: Callable[..., Iterable[U] | AsyncIterable[U]] | None = None,
        input_col: _Col = None,
        *,
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        concurrency: int | Literal["auto"] = 1,
        ordered: bool = True,
        executor: _Executor = "thread",
    ) -> None:
        require_pipe(datapipe, "FlatMapper")
        require_callable(fn, "FlatMapper", "fn", optional=True)
        _check_cols(input_col, None, "FlatMapper")
        if fn is not None:
            check_arity(fn, input_col, "FlatMapper")
        _check_concurrency("FlatMapper", fn, concurrency, ordered, executor, None, None, None)
        self.datapipe = datapipe
        self.fn = fn
        self.input_col = input_col
        self.concurrency = concurrency
        self.ordered = ordered
        self.executor = executor
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures)
        self._concurrent = concurrency != 1 or executor != "thread"
        if self._concurrent:
            if fn is None:
                raise ValueError("FlatMapper: concurrency needs a fn (flattening items themselves has nothing to "
                                 "run concurrently)")
            self._async = is_async_gen_callable(fn) or is_async_callable(fn)
            if self._async and executor != "thread":
                raise ValueError(f"FlatMapper: an async fn runs on the event loop, not executor={executor!r}")
        elif fn is not None and is_async_gen_callable(fn):
            self._run = _flatmap_async
        else:
            self._run = _flatmap

    def _thread_demand(self) -> int | str | None:
        """What a pass's thread budget counts for this stage (see :class:`Mapper`)."""
        if not self._concurrent or self._async or self.executor != "thread":
            return None
        return self.concurrency

    def _open(self, ctx: Pass) -> Iterator[U]:
        if self._concurrent:
            return _flat_engine(self, ctx, ctx.open(self.datapipe), _listing_fn(self.fn, self.input_col))
        it = ctx.open(self.datapipe)
        run = _FlatmapRun()
        ctx.track(self, run)
        return self._run(self, it, run)

    def __len__(self) -> int:
        raise len_unknown(self, "FlatMapper's length relies on the output of its function (the number of outputs per "
                                "item is known only after iterating).", "length relies on the output of its function")
