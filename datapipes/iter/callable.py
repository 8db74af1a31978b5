"""Stages that call a user function per item: Mapper [map], Filter [filter], FlatMapper [flatmap].

Every one of them follows the shared error policy (:mod:`datapipes.errors`): by default the first
failure reaches the consumer as the user's own exception object with a note naming the stage and the
item's position; ``on_error="skip"`` drops failing items and counts them in ``pipe.failures``.

The hot loops are bare generators chosen once at construction: no per-item branching on options.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable, Iterator, Sequence, TypeVar

from ..datapipe import IterDataPipe, functional_datapipe, len_unknown, require_callable, require_pipe, stage_label
from ..errors import ErrorPolicy, FailureLog, add_stage_note, call_lines, raised_at

__all__ = ["Mapper", "Filter", "FlatMapper"]

T = TypeVar("T")
U = TypeVar("U")

_Col = Hashable | Sequence[Hashable] | None


def _check_cols(input_col: _Col, output_col: _Col, stage: str) -> None:
    if input_col is None and output_col is not None:
        raise ValueError(f"{stage}: output_col must be None when input_col is None, got output_col={output_col!r}")
    if isinstance(output_col, (list, tuple)):
        if len(output_col) != 1:
            raise ValueError(f"{stage}: output_col must be a single column, got {output_col!r}")
    if isinstance(input_col, (list, tuple)) and len(input_col) == 0:
        raise ValueError(f"{stage}: input_col must name at least one column, got {input_col!r}")


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
        out = list(item) if is_tuple else item.copy()
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


def _selected_fn(fn: Callable[..., Any], input_col: _Col) -> Callable[[Any], Any]:
    """``fn`` applied to the ``input_col`` column(s) of each item; the result alone is returned."""
    if input_col is None:
        return fn
    if isinstance(input_col, (list, tuple)):
        cols = tuple(input_col)
        return lambda item: fn(*[item[c] for c in cols])
    return lambda item: fn(item[input_col])


# -- Mapper ----------------------------------------------------------------------------------------


def _map_raise(pipe: Mapper) -> Iterator[Any]:
    fn = _item_fn(pipe)
    n = 0
    try:
        for x in pipe.datapipe:
            yield fn(x)
            n += 1
    except Exception as e:
        if raised_at(e, _MAP_FN_LINES):
            add_stage_note(e, stage_label(pipe), n)
        raise


def _map_skip(pipe: Mapper) -> Iterator[Any]:
    fn = _item_fn(pipe)
    failures = pipe._policy.new_pass(stage_label(pipe), pipe.failures)
    n = -1
    for x in pipe.datapipe:
        n += 1
        try:
            y = fn(x)
        except Exception as e:
            failures.skip(e, n)
            continue
        yield y


_MAP_FN_LINES = call_lines(_map_raise)


@functional_datapipe("map")
class Mapper(IterDataPipe[U]):
    """Apply ``fn`` to every item (functional name: ``map``).

    Args:
        datapipe: the source pipe.
        fn: the function, called once per item on the consumer's thread.
        input_col: apply ``fn`` to this column (index or key) of each tuple/list/dict item, or to
            several columns as positional arguments. ``None``: to the whole item.
        output_col: where the result goes: ``None`` replaces the input column (several input
            columns collapse into the first), ``-1`` appends, any other index or key is written.
            Input items are never mutated; a changed copy is yielded.
        on_error: ``"raise"`` (default) or ``"skip"``, see :mod:`datapipes.errors`.
        max_failures: with ``on_error="skip"``, failures tolerated per pass (``None``: any).

    Yields:
        ``fn(item)`` for each item, in source order.

    Raises:
        Whatever ``fn`` raises, as the same object, with a note naming the stage and the item's
        position; an ``ExceptionGroup`` once ``max_failures`` is exceeded.

    ``len()`` is the source's length.

    >>> from datapipes.iter import IterableWrapper
    >>> list(IterableWrapper([1, 2, 3]).map(lambda x: x * 2))
    [2, 4, 6]
    >>> list(IterableWrapper([(1, "a"), (2, "b")]).map(str.upper, input_col=1))
    [(1, 'A'), (2, 'B')]

    See also: :class:`FlatMapper` for one-to-many functions, :class:`Filter`.
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
        max_failures: int | None = None,
    ) -> None:
        require_pipe(datapipe, "Mapper")
        require_callable(fn, "Mapper", "fn")
        _check_cols(input_col, output_col, "Mapper")
        self.datapipe = datapipe
        self.fn = fn
        self.input_col = input_col
        self.output_col = output_col
        self._policy = ErrorPolicy(on_error, max_failures)
        self._run = _map_skip if self._policy.skips else _map_raise
        self.failures = FailureLog()

    def __iter__(self) -> Iterator[U]:
        return self._run(self)

    def __len__(self) -> int:
        return len(self.datapipe)  # type: ignore[arg-type]


# -- Filter ----------------------------------------------------------------------------------------


def _filter_raise(pipe: Filter) -> Iterator[Any]:
    fn = pipe.filter_fn
    col = pipe.input_col
    n = 0
    try:
        if col is None:
            for x in pipe.datapipe:
                if fn(x):
                    yield x
                n += 1
        else:
            for x in pipe.datapipe:
                if fn(x[col]):
                    yield x
                n += 1
    except Exception as e:
        if raised_at(e, _FILTER_FN_LINES):
            add_stage_note(e, stage_label(pipe), n)
        raise


