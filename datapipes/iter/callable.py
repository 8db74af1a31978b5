"""Stages that call a user function per item: Mapper [map], Filter [filter], FlatMapper [flatmap].

Every one of them follows the shared error policy (:mod:`datapipes.errors`): by default the first
failure reaches the consumer as the user's own exception object with a note naming the stage and the
item's position; ``on_error="skip"`` drops failing items and counts them in ``pipe.failures``.

The hot loops are bare generators chosen once at construction: no per-item branching on options.
"""

from __future__ import annotations

import functools
import inspect
import threading
from concurrent.futures import Executor, ProcessPoolExecutor
from itertools import islice
from typing import Any, Callable, Hashable, Iterable, Iterator, Sequence, TypeVar, cast

from .. import _pass
from .._collate import collate as default_collate
from .._checks import phrased
from .._engine import EngineRun, LoopRef, abandon, close_iterator, concurrent_map, is_async_callable, is_async_gen_callable, iterate_async, new_stats
from .._tuning import process_workers
from .._engine.rng import check_rng, item_seed, make_rng, seeded_call, with_seeds
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_callable, require_int, require_pipe, source_len, stage_label
from ..errors import WARN_FAILURES, PassFailures, add_stage_note, call_lines, policy_and_log, raised_at
from .device import StreamOps, cuda_upstream

__all__ = ["Mapper", "Filter", "FlatMapper", "Collator"]

T = TypeVar("T")
U = TypeVar("U")

_Col = Hashable | Sequence[Hashable] | None


def _check_cols(input_col: _Col, output_col: _Col, stage: str) -> None:
    # torch's (and torchdata's) words where they check the same
    if input_col is None and output_col is not None:
        raise ValueError(phrased(stage, "`output_col` must be None when `input_col` is None.", output_col=output_col))
    if isinstance(output_col, (list, tuple)):
        if len(output_col) > 1:
            raise ValueError(phrased(stage, "`output_col` must be a single-element list or tuple",
                                     output_col=output_col))
        if not output_col:
            raise ValueError(f"{stage}: output_col must name one column, got {output_col!r}")
    if isinstance(input_col, (list, tuple)) and len(input_col) == 0:
        raise ValueError(f"{stage}: input_col must name at least one column, got {input_col!r}")


