"""Map-style Batcher [batch]: batch ``i`` holds the items ``[i * batch_size, (i + 1) * batch_size)``."""

from __future__ import annotations

from typing import Any, Callable, Iterator, TypeVar, overload

from .._chunk import DataChunk
from ..datapipe import MapDataPipe, functional_datapipe, require_callable, require_int, require_pipe, source_len, stage_label
from ..errors import add_stage_note
from .._checks import require_bool
from ..iter.batching import _BATCH_SIZE_ASSERT, _batch_drop, _batch_keep, _batch_wrap, _count_batches
from ._index import position

__all__ = ["Batcher"]

T = TypeVar("T")
U = TypeVar("U")


@functional_datapipe("batch")
class Batcher(MapDataPipe[Any]):
    """Group consecutive items into batches of ``batch_size`` (functional name: ``batch``).

    Args:
        datapipe: the source map-style pipe, read by position ``0 .. len - 1``.
        batch_size: the number of items per batch, at least 1 (else a ``ValueError`` that is also the
            ``AssertionError`` torch DataPipes raise).
        drop_last: leave out the last batch when it holds fewer than ``batch_size`` items.
        wrapper_class: what each batch is made as: :class:`~datapipes.DataChunk` (the default, as
            torch's) or ``list``; any other callable (e.g. ``tuple``) is called on each batch (a
            new ``list``) before it is returned.

    Yields:
        Batch ``i`` is ``wrapper_class([datapipe[j] for j in range(i * batch_size, (i + 1) *
        batch_size)])``, the last one cut at ``len(datapipe)`` (or left out with ``drop_last``).

    Raises:
        TypeError: an index that is not an int. IndexError: an index out of range (negative
            indices count from the end), naming the stage and ending in torch's words:
            ``Batcher(3) (length 3): Index 7 is out of bound.`` Whatever ``wrapper_class`` raises, as
            the same object with a note naming the stage and the batch index; the source's errors
            unchanged.

    ``len()`` is ``ceil(len(datapipe) / batch_size)`` (``floor`` with ``drop_last``), computed from
    the source at call time.

    Example:
        >>> from datapipes.map import SequenceWrapper
        >>> pipe = SequenceWrapper(range(7)).batch(3)
        >>> pipe[1], pipe[-1], len(pipe)
        ([3, 4, 5], [6], 3)
        >>> list(SequenceWrapper(range(7)).batch(3, drop_last=True, wrapper_class=tuple))
        [(0, 1, 2), (3, 4, 5)]

    See also: :class:`datapipes.iter.Batcher`.
    """

    _saves = "same as SequenceWrapper"

    _repr_fields = ("batch_size",)
    _batch_what = "index"  # the iterable-style loops, reused for iterating, name the batch's index
    _run: Callable[[Any], Iterator[Any]]

    @overload
    def __init__(
        self: MapDataPipe[list[T]],
        datapipe: MapDataPipe[T],
        batch_size: int,
        drop_last: bool = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: MapDataPipe[U],
        datapipe: MapDataPipe[T],
        batch_size: int,
        drop_last: bool = ...,
        wrapper_class: Callable[[list[T]], U] = ...,
    ) -> None: ...
    def __init__(
        self,
        datapipe: MapDataPipe[T],
        batch_size: int,
        drop_last: bool = False,
        wrapper_class: Callable[[list[T]], Any] = DataChunk,
    ) -> None:
        require_pipe(datapipe, "Batcher", kind=MapDataPipe)
        require_int(batch_size, "Batcher", "batch_size", minimum=1, torch_assert=_BATCH_SIZE_ASSERT)
        drop_last = require_bool(drop_last, "Batcher", "drop_last", ints=True)  # 0 and 1 read as torch code may pass them
        require_callable(wrapper_class, "Batcher", "wrapper_class")
        self.datapipe = datapipe
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.wrapper_class = wrapper_class
        if wrapper_class is list or wrapper_class is DataChunk:
            self._run = _batch_drop if drop_last else _batch_keep
        else:
            self._run = _batch_wrap

    def __getitem__(self, index: int) -> Any:
        dp = self.datapipe
        n = len(dp)
        bs = self.batch_size
        i = position(self, index, _count_batches(n, bs, self.drop_last), "is out of bound")
        start = i * bs
        batch = [dp[j] for j in range(start, min(start + bs, n))]
        if self.wrapper_class is list:
            return batch
        if self.wrapper_class is DataChunk:
            return DataChunk(batch)
        try:
            return self.wrapper_class(batch)
        except Exception as e:
            add_stage_note(e, stage_label(self), i, "index")
            raise

    def __iter__(self) -> Iterator[Any]:
        return self._run(self)

    def __len__(self) -> int:
        return _count_batches(source_len(self, self.datapipe), self.batch_size, self.drop_last)
