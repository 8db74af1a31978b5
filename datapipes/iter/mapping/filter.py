"""Filter [filter]: keep the items for which a predicate returns True, on the consumer's thread.

Checkpoint and resume (docs/howto/checkpoint.rst): a pass keeps nothing of its own (its position is
its source's), except under a failure budget the failures counted: its run then holds the pass's
failures, and the loop writes the position of the item it keeps to the run before each ``yield``.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Iterator, Sequence, TypeVar, overload

from ..._redact import redact
from ..._runtime.passes import Pass
from ..._engine import abandon
from ...datapipe import (
    NO_LEN,
    IterDataPipe,
    functional_datapipe,
    len_unknown,
    require_callable,
    require_pipe,
    stage_label,
)
from ...errors import WARN_FAILURES, _OnError, call_lines, policy_and_log
from ._shared import _Col, _budget_start, _BudgetRun, _check_cols, _selected_fn, check_arity, serial_failed, taken_reader

__all__ = ["Filter"]

T = TypeVar("T")


# -- Filter ----------------------------------------------------------------------------------------


def _filter_call(pipe: Filter) -> tuple[Callable[[Any], Any], Hashable | None]:
    """``(fn, col)`` for the filter loops: they call ``fn(x)``, or ``fn(x[col])`` with one input
    column (inlined: no wrapper call per item); several columns are passed by a wrapper."""
    col = pipe.input_col
    if isinstance(col, (list, tuple)):
        return _selected_fn(pipe.filter_fn, col), None
    return pipe.filter_fn, col


#: torch's words for a result that is not a bool, which end our message (code matches on them)
_TORCH_NOT_BOOL = "Boolean output is required for `filter_fn` of FilterIterDataPipe, got"


def _shown(value: Any) -> str:
    """``value``'s repr, cut at 100 characters, for a message; never raises."""
    try:
        return f"{value!r:.100}"
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the error being reported
        return f"<{type(value).__name__}>"


def _not_a_bool(pipe: Filter, result: Any, x: Any, position: int) -> ValueError:
    """The error for ``filter_fn`` returning ``result``, not a bool, for item ``x`` at ``position``:
    torch's type, our stage, item and result, then torch's phrase."""
    kind = type(result)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return ValueError(redact(
        f"{stage_label(pipe)}: filter_fn returned {_shown(result)} ({name}) for item {position} ({_shown(x)}), "
        f"not a bool: {_TORCH_NOT_BOOL} {kind}"
    ))


# The loops keep an item when filter_fn returns True, drop it on False and raise for anything else,
# as torch does (``isinstance(result, bool)``; bool has no subclasses, so two identity tests say
# it): a numpy bool, a tensor or a truthy object is refused, not taken for its truth value.


def _filter_raise(pipe: Filter, it: Iterator[Any]) -> Iterator[Any]:
    fn, col = _filter_call(pipe)
    n = 0.0  # a float counter: see map_serial._map_raise (and _filter_told, where the source tells the position)
    try:
        if col is None:
            for x in it:
                keep = fn(x)
                if keep is True:
                    yield x
                elif keep is not False:
                    raise _not_a_bool(pipe, keep, x, int(n))
                x = None  # kept or not, let go of it while the next one is made (see iter/batching.py)
                n += 1.0
        else:
            for x in it:
                keep = fn(x[col])
                if keep is True:
                    yield x
                elif keep is not False:
                    raise _not_a_bool(pipe, keep, x, int(n))
                x = None
                n += 1.0
    except BaseException as e:
        serial_failed(e, pipe, _FILTER_FN_LINES, n)
        abandon(it)
        raise


