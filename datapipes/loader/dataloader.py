"""The public :class:`DataLoader`: checks its arguments, builds one pipe, runs it pass by pass.

The loader builds one spelling, torch's (``batch -> collate -> [worker processes] -> pin_memory ->
to_device``); a call in SPDL's spelling is translated into it by :mod:`.spdl_spelling` (the pipe
``concurrent map (or flatmap) -> batch -> aggregate -> transfer``, and a buffer of ``buffer_size``),
so the class body handles one spelling. What the loader reads becomes a pipe in :mod:`.datasets`;
the arguments both spellings share are checked in :mod:`.arguments`. Each pass draws (once per
loader) the agreed seed, installs the seeds and, with ``even_batches``, evens the batch count across
ranks (:mod:`.distributed`); worker processes live in :mod:`.workers`, the timed buffer in
:mod:`.buffer`.
"""

from __future__ import annotations

import inspect
import math
import threading
import warnings
import weakref
from typing import Any, AsyncIterable, Callable, Generator, Generic, Iterable, Iterator, TypeVar, cast, overload

import torch
from torch.utils.data import IterableDataset, RandomSampler
from torch.utils.data import IterDataPipe as TorchIterDataPipe

from .._checks import require_bool
from ..datapipe import IterDataPipe, MapDataPipe, require_callable
from .._engine.lifecycle import abandon
from ..graph import traverse
from ..hooks import StatsReporter
from ..iter import IterableWrapper
from ..iter.sharding import SHARDING_PRIORITIES, is_sharding_stage
from .arguments import (
    NOT_GIVEN,
    _NotGiven,
    check_pin_memory_device,
    check_shared,
    check_workers,
    data_of,
    warn_worker_number,
)
from .buffer import TimedBuffer
from .._runtime.passes import PassConfig
from .._runtime.passes import current as pass_being_built
from .distributed import _WHERE, _agreed_seed, _distributed, _even_pass, _shard_id
from .shards import InProcess, ShardsRun, check_loader_state, loader_layout, merged_states, plan
from .datasets import Collate, Fetch, Indices, _FailedBatch, as_pipe, map_style
from .sampling import (
    DrawnSampler,
    check_drawn_alike,
    foreign,
    own_generator,
    refuse_wrapped_samplers,
    shards_itself,
    shuffled,
    torch_graph,
)
from .spdl_spelling import Translation, from_spdl, is_spdl_call
from .workers import WorkerProcesses

__all__ = ["DataLoader"]

T = TypeVar("T")  # what a loader yields
U = TypeVar("U")  # the items of its pipe, where they differ from what it yields

#: The buffer the torch spelling puts before pin_memory/to_device when ``timeout`` is set.
_TIMEOUT_BUFFER = 2

_STATE_FORMAT = "datapipes.loader/2"


def _check_device(device: Any) -> Any:
    if device is None:
        return None
    import torch

    if not isinstance(device, (str, int, torch.device)) or isinstance(device, bool):
        raise TypeError(f"{_WHERE}: device must be a str, an int or a torch.device, got {type(device).__name__}")
    try:
        return torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"{_WHERE}: device={device!r} is not a device ({e})") from None


def _drain(it: Iterator[Any], run: ShardsRun, done: list[bool]) -> Generator[Any, None, None]:
    delivered = run.delivered
    try:
        for item in it:
            delivered[0] += 1
            yield item
            item = None  # the user's now: not held here while the next batch is made
    except GeneratorExit:  # closed, dropped or collected after a batch; ``it`` is closed after this
        run.end("closed")
        raise
    except BaseException:
        run.end("failed")
        abandon(it)  # the workers and their queues go now, not when the traceback is collected
        raise
    done[0] = True
    run.end("done")


class _Tracked:
    """A loader pass's iterator: counts the batches it hands over (what a state counts as
    delivered) and knows when it has run out (a state saved then starts the next epoch). One small
    generator step per batch, not per item; no reference cycle, so a dropped pass stops at once.

    A map-style dataset's batch that failed (a ``_FailedBatch``, see :mod:`.datasets`) counts as
    delivered, and its exception is raised from ``next()`` (``raises``) without ending the pass, as
    torch's DataLoader does; ``raises=False`` hands the marker on, for :class:`_Raising` to raise
    after the stages that still count it as a batch (``even_batches``).

    The loader keeps ``run`` and ``done`` (not this object): as the pass stops (run out, closed,
    dropped, collected or failed) ``run`` is told (:meth:`ShardsRun.end`), so that a state taken
    later is the one of the last batch delivered."""

    __slots__ = ("it", "run", "_done", "_gen", "_raises", "_length", "__weakref__")

    def __init__(self, it: Iterator[Any], run: ShardsRun, raises: bool = True,
                 length: tuple[Any, int, int] | None = None) -> None:
        self.it = it
        self.run = run
        self._done = [False]
        self._gen = _drain(it, run, self._done)
        self._raises = raises
        #: (dataset, len(dataset), num_workers): a torch IterableDataset whose len() the user read
        #: (len(loader)); torch warns once the pass yields more than that (see _past_length)
        self._length = length

    @property
    def done(self) -> bool:
        return self._done[0]

    @property
    def finished(self) -> bool:
        """Whether the pass yields nothing more: exhausted, failed or closed."""
        return inspect.getgeneratorstate(self._gen) == inspect.GEN_CLOSED

    @property
    def _workers(self) -> list[Any]:
        """The pass's worker processes (``multiprocessing.Process``), started at ``iter()``.
        Compatibility: torch's ``_MultiProcessingDataLoaderIter._workers``, which torch's tests and
        some user code read (to check that the workers stop once the iterator is dropped, say);
        torch's iterator without workers has none, nor has this one."""
        workers = None if self.run.workers is None else self.run.workers()
        processes: list[Any] | None = None if workers is None else workers.processes
        if processes is None:
            raise AttributeError("'_Tracked' object has no attribute '_workers': the pass has no worker processes "
                                 "(num_workers=0), or has not started them yet")
        return processes

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        batch = next(self._gen)
        if type(batch) is _FailedBatch and self._raises:
            raise batch.exception()  # counted as delivered; the pass goes on at the next next()
        if self._length is not None and self.run.delivered[0] > self._length[1]:
            self._past_length()
        return batch

    def _past_length(self) -> None:
        """torch's warning (its words, and its comparison: batches yielded against the dataset's
        ``len()``) when a torch ``IterableDataset`` yields more than its ``len()`` said, after
        ``len(loader)`` read it: an IterableDataset that does not split itself across workers
        yields its items once per worker."""
        dataset, length, workers = self._length  # type: ignore[misc]
        message = (f"Length of IterableDataset {dataset} was reported to be {length}(when accessing "
                   f"len(dataloader)), but {self.run.delivered[0]} samples have been fetched. ")
        if workers > 0:
            message += ("For multiprocessing data-loading, this could be caused by not properly configuring the "
                        "IterableDataset replica at each worker. Please see "
                        "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples.")
        warnings.warn(message, UserWarning, stacklevel=3)

    def close(self) -> None:
        self._gen.close()
        close = getattr(self.it, "close", None)
        if close is not None:
            close()