def check_arity(fn: Callable[..., Any], input_col: Any, stage: str, passed: tuple[str, ...] = ()) -> None:
    """Raise ``ValueError`` when ``fn`` cannot take the columns ``input_col`` gives it (one, or one
    per column of a list or tuple), as torch's ``validate_input_col`` does, its phrase kept after the
    stage's name ("The function f takes 1 parameters, but 2 are required."). Keyword-only
    parameters without a default are refused; ``passed`` names keywords the stage gives (``rng``).
    Functions whose signature cannot be read (some built-ins) are not checked."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    need = len(input_col) if isinstance(input_col, (list, tuple)) else 1
    params = [p for p in sig.parameters.values() if p.name not in passed]
    kinds = inspect.Parameter
    pos = [p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    star = any(p.kind is kinds.VAR_POSITIONAL for p in params)
    bare_kw = [p for p in params if p.kind is kinds.KEYWORD_ONLY and p.default is p.empty]
    target = fn.func if isinstance(fn, functools.partial) else fn
    name = getattr(target, "__name__", repr(target))
    if bare_kw:
        raise ValueError(f"{stage}: The function {name} takes {len(bare_kw)} non-default keyword-only parameters, "
                         f"which is not allowed.")
    if len(params) < need and not star:
        raise ValueError(f"{stage}: The function {name} takes {len(params)} parameters, but {need} are required.")
    if len(params) >= need and len(pos) > need and any(p.default is p.empty for p in pos[need:]):
        raise ValueError(f"{stage}: The function {name} takes {len(pos)} positional parameters, but {need} are "
                         f"required.")
    if len(params) >= need and len(pos) < need and not star:
        raise ValueError(f"{stage}: The function {name} takes {len(pos)} positional parameters, but {need} are "
                         f"required.")


def _column_fn(fn: Callable[..., Any], input_col: _Col, output_col: _Col) -> Callable[[Any], Any]:
    """A per-item function applying ``fn`` to the ``input_col`` columns of a tuple, list or dict and
    writing the result to ``output_col`` (torch DataPipes semantics). The input item is not mutated.

    - ``input_col`` one column: ``fn(item[input_col])``; several: ``fn(*(item[c] for c in input_col))``.
    - ``output_col`` None: the result replaces the (first) input column, the other input columns are
      removed; ``-1``: the result is appended (tuples and lists); any other: the result is written
      there.
    """
    if isinstance(output_col, (list, tuple)):
        output_col = output_col[0]
    many = isinstance(input_col, (list, tuple))

    def apply(item: Any) -> Any:
        res = fn(*[item[c] for c in input_col]) if many else fn(item[input_col])  # type: ignore[union-attr]
        is_tuple = isinstance(item, tuple)
        out: Any = list(item) if is_tuple else item.copy()  # a list or a dict: indexed by the columns
        if output_col is None:
            if many:
                out[input_col[0]] = res  # type: ignore[index]
                for col in sorted(input_col[1:], reverse=True):  # type: ignore[index]
                    del out[col]
            else:
                out[input_col] = res
        elif output_col == -1 and not isinstance(out, dict):
            out.append(res)
        else:
            out[output_col] = res
        return tuple(out) if is_tuple else out

    return apply


def _item_fn(pipe: Any) -> Callable[[Any], Any]:
    if pipe.input_col is None:
        return pipe.fn
    return _column_fn(pipe.fn, pipe.input_col, pipe.output_col)


def _column_rng_fn(fn: Callable[..., Any], input_col: _Col, output_col: _Col) -> Callable[..., Any]:
    """As :func:`_column_fn`, for a ``fn`` that also takes ``rng=``: ``apply(item, rng=...)``."""
    holder: list[Any] = [None]
    apply = _column_fn(lambda *args: fn(*args, rng=holder[0]), input_col, output_col)

    def apply_rng(item: Any, rng: Any) -> Any:
        holder[0] = rng  # one item at a time per copy: each worker thread calls its own copy
        return apply(item)

    return apply_rng


def _async_column_fn(fn: Callable[..., Any], input_col: _Col, output_col: _Col) -> Callable[..., Any]:
    """As :func:`_column_fn`, for an ``async def fn``: awaits ``fn`` on the selected columns."""
    many = isinstance(input_col, (list, tuple))

    async def apply(item: Any, **kw: Any) -> Any:
        res = await (fn(*[item[c] for c in input_col], **kw) if many else fn(item[input_col], **kw))  # type: ignore[union-attr]
        return _column_fn(lambda *_: res, input_col, output_col)(item)

    return apply


def _check_concurrency(stage: str, fn: Any, concurrency: Any, ordered: Any, executor: Any, timeout: Any,
                       chunksize: Any, rng: Any) -> None:
    if concurrency != "auto":
        if isinstance(concurrency, str):
            raise ValueError(f'{stage}: concurrency must be an int >= 1 or "auto", got {concurrency!r}')
        require_int(concurrency, stage, "concurrency", minimum=1)
    if not isinstance(ordered, bool):
        raise TypeError(f"{stage}: ordered must be a bool, got {type(ordered).__name__}")
    if not isinstance(executor, Executor):
        if not isinstance(executor, str):
            raise TypeError(f"{stage}: executor must be 'thread', 'process' or a concurrent.futures.Executor, "
                            f"got {type(executor).__name__}")
        if executor not in ("thread", "process"):
            raise ValueError(f"{stage}: executor must be 'thread', 'process' or a concurrent.futures.Executor, "
                             f"got {executor!r}")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"{stage}: timeout must be a number of seconds or None, got {type(timeout).__name__}")
        if not timeout > 0:
            raise ValueError(f"{stage}: timeout must be > 0, got {timeout!r}")
        if executor == "process":
            raise ValueError(f"{stage}: timeout needs executor='thread' (a stuck worker is abandoned) or an "
                             f"Executor (a late task is cancelled), got executor={executor!r}")
    require_int(chunksize, stage, "chunksize", minimum=1, optional=True)
    if chunksize is not None and executor == "thread":
        raise ValueError(f"{stage}: chunksize applies with executor='process' or an Executor (items per task), "
                         f"got executor={executor!r}")
    check_rng(rng, stage)
    if is_async_callable(fn) and executor != "thread":
        raise ValueError(f"{stage}: an async fn runs on the engine's event loop; executor must be 'thread' "
                         f"(the default), got {executor!r}")


def _no_op(*args: Any) -> Any:
    """torchdata's identity for ``fn=None``: one column as it is, several as a tuple."""
    return args[0] if len(args) == 1 else args


