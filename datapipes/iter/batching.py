"""Stages that cut a stream into lists and take lists apart: Batcher [batch], Unbatcher [unbatch]
(``UnBatcher``, torch's spelling). Batches of a sorted buffer and groups by key are
:mod:`datapipes.iter.grouping`'s.

The hot loops are bare generators chosen once at construction. ``Batcher`` cuts batches with
``list(islice(it, batch_size))``, which builds each batch in C: about 12 ns per item here against
about 30 ns for a Python loop appending item by item.

Every ``_open(ctx)`` creates its source's iterator at once (``ctx.open``), as part of the pass it is
handed (:mod:`datapipes._runtime.passes`), and hands it to the generator that does the work; a generator
left by an exception (or closed early) closes that iterator, so the upstream is released at once.

Checkpoint and resume (docs/howto/checkpoint.rst): ``Batcher`` keeps nothing (at a batch boundary it has
consumed exactly the batched items). ``Unbatcher`` records a run that its loop writes to once per item
read, never once per element: the item's position and the iterator over its elements, whose
elements left a copy of it lists when a state is taken (an item that is not a batch, passed as it is
by ``unbatch_level=-1``, costs that one write).
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Callable, Iterable, Iterator, Literal, TypeVar, cast, overload

from .._runtime.passes import Pass
from .._runtime.validate import check_int, check_list, check_loop_state, invalid
from .._chunk import DataChunk
from .._engine import abandon
from .._engine.lifecycle import Resumable
from .._checks import require_bool
from .._positions import remaining
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_callable, require_int, require_pipe, source_len, stage_label
from ..errors import add_stage_note, call_lines, raised_at

__all__ = ["Batcher", "Unbatcher", "UnBatcher"]

T = TypeVar("T")
U = TypeVar("U")

#: The containers :class:`Unbatcher` treats as batches.
_BATCH = (list, tuple)

#: torch DataPipes' words where they assert on the batch size (iterable- and map-style ``batch``).
_BATCH_SIZE_ASSERT = "Batch size is required to be larger than 0!"


def _count_batches(n: int, batch_size: int, drop_last: bool) -> int:
    return n // batch_size if drop_last else -(-n // batch_size)


# -- Batcher ---------------------------------------------------------------------------------------


# The batching loops let go of a batch once it is yielded (``del batch`` before the next one is
# gathered): a suspended frame keeps its locals, and a batch of large samples (a DataLoader worker's
# 32 decoded images) would otherwise stay alive while the next one fills (docs/architecture.rst,
# "The loader").


def _batches(it: Iterator[Any], n: int) -> Iterator[list[Any]]:
    # Stops at the first short batch, so an exhausted source is not asked again.
    while len(batch := list(islice(it, n))) == n:
        yield batch
        del batch
    if batch:
        yield batch


def _full_batches(it: Iterator[Any], n: int) -> Iterator[list[Any]]:
    while len(batch := list(islice(it, n))) == n:
        yield batch
        del batch


def _batch_keep(pipe: Batcher, it: Iterator[Any] | None = None) -> Iterator[list[Any]]:
    n = pipe.batch_size
    # DataChunk or list: each batch built in C from the source (both take any iterable)
    make = cast("Callable[[Iterable[Any]], list[Any]]", pipe.wrapper_class)
    if it is None:  # the map-style Batcher's iteration, which reads its source by position
        it = iter(pipe.datapipe)
    try:
        while len(batch := make(islice(it, n))) == n:
            yield batch
            del batch
        if batch:
            yield batch
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


def _batch_drop(pipe: Batcher, it: Iterator[Any] | None = None) -> Iterator[list[Any]]:
    n = pipe.batch_size
    make = cast("Callable[[Iterable[Any]], list[Any]]", pipe.wrapper_class)  # DataChunk or list
    if it is None:  # the map-style Batcher's iteration, which reads its source by position
        it = iter(pipe.datapipe)
    try:
        while len(batch := make(islice(it, n))) == n:
            yield batch
            del batch
    except BaseException:
        abandon(it)
        raise


def _batch_wrap(pipe: Batcher, it: Iterator[Any] | None = None) -> Iterator[Any]:
    fn = pipe.wrapper_class
    if it is None:  # the map-style Batcher's iteration, which reads its source by position
        it = iter(pipe.datapipe)
    batches = _full_batches if pipe.drop_last else _batches
    b = 0
    try:
        for batch in batches(it, pipe.batch_size):
            wrapped = fn(batch)
            del batch
            yield wrapped
            del wrapped
            b += 1
    except Exception as e:
        if raised_at(e, _WRAP_FN_LINES):
            add_stage_note(e, stage_label(pipe), b, pipe._batch_what)
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise


_WRAP_FN_LINES = call_lines(_batch_wrap)


@functional_datapipe("batch")
class Batcher(IterDataPipe[Any]):
    """Gather consecutive items into lists of ``batch_size`` (functional name: ``batch``).

    Args:
        datapipe: the source pipe.
        batch_size: the number of items per batch, at least 1 (else a ``ValueError`` that is also the
            ``AssertionError`` torch DataPipes raise).
        drop_last: drop the last batch when it holds fewer than ``batch_size`` items.
        wrapper_class: what each batch is made as: :class:`~datapipes.DataChunk` (the default, as
            torch's: a ``list`` with torch's ``DataChunk`` methods) or ``list``, built directly
            from the source; any other callable (e.g. ``tuple``) is called on each batch (a new
            ``list``) before it is yielded.

    Yields:
        Lists of ``batch_size`` items in source order; the last one may be shorter unless
        ``drop_last``.

    Raises:
        Whatever the source raises, unchanged; whatever ``wrapper_class`` raises, as the same object
        with a note naming the stage and the batch's position.

    ``len()`` is ``ceil(len(datapipe) / batch_size)`` (``floor`` with ``drop_last``), computed from
    the source at call time.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(7)).batch(3))
        [[0, 1, 2], [3, 4, 5], [6]]
        >>> list(IterableWrapper(range(7)).batch(3, drop_last=True, wrapper_class=tuple))
        [(0, 1, 2), (3, 4, 5)]

    See also: :class:`Unbatcher`, :class:`BucketBatcher`, :class:`Grouper`.
    """

    _saves = "nothing: at a boundary their position is their source's"

    _repr_fields = ("batch_size",)
    _batch_what = "batch"  # what the note on a wrapper_class error calls the failing batch
    _stateless = True  # at a batch boundary it has consumed exactly the batched items: its source's position

    @overload
    def __init__(
        self: IterDataPipe[list[T]],
        datapipe: IterDataPipe[T],
        batch_size: int,
        drop_last: bool = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[U],
        datapipe: IterDataPipe[T],
        batch_size: int,
        drop_last: bool = ...,
        wrapper_class: Callable[[list[T]], U] = ...,
    ) -> None: ...
    def __init__(
        self,
        datapipe: IterDataPipe[T],
        batch_size: int,
        drop_last: bool = False,
        wrapper_class: Callable[[list[T]], Any] = DataChunk,
    ) -> None:
        require_pipe(datapipe, "Batcher")
        require_int(batch_size, "Batcher", "batch_size", minimum=1, torch_assert=_BATCH_SIZE_ASSERT)
        require_callable(wrapper_class, "Batcher", "wrapper_class")
        self.datapipe = datapipe
        self.batch_size = batch_size
        self.drop_last = require_bool(drop_last, "Batcher", "drop_last", ints=True)
        self.wrapper_class = wrapper_class
        self._run: Callable[[Batcher, Iterator[Any] | None], Iterator[Any]]
        if wrapper_class is list or wrapper_class is DataChunk:
            self._run = _batch_drop if self.drop_last else _batch_keep
        else:
            self._run = _batch_wrap

    def _open(self, ctx: Pass) -> Iterator[Any]:
        return self._run(self, ctx.open(self.datapipe))

    def __len__(self) -> int:
        return _count_batches(source_len(self, self.datapipe), self.batch_size, self.drop_last)


# -- Unbatcher -------------------------------------------------------------------------------------


class UnbatchLevelError(TypeError, IndexError):
    """Raised by :class:`Unbatcher` when an item at a level to flatten is not a list or tuple: a
    ``TypeError`` (the item is of the wrong kind) that is also the ``IndexError`` torch DataPipes
    raise there, its message ending with theirs ("unbatch_level 5 exceeds the depth of the
    DataPipe")."""


def _not_a_batch(pipe: Unbatcher, value: Any, path: tuple[int, ...]) -> UnbatchLevelError:
    where = f"item {path[0]}" + "".join(f"[{j}]" for j in path[1:])
    kind = type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    return UnbatchLevelError(
        f"{stage_label(pipe)}: {where} is {article} {kind}, not a list or tuple: unbatch_level {pipe.unbatch_level} "
        "exceeds the depth of the DataPipe"
    )


def _unbatch_none(pipe: Unbatcher, it: Iterator[Any]) -> Iterator[Any]:
    return it  # items pass as they are: the source's own iterator, no generator in between


#: the elements a pass has left before it reads its source's first item: none
_NONE_LEFT: Iterator[Any] = iter(())


def _check_unbatch_state(state: dict[str, Any], deep: bool) -> None:
    """The checks of an ``unbatch`` pass's state: ``ended`` (True), or the position of the source's
    next item (an int >= 0), the elements of the current one left (a list) and, where ``deep``
    (``unbatch_level`` > 1), the item found in it that is not a batch, still to be raised (``bad``:
    ``[path, item]``, with ``rest``)."""
    check_loop_state(state, needs_next=False)
    if "ended" in state:
        return
    check_int(state, "next")
    if deep and "bad" in state:
        check_list(state, "rest")
        bad = state["bad"]
        if type(bad) not in (list, tuple) or len(bad) != 2 or type(bad[0]) not in (list, tuple) or not bad[0]:
            invalid(f"state['bad'] must be a [path, item] pair, got {bad!r:.100}")


class _UnbatchRun(Resumable):
    """The position of an ``unbatch`` pass: the source's item whose elements are being yielded
    (``n``) and the iterator over them (``rest``: the batch's own, or over the elements gathered
    from deeper levels), which the loop writes once per item read; the state holds the position of
    the source's next item and the elements not yet yielded (a copy of the iterator lists them).
    Deeper than one level, an item found in the current one that is not a batch (``bad``: its path
    and value) is raised once the elements before it are yielded, and the state holds it until then.
    A pass that has ended saves ``{"ended": True}``."""

    __slots__ = ("deep", "loaded", "ended", "n", "rest", "bad")

    def __init__(self, deep: bool) -> None:
        super().__init__()
        self.deep = deep  # unbatch_level > 1: the state may hold ``bad``
        self.loaded: dict[str, Any] | None = None  # the state loaded, saved as it is until the pass starts
        self.ended = False
        self.n = -1  # the source's item being unbatched (-1: none yet)
        self.rest: Iterator[Any] = _NONE_LEFT  # a resumed pass's: the elements it yields first
        self.bad: tuple[tuple[int, ...], Any] | None = None

    def state(self) -> dict[str, Any]:
        if not self.started:
            return {"next": 0} if self.loaded is None else dict(self.loaded)
        if self.ended:
            return {"ended": True}
        state: dict[str, Any] = {"next": self.n + 1, "rest": remaining(self.rest)}
        if self.bad is not None:
            state["bad"] = [list(self.bad[0]), self.bad[1]]
        return state

    def load(self, state: dict[str, Any]) -> None:
        _check_unbatch_state(state, self.deep)
        self.loaded, self.ended = state, "ended" in state
        if not self.ended:
            self.n = state["next"] - 1  # the item whose elements are left: the one before the next
            self.rest = iter(list(state.get("rest", ())))
            if self.deep and "bad" in state:
                path, value = state["bad"]
                self.bad = (tuple(path), value)


# The unbatching loops keep ``n``, the position of the source item whose elements they yield, and
# yield them from a list iterator (the batch's own, or over its elements gathered into a list);
# both are written to the run once per item read (see _UnbatchRun). A pass starts by yielding the
# elements its run has left (a resumed pass's; none otherwise).


def _unbatch_one(pipe: Unbatcher, it: Iterator[Any], run: _UnbatchRun) -> Iterator[Any]:
    run.started = True
    n = run.n
    try:
        if run.ended:
            return
        yield from run.rest
        for batch in it:
            n += 1
            if type(batch) is not list and type(batch) is not DataChunk and type(batch) is not tuple:
                if not isinstance(batch, _BATCH):
                    raise _not_a_batch(pipe, batch, (n,))
                batch = list(batch)  # a subclass's own __iter__ (torch's DataChunk), once: its rest stays readable
            run.n = n
            run.rest = rest = iter(batch)
            yield from rest
    except BaseException:
        abandon(it)
        raise
    finally:
        run.ended = True
        run.rest = _NONE_LEFT  # let go of the batch with the pass's frame


def _dive(batch: Any, level: int, path: tuple[int, ...], out: list[Any]) -> tuple[tuple[int, ...], Any] | None:
    """Append the elements ``level`` levels down ``batch`` to ``out``; at the first item that should
    be a batch and is not, stop and return its path and value (the error to raise once the elements
    before it are yielded)."""
    if not isinstance(batch, _BATCH):
        return path, batch
    if level == 1:
        out.extend(batch)
        return None
    for j, inner in enumerate(batch):
        bad = _dive(inner, level - 1, (*path, j), out)
        if bad is not None:
            return bad
    return None


def _unbatch_deep(pipe: Unbatcher, it: Iterator[Any], run: _UnbatchRun) -> Iterator[Any]:
    level = pipe.unbatch_level
    run.started = True
    n = run.n
    try:
        if run.ended:
            return
        yield from run.rest
        bad = run.bad
        if bad is not None:
            raise _not_a_batch(pipe, bad[1], bad[0])
        for batch in it:
            n += 1
            elements: list[Any] = []
            bad = _dive(batch, level, (n,), elements)
            run.n, run.bad = n, bad
            run.rest = rest = iter(elements)
            yield from rest
            if bad is not None:
                raise _not_a_batch(pipe, bad[1], bad[0])
    except BaseException:
        abandon(it)
        raise
    finally:
        run.ended = True
        run.rest = _NONE_LEFT


def _flatten(batch: Any, out: list[Any]) -> None:
    for x in batch:
        if isinstance(x, _BATCH):
            _flatten(x, out)
        else:
            out.append(x)


def _unbatch_all(pipe: Unbatcher, it: Iterator[Any], run: _UnbatchRun) -> Iterator[Any]:
    run.started = True
    n = run.n
    try:
        if run.ended:
            return
        yield from run.rest
        for x in it:
            n += 1
            if isinstance(x, _BATCH):
                elements: list[Any] = []
                _flatten(x, elements)
                run.n = n
                run.rest = rest = iter(elements)
                yield from rest
            else:
                run.n = n  # the iterator of the batch before, if any, has nothing left
                yield x
    except BaseException:
        abandon(it)
        raise
    finally:
        run.ended = True
        run.rest = _NONE_LEFT


@functional_datapipe("unbatch")
class Unbatcher(IterDataPipe[Any]):
    """Undo batching: yield the elements of each batch (functional name: ``unbatch``).

    Lists and tuples are batches; anything else is an element.

    Args:
        datapipe: the source pipe, yielding batches.
        unbatch_level: how many levels of nesting to flatten: ``1`` (default) the top level, ``2``
            the top two, ``0`` none (items pass as they are), ``-1`` every level (elements that are
            not lists or tuples, at whatever depth, are yielded as they are).

    Yields:
        The elements, in order.

    Raises:
        UnbatchLevelError: an item at a level to flatten is not a list or tuple. It is a
            ``TypeError`` and, as torch DataPipes raise there, an ``IndexError``; the message names
            the stage and the item's position (``item 3[0]``: element 0 of the stage's item 3), then
            ends with torch's words ("unbatch_level 2 exceeds the depth of the DataPipe").

    ``len()`` is the source's length with ``unbatch_level=0``; otherwise it raises ``TypeError``
    (the batch sizes are known only after iterating).

    Deeper than one level, the elements of each source item are gathered into a list before the
    first is yielded (an item that should be a batch and is not is still raised in its place, after
    the elements before it). A list or tuple subclass with an ``__iter__`` of its own (torch's
    ``DataChunk``) is iterated once into a list. A pass's state holds the position of the source's
    next item and the elements of the current one not yet yielded (at most one item's elements).

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([[0, 1], [2]]).unbatch())
        [0, 1, 2]
        >>> list(IterableWrapper([[[0, 1], [2]], [[3]]]).unbatch(unbatch_level=-1))
        [0, 1, 2, 3]

    See also: :class:`Batcher`, :class:`~datapipes.iter.FlatMapper`.
    """

    _saves = {
        "``unbatch``": "the rest of the current batch",
        "``unbatch(unbatch_level=0)``": "nothing: at a boundary their position is their source's",
    }

    _repr_fields = ("unbatch_level",)

    @overload
    def __init__(
        self: IterDataPipe[U],
        datapipe: IterDataPipe[Iterable[U]],
        unbatch_level: Literal[1] = ...,
    ) -> None: ...
    @overload
    def __init__(self: IterDataPipe[Any], datapipe: IterDataPipe[T], unbatch_level: int = ...) -> None: ...
    def __init__(self, datapipe: IterDataPipe[Any], unbatch_level: int = 1) -> None:
        require_pipe(datapipe, "Unbatcher")
        require_int(unbatch_level, "Unbatcher", "unbatch_level", minimum=-1)
        self.datapipe = datapipe
        self.unbatch_level = unbatch_level
        runs = {-1: _unbatch_all, 1: _unbatch_one}
        self._run: Callable[[Unbatcher, Iterator[Any], _UnbatchRun], Iterator[Any]]
        self._run = runs.get(unbatch_level, _unbatch_deep)
        # unbatch_level=0 passes the source's iterator itself: its position is the source's.
        self._stateless = unbatch_level == 0

    def _open(self, ctx: Pass) -> Iterator[Any]:
        it = ctx.open(self.datapipe)
        if self.unbatch_level == 0:
            return _unbatch_none(self, it)
        run = _UnbatchRun(self.unbatch_level > 1)
        ctx.track(self, run)
        return self._run(self, it, run)

    def __len__(self) -> int:
        if self.unbatch_level == 0:
            return source_len(self, self.datapipe)
        raise len_unknown(self, "the sizes of the batches are known only after iterating", NO_LEN)


#: torch's spelling of :class:`Unbatcher` (``torch.utils.data.datapipes.iter.UnBatcher``)
UnBatcher = Unbatcher
