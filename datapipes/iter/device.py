"""Getting batches onto the accelerator: PinMemory [pin_memory], DeviceMover [to_device] and
CudaMover [to_cuda], and keeping CUDA tensors safe when a later stage hands them to another thread.

All three walk nested tuples, lists, dicts, namedtuples and dataclasses. ``to_device`` / ``to_cuda``
first turn each item into tensors (``collate=True``, the default: a list, which is what ``batch()``
yields, is collated as by ``collate()``; numpy arrays and scalars elsewhere become tensors) and refuse
an item that holds no tensor at all; ``pin_memory`` acts on the tensors it finds and leaves other
values alone. Pinning and CUDA copies belong in the main process: inside a DataLoader worker
``pin_memory`` passes items through with a warning and a CUDA ``to_device`` / ``to_cuda`` raises.

Where pinning is not available, :class:`PinMemory` warns once per process and per reason (no CUDA;
inside a DataLoader worker), not at every pass or epoch: Python's own "once per call site" rule is
switched off by test runners and ``-W always``, so the stage keeps its own record.

Crossing threads after ``to_cuda``: a CUDA tensor is safe to read on the stream that waited for the
work that wrote it. ``to_cuda`` makes the current stream of the thread that pulls it wait on its copy;
a stage that runs on other threads (``prefetch``, ``pin_memory``, a concurrent ``map`` with threads
or ``async``) finds a CUDA mover upstream when it is built (:func:`cuda_upstream`) and then, for every
item that crosses threads, records an event on the sending thread's current stream, makes the
receiving thread's current stream wait on it and marks the item's tensors as used by that stream
(``record_stream``). The stream calls come from a small object (:class:`StreamOps`;
:class:`CudaStreamOps` on a GPU), so the logic runs and is tested without one. Stages with no CUDA
mover upstream run their usual loops and pay nothing.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any, Callable, Iterable, Iterator, Protocol, TypeVar

import torch
from torch.utils.data import get_worker_info

from .._runtime.passes import Pass
from .._collate import map_collated, map_converted, map_tensors
from .._checks import phrased
from .._engine import BackgroundRun, StageStats, abandon, background_iter
from ..datapipe import IterDataPipe, functional_datapipe, require_callable, require_int, require_pipe, source_len, stage_label
from ..errors import add_stage_note
from ..graph import walk
from .util import _Unresumable

__all__ = ["CudaMover", "DeviceMover", "PinMemory"]

T = TypeVar("T")

_IN_WORKER = "inside a DataLoader worker process"
_NO_CUDA = "CUDA is not available (torch.cuda.is_available() is False)"

_warned: set[str] = set()  # the reasons already warned about in this process
_warned_lock = threading.Lock()
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _warn_once(reason: str, message: str) -> None:
    with _warned_lock:
        if reason in _warned:
            return
        _warned.add(reason)
    frame, level = sys._getframe(0), 1  # point the warning at the first frame outside datapipes
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)


def _cuda_unavailable(stage: str) -> RuntimeError | None:
    if get_worker_info() is not None:
        return RuntimeError(
            f"{stage}: CUDA copies belong in the main process, but this pass runs {_IN_WORKER}; move the "
            "to_cuda/to_device stage after the DataLoader (or use datapipes.DataLoader(device=...))"
        )
    if not torch.cuda.is_available():
        return RuntimeError(f"{stage}: cannot copy to a CUDA device: {_NO_CUDA}; use to_device('cpu') or run "
                            "the pipe on a machine with a GPU")
    return None


# -- handing CUDA tensors from one thread to another -------------------------------------------------


class StreamOps(Protocol):
    """The stream operations of a hand-over between threads downstream of a CUDA mover.

    A stage that crosses threads calls :meth:`bind` once per pass, on its consumer's thread, and uses
    the object it returns on every thread of the pass: for each item, :meth:`record` on the thread
    that sends it, then :meth:`wait` and :meth:`mark_used` on the thread that receives it.
    :class:`CudaStreamOps` is the CUDA implementation; a test passes a double that logs the calls.
    """

    def bind(self) -> StreamOps:
        """The operations of one pass: called on the consumer's thread when the pass starts."""
        ...

    def enter_thread(self) -> None:
        """Called first on a thread the pass starts (a producer thread): set its CUDA device."""
        ...

    def record(self) -> Any:
        """An event recorded on the calling thread's current stream."""
        ...

    def wait(self, event: Any) -> None:
        """Make the calling thread's current stream wait on ``event`` (no host synchronisation)."""
        ...

    def mark_used(self, item: Any) -> None:
        """Mark the item's tensors as used by the calling thread's current stream."""
        ...


