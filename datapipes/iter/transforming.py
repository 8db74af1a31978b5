"""torchdata's stages that reshape a stream: InBatchShuffler [in_batch_shuffle], ShuffledFlatMapper
[shuffled_flatmap], MaxTokenBucketizer [max_token_bucketize], ParagraphAggregator
[lines_to_paragraphs], Rows2Columnar [rows2columnar], ShardExpander [shard_expand], BatchMapper
[map_batches], ThreadPoolMapper [threadpool_map] and BatchAsyncMapper [async_map_batches].

Names, parameters, defaults and outputs follow torchdata 0.9; the differences are listed in each
docstring. Every ``__iter__`` creates its source's iterator (and reads its pass seed) at once, as part
of the pass being built (:mod:`datapipes._pass`), and hands it to the generator that does the work.

Checkpoint and resume (docs/howto/checkpoint.rst): ``rows2columnar`` keeps nothing (it is 1:1), and
``threadpool_map`` is a concurrent ``map`` (:class:`~datapipes.iter.Mapper`), whose pass keeps
the items in flight. The others keep their position where it can be read when a state is taken,
at no cost per item: the generator's state of ``in_batch_shuffle``; the buffers of
``shuffled_flatmap`` and ``max_token_bucketize``; the paragraph being gathered; the outputs left
of the current item of ``shard_expand`` and of the current batch of ``map_batches``.
"""

from __future__ import annotations

import heapq
import inspect
import random
import re
from collections import defaultdict
from itertools import chain, islice
from typing import Any, Callable, Hashable, Iterable, Iterator, Sequence, TypeVar

from .. import _pass
from .._positions import Counted, skip
from .._chunk import DataChunk
from .._checks import phrased, require_bool
from .._engine import abandon, close_iterator, is_async_callable
from .._tuning import usable_cpus
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_root, len_unknown, require_callable, require_int, require_pipe, source_len, stage_label
from ..errors import add_stage_note, call_lines, raised_at
from .callable import Mapper, _check_cols, _no_op, _selected_fn, check_arity
from .combinatorics import _rng_state, _set_rng_state

__all__ = [
    "BatchAsyncMapper",
    "BatchMapper",
    "InBatchShuffler",
    "MapBatches",
    "MaxTokenBucketizer",
    "ParagraphAggregator",
    "Rows2Columnar",
    "ShardExpander",
    "ShuffledFlatMapper",
    "ThreadPoolMapper",
]

T = TypeVar("T")
U = TypeVar("U")

_Col = Hashable | Sequence[Hashable] | None

_END = object()  # private marker: no item held (None is a valid item)
#: torchdata's words for the length of a stage whose fn decides how many items come out (len_unknown).
_RELIES = "length relies on the output of its function"

#: iterators whose items not yet yielded can be read back (:func:`datapipes._pass.remaining`)
_READABLE: frozenset[type] = frozenset((type(iter([])), type(iter(())), type(iter(""))))


class _NotCoroutine(TypeError, ValueError):
    """``async_map_batches`` given a plain function: a ``TypeError`` (the wrong kind of function)
    that is also the ``ValueError`` torchdata raises there."""



def _check_started(run: Any) -> None:
    if run.started:
        raise RuntimeError(_pass.STARTED)


# -- InBatchShuffler -------------------------------------------------------------------------------


class _RngRun:
    """The position of an ``in_batch_shuffle`` pass: its generator's state (625 ints), read when
    the state is taken; the batches themselves are its source's."""

    __slots__ = ("rng", "started")

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.started = False

    def state(self) -> dict[str, Any]:
        return {"rng": _rng_state(self.rng)}

    def restore(self, state: dict[str, Any]) -> None:
        _check_started(self)
        if not isinstance(state, dict) or "rng" not in state:
            raise ValueError(f"load_state_dict: not the state of an in_batch_shuffle: {str(state)[:200]}")
        _set_rng_state(self.rng, state["rng"])


def _in_batch_shuffle(pipe: InBatchShuffler, it: Iterator[Any], run: _RngRun) -> Iterator[list[Any]]:
    sample = run.rng.sample
    run.started = True
    n = 0
    try:
        for batch in it:
            yield DataChunk(sample(batch, len(batch)))
            n += 1
    except Exception as e:
        if raised_at(e, _SAMPLE_LINES):
            add_stage_note(e, stage_label(pipe), n, "batch")
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise


_SAMPLE_LINES = call_lines(_in_batch_shuffle, "sample")


