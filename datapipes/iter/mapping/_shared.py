"""Helpers shared by the stages of :mod:`datapipes.iter.mapping` (and by stages elsewhere that take
the same arguments: ``shuffled_flatmap``, the map-style ``map``): reading an item's columns and writing
a result back (``input_col``, ``output_col``), the checks of a stage's function and of its concurrency
arguments, the failure handling of a pass (under ``on_error="skip"`` and a failure budget), and the
number of workers a concurrent pass runs.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from abc import abstractmethod
from concurrent.futures import Executor
from types import GeneratorType
from typing import Any, Callable, Hashable, Iterator, Literal, Sequence

from ..._runtime import shares
from ..._runtime.passes import Pass
from ..._runtime.validate import check_loop_state
from ..._positions import handed_out
from ..._checks import phrased
from ..._engine import EngineRun, StageSink, StageStats, is_async_callable
from ..._engine.lifecycle import Resumable
from ..._engine.rng import check_rng
from ...datapipe import require_int, stage_label
from ...errors import PassFailures, add_stage_note, raised_at

_Col = Hashable | Sequence[Hashable] | None
#: where a concurrent stage runs its calls: a pool it starts, or an executor of the caller's
_Executor = Literal["thread", "process"] | Executor
#: the generator kinds that ``rng=`` hands a stage's function
_Rng = Literal["python", "numpy", "torch"]


# -- positions without counting --------------------------------------------------------------------

#: the generators of the serial one-to-one loops whose source tells its position, each with that
#: source's ``taken`` reader: such a loop hands out exactly the items it takes, so its consumers can
#: read their position from its source. An entry goes with its generator (a weak key).
_TOLD: weakref.WeakKeyDictionary[Any, Callable[[], int]] = weakref.WeakKeyDictionary()


def one_to_one(gen: Iterator[Any], taken: Callable[[], int]) -> Iterator[Any]:
    """``gen``, the generator of a serial loop that yields one item per item it takes from a source
    whose ``taken`` reader it holds, recorded so that :func:`taken_reader` hands that reader to its
    consumer (once per pass: nothing per item)."""
    _TOLD[gen] = taken
    return gen


def serial_failed(e: BaseException, pipe: Any, lines: frozenset[int], position: float | Callable[[], int]) -> None:
    """What a serial loop's ``except`` does before re-raising: an exception that ``fn`` raised (it
    passed through one of ``lines``, see ``errors.call_lines``) gets the note naming the stage and
    the item's position: the loop's count, or ``position()`` read only now. (A count is passed as
    it is, not in a closure: that would make it a cell, slower to add to in the loop.)"""
    if isinstance(e, Exception) and raised_at(e, lines):
        add_stage_note(e, stage_label(pipe), position() if callable(position) else int(position))


def taken_reader(it: Any) -> Callable[[], int] | None:
    """A function telling how many items ``it`` has handed out since this call, where ``it`` can tell
    without being counted; None where only counting tells.

    A serial stage names the failing item's position in its error note. Counting items costs its
    loop about 12 ns per item on CPython 3.11 and 20 ns on 3.13 (``benchmarks/overhead.py`` holds a
    ``map`` stage to 1.3x a bare generator's time), so a loop whose source can tell its own position
    reads it only when an item fails. Sources that can: the iterators of lists, tuples, strings,
    bytes and ranges (:func:`datapipes._positions.handed_out`), and the serial one-to-one loops
    (:func:`one_to_one`) over such a source.
    """
    told = handed_out(it)
    if told is not None:
        return told
    return _TOLD.get(it) if type(it) is GeneratorType else None  # only a generator can be one of ours


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
    check_rng(rng, stage)
    if is_async_callable(fn) and executor != "thread":
        raise ValueError(f"{stage}: an async fn runs on the engine's event loop; executor must be 'thread' "
                         f"(the default), got {executor!r}")
    if chunksize is not None and chunksize > 1 and executor == "thread":
        if timeout is not None:
            raise ValueError(f"{stage}: a timeout applies to one item, so a thread stage with a timeout takes "
                             f"items one by one; got chunksize={chunksize!r} with timeout={timeout!r}")
        if is_async_callable(fn):
            raise ValueError(f"{stage}: chunksize applies to worker threads and processes; an async fn runs "
                             f"on the event loop, got chunksize={chunksize!r}")


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


class _LoopRun(Resumable):
    """What the runs of these stages' serial loops share: ``loaded``, the state loaded, saved as it
    is until the pass starts (``{"next": 0}`` when none was); ``ended``, set as the loop ends
    (exhausted, failed or closed), after which the state is ``{"ended": True}``; ``budget``, the
    pass's failures under a failure budget (``max_failures``), whose count the state saves so that
    a resumed pass gives up where the uninterrupted one would. In between, :meth:`position` gives
    the state from what the loop wrote."""

    __slots__ = ("loaded", "ended", "budget")

    def __init__(self) -> None:
        super().__init__()
        self.loaded: dict[str, Any] | None = None
        self.ended = False
        self.budget: PassFailures | None = None

    def state(self) -> dict[str, Any]:
        if not self.started:
            return {"next": 0} if self.loaded is None else dict(self.loaded)
        if self.ended:
            return {"ended": True}
        return self.position()

    @abstractmethod
    def position(self) -> dict[str, Any]:
        """The state of a pass under way, the loop suspended at a ``yield``."""

    def counted(self) -> dict[str, int]:
        """``{"failures": count}`` under a failure budget, else nothing."""
        return {} if self.budget is None else {"failures": self.budget.count}

    def load(self, state: dict[str, Any]) -> None:
        self.loaded = check_loop_state(state)


class _BudgetRun(_LoopRun):
    """The position of a serial ``map`` or ``filter`` pass under a failure budget: the position of
    the item last handed out (``n``, which the loop writes before each ``yield``) and the failures
    counted so far. A pass resumed from a state that has ended starts from its source's position
    with no failures counted, as it always has."""

    __slots__ = ("n", "needs_next")

    def __init__(self, needs_next: bool = True) -> None:
        super().__init__()
        self.n = -1
        self.needs_next = needs_next

    def position(self) -> dict[str, Any]:
        return {"next": self.n + 1, "failures": self.budget.count}  # type: ignore[union-attr]

    def load(self, state: dict[str, Any]) -> None:
        self.loaded = check_loop_state(state, self.needs_next)


def _budget_start(pipe: Any, run: _BudgetRun) -> tuple[PassFailures, int]:
    """The failures of a serial skip loop's pass and the position before its first item, as a
    resumed pass continues them (``run``: the pass's run under a failure budget; a pass without one,
    which saves nothing, gets a run that is not tracked)."""
    failures = pipe._policy.new_pass(stage_label(pipe), pipe.failures)
    loaded = run.loaded or {}
    failures.count = loaded.get("failures", 0)
    run.budget = failures
    run.started = True
    return failures, loaded.get("next", 0) - 1


def _item_fail(pipe: Any, run: _LoopRun) -> Callable[[Exception, int], None]:
    """The failure handler of one pass of a per-item stage (``map(rng=)``, ``flatmap``), chosen when
    the pass starts and called in the loop's ``except`` block with the exception and the item's
    position: ``on_error="raise"`` adds the note naming the stage and raises the same object again,
    ``"skip"`` counts it in ``pipe.failures`` (raising the pass's ``ExceptionGroup`` past
    ``max_failures``) and returns, and the loop goes on. Under a failure budget, ``run`` holds the
    pass's failures (their count is saved), and a resumed pass goes on with the count it loaded."""
    label = stage_label(pipe)
    if pipe._policy.skips:
        failures = pipe._policy.new_pass(label, pipe.failures)
        failures.count = (run.loaded or {}).get("failures", 0)
        if failures.max_failures is not None:
            run.budget = failures
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


def _stage_concurrency(pipe: Any, ctx: Pass | None = None) -> tuple[int, Callable[..., None] | None]:
    """``(workers, tune)`` of a concurrent map/flatmap's pass: its concurrency within the pass's
    thread budget (0: inline), and for ``concurrency="auto"`` its registration with the tuner; a
    process stage's worker processes within the pass's process budget (``shares.processes_for``)."""
    if pipe.executor == "process":
        return shares.processes_for(pipe, pipe.concurrency, ctx)
    return shares.concurrency_for(pipe, pipe.concurrency, pipe._thread_demand() is not None, ctx)


def stage_sink(pipe: Any, ctx: Pass, stats: StageStats, run: EngineRun, tune: Callable[..., None] | None) -> StageSink:
    """Where a map/flatmap pass reports to the engine: the pipe's error policy and failure log, the
    pass's statistics and run, the pipe's task hooks, the tuner (``concurrency="auto"``), and the
    pipe as the owner of its warm worker processes."""
    return StageSink(pipe._policy, pipe.failures, stats, run, shares.task_hooks(pipe, ctx), tune, pipe)