class _NoStreamOps:
    """Where CUDA is not there (the mover upstream raises its own clear error when its pass starts)."""

    def bind(self) -> _NoStreamOps:
        return self

    def enter_thread(self) -> None:
        pass

    def record(self) -> None:
        return None

    def wait(self, event: Any) -> None:
        pass

    def mark_used(self, item: Any) -> None:
        pass


_NO_STREAM_OPS = _NoStreamOps()


class CudaStreamOps:
    """:class:`StreamOps` on a CUDA device: ``torch.cuda.Event`` recorded on
    ``torch.cuda.current_stream(device)``, ``Stream.wait_event`` and ``Tensor.record_stream``.

    Args:
        device: the CUDA device of the mover (``"cuda:1"``); ``None`` or ``"cuda"``: the current
            device of the thread that starts the pass, resolved by :meth:`bind`.
    """

    def __init__(self, device: str | None = None) -> None:
        self.device = device

    def __repr__(self) -> str:
        return f"CudaStreamOps({self.device!r})"

    def bind(self) -> StreamOps:
        if _cuda_unavailable("") is not None:
            return _NO_STREAM_OPS
        device = torch.device("cuda" if self.device is None else self.device)
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return _BoundCudaOps(device)


class _BoundCudaOps:
    __slots__ = ("device",)

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def bind(self) -> _BoundCudaOps:
        return self

    def enter_thread(self) -> None:
        torch.cuda.set_device(self.device)

    def record(self) -> Any:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def wait(self, event: Any) -> None:
        torch.cuda.current_stream(self.device).wait_event(event)

    def mark_used(self, item: Any) -> None:
        stream, device = torch.cuda.current_stream(self.device), self.device

        def mark(t: torch.Tensor) -> torch.Tensor:
            if t.device == device:
                t.record_stream(stream)
            return t

        map_tensors(item, mark)


def cuda_upstream(pipe: Any) -> Any:
    """The CUDA mover whose items reach ``pipe`` (``pipe`` itself included), or ``None``.

    Walks the graph from ``pipe`` towards its sources; a mover (a stage with a ``_handover_ops``
    attribute) ends a path: a CUDA one is the answer (its ``_handover_ops`` is the
    :class:`StreamOps` to use), another one (``to_device("cpu")``) means the items of that path are
    not on a GPU any more. Stages that cross threads call it once, when they are built.
    """
    for stage in walk(pipe, stop=lambda s: hasattr(s, "_handover_ops")):
        if getattr(stage, "_handover_ops", None) is not None:
            return stage
    return None


def _handover_unresumable(label: str) -> Any:
    """The run of a background stage after a CUDA mover, which saves no position (its items hold
    CUDA tensors, and the mover above it cannot save its own)."""
    return _Unresumable(
        f"{label} cannot save its position: it runs after a CUDA mover (to_cuda, to_device), whose copies are "
        f"not saved; take the state of the pipe before the mover, or let datapipes.DataLoader(pipe, device=...) "
        f"move the batches"
    )


def handover_ops(pipe: Any) -> StreamOps | None:
    """The :class:`StreamOps` of the CUDA mover upstream of ``pipe`` (:func:`cuda_upstream`), or ``None``."""
    mover = cuda_upstream(pipe)
    return None if mover is None else mover._handover_ops