def _selected_fn(fn: Callable[..., Any], input_col: _Col) -> Callable[[Any], Any]:
    """``fn`` applied to the ``input_col`` column(s) of each item; the result alone is returned."""
    if input_col is None:
        return fn
    if isinstance(input_col, (list, tuple)):
        cols = tuple(input_col)
        return lambda item: fn(*[item[c] for c in cols])
    return lambda item: fn(item[input_col])


# -- Mapper ----------------------------------------------------------------------------------------


def _map_raise(pipe: Mapper, it: Iterator[Any]) -> Iterator[Any]:
    fn = _item_fn(pipe)
    # The position counter is a float: CPython keeps a free list of floats but allocates every int
    # above 256, so ``n += 1.0`` costs about half of ``n += 1`` here (exact up to 2**53 items).
    n = 0.0
    try:
        for x in it:
            yield fn(x)
            n += 1.0
    except Exception as e:
        if raised_at(e, _MAP_FN_LINES):
            add_stage_note(e, stage_label(pipe), int(n))
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise


def _budget_state(local: dict[str, Any], yielding_from: Any) -> dict[str, Any]:
    """A serial map's or filter's position under a failure budget (``max_failures``), read from its
    suspended generator: the failures counted so far, so that a resumed pass gives up where the
    uninterrupted one would, and the next item's position (what the failures' notes name)."""
    return {"next": local["n"] + 1, "failures": local["failures"].count}


def _budget_start(pipe: Any, run: _pass.FrameRun | None) -> tuple[PassFailures, int]:
    """The failures of a serial skip loop's pass and the position before its first item, as a
    resumed pass continues them (``run``: the pass's FrameRun under a failure budget, else None)."""
    failures = pipe._policy.new_pass(stage_label(pipe), pipe.failures)
    if run is None:
        return failures, -1
    run.started = True
    resume = run.resume or {}
    failures.count = int(resume.get("failures", 0))
    return failures, int(resume.get("next", 0)) - 1


def _map_skip(pipe: Mapper, it: Iterator[Any], run: _pass.FrameRun | None = None) -> Iterator[Any]:
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
            yield y
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise
    finally:
        failures.end(n + 1)  # the summary of what this pass skipped (see datapipes.errors)


def _seeded_state(local: dict[str, Any], yielding_from: Any) -> dict[str, Any]:
    """A serial ``rng=`` map's position, read from its suspended generator: the pass seed and the
    position of the next item (each item's generator derives from both)."""
    return {"seed": local["seed"], "next": local["n"] + 1, **_budget_count(local)}


def _budget_count(local: dict[str, Any]) -> dict[str, int]:
    """``{"failures": count}`` for a pass under a failure budget whose loop holds its failure
    handler in the local ``fail`` (:func:`_item_fail`), else nothing."""
    failures = getattr(local.get("fail"), "__self__", None)
    if isinstance(failures, PassFailures) and failures.max_failures is not None:
        return {"failures": failures.count}
    return {}


def _seeded_start(run: _pass.FrameRun, seed: int) -> tuple[int, int]:
    """(seed, position of the first item) for a serial ``rng=`` map's pass, resumed or not."""
    run.started = True
    resume = run.resume
    if resume is None or "next" not in resume:
        return seed, 0
    return int(resume.get("seed", seed)), int(resume["next"])


