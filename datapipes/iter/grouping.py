"""Stages that gather items into groups: BucketBatcher [bucketbatch] (batches of a sorted buffer),
Grouper [groupby] (by key). Batches by count (``batch``, ``unbatch``) are :mod:`datapipes.iter.batching`'s.

The hot loops are bare generators chosen once at construction. Every ``_open(ctx)`` creates its source's
iterator (``ctx.open``; and reads its pass seed, ``ctx.seed_for``) at once, as part of the pass it is
handed (:mod:`datapipes._runtime.passes`), and hands it to the generator that does the work; a generator
left by an exception (or closed early) closes that iterator, so the upstream is released at once.

Checkpoint and resume (docs/howto/checkpoint.rst): ``Grouper``'s run holds the dict of groups its
loop fills, and the loop writes the items read before it yields a group (never per item); once
the source is exhausted, the iterator over the groups left, whose groups not yet yielded a copy of
it lists. ``BucketBatcher`` records its buffers once per pool, bucket or buffer (the lists are
mutated in place), and its RNG state.
"""

from __future__ import annotations

import random
from itertools import islice
from typing import Any, Callable, Hashable, Iterable, Iterator, Literal, TypeVar, overload

from .._runtime.passes import Pass
from .._runtime.validate import check_dict, check_int, check_list, check_rng, invalid
from .._engine import abandon
from .._positions import remaining
from .._checks import ArgumentError, phrased, require_bool
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_callable, require_int, require_pipe, source_len, stage_label
from ..errors import add_stage_note
from .batching import _BATCH_SIZE_ASSERT, _batches, _count_batches, _full_batches
from .._engine.lifecycle import Resumable

__all__ = ["BucketBatcher", "Grouper"]

T = TypeVar("T")
Key = TypeVar("Key")

#: torch DataPipes' words where they assert on the sizes of ``groupby``.
_GROUP_SIZE_ASSERT = "group_size must be > 0 and <= buffer_size"
_GUARANTEED_ASSERT = "guaranteed_group_size must be > 0 and <= group_size and group_size must be set"


# -- BucketBatcher ---------------------------------------------------------------------------------


class _Buffer:
    """A streaming buffer shuffle's position: the buffer (a list it mutates in place), then, once its
    source is exhausted, the iterator over the shuffled buffer it yields from."""

    __slots__ = ("buffer", "drain")

    def __init__(self) -> None:
        self.buffer: list[Any] = []
        self.drain: Iterator[Any] | None = None

    def state(self, copy: Callable[[Any], Any]) -> dict[str, Any]:
        if self.drain is not None:
            return {"drain": [copy(x) for x in remaining(self.drain)]}
        return {"buffer": [copy(x) for x in self.buffer]}

    def restore(self, state: dict[str, Any], copy: Callable[[Any], Any]) -> None:
        check_dict(state)
        check_list(state, "drain" if "drain" in state else "buffer")
        if "drain" in state:
            self.drain = iter([copy(x) for x in state["drain"]])
        else:
            self.buffer = [copy(x) for x in state["buffer"]]


def _buffer_shuffle(it: Iterator[Any], size: int, rng: random.Random, at: _Buffer) -> Iterator[Any]:
    """Shuffle through a buffer of ``size`` items: each new item replaces a random one, yielded.
    The buffer is updated before each ``yield``, so ``at`` reads a position between two items."""
    if at.drain is None:
        buffer = at.buffer
        randrange = rng.randrange
        for x in it:
            if len(buffer) == size:
                i = randrange(size)
                y = buffer[i]
                buffer[i] = x
                yield y
            else:
                buffer.append(x)
        rng.shuffle(buffer)
        at.drain = iter(buffer)
    yield from at.drain


def _sort_bucket(
    pipe: BucketBatcher, sorter: Callable[[list[Any]], Iterable[Any]], bucket: list[Any], b: int
) -> list[Any]:
    try:
        result = sorter(bucket)
        if result is None:
            raise TypeError(
                f"{stage_label(pipe)}: sort_key returned None; it must return the sorted bucket "
                "(e.g. sorted(bucket), not bucket.sort())"
            )
        return list(result)
    except Exception as e:
        add_stage_note(e, stage_label(pipe), b, "bucket")
        raise


