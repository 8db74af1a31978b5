"""Stages that reshape each item of one source, or the stream around it: IndexAdder [add_index],
Repeater [repeat], Slicer [slice], Flattener [flatten], Dropper [drop], LengthSetter [set_length], and
torchdata's Rows2Columnar [rows2columnar] (each batch of rows as columns; torchdata 0.9's names,
parameters and outputs, the differences listed in its docstring).

Every ``_open(ctx)`` creates its source's iterator at once (``ctx.open``), as part of the pass it
is handed (:mod:`datapipes._runtime.passes`), and hands it to a module-level generator that does the
work (``set_length`` returns the source's own iterator).

Checkpoint and resume (``it.state_dict()``): ``slice``, ``flatten``, ``drop``, ``set_length`` and
``rows2columnar`` keep nothing of their own (their position is their source's); ``add_index`` saves
the next index; ``repeat`` the item being repeated and the repetitions left, which its loop writes
once per item read (the item and the ``itertools.repeat`` it yields from, whose ``length_hint`` is
read when a state is taken).
"""

from __future__ import annotations

import copy as _copy
import itertools
from collections import defaultdict
from operator import length_hint
from typing import Any, Callable, Hashable, Iterable, Iterator, Sequence, TypeVar

from .._runtime.passes import Pass
from .._runtime.validate import check_loop_state, invalid
from .._positions import Enumerated
from .._engine import abandon
from .._engine.lifecycle import Resumable
from ..datapipe import IterDataPipe, functional_datapipe, require_int, require_pipe, source_len, stage_label
from ..errors import add_stage_note, call_lines, raised_at
from ._shared import _warn
from .util import _EnumerateRun

__all__ = ["Dropper", "Flattener", "IndexAdder", "LengthSetter", "Repeater", "Rows2Columnar", "Slicer"]

T = TypeVar("T")


# -- IndexAdder ------------------------------------------------------------------------------------


def _add_index(pipe: IndexAdder, it: Iterator[Any], run: _EnumerateRun) -> Iterator[dict[Any, Any]]:
    name = pipe.index_name
    run.started = True
    run.counter = counter = Enumerated(it, run.start)
    try:
        for i, row in counter:
            if type(row) is dict:
                row = row.copy()
            elif isinstance(row, dict):
                row = _copy.copy(row)  # keeps the subclass (OrderedDict, defaultdict, ...)
            else:
                raise NotImplementedError(
                    f"{stage_label(pipe)}, item {i} ({type(row).__name__}): We only support adding index to row or "
                    "batch in dict type"
                )
            row[name] = i
            yield row
    except BaseException:
        abandon(it)
        raise
    finally:  # ended, closed or dropped: the run keeps the count and lets go of the source
        run.start = counter.count()
        run.counter = None


@functional_datapipe("add_index")
class IndexAdder(IterDataPipe[dict[Any, Any]]):
    """Add each item's position to it under the key ``index_name`` (functional name: ``add_index``).
    The items must be dicts (rows, or batches in dict form).

    Args:
        source_datapipe: a pipe of dicts.
        index_name: the key the position is stored under (default ``"index"``); an existing key of
            that name is overwritten.

    Yields:
        A shallow copy of each dict with ``copy[index_name] = position`` (0, 1, ...). Unlike
        torchdata, the source's dicts are not changed in place, so a second pass over a list or a
        cache sees them as they were.

    Raises:
        TypeError: ``index_name`` is not hashable.
        NotImplementedError: (while iterating) an item is not a dict (torch's type and phrase).

    ``len()`` is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([{"a": 1}, {"a": 2}]).add_index("order"))
        [{'a': 1, 'order': 0}, {'a': 2, 'order': 1}]

    See also: :class:`Enumerator` for ``(index, item)`` pairs.
    """

    _saves = "same as enumerate"

    _repr_fields = ("index_name",)

    def __init__(self, source_datapipe: IterDataPipe[dict[Any, Any]], index_name: Hashable = "index") -> None:
        require_pipe(source_datapipe, "IndexAdder", "source_datapipe")
        try:
            hash(index_name)
        except TypeError:
            raise TypeError(f"IndexAdder: index_name must be hashable (a dict key), got {type(index_name).__name__}") from None
        self.source_datapipe = source_datapipe
        self.index_name = index_name

    def _open(self, ctx: Pass) -> Iterator[dict[Any, Any]]:
        run = _EnumerateRun(0)
        it = _add_index(self, ctx.open(self.source_datapipe), run)
        ctx.track(self, run)
        return it

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")


