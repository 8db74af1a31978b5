"""MaxTokenBucketizer [max_token_bucketize]: batches of items of similar length, each within a
budget of tokens. Batches by count are :mod:`datapipes.iter.batching`'s (``batch``) and
:mod:`datapipes.iter.grouping`'s (``bucketbatch``).

Names, parameters, defaults and outputs follow torchdata 0.9; the differences are listed in the
docstring. ``_open(ctx)`` creates its source's iterator at once (``ctx.open``), as part of the pass it
is handed (:mod:`datapipes._runtime.passes`), and hands it to the generator that does the work.

Checkpoint and resume (docs/howto/checkpoint.rst): a pass keeps its heap and the batch being filled,
read when a state is taken, at no cost per item.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Iterator, TypeVar

from .._runtime.passes import Pass
from .._runtime.validate import check_dict, check_int, check_list, check_number, invalid
from .._chunk import DataChunk
from .._checks import phrased, require_bool
from .._engine import abandon
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_callable, require_int, require_pipe, stage_label
from ..errors import add_stage_note, call_lines, raised_at
from ._shared import _check_started

__all__ = ["MaxTokenBucketizer"]

T = TypeVar("T")


# -- MaxTokenBucketizer ----------------------------------------------------------------------------


class _Tie:
    """The middle of a heap entry ``(length, tie, item)``: entries of equal length compare equal
    without comparing the items, as torchdata's ``PrioritizedItem`` (ordered by length alone) do,
    so the heap yields them in torchdata's order. One per entry: a shared one would be equal to
    itself and let the comparison reach the items."""

    __slots__ = ()

    def __lt__(self, other: Any) -> bool:
        return False


class _BucketizeRun:
    """The position of a ``max_token_bucketize`` pass: the heap (at most ``buffer_size`` items with
    their lengths), the batch being filled with its token count and longest length, and the count
    of items read (for error notes). Read when a state is taken; the loop updates it before each
    ``yield``."""

    __slots__ = ("heap", "batch", "total", "longest", "read", "started")

    def __init__(self) -> None:
        self.heap: list[tuple[Any, _Tie, Any]] = []
        self.batch: list[Any] = []
        self.total: Any = 0
        self.longest: Any = 0
        self.read = 0
        self.started = False

    def add(self, length: Any, x: Any, limit: Any, padding: bool) -> list[Any] | None:
        """Add ``x`` (taken from the heap) to the batch; returns the batch it closes, if any."""
        if padding:  # the batch's size once padded to its longest item
            longest = self.longest = max(length, self.longest)
            grown = (len(self.batch) + 1) * longest
        else:
            grown = self.total + length
        if grown > limit:
            full = self.batch
            self.batch, self.total, self.longest = [x], length, length
            return full
        self.batch.append(x)
        self.total = grown
        return None

    def state(self) -> dict[str, Any]:
        return {"heap": [[length, x] for length, _, x in self.heap], "batch": list(self.batch),
                "total": self.total, "longest": self.longest, "read": self.read}

    def restore(self, state: dict[str, Any]) -> None:
        _check_started(self)
        if not isinstance(state, dict) or "heap" not in state:
            raise ValueError(f"load_state_dict: not the state of a max_token_bucketize: {str(state)[:200]}")
        check_dict(state, keys=("heap", "batch", "total", "longest", "read"))
        for entry in check_list(state, "heap"):
            if type(entry) not in (list, tuple) or len(entry) != 2 or type(entry[0]) not in (int, float):
                invalid(f"state['heap'] must hold [length, item] pairs, got {entry!r:.100}")
        check_list(state, "batch")
        check_number(state, "total")
        check_number(state, "longest")
        check_int(state, "read")
        self.heap = [(length, _Tie(), x) for length, x in state["heap"]]  # the same order: still a heap
        self.batch = list(state["batch"])
        self.total, self.longest, self.read = state["total"], state["longest"], int(state["read"])


def _bucketize(pipe: MaxTokenBucketizer, it: Iterator[Any], run: _BucketizeRun) -> Iterator[list[Any]]:
    len_fn, lo, hi = pipe.len_fn, pipe.min_len, pipe.max_len
    size, limit, padding = pipe.buffer_size, pipe.max_token_count, pipe.include_padding
    heap, add, push, pop = run.heap, run.add, heapq.heappush, heapq.heappop
    run.started = True
    n = run.read
    try:
        for x in it:
            length = len_fn(x)
            n += 1
            if lo <= length <= hi:
                push(heap, (length, _Tie(), x))
                if len(heap) == size:
                    length, _, x = pop(heap)
                    full = add(length, x, limit, padding)
                    if full is not None:
                        run.read = n
                        yield DataChunk(full)
        run.read = n
        while heap:
            length, _, x = pop(heap)
            full = add(length, x, limit, padding)
            if full is not None:
                yield DataChunk(full)
        if run.batch:
            full, run.batch = run.batch, []
            yield DataChunk(full)
    except Exception as e:
        if raised_at(e, _LEN_FN_LINES):
            add_stage_note(e, stage_label(pipe), n)
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise


_LEN_FN_LINES = call_lines(_bucketize, "len_fn")


@functional_datapipe("max_token_bucketize")
class MaxTokenBucketizer(IterDataPipe[list[T]]):
    """Batch items of similar length so that each batch holds at most ``max_token_count`` tokens
    (functional name: ``max_token_bucketize``).

    Items are read into a min-heap of ``buffer_size`` items ordered by ``len_fn(item)``; once it is
    full, each new item makes the shortest one leave it for the current batch. A batch is yielded
    when the next item would take its token count (the sum of its items' lengths, or with
    ``include_padding`` its item count times its longest length) over ``max_token_count``. When
    the source ends, the heap is emptied the same way and the last batch yielded. Items whose
    length is outside ``[min_len, max_len]`` are dropped.

    Args:
        datapipe: the source pipe.
        max_token_count: the most tokens a batch may hold.
        len_fn: the length of one item (default ``len``).
        min_len: the shortest length kept (default 0), at least 0.
        max_len: the longest length kept; ``None`` (default): ``max_token_count``, which it may
            not exceed.
        buffer_size: the number of items in the heap (default 1000), at least 1. A larger heap
            gives batches of closer lengths; batches then come from the shortest items up.
        include_padding: count each batch as padded to its longest item.

    Yields:
        :class:`~datapipes.DataChunk` batches (lists, as torchdata's), within a batch in increasing
        length. Items of equal length come in torchdata's order (the heap's, not the source's).

    Raises:
        ValueError: ``min_len`` below 0 or above ``max_len``; ``max_len`` above
            ``max_token_count``; ``buffer_size`` below 1 (torchdata's messages kept at the end).
        Whatever ``len_fn`` raises, as the same object, with a note naming the stage and the
        item's position.

    ``len()`` raises ``TypeError``: the number of batches is known only after iterating.

    Checkpoint: the state holds the heap (at most ``buffer_size`` items) and the batch being filled.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> source = IterableWrapper(["1", "11", "1", "1111", "111", "1", "11", "11", "111"])
        >>> list(source.max_token_bucketize(max_token_count=5))
        [['1', '1', '1', '11'], ['11', '11'], ['111'], ['111'], ['1111']]
        >>> list(source.max_token_bucketize(max_token_count=4, buffer_size=4))
        [['1', '1', '1'], ['11', '11'], ['11'], ['111'], ['111'], ['1111']]

    See also: :class:`~datapipes.iter.BucketBatcher`, :class:`~datapipes.iter.Batcher`.
    """

    _saves = "the heap (at most ``buffer_size`` items and their lengths) and the batch being filled"

    _repr_fields = ("max_token_count",)

    def __init__(
        self,
        datapipe: IterDataPipe[T],
        max_token_count: int,
        len_fn: Callable[[Any], Any] = len,
        min_len: int = 0,
        max_len: int | None = None,
        buffer_size: int = 1000,
        include_padding: bool = False,
    ) -> None:
        stage = "MaxTokenBucketizer"
        require_pipe(datapipe, stage)
        require_int(max_token_count, stage, "max_token_count")
        require_callable(len_fn, stage, "len_fn")
        require_int(min_len, stage, "min_len")
        require_int(max_len, stage, "max_len", optional=True)
        require_int(buffer_size, stage, "buffer_size")
        if max_len is None:
            max_len = max_token_count
        if min_len < 0 or min_len > max_len:
            raise ValueError(phrased(stage, "``min_len`` should be larger than 0 and equal to or smaller than "
                                     "``max_len``.", min_len=min_len, max_len=max_len))
        if max_len > max_token_count:
            raise ValueError(phrased(stage, "``max_token_count`` must be equal to or greater than ``max_len``.",
                                     max_len=max_len, max_token_count=max_token_count))
        if buffer_size <= 0:
            raise ValueError(phrased(stage, "'buffer_size' is required to be a positive integer.",
                                     buffer_size=buffer_size))
        self.datapipe = datapipe
        self.max_token_count = max_token_count
        self.len_fn = len_fn
        self.min_len = min_len
        self.max_len = max_len
        self.buffer_size = buffer_size
        self.include_padding = require_bool(include_padding, stage, "include_padding", ints=True)

    def _open(self, ctx: Pass) -> Iterator[list[T]]:
        run = _BucketizeRun()
        it = _bucketize(self, ctx.open(self.datapipe), run)
        ctx.track(self, run)
        return it

    def __len__(self) -> int:
        raise len_unknown(self, "the number of batches is known only after iterating", NO_LEN)
