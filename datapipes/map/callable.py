"""Map-style Mapper [map]: ``pipe.map(fn)[index]`` is ``fn(pipe[index])``, computed on access."""

from __future__ import annotations

from typing import Any, Callable, Iterator, TypeVar, overload

from ..datapipe import MapDataPipe, functional_datapipe, index_ordered, require_callable, require_pipe, source_len, stage_label
from ..errors import add_stage_note, call_lines, raised_at
from ..iter.mapping._shared import _check_cols, _Col, _item_fn, check_arity
from ._index import index_text

__all__ = ["Mapper"]

T = TypeVar("T")
U = TypeVar("U")


def _map_iter(pipe: Mapper[Any]) -> Iterator[Any]:
    fn = pipe._fn
    n = 0
    try:
        for x in pipe.datapipe:
            yield fn(x)
            n += 1
    except Exception as e:
        if raised_at(e, _MAP_FN_LINES):
            add_stage_note(e, stage_label(pipe), n, "index")
        raise


_MAP_FN_LINES = call_lines(_map_iter)


def default_fn(data: Any) -> Any:
    """The identity: the default ``fn`` of the map-style :class:`Mapper`, as torch's (a module-level
    function, so the pipe pickles by reference)."""
    return data


@functional_datapipe("map")
class Mapper(MapDataPipe[U]):
    """Apply ``fn`` to an item when it is read (functional name: ``map``).

    Args:
        datapipe: the source map-style pipe.
        fn: the function, called on every access: ``pipe[i]`` is ``fn(datapipe[i])``. Nothing is
            cached, so reading an index twice calls ``fn`` twice. Default: the identity
            (:func:`default_fn`), as torch's.
        input_col: apply ``fn`` to this column (index or key) of each tuple/list/dict item, or to
            several columns as positional arguments. ``None``: to the whole item.
        output_col: where the result goes: ``None`` replaces the input column (several input
            columns collapse into the first), ``-1`` appends, any other index or key is written.
            Items are never mutated; a changed copy is returned. Same rules as the iterable-style
            :class:`datapipes.iter.Mapper`.

    Yields:
        ``fn(item)`` for each item of the source, in the source's order.

    Raises:
        Whatever ``fn`` raises, as the same object, with a note naming the stage and the index.
        The index is passed to the source as it is, so the source's ``IndexError`` (or
        ``KeyError`` for a keyed source) reaches the caller as the source raised it, with the
        source's note (e.g. ``SequenceWrapper at index 7``).

    ``len()`` is the source's length at call time.

    Example:
        >>> from datapipes.map import SequenceWrapper
        >>> pipe = SequenceWrapper([1, 2, 3]).map(lambda x: x * 10)
        >>> pipe[2], list(pipe)
        (30, [10, 20, 30])
        >>> SequenceWrapper([(1, "a"), (2, "b")]).map(str.upper, input_col=1)[0]
        (1, 'A')

    See also: :class:`datapipes.iter.Mapper`, the iterable-style map with an error policy.
    """

    _saves = "same as SequenceWrapper"

    _repr_fields = ("fn",)

    @overload
    def __init__(self: MapDataPipe[T], datapipe: MapDataPipe[T]) -> None: ...
    @overload
    def __init__(
        self: MapDataPipe[U],
        datapipe: MapDataPipe[T],
        fn: Callable[[T], U],
        input_col: None = ...,
        output_col: None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: MapDataPipe[Any],
        datapipe: MapDataPipe[T],
        fn: Callable[..., Any] = ...,
        input_col: _Col = ...,
        output_col: _Col | None = ...,
    ) -> None: ...
    def __init__(
        self,
        datapipe: MapDataPipe[T],
        fn: Callable[..., U] = default_fn,
        input_col: _Col = None,
        output_col: _Col = None,
    ) -> None:
        require_pipe(datapipe, "Mapper", kind=MapDataPipe)
        require_callable(fn, "Mapper", "fn")
        _check_cols(input_col, output_col, "Mapper")
        check_arity(fn, input_col, "Mapper")
        self.datapipe = datapipe
        self.fn = fn
        self.input_col = input_col
        self.output_col = output_col
        self._fn = _item_fn(self)

    def __getitem__(self, index: Any) -> U:
        item = self.datapipe[index]
        try:
            return self._fn(item)
        except Exception as e:
            add_stage_note(e, stage_label(self), index_text(index), "index")
            raise

    def __iter__(self) -> Iterator[U]:
        return _map_iter(self)

    def __len__(self) -> int:
        return source_len(self, self.datapipe)

    def _index_ordered(self) -> bool:
        return index_ordered(self.datapipe)  # fn over its source, in the source's order