def _filter_told(pipe: Filter, it: Iterator[Any], taken: Callable[[], int]) -> Iterator[Any]:
    """``_filter_raise`` over a source that tells its own position (``taken_reader``): nothing counted."""
    fn, col = _filter_call(pipe)
    start = taken()
    try:
        if col is None:
            for x in it:
                keep = fn(x)
                if keep is True:
                    yield x
                elif keep is not False:
                    raise _not_a_bool(pipe, keep, x, taken() - start - 1)
                x = None
        else:
            for x in it:
                keep = fn(x[col])
                if keep is True:
                    yield x
                elif keep is not False:
                    raise _not_a_bool(pipe, keep, x, taken() - start - 1)
                x = None
    except BaseException as e:
        serial_failed(e, pipe, _FILTER_TOLD_FN_LINES, lambda: taken() - start - 1)
        abandon(it)
        raise


def _filter_skip(pipe: Filter, it: Iterator[Any], run: _BudgetRun) -> Iterator[Any]:
    """The loop under ``on_error="skip"``; ``run`` as in ``map``'s (``map_serial._map_skip``)."""
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
            if keep is True:
                run.n = n
                yield x
            elif keep is not False:  # a failure of this item, as if filter_fn had raised
                failures.skip(_not_a_bool(pipe, keep, x, n), n)
            x = None
    except BaseException:
        abandon(it)
        raise
    finally:
        run.ended = True
        failures.end(n + 1)  # the summary of what this pass skipped (see datapipes.errors)


_FILTER_FN_LINES = call_lines(_filter_raise)
_FILTER_TOLD_FN_LINES = call_lines(_filter_told)


@functional_datapipe("filter")
class Filter(IterDataPipe[T]):
    """Keep the items for which ``filter_fn`` returns ``True`` (functional name: ``filter``).

    Args:
        datapipe: the source pipe.
        filter_fn: the predicate, called once per item. It must return a bool, ``True`` to keep the
            item, ``False`` to drop it, as torch's ``filter`` requires: any other result (``1``,
            ``None``, a numpy bool, a tensor) raises ``ValueError`` rather than being taken for its
            truth value. Wrap it (``bool(...)``, ``.item()``) where that is what you mean.
        input_col: apply ``filter_fn`` to this column (index or key) of each tuple/list/dict item,
            or to several columns (a list or tuple of them) as positional arguments, instead of
            to the whole item. The item itself is yielded, unchanged.
        on_error: ``"raise"`` (default) or ``"skip"`` (an item whose predicate raises, or returns
            something else than a bool, is dropped and counted).
        max_failures: with ``on_error="skip"``, failures tolerated per pass: a number, or a float
            between 0 and 1 for a share of the items (``None``: any).
        warn_failures: with ``on_error="skip"``, past how many failures (a number, or a share:
            10% by default) a pass warns once (``None``: never); see :mod:`datapipes.errors`.

    Yields:
        The kept items, in source order.

    Raises:
        ValueError: (while iterating) ``filter_fn`` returned something else than a bool; the
            message names the stage, the item's position and value, and the result and its type,
            and ends with torch's phrase "Boolean output is required for `filter_fn` of
            FilterIterDataPipe, got <type>".
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

    _saves = "nothing: at a boundary their position is their source's"

    _stateless = True  # a pass's position is its source's

    _repr_fields = ("filter_fn",)

    @overload
    def __init__(
        self: Filter[T],
        datapipe: IterDataPipe[T],
        filter_fn: Callable[[T], object],
        input_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: Filter[T],
        datapipe: IterDataPipe[T],
        filter_fn: Callable[..., object],
        input_col: Hashable | Sequence[Hashable],
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> None: ...
    def __init__(
        self,
        datapipe: IterDataPipe[T],
        filter_fn: Callable[..., Any],
        input_col: _Col = None,
        *,
        on_error: _OnError = "raise",
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

    def _open(self, ctx: Pass) -> Iterator[T]:
        it = ctx.open(self.datapipe)
        if self._run is _filter_skip:
            run = _BudgetRun(needs_next=False)
            if self._policy.max_failures is not None:  # a budget: its count is saved
                ctx.track(self, run)
            return _filter_skip(self, it, run)
        taken = taken_reader(it)
        if taken is not None:
            return _filter_told(self, it, taken)
        return _filter_raise(self, it)

    def __len__(self) -> int:
        raise len_unknown(self, "how many items pass the filter is known only after iterating", NO_LEN)