# -- Repeater --------------------------------------------------------------------------------------


#: the repetitions of a pass that has none left: none
_NONE_LEFT: Iterator[Any] = itertools.repeat(None, 0)


def _check_repeat_state(state: dict[str, Any]) -> None:
    """The checks of a ``repeat`` pass's state: ``ended`` (True), or the repetitions left (an int
    >= 0; none when absent) and, where some are, the item (any value)."""
    check_loop_state(state, needs_next=False)
    if "ended" not in state and state.get("left") and "item" not in state:
        invalid("the state has no 'item'")


class _RepeatRun(Resumable):
    """The position of a ``repeat`` pass: the item being repeated (``item``) and the repetitions
    left, read from the ``itertools.repeat`` the loop yields it from (``repeats``, by
    ``length_hint``); the loop writes both once per item read. A pass that has ended saves
    ``{"ended": True}``."""

    __slots__ = ("loaded", "ended", "item", "repeats")

    def __init__(self) -> None:
        super().__init__()
        self.loaded: dict[str, Any] | None = None  # the state loaded, saved as it is until the pass starts
        self.ended = False
        self.item: Any = None
        self.repeats: Iterator[Any] = _NONE_LEFT  # a resumed pass's: the repetitions it yields first

    def state(self) -> dict[str, Any]:
        if not self.started:
            return {"next": 0} if self.loaded is None else dict(self.loaded)
        if self.ended:
            return {"ended": True}
        left = length_hint(self.repeats)
        return {"item": self.item, "left": left} if left else {"left": 0}

    def load(self, state: dict[str, Any]) -> None:
        _check_repeat_state(state)
        self.loaded, self.ended = state, "ended" in state
        left = state.get("left", 0)
        if not self.ended and left:
            self.item = state["item"]
            self.repeats = itertools.repeat(self.item, left)


def _repeat(it: Iterator[Any], times: int, run: _RepeatRun) -> Iterator[Any]:
    repeat = itertools.repeat
    run.started = True
    try:
        if run.ended:
            return
        yield from run.repeats
        for x in it:
            run.item = x
            run.repeats = repeats = repeat(x, times)
            yield from repeats
    except BaseException:
        abandon(it)
        raise
    finally:
        run.ended = True
        run.item, run.repeats = None, _NONE_LEFT  # let go of the item with the pass's frame


@functional_datapipe("repeat")
class Repeater(IterDataPipe[T]):
    """Yield each item ``times`` times before moving on to the next (functional name: ``repeat``).

    Args:
        source_datapipe: the source pipe.
        times: how many times each item is yielded, an int > 1.

    Yields:
        ``a, a, ..., b, b, ...``: the very same object each time (no copy is made).

    Raises:
        TypeError / ValueError: ``times`` is not an int > 1 (torch's phrase "The number of
            repetition must be > 1").

    ``len()`` is ``times * len(source)``.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(3)).repeat(2))
        [0, 0, 1, 1, 2, 2]

    See also: :class:`Cycler` to repeat the whole pass instead.
    """

    _saves = "the item being repeated and the repetitions left"

    _repr_fields = ("times",)

    def __init__(self, source_datapipe: IterDataPipe[T], times: int) -> None:
        require_pipe(source_datapipe, "Repeater", "source_datapipe")
        require_int(times, "Repeater", "times")
        if times <= 1:
            raise ValueError(f"Repeater: The number of repetition must be > 1, got {times}")
        self.source_datapipe = source_datapipe
        self.times = times

    def _open(self, ctx: Pass) -> Iterator[T]:
        it = ctx.open(self.source_datapipe)
        run = _RepeatRun()
        ctx.track(self, run)
        return _repeat(it, self.times, run)

    def __len__(self) -> int:
        return self.times * source_len(self, self.source_datapipe, "source_datapipe")


# -- Slicer, Flattener, Dropper: reshaping each item ------------------------------------------------


def _each(pipe: Any, fn: Callable[[Any], Any], it: Iterator[Any]) -> Iterator[Any]:
    """``fn(item)`` for each item; an error from ``fn`` gets a note naming the stage and the item."""
    n = 0
    try:
        for x in it:
            yield fn(x)
            n += 1
    except Exception as e:
        if raised_at(e, _EACH_LINES):
            add_stage_note(e, stage_label(pipe), n)
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise


_EACH_LINES = call_lines(_each, "fn")


def _indices(value: Any) -> list[Any]:
    """torchdata's reading of an ``indices`` argument: a list is several, anything else one."""
    return list(value) if isinstance(value, list) else [value]


def _check_hashable(stage: str, name: str, values: list[Any]) -> None:
    for v in values:
        try:
            hash(v)
        except TypeError:
            raise TypeError(f"{stage}: {name} must hold indices or keys (hashable), got a {type(v).__name__}") from None


def _positions(indices: list[Any]) -> Callable[[int], frozenset[Any]]:
    """The positions ``indices`` name in a sequence of length ``n`` (negative ints count from the end)."""
    fixed = frozenset(indices)
    if not any(type(i) is int and i < 0 for i in indices):
        return lambda n: fixed
    return lambda n: frozenset(i + n if type(i) is int and i < 0 else i for i in indices)


def _missing(x: Any, indices: list[Any]) -> bool:
    """Whether an index or key of ``indices`` is absent from the item ``x`` (a sequence or a dict)."""
    if isinstance(x, dict):
        return any(i not in x for i in indices)
    n = len(x)
    return any(not (type(i) is int and -n <= i < n) for i in indices)


_MISSING_WARNING = ("At least one index in the filter is not present in the item being returned, "
                    "please be aware that expected columns/keys may be missing.")
_NOT_ITERABLE_WARNING = ("The next item was not an iterable and cannot be filtered, "
                         "please be aware that no filter was done or new item created.")


def _slicer_fn(pipe: Slicer[Any]) -> Callable[[Any], Any]:
    label = stage_label(pipe)
    index, stop, step = pipe.index, pipe.stop, pipe.step
    if isinstance(index, list):
        wanted = list(index)
        keys = frozenset(wanted)
        positions = _positions(wanted)

        def pick(x: Any) -> Any:
            if isinstance(x, (tuple, list)):
                keep = positions(len(x))
                picked = [v for j, v in enumerate(x) if j in keep]
                out: Any = tuple(picked) if isinstance(x, tuple) else picked
            elif isinstance(x, dict):
                out = {k: v for k, v in x.items() if k in keys}
            else:
                _warn(f"{label}: {_NOT_ITERABLE_WARNING}")
                return x
            if _missing(x, wanted):
                _warn(f"{label}: {_MISSING_WARNING}")
            return out

        return pick

    def cut(x: Any) -> Any:
        if isinstance(x, (tuple, list)):
            return x[index:stop:step]
        if isinstance(x, dict):
            if index in x:
                return {index: x[index]}
            _warn(f"{label}: Dictionaries are not sliced by steps, only direct index. "
                  "Please be aware that no filter was done or new item created.")
            return x
        _warn(f"{label}: {_NOT_ITERABLE_WARNING}")
        return x

    return cut