class _Raising:
    """``it`` (a pass with ``even_batches``, over a :class:`_Tracked` that hands failed batches on),
    raising the exception of each failed batch from ``next()`` without ending the pass."""

    __slots__ = ("it",)

    def __init__(self, it: Iterator[Any]) -> None:
        self.it = it

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        batch = next(self.it)
        if type(batch) is _FailedBatch:
            raise batch.exception()
        return batch

    def close(self) -> None:
        close = getattr(self.it, "close", None)
        if close is not None:
            close()


class DataLoader(Generic[T]):
    """Run a pipe and yield its batches, collated into tensors and moved to the device.

    Torch's spelling is the loader's own; SPDL's keywords are accepted through a translation into it
    (``datapipes.loader.spdl_spelling.from_spdl``; the how-to, ``docs/howto/dataloader.rst``, says
    what each becomes).

    torch's: torch's signature and defaults, ``DataLoader(dataset, batch_size=1, shuffle=None,
    sampler=None, batch_sampler=None, num_workers=0, collate_fn=None, pin_memory=False,
    drop_last=False, timeout=0, worker_init_fn=None, multiprocessing_context=None, generator=None,
    *, prefetch_factor=None, persistent_workers=False, pin_memory_device="", in_order=True,
    snapshot_every_n_steps=1, device=None, seed=None, ...)`` (``snapshot_every_n_steps``:
    torchdata's ``StatefulDataLoader``'s), builds::

        dataset -> [batch(batch_size, drop_last) -> collate(collate_fn)] -> [pin_memory] -> [to_device]

    (over a map-style dataset: its indices, from the sampler, batched, sharded, then fetched).

    SPDL's: ``DataLoader(src, *, preprocessor=None, batch_size=None, drop_last=False,
    aggregator=None, transfer_fn=None, buffer_size=3, num_threads=8, timeout=None,
    output_order="input")`` is translated into torch's spelling over the pipe::

        src -> map(preprocessor, concurrency=num_threads)  (flatmap for a generator)
            -> [batch(batch_size, drop_last)] -> [map(aggregator, concurrency=num_threads)]
            -> [map(transfer_fn)]

    with ``batch_size=None`` (the batches stay lists) and a final buffer of ``buffer_size`` batches
    (``prefetch(buffer_size)``, a timed buffer with ``timeout``).

    Any SPDL-only argument (``src=``, ``preprocessor``, ``aggregator``, ``transfer_fn``,
    ``buffer_size``, ``num_threads``, ``output_order``) selects the SPDL spelling; it cannot be mixed
    with a torch-only one (``shuffle``, ``sampler``, ``batch_sampler``, ``num_workers``,
    ``collate_fn``, ``pin_memory``, ``worker_init_fn``, ``multiprocessing_context``, ``generator``,
    ``prefetch_factor``, ``persistent_workers``, ``pin_memory_device``, ``in_order``,
    ``snapshot_every_n_steps``, ``device``) given another value than its default.
    ``batch_size``, ``drop_last``, ``seed``, ``timeout`` and ``even_batches`` belong to both.

    Where torch's DataLoader refuses an argument, this one refuses it at construction with the same
    type and torch's message, followed by its own detail.

    Args:
        dataset: the data (torch's name; ``pipe=`` and SPDL's ``src=`` name it too: give it once,
            by one name, else ``TypeError`` naming both): an ``IterDataPipe``; a map-style dataset
            (a ``MapDataPipe`` iterated in index order, a list or tuple, or an object with
            ``__getitem__`` and ``__len__`` and no ``__iter__``, as torch's ``Dataset``), read by
            index as torch's loader reads it: with
            ``batch_size``, batches of consecutive indices, each fetched whole by one worker
            (``__getitems__`` where the dataset has it), in index order; the indices are sharded
            across workers and ranks, so each loads only its own items; or any other iterable or
            async iterable (wrapped in :class:`~datapipes.iter.IterableWrapper`).
        batch_size: items per batch; ``None``: the pipe's items as they are (the pipe may batch
            itself). Torch spelling: default ``1``, as torch's (batches of one sample); batches are
            collated (``collate_fn`` or the default :func:`datapipes.collate`, which makes tensors).
            SPDL spelling: default ``None``, as SPDL's; batches are lists, handed to ``aggregator``.
        shuffle: as torch's. Over a map-style dataset, ``True`` reads the indices in a new random
            permutation every epoch (a ``RandomSampler``); over a DataPipe, ``True`` / ``False``
            turn its ``shuffle()`` stages on / off (with ``True`` and none in the pipe, one is added
            at the end, with a warning); ``None`` (default) changes nothing. ``ValueError`` over
            another iterable, as in torch.
        sampler: a sampler of a map-style dataset's indices (any ``torch.utils.data.Sampler``
            instance, or an iterable of indices), as torch's; exclusive with ``shuffle``. Each
            worker process and rank draws the same indices (see ``docs/from_dataloader.rst``): at
            every pass the loader seeds the generators the sampler reads (torch's, Python's and
            NumPy's global ones, and its own ``torch.Generator``) from the pass's seed and calls its
            ``set_epoch`` with the epoch. A ``DistributedSampler`` keeps its rank's share itself;
            the loader then splits it across workers only. With ``num_workers > 0`` a sampler that
            draws differently from the same seed is refused (``ValueError``).
        batch_sampler: a sampler of lists of indices, each list one batch (fetched whole by one
            worker), as torch's; exclusive with ``batch_size`` (other than its default, ``1``; the
            loader's ``batch_size`` is then None, as torch's), ``shuffle``, ``sampler`` and
            ``drop_last``.
        generator: a ``torch.Generator`` the loader draws its seed from (instead of torch's global
            one; where neither ``seed`` nor ``generator`` is given, a sampler's own generator is
            used), so ``torch.Generator().manual_seed(s)`` reproduces a run. Exclusive with ``seed``.
        drop_last: drop a last batch shorter than ``batch_size``.
        collate_fn: turns a list of items into a batch; default: the default collate. With
            ``batch_size=None`` it is applied to every item (as in torch).
        pin_memory: pin batches in page-locked memory (on a background thread) before they go to
            ``device``; skipped for ``device="cpu"``. Where pinning is not available it is a no-op
            with a warning.
        device: move batches there (``"cuda"``, ``"cuda:1"``, ``"cpu"``, a ``torch.device``); CUDA
            copies run on a side stream, overlapped with your compute.
        num_workers: ``0`` runs the pipe in this process, on its stages' own threads (the fast path
            for I/O and for work that releases the GIL). ``n > 0`` runs it in ``n`` processes, each
            holding a shard (for Python code that holds the GIL): torch's DataLoader starts them,
            each runs the pipe up to batching and collating, and the main process pins and copies.
            A pipe without ``sharding_filter()`` gets one at its end (with a warning: each worker
            would then run the whole pipe and keep its share; put ``sharding_filter()`` right after
            the source instead). A torch ``IterableDataset`` given as it is runs whole in each
            worker, as with torch's DataLoader: it shards itself (``get_worker_info()``). More
            workers than the CPUs this process may use warns, with torch's warning, where torch
            gives it: at construction and at each ``iter()`` that starts workers. The workers start
            at ``iter()``, as torch's.
        seed: seeds every random stage (shuffle, sample, rng maps): the same seed gives the same
            order, every epoch another one. ``None``: one seed per loader drawn from torch's global
            generator at the first pass (``torch.manual_seed`` reproduces it); under
            ``torch.distributed`` rank 0's is broadcast, so shuffles before ``sharding_filter`` agree
            across ranks and workers. The loader owns the seeds of its pipe's random stages.
        even_batches: under ``torch.distributed``, make every rank yield the same number of batches
            (uneven counts hang collective training): ``"drop"`` stops every rank at the smallest
            count, ``"pad"`` goes on to the largest, a rank that ran out repeating its last batch;
            ``None`` (default): each rank yields what it has. When every rank knows its ``len()``
            this costs one all_reduce per pass; otherwise one tiny all_reduce (three integers) per
            batch. No-op without a process group of two or more ranks.
        timeout: seconds to wait for each batch (``0`` or ``None``: no timeout, torch's default);
            past it, a :class:`~datapipes.loader.buffer.LoaderTimeoutError`: a ``RuntimeError``
            saying torch's ``DataLoader timed out after N seconds``, then which batch and the pipe,
            and also a ``TimeoutError``. The wait happens on a buffer: SPDL spelling, the final
            ``buffer_size`` buffer; torch spelling, a buffer of 2 batches on a background thread
            before ``pin_memory``.
        report_stats_interval: seconds between two logs of every stage's statistics (a table on the
            ``datapipes`` logger, at INFO; see :class:`datapipes.hooks.StatsReporter`), and one at the
            end of each pass. ``None``: no reports. With ``num_workers > 0`` the table also has
            the stages inside the worker processes, one row per worker and stage, labelled
            ``[worker k] stage`` (the workers send their figures back with their batches).
        max_threads, max_memory: the budget of the loader's passes (see
            :meth:`~datapipes.iter.IterDataPipe.set_budget`): the most worker threads of all thread
            stages together, and the RSS in bytes that ``concurrency="auto"`` stages keep below.
            With ``num_workers > 0``, each worker process has this budget for its own pass.
        persistent_workers, prefetch_factor, multiprocessing_context, worker_init_fn: passed to
            torch's DataLoader for ``num_workers > 0``, and checked at construction as torch checks
            them (``multiprocessing_context``: a start method's name or a ``multiprocessing``
            context; with ``num_workers=0`` the first three are refused and ``worker_init_fn`` is
            not called, as in torch). Persistent workers see ``set_epoch``, and serve one pass at a
            time: ``iter()`` while a pass is live ends that pass (as torch resets its iterator), or,
            from another thread than the one iterating it, raises ``RuntimeError``.
        pin_memory_device: deprecated in torch, which ignores it (with a warning when
            ``pin_memory`` is set): the same here; ``device=`` is where batches go.
        in_order: ``True`` (default): batches in the sampler's (or the pipe's) order, the workers'
            taken in turn, as torch's. ``False`` with ``num_workers > 0``: batches as the workers
            finish them (torch's ``in_order=False``; torch 2.6 or later, else ``ValueError``), so a
            slow worker holds back only its own batches; each worker still makes the batches of its
            own shard (torch hands the next indices to whichever worker has room). A state saved
            mid-pass stays exact: after :meth:`load_state_dict`, every batch not yet delivered comes
            once and none twice, in an order of its own. Without workers it changes nothing, as in
            torch.
        snapshot_every_n_steps: torchdata's ``StatefulDataLoader`` argument (an int >= 1, default
            ``1``): accepted and unnecessary. Each worker sends its position with every batch, so
            :meth:`state_dict` is exact after any batch whatever the value.
        pipe: another name of ``dataset`` (the loader's own before it took torch's).
        src: the SPDL name of ``dataset``.
        preprocessor: called on each source item, concurrently on ``num_threads`` threads (an
            ``async def`` one as tasks on the event loop). A generator function or async generator
            function yields several outputs per item (flatmap); with ``num_threads > 1`` each item's
            outputs are gathered into a list on a worker, then flattened.
        aggregator: called on each batch (or item without ``batch_size``), on ``num_threads`` workers.
        transfer_fn: called on each batch on one background thread (the buffer's), e.g. a copy to
            the GPU: transfers are never concurrent.
        buffer_size: batches buffered ahead of the consumer (default 3).
        num_threads: workers of the preprocessor and aggregator stages (default 8).
        output_order: ``"input"`` (default, deterministic) or ``"completion"`` (SPDL's default:
            a slow item does not hold back the others).

    Yields:
        The batches (or items). ``iter(loader)`` starts a new pass: a new epoch, unless
        :meth:`set_epoch` was called for it.

    Raises:
        TypeError / ValueError: bad arguments, or the two spellings mixed (at construction).
        RuntimeError: a batch took longer than ``timeout`` (a ``LoaderTimeoutError``, also a
            ``TimeoutError``).
        Whatever the pipe raises, as the same object (from worker processes: as torch re-raises it).

    ``len()`` is the number of batches a pass yields, from the pipe's length at call time
    (``ceil(len / batch_size)``, ``floor`` with ``drop_last``; with workers, the sum over the workers'
    shards; under ``torch.distributed``, this rank's shard, before ``even_batches``). ``TypeError``
    naming the stage whose length is unknown. For a torch ``IterableDataset`` given as it is (it
    splits itself across workers and ranks), torch's count: its ``len()``, batched, whatever the
    number of workers.

    Attributes: torch's, with torch's values where it has them (``dataset``: the object given;
    ``batch_size``, ``drop_last``, ``sampler``, ``batch_sampler``, ``num_workers``, ``collate_fn``,
    ``pin_memory``, ``timeout``, ``worker_init_fn``, ``multiprocessing_context``, ``generator``,
    ``prefetch_factor``, ``persistent_workers``, ``pin_memory_device``, ``in_order``,
    ``snapshot_every_n_steps``), and ``pipe``, the pipe the loader runs. As in torch, setting
    ``batch_size``, ``sampler``, ``batch_sampler``, ``drop_last``, ``dataset`` or
    ``persistent_workers`` after construction raises ``ValueError``. For compatibility, torch's
    private ``_auto_collation`` and ``_iterator`` (the persistent workers' iterator, or None), and
    ``iter(loader)._workers`` (the pass's worker processes), with torch's meaning.

    Lifecycle: each pass owns its threads and worker processes; they stop when the pass ends, is
    closed (``break``, ``close()``) or garbage collected. Persistent workers live until
    :meth:`close` (or the loader is collected); the loader is a context manager.

    >>> from datapipes.iter import IterableWrapper
    >>> loader = DataLoader(IterableWrapper(range(10)), batch_size=4, seed=0)
    >>> [batch.tolist() for batch in loader]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    >>> len(loader)
    3
    >>> loader = DataLoader(["a", "b", "c"], preprocessor=str.upper, batch_size=2, aggregator="".join)
    >>> list(loader)
    ['AB', 'C']

    See also: :func:`datapipes.profile` (``profile(loader.pipe)``) to find the slow stage.
    """

    # For type checkers, what the loader yields (``DataLoader[T]``): the pipe's items when nothing
    # batches or converts them (``batch_size=None`` given: torch's default is 1); the result type
    # of collate_fn, aggregator or transfer_fn, the last stage, where one is given; Any otherwise
    # (the default collate, pin_memory, device). The data by position or ``dataset=``, or by
    # ``pipe=`` (each typed overload twice); past ``shuffle``, torch's positional arguments are
    # typed by the last overload only.
    @overload
    def __init__(
        self: DataLoader[T],
        dataset: IterDataPipe[T] | MapDataPipe[T] | Iterable[T] | AsyncIterable[T],
        batch_size: None,
        shuffle: bool | None = None,
        *,
        sampler: Any = None,
        num_workers: int = 0,
        timeout: float | None = None,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        in_order: bool = True,
        snapshot_every_n_steps: int | None = 1,
        seed: int | None = None,
        even_batches: str | None = None,
        report_stats_interval: float | None = None,
        max_threads: int | None = None,
        max_memory: int | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: DataLoader[T],
        *,
        pipe: IterDataPipe[T] | MapDataPipe[T] | Iterable[T] | AsyncIterable[T],
        batch_size: None,
        shuffle: bool | None = None,
        sampler: Any = None,
        num_workers: int = 0,
        timeout: float | None = None,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        in_order: bool = True,
        snapshot_every_n_steps: int | None = 1,
        seed: int | None = None,
        even_batches: str | None = None,
        report_stats_interval: float | None = None,
        max_threads: int | None = None,
        max_memory: int | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: DataLoader[T],
        dataset: IterDataPipe[U] | MapDataPipe[U] | Iterable[U] | AsyncIterable[U],
        batch_size: int = 1,
        shuffle: bool | None = None,
        *,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[U]], T],
        drop_last: bool = False,
        timeout: float | None = None,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        in_order: bool = True,
        snapshot_every_n_steps: int | None = 1,
        seed: int | None = None,
        even_batches: str | None = None,
        report_stats_interval: float | None = None,
        max_threads: int | None = None,
        max_memory: int | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: DataLoader[T],
        *,
        pipe: IterDataPipe[U] | MapDataPipe[U] | Iterable[U] | AsyncIterable[U],
        batch_size: int = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[U]], T],
        drop_last: bool = False,
        timeout: float | None = None,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        in_order: bool = True,
        snapshot_every_n_steps: int | None = 1,
        seed: int | None = None,
        even_batches: str | None = None,
        report_stats_interval: float | None = None,
        max_threads: int | None = None,
        max_memory: int | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: DataLoader[T],
        dataset: Any = None,
        batch_size: int | None = None,
        *,
        drop_last: bool = False,
        timeout: float | None = None,
        pipe: Any = None,
        seed: int | None = None,
        even_batches: str | None = None,
        report_stats_interval: float | None = None,
        max_threads: int | None = None,
        max_memory: int | None = None,
        src: Any = None,
        preprocessor: Callable[[Any], Any] | None = None,
        aggregator: Callable[[list[Any]], Any] | None = None,
        transfer_fn: Callable[[Any], T],
        buffer_size: int | None = None,
        num_threads: int | None = None,
        output_order: str | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: DataLoader[T],
        dataset: Any = None,
        batch_size: int | None = None,
        *,
        drop_last: bool = False,
        timeout: float | None = None,
        pipe: Any = None,
        seed: int | None = None,
        even_batches: str | None = None,
        report_stats_interval: float | None = None,
        max_threads: int | None = None,
        max_memory: int | None = None,
        src: Any = None,
        preprocessor: Callable[[Any], Any] | None = None,
        aggregator: Callable[[Any], T],
        buffer_size: int | None = None,
        num_threads: int | None = None,
        output_order: str | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: DataLoader[Any],
        dataset: Any = None,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float | None = None,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        snapshot_every_n_steps: int | None = 1,
        pipe: Any = None,
        device: Any = None,
        seed: int | None = None,
        even_batches: str | None = None,
        report_stats_interval: float | None = None,
        max_threads: int | None = None,
        max_memory: int | None = None,
        src: Any = None,
        preprocessor: Callable[[Any], Any] | None = None,
        aggregator: Callable[[list[Any]], Any] | None = None,
        transfer_fn: Callable[[Any], Any] | None = None,
        buffer_size: int | None = None,
        num_threads: int | None = None,
        output_order: str | None = None,
    ) -> None: ...

    def __init__(
        self,
        dataset: Any = None,
        batch_size: int | None | _NotGiven = NOT_GIVEN,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float | None = None,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        snapshot_every_n_steps: int | None = 1,
        pipe: Any = None,
        device: Any = None,
        seed: int | None = None,
        even_batches: str | None = None,
        report_stats_interval: float | None = None,
        max_threads: int | None = None,
        max_memory: int | None = None,
        src: Any = None,
        preprocessor: Callable[[Any], Any] | None = None,
        aggregator: Callable[[list[Any]], Any] | None = None,
        transfer_fn: Callable[[Any], Any] | None = None,
        buffer_size: int | None = None,
        num_threads: int | None = None,
        output_order: str | None = None,
    ) -> None:
        if is_spdl_call(locals()):  # the torch-only arguments are at their defaults
            self._from_spdl(from_spdl(
                pipe, None if isinstance(batch_size, _NotGiven) else batch_size, drop_last=drop_last, seed=seed,
                even_batches=even_batches, timeout=timeout, report_stats_interval=report_stats_interval,
                max_threads=max_threads, max_memory=max_memory, src=src, preprocessor=preprocessor,
                aggregator=aggregator, transfer_fn=transfer_fn, buffer_size=buffer_size, num_threads=num_threads,
                output_order=output_order, dataset=dataset))
            return
        data, name = data_of({"dataset": dataset, "pipe": pipe, "src": src})
        batch_size = 1 if isinstance(batch_size, _NotGiven) else batch_size  # torch's default
        self._torch_spelling(
            data, batch_size, shuffle, sampler=sampler, batch_sampler=batch_sampler, generator=generator,
            drop_last=drop_last, collate_fn=collate_fn, pin_memory=pin_memory, device=device, num_workers=num_workers,
            seed=seed, even_batches=even_batches, timeout=timeout, report_stats_interval=report_stats_interval,
            max_threads=max_threads, max_memory=max_memory, persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor, multiprocessing_context=multiprocessing_context,
            worker_init_fn=worker_init_fn, pin_memory_device=pin_memory_device, in_order=in_order,
            snapshot_every_n_steps=snapshot_every_n_steps, given_as=name)
        warn_worker_number(self.num_workers, stacklevel=2)
        self._initialized = True

    #: torch's: the attributes the pipe is built from, which may not change once it is (__setattr__)
    _FIXED = frozenset({"batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"})
    _initialized = False

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._FIXED and self._initialized:
            raise ValueError(f"{name} attribute should not be set after {type(self).__name__} is initialized")
        super().__setattr__(name, value)

    def check_worker_number_rationality(self) -> None:
        """Warn, as torch's DataLoader does (its method and words), where the loader starts more
        worker processes than the CPUs this process may use."""
        warn_worker_number(self.num_workers, stacklevel=2)

    # Compatibility: torch's private attributes that torch's own tests and some user code read, with
    # torch's meaning.

    @property
    def _auto_collation(self) -> bool:
        """torch's ``_auto_collation`` (``batch_sampler is not None``, its ``batch_size`` making one):
        whether the loader gathers samples into batches (``batch_size`` or ``batch_sampler``)."""
        return self.batch_size is not None or self.batch_sampler is not None

    @property
    def _iterator(self) -> Any:
        """torch's ``_iterator``: the iterator of the persistent workers (torch's own
        ``_MultiProcessingDataLoaderIter``, which has ``_workers`` and ``_shutdown_workers()``) once
        they are started; None otherwise. Setting it to None lets go of them, as in torch: stopped,
        and the next pass starts new ones."""
        loader = None if self._workers is None else self._workers._loader
        return None if loader is None else loader._iterator

    @_iterator.setter
    def _iterator(self, value: Any) -> None:
        if value is not None:
            raise ValueError(f"{_WHERE}: _iterator can only be set to None (which stops the persistent workers), "
                             f"got {type(value).__name__}")
        if self._workers is not None:
            self._workers.close()

    def _from_spdl(self, spdl: Translation) -> None:
        """Build an SPDL call translated by :func:`.spdl_spelling.from_spdl`, and record its arguments
        (the batches are stages of ``spdl.pipe``; ``datapipe`` is what it reads)."""
        self._torch_spelling(spdl.pipe, **spdl.torch)
        self.spdl = True
        self.datapipe, self.batch_size, self.drop_last = spdl.source, spdl.batch_size, spdl.drop_last
        self.dataset = spdl.data
        self.buffer_size, self.num_threads, self.output_order = spdl.buffer_size, spdl.num_threads, spdl.output_order
        self._initialized = True

    def _torch_spelling(
        self,
        data: Any,
        batch_size: int | None = None,
        shuffle: bool | None = None,
        *,
        sampler: Any = None,
        batch_sampler: Any = None,
        generator: torch.Generator | None = None,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        device: Any = None,
        num_workers: int = 0,
        seed: int | None = None,
        even_batches: str | None = None,
        timeout: float | None = None,
        report_stats_interval: float | None = None,
        max_threads: int | None = None,
        max_memory: int | None = None,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        multiprocessing_context: Any = None,
        worker_init_fn: Callable[[int], None] | None = None,
        pin_memory_device: str = "",
        in_order: bool = True,
        snapshot_every_n_steps: int | None = 1,
        buffer: int | None = None,
        given_as: str = "dataset",
    ) -> None:
        """The constructor: torch's spelling (``data``, given by the name ``given_as``), plus
        ``buffer``, the batches buffered on a background thread ahead of ``pin_memory`` and the
        consumer (SPDL's ``buffer_size``; ``None``: a buffer of 2 where ``timeout`` needs one, none
        otherwise)."""
        self.drop_last, self.timeout = check_shared(batch_size, drop_last, seed, even_batches, timeout)
        self.dataset = data  # the object given, as torch's attribute
        self.batch_size = batch_size
        self.seed = seed
        self.even_batches = even_batches
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"{_WHERE}: generator must be a torch.Generator or None, got {type(generator).__name__}")
        if generator is not None and seed is not None:
            raise ValueError(f"{_WHERE}: give seed= or generator=, not both (both seed the loader's passes)")
        self.datapipe = as_pipe(data, given_as)
        self._indexed = data if map_style(data) else None  # a map-style dataset, read by index
        self.shuffle = None if shuffle is None else require_bool(shuffle, _WHERE, "shuffle", ints=True)
        self.sampler, self.batch_sampler = sampler, batch_sampler
        self._drawn = self._sampling(data, sampler, batch_sampler)  # the sampler the loader draws indices from
        #: draws the loader's seed (when seed= is not given): generator=, else the sampler's own
        #: generator (so that seeding it reproduces a run, as in torch), else torch's global one
        self.generator = generator if generator is not None else own_generator(self._drawn)
        #: a torch IterableDataset (not a DataPipe) runs whole in each worker, as with torch's
        #: DataLoader: it shards itself (get_worker_info()), so the loader adds no sharding_filter()
        self._shards_itself = isinstance(data, IterableDataset) and not isinstance(data, TorchIterDataPipe)
        #: that IterableDataset's len(), once len(loader) has read it (torch's _IterableDataset_len_called)
        self._len_called: int | None = None
        self.spdl = False
        self._workers: WorkerProcesses | None = None
        self._source: WorkerProcesses | InProcess  # the first stage of self.pipe: its shards' positions
        self.pipe = self._build(collate_fn, pin_memory, device, num_workers, persistent_workers, prefetch_factor,
                                multiprocessing_context, worker_init_fn, buffer, pin_memory_device, in_order,
                                snapshot_every_n_steps)
        if report_stats_interval is not None:
            self.pipe.add_hook(StatsReporter(report_stats_interval))  # the loader's own last stage
        if max_threads is not None or max_memory is not None:
            self.pipe.set_budget(max_threads, max_memory)
        self.report_stats_interval = report_stats_interval
        self._epoch = 0
        self._epoch_set = False
        self._passes = 0
        self._base_seed: int | None = seed
        #: the pass being iterated (whether one is live); weak, so that a pass dropped mid-way stops
        #: its threads and workers as any dropped iterator does
        self._current: weakref.ref[_Tracked] | None = None
        #: the latest pass's ShardsRun and its "ran out" flag, for state_dict: what it saves after
        #: the pass was left (neither holds the pass's iterator)
        self._last: tuple[ShardsRun, list[bool]] | None = None
        self._resume: list[dict[str, Any]] | None = None  # the pass states loaded for the next iter()
        #: the pass states of the state loaded, which state_dict gives back until the next iter()
        self._loaded: list[dict[str, Any]] | None = None
        self._iter_lock = threading.Lock()  # one iter() at a time decides whether another pass is live
        self._current_thread: int | None = None

    # -- building ----------------------------------------------------------------------------------

    def _sampling(self, data: Any, sampler: Any, batch_sampler: Any) -> Any:
        """Check torch's ``shuffle``/``sampler``/``batch_sampler`` (its rules and phrases) and return
        the sampler of a map-style dataset's indices (``RandomSampler`` for ``shuffle=True``), or
        None; an iterable pipe's shuffles are turned on or off instead. In torch's order: an iterable's
        checks first, whatever the values given."""
        shuffle = self.shuffle
        if self._indexed is None:
            for name, given in (("shuffle", shuffle or None), ("sampler", sampler), ("batch_sampler", batch_sampler)):
                if given is not None and (name != "shuffle" or not isinstance(data, (IterDataPipe,
                                                                                     TorchIterDataPipe))):
                    raise ValueError(
                        f"DataLoader with IterableDataset: expected unspecified {name} option, but got "
                        f"{name}={given!r}. An iterable has no indices to sample: give a map-style dataset "
                        f"(__getitem__ and __len__), or shuffle an IterDataPipe with .shuffle()")
            if foreign(data):  # torch's own DataPipes: seeded and sharded at each pass as torch's loader does
                self.datapipe = torch_graph(data, shuffle)
            elif shuffle is not None:
                self.datapipe = shuffled(self.datapipe, data, shuffle)
            return None
        if sampler is not None and shuffle:
            raise ValueError(f"{_WHERE}: sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            # batch_size at its default (1; None too): torch's loader then has no batch_size of its own
            if self.batch_size not in (1, None) or shuffle or sampler is not None or self.drop_last:
                raise ValueError(f"{_WHERE}: batch_sampler option is mutually exclusive with batch_size, shuffle, "
                                 f"sampler, and drop_last")
            self.batch_size = None
        for name, given in (("sampler", sampler), ("batch_sampler", batch_sampler)):
            if given is not None and not hasattr(type(given), "__iter__"):
                raise TypeError(f"{_WHERE}: {name} must be an iterable of indices (a torch.utils.data.Sampler), got "
                                f"{type(given).__name__}")
        chosen = batch_sampler if batch_sampler is not None else sampler
        if chosen is None and shuffle:
            chosen = RandomSampler(self._indexed)  # one permutation per epoch, as torch's shuffle=True
        if chosen is not None and self.batch_size is None and batch_sampler is None:
            group = SHARDING_PRIORITIES.MULTIPROCESSING if shards_itself(chosen) else None
            self.datapipe = (DrawnSampler(IterableWrapper(Indices(self._indexed), deepcopy=False), chosen)
                             .sharding_filter(group).map(self._indexed.__getitem__))
        return chosen

    def _build(self, collate_fn: Any, pin_memory: Any, device: Any, num_workers: Any, persistent_workers: Any,
               prefetch_factor: Any, multiprocessing_context: Any, worker_init_fn: Any,
               buffer: int | None, pin_memory_device: Any = "", in_order: Any = True,
               snapshot_every_n_steps: Any = 1) -> IterDataPipe[Any]:
        require_callable(collate_fn, _WHERE, "collate_fn", optional=True)
        pin = require_bool(pin_memory, _WHERE, "pin_memory", ints=True)
        self.device = _check_device(device)
        workers = check_workers(num_workers, persistent_workers, prefetch_factor, multiprocessing_context,
                                worker_init_fn, in_order, snapshot_every_n_steps)
        ordered = workers.in_order
        persistent = workers.persistent_workers
        # torch's attributes, with torch's values
        self.num_workers, self.persistent_workers = num_workers, persistent
        self.prefetch_factor, self.multiprocessing_context = workers.prefetch_factor, workers.multiprocessing_context
        self.worker_init_fn, self.in_order = worker_init_fn, ordered
        self.snapshot_every_n_steps = snapshot_every_n_steps  # every state is current: see state_dict()
        self.pin_memory_device = check_pin_memory_device(pin_memory_device, pin, stacklevel=4)
        self.collate_fn = collate_fn
        self.pin_memory = pin
        pipe = self.datapipe
        batch_size = self.batch_size
        drawn = self._drawn
        if num_workers > 0:
            if drawn is not None:
                check_drawn_alike(drawn, "batch_sampler" if self.batch_sampler is not None else "sampler", _WHERE)
            refuse_wrapped_samplers(pipe, num_workers)
        if self._indexed is not None:
            # A map-style dataset, as torch's DataLoader reads it: batches of indices (consecutive,
            # or the sampler's), each worker fetching whole batches (the loader takes them from the
            # workers in turn, so they come in the sampler's order whatever the number of workers);
            # without batch_size or batch_sampler, single indices. As with torch's, a batch whose
            # loading or collate_fn raises does not end the pass: Fetch and Collate put a
            # _FailedBatch in its place, which _Tracked raises from next()
            batched = bool(batch_size) or self.batch_sampler is not None
            indices: IterDataPipe[Any] = IterableWrapper(Indices(self._indexed), deepcopy=False)
            if drawn is not None:
                indices = DrawnSampler(indices, drawn)
            if batched and self.batch_sampler is None:
                indices = indices.batch(cast(int, batch_size), drop_last=self.drop_last)
            group = SHARDING_PRIORITIES.MULTIPROCESSING if shards_itself(drawn) else None
            in_workers = num_workers > 0
            pipe = indices.sharding_filter(group).map(Fetch(self._indexed, batched, in_workers))
            if batched or collate_fn is not None:  # without batch_size, collate_fn on each item, as torch's
                pipe = pipe.collate(collate_fn=Collate(collate_fn, in_workers))
            batch_size = None
        if num_workers > 0 and not self._shards_itself and not any(is_sharding_stage(s) for s in traverse(pipe)):
            warnings.warn(
                f"{_WHERE}: the pipe has no sharding_filter(); each of the {num_workers} workers runs the whole "
                f"pipe and keeps its share of the items. Put .sharding_filter() right after the source so each "
                f"worker only does its own share ({pipe!r})",
                UserWarning, stacklevel=3,
            )
            pipe = pipe.sharding_filter(SHARDING_PRIORITIES.MULTIPROCESSING)
        if batch_size:
            pipe = pipe.batch(batch_size, drop_last=self.drop_last)
            pipe = pipe.collate() if collate_fn is None else pipe.collate(collate_fn=collate_fn)
        elif collate_fn is not None and self.batch_size is None and self._indexed is None:
            pipe = pipe.collate(collate_fn=collate_fn)  # per item, as torch's loader does without batch_size
        self._worker_pipe = pipe
        following = buffer is not None or self.timeout is not None or pin or self.device is not None  # read ahead
        if num_workers > 0:
            self._workers = WorkerProcesses(pipe, num_workers, persistent, prefetch_factor, multiprocessing_context,
                                            worker_init_fn, ordered)
            pipe = self._source = self._workers
        else:
            pipe = self._source = InProcess(pipe, eager=following)
        if self.timeout is not None:
            pipe = TimedBuffer(pipe, _TIMEOUT_BUFFER if buffer is None else buffer, self.timeout, _WHERE)
        elif buffer is not None:
            pipe = pipe.prefetch(buffer)
        if pin and (self.device is None or self.device.type != "cpu"):
            pipe = pipe.pin_memory()
        if self.device is not None:
            # Without batching or a collate_fn, items go to the device as they are (torch's loader
            # does not stack them either); otherwise they are collated batches already.
            pipe = pipe.to_device(self.device, collate=bool(batch_size or collate_fn is not None))
        return pipe

    # -- epochs and seeds --------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next pass: with the loader's seed, it fixes the order of every random
        stage (same seed and epoch, same order). Passes without a ``set_epoch`` count up from the
        last epoch."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"{_WHERE}: epoch must be an int >= 0, got {epoch!r}")
        self._epoch = epoch
        self._epoch_set = True

    @property
    def epoch(self) -> int:
        """The epoch of the current (or, before the first pass, the next) pass."""
        return self._epoch

    def _begin_pass(self) -> tuple[int, int]:
        if not self._epoch_set and self._passes:
            self._epoch += 1
        self._epoch_set = False
        self._passes += 1
        if self._base_seed is None:
            self._base_seed = _agreed_seed(self.datapipe, self.generator)
        return self._base_seed, self._epoch

    # -- running -----------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[T]:
        with self._iter_lock:
            workers = self._workers
            if workers is not None and workers.persistent_workers:
                self._refuse_a_second_pass()
            if workers is not None and (not workers.persistent_workers or self._iterator is None
                                        or self._resume is not None):
                warn_worker_number(self.num_workers, stacklevel=2)  # torch's, as its iter() starts workers
            return self._start_pass()

    def _refuse_a_second_pass(self) -> None:
        """With persistent workers, one set of worker processes serves one pass at a time. A second
        ``iter()`` from the thread that iterates the live pass ends that pass (as torch's loader
        resets its one iterator; the first iterator is then exhausted, where torch's would go on
        with the second pass's batches). From another thread it is refused, naming what to do: ending
        a pass another thread iterates would cut its epoch short without a word."""
        current = None if self._current is None else self._current()
        if current is None or current.finished:
            return
        if self._current_thread == threading.get_ident():
            current.close()
            return
        raise RuntimeError(
            "DataLoader is already being iterated: with persistent_workers=True its worker processes "
            "serve one pass at a time, and another thread is iterating the live pass. Finish or close "
            "that iterator (it.close(), or drop every reference to it) before the next iter(); or build "
            "the loader with persistent_workers=False, where each pass has worker processes of its own."
        )

    def _start_pass(self) -> Iterator[T]:
        resume = self._resume
        layout = loader_layout(self.num_workers)
        if resume is None:
            seed, epoch = self._begin_pass()
            states, first = None, 0
        else:  # the pass a loaded state stopped in: same seed and epoch
            seed, epoch = self._base_seed, self._epoch  # type: ignore[assignment]
            # a state this layout cannot resume raises here, and again at the next iter(): never
            # a new pass in its place
            states, first = plan(self._worker_pipe, resume, layout, seed, epoch)
            self._epoch_set = False  # the epoch is this pass's now; the next one counts on from it
        self._resume = self._loaded = None
        run = ShardsRun(layout, states, first, [0], PassConfig(seed, epoch, _shard_id()))
        if self._workers is not None:
            self._workers.prepare(seed, epoch, run)
        else:
            cast(InProcess, self._source).prepare(run)  # no worker processes: the pass runs in process
        length = None if self._len_called is None else (self.dataset, self._len_called, self.num_workers)
        tracked = _Tracked(iter(self.pipe), run, raises=self.even_batches is None, length=length)
        self._current = weakref.ref(tracked)
        self._current_thread = threading.get_ident()  # the thread that may start the next pass over it
        self._last = (run, tracked._done)
        workers = None if run.workers is None else run.workers()
        if workers is not None and pass_being_built() is None:
            # torch starts its workers at iter(): they are there (``_workers``) before the first batch.
            # Not while a pass is being built (iter(loader) in a stage's __iter__): a fork would copy
            # that state into the workers; they start at the first batch then.
            workers.start()
        if self.even_batches is None:
            return tracked
        return _Raising(_even_pass(self, tracked, self.even_batches, resumed=resume is not None))

    # -- checkpoints (torchdata's StatefulDataLoader convention) ---------------------------------

    def state_dict(self, all_ranks: bool = False) -> dict[str, Any]:
        """Where the loader stands, as plain data: its seed and epoch and, in the middle of a pass,
        where each of its shards (each worker process; the loader's own process with
        ``num_workers=0``) stands after the last batch handed to you, whether the pass is still
        iterated or was left (``break``, ``close()``, dropped, collected, or failed: over an iterable
        pipe the failed batch is not delivered, so it comes again; over a map-style dataset a failed
        batch counts as delivered, and the pass goes on). Give it to :meth:`load_state_dict` of a loader built
        the same way and its next ``iter()`` goes on exactly there: the batches not yet delivered, in
        the same order; at a pass's end, the next epoch. Between :meth:`load_state_dict` and the
        next ``iter()``, the state loaded.

        With ``num_workers > 0`` each worker sends its position with every batch (a few dozen
        microseconds per batch for a small pipe; a shuffle buffer's contents too, see
        ``docs/howto/checkpoint.rst``); batches the loader holds ahead of you are not counted.

        Args:
            all_ranks: under ``torch.distributed``, gather every rank's state (a collective call:
                every rank must make it) into one, which every rank returns. A loader with another
                number of ranks or workers needs it to resume (see :meth:`load_state_dict`).

        Raises:
            TypeError: a stage of the pipe cannot save its position (the message names it).
        """
        state: dict[str, Any] = {
            "format": _STATE_FORMAT, "seed": self._base_seed, "epoch": self._epoch,
            "epoch_set": self._epoch_set, "passes": self._passes, "pass": None,
        }
        if self._loaded is not None:  # loaded, and no pass since: the state loaded
            state["pass"] = list(self._loaded)
        elif self._last is not None and not self._epoch_set:  # live or left (run out, closed, failed)
            # (after set_epoch() the next pass is that epoch's, from its start: no pass to resume)
            run, done = self._last
            state["pass"] = [run.state(ended=done[0])]
        if all_ranks:
            dist = _distributed()
            if dist is not None:
                gathered: list[Any] = [None] * dist.get_world_size()
                dist.all_gather_object(gathered, state)
                state = merged_states(gathered)
        return state

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Resume from ``state`` (what :meth:`state_dict` returned): the next ``iter(self)`` goes on
        where the saved loader stood, with its seed and epoch.

        With the same number of workers and ranks as when it was saved, every rank loads its own
        state (or one holding every rank's, from ``state_dict(all_ranks=True)``) and the batches
        come exactly as the interrupted pass would have given them. With another number of workers
        or ranks, give every rank the state of every saved rank (``state_dict(all_ranks=True)``, or
        the list of each rank's ``state_dict()``): across the new workers and ranks, every item not
        yet delivered is delivered exactly once (see ``docs/howto/checkpoint.rst``). That needs a
        ``sharding_filter`` whose upstream gives the same items in every pass; the next ``iter()``
        raises ``ValueError`` naming the stage otherwise.

        Raises:
            ValueError: ``state`` is not a loader state (a value of another type or out of range:
                the message names it), or states of several ranks disagree on the seed and epoch.
        """
        states = state if isinstance(state, list) else [state]
        if not states:
            raise ValueError(f"{_WHERE}.load_state_dict: an empty list of states")
        for index, one in enumerate(states):
            if not isinstance(one, dict) or one.get("format") != _STATE_FORMAT:
                raise ValueError(f"{_WHERE}.load_state_dict: not a state saved by DataLoader.state_dict(): "
                                 f"{str(one)[:200]}")
            # A state may come from someone else: plain data of the expected types and ranges, checked
            # before anything uses it (docs/howto/security.rst)
            check_loader_state(one, "state" if len(states) == 1 else f"state[{index}]")
        state = merged_states(states)
        self._base_seed = state["seed"]
        self._epoch = int(state["epoch"])
        self._epoch_set = bool(state["epoch_set"])
        self._passes = int(state["passes"])
        passes = state["pass"]
        self._resume = None if passes is None or all(p["ended"] for p in passes) else passes
        self._loaded = passes
        self._current = self._last = None

    def __len__(self) -> int:
        if self._shards_itself:
            # an IterableDataset splits itself across workers and ranks: torch's count, its len() batched
            length = self._len_called = len(self.dataset)
            if self.batch_size is None:
                return length
            return length // self.batch_size if self.drop_last else math.ceil(length / self.batch_size)
        return len(self.pipe)  # type: ignore[arg-type]

    def __bool__(self) -> bool:
        return True

    def close(self) -> None:
        """Stop persistent worker processes (idempotent). Passes stop their own threads and workers."""
        if self._workers is not None:
            self._workers.close()

    def __enter__(self) -> DataLoader[T]:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        extra = f", num_workers={self.num_workers}" if self.num_workers else ""
        return f"DataLoader({self.pipe!r}{extra})"