def _filter_skip(pipe: Filter) -> Iterator[Any]:
    fn = pipe.filter_fn
    col = pipe.input_col
    failures = pipe._policy.new_pass(stage_label(pipe), pipe.failures)
    n = -1
    for x in pipe.datapipe:
        n += 1
        try:
            keep = fn(x) if col is None else fn(x[col])
        except Exception as e:
            failures.skip(e, n)
            continue
        if keep:
            yield x


_FILTER_FN_LINES = call_lines(_filter_raise)


@functional_datapipe("filter")
class Filter(IterDataPipe[T]):
    """Keep the items for which ``filter_fn`` is true (functional name: ``filter``).

    Args:
        datapipe: the source pipe.
        filter_fn: the predicate, called once per item; its result is taken for its truth value.
        input_col: apply ``filter_fn`` to this column (index or key) of each item instead.
        on_error: ``"raise"`` (default) or ``"skip"`` (an item whose predicate raises is dropped
            and counted).
        max_failures: with ``on_error="skip"``, failures tolerated per pass (``None``: any).

    Yields:
        The kept items, in source order.

    ``len()`` raises ``TypeError``: how many items pass cannot be known before iterating.

    >>> from datapipes.iter import IterableWrapper
    >>> list(IterableWrapper(range(6)).filter(lambda x: x % 2 == 0))
    [0, 2, 4]
    """

    _repr_fields = ("filter_fn",)

    def __init__(
        self,
        datapipe: IterDataPipe[T],
        filter_fn: Callable[[Any], Any],
        input_col: Hashable | None = None,
        *,
        on_error: str = "raise",
        max_failures: int | None = None,
    ) -> None:
        require_pipe(datapipe, "Filter")
        require_callable(filter_fn, "Filter", "filter_fn")
        if isinstance(input_col, (list, tuple)):
            raise ValueError(f"Filter: input_col must be a single column, got {input_col!r}")
        self.datapipe = datapipe
        self.filter_fn = filter_fn
        self.input_col = input_col
        self._policy = ErrorPolicy(on_error, max_failures)
        self._run = _filter_skip if self._policy.skips else _filter_raise
        self.failures = FailureLog()

    def __iter__(self) -> Iterator[T]:
        return self._run(self)

    def __len__(self) -> int:
        raise len_unknown(self, "how many items pass the filter is known only after iterating")


# -- FlatMapper ------------------------------------------------------------------------------------


def _flatmap_raise(pipe: FlatMapper) -> Iterator[Any]:
    fn = _selected_fn(pipe.fn, pipe.input_col) if pipe.fn is not None else iter
    n = 0
    try:
        for x in pipe.datapipe:
            yield from fn(x)
            n += 1
    except Exception as e:
        if raised_at(e, _FLATMAP_FN_LINES):
            add_stage_note(e, stage_label(pipe), n)
        raise


def _flatmap_skip(pipe: FlatMapper) -> Iterator[Any]:
    fn = _selected_fn(pipe.fn, pipe.input_col) if pipe.fn is not None else iter
    failures = pipe._policy.new_pass(stage_label(pipe), pipe.failures)
    n = -1
    for x in pipe.datapipe:
        n += 1
        try:
            for y in fn(x):
                yield y
        except Exception as e:
            failures.skip(e, n)


_FLATMAP_FN_LINES = call_lines(_flatmap_raise)


@functional_datapipe("flatmap")
class FlatMapper(IterDataPipe[U]):
    """Apply ``fn`` to every item and yield each element of the iterable it returns
    (functional name: ``flatmap``).

    Args:
        datapipe: the source pipe.
        fn: a function returning an iterable (a list, a generator, ...). ``None``: each item is
            itself an iterable and is flattened one level.
        input_col: apply ``fn`` to this column (or these columns) of each item, as in
            :class:`Mapper`; ``fn`` then returns the iterable.
        on_error: ``"raise"`` (default) or ``"skip"``. When skipping, a failure while iterating
            ``fn``'s result drops the rest of that item's outputs; what it already yielded stays.
        max_failures: with ``on_error="skip"``, failures tolerated per pass (``None``: any).

    Yields:
        The elements of ``fn(item)`` for each item, in order.

    ``len()`` raises ``TypeError``: the number of outputs per item is not known in advance.

    >>> from datapipes.iter import IterableWrapper
    >>> list(IterableWrapper([1, 2, 3]).flatmap(lambda x: [x] * x))
    [1, 2, 2, 3, 3, 3]
    """

    _repr_fields = ("fn",)

    def __init__(
        self,
        datapipe: IterDataPipe[T],
        fn: Callable[..., Iterable[U]] | None = None,
        input_col: _Col = None,
        *,
        on_error: str = "raise",
        max_failures: int | None = None,
    ) -> None:
        require_pipe(datapipe, "FlatMapper")
        require_callable(fn, "FlatMapper", "fn", optional=True)
        if fn is None and input_col is not None:
            raise ValueError("FlatMapper: input_col needs a fn")
        self.datapipe = datapipe
        self.fn = fn
        self.input_col = input_col
        self._policy = ErrorPolicy(on_error, max_failures)
        self._run = _flatmap_skip if self._policy.skips else _flatmap_raise
        self.failures = FailureLog()

    def __iter__(self) -> Iterator[U]:
        return self._run(self)

    def __len__(self) -> int:
        raise len_unknown(self, "the number of outputs per item is known only after iterating")
