"""Random stages that shuffle inside a bounded unit rather than across the stream: InBatchShuffler
[in_batch_shuffle] (the items of each batch) and ShuffledFlatMapper [shuffled_flatmap] (the outputs of
a buffer of iterables). The stream's Shuffler [shuffle] is :mod:`datapipes.iter.combinatorics`'s, and
they are seeded as it is.

Names, parameters, defaults and outputs follow torchdata 0.9; the differences are listed in each
docstring. Every ``_open(ctx)`` reads its pass seed and creates its source's iterator (``ctx.open``) at
once, as part of the pass it is handed (:mod:`datapipes._runtime.passes`), and hands it to the
generator that does the work.

Checkpoint and resume (docs/howto/checkpoint.rst): ``in_batch_shuffle`` keeps its generator's state,
at no cost per item; ``shuffled_flatmap`` its generator's state and its buffer: its run holds the
list the loop fills (an iterator's outputs left are read back from it, or counted in C), and the
loop writes the index it draws once per output, and the item it reads and its position once per
item read.
"""

from __future__ import annotations

import random
from itertools import chain
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar, overload

from .._runtime.passes import Pass
from .._runtime.validate import check_bool, check_dict, check_int, check_list, check_loop_state, check_rng, invalid
from .._chunk import DataChunk
from .._engine import abandon, close_iterator
from .._engine.lifecycle import Resumable
from .._positions import Counted, remaining, skip
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_root, len_unknown, require_callable, require_int, require_pipe, source_len, stage_label
from ..errors import add_stage_note, call_lines, raised_at
from ._shared import _RELIES, _check_started
from .combinatorics import _rng_state, _set_rng_state
from .mapping._shared import _Col, _check_cols, _no_op, _selected_fn, check_arity

__all__ = ["InBatchShuffler", "ShuffledFlatMapper"]

T = TypeVar("T")
U = TypeVar("U")

_END = object()  # private marker: no item held (None is a valid item)

#: iterators whose items not yet yielded can be read back (:func:`datapipes._runtime.passes.remaining`)
_READABLE: frozenset[type] = frozenset((type(iter([])), type(iter(())), type(iter(""))))


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
        _set_rng_state(self.rng, check_rng(state))


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

    _saves = "the generator's state (625 ints); the batches are its source's"

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

    def _open(self, ctx: Pass) -> Iterator[list[T]]:
        if not self._enabled:
            batches: Iterator[Any] = ctx.open(self.datapipe)
            return batches
        # The seed first, then the source: unseeded passes draw from torch's generator in this order.
        # _pass_seed() is ctx.seed_for(self) here (ctx is the pass building this stage); kept as the
        # hook tests/compat/test_shuffling.py patches
        run = _RngRun(random.Random(self._pass_seed()))
        it = _in_batch_shuffle(self, ctx.open(self.datapipe), run)
        ctx.track(self, run)
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
        return {"item": n, "rest": remaining(it)}
    return {"item": n, "input": x, "done": counter.count()}


def _check_shuffled_flatmap(state: dict[str, Any], size: int) -> None:
    """The checks of a ``shuffled_flatmap`` state: its generator, the index drawn, the position, and
    at most ``size`` (``buffer_size``) slots, each the outputs left or the item and the count yielded."""
    check_dict(state, keys=("rng", "idx", "next", "draining", "slots"))
    check_rng(state)
    check_int(state, "idx", 0, size - 1, optional=True)
    check_int(state, "next")
    check_bool(state, "draining")
    for slot in check_list(state, "slots", size, limit=f"buffer_size={size}"):
        check_dict(slot, "a slot of state['slots']", keys=("item",))
        check_int(slot, "item")
        if "rest" in slot:
            check_list(slot, "rest")
        elif "input" in slot:
            check_int(slot, "done")
        else:
            invalid(f"a slot of state['slots'] holds neither 'rest' nor 'input': {slot!r:.100}")


def _reopened_all(call: Callable[[Any], Any] | None, slots: list[dict[str, Any]]) -> list[tuple[Any, Any, Any, int]]:
    return [_reopened(call, s) for s in slots]


