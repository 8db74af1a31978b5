"""Stages that apply a function to whole batches: BatchMapper [map_batches] gathers the items into
batches and yields the elements of what ``fn`` returns for each (torchdata 0.9's, the differences
listed in its docstring); Collator [collate] turns each batch (a list of samples) into batched tensors.

Checkpoint and resume (docs/howto/checkpoint.rst): ``collate`` keeps nothing (it is 1:1);
``map_batches`` keeps the outputs left of the current batch: its loop writes the batch to the pass's
run once per batch, with the iterator over the list or tuple ``fn`` returned for it, or else the
count of outputs yielded before each ``yield``.
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Callable, Iterable, Iterator, TypeVar, overload

from ..._runtime.passes import Pass
from ..._runtime.validate import check_int, check_list, check_loop_state
from ..._collate import collate as default_collate
from ..._engine import abandon
from ..._positions import remaining, skip
from ...datapipe import IterDataPipe, functional_datapipe, len_unknown, require_callable, require_int, require_pipe, source_len, stage_label
from ...errors import add_stage_note, call_lines, raised_at
from .._shared import _RELIES
from ._shared import _Col, _check_cols, _LoopRun, check_arity

__all__ = ["BatchMapper", "Collator", "MapBatches"]

U = TypeVar("U")
T = TypeVar("T")


# -- BatchMapper -----------------------------------------------------------------------------------


def _batch_fn(fn: Callable[[Any], Any], input_col: _Col) -> Callable[[list[Any]], Any]:
    """``fn`` applied to a batch: to the batch itself, to the list of one column's values, or to the
    list of the rows' columns (one list per row), as torchdata's ``map_batches`` does."""
    if input_col is None:
        return fn
    if isinstance(input_col, (list, tuple)):
        cols = tuple(input_col)
        return lambda batch: fn([[row[c] for c in cols] for row in batch])
    return lambda batch: fn([row[input_col] for row in batch])


class _BatchesRun(_LoopRun):
    """The position of a ``map_batches`` pass, between two outputs of one batch: the batch's
    position (``n``) and the batch, written once per batch, and what is left of it: where ``fn``
    returned a list or tuple, the iterator over it that the loop yields from (``rest``, a copy of
    which lists the outputs left); else the count of outputs yielded (``done``), written before each
    ``yield``, and a resumed pass calls ``fn`` on the batch again and skips them."""

    __slots__ = ("n", "batch", "rest", "done")

    def __init__(self) -> None:
        super().__init__()
        self.n = 0
        self.batch: list[Any] = []
        self.rest: Iterator[Any] | None = None
        self.done = 0

    def position(self) -> dict[str, Any]:
        if self.rest is not None:
            return {"next": self.n + 1, "rest": remaining(self.rest)}
        return {"next": self.n + 1, "input": list(self.batch), "done": self.done}

    def load(self, state: dict[str, Any]) -> None:
        check_loop_state(state)
        if "input" in state and "rest" not in state and "ended" not in state:
            check_list(state, "input")
            check_int(state, "done")
        self.loaded = state


def _map_batches(pipe: BatchMapper, it: Iterator[Any], run: _BatchesRun) -> Iterator[Any]:
    fn = _batch_fn(pipe.fn, pipe.input_col)
    size = pipe.batch_size
    run.started = True
    loaded = run.loaded
    # The position (see _BatchesRun): ``n`` (the batch whose outputs are yielded) and ``batch``,
    # written to ``run`` as a batch starts, with the iterator over a list or tuple ``fn`` returned,
    # or (any other iterable) ``done``, the outputs yielded, written before each output is yielded.
    n = 0
    batch: list[Any] = []
    try:
        if loaded is not None:
            if "ended" in loaded:
                return
            n = loaded["next"]
            if "rest" in loaded or "input" in loaded:
                n -= 1
                if "rest" in loaded:
                    rest = iter(list(loaded["rest"]))
                    run.n, run.rest = n, rest
                    for y in rest:
                        yield y
                else:
                    batch, done = list(loaded["input"]), loaded["done"]
                    out = fn(batch)
                    out = iter(out)
                    skip(out, done)  # the outputs yielded before the state was taken
                    run.n, run.batch, run.done = n, batch, done
                    for y in out:
                        done += 1
                        run.done = done
                        yield y
                n += 1
        while batch := list(islice(it, size)):
            out = fn(batch)
            if type(out) is list or type(out) is tuple:  # its outputs left are read from the iterator
                rest = iter(out)
                run.n, run.batch, run.rest = n, batch, rest
                for y in rest:  # (a for loop: ``yield from`` a list's iterator costs more per output)
                    yield y
            else:
                run.n, run.batch, run.rest = n, batch, None
                done = 0
                for y in out:
                    done += 1
                    run.done = done
                    yield y
            n += 1
            if len(batch) < size:
                break  # the source has ended: it is not asked again
    except Exception as e:
        if raised_at(e, _BATCH_FN_LINES):
            add_stage_note(e, stage_label(pipe), n, "batch")
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise
    finally:
        run.ended = True
        run.batch, run.rest = [], None  # let go of the batch and its outputs with the pass


_BATCH_FN_LINES = call_lines(_map_batches, "fn") | call_lines(_map_batches, "out")


@functional_datapipe("map_batches")
class BatchMapper(IterDataPipe[U]):
    """Gather the items into batches, apply ``fn`` to each batch and yield the elements of what it
    returns (functional name: ``map_batches``).

    For a vectorised function (a tokenizer, a C++ binding) that works best on many items at once.

    Args:
        datapipe: the source pipe.
        fn: a function taking a batch (a list) and returning an iterable, whose elements are
            yielded; it may return more or fewer elements than it was given.
        batch_size: the number of items per batch, at least 1 (the last batch may be shorter).
        input_col: ``None`` (default): ``fn`` gets the batch of items; a column (index or key):
            the list of that column's values; several columns: a list with, for each item, the
            list of its values. There is no ``output_col``: the outputs replace the items.

    Yields:
        The elements of ``fn(batch)`` for each batch, in order.

    Raises:
        Whatever ``fn`` (or iterating its result) raises, as the same object, with a note naming
        the stage and the batch's position.

    ``len()`` raises ``TypeError``: it relies on the output of ``fn``.

    Checkpoint: the state holds what is left of the current batch: the outputs left when ``fn``
    returned a list or tuple; otherwise the batch and the count of outputs yielded, and a resumed
    pass calls ``fn`` on it again and skips them (exact for a ``fn`` that gives the same outputs).

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(5)).map_batches(lambda batch: [x + 1 for x in batch], batch_size=3))
        [1, 2, 3, 4, 5]
        >>> list(IterableWrapper([(1, "a"), (2, "b"), (3, "c")]).map_batches(lambda xs: [sum(xs)], 2, input_col=0))
        [3, 3]

    See also: :class:`~datapipes.iter.FlatMapper`, :class:`~datapipes.iter.Batcher`.
    """

    _saves = "same as flatmap"

    _repr_fields = ("fn",)

    @overload
    def __init__(
        self: IterDataPipe[U],
        datapipe: IterDataPipe[T],
        fn: Callable[[list[T]], Iterable[U]],
        batch_size: int,
        input_col: None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[U],
        datapipe: IterDataPipe[T],
        fn: Callable[[list[Any]], Iterable[U]],
        batch_size: int,
        input_col: _Col | None = ...,
    ) -> None: ...
    def __init__(self, datapipe: IterDataPipe[Any], fn: Callable[[list[Any]], Iterable[U]], batch_size: int,
                 input_col: _Col = None) -> None:
        stage = "BatchMapper"
        require_pipe(datapipe, stage)
        require_callable(fn, stage, "fn")
        check_arity(fn, None, stage)
        require_int(batch_size, stage, "batch_size", minimum=1,
                    torch_assert="Batch size is required to be larger than 0!")  # torchdata asserts
        _check_cols(input_col, None, stage)
        self.datapipe = datapipe
        self.fn = fn
        self.batch_size = batch_size
        self.input_col = input_col

    def _open(self, ctx: Pass) -> Iterator[U]:
        it = ctx.open(self.datapipe)
        run = _BatchesRun()
        ctx.track(self, run)
        return _map_batches(self, it, run)

    def __len__(self) -> int:
        raise len_unknown(self, f"{type(self).__name__}'s {_RELIES}.", _RELIES)


#: the functional name's spelling of :class:`BatchMapper`
MapBatches = BatchMapper


# -- Collator --------------------------------------------------------------------------------------


def _collate_raise(pipe: Collator, it: Iterator[Any]) -> Iterator[Any]:
    fn = pipe.fn
    n = 0
    try:
        for batch in it:
            out = fn(batch)
            batch = None  # neither the samples nor the batch outlive their turn (see iter/batching.py)
            yield out
            out = None
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

    _saves = "nothing: at a boundary their position is their source's"

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

    def _open(self, ctx: Pass) -> Iterator[Any]:
        return _collate_raise(self, ctx.open(self.datapipe))

    def __len__(self) -> int:
        return source_len(self, self.datapipe)