def background_handover(ops: StreamOps, make: Callable[[], Iterable[Any]], buffer_size: int, label: str,
                        stats: StageStats, fn: Callable[[Any], Any] | None = None) -> Iterator[Any]:
    """:func:`~datapipes._engine.background_iter` for items that may hold CUDA tensors: the producer
    thread starts with ``ops.enter_thread()`` and records an event after each item (after ``fn``);
    the consumer's stream waits on it and marks the item's tensors as used before the item is
    yielded."""
    bound = ops.bind()
    record, wait, mark_used = bound.record, bound.wait, bound.mark_used

    def make_on_thread() -> Iterable[Any]:
        bound.enter_thread()
        return make()

    if fn is None:
        def tag(x: Any) -> tuple[Any, Any]:
            return x, record()
    else:
        def tag(x: Any) -> tuple[Any, Any]:
            y = fn(x)
            return y, record()

    items = background_iter(make_on_thread, buffer_size, label, stats, fn=tag)
    try:
        for x, event in items:
            wait(event)
            mark_used(x)
            yield x
    finally:
        close = getattr(items, "close", None)  # stops the producer thread now, also when we are closed
        if close is not None:
            close()


# -- PinMemory -------------------------------------------------------------------------------------


def _pin(t: torch.Tensor) -> torch.Tensor:
    return t.pin_memory() if t.device.type == "cpu" else t


def pin_tensors(data: Any) -> Any:
    """``data`` with every CPU tensor in it copied to pinned (page-locked) memory, the structure kept;
    tensors already pinned are returned as they are, tensors on a device are left alone."""
    return map_tensors(data, _pin)


def _noted(fn: Callable[[Any], Any], label: str) -> Callable[[Any], Any]:
    """``fn`` whose failures get a note naming the stage and the item's position."""
    n = 0

    def call(x: Any) -> Any:
        nonlocal n  # one producer thread per pass calls it: no race
        try:
            y = fn(x)
        except Exception as e:
            add_stage_note(e, label, n)
            raise
        n += 1
        return y

    return call


def _pin_pass(pipe: PinMemory[Any], ctx: Pass) -> Iterator[Any]:
    label = stage_label(pipe)
    stats = ctx.stats_for(pipe, lambda: StageStats(label, "prefetch", 1, pipe.buffer_size))
    source = ctx.open(pipe.source_datapipe)  # created here, as part of the pass; pulled on the thread
    fn = _noted(pipe._fn, label)
    index = torch.cuda.current_device()  # the consumer's device, read when the pass starts

    def make() -> Any:
        # As torch's own pin loop (torch.utils.data._utils.pin_memory._pin_memory_loop): the pinning
        # thread works on the consumer's device, not on device 0, the default of a new thread.
        torch.cuda.set_device(index)
        return source

    if pipe._crossing_ops is None:
        run = BackgroundRun()  # the pinned items not yet taken, saved as prefetch saves its own
        ctx.track(pipe, run)
        return background_iter(make, pipe.buffer_size, label, stats, fn=fn, run=run)
    ctx.track(pipe, _handover_unresumable(label))
    return background_handover(pipe._crossing_ops, make, pipe.buffer_size, label, stats, fn=fn)


def _pin_unavailable() -> str | None:
    if get_worker_info() is not None:
        return _IN_WORKER
    if not torch.cuda.is_available():
        return _NO_CUDA
    return None