@functional_datapipe("in_batch_shuffle")
class InBatchShuffler(IterDataPipe[list[T]]):
    """Shuffle the items inside each batch (functional name: ``in_batch_shuffle``).

    Args:
        datapipe: the source pipe, yielding batches (lists, tuples or other sequences).

    Yields:
        For each batch, a new :class:`~datapipes.DataChunk` of its items in a random order; the
        batches keep their order.

    Raises:
        TypeError: a batch is not a sequence (a set, a generator), as ``random.sample`` raises it,
            with a note naming the stage and the batch's position.

    Seeds: a random stage, as :class:`~datapipes.iter.Shuffler`: same seed (:meth:`set_seed`), same
    order; each ``set_epoch(n)`` reshuffles; unseeded passes draw their seed from torch's global
    generator. ``set_shuffle(False)`` passes the batches through unchanged. As torchdata's, each
    shuffled batch is a :class:`~datapipes.DataChunk` (a ``list``).

    ``len()`` is the source's length.

    Checkpoint: the state holds the generator's state; the batches are the source's.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper(range(9)).batch(3).in_batch_shuffle().set_seed(0)
        >>> [sorted(b) for b in pipe], list(pipe) == list(pipe)
        ([[0, 1, 2], [3, 4, 5], [6, 7, 8]], True)
        >>> list(pipe.set_shuffle(False))
        [[0, 1, 2], [3, 4, 5], [6, 7, 8]]

    See also: :class:`~datapipes.iter.Shuffler`, :class:`~datapipes.iter.BucketBatcher`.
    """

    _is_random = True

    def __init__(self, datapipe: IterDataPipe[Sequence[T]]) -> None:
        require_pipe(datapipe, "InBatchShuffler")
        self.datapipe = datapipe
        self._enabled = True
        self._stateless = False  # shuffling: its pass keeps a generator (_RngRun)

    def set_shuffle(self, shuffle: bool = True) -> InBatchShuffler[T]:
        """Turn the shuffle on or off (off: the batches pass unchanged); returns the pipe."""
        self._enabled = bool(shuffle)
        self._stateless = not self._enabled
        return self

    def __iter__(self) -> Iterator[list[T]]:
        if not self._enabled:
            batches: Iterator[Any] = iter(self.datapipe)
            return batches
        # The seed first, then the source: unseeded passes draw from torch's generator in this order.
        run = _RngRun(random.Random(self._pass_seed()))
        it = _in_batch_shuffle(self, iter(self.datapipe), run)
        _pass.track(self, run)
        return it

    def __len__(self) -> int:
        return source_len(self, self.datapipe)


# -- ShuffledFlatMapper ----------------------------------------------------------------------------

# A buffer slot: (iterator of the outputs, the item they come from or _END, the Counted iterator
# counting them or None, the item's position). The outputs of a list, tuple or str are read back from
# their iterator when a state is taken; any other iterable's are counted (in C) and computed again by
# a resumed pass.


def _opened(call: Callable[[Any], Any] | None, x: Any, n: int) -> tuple[Any, Any, Any, int]:
    it = iter(x if call is None else call(x))
    if type(it) in _READABLE:
        return it, _END, None, n
    counter = Counted(it)
    return counter, x, counter, n


def _reopened(call: Callable[[Any], Any] | None, slot: dict[str, Any]) -> tuple[Any, Any, Any, int]:
    n = int(slot["item"])
    if "rest" in slot:
        return iter(list(slot["rest"])), _END, None, n
    x, done = slot["input"], int(slot["done"])
    it = iter(x if call is None else call(x))
    skip(it, done)  # the outputs yielded before the state was taken
    counter = Counted(it, done)
    return counter, x, counter, n


def _slot_state(slot: tuple[Any, Any, Any, int]) -> dict[str, Any]:
    it, x, counter, n = slot
    if counter is None:
        return {"item": n, "rest": _pass.remaining(it)}
    return {"item": n, "input": x, "done": counter.count()}