@functional_datapipe("slice")
class Slicer(IterDataPipe[T]):
    """Slice each item, or pick some of its columns (functional name: ``slice``).

    Args:
        datapipe: a pipe of tuples, lists or dicts.
        index: an int: the start of the slice ``item[index:stop:step]`` of a tuple or list, or the
            one key kept of a dict; a list: the positions (of a tuple or list; negative ones count
            from the end) or keys (of a dict) kept, in the item's order.
        stop: the end of the slice (ignored with a list ``index``, or for dicts).
        step: the step of the slice (ignored with a list ``index``, or for dicts).

    Yields:
        A new tuple, list or dict per item (a tuple for a tuple, a list for a list). An item of
        another type, or a dict without the key ``index``, passes unchanged with a warning, as in
        torchdata; a list ``index`` naming a column an item lacks gives a warning too.

    Raises:
        TypeError: ``stop`` or ``step`` is not an int or None; ``index`` holds unhashable values.
        Whatever slicing an item raises (``TypeError`` for a non-int ``index`` on a tuple), as the
        same object, with a note naming the stage and the item's position.

    A list ``index`` with a ``stop`` or ``step`` warns at construction that they are ignored.

    ``len()`` is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([(0, 10, 100), (1, 11, 111)]).slice(0, 2))
        [(0, 10), (1, 11)]
        >>> list(IterableWrapper([(0, 10, 100), (1, 11, 111)]).slice([0, -1]))
        [(0, 100), (1, 111)]
        >>> list(IterableWrapper([{"a": 1, "b": 2}]).slice(["a"]))
        [{'a': 1}]

    See also: :class:`Dropper` to drop columns, :class:`Flattener`.
    """

    _saves = "nothing: at a boundary their position is their source's"

    _stateless = True  # one item per item
    _repr_fields = ("index",)

    def __init__(
        self, datapipe: IterDataPipe[T], index: int | list[Hashable], stop: int | None = None, step: int | None = None
    ) -> None:
        require_pipe(datapipe, "Slicer")
        require_int(stop, "Slicer", "stop", optional=True)
        require_int(step, "Slicer", "step", optional=True)
        if step == 0:
            raise ValueError("Slicer: step must not be 0 (slice step cannot be zero)")
        _check_hashable("Slicer", "index", _indices(index))
        if isinstance(index, list) and (stop is not None or step is not None):
            _warn("Slicer: A list of indices was passed as well as a stop or step for the slice, these arguments "
                  "can't be used together so only the indices list will be used.")
        self.datapipe = datapipe
        self.index = index
        self.stop = stop
        self.step = step

    def _open(self, ctx: Pass) -> Iterator[T]:
        return _each(self, _slicer_fn(self), ctx.open(self.datapipe))

    def __len__(self) -> int:
        return source_len(self, self.datapipe)


_SAME_KEY_WARNING = ("Flattener tried to insert the same key twice into the dict item, "
                     "the second key,value pair has been dropped.")


def _flattener_fn(pipe: Flattener[Any]) -> Callable[[Any], Any]:
    label = stage_label(pipe)
    wanted = None if pipe.indices is None else _indices(pipe.indices)
    if wanted == []:
        wanted = None
    keys = frozenset(wanted or ())
    positions = _positions(wanted or [])
    every = wanted is None

    def flatten(x: Any) -> Any:
        if isinstance(x, dict):
            out: Any = {}
            for k, v in x.items():
                if (every or k in keys) and isinstance(v, dict):
                    for k_sub, v_sub in v.items():
                        if k_sub in x or k_sub in out:
                            _warn(f"{label}: {_SAME_KEY_WARNING}")
                        else:
                            out[k_sub] = v_sub
                elif k in out:
                    _warn(f"{label}: {_SAME_KEY_WARNING}")
                else:
                    out[k] = v
        elif isinstance(x, (tuple, list)):
            keep = positions(len(x))
            out = []
            for j, v in enumerate(x):
                if (every or j in keep) and isinstance(v, (tuple, list)):
                    out.extend(v)
                else:
                    out.append(v)
            if isinstance(x, tuple):
                out = tuple(out)
        else:
            raise TypeError(f"{label}: the item is a {type(x).__name__}; flatten takes tuples, lists and dicts")
        if wanted is not None and _missing(x, wanted):
            _warn(f"{label}: {_MISSING_WARNING}")
        return out

    return flatten


@functional_datapipe("flatten")
class Flattener(IterDataPipe[T]):
    """Flatten one level of nesting inside each item (functional name: ``flatten``).

    Args:
        datapipe: a pipe of tuples, lists or dicts.
        indices: which elements to flatten: a position of a tuple or list (negative ones count from
            the end) or a key of a dict, or a list of them; ``None`` (default): every element.

    Yields:
        Per item, a new item of its kind: in a tuple or list, each selected element that is a
        tuple or list is replaced by its elements; in a dict, each selected value that is a dict
        is replaced by its key-value pairs. A key already in the item is kept and the nested pair
        dropped, with a warning; so is a key that an earlier nested dict brought in (torchdata
        lets the later one overwrite it). An index an item lacks gives a warning.

    Raises:
        TypeError: ``indices`` holds unhashable values; (while iterating) an item is not a tuple,
            list or dict, with a note naming the stage and its position (torchdata turns a string
            into a list of its characters, and fails on other types).

    ``indices=0`` flattens element 0 (torchdata reads a falsy ``indices`` as every element).

    ``len()`` is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([(0, 10, (100, 1000)), (1, 11, (111, 1001))]).flatten(2))
        [(0, 10, 100, 1000), (1, 11, 111, 1001)]
        >>> list(IterableWrapper([{"a": 1, "b": {"c": 2, "d": 3}}]).flatten())
        [{'a': 1, 'c': 2, 'd': 3}]

    See also: :class:`Slicer`, :class:`Dropper`, :class:`Unbatcher` to flatten the stream itself.
    """

    _saves = "nothing: at a boundary their position is their source's"

    _stateless = True  # one item per item
    _repr_fields = ("indices",)

    def __init__(self, datapipe: IterDataPipe[T], indices: Hashable | list[Hashable] | None = None) -> None:
        require_pipe(datapipe, "Flattener")
        if indices is not None:
            _check_hashable("Flattener", "indices", _indices(indices))
        self.datapipe = datapipe
        self.indices = indices

    def _open(self, ctx: Pass) -> Iterator[T]:
        return _each(self, _flattener_fn(self), ctx.open(self.datapipe))

    def __len__(self) -> int:
        return source_len(self, self.datapipe)