@functional_datapipe("pin_memory")
class PinMemory(IterDataPipe[T]):
    """Copy the tensors of each item to pinned memory on a background thread
    (functional name: ``pin_memory``), so host-to-GPU copies downstream can be asynchronous.

    Args:
        source_datapipe: the upstream pipe, usually ``collate()``'s output.
        pin_memory_fn: the function that pins one item; ``None``: every CPU tensor in nested tuples,
            lists, dicts, namedtuples and dataclasses is pinned (``Tensor.pin_memory()``); numpy
            arrays and other values are left as they are (collate first).
        buffer_size: how many pinned items the background thread may prepare ahead of the consumer.

    Yields:
        The upstream's items with their tensors pinned, in order.

    Raises:
        Whatever the upstream raises, as the same object, after the items before it; what
        ``pin_memory_fn`` raises, as the same object with a note naming the stage and the item's
        position.

    Threads: as :class:`~datapipes.iter.Prefetcher` (the engine's background thread), the upstream's
    iterator is created when the pass starts (``iter()``, nothing pulled yet), then pulled and closed
    on the pinning thread, so reading, decoding and pinning overlap the consumer. The pinning thread
    first sets its CUDA device to the consumer's current device when the pass started
    (``torch.cuda.set_device``, as torch's DataLoader pin thread does). At most ``buffer_size`` items
    pinned and not yet taken, plus the one being pinned. The thread starts at the first ``next()``
    and stops when the pass is exhausted, closed, collected or the consumer raises. Statistics of
    the last pass are in ``pipe.stats``. Downstream of ``to_cuda`` (unusual) the items cross threads
    as after :class:`~datapipes.iter.Prefetcher`.

    Where pinning is not available, checked when each pass starts (``iter()``), items pass through
    unchanged on the consumer's thread, no thread is started, and a ``RuntimeWarning`` says why, once
    per process and reason: CUDA is not available, or the pass runs inside a DataLoader worker
    process (pin in the main process: ``torch.utils.data.DataLoader(pin_memory=True)`` or
    ``datapipes.DataLoader``). The pipe may be built on a machine without CUDA and run on one with it.

    ``len()`` is the upstream's length.

    Example:
        >>> import torch
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper([torch.zeros(2), torch.ones(2)]).pin_memory()
        >>> [t.tolist() for t in pipe]  # pinned where CUDA is; passed through with a warning elsewhere
        [[0.0, 0.0], [1.0, 1.0]]

    See also: :class:`DeviceMover` (``to_device``), :class:`CudaMover` (``to_cuda``, which pins what
    is not pinned by itself, on the consumer's thread), :class:`~datapipes.iter.Collator`.
    """

    _saves = "same as prefetch"

    _repr_fields = ("buffer_size",)

    def __init__(
        self,
        source_datapipe: IterDataPipe[T],
        pin_memory_fn: Callable[[Any], Any] | None = None,
        buffer_size: int = 2,
    ) -> None:
        require_pipe(source_datapipe, "PinMemory", "source_datapipe")
        require_callable(pin_memory_fn, "PinMemory", "pin_memory_fn", optional=True)
        require_int(buffer_size, "PinMemory", "buffer_size")
        if buffer_size <= 0:  # torchdata's words (its pin_memory is a prefetcher)
            raise ValueError(phrased("PinMemory", "'buffer_size' is required to be a positive integer.",
                                     buffer_size=buffer_size))
        self.source_datapipe = source_datapipe
        self.pin_memory_fn = pin_memory_fn
        self.buffer_size = buffer_size
        self._fn = pin_tensors if pin_memory_fn is None else pin_memory_fn
        self._crossing_ops = handover_ops(source_datapipe)

    def _open(self, ctx: Pass) -> Iterator[T]:
        why = _pin_unavailable()
        if why is None:
            return _pin_pass(self, ctx)
        _warn_once(why, f"{stage_label(self)}: pinning is skipped, items pass through unpinned: {why}"
                        + ("; pin in the main process instead" if why == _IN_WORKER else ""))
        ctx.no_position(self)
        return ctx.open(self.source_datapipe)

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")


# -- DeviceMover / CudaMover -----------------------------------------------------------------------


def _parse_device(device: Any, stage: str) -> torch.device:
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"{stage}: device must be a str, an int or a torch.device, got {type(device).__name__}")
    if isinstance(device, int):  # an index means a CUDA device (resolved without touching CUDA)
        if device < 0:
            raise ValueError(f"{stage}: device index must be >= 0, got {device}")
        return torch.device("cuda", device)
    try:
        return torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"{stage}: device {device!r} is not a device: {e}") from None


#: functional names of the stages whose output is lists of samples, not collated batches
_BATCHING = frozenset({"batch", "bucketbatch", "groupby", "unbatch"})


def _collated_upstream(pipe: Any) -> bool:
    """Whether the items reaching a mover were collated upstream: a ``collate()`` stage (or a mover
    that collates) is met before any batching stage on some path from ``pipe`` to its sources. Its
    lists are then fields of a batch (``[images, labels]``), not samples to stack again."""
    for stage in walk(pipe, stop=lambda s: getattr(type(s), "_functional_name", None) in _BATCHING):
        if getattr(type(stage), "_functional_name", None) == "collate" or (
                isinstance(stage, DeviceMover) and stage._collate):
            return True
    return False