class _ShuffledFlatMapRun(_pass.FrameRun):
    """A :class:`~datapipes._pass.FrameRun` that holds the pass's generator, so that a state taken
    before the first ``next()`` holds it too (a resumed pass then draws what this one would have)."""

    __slots__ = ("rng",)

    def __init__(self, rng: random.Random) -> None:
        super().__init__(_shuffled_flatmap_state)
        self.rng = rng

    def state(self) -> dict[str, Any]:
        if not self.started and self.resume is None:
            return {"rng": _rng_state(self.rng), "idx": None, "next": 0, "draining": False, "slots": []}
        return super().state()

    def restore(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or not ("rng" in state or "ended" in state):
            raise ValueError(f"load_state_dict: not the state of a shuffled_flatmap: {str(state)[:200]}")
        super().restore(state)


def _reopened_all(call: Callable[[Any], Any] | None, slots: list[dict[str, Any]]) -> list[tuple[Any, Any, Any, int]]:
    return [_reopened(call, s) for s in slots]


def _shuffled_flatmap_state(local: dict[str, Any], yielding_from: Any) -> dict[str, Any]:
    """A ``shuffled_flatmap`` pass's state, read from its generator's locals between two outputs:
    its generator's state, the index drawn, the buffered iterators (each as the outputs it has left,
    or as its item and the count of outputs yielded), the item read but not yet buffered."""
    state: dict[str, Any] = {
        "rng": _rng_state(local["rng"]),
        "idx": local["idx"],
        "next": local["n"],
        "draining": local["draining"],
        "slots": [_slot_state(s) for s in local["buf"]],
    }
    if local["held"] is not _END:
        state["held"] = local["held"]
    return state


def _shuffled_flatmap(pipe: ShuffledFlatMapper, it: Iterator[Any], run: _ShuffledFlatMapRun, size: int,
                      call: Callable[[Any], Any] | None) -> Iterator[Any]:
    # The draws are torchdata's: an index drawn first, then one after each output while the buffer
    # is full (none when an iterator runs out), and one before each output once the source is done.
    rng = run.rng
    randint = rng.randint
    run.started = True
    resume = run.resume
    buf: list[tuple[Any, Any, Any, int]] = []
    held: Any = _END  # an item read from the source and not yet in the buffer
    draining = False
    n = 0  # the position of the next item read from the source
    slot: Any = None
    try:
        if resume is not None:
            if "ended" in resume:
                return
            _set_rng_state(rng, resume["rng"])
            n, draining = int(resume["next"]), bool(resume["draining"])
            buf = _reopened_all(call, resume["slots"])
            held = resume.get("held", _END)
        if resume is None or resume["idx"] is None:
            idx = randint(0, size - 1)
        else:
            idx = int(resume["idx"])
        if not draining:
            for x in it if held is _END else chain((held,), it):
                held = x
                while len(buf) == size:
                    slot = buf[idx]
                    try:
                        y = next(slot[0])
                    except StopIteration:
                        del buf[idx]
                        continue
                    idx = randint(0, size - 1)
                    yield y
                buf.append(_opened(call, x, n))
                held = _END
                n += 1
            draining = True
        while buf:
            idx = randint(0, len(buf) - 1)
            slot = buf[idx]
            try:
                y = next(slot[0])
            except StopIteration:
                del buf[idx]
                continue
            yield y
    except Exception as e:
        if raised_at(e, _SFM_CALL_LINES):
            add_stage_note(e, stage_label(pipe), n)
        elif raised_at(e, _SFM_NEXT_LINES):
            add_stage_note(e, stage_label(pipe), slot[3])
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise


_SFM_CALL_LINES = call_lines(_shuffled_flatmap, "call")
_SFM_NEXT_LINES = call_lines(_shuffled_flatmap, "slot")


def _count_outputs(pipe: Any, source: IterDataPipe[Any]) -> int:
    """The sum of ``len(item)`` over a pass of ``source``, run as a pass of its own: a pass that
    is live and contains ``source`` is not joined (its position stays its own)."""
    pass_ = _pass.Pass(source)
    with pass_.building():
        it = iter(source)
    try:
        return sum(map(len, it))
    except TypeError as e:
        raise len_unknown(pipe, f"an item of its source has no length ({len_root(e)})", NO_LEN) from None
    finally:
        pass_.ended = True
        close_iterator(it)


@functional_datapipe("shuffled_flatmap")
class ShuffledFlatMapper(IterDataPipe[Any]):
    """Apply ``fn`` to every item and yield the elements of the iterables it returns, drawn at
    random from a buffer of ``buffer_size`` of them (functional name: ``shuffled_flatmap``).

    Once the buffer holds ``buffer_size`` iterables, each output is the next element of one of them
    chosen at random; an iterable that runs out leaves the buffer and the next item's takes its
    place. When the source ends, the buffered iterables are drained the same way. Each iterable's
    own elements keep their order.

    Args:
        datapipe: the source pipe.
        fn: a function returning an iterable (a list, a string, a generator ...). ``None``
            (default): each item (or its ``input_col`` column) is itself the iterable.
        input_col: apply ``fn`` to this column (or these columns, as positional arguments) of
            each item. With ``fn=None``, the column (several: the tuple of them) is flattened.
        buffer_size: how many iterables are held at once (default 100), at least 1.

    Yields:
        Every element of every iterable exactly once, in a random interleaving.

    Raises:
        Whatever ``fn`` (or iterating its result) raises, as the same object, with a note naming
        the stage and the item's position.

    Seeds: a random stage, as :class:`~datapipes.iter.Shuffler`: same seed, same order;
    ``set_epoch(n)`` reshuffles; unseeded passes draw from torch's global generator.
    ``set_shuffle(False)`` makes it a plain ``flatmap`` (source order).

    ``len()``: with ``fn=None`` and no ``input_col``, the sum of the items' lengths, which reads
    the whole source (as torchdata does); otherwise ``TypeError``.

    Checkpoint: the state holds the generator's state and the buffer: for an iterable that is a
    list, tuple or str, the elements it has left; for any other (a generator), its item and the
    count of elements yielded, and a resumed pass calls ``fn`` on the item again and skips them,
    which is exact for a ``fn`` that gives the same elements for the same item.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> source = IterableWrapper([[1, 2, 3, 4], "abcd", "ABCD"])
        >>> pipe = source.shuffled_flatmap(buffer_size=2).set_seed(0)
        >>> out = list(pipe)
        >>> sorted(map(str, out)) == sorted("1234abcdABCD"), out == list(pipe)
        (True, True)
        >>> [x for x in out if x in list("abcd")]  # each iterable keeps its order
        ['a', 'b', 'c', 'd']
        >>> list(IterableWrapper([(0, "ab"), (1, "cd")]).shuffled_flatmap(str.upper, input_col=1).set_shuffle(False))
        ['A', 'B', 'C', 'D']

    See also: :class:`~datapipes.iter.FlatMapper`, :class:`InBatchShuffler`.
    """

    _is_random = True
    _repr_fields = ("fn",)

    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        fn: Callable[..., Iterable[Any]] | None = None,
        input_col: _Col = None,
        buffer_size: int = 100,
    ) -> None:
        stage = "ShuffledFlatMapper"
        require_pipe(datapipe, stage)
        require_callable(fn, stage, "fn", optional=True)
        _check_cols(input_col, None, stage)
        if fn is not None:
            check_arity(fn, input_col, stage)
        require_int(buffer_size, stage, "buffer_size", minimum=1, torch_assert="buffer_size should be larger than 0")
        self.datapipe = datapipe
        self.fn = fn
        self.input_col = input_col
        self.buffer_size = buffer_size
        self._enabled = True

    def set_shuffle(self, shuffle: bool = True) -> ShuffledFlatMapper:
        """Turn the shuffle on or off (off: a plain ``flatmap``, in source order); returns the pipe."""
        self._enabled = bool(shuffle)
        return self

    def __iter__(self) -> Iterator[Any]:
        call: Callable[[Any], Any] | None
        if self.input_col is None:
            call = self.fn
        else:
            call = _selected_fn(_no_op if self.fn is None else self.fn, self.input_col)
        if self._enabled:
            # The seed first, then the source: unseeded passes draw from torch's generator in this order.
            rng, size = random.Random(self._pass_seed()), self.buffer_size
        else:  # one iterable at a time: flatmap's order (the draws are all 0)
            rng, size = random.Random(0), 1
        run = _ShuffledFlatMapRun(rng)
        it = _shuffled_flatmap(self, iter(self.datapipe), run, size, call)
        return _pass.track_generator(self, it, run)

    def __len__(self) -> int:
        if self.fn is None and self.input_col is None:
            return _count_outputs(self, self.datapipe)
        raise len_unknown(self, f"{type(self).__name__}'s {_RELIES}.", _RELIES)


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

    def __iter__(self) -> Iterator[list[T]]:
        run = _BucketizeRun()
        it = _bucketize(self, iter(self.datapipe), run)
        _pass.track(self, run)
        return it

    def __len__(self) -> int:
        raise len_unknown(self, "the number of batches is known only after iterating", NO_LEN)