def _dropper_fn(pipe: Dropper[Any]) -> Callable[[Any], Any]:
    label = stage_label(pipe)
    wanted = _indices(pipe.indices)
    keys = frozenset(wanted)
    positions = _positions(wanted)

    def drop(x: Any) -> Any:
        if isinstance(x, (tuple, list)):
            gone = positions(len(x))
            kept = [v for j, v in enumerate(x) if j not in gone]
            out: Any = tuple(kept) if isinstance(x, tuple) else kept
        elif isinstance(x, dict):
            out = {k: v for k, v in x.items() if k not in keys}
        else:
            _warn(f"{label}: {_NOT_ITERABLE_WARNING}")
            return x
        if _missing(x, wanted):
            _warn(f"{label}: {_MISSING_WARNING}")
        return out

    return drop


@functional_datapipe("drop")
class Dropper(IterDataPipe[T]):
    """Drop some columns of each item (functional name: ``drop``).

    Args:
        datapipe: a pipe of tuples, lists or dicts.
        indices: a position (of a tuple or list; negative ones count from the end) or a key (of a
            dict), or a list of them.

    Yields:
        Per item, a new item of its kind without those columns. An item of another type passes
        unchanged with a warning, as in torchdata; so does an index an item lacks.

    Raises:
        TypeError: ``indices`` holds unhashable values.

    ``len()`` is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([(0, 10, 100), (1, 11, 111)]).drop([0, -1]))
        [(10,), (11,)]
        >>> list(IterableWrapper([{"a": 1, "b": 2}]).drop("a"))
        [{'b': 2}]

    See also: :class:`Slicer` to keep columns instead.
    """

    _saves = "nothing: at a boundary their position is their source's"

    _stateless = True  # one item per item
    _repr_fields = ("indices",)

    def __init__(self, datapipe: IterDataPipe[T], indices: Hashable | list[Hashable]) -> None:
        require_pipe(datapipe, "Dropper")
        _check_hashable("Dropper", "indices", _indices(indices))
        self.datapipe = datapipe
        self.indices = indices

    def _open(self, ctx: Pass) -> Iterator[T]:
        return _each(self, _dropper_fn(self), ctx.open(self.datapipe))

    def __len__(self) -> int:
        return source_len(self, self.datapipe)


# -- LengthSetter ----------------------------------------------------------------------------------


@functional_datapipe("set_length")
class LengthSetter(IterDataPipe[T]):
    """Give the pipe a ``len()`` of your choosing (functional name: ``set_length``), for stages
    whose length cannot be known in advance (``filter``, ``flatmap``) when you know it.

    Args:
        source_datapipe: the source pipe.
        length: what ``len()`` returns, an int >= 0.

    Yields:
        The source's items, all of them: unlike :class:`Header`, nothing is cut at ``length``.

    Raises:
        TypeError / ValueError: ``length`` is not an int >= 0.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper(range(10)).filter(lambda x: x < 5).set_length(5)
        >>> list(pipe), len(pipe)
        ([0, 1, 2, 3, 4], 5)

    See also: :class:`Header` to also cut the pass at a length.
    """

    _saves = "nothing: at a boundary their position is their source's"

    _stateless = True  # the source's own iterator: its position is the source's
    _repr_fields = ("length",)

    def __init__(self, source_datapipe: IterDataPipe[T], length: int) -> None:
        require_pipe(source_datapipe, "LengthSetter", "source_datapipe")
        require_int(length, "LengthSetter", "length", minimum=0, torch_assert="length must be >= 0")  # torchdata asserts
        self.source_datapipe = source_datapipe
        self.length = length

    def _open(self, ctx: Pass) -> Iterator[T]:
        return ctx.open(self.source_datapipe)

    def __len__(self) -> int:
        return self.length