def _keep(t: torch.Tensor) -> torch.Tensor:
    return t


def _describe(x: Any) -> str:
    """``int``, ``list of str``, ``dict with keys ['id', 'path']``: what an item without tensors is."""
    t = type(x)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    if isinstance(x, dict):
        keys = list(x)
        return f"{name} with keys {keys[:8]}{' ...' if len(keys) > 8 else ''}"
    if isinstance(x, (list, tuple)) and x:
        return f"{name} of {_describe(x[0]).split(' with ')[0]}"
    return name


def _nothing_to_move(pipe: DeviceMover, n: int, item: Any) -> TypeError:
    where = "a CUDA device" if pipe.device is None else pipe.device
    if pipe._collate:
        hint = ("it holds no tensor even after conversion (lists are collated as batches, numpy arrays and "
                "scalars become tensors; Python numbers outside a list and strings stay as they are): map "
                "each item to tensors first, or filter out the items without any")
    else:
        hint = ("with collate=False nothing is converted, so lists of samples, numpy arrays and numbers are not "
                "moved: drop collate=False, or map each item to tensors first")
    return TypeError(f"{stage_label(pipe)}: item {n} has no tensor to move to {where}: found {_describe(item)}; {hint}")


def _handed_on(item: Any) -> bool:
    """Whether ``item``, which holds no tensor, stands for a batch that failed upstream (the
    DataLoader's marker for a map-style batch whose loading raised, which the loader raises in the
    batch's place): it is handed on as it is. Checked only for items with no tensor."""
    return getattr(type(item), "_failed_batch", False) is True


def _move_plain(pipe: DeviceMover, it: Iterator[Any], device: torch.device) -> Iterator[Any]:
    """CPU and non-CUDA devices: ``Tensor.to`` on the consumer's thread (a tensor already there is
    returned as it is), over ``it``, the upstream's iterator of this pass. Copies to the CPU are
    blocking: a non-blocking device-to-host copy could be read before it lands."""
    label = stage_label(pipe)
    non_blocking = pipe.non_blocking and device.type != "cpu"
    walk = pipe._walk
    found = 0

    def move(t: torch.Tensor) -> torch.Tensor:
        nonlocal found
        found += 1
        return t.to(device, non_blocking=non_blocking)

    n = 0
    try:
        for x in it:
            found = 0
            try:
                y = walk(x, move)
            except Exception as e:
                add_stage_note(e, label, n)
                raise
            if not found and not _handed_on(y):
                raise _nothing_to_move(pipe, n, y)
            n += 1
            yield y
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