# -- ParagraphAggregator ---------------------------------------------------------------------------


def _join_lines(lines: list[str]) -> str:
    """torchdata's default joiner: the lines joined by newlines."""
    return "\n".join(lines)


def _paragraphs(pipe: ParagraphAggregator, it: Iterator[Any], run: _pass.FrameRun) -> Iterator[tuple[Any, Any]]:
    joiner = pipe.joiner
    run.started = True
    resume = run.resume
    # The position, read by _paragraph_state: ``n`` (the items read), ``prev`` (the file of the
    # paragraph being gathered), ``lines`` (its lines). Both are updated before a paragraph is yielded.
    n = 0
    prev: Any = None
    lines: list[Any] = []
    if resume is not None:
        if "ended" in resume:
            return
        n, prev, lines = int(resume["next"]), resume.get("file"), list(resume.get("lines", ()))
    try:
        for item in it:
            filename, line = item
            n += 1
            if prev is None:
                prev = filename
            if line and prev == filename:
                lines.append(line)
            else:  # a new file, or an empty line: the paragraph ends
                done, name = lines, prev
                lines = [line] if line else []
                prev = filename
                if done:
                    yield name, joiner(done)
        if lines:
            done, lines = lines, []
            yield prev, joiner(done)
    except Exception as e:
        if raised_at(e, _ITEM_LINES):
            add_stage_note(e, stage_label(pipe), n)
            e.add_note(f"{stage_label(pipe)}: each item must be a (file name, line) pair")
        elif raised_at(e, _JOINER_LINES):
            add_stage_note(e, stage_label(pipe))
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise


_ITEM_LINES = call_lines(_paragraphs, "item")
_JOINER_LINES = call_lines(_paragraphs, "joiner")