def _item_fail(pipe: Any, run: _pass.FrameRun) -> Callable[[Exception, int], None]:
    """The failure handler of one pass of a per-item stage (``map(rng=)``, ``flatmap``), chosen when
    the pass starts and called in the loop's ``except`` block with the exception and the item's
    position: ``on_error="raise"`` adds the note naming the stage and raises the same object again,
    ``"skip"`` counts it in ``pipe.failures`` (raising the pass's ``ExceptionGroup`` past
    ``max_failures``) and returns, and the loop goes on."""
    label = stage_label(pipe)
    if pipe._policy.skips:
        failures = pipe._policy.new_pass(label, pipe.failures)
        # a resumed pass goes on with the failures its budget counted (read back by _budget_count)
        failures.count = int((run.resume or {}).get("failures", 0))
        return failures.skip  # type: ignore[no-any-return]

    def fail(exc: Exception, position: int) -> None:
        add_stage_note(exc, label, position)
        raise exc

    return fail


def _end_pass(fail: Callable[[Exception, int], None], seen: int) -> None:
    """End the pass of a loop whose failure handler is ``fail`` (:func:`_item_fail`), which took in
    ``seen`` items: under ``on_error="skip"``, the summary of what it skipped (see datapipes.errors)."""
    failures = getattr(fail, "__self__", None)
    if isinstance(failures, PassFailures):
        failures.end(seen)


def _map_seeded(pipe: Mapper, it: Iterator[Any], seed: int, run: _pass.FrameRun) -> Iterator[Any]:
    fn = _column_rng_fn(pipe.fn, pipe.input_col, pipe.output_col) if pipe.input_col is not None else pipe.fn
    kind = cast(str, pipe.rng)  # the seeded loop runs only with rng= set
    fail = _item_fail(pipe, run)
    seed, n = _seeded_start(run, seed)
    n -= 1
    try:
        for x in it:
            n += 1
            try:
                y = fn(x, rng=make_rng(kind, item_seed(seed, n)))
            except Exception as e:
                fail(e, n)
                continue
            yield y
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise
    finally:
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
    return concurrent_map(
        source, fn, label=label, concurrency=concurrency, ordered=pipe.ordered, executor=pipe.executor,
        timeout=pipe.timeout, chunksize=pipe.chunksize, policy=pipe._policy, log=pipe.failures, stats=stats,
        rng_kind=worker_rng, run=run.engine, hooks=_pass.task_hooks(pipe), tune=tune, owner=pipe,
    )


def _stage_concurrency(pipe: Any) -> tuple[int, Callable[..., None] | None]:
    """``(workers, tune)`` of a concurrent map/flatmap's pass: its concurrency within the pass's
    thread budget (0: inline), and for ``concurrency="auto"`` its registration with the tuner
    (a process stage with "auto" runs one worker per usable CPU as the pass read them, at most
    ``PROCESS_MAXIMUM``, untuned)."""
    if pipe.executor == "process" and pipe.concurrency == "auto":
        return process_workers(_pass.cpus_for(pipe)), None
    return _pass.concurrency_for(pipe, pipe.concurrency, pipe._thread_demand() is not None)


def _seeded(it: Iterator[Any], run: _MapRun) -> Iterator[tuple[Any, int]]:
    """``(item, its seed)`` pairs: seeds from the run's pass seed and positions, both read at the
    first ``next()`` (a resumed pass has restored them by then)."""
    yield from with_seeds(it, run.seed, lambda: run.engine.pulled)  # type: ignore[arg-type]


def _tagged(source: Iterable[Any], record: Callable[[], Any]) -> Iterator[tuple[Any, Any]]:
    """``(item, event)`` for each item of ``source``, the event recorded on the consumer's thread."""
    it = iter(source)
    try:
        for x in it:
            yield x, record()
    finally:
        close_iterator(it)  # closing this pass closes the upstream's now


def _handover_fn(fn: Callable[[Any], Any], ops: StreamOps, is_async: bool) -> Callable[[Any], Any]:
    """``fn`` for a worker thread (or the event loop) receiving ``(item, event)`` pairs: its current
    stream waits on the consumer's event and marks the item as used before ``fn`` runs, and an event
    recorded after ``fn`` goes back with the result. A worker thread sets its CUDA device to the
    consumer's before its first item; the event loop thread, shared by every async stage, is left
    as it is."""
    record, wait, mark_used = ops.record, ops.wait, ops.mark_used
    if is_async:
        async def call_async(pair: tuple[Any, Any]) -> tuple[Any, Any]:
            x, event = pair
            wait(event)
            mark_used(x)
            y = await fn(x)
            return y, record()

        return call_async

    entered = threading.local()  # worker threads set their CUDA device once, before their first item

    def call(pair: tuple[Any, Any]) -> tuple[Any, Any]:
        if not getattr(entered, "done", False):
            ops.enter_thread()
            entered.done = True
        x, event = pair
        wait(event)
        mark_used(x)
        y = fn(x)
        return y, record()

    return call


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
    out = concurrent_map(
        _tagged(source, ops.record), fn, label=label, concurrency=concurrency, ordered=pipe.ordered,
        executor=pipe.executor, timeout=pipe.timeout, chunksize=pipe.chunksize, policy=pipe._policy,
        log=pipe.failures, stats=stats, run=run.engine, hooks=_pass.task_hooks(pipe), tune=tune, owner=pipe,
    )
    return _handed_back(out, ops)