def _sorted_buckets(
    pipe: BucketBatcher, sorter: Callable[[list[Any]], Iterable[Any]], it: Iterator[Any], size: int, run: _BucketRun
) -> Iterator[Any]:
    """The items of each bucket of ``size`` items, sorted; ``run.rest`` is the current bucket's
    iterator and ``run.buckets`` counts the buckets sorted (both written once per bucket)."""
    if run.rest is not None:
        yield from run.rest
    while bucket := list(islice(it, size)):
        result = _sort_bucket(pipe, sorter, bucket, run.buckets)
        run.buckets += 1
        run.rest = rest = iter(result)
        yield from rest


def _rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


class _BucketRun(Resumable):
    """The position of a bucket-batching pass, between two batches: the RNG state, then

    - pooled (``use_in_batch_shuffle=True``): every stage of a pool runs when its first batch is
      asked for, so the position is the batches of the current pool not yet yielded (``rest``, at
      most ``batch_size * batch_num * bucket_num`` items) and the number of buckets sorted;
    - streaming: the item shuffle's buffer (at most ``batch_size * batch_num * bucket_num`` items),
      the rest of the current sorted bucket (``rest``, at most ``batch_size * batch_num`` items), the
      number of buckets sorted and the batch shuffle's buffer (at most ``batch_size * batch_num``
      batches).

    Written once per pool, bucket or buffer; the buffers are the lists the loops mutate.
    """

    __slots__ = ("rng", "pooled", "rest", "buckets", "items", "batches")

    def __init__(self, seed: int, pooled: bool) -> None:
        self.rng = random.Random(seed)
        self.pooled = pooled
        self.rest: Iterator[Any] | None = None  # pooled: the batches of the pool; streaming: the bucket's items
        self.buckets = 0
        self.items = _Buffer()
        self.batches = _Buffer()
        self.started = False

    def state(self) -> dict[str, Any]:
        rest = [] if self.rest is None else remaining(self.rest)
        state: dict[str, Any] = {"rng": _rng_state(self.rng), "buckets": self.buckets}
        if self.pooled:
            state["rest"] = [list(batch) for batch in rest]  # a consumer may change a batch once yielded
        else:
            state.update(items=self.items.state(_same), rest=rest, batches=self.batches.state(list))
        return state

    def load(self, state: dict[str, Any]) -> None:
        check_dict(state, keys=("rng", "buckets", "rest"))
        check_rng(state)
        check_int(state, "buckets")
        if self.pooled:
            if any(type(batch) not in (list, tuple) for batch in check_list(state, "rest")):
                invalid(f"state['rest'] must be a list of batches, got {state['rest']!r:.100}")
        else:
            check_list(state, "rest")
            for key in ("items", "batches"):
                check_dict(state, keys=(key,))
                check_dict(state[key], f"state[{key!r}]")
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.buckets = state["buckets"]
        if self.pooled:
            self.rest = iter([list(batch) for batch in state["rest"]])
        else:
            self.rest = iter(list(state["rest"]))
            self.items.restore(state["items"], _same)
            self.batches.restore(state["batches"], list)


def _same(x: Any) -> Any:
    return x


def _bucket_pools(pipe: BucketBatcher, source: Iterator[Any], run: _BucketRun) -> Iterator[list[Any]]:
    """``use_in_batch_shuffle=True``: one pool at a time, every step of it before its first batch."""
    run.started = True
    rng = run.rng
    size = pipe.batch_size
    bucket_size = size * pipe.batch_num
    pool_size = bucket_size * pipe.bucket_num
    sorter = pipe._sorter
    shuffle_items = sorter is None or pipe.bucket_num > 1
    groups = pipe.bucket_num
    drop_last = pipe.drop_last
    try:
        if run.rest is not None:
            yield from run.rest
        while pool := list(islice(source, pool_size)):
            if shuffle_items:
                rng.shuffle(pool)
            if sorter is not None:
                b = run.buckets
                buckets: list[Any] = []
                for i in range(0, len(pool), bucket_size):
                    buckets += _sort_bucket(pipe, sorter, pool[i:i + bucket_size], b)
                    b += 1
                run.buckets = b
                pool = buckets
            batches = [pool[i:i + size] for i in range(0, len(pool), size)]
            if drop_last and len(batches[-1]) < size:
                batches.pop()
            if sorter is not None and groups > 1:  # torchdata's order: groups of bucket_num batches
                for i in range(0, len(batches), groups):
                    group = batches[i:i + groups]
                    rng.shuffle(group)
                    batches[i:i + groups] = group
            run.rest = rest = iter(batches)
            yield from rest
    except BaseException:
        abandon(source)  # this frame names it: release the upstream now, not at collection
        raise