def _paragraph_state(local: dict[str, Any], yielding_from: Any) -> dict[str, Any]:
    """A ``lines_to_paragraphs`` pass's state: the items read, the file and lines of the paragraph
    being gathered (at most one paragraph's lines)."""
    return {"next": local["n"], "file": local["prev"], "lines": list(local["lines"])}


@functional_datapipe("lines_to_paragraphs")
class ParagraphAggregator(IterDataPipe[tuple[Any, Any]]):
    """Join consecutive lines of the same file into paragraphs
    (functional name: ``lines_to_paragraphs``).

    Items are ``(file name, line)`` pairs, as ``readlines`` yields them. Consecutive non-empty lines
    of one file make a paragraph; a paragraph ends at an empty line or where the file name changes.

    Args:
        source_datapipe: the source pipe, yielding ``(file name, line)`` pairs.
        joiner: a function joining a paragraph's lines (a list); default: ``"\\n".join``.

    Yields:
        ``(file name, joiner(lines))`` for each paragraph, in order.

    Raises:
        Whatever ``joiner`` raises, as the same object, with a note naming the stage; an item that
        is not a pair raises Python's unpacking error with notes naming the stage and the item.

    ``len()`` raises ``TypeError``: the number of paragraphs is known only after iterating.

    Checkpoint: the state holds the file name and lines of the paragraph being gathered.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> lines = IterableWrapper([("f1", "Line1"), ("f1", "Line2"), ("f2", "Line2,1"), ("f2", "Line2,2"),
        ...                          ("f2", ""), ("f2", "Line2,3")])
        >>> list(lines.lines_to_paragraphs(joiner=lambda ls: " ".join(ls)))
        [('f1', 'Line1 Line2'), ('f2', 'Line2,1 Line2,2'), ('f2', 'Line2,3')]

    See also: :class:`~datapipes.iter.LineReader`.
    """

    _repr_fields = ("joiner",)

    def __init__(
        self, source_datapipe: IterDataPipe[tuple[Any, Any]], joiner: Callable[[list[Any]], Any] = _join_lines
    ) -> None:
        require_pipe(source_datapipe, "ParagraphAggregator", "source_datapipe")
        require_callable(joiner, "ParagraphAggregator", "joiner")
        self.source_datapipe = source_datapipe
        self.joiner = joiner

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        run = _pass.FrameRun(_paragraph_state)
        return _pass.track_generator(self, _paragraphs(self, iter(self.source_datapipe), run), run)

    def __len__(self) -> int:
        raise len_unknown(self, "the number of paragraphs is known only after iterating", NO_LEN)


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

    def __iter__(self) -> Iterator[dict[Any, list[Any]]]:
        return _rows_to_columns(self, iter(self.source_datapipe))

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")


# -- ShardExpander ---------------------------------------------------------------------------------

_RANGE = re.compile(r"\{([0-9]+)\.\.([0-9]+)\}")


def _shard_names(spec: str, item: tuple[str, int, str]) -> list[str]:
    """The names ``spec`` expands to: each ``{lo..hi}`` range (both ends included) in turn, the
    first one outermost; ``lo`` and ``hi`` of the same width with a leading 0 pad to that width.
    ``item``: the stage's label, the item's position and the item, for the messages."""
    m = _RANGE.search(spec)
    if m is None:
        return [spec]
    rest = _shard_names(spec[m.end():], item)
    low, high = m.group(1), m.group(2)
    if len(low) == len(high) and low.startswith("0"):
        width = len(high)
    elif len(low) <= len(high):
        if low.startswith("0") and low != "0":
            raise ValueError(f"{_where(item)}: in {m.group(0)!r}: shard_expand: low bound must not start with 0 if "
                             "low bound is shorter")
        width = 0
    else:
        raise ValueError(f"{_where(item)}: in {m.group(0)!r}: shard_expand: low bound must be shorter than high bound")
    lo, hi = int(low), int(high)
    if lo >= hi:
        raise ValueError(f"{_where(item)}: shard_expand: bad range in in shard spec {spec}.")
    prefix = spec[:m.start()]
    return [f"{prefix}{str(i).zfill(width)}{r}" for i in range(lo, hi + 1) for r in rest]


def _where(item: tuple[str, int, str]) -> str:
    label, n, spec = item
    return f"{label}: item {n} {spec!r:.200}"


def _shard_expand(pipe: ShardExpander, it: Iterator[Any], run: _pass.FrameRun) -> Iterator[str]:
    label = stage_label(pipe)
    run.started = True
    n = 0
    try:
        resume = run.resume
        if resume is not None:
            if "ended" in resume:
                return
            n = int(resume["next"])
            if resume.get("rest"):
                n -= 1
                yield from list(resume["rest"])
                n += 1
        for spec in it:
            yield from _shard_names(spec, (label, n, spec))
            n += 1
    except Exception as e:
        if raised_at(e, _SPEC_LINES) and not isinstance(e, ValueError):
            add_stage_note(e, label, n)  # not a str (re.search's TypeError)
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise


_SPEC_LINES = call_lines(_shard_expand, "spec")


def _rest_state(local: dict[str, Any], yielding_from: Any) -> dict[str, Any]:
    """A pass's state between two outputs of one item: the position of the source's next item and
    the outputs of the current one not yet yielded."""
    rest = [] if yielding_from is None else _pass.remaining(yielding_from)
    return {"next": local["n"] + 1, "rest": rest}


@functional_datapipe("shard_expand")
class ShardExpander(IterDataPipe[str]):
    """Expand shell-style brace ranges in shard names: ``"data-{000..009}.tar"`` gives the ten
    names ``data-000.tar`` to ``data-009.tar`` (functional name: ``shard_expand``).

    Args:
        source_datapipe: the source pipe, yielding shard specs (strings).

    Yields:
        The names of each spec in order: both ends of a range included, several ranges expanded
        as nested loops (the first outermost). When both ends have the same width and the low one
        starts with 0, the numbers are zero-padded to that width. A spec without a range is
        yielded as it is; only ``{digits..digits}`` counts as a range.

    Raises:
        ValueError: a range whose low end is not below its high end, whose low end is longer than
            its high end, or that starts with 0 and is shorter (torchdata's messages kept at the end,
            after the stage, the item's position and spec).

    ``len()`` raises ``TypeError``: the number of names is known only after iterating.

    Checkpoint: the state holds the names of the current spec not yet yielded.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(["ds-{00..05}.tar"]).shard_expand())
        ['ds-00.tar', 'ds-01.tar', 'ds-02.tar', 'ds-03.tar', 'ds-04.tar', 'ds-05.tar']
        >>> list(IterableWrapper(["{a,b}-{1..2}-{8..10}"]).shard_expand())
        ['{a,b}-1-8', '{a,b}-1-9', '{a,b}-1-10', '{a,b}-2-8', '{a,b}-2-9', '{a,b}-2-10']

    See also: :class:`~datapipes.iter.FileLister`, :class:`~datapipes.iter.FSSpecFileLister`.
    """

    def __init__(self, source_datapipe: IterDataPipe[str]) -> None:
        require_pipe(source_datapipe, "ShardExpander", "source_datapipe")
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[str]:
        run = _pass.FrameRun(_rest_state)
        return _pass.track_generator(self, _shard_expand(self, iter(self.source_datapipe), run), run)

    def __len__(self) -> int:
        raise len_unknown(self, "the number of names is known only after iterating", NO_LEN)


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


def _outputs_state(local: dict[str, Any], yielding_from: Any) -> dict[str, Any]:
    """A ``map_batches`` pass's state, between two outputs of one batch: the position of the next
    batch and what is left of this one: its outputs left where ``fn`` returned a list or tuple,
    else the batch and the count of outputs yielded (a resumed pass calls ``fn`` again)."""
    out, done = local["out"], local["done"]
    state: dict[str, Any] = {"next": local["n"] + 1}
    if type(out) is list or type(out) is tuple:
        state["rest"] = list(out[done:])
    else:
        state.update(input=list(local["batch"]), done=done)
    return state


def _map_batches(pipe: BatchMapper, it: Iterator[Any], run: _pass.FrameRun) -> Iterator[Any]:
    fn = _batch_fn(pipe.fn, pipe.input_col)
    size = pipe.batch_size
    run.started = True
    resume = run.resume
    # The position, read by _outputs_state: ``n`` (the batch whose outputs are yielded), ``batch``,
    # ``out`` (what fn returned for it) and ``done`` (the outputs yielded).
    n = 0
    batch: list[Any] = []
    try:
        if resume is not None:
            if "ended" in resume:
                return
            n = int(resume["next"])
            if "rest" in resume or "input" in resume:
                n -= 1
                if "rest" in resume:
                    out, done = list(resume["rest"]), 0
                else:
                    batch, done = list(resume["input"]), int(resume["done"])
                    out = fn(batch)
                    out = iter(out)
                    skip(out, done)  # the outputs yielded before the state was taken
                for y in out:
                    done += 1
                    yield y
                n += 1
        while batch := list(islice(it, size)):
            out = fn(batch)
            done = 0
            for y in out:
                done += 1
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

    _repr_fields = ("fn",)

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

    def __iter__(self) -> Iterator[U]:
        run = _pass.FrameRun(_outputs_state)
        return _pass.track_generator(self, _map_batches(self, iter(self.datapipe), run), run)

    def __len__(self) -> int:
        raise len_unknown(self, f"{type(self).__name__}'s {_RELIES}.", _RELIES)


#: the functional name's spelling of :class:`BatchMapper`
MapBatches = BatchMapper


# -- ThreadPoolMapper ------------------------------------------------------------------------------