def _handed_back(out: Iterator[tuple[Any, Any]], ops: Any) -> Iterator[Any]:
    """The results of a hand-over map, each waited on by the consumer's stream before it is yielded."""
    wait, mark_used = ops.wait, ops.mark_used
    try:
        for y, event in out:
            wait(event)
            mark_used(y)
            yield y
    finally:
        close_iterator(out)  # stops the workers now, also when our consumer closes us


def _check_crossing(datapipe: Any, executor: Any) -> StreamOps | None:
    """The stream hand-over a concurrent map needs: that of a CUDA mover upstream, or None."""
    mover = cuda_upstream(datapipe)
    if mover is None:
        return None
    if executor == "process" or isinstance(executor, ProcessPoolExecutor):
        raise ValueError(
            f"Mapper: executor={executor!r} cannot run downstream of {stage_label(mover)}: CUDA tensors are not "
            "sent to worker processes; put this map before to_cuda/to_device, or run it on threads "
            "(executor='thread')"
        )
    return mover._handover_ops  # type: ignore[no-any-return]


_MAP_FN_LINES = call_lines(_map_raise)


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
            budget. With ``executor="process"``, ``"auto"`` runs one process per usable CPU, at most
            32 (``min(CPUs, 32)``). A thread stage's workers count against the pass's budget:
            beyond it the stage gets fewer (with none left, ``fn`` runs on the consumer's thread).
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
            pass stops them.
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
        chunksize: with ``executor="process"``, items per message; ``None`` picks it from the measured
            cost of ``fn`` (about 10 ms of work per chunk). With an ``Executor``, items per task
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

    _repr_fields = ("fn",)

    def __init__(
        self,
        datapipe: IterDataPipe[T],
        fn: Callable[..., U],
        input_col: _Col = None,
        output_col: _Col = None,
        *,
        on_error: str = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        concurrency: int = 1,
        ordered: bool = True,
        executor: str | Executor = "thread",
        timeout: float | None = None,
        chunksize: int | None = None,
        rng: str | None = None,
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
            if self._run is _map_seeded:  # serial: a FrameRun reads it
                run = _pass.FrameRun(_seeded_state)
                return _pass.track_generator(self, self._run(self, it, self._pass_seed(), run), run)
            return self._run(self, it, self._pass_seed())
        if self._run is _map_skip and self._policy.max_failures is not None:  # a budget: its count is saved
            run = _pass.FrameRun(_budget_state)
            return _pass.track_generator(self, _map_skip(self, it, run), run)
        return self._run(self, it)

    def __len__(self) -> int:
        return source_len(self, self.datapipe)


# -- Filter ----------------------------------------------------------------------------------------


def _filter_call(pipe: Filter) -> tuple[Callable[[Any], Any], Hashable | None]:
    """``(fn, col)`` for the filter loops: they call ``fn(x)``, or ``fn(x[col])`` with one input
    column (inlined: no wrapper call per item); several columns are passed by a wrapper."""
    col = pipe.input_col
    if isinstance(col, (list, tuple)):
        return _selected_fn(pipe.filter_fn, col), None
    return pipe.filter_fn, col


def _filter_raise(pipe: Filter, it: Iterator[Any]) -> Iterator[Any]:
    fn, col = _filter_call(pipe)
    n = 0.0  # a float counter: see _map_raise
    try:
        # The result's truth value decides, as for Python's filter(): checking that it is a bool,
        # as torch does, would cost every item of every pipe (about 10 ns, 7% of map -> filter ->
        # batch) to catch a mistake that keeps the same items anyway.
        if col is None:
            for x in it:
                if fn(x):
                    yield x
                n += 1.0
        else:
            for x in it:
                if fn(x[col]):
                    yield x
                n += 1.0
    except Exception as e:
        if raised_at(e, _FILTER_FN_LINES):
            add_stage_note(e, stage_label(pipe), int(n))
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise


def _filter_skip(pipe: Filter, it: Iterator[Any], run: _pass.FrameRun | None = None) -> Iterator[Any]:
    fn, col = _filter_call(pipe)
    failures, n = _budget_start(pipe, run)
    try:
        for x in it:
            n += 1
            try:
                keep = fn(x) if col is None else fn(x[col])
            except Exception as e:
                failures.skip(e, n)
                continue
            if keep:
                yield x
    except BaseException:
        abandon(it)
        raise
    finally:
        failures.end(n + 1)  # the summary of what this pass skipped (see datapipes.errors)


_FILTER_FN_LINES = call_lines(_filter_raise)


@functional_datapipe("filter")
class Filter(IterDataPipe[T]):
    """Keep the items for which ``filter_fn`` returns ``True`` (functional name: ``filter``).

    Args:
        datapipe: the source pipe.
        filter_fn: the predicate, called once per item. Its result is taken for its truth value, as
            Python's ``filter`` takes it (torch DataPipes raise ``ValueError`` for a result that is
            not a bool; checking would cost every item).
        input_col: apply ``filter_fn`` to this column (index or key) of each tuple/list/dict item,
            or to several columns (a list or tuple of them) as positional arguments, instead of
            to the whole item. The item itself is yielded, unchanged.
        on_error: ``"raise"`` (default) or ``"skip"`` (an item whose predicate raises is dropped
            and counted).
        max_failures: with ``on_error="skip"``, failures tolerated per pass: a number, or a float
            between 0 and 1 for a share of the items (``None``: any).
        warn_failures: with ``on_error="skip"``, past how many failures (a number, or a share:
            10% by default) a pass warns once (``None``: never); see :mod:`datapipes.errors`.

    Yields:
        The kept items, in source order.

    Raises:
        Whatever ``filter_fn`` raises, as the same object, with a note naming the stage and the
            item's position.

    ``len()`` raises ``TypeError``: how many items pass cannot be known before iterating.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(6)).filter(lambda x: x % 2 == 0))
        [0, 2, 4]
        >>> list(IterableWrapper([(1, 2, 3), (4, 5, 6)]).filter(lambda a, c: a + c < 9, input_col=[0, 2]))
        [(1, 2, 3)]
    """

    _stateless = True  # a pass's position is its source's

    _repr_fields = ("filter_fn",)

    def __init__(
        self,
        datapipe: IterDataPipe[T],
        filter_fn: Callable[..., Any],
        input_col: _Col = None,
        *,
        on_error: str = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
    ) -> None:
        require_pipe(datapipe, "Filter")
        require_callable(filter_fn, "Filter", "filter_fn")
        _check_cols(input_col, None, "Filter")
        check_arity(filter_fn, input_col, "Filter")
        self.datapipe = datapipe
        self.filter_fn = filter_fn
        self.input_col = input_col
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures)
        self._run = _filter_skip if self._policy.skips else _filter_raise

    def __iter__(self) -> Iterator[T]:
        it = iter(self.datapipe)
        if self._run is _filter_skip and self._policy.max_failures is not None:  # a budget: its count is saved
            run = _pass.FrameRun(_budget_state)
            return _pass.track_generator(self, _filter_skip(self, it, run), run)
        return self._run(self, it)

    def __len__(self) -> int:
        raise len_unknown(self, "how many items pass the filter is known only after iterating", NO_LEN)


# -- FlatMapper ------------------------------------------------------------------------------------


_LIST_ITERATORS: tuple[type, ...] = (type(iter([])), type(iter(())))


def _flatmap_state(local: dict[str, Any], yielding_from: Any) -> dict[str, Any]:
    """What a flatmap pass's generator holds when a state is taken (read by its
    :class:`~datapipes._pass.FrameRun`; the loops keep it in locals and write nothing else): the
    position of the source's next item (``next``) and, inside an item's outputs, what is left:

    - ``fn`` returned a list or tuple (or, with ``fn=None``, the item is one): the outputs left
      (``rest``: ``out[done:]``), which a resumed pass yields first;
    - any other iterable (a generator, an async generator, ...): its outputs can only be computed
      again. The item and the count of its outputs yielded are kept (``input``, ``done``); a
      resumed pass calls ``fn`` on the item again and skips that many, so ``fn`` must give the same
      outputs for the same item.

    Costs the outputs left of one item, or one item. The loops count every output (``done += 1``,
    a local: about 6 ns); telling lists from other iterables per item instead (a type check and an
    ``iter()`` call) costs about 20 ns per item, more than the count up to about four outputs per
    item and for every generator.
    """
    out, done = local["out"], local["done"]
    state: dict[str, Any] = {"next": local["n"] + 1, **_budget_count(local)}
    if type(out) is list or type(out) is tuple:
        state["rest"] = list(out[done:])
    elif type(out) in _LIST_ITERATORS:
        state["rest"] = _pass.remaining(out)
    else:
        state.update(input=local["x"], done=done)
    return state


def _flatmap_resumed(resume: dict[str, Any], call: Callable[[Any], Iterable[Any]]) -> tuple[Any, Any, int]:
    """The item a resumed pass stopped inside: ``(item, its outputs left, the count yielded before)``."""
    if "rest" in resume:
        return None, list(resume["rest"]), 0
    x, done = resume["input"], resume["done"]
    out = iter(call(x))
    next(islice(out, done, done), None)  # skip the outputs yielded before the state was taken
    return x, out, done


# Each loop keeps the locals _flatmap_state reads: ``n``, the position of the item whose outputs it
# yields; ``x``, that item; ``out``, what fn returned for it; ``done``, the outputs yielded. A
# resumed pass first yields what was left of its item.


def _flatmap(pipe: FlatMapper, it: Iterator[Any], run: _pass.FrameRun) -> Iterator[Any]:
    if pipe.fn is not None:
        fn = _selected_fn(pipe.fn, pipe.input_col)
    else:  # the item, or its column(s), is the iterable (torchdata's no-op fn)
        fn = iter if pipe.input_col is None else _selected_fn(_no_op, pipe.input_col)
    fail = _item_fail(pipe, run)
    run.started = True
    resume = run.resume
    n = -1
    try:
        if resume is not None:
            if "ended" in resume:
                return
            n = resume["next"] - 1
            if "rest" in resume or "input" in resume:
                try:
                    x, out, done = _flatmap_resumed(resume, fn)
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
        _end_pass(fail, n + 1)


def _async_outputs(fn: Callable[[Any], Any]) -> Callable[[Any], Iterator[Any]]:
    return lambda x: iterate_async(fn(x))


def _flatmap_async(pipe: FlatMapper, it: Iterator[Any], run: _pass.FrameRun) -> Iterator[Any]:
    fn = _selected_fn(cast("Callable[..., Any]", pipe.fn), pipe.input_col)  # the async loop runs only with a fn
    fail = _item_fail(pipe, run)
    run.started = True
    resume = run.resume
    n = -1
    out = None
    try:
        with LoopRef():  # one loop reference for the pass: each item's generator reuses the running loop
            if resume is not None:
                if "ended" in resume:
                    return
                n = resume["next"] - 1
                if "input" in resume:
                    try:
                        x, out, done = _flatmap_resumed(resume, _async_outputs(fn))
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
        self.engine.restore(state)
        self.resume = list(state["rest"])


def _flat_engine(pipe: Any, it: Iterator[Any], fn: Callable[[Any], Any]) -> Iterator[Any]:
    """The pass of a concurrent flatmap (or a map of a generator function): ``fn`` gives each
    item's outputs as a list on a worker; they are yielded one by one, in input order or in
    completion order."""
    label = stage_label(pipe)
    run = _FlatRun()
    _pass.track(pipe, run)
    concurrency, tune = _stage_concurrency(pipe)
    stats = _pass.stats_for(pipe, lambda: new_stats(label, fn, concurrency, pipe.executor, tune is not None))
    lists = concurrent_map(
        it, fn, label=label, concurrency=concurrency, ordered=pipe.ordered, executor=pipe.executor,
        policy=pipe._policy, log=pipe.failures, stats=stats, run=run.engine, hooks=_pass.task_hooks(pipe),
        tune=tune, owner=pipe,
    )
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

    _repr_fields = ("fn",)

    def __init__(
        self,
        datapipe: IterDataPipe[T],
        fn: Callable[..., Iterable[U]] | None = None,
        input_col: _Col = None,
        *,
        on_error: str = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        concurrency: int | str = 1,
        ordered: bool = True,
        executor: str | Executor = "thread",
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

    def __iter__(self) -> Iterator[U]:
        if self._concurrent:
            return _flat_engine(self, iter(self.datapipe), _listing_fn(self.fn, self.input_col))
        run = _pass.FrameRun(_flatmap_state)
        return _pass.track_generator(self, self._run(self, iter(self.datapipe), run), run)

    def __len__(self) -> int:
        raise len_unknown(self, "FlatMapper's length relies on the output of its function (the number of outputs per "
                                "item is known only after iterating).", "length relies on the output of its function")


# -- Collator --------------------------------------------------------------------------------------


def _collate_raise(pipe: Collator, it: Iterator[Any]) -> Iterator[Any]:
    fn = pipe.fn
    n = 0
    try:
        for batch in it:
            yield fn(batch)
            n += 1
    except Exception as e:
        if raised_at(e, _COLLATE_FN_LINES):
            add_stage_note(e, stage_label(pipe), n, what="batch")
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise


_COLLATE_FN_LINES = call_lines(_collate_raise)


@functional_datapipe("collate")
class Collator(IterDataPipe[Any]):
    """Turn each batch (a list of samples) into batched tensors (functional name: ``collate``).

    Args:
        datapipe: the source pipe, usually ``batch(n)``'s output.
        conversion: the function applied to each batch, as in torch DataPipes; ``None`` (the
            default): :func:`datapipes._collate.collate`, which stacks tensors, numpy arrays, numbers
            and PIL images (as ``(N, C, H, W)``) and keeps strings as lists, through nested tuples,
            lists, dicts, namedtuples and dataclasses. torch DataPipes' dict of per-column
            conversions (for DataFrame batches) is not supported.
        collate_fn: the function applied to each batch (give it or ``conversion``, not both).

    Yields:
        ``collate_fn(batch)`` for each batch, in order; it runs on the consumer's thread.

    Raises:
        Whatever the collate function raises, as the same object, with a note naming the stage and
            the batch's position. The default's errors name the field and the sample that disagree,
            e.g. ``collate: field 'image' (sample 3): shape (3, 224, 200) differs from (3, 224, 224) of
            sample 0``.

    ``len()`` is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([(1, "a"), (2, "b"), (3, "c")]).batch(2).collate())
        [[tensor([1, 2]), ['a', 'b']], [tensor([3]), ['c']]]

    See also: :func:`datapipes._collate.collate`, :class:`~datapipes.iter.Batcher`,
    :class:`~datapipes.iter.PinMemory`, :class:`~datapipes.iter.DeviceMover`.
    """

    _stateless = True  # a pass's position is its source's

    _repr_fields = ("fn",)

    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        conversion: Callable[[Any], Any] | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
    ) -> None:
        require_pipe(datapipe, "Collator")
        if isinstance(conversion, dict):
            raise TypeError("Collator: conversion as a dict of per-column functions (torch DataPipes' DataFrame "
                            "conversion) is not supported; pass a function as collate_fn")
        require_callable(conversion, "Collator", "conversion", optional=True)
        require_callable(collate_fn, "Collator", "collate_fn", optional=True)
        if conversion is not None and collate_fn is not None:
            raise ValueError("Collator: give collate_fn or conversion, not both")
        self.datapipe = datapipe
        self.conversion = conversion
        self.collate_fn = collate_fn
        self.fn = collate_fn if collate_fn is not None else conversion if conversion is not None else default_collate

    def __iter__(self) -> Iterator[Any]:
        return _collate_raise(self, iter(self.datapipe))

    def __len__(self) -> int:
        return source_len(self, self.datapipe)