def _bucket_stream(pipe: BucketBatcher, source: Iterator[Any], run: _BucketRun) -> Iterator[list[Any]]:
    """``use_in_batch_shuffle=False``: streaming buffer shuffles of items and of batches."""
    run.started = True
    rng = run.rng
    bucket_size = pipe.batch_size * pipe.batch_num
    sorter = pipe._sorter
    items: Iterator[Any] = source
    if sorter is None or pipe.bucket_num > 1:
        items = _buffer_shuffle(items, bucket_size * pipe.bucket_num, rng, run.items)
    if sorter is not None:
        items = _sorted_buckets(pipe, sorter, items, bucket_size, run)
    batches = (_full_batches if pipe.drop_last else _batches)(items, pipe.batch_size)
    if sorter is not None:
        batches = _buffer_shuffle(batches, bucket_size, rng, run.batches)  # torchdata's buffer: bucket_size batches
    try:
        yield from batches
    except BaseException:
        abandon(source)  # this frame names it: release the upstream now, not at collection
        raise


def _by_key(key: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    def sort_bucket(bucket: list[Any]) -> list[Any]:
        bucket.sort(key=key)
        return bucket

    return sort_bucket


@functional_datapipe("bucketbatch")
class BucketBatcher(IterDataPipe[list[T]]):
    """Batch items of similar size together: sort buckets of items, cut them into batches and
    shuffle the batches (functional name: ``bucketbatch``).

    Items are read in pools of ``bucket_num`` buckets of ``batch_num`` batches
    (``pool_size = batch_size * batch_num * bucket_num`` items), as in torchdata:

    1. without a sort, or with ``bucket_num > 1``: the items of each pool are shuffled, so each
       bucket is a random sample of the pool;
    2. with a sort: each bucket of ``batch_size * batch_num`` items is sorted (``sort_key`` or
       ``key``);
    3. the items are cut into batches of ``batch_size`` (only the one cut from the end of the data
       can be short, and ``drop_last`` drops it);
    4. with a sort: the batches are shuffled in groups of ``bucket_num`` consecutive batches, so
       with ``bucket_num=1`` they keep the sorted order of their bucket.

    With ``use_in_batch_shuffle=False`` steps 1 and 4 use streaming buffer shuffles (an item can
    then move across pools): of ``pool_size`` items in step 1 and of ``batch_size * batch_num``
    batches in step 4. These are torchdata's steps and sizes, so the same batches can come in the
    same places (the random draws are not torchdata's).

    This is a random stage: the order comes from :meth:`set_seed` / :meth:`set_epoch`, or from
    torch's global generator when unseeded. A pass's state holds its RNG state and what it holds
    between two batches: the current pool's batches not yet yielded (at most ``pool_size`` items);
    streaming, the item buffer, the rest of the current bucket and the batch buffer.

    Args:
        datapipe: the source pipe.
        batch_size: the number of items per batch, at least 1.
        drop_last: drop the last batch when it holds fewer than ``batch_size`` items.
        batch_num: the number of batches in a bucket, at least 1.
        bucket_num: the number of buckets in a pool, at least 1.
        sort_key: as in torchdata, a function taking a bucket (a list of items) and returning it
            sorted (e.g. ``lambda bucket: sorted(bucket, key=len)``). It must return the same items.
        use_in_batch_shuffle: shuffle each pool as a whole (default), or through a streaming buffer.
        key: instead of ``sort_key``, a function of one item: buckets are sorted by it.

    Yields:
        Lists of ``batch_size`` items (the last one may be shorter unless ``drop_last``).

    Raises:
        ValueError/TypeError: bad arguments, or both ``sort_key`` and ``key``.
        Whatever ``sort_key`` or ``key`` raises, as the same object, with a note naming the stage
        and the bucket's position; ``TypeError`` when ``sort_key`` returns ``None``.

    ``len()`` is ``ceil(len(datapipe) / batch_size)`` (``floor`` with ``drop_last``); with
    ``sort_key``, which may return a bucket of another size, it is unknown (``TypeError``, as in
    torchdata).

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> words = IterableWrapper(["bbb", "a", "cccc", "dd", "eeeee", "f"])
        >>> list(words.bucketbatch(batch_size=2, key=len))  # one bucket: its batches stay sorted
        [['a', 'f'], ['dd', 'bbb'], ['cccc', 'eeeee']]
        >>> pipe = words.bucketbatch(batch_size=1, batch_num=2, bucket_num=3, key=len).set_seed(0)
        >>> sorted(len(b[0]) for b in pipe)  # pooled, sorted by bucket, shuffled in groups of 3
        [1, 1, 2, 3, 4, 5]
        >>> list(pipe) == list(pipe)  # the same order for the same seed
        True

    See also: :class:`Batcher`, :class:`~datapipes.iter.Shuffler`.
    """

    _saves = (
        "the generator's state (625 ints) and the batches of the current pool not yet yielded (at most "
        "``batch_size * batch_num * bucket_num`` items); with ``use_in_batch_shuffle=False``: the item "
        "shuffle's buffer (at most as many items), the rest of the sorted bucket and the batch shuffle's "
        "buffer (at most ``batch_size * batch_num`` batches)"
    )

    _repr_fields = ("batch_size",)
    _is_random = True

    def __init__(
        self,
        datapipe: IterDataPipe[T],
        batch_size: int,
        drop_last: bool = False,
        batch_num: int = 100,
        bucket_num: int = 1,
        sort_key: Callable[[list[T]], Iterable[T]] | None = None,
        use_in_batch_shuffle: bool = True,
        *,
        key: Callable[[T], Any] | None = None,
    ) -> None:
        stage = "BucketBatcher"
        require_pipe(datapipe, stage)
        # torchdata asserts these three: ValueError and AssertionError, with its words
        require_int(batch_size, stage, "batch_size", minimum=1, torch_assert=_BATCH_SIZE_ASSERT)
        require_int(batch_num, stage, "batch_num", minimum=1,
                    torch_assert="Number of batches is required to be larger than 0!")
        require_int(bucket_num, stage, "bucket_num", minimum=1,
                    torch_assert="Number of buckets is required to be larger than 0!")
        require_callable(sort_key, stage, "sort_key", optional=True)
        require_callable(key, stage, "key", optional=True)
        if sort_key is not None and key is not None:
            raise ValueError(f"{stage}: give sort_key (sorts a bucket) or key (of one item), not both")
        self.datapipe = datapipe
        self.batch_size = batch_size
        self.drop_last = require_bool(drop_last, stage, "drop_last", ints=True)
        self.batch_num = batch_num
        self.bucket_num = bucket_num
        self.sort_key = sort_key
        self.use_in_batch_shuffle = require_bool(use_in_batch_shuffle, stage, "use_in_batch_shuffle", ints=True)
        self.key = key
        self._sorter = sort_key if key is None else _by_key(key)

    def _open(self, ctx: Pass) -> Iterator[list[T]]:
        # The seed first, then the source: unseeded passes draw from torch's generator in this order.
        run = _BucketRun(ctx.seed_for(self), self.use_in_batch_shuffle)
        source = ctx.open(self.datapipe)
        ctx.track(self, run)
        return (_bucket_pools if self.use_in_batch_shuffle else _bucket_stream)(self, source, run)

    def __len__(self) -> int:
        if self.sort_key is not None:  # as torchdata's: it may return a bucket of another size
            raise len_unknown(self, "sort_key may return a bucket of another size (key= keeps the length)", NO_LEN)
        return _count_batches(source_len(self, self.datapipe), self.batch_size, self.drop_last)


# -- Grouper ---------------------------------------------------------------------------------------


def _unhashable_note(e: TypeError, pipe: Grouper, n: int, key: Any) -> None:
    add_stage_note(e, stage_label(pipe), n)
    if type(key).__hash__ is None:
        e.add_note(
            f"{stage_label(pipe)}: group_key_fn returned a key of type {type(key).__name__} for item {n}, "
            "which is unhashable; return a hashable key (a tuple instead of a list, a str, an int)"
        )


def _check_group_state(state: dict[str, Any], size: int | None) -> None:
    """The checks of a ``groupby`` pass's state: ``ended`` (True), or the items read and the groups
    started, ``[key, items]`` pairs holding at most ``size`` (``buffer_size``) items together."""
    check_dict(state)
    if "ended" in state and state["ended"] is not True:
        invalid(f"state['ended'] must be True, got {state['ended']!r:.100}")
    if "next" in state or "ended" not in state:
        check_int(state, "next")
    if "ended" in state:
        return
    groups = check_list(state, "groups", default=[])
    for group in groups:
        if type(group) not in (list, tuple) or len(group) != 2 or type(group[1]) not in (list, tuple):
            invalid(f"state['groups'] must hold [key, items] pairs, got {group!r:.100}")
        hash(group[0])  # a group's key: TypeError (naming no stage, which the pass adds) if it cannot be one
    held = sum(len(group[1]) for group in groups)
    if size is not None and "draining" not in state and held > size:
        invalid(f"state['groups'] holds {held} items, more than buffer_size={size} allows")
    if "draining" in state and state["draining"] is not True:
        invalid(f"state['draining'] must be True, got {state['draining']!r:.100}")


class _GroupRun(Resumable):
    """The position of a ``groupby`` pass: the items read and the groups held, in the order they
    were started (at most ``buffer_size`` items); once the source is exhausted, the groups not yet
    yielded. A pass that has ended saves ``{"ended": True}``.

    ``groups`` is the dict the loop fills (a resumed pass's, rebuilt from the state); the loop writes
    ``n`` before it yields a group, and ``drain``, the iterator over the groups left, once."""

    __slots__ = ("buffer_size", "loaded", "ended", "n", "groups", "draining", "drain")

    def __init__(self, buffer_size: int | None) -> None:
        super().__init__()
        self.buffer_size = buffer_size
        self.loaded: dict[str, Any] | None = None  # the state loaded, saved as it is until the pass starts
        self.ended = False
        self.n = 0
        self.groups: dict[Any, list[Any]] = {}
        self.draining = False  # a resumed pass whose source was exhausted: it yields the groups left
        self.drain: Iterator[tuple[Any, list[Any]]] | None = None

    def state(self) -> dict[str, Any]:
        if not self.started:
            return {"next": 0} if self.loaded is None else dict(self.loaded)
        if self.ended:
            return {"ended": True}
        if self.drain is not None:
            return {"next": self.n, "groups": [[k, list(g)] for k, g in remaining(self.drain)], "draining": True}
        return {"next": self.n, "groups": [[k, list(g)] for k, g in self.groups.items()]}

    def load(self, state: dict[str, Any]) -> None:
        _check_group_state(state, self.buffer_size)
        self.loaded, self.ended = state, "ended" in state
        if not self.ended:
            self.n = state["next"]
            self.groups = {key: list(group) for key, group in state.get("groups", ())}
            self.draining = "draining" in state


def _group_run(pipe: Grouper, it: Iterator[Any], run: _GroupRun) -> Iterator[Any]:
    fn = pipe.group_key_fn
    keep_key = pipe.keep_key
    # 0 never equals a group's length after an append; -1 never equals the buffer's fill.
    group_size = pipe.group_size or 0
    buffer_size = -1 if pipe.buffer_size is None else pipe.buffer_size
    guaranteed = pipe._guaranteed
    drop_remaining = pipe.drop_remaining
    run.started = True
    if run.ended:
        return
    # The position (see _GroupRun): ``groups`` is the run's dict; ``n`` (the items read) is written
    # to the run before a group is yielded; once the source is exhausted, ``drain`` (the groups
    # left, yielded in the order they were started) too.
    groups = run.groups
    n = run.n
    held = sum(map(len, groups.values()))
    source: Iterable[Any] = () if run.draining else it  # draining: it is exhausted
    try:
        for x in source:
            try:
                key = fn(x)
            except Exception as e:
                add_stage_note(e, stage_label(pipe), n)
                raise
            try:
                group = groups.get(key)
            except TypeError as e:
                _unhashable_note(e, pipe, n, key)
                raise
            if group is None:
                groups[key] = group = [x]
            else:
                group.append(x)
            n += 1
            held += 1
            if len(group) == group_size:
                del groups[key]
                held -= group_size
                run.n = n
                yield (key, group) if keep_key else group
            if held == buffer_size:
                big = max(groups, key=lambda k: len(groups[k]))
                group = groups.pop(big)
                held -= len(group)
                if guaranteed is None or len(group) >= guaranteed:
                    run.n = n
                    yield (big, group) if keep_key else group
                elif not drop_remaining:
                    raise RuntimeError(
                        f"{stage_label(pipe)}: the buffer is full ({buffer_size} items) at item {n - 1} and its "
                        f"largest group (key {big!r:.80}, {len(group)} items) is smaller than "
                        f"guaranteed_group_size={guaranteed}; raise buffer_size, lower guaranteed_group_size, "
                        "or pass drop_remaining=True to drop such groups"
                    )
        run.n = n
        run.drain = drain = iter(list(groups.items()))
        for key, group in drain:
            yield (key, group) if keep_key else group
    except BaseException:
        abandon(it)
        raise
    finally:
        run.ended = True
        run.groups, run.drain = {}, None  # let go of the groups with the pass's frame


@functional_datapipe("groupby")
class Grouper(IterDataPipe[Any]):
    """Group items by key, yielding each group as a list (functional name: ``groupby``).

    Items are read in order and buffered by ``group_key_fn(item)``. A group is yielded as soon as it
    holds ``group_size`` items. When the buffer holds ``buffer_size`` items, its largest group is
    taken out: yielded if it holds at least ``guaranteed_group_size`` items, otherwise dropped with
    ``drop_remaining`` or a ``RuntimeError``. At the end every group left is yielded, in the order
    the groups were started, whatever its size.

    Args:
        datapipe: the source pipe.
        group_key_fn: returns an item's group key, which must be hashable.
        keep_key: yield ``(key, group)`` pairs instead of groups.
        buffer_size: the most items held at once (``None``: no bound).
        group_size: yield a group as soon as it holds this many items (``None``: at the end, or
            when the buffer is full). At most ``buffer_size``.
        guaranteed_group_size: the smallest group that may be yielded when the buffer is full, at
            most ``group_size`` (which it needs). Defaults to ``group_size`` when that is given, as
            in torch: a full buffer is then an error unless ``drop_remaining``.
        drop_remaining: when the buffer is full and its largest group is smaller than
            ``guaranteed_group_size``, drop that group instead of raising.

    Yields:
        Lists of items sharing a key (``(key, list)`` with ``keep_key``), each in source order.

    Raises:
        Whatever ``group_key_fn`` raises, as the same object, with a note naming the stage and the
            item's position. An unhashable key raises Python's own ``TypeError`` object
            (``unhashable type: 'list'``) with two notes: the stage and item position, and the key's type.
        RuntimeError: the buffer is full and its largest group is smaller than
            ``guaranteed_group_size`` (without ``drop_remaining``).

    ``len()`` raises ``TypeError``: the number of groups is known only after iterating.

    Unlike torch DataPipes, with ``keep_key`` a group taken out of a full buffer is paired with its
    own key (torch pairs it with the key of the item just read).

    A pass's state holds the groups held, keys and items (at most ``buffer_size`` items).

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> files = IterableWrapper(["a.png", "b.png", "a.json", "b.json", "a.jpg", "c.json"])
        >>> list(files.groupby(lambda f: f.split(".")[0]))
        [['a.png', 'a.json', 'a.jpg'], ['b.png', 'b.json'], ['c.json']]
        >>> list(files.groupby(lambda f: f.split(".")[0], group_size=2, keep_key=True))
        [('a', ['a.png', 'a.json']), ('b', ['b.png', 'b.json']), ('a', ['a.jpg']), ('c', ['c.json'])]

    See also: :class:`BucketBatcher`, :class:`~datapipes.iter.Demultiplexer`.
    """

    _saves = "the groups held, keys and items (at most ``buffer_size`` items)"

    _repr_fields = ("group_key_fn",)

    @overload
    def __init__(
        self: IterDataPipe[list[T]],
        datapipe: IterDataPipe[T],
        group_key_fn: Callable[[T], Hashable],
        *,
        keep_key: Literal[False] = ...,
        buffer_size: int | None = ...,
        group_size: int | None = ...,
        guaranteed_group_size: int | None = ...,
        drop_remaining: bool = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[tuple[Key, list[T]]],
        datapipe: IterDataPipe[T],
        group_key_fn: Callable[[T], Key],
        *,
        keep_key: Literal[True],
        buffer_size: int | None = ...,
        group_size: int | None = ...,
        guaranteed_group_size: int | None = ...,
        drop_remaining: bool = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[Any],
        datapipe: IterDataPipe[T],
        group_key_fn: Callable[[T], Hashable],
        *,
        keep_key: bool = ...,
        buffer_size: int | None = ...,
        group_size: int | None = ...,
        guaranteed_group_size: int | None = ...,
        drop_remaining: bool = ...,
    ) -> None: ...
    def __init__(
        self,
        datapipe: IterDataPipe[T],
        group_key_fn: Callable[[T], Hashable],
        *,
        keep_key: bool = False,
        buffer_size: int | None = 10000,
        group_size: int | None = None,
        guaranteed_group_size: int | None = None,
        drop_remaining: bool = False,
    ) -> None:
        stage = "Grouper"
        require_pipe(datapipe, stage)
        require_callable(group_key_fn, stage, "group_key_fn")
        # Where torch asserts (a group_size set with a buffer, a guaranteed_group_size), the
        # ValueError is also an AssertionError that ends with torch's words.
        sized = group_size is not None
        require_int(buffer_size, stage, "buffer_size", minimum=1, optional=True,
                    torch_assert=_GROUP_SIZE_ASSERT if sized else None)
        require_int(group_size, stage, "group_size", minimum=1, optional=True,
                    torch_assert=_GROUP_SIZE_ASSERT if buffer_size is not None else None)
        require_int(guaranteed_group_size, stage, "guaranteed_group_size", minimum=1, optional=True,
                    torch_assert=_GUARANTEED_ASSERT)
        if group_size is not None and buffer_size is not None and group_size > buffer_size:
            raise ArgumentError(phrased(stage, _GROUP_SIZE_ASSERT, group_size=group_size, buffer_size=buffer_size))
        if guaranteed_group_size is not None and (group_size is None or guaranteed_group_size > group_size):
            raise ArgumentError(phrased(stage, _GUARANTEED_ASSERT, guaranteed_group_size=guaranteed_group_size,
                                        group_size=group_size))
        self.datapipe = datapipe
        self.group_key_fn = group_key_fn
        self.keep_key = require_bool(keep_key, stage, "keep_key", ints=True)
        self.buffer_size = buffer_size
        self.group_size = group_size
        self.guaranteed_group_size = guaranteed_group_size
        self.drop_remaining = require_bool(drop_remaining, stage, "drop_remaining", ints=True)
        self._guaranteed = group_size if guaranteed_group_size is None else guaranteed_group_size

    def _open(self, ctx: Pass) -> Iterator[Any]:
        it = ctx.open(self.datapipe)
        run = _GroupRun(self.buffer_size)
        ctx.track(self, run)
        return _group_run(self, it, run)

    def __len__(self) -> int:
        raise len_unknown(self, "the number of groups is known only after iterating", NO_LEN)