#: the ``threadpool_kwargs`` accepted: ThreadPoolExecutor's naming of its threads (the engine names
#: its own: ``datapipes ThreadPoolMapper(fn) worker k``)
_THREADPOOL_KWARGS = frozenset({"thread_name_prefix"})


def _default_workers() -> int:
    """``ThreadPoolExecutor``'s default number of threads (Python 3.13's, which counts the CPUs this
    process may use): ``min(32, CPUs + 4)``, 6 on 2 CPUs, 20 on 16, 32 from 28 on."""
    return min(32, usable_cpus() + 4)


@functional_datapipe("threadpool_map")
class ThreadPoolMapper(Mapper[U]):
    """Apply ``fn`` to every item on a pool of worker threads, yielding in source order
    (functional name: ``threadpool_map``).

    This is a concurrent :class:`~datapipes.iter.Mapper` (``concurrency=min(max_workers,
    scheduled_tasks)``, ``ordered=True``) under torchdata's name and parameters: it runs on the
    package's engine, which owns the threads of each pass, bounds the items in flight and passes
    ``fn``'s exceptions through unchanged.

    Args:
        source_datapipe: the source pipe.
        fn: the function, called once per item on a worker thread (on the consumer's thread when
            only one worker is allowed).
        input_col: apply ``fn`` to this column (or these columns) of each item, as in ``map``.
        output_col: where the result goes, as in ``map``: ``None`` replaces the input column,
            ``-1`` appends. Input items are not mutated (torchdata writes into list and dict items).
        scheduled_tasks: the most items scheduled at once, at least 1 (default 128). The engine
            keeps at most ``2 * min(max_workers, scheduled_tasks)`` items in flight (one running,
            one queued per worker) rather than ``scheduled_tasks``: the first item comes sooner
            and the memory bound is tighter; the output is the same.
        max_workers: the number of threads, at least 1; ``None``: ``ThreadPoolExecutor``'s default,
            ``min(32, CPUs + 4)`` with the CPUs this process may use (6 on 2 CPUs, 20 on 16, 32 on
            128), read when the pipe is built.
        threadpool_kwargs: ``thread_name_prefix`` is accepted and not applied (the engine names
            its threads after the stage). ``initializer``/``initargs`` are refused: the worker
            threads are the engine's; do per-thread set-up inside ``fn`` (a ``threading.local``).

    Yields:
        ``fn(item)`` for each item (or the item with ``fn``'s result in ``output_col``), in source
        order.

    Raises:
        Whatever ``fn`` raises, as the same object, with a note naming the stage and the item's
        position; the rest of the work in flight is cancelled.
        TypeError: at construction, an unsupported ``threadpool_kwargs`` name.

    ``len()`` is the source's length.

    Checkpoint: as a concurrent ``map``, a pass's state holds the items in flight.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(5)).threadpool_map(lambda x: x * 10, max_workers=4))
        [0, 10, 20, 30, 40]
        >>> list(IterableWrapper([(i, i) for i in range(3)]).threadpool_map(lambda x: x * 10, input_col=1, output_col=-1))
        [(0, 0, 0), (1, 1, 10), (2, 2, 20)]

    See also: :class:`~datapipes.iter.Mapper` (``concurrency=``, ``ordered=False``, ``on_error``,
    ``timeout`` ...), :class:`~datapipes.iter.Prefetcher`.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        fn: Callable[..., U],
        input_col: _Col = None,
        output_col: _Col = None,
        scheduled_tasks: int = 128,
        max_workers: int | None = None,
        **threadpool_kwargs: Any,
    ) -> None:
        stage = "ThreadPoolMapper"
        require_pipe(source_datapipe, stage, "source_datapipe")
        require_callable(fn, stage, "fn")
        require_int(scheduled_tasks, stage, "scheduled_tasks")
        if scheduled_tasks <= 0:
            raise ValueError(phrased(stage, "'scheduled_tasks' is required to be a positive integer.",
                                     scheduled_tasks=scheduled_tasks))
        require_int(max_workers, stage, "max_workers", optional=True)
        if max_workers is not None and max_workers <= 0:
            raise ValueError(phrased(stage, "'max_workers' is required to be a positive integer.",
                                     max_workers=max_workers))
        refused = sorted(set(threadpool_kwargs) - _THREADPOOL_KWARGS)
        if refused:
            raise TypeError(f"{stage}: threadpool_kwargs {refused} are not supported: fn runs on the engine's worker "
                            "threads, which take no initializer; do per-thread set-up inside fn")
        _check_cols(input_col, output_col, stage)
        check_arity(fn, input_col, stage)
        workers = _default_workers() if max_workers is None else max_workers
        super().__init__(source_datapipe, fn, input_col, output_col, concurrency=min(workers, scheduled_tasks))
        self.scheduled_tasks = scheduled_tasks
        self.max_workers = max_workers
        self.threadpool_kwargs = dict(threadpool_kwargs)


# -- BatchAsyncMapper ------------------------------------------------------------------------------


@functional_datapipe("async_map_batches")
class BatchAsyncMapper(Mapper[U]):
    """Apply a coroutine function to every item, up to ``max_concurrency`` at once on the engine's
    event loop, yielding in source order (functional name: ``async_map_batches``).

    torchdata's ``async_map_batches`` gathers ``batch_size`` items, awaits ``async_fn`` on all of
    them together (at most ``max_concurrency`` at a time), then moves to the next batch. Here it is
    a concurrent :class:`~datapipes.iter.Mapper` with ``concurrency=min(batch_size,
    max_concurrency)`` and ``ordered=True``: the same items in the same order, without the wait at
    every batch boundary (a slow item no longer holds back the start of the next batch).

    Args:
        source_datapipe: the source pipe.
        async_fn: an ``async def`` function (or an object whose ``__call__`` is one), awaited once
            per item on the engine's event-loop thread.
        batch_size: the items torchdata awaits together, at least 1; with ``flatten=False`` the
            size of the batches yielded.
        input_col: apply ``async_fn`` to this column (or these columns) of each item, as in ``map``.
        output_col: where the result goes, as in ``map``: ``None`` replaces the input column,
            ``-1`` appends. Input items are not mutated.
        max_concurrency: the most calls awaited at once, at least 1 (default 32).
        flatten: ``True`` (default) yields the results one by one; ``False`` yields them in
            batches of ``batch_size`` (:class:`~datapipes.DataChunk`), as torchdata does; the pipe
            is then ``Batcher(BatchAsyncMapper(...), batch_size)``.

    Yields:
        ``await async_fn(item)`` for each item (or the item with the result in ``output_col``), in
        source order; with ``flatten=False``, lists of them.

    Raises:
        TypeError: ``async_fn`` is not a coroutine function (also a ``ValueError``, as torchdata's,
            with its words: "Expected a corotine function ..."); bad ``batch_size``/``max_concurrency``.
        Whatever ``async_fn`` raises, as the same object, with a note naming the stage and the
        item's position; the calls in flight are cancelled.

    ``len()`` is the source's length (with ``flatten=False``, the number of batches).

    Checkpoint: as a concurrent ``map``, a pass's state holds the items in flight.

    Example:
        >>> import asyncio
        >>> from datapipes.iter import IterableWrapper
        >>> async def times_ten(x):
        ...     await asyncio.sleep(0.001)
        ...     return x * 10
        >>> list(IterableWrapper(range(5)).async_map_batches(times_ten, batch_size=2))
        [0, 10, 20, 30, 40]
        >>> list(IterableWrapper(range(5)).async_map_batches(times_ten, 2, flatten=False))
        [[0, 10], [20, 30], [40]]

    See also: :class:`~datapipes.iter.Mapper` with an ``async def fn`` and ``concurrency=``, which
    this is; ``ordered=False`` there yields in completion order.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # flatten=False: the flat stage batched again (torchdata's batches, in the same order).
        # Without arguments (unpickling) a bare instance, as for every pipe.
        flatten = kwargs.get("flatten", args[6] if len(args) > 6 else True)
        if (args or kwargs) and flatten is False:
            flat = dict(kwargs, flatten=True)
            pipe = cls(*args[:6], **flat)
            return pipe.batch(pipe.batch_size)
        return super().__new__(cls)

    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        async_fn: Callable[..., Any],
        batch_size: int,
        input_col: _Col = None,
        output_col: _Col = None,
        max_concurrency: int = 32,
        flatten: bool = True,
    ) -> None:
        stage = "BatchAsyncMapper"
        require_pipe(source_datapipe, stage, "source_datapipe")
        require_callable(async_fn, stage, "async_fn")
        if not is_async_callable(async_fn):
            raise _NotCoroutine(f"{stage}: Expected a corotine function with an async def syntax, but got a "
                               f"{type(async_fn)} (use map(fn, concurrency=n) or threadpool_map for a plain "
                               "function)")
        require_int(batch_size, stage, "batch_size", minimum=1)
        require_int(max_concurrency, stage, "max_concurrency", minimum=1)
        require_bool(flatten, stage, "flatten", ints=True)
        _check_cols(input_col, output_col, stage)
        check_arity(async_fn, input_col, stage)
        super().__init__(source_datapipe, async_fn, input_col, output_col, concurrency=min(batch_size, max_concurrency))
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency
        # kept as torchdata names it; on the instance it shadows the functional ``flatten`` (a bool here)


# What inspect (help(), IDEs, the stub check) shows: __init__'s parameters, not __new__'s *args.
BatchAsyncMapper.__signature__ = inspect.signature(BatchAsyncMapper.__init__).replace(  # type: ignore[attr-defined]
    parameters=list(inspect.signature(BatchAsyncMapper.__init__).parameters.values())[1:]
)