# -- Rows2Columnar ---------------------------------------------------------------------------------


def _columnar(batch: Iterable[Any], names: list[Any], ordered: bool = True) -> defaultdict[Any, list[Any]]:
    columns: defaultdict[Any, list[Any]] = defaultdict(list)
    k = len(names)
    for j, row in enumerate(batch):
        if isinstance(row, dict):
            if names:  # a filter: a name missing from a row raises KeyError, as in torchdata
                for name in names:
                    columns[name].append(row[name])
            else:
                for key, value in row.items():
                    columns[key].append(value)
        else:
            if not ordered:
                raise TypeError(f"Rows2Columnar: row {j} is a list, whose values are named by position, but "
                                "column_names is a set, which has no order: pass a list of names")
            for i, value in enumerate(row):
                if i >= k:
                    raise IndexError(f"Rows2Columnar: row {j} has more than {k} values, one per name of "
                                     f"column_names={names!r}; list index out of range")
                columns[names[i]].append(value)
    return columns


def _rows_to_columns(pipe: Rows2Columnar, it: Iterator[Any]) -> Iterator[defaultdict[Any, list[Any]]]:
    names = pipe.column_names
    ordered = pipe._ordered
    n = 0
    try:
        for batch in it:
            yield _columnar(batch, names, ordered)
            n += 1
    except Exception as e:
        if raised_at(e, _COLUMNAR_LINES):
            add_stage_note(e, stage_label(pipe), n, "batch")
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise


_COLUMNAR_LINES = call_lines(_rows_to_columns, "names")


@functional_datapipe("rows2columnar")
class Rows2Columnar(IterDataPipe[dict[Any, list[Any]]]):
    """Turn each batch of rows into columns: one dict per batch, column name -> list of values
    (functional name: ``rows2columnar``).

    Args:
        source_datapipe: the source pipe, yielding batches whose rows are dicts or lists.
        column_names: for dict rows, the keys to keep (a list, or a set as in torchdata; every key
            when ``None`` or empty); for list rows, the name of each position, in a list or tuple
            (needed: a row longer than it raises ``IndexError``, a set ``TypeError``).

    Yields:
        For each batch, a ``collections.defaultdict(list)`` (as torchdata yields) mapping each
        column name to its values, in row order; a dict row without one of ``column_names``
        raises ``KeyError``.

    Raises:
        KeyError, IndexError, TypeError: as above, with a note naming the stage and the batch's
        position.

    ``len()`` is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> rows = IterableWrapper([[{"a": 1}, {"b": 2, "a": 1}], [{"a": 1, "b": 200}, {"b": 2, "c": 3, "a": 100}]])
        >>> [dict(d) for d in rows.rows2columnar()]
        [{'a': [1, 1], 'b': [2]}, {'a': [1, 100], 'b': [200, 2], 'c': [3]}]
        >>> [dict(d) for d in rows.rows2columnar(column_names=["a"])]
        [{'a': [1, 1]}, {'a': [1, 100]}]
        >>> [dict(d) for d in IterableWrapper([[[0, 1], [2, 3]]]).rows2columnar(["x", "y"])]
        [{'x': [0, 2], 'y': [1, 3]}]
    """

    _saves = "nothing: at a boundary their position is their source's"

    _stateless = True  # one dict per batch: its position is its source's

    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        column_names: Sequence[Hashable] | set[Hashable] | frozenset[Hashable] | None = None,
    ) -> None:
        require_pipe(source_datapipe, "Rows2Columnar", "source_datapipe")
        if column_names is not None and not isinstance(column_names, (list, tuple, set, frozenset)):
            raise TypeError(f"Rows2Columnar: column_names must be a list or set of names, or None, got "
                            f"{type(column_names).__name__}")
        self.source_datapipe = source_datapipe
        self.column_names: list[Any] = [] if column_names is None else list(column_names)
        self._ordered = not isinstance(column_names, (set, frozenset))

    def _open(self, ctx: Pass) -> Iterator[dict[Any, list[Any]]]:
        return _rows_to_columns(self, ctx.open(self.source_datapipe))

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")