class _ShuffledFlatMapRun(Resumable):
    """The position of a ``shuffled_flatmap`` pass: its generator (``rng``, whose state is read when
    a state is taken), the index drawn, the position of the source's next item, whether the source
    is exhausted (``draining``), the buffered iterators (``buf``, the list the loop fills, each saved
    as the outputs it has left, or as its item and the count of outputs yielded) and the item read
    but not yet buffered (``held``). The loop writes ``idx`` before each output and ``held`` and
    ``n`` as it reads an item (the item being held until it is buffered). A state taken before
    the first ``next()`` holds the generator too (a resumed pass then draws what this one would
    have); a pass that has ended saves ``{"ended": True}``."""

    __slots__ = ("rng", "size", "loaded", "ended", "idx", "n", "draining", "buf", "held", "slots")

    def __init__(self, rng: random.Random, size: int) -> None:
        super().__init__()
        self.rng = rng
        self.size = size  # the buffer's: buffer_size, or 1 with the shuffle off
        self.loaded: dict[str, Any] | None = None  # the state loaded, saved as it is until the pass starts
        self.ended = False
        self.idx: int | None = None  # None: drawn as the pass starts
        self.n = 0
        self.draining = False
        self.buf: list[tuple[Any, Any, Any, int]] = []
        self.held: Any = _END
        self.slots: list[dict[str, Any]] = []  # a resumed pass's: the buffer it opens again as it starts

    def state(self) -> dict[str, Any]:
        if not self.started:
            if self.loaded is not None:
                return dict(self.loaded)
            return {"rng": _rng_state(self.rng), "idx": None, "next": 0, "draining": False, "slots": []}
        if self.ended:
            return {"ended": True}
        state: dict[str, Any] = {
            "rng": _rng_state(self.rng),
            "idx": self.idx,
            "next": self.n,
            "draining": self.draining,
            "slots": [_slot_state(s) for s in self.buf],
        }
        if self.held is not _END:
            state["held"] = self.held
        return state

    def restore(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or not ("rng" in state or "ended" in state):
            raise ValueError(f"load_state_dict: not the state of a shuffled_flatmap: {str(state)[:200]}")
        if "ended" not in state:
            _check_shuffled_flatmap(state, self.size)
        super().restore(state)

    def load(self, state: dict[str, Any]) -> None:
        check_loop_state(state, needs_next=False)
        self.loaded, self.ended = state, "ended" in state
        if not self.ended:
            _set_rng_state(self.rng, state["rng"])
            self.idx, self.n, self.draining = state["idx"], state["next"], state["draining"]
            self.slots = list(state["slots"])
            self.held = state.get("held", _END)


def _shuffled_flatmap(pipe: ShuffledFlatMapper, it: Iterator[Any], run: _ShuffledFlatMapRun,
                      call: Callable[[Any], Any] | None) -> Iterator[Any]:
    # The draws are torchdata's: an index drawn first, then one after each output while the buffer
    # is full (none when an iterator runs out), and one before each output once the source is done.
    # ``buf`` is the run's list; the index drawn before an output, and the item being buffered and
    # its position as it is read, are written to the run (see _ShuffledFlatMapRun).
    size = run.size
    randint = run.rng.randint
    run.started = True
    buf = run.buf
    n = run.n  # the position of the next item read from the source
    slot: Any = None
    try:
        if run.ended:
            return
        if run.slots:
            buf += _reopened_all(call, run.slots)
            run.slots = []
        idx = run.idx
        if idx is None:
            run.idx = idx = randint(0, size - 1)
        if not run.draining:
            held = run.held
            for x in it if held is _END else chain((held,), it):
                run.held, run.n = x, n  # held until it is buffered
                while len(buf) == size:
                    slot = buf[idx]
                    try:
                        y = next(slot[0])
                    except StopIteration:
                        del buf[idx]
                        continue
                    run.idx = idx = randint(0, size - 1)
                    yield y
                buf.append(_opened(call, x, n))
                n += 1
            run.held, run.n, run.draining = _END, n, True
        while buf:
            idx = randint(0, len(buf) - 1)
            slot = buf[idx]
            try:
                y = next(slot[0])
            except StopIteration:
                del buf[idx]
                continue
            run.idx = idx
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
    finally:
        run.ended = True
        run.buf, run.held = [], _END  # let go of the buffer with the pass's frame


_SFM_CALL_LINES = call_lines(_shuffled_flatmap, "call")
_SFM_NEXT_LINES = call_lines(_shuffled_flatmap, "slot")


def _count_outputs(pipe: Any, source: IterDataPipe[Any]) -> int:
    """The sum of ``len(item)`` over a pass of ``source``, run as a pass of its own: a pass that
    is live and contains ``source`` is not joined (its position stays its own)."""
    pass_ = Pass(source)
    it = pass_.open(source)
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

    _saves = (
        "the generator's state (625 ints) and the buffer: at most ``buffer_size`` inputs, each as its outputs "
        "left or as the input and a count (as ``flatmap``)"
    )

    _is_random = True
    _repr_fields = ("fn",)

    @overload
    def __init__(
        self: IterDataPipe[U],
        datapipe: IterDataPipe[Iterable[U]],
        fn: None = ...,
        input_col: None = ...,
        buffer_size: int = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[U],
        datapipe: IterDataPipe[T],
        fn: Callable[[T], Iterable[U]],
        input_col: None = ...,
        buffer_size: int = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[Any],
        datapipe: IterDataPipe[T],
        fn: Callable[..., Iterable[Any]] | None = ...,
        input_col: _Col | None = ...,
        buffer_size: int = ...,
    ) -> None: ...
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

    def _open(self, ctx: Pass) -> Iterator[Any]:
        call: Callable[[Any], Any] | None
        if self.input_col is None:
            call = self.fn
        else:
            call = _selected_fn(_no_op if self.fn is None else self.fn, self.input_col)
        if self._enabled:
            # The seed first, then the source: unseeded passes draw from torch's generator in this order.
            # _pass_seed() is ctx.seed_for(self) here; kept as the hook tests/compat/test_shuffling.py patches
            rng, size = random.Random(self._pass_seed()), self.buffer_size
        else:  # one iterable at a time: flatmap's order (the draws are all 0)
            rng, size = random.Random(0), 1
        it = ctx.open(self.datapipe)
        run = _ShuffledFlatMapRun(rng, size)
        ctx.track(self, run)
        return _shuffled_flatmap(self, it, run, call)

    def __len__(self) -> int:
        if self.fn is None and self.input_col is None:
            return _count_outputs(self, self.datapipe)
        raise len_unknown(self, f"{type(self).__name__}'s {_RELIES}.", _RELIES)