def _pin_host(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_pinned() else t.pin_memory()


class _CudaOps:
    """The CUDA calls :func:`_move_cuda` makes, gathered so a test can stand in for them."""

    Stream = staticmethod(lambda device: torch.cuda.Stream(device=device))
    stream = staticmethod(lambda s: torch.cuda.stream(s))
    current_stream = staticmethod(lambda device: torch.cuda.current_stream(device))
    Event = staticmethod(lambda: torch.cuda.Event())
    pin = staticmethod(_pin_host)

    @staticmethod
    def record_stream(t: torch.Tensor, stream: Any) -> None:
        t.record_stream(stream)


def _move_cuda(pipe: DeviceMover, device: torch.device, cuda: Any = _CudaOps, ctx: Pass | None = None) -> Iterator[Any]:
    """CUDA: copies on a dedicated stream, one item ahead of the consumer (see DeviceMover). The
    upstream's iterator is created now, in ``ctx``, the mover's pass (called from ``_open``; ``None``:
    the upstream starts a pass of its own, as where a test stands in for CUDA); the stream and
    everything else at the first ``next()``."""
    if ctx is None:
        return _cuda_copies(pipe, iter(pipe.source_datapipe), device, cuda)
    ctx.track(pipe, _Unresumable(
        f"{stage_label(pipe)} cannot save its position: it copies items to the GPU one ahead of the consumer, on a "
        f"stream of its own, and a copied item is not saved; take the state of the pipe before it, or let "
        f"datapipes.DataLoader(pipe, device=...) move the batches (its state leaves the copies out)"
    ))
    return _cuda_copies(pipe, ctx.open(pipe.source_datapipe), device, cuda)


def _cuda_copies(pipe: DeviceMover, it: Iterator[Any], device: torch.device, cuda: Any) -> Iterator[Any]:
    label = stage_label(pipe)
    non_blocking = pipe.non_blocking
    pin = cuda.pin if non_blocking else None  # a blocking copy gains nothing from pinned memory
    convert = None if pipe._walk is map_tensors else pipe._walk
    stream = cuda.Stream(device)  # one per pass, made on the consumer's thread at the first next()
    current_stream, record_stream, new_event, on_stream = cuda.current_stream, cuda.record_stream, cuda.Event, cuda.stream

    def issue(x: Any) -> tuple[Any, Any, list[torch.Tensor], int]:
        made: list[torch.Tensor] = []
        found = 0

        def copy(t: torch.Tensor) -> torch.Tensor:
            nonlocal found
            found += 1
            if t.device == device:
                return t
            if t.device.type == "cpu":
                if pin is not None:
                    t = pin(t)  # the copy is asynchronous only from page-locked memory
            else:  # from another GPU: wait for the work that produced it
                stream.wait_stream(current_stream(t.device))
            y = t.to(device, non_blocking=non_blocking)
            made.append(y)
            return y

        if convert is not None:  # on the consumer's stream: collating device tensors stacks them there
            x = convert(x, _keep)
        with on_stream(stream):
            out = map_tensors(x, copy)
            done = new_event()
            done.record(stream)
        return out, done, made, found

    def hand_over(out: Any, done: Any, made: list[torch.Tensor]) -> Any:
        consumer = current_stream(device)
        consumer.wait_event(done)  # the consumer's kernels start after the copy, without a host sync
        for y in made:
            record_stream(y, consumer)  # its memory is not reused before the consumer's work ends
        return out

    n = 0  # position of the item being copied
    pending: tuple[Any, Any, list[torch.Tensor]] | None = None
    try:
        try:
            for x in it:
                try:
                    out, done, made, found = issue(x)
                except Exception as e:
                    add_stage_note(e, label, n)
                    raise
                if not found and not _handed_on(out):
                    raise _nothing_to_move(pipe, n, out)
                n += 1
                if pending is not None:
                    ready, pending = pending, None
                    yield hand_over(*ready)
                pending = out, done, made
        except Exception:
            if pending is not None:  # hand over what was copied before the failure, then raise it
                ready, pending = pending, None
                yield hand_over(*ready)
            raise
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise
    if pending is not None:
        yield hand_over(*pending)


@functional_datapipe("to_device")
class DeviceMover(IterDataPipe[Any]):
    """Turn each item into tensors and move them to ``device`` (functional name: ``to_device``).

    Args:
        source_datapipe: the upstream pipe: ``batch()``'s lists of samples, or ``collate()``'s /
            ``pin_memory()``'s batches.
        device: where to: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a CUDA device index or a
            ``torch.device``. ``"cuda"`` without an index is the current CUDA device of the thread
            that starts the pass.
        non_blocking: issue host-to-device copies asynchronously. To CUDA, CPU tensors that are not
            pinned are first copied to pinned memory (skipped for tensors already pinned), so the
            copy really overlaps the host; ``False``: blocking copies, nothing pinned. Copies to the
            CPU are always blocking.
        collate: ``True`` (the default) converts each item before moving it, as
            :func:`datapipes._collate.map_collated`: a ``list`` (what ``batch()`` yields) is a list
            of samples and is collated as ``collate()`` does (tensors, numpy arrays, numbers and PIL
            images stacked; strings kept as lists); any other item (a tensor, a dict or tuple of
            tensors: a batch already) keeps its tensors, nothing is stacked again, and its numpy
            arrays and scalars become tensors (torch's ``default_convert``). Lists are not collated
            again when a ``collate()`` stage upstream already made the batches (found when the pipe
            is built), so ``batch().collate().to_device(d)`` moves ``collate()``'s output as it is.
            ``False``: items are moved as they are, only their torch tensors.

    Yields:
        The items with their tensors on ``device`` (nested tuples, lists, dicts, namedtuples and
        dataclasses are rebuilt; strings, Python numbers outside a collated list and other values
        are kept), in order. A tensor already on ``device`` is yielded as it is, so
        ``to_device("cpu")`` on CPU tensors costs only the walk over the item.

    Raises:
        TypeError: an item holds no tensor at all after conversion (a string, ``None``, a list of
            strings, a number outside a list, or anything with ``collate=False`` that is not a
            tensor): nothing would reach the device and the pipe would run on silently on the
            host. The message names the stage, the item's position and what was found, e.g.
            ``DeviceMover('cpu'): item 0 has no tensor to move to cpu: found list of str; ...``.
        Whatever ``collate()`` raises for a list whose samples cannot be batched (the field and
        sample that disagree), and a ``TypeError`` for a numpy value of a dtype torch has no tensor
        for (``datetime64``), with a note naming the stage and the item's position.
        RuntimeError: when a pass starts (``iter()``) with a CUDA ``device`` and CUDA is not
            available, or inside a DataLoader worker process; construction never touches CUDA, so a
            pipe can be built and pickled on a machine without a GPU.
        Whatever the upstream raises, as the same object, after the items before it.

    CUDA: each pass makes a dedicated CUDA stream on the consumer's thread. Conversion and pinning
    run on the consumer's thread; the copy of an item is issued on that stream and followed by an
    event; when the item is handed over, the consumer's current stream waits on the event
    (``wait_event``: no host synchronisation) and every copied tensor is marked as used by that
    stream (``record_stream``), so the caching allocator does not reuse its memory while the
    consumer's kernels may still read it. The copy of item ``k + 1`` is issued before item ``k`` is
    handed over (one item of lookahead), so it runs on the copy engine while the consumer computes on
    item ``k``: at most two items are on the device per pass, the one the consumer holds and the
    next. A stage after this one that runs on other threads (``prefetch``, a concurrent ``map``)
    repeats the hand-over for the thread that finally receives the item (see
    :mod:`datapipes.iter.device`); ``map(executor="process")`` after a CUDA mover raises a
    ``ValueError`` when it is built. Other devices (``mps``, ``xpu``, ...) use ``Tensor.to`` on the
    consumer's thread.

    ``len()`` is the upstream's length.

    Example:
        >>> import numpy as np
        >>> from datapipes.iter import IterableWrapper
        >>> samples = IterableWrapper([(np.zeros(2, np.float32), 0), (np.ones(2, np.float32), 1)])
        >>> list(samples.batch(2).to_device("cpu"))  # a list of samples becomes batched tensors
        [[tensor([[0., 0.],
                [1., 1.]]), tensor([0, 1])]]

    See also: :class:`CudaMover` (``to_cuda``), :class:`PinMemory` (``pin_memory``),
    :func:`datapipes.collate`.
    """

    _saves: str | dict[str, str] = {  # subclasses declare a string
        "``to_device`` (CPU)": "nothing: one item out per item in",
        "``to_device`` (CUDA)": "same as to_cuda",
    }

    _repr_fields = ("device",)

    def __init__(self, source_datapipe: IterDataPipe[Any], device: str | int | torch.device, non_blocking: bool = True,
                 *, collate: bool = True) -> None:
        stage = type(self).__name__
        require_pipe(source_datapipe, stage, "source_datapipe")
        if not isinstance(non_blocking, bool):
            raise TypeError(f"{stage}: non_blocking must be a bool, got {type(non_blocking).__name__}")
        if not isinstance(collate, bool):
            raise TypeError(f"{stage}: collate must be a bool, got {type(collate).__name__}")
        self.source_datapipe = source_datapipe
        self.device = self._check_device(device, stage)
        self.non_blocking = non_blocking
        # Stored as _collate: an attribute named ``collate`` would hide the pipe's collate() method.
        self._collate = collate
        self._walk = map_tensors if not collate else map_converted if _collated_upstream(source_datapipe) else map_collated
        on_cuda = self.device is None or torch.device(self.device).type == "cuda"
        self._handover_ops: Any = CudaStreamOps(self.device) if on_cuda else None  # a StreamOps or None

    def _check_device(self, device: Any, stage: str) -> str | None:
        """The device as a string (``"cpu"``, ``"cuda:1"``): light to pickle and to show in a repr."""
        return str(_parse_device(device, stage))

    def _open(self, ctx: Pass) -> Iterator[Any]:
        device = torch.device("cuda" if self.device is None else self.device)
        if device.type != "cuda":
            ctx.no_position(self)  # one item out per item in, on the consumer's thread
            return _move_plain(self, ctx.open(self.source_datapipe), device)
        error = _cuda_unavailable(type(self).__name__)
        if error is not None:
            raise error
        if device.index is None:  # the current device of the thread starting the pass
            device = torch.device("cuda", torch.cuda.current_device())
        return _move_cuda(self, device, ctx=ctx)

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")


@functional_datapipe("to_cuda")
class CudaMover(DeviceMover):
    """Turn each item into tensors and move them to a CUDA device (functional name: ``to_cuda``),
    pinning and copying on a dedicated CUDA stream that the consumer's stream waits on:
    :class:`DeviceMover` for CUDA.

    ``dp.map(f).batch(32).to_cuda()`` yields batched tensors on the GPU: each list of samples is
    collated, its CPU tensors pinned, then copied asynchronously one batch ahead of the consumer.

    Args:
        source_datapipe: the upstream pipe: ``batch()``'s lists of samples, or ``collate()``'s /
            ``pin_memory()``'s batches.
        device: the CUDA device (``"cuda:1"``, an index, a ``torch.device``); ``None``: the current
            CUDA device of the thread that starts the pass.
        non_blocking: issue the copies asynchronously from pinned memory, pinning what is not pinned
            yet (as in :class:`DeviceMover`); ``False``: blocking copies, nothing pinned.
        collate: convert each item to tensors first, as in :class:`DeviceMover` (``True``, the
            default: lists of samples are collated, numpy values become tensors); ``False``: move
            the torch tensors of each item as they are.

    Yields:
        The items as batched tensors on the GPU, in order, as :class:`DeviceMover`.

    Raises:
        ValueError: at construction, ``device`` is not a CUDA device.
        TypeError: an item holds no tensor at all after conversion (see :class:`DeviceMover`).
        RuntimeError: when a pass starts (``iter()``), CUDA is not available or the pass runs inside
            a DataLoader worker process. Construction never touches CUDA, so a pipe can be described
            and pickled on a machine without a GPU and run on one with it.

    Pinning runs on the consumer's thread, one batch ahead: put ``pin_memory()`` before ``to_cuda``
    (after ``collate()``) to pin on a background thread instead; what arrives pinned is not pinned
    again.

    ``len()`` is the upstream's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper(range(4)).batch(2).to_cuda()  # built anywhere; runs where CUDA is
        >>> pipe
        IterableWrapper -> Batcher(2) -> CudaMover(None)

    See also: :class:`DeviceMover` (``to_device``), :class:`PinMemory` (``pin_memory``).
    """

    _saves = (
        "cannot save: they copy one item ahead on a stream of their own, which a state does not hold; "
        "``state_dict()`` raises ``TypeError`` saying so (as does a ``prefetch`` or ``pin_memory`` after "
        "them). ``datapipes.DataLoader(pipe, device=...)`` moves the batches and saves its state without the "
        "copies"
    )

    def __init__(self, source_datapipe: IterDataPipe[Any], device: str | int | torch.device | None = None,
                 non_blocking: bool = True, *, collate: bool = True) -> None:
        super().__init__(source_datapipe, device, non_blocking, collate=collate)  # type: ignore[arg-type]

    def _check_device(self, device: Any, stage: str) -> str | None:
        if device is None:
            return None
        parsed = _parse_device(device, stage)
        if parsed.type != "cuda":
            raise ValueError(f"{stage}: device must be a CUDA device, got {device!r}; use to_device({device!r})")
        return str(parsed)
