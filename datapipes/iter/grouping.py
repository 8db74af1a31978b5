"""Stages that gather items into lists: Batcher [batch], Unbatcher [unbatch],
BucketBatcher [bucketbatch], Grouper [groupby].

The hot loops are bare generators chosen once at construction. ``Batcher`` cuts batches with
``list(islice(it, batch_size))``, which builds each batch in C: about 12 ns per item here against
about 30 ns for a Python loop appending item by item.

Every ``__iter__`` creates its source's iterator (and reads its pass seed) at once, as part of the pass
being built (:mod:`datapipes._pass`), and hands it to the generator that does the work; a generator
left by an exception (or closed early) closes that iterator, so the upstream is released at once.
"""

from __future__ import annotations

import random
from itertools import islice
from typing import Any, Callable, Hashable, Iterable, Iterator, TypeVar

from .._engine import abandon
from ..datapipe import IterDataPipe, functional_datapipe, len_unknown, require_callable, require_int, require_pipe, stage_label
from ..errors import add_stage_note, call_lines, raised_at

__all__ = ["Batcher", "Unbatcher", "BucketBatcher", "Grouper"]

T = TypeVar("T")

#: The containers :class:`Unbatcher` treats as batches.
_BATCH = (list, tuple)


def _require_flag(value: Any, stage: str, name: str) -> bool:
    """``value`` as a bool; ``TypeError`` naming ``stage`` and ``name`` unless it is a bool or an int."""
    if not isinstance(value, int):
        raise TypeError(f"{stage}: {name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _count_batches(n: int, batch_size: int, drop_last: bool) -> int:
    return n // batch_size if drop_last else -(-n // batch_size)


# -- Batcher ---------------------------------------------------------------------------------------


def _batches(it: Iterator[Any], n: int) -> Iterator[list[Any]]:
    # Stops at the first short batch, so an exhausted source is not asked again.
    while len(batch := list(islice(it, n))) == n:
        yield batch
    if batch:
        yield batch


def _full_batches(it: Iterator[Any], n: int) -> Iterator[list[Any]]:
    while len(batch := list(islice(it, n))) == n:
        yield batch


def _batch_keep(pipe: Batcher, it: Iterator[Any] | None = None) -> Iterator[list[Any]]:
    n = pipe.batch_size
    if it is None:  # the map-style Batcher's iteration, which reads its source by position
        it = iter(pipe.datapipe)
    try:
        while len(batch := list(islice(it, n))) == n:
            yield batch
        if batch:
            yield batch
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


def _batch_drop(pipe: Batcher, it: Iterator[Any] | None = None) -> Iterator[list[Any]]:
    n = pipe.batch_size
    if it is None:  # the map-style Batcher's iteration, which reads its source by position
        it = iter(pipe.datapipe)
    try:
        while len(batch := list(islice(it, n))) == n:
            yield batch
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
            yield fn(batch)
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
        batch_size: the number of items per batch, at least 1.
        drop_last: drop the last batch when it holds fewer than ``batch_size`` items.
        wrapper_class: called on each batch (a new ``list``) before it is yielded, e.g. ``tuple``
            or torch's ``DataChunk``. ``list`` (the default) yields the list itself.

    Yields:
        Lists of ``batch_size`` items in source order; the last one may be shorter unless
        ``drop_last``.

    Raises:
        Whatever the source raises, unchanged; whatever ``wrapper_class`` raises, as the same object
        with a note naming the stage and the batch's position.

    ``len()`` is ``ceil(len(datapipe) / batch_size)`` (``floor`` with ``drop_last``), computed from
    the source at call time.

    >>> from datapipes.iter import IterableWrapper
    >>> list(IterableWrapper(range(7)).batch(3))
    [[0, 1, 2], [3, 4, 5], [6]]
    >>> list(IterableWrapper(range(7)).batch(3, drop_last=True, wrapper_class=tuple))
    [(0, 1, 2), (3, 4, 5)]

    See also: :class:`Unbatcher`, :class:`BucketBatcher`, :class:`Grouper`.
    """

    _repr_fields = ("batch_size",)
    _batch_what = "batch"  # what the note on a wrapper_class error calls the failing batch

    def __init__(
        self,
        datapipe: IterDataPipe[T],
        batch_size: int,
        drop_last: bool = False,
        wrapper_class: Callable[[list[T]], Any] = list,
    ) -> None:
        require_pipe(datapipe, "Batcher")
        require_int(batch_size, "Batcher", "batch_size", minimum=1)
        require_callable(wrapper_class, "Batcher", "wrapper_class")
        self.datapipe = datapipe
        self.batch_size = batch_size
        self.drop_last = _require_flag(drop_last, "Batcher", "drop_last")
        self.wrapper_class = wrapper_class
        self._run: Callable[[Batcher, Iterator[Any] | None], Iterator[Any]]
        if wrapper_class is list:
            self._run = _batch_drop if self.drop_last else _batch_keep
        else:
            self._run = _batch_wrap

    def __iter__(self) -> Iterator[Any]:
        return self._run(self, iter(self.datapipe))

    def __len__(self) -> int:
        return _count_batches(len(self.datapipe), self.batch_size, self.drop_last)  # type: ignore[arg-type]


# -- Unbatcher -------------------------------------------------------------------------------------


def _not_a_batch(pipe: Unbatcher, value: Any, path: tuple[int, ...]) -> TypeError:
    where = f"item {path[0]}" + "".join(f"[{j}]" for j in path[1:])
    kind = type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    return TypeError(
        f"{stage_label(pipe)}: {where} is {article} {kind}, not a list or tuple; "
        f"unbatch_level={pipe.unbatch_level} is deeper than the nesting of the data"
    )


def _unbatch_none(pipe: Unbatcher, it: Iterator[Any]) -> Iterator[Any]:
    return it  # items pass as they are: the source's own iterator, no generator in between


def _unbatch_one(pipe: Unbatcher, it: Iterator[Any]) -> Iterator[Any]:
    n = 0
    try:
        for batch in it:
            if not isinstance(batch, _BATCH):
                raise _not_a_batch(pipe, batch, (n,))
            yield from batch
            n += 1
    except BaseException:
        abandon(it)
        raise


def _dive(pipe: Unbatcher, batch: Any, level: int, path: tuple[int, ...]) -> Iterator[Any]:
    if not isinstance(batch, _BATCH):
        raise _not_a_batch(pipe, batch, path)
    if level == 1:
        yield from batch
        return
    for j, inner in enumerate(batch):
        yield from _dive(pipe, inner, level - 1, (*path, j))


def _unbatch_deep(pipe: Unbatcher, it: Iterator[Any]) -> Iterator[Any]:
    level = pipe.unbatch_level
    n = 0
    try:
        for batch in it:
            yield from _dive(pipe, batch, level, (n,))
            n += 1
    except BaseException:
        abandon(it)
        raise


def _flatten(batch: Any) -> Iterator[Any]:
    for x in batch:
        if isinstance(x, _BATCH):
            yield from _flatten(x)
        else:
            yield x


def _unbatch_all(pipe: Unbatcher, it: Iterator[Any]) -> Iterator[Any]:
    try:
        for x in it:
            if isinstance(x, _BATCH):
                yield from _flatten(x)
            else:
                yield x
    except BaseException:
        abandon(it)
        raise


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
        TypeError: an item at a level to flatten is not a list or tuple; the message names the
            stage and the item's position (``item 3[0]``: element 0 of the stage's item 3).

    ``len()`` is the source's length with ``unbatch_level=0``; otherwise it raises ``TypeError``
    (the batch sizes are known only after iterating).

    >>> from datapipes.iter import IterableWrapper
    >>> list(IterableWrapper([[0, 1], [2]]).unbatch())
    [0, 1, 2]
    >>> list(IterableWrapper([[[0, 1], [2]], [[3]]]).unbatch(unbatch_level=-1))
    [0, 1, 2, 3]

    See also: :class:`Batcher`, :class:`~datapipes.iter.FlatMapper`.
    """

    _repr_fields = ("unbatch_level",)

    def __init__(self, datapipe: IterDataPipe[Any], unbatch_level: int = 1) -> None:
        require_pipe(datapipe, "Unbatcher")
        require_int(unbatch_level, "Unbatcher", "unbatch_level", minimum=-1)
        self.datapipe = datapipe
        self.unbatch_level = unbatch_level
        runs = {-1: _unbatch_all, 0: _unbatch_none, 1: _unbatch_one}
        self._run: Callable[[Unbatcher, Iterator[Any]], Iterator[Any]] = runs.get(unbatch_level, _unbatch_deep)

    def __iter__(self) -> Iterator[Any]:
        return self._run(self, iter(self.datapipe))

    def __len__(self) -> int:
        if self.unbatch_level == 0:
            return len(self.datapipe)  # type: ignore[arg-type]
        raise len_unknown(self, "the sizes of the batches are known only after iterating")


# -- BucketBatcher ---------------------------------------------------------------------------------


def _pool_shuffle(it: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """Shuffle each run of ``size`` consecutive items (the last run may be shorter)."""
    shuffle = rng.shuffle
    while chunk := list(islice(it, size)):
        shuffle(chunk)
        yield from chunk


def _buffer_shuffle(it: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """Shuffle through a buffer of ``size`` items: each new item replaces a random one, yielded."""
    buffer: list[Any] = []
    randrange = rng.randrange
    for x in it:
        if len(buffer) == size:
            i = randrange(size)
            yield buffer[i]
            buffer[i] = x
        else:
            buffer.append(x)
    rng.shuffle(buffer)
    yield from buffer


def _sorted_buckets(
    pipe: BucketBatcher, sorter: Callable[[list[Any]], Iterable[Any]], it: Iterator[Any], size: int
) -> Iterator[Any]:
    b = 0
    while bucket := list(islice(it, size)):
        try:
            result = sorter(bucket)
            if result is None:
                raise TypeError(
                    f"{stage_label(pipe)}: sort_key returned None; it must return the sorted bucket "
                    "(e.g. sorted(bucket), not bucket.sort())"
                )
            result = list(result)
        except Exception as e:
            add_stage_note(e, stage_label(pipe), b, "bucket")
            raise
        yield from result
        b += 1


def _bucket_run(pipe: BucketBatcher, source: Iterator[Any], seed: int) -> Iterator[list[Any]]:
    rng = random.Random(seed)
    shuffle = _pool_shuffle if pipe.use_in_batch_shuffle else _buffer_shuffle
    bucket_size = pipe.batch_size * pipe.batch_num
    sorter = pipe._sorter
    items = source
    if sorter is None or pipe.bucket_num > 1:
        items = shuffle(items, bucket_size * pipe.bucket_num, rng)
    if sorter is not None:
        items = _sorted_buckets(pipe, sorter, items, bucket_size)
    batches = (_full_batches if pipe.drop_last else _batches)(items, pipe.batch_size)
    if sorter is not None:
        batches = shuffle(batches, pipe.batch_num * pipe.bucket_num, rng)
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
    4. with a sort: the ``batch_num * bucket_num`` batches of each pool are shuffled, so batches of
       short and long items alternate.

    With ``use_in_batch_shuffle=False`` steps 1 and 4 use a streaming buffer shuffle of the same
    size (an item can then move across pools), as torchdata's ``use_in_batch_shuffle=False`` does.
    Unlike torchdata, step 4 mixes the batches of a whole pool in both modes.

    This is a random stage: the order comes from :meth:`set_seed` / :meth:`set_epoch`, or from
    torch's global generator when unseeded.

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

    ``len()`` is ``ceil(len(datapipe) / batch_size)`` (``floor`` with ``drop_last``).

    >>> from datapipes.iter import IterableWrapper
    >>> words = IterableWrapper(["bbb", "a", "cccc", "dd", "eeeee", "f"])
    >>> pipe = words.bucketbatch(batch_size=2, key=len).set_seed(0)
    >>> sorted(pipe)  # the batches come in a random order, the same for the same seed
    [['a', 'f'], ['cccc', 'eeeee'], ['dd', 'bbb']]
    >>> list(pipe) == list(pipe)
    True

    See also: :class:`Batcher`, :class:`~datapipes.iter.Shuffler`.
    """

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
        require_int(batch_size, stage, "batch_size", minimum=1)
        require_int(batch_num, stage, "batch_num", minimum=1)
        require_int(bucket_num, stage, "bucket_num", minimum=1)
        require_callable(sort_key, stage, "sort_key", optional=True)
        require_callable(key, stage, "key", optional=True)
        if sort_key is not None and key is not None:
            raise ValueError(f"{stage}: give sort_key (sorts a bucket) or key (of one item), not both")
        self.datapipe = datapipe
        self.batch_size = batch_size
        self.drop_last = _require_flag(drop_last, stage, "drop_last")
        self.batch_num = batch_num
        self.bucket_num = bucket_num
        self.sort_key = sort_key
        self.use_in_batch_shuffle = _require_flag(use_in_batch_shuffle, stage, "use_in_batch_shuffle")
        self.key = key
        self._sorter = sort_key if key is None else _by_key(key)

    def __iter__(self) -> Iterator[list[T]]:
        # The seed first, then the source: unseeded passes draw from torch's generator in this order.
        seed = self._pass_seed()
        return _bucket_run(self, iter(self.datapipe), seed)

    def __len__(self) -> int:
        return _count_batches(len(self.datapipe), self.batch_size, self.drop_last)  # type: ignore[arg-type]


# -- Grouper ---------------------------------------------------------------------------------------


def _unhashable_note(e: TypeError, pipe: Grouper, n: int, key: Any) -> None:
    add_stage_note(e, stage_label(pipe), n)
    if type(key).__hash__ is None:
        e.add_note(
            f"{stage_label(pipe)}: group_key_fn returned a key of type {type(key).__name__} for item {n}, "
            "which is unhashable; return a hashable key (a tuple instead of a list, a str, an int)"
        )


def _group_run(pipe: Grouper, it: Iterator[Any]) -> Iterator[Any]:
    fn = pipe.group_key_fn
    keep_key = pipe.keep_key
    # 0 never equals a group's length after an append; -1 never equals the buffer's fill.
    group_size = pipe.group_size or 0
    buffer_size = -1 if pipe.buffer_size is None else pipe.buffer_size
    guaranteed = pipe._guaranteed
    drop_remaining = pipe.drop_remaining
    groups: dict[Any, list[Any]] = {}
    held = 0
    n = 0
    try:
        for x in it:
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
                yield (key, group) if keep_key else group
            if held == buffer_size:
                big = max(groups, key=lambda k: len(groups[k]))
                group = groups.pop(big)
                held -= len(group)
                if guaranteed is None or len(group) >= guaranteed:
                    yield (big, group) if keep_key else group
                elif not drop_remaining:
                    raise RuntimeError(
                        f"{stage_label(pipe)}: the buffer is full ({buffer_size} items) at item {n - 1} and its "
                        f"largest group (key {big!r:.80}, {len(group)} items) is smaller than "
                        f"guaranteed_group_size={guaranteed}; raise buffer_size, lower guaranteed_group_size, "
                        "or pass drop_remaining=True to drop such groups"
                    )
        for key, group in list(groups.items()):
            yield (key, group) if keep_key else group
    except BaseException:
        abandon(it)
        raise


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

    >>> from datapipes.iter import IterableWrapper
    >>> files = IterableWrapper(["a.png", "b.png", "a.json", "b.json", "a.jpg", "c.json"])
    >>> list(files.groupby(lambda f: f.split(".")[0]))
    [['a.png', 'a.json', 'a.jpg'], ['b.png', 'b.json'], ['c.json']]
    >>> list(files.groupby(lambda f: f.split(".")[0], group_size=2, keep_key=True))
    [('a', ['a.png', 'a.json']), ('b', ['b.png', 'b.json']), ('a', ['a.jpg']), ('c', ['c.json'])]

    See also: :class:`BucketBatcher`, :class:`~datapipes.iter.Demultiplexer`.
    """

    _repr_fields = ("group_key_fn",)

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
        require_int(buffer_size, stage, "buffer_size", minimum=1, optional=True)
        require_int(group_size, stage, "group_size", minimum=1, optional=True)
        require_int(guaranteed_group_size, stage, "guaranteed_group_size", minimum=1, optional=True)
        if group_size is not None and buffer_size is not None and group_size > buffer_size:
            raise ValueError(f"{stage}: group_size must be <= buffer_size, got group_size={group_size}, buffer_size={buffer_size}")
        if guaranteed_group_size is not None:
            if group_size is None:
                raise ValueError(f"{stage}: guaranteed_group_size={guaranteed_group_size} needs a group_size")
            if guaranteed_group_size > group_size:
                raise ValueError(
                    f"{stage}: guaranteed_group_size must be <= group_size, got "
                    f"guaranteed_group_size={guaranteed_group_size}, group_size={group_size}"
                )
        self.datapipe = datapipe
        self.group_key_fn = group_key_fn
        self.keep_key = _require_flag(keep_key, stage, "keep_key")
        self.buffer_size = buffer_size
        self.group_size = group_size
        self.guaranteed_group_size = guaranteed_group_size
        self.drop_remaining = _require_flag(drop_remaining, stage, "drop_remaining")
        self._guaranteed = group_size if guaranteed_group_size is None else guaranteed_group_size

    def __iter__(self) -> Iterator[Any]:
        return _group_run(self, iter(self.datapipe))

    def __len__(self) -> int:
        raise len_unknown(self, "the number of groups is known only after iterating")
