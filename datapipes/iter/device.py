"""Getting batches onto the accelerator: PinMemory [pin_memory], DeviceMover [to_device] and
CudaMover [to_cuda].

All three walk nested tuples, lists, dicts, namedtuples and dataclasses and act on the torch tensors in
them (:func:`datapipes._collate.map_tensors`); numpy arrays and other values pass through unchanged,
so ``collate()`` comes first. Pinning and CUDA copies belong in the main process: inside a
DataLoader worker ``pin_memory`` passes items through with a warning and a CUDA ``to_device`` /
``to_cuda`` raises.

Where pinning is not available, :class:`PinMemory` warns once per process and per reason (no CUDA;
inside a DataLoader worker), not at every pass or epoch: Python's own "once per call site" rule is
switched off by test runners and ``-W always``, so the stage keeps its own record.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any, Callable, Iterator, TypeVar

import torch
from torch.utils.data import get_worker_info

from .._collate import map_tensors
from .._engine import StageStats, background_iter
from ..datapipe import IterDataPipe, functional_datapipe, require_callable, require_int, require_pipe, stage_label
from ..errors import add_stage_note

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


def _pin_pass(pipe: PinMemory[Any]) -> Iterator[Any]:
    label = stage_label(pipe)
    stats = pipe.stats = StageStats(label, "prefetch", 1, pipe.buffer_size)
    source = pipe.source_datapipe
    fn = _noted(pipe._fn, label)
    yield from background_iter(lambda: source, pipe.buffer_size, label, stats, fn=fn)


def _pin_unavailable() -> str | None:
    if get_worker_info() is not None:
        return _IN_WORKER
    if not torch.cuda.is_available():
        return _NO_CUDA
    return None


@functional_datapipe("pin_memory")
class PinMemory(IterDataPipe[T]):
    """Copy the tensors of each item to pinned memory on a background thread (functional name:
    ``pin_memory``), so host-to-GPU copies downstream can be asynchronous.

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

    Threads: as :class:`~datapipes.iter.Prefetcher` (the engine's background thread), the upstream is
    created, pulled and closed on the pinning thread, so reading, decoding and pinning overlap the
    consumer. At most ``buffer_size`` items pinned and not yet taken, plus the one being pinned. The
    thread starts at the first ``next()`` and stops when the pass is exhausted, closed, collected or
    the consumer raises. Statistics of the last pass are in ``pipe.stats``.

    Where pinning is not available, checked when each pass starts (``iter()``), items pass through
    unchanged on the consumer's thread, no thread is started, and a ``RuntimeWarning`` says why, once
    per process and reason: CUDA is not available, or the pass runs inside a DataLoader worker
    process (pin in the main process: ``torch.utils.data.DataLoader(pin_memory=True)`` or
    ``datapipes.DataLoader``). The pipe may be built on a machine without CUDA and run on one with it.

    ``len()`` is the upstream's length.

    >>> import torch
    >>> from datapipes.iter import IterableWrapper
    >>> pipe = IterableWrapper([torch.zeros(2), torch.ones(2)]).pin_memory()
    >>> [t.tolist() for t in pipe]  # pinned where CUDA is; passed through with a warning elsewhere
    [[0.0, 0.0], [1.0, 1.0]]

    See also: :class:`DeviceMover` (``to_device``), :class:`CudaMover` (``to_cuda``),
    :class:`~datapipes.iter.Collator`.
    """

    _repr_fields = ("buffer_size",)

    def __init__(
        self,
        source_datapipe: IterDataPipe[T],
        pin_memory_fn: Callable[[Any], Any] | None = None,
        buffer_size: int = 2,
    ) -> None:
        require_pipe(source_datapipe, "PinMemory", "source_datapipe")
        require_callable(pin_memory_fn, "PinMemory", "pin_memory_fn", optional=True)
        require_int(buffer_size, "PinMemory", "buffer_size", minimum=1)
        self.source_datapipe = source_datapipe
        self.pin_memory_fn = pin_memory_fn
        self.buffer_size = buffer_size
        self._fn = pin_tensors if pin_memory_fn is None else pin_memory_fn
        self.stats: Any = None

    def __iter__(self) -> Iterator[T]:
        why = _pin_unavailable()
        if why is None:
            return _pin_pass(self)
        _warn_once(why, f"{stage_label(self)}: pinning is skipped, items pass through unpinned: {why}"
                        + ("; pin in the main process instead" if why == _IN_WORKER else ""))
        return iter(self.source_datapipe)

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]


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


def _move_plain(pipe: DeviceMover[Any], device: torch.device) -> Iterator[Any]:
    """CPU and non-CUDA devices: ``Tensor.to`` on the consumer's thread (a tensor already there is
    returned as it is). Copies to the CPU are blocking: a non-blocking device-to-host copy could be
    read before it lands."""
    non_blocking = pipe.non_blocking and device.type != "cpu"

    def move(t: torch.Tensor) -> torch.Tensor:
        return t.to(device, non_blocking=non_blocking)

    for x in pipe.source_datapipe:
        yield map_tensors(x, move)


class _CudaOps:
    """The CUDA calls :func:`_move_cuda` makes, gathered so a test can stand in for them."""

    Stream = staticmethod(lambda device: torch.cuda.Stream(device=device))
    stream = staticmethod(lambda s: torch.cuda.stream(s))
    current_stream = staticmethod(lambda device: torch.cuda.current_stream(device))
    Event = staticmethod(lambda: torch.cuda.Event())

    @staticmethod
    def record_stream(t: torch.Tensor, stream: Any) -> None:
        t.record_stream(stream)


def _move_cuda(pipe: DeviceMover[Any], device: torch.device, cuda: Any = _CudaOps) -> Iterator[Any]:
    """CUDA: copies on a dedicated stream, one item ahead of the consumer (see DeviceMover)."""
    label = stage_label(pipe)
    non_blocking = pipe.non_blocking
    stream = cuda.Stream(device)  # one per pass, made on the consumer's thread at the first next()
    current_stream, record_stream, new_event, on_stream = cuda.current_stream, cuda.record_stream, cuda.Event, cuda.stream

    def issue(x: Any) -> tuple[Any, Any, list[torch.Tensor]]:
        made: list[torch.Tensor] = []

        def copy(t: torch.Tensor) -> torch.Tensor:
            if t.device == device:
                return t
            if t.device.type != "cpu":  # from another GPU: wait for the work that produced it
                stream.wait_stream(current_stream(t.device))
            y = t.to(device, non_blocking=non_blocking)
            made.append(y)
            return y

        with on_stream(stream):
            out = map_tensors(x, copy)
            done = new_event()
            done.record(stream)
        return out, done, made

    def hand_over(out: Any, done: Any, made: list[torch.Tensor]) -> Any:
        consumer = current_stream(device)
        consumer.wait_event(done)  # the consumer's kernels start after the copy, without a host sync
        for y in made:
            record_stream(y, consumer)  # its memory is not reused before the consumer's work ends
        return out

    n = 0  # position of the item being copied
    pending: tuple[Any, Any, list[torch.Tensor]] | None = None
    try:
        for x in pipe.source_datapipe:
            try:
                issued = issue(x)
            except Exception as e:
                add_stage_note(e, label, n)
                raise
            n += 1
            if pending is not None:
                ready, pending = pending, None
                yield hand_over(*ready)
            pending = issued
    except Exception:
        if pending is not None:  # hand over what was copied before the failure, then raise it
            ready, pending = pending, None
            yield hand_over(*ready)
        raise
    if pending is not None:
        yield hand_over(*pending)


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


@functional_datapipe("to_device")
class DeviceMover(IterDataPipe[T]):
    """Move the tensors of each item to ``device`` (functional name: ``to_device``).

    Args:
        source_datapipe: the upstream pipe, usually ``collate()`` or ``pin_memory()``'s output.
        device: where to: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a CUDA device index or a
            ``torch.device``. ``"cuda"`` without an index is the current CUDA device of the thread
            that starts the pass.
        non_blocking: issue host-to-device copies asynchronously (they overlap with the host only
            from pinned memory: put ``pin_memory()`` first). Copies to the CPU are always blocking.

    Yields:
        The upstream's items with their tensors on ``device`` (nested tuples, lists, dicts,
        namedtuples and dataclasses are rebuilt; numpy arrays and other values are left as they
        are), in order. A tensor already on ``device`` is yielded as it is, so ``to_device("cpu")``
        on CPU tensors costs only the walk over the item.

    Raises:
        RuntimeError: when a pass starts (``iter()``) with a CUDA ``device`` and CUDA is not
            available, or inside a DataLoader worker process; construction never touches CUDA, so a
            pipe can be built and pickled on a machine without a GPU.
        Whatever the upstream raises, as the same object, after the items before it.

    CUDA: each pass makes a dedicated CUDA stream on the consumer's thread. The copy of an item is
    issued on that stream and followed by an event; when the item is handed over, the consumer's
    current stream waits on the event (``wait_event``: no host synchronisation) and every copied
    tensor is marked as used by that stream (``record_stream``), so the caching allocator does not
    reuse its memory while the consumer's kernels may still read it. The copy of item ``k + 1`` is
    issued before item ``k`` is handed over (one item of lookahead), so it runs on the copy engine
    while the consumer computes on item ``k``: at most two items are on the device per pass, the
    one the consumer holds and the next. Other devices (``mps``, ``xpu``, ...) use ``Tensor.to`` on
    the consumer's thread.

    ``len()`` is the upstream's length.

    >>> import torch
    >>> from datapipes.iter import IterableWrapper
    >>> list(IterableWrapper([{"x": torch.ones(2), "id": "a"}]).to_device("cpu"))
    [{'x': tensor([1., 1.]), 'id': 'a'}]

    See also: :class:`CudaMover` (``to_cuda``), :class:`PinMemory` (``pin_memory``).
    """

    _repr_fields = ("device",)

    def __init__(self, source_datapipe: IterDataPipe[T], device: str | int | torch.device, non_blocking: bool = True) -> None:
        stage = type(self).__name__
        require_pipe(source_datapipe, stage, "source_datapipe")
        if not isinstance(non_blocking, bool):
            raise TypeError(f"{stage}: non_blocking must be a bool, got {type(non_blocking).__name__}")
        self.source_datapipe = source_datapipe
        self.device = self._check_device(device, stage)
        self.non_blocking = non_blocking

    def _check_device(self, device: Any, stage: str) -> str | None:
        """The device as a string (``"cpu"``, ``"cuda:1"``): light to pickle and to show in a repr."""
        return str(_parse_device(device, stage))

    def __iter__(self) -> Iterator[T]:
        device = torch.device("cuda" if self.device is None else self.device)
        if device.type != "cuda":
            return _move_plain(self, device)
        error = _cuda_unavailable(type(self).__name__)
        if error is not None:
            raise error
        if device.index is None:  # the current device of the thread starting the pass
            device = torch.device("cuda", torch.cuda.current_device())
        return _move_cuda(self, device)

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]


@functional_datapipe("to_cuda")
class CudaMover(DeviceMover[T]):
    """Move the tensors of each item to a CUDA device (functional name: ``to_cuda``), copying on a
    dedicated CUDA stream that the consumer's stream waits on: :class:`DeviceMover` for CUDA.

    Args:
        source_datapipe: the upstream pipe, usually ``pin_memory()``'s output.
        device: the CUDA device (``"cuda:1"``, an index, a ``torch.device``); ``None``: the current
            CUDA device of the thread that starts the pass.
        non_blocking: issue the copies asynchronously (as in :class:`DeviceMover`).

    Yields:
        The upstream's items with their tensors on the GPU, in order, as :class:`DeviceMover`.

    Raises:
        ValueError: at construction, ``device`` is not a CUDA device.
        RuntimeError: when a pass starts (``iter()``), CUDA is not available or the pass runs inside
            a DataLoader worker process. Construction never touches CUDA, so a pipe can be described
            and pickled on a machine without a GPU and run on one with it.

    ``len()`` is the upstream's length.

    >>> from datapipes.iter import IterableWrapper
    >>> pipe = IterableWrapper([1, 2]).to_cuda()  # built anywhere; runs where CUDA is
    >>> pipe
    IterableWrapper -> CudaMover(None)

    See also: :class:`DeviceMover` (``to_device``), :class:`PinMemory` (``pin_memory``).
    """

    def __init__(self, source_datapipe: IterDataPipe[T], device: str | int | torch.device | None = None,
                 non_blocking: bool = True) -> None:
        super().__init__(source_datapipe, device, non_blocking)  # type: ignore[arg-type]

    def _check_device(self, device: Any, stage: str) -> str | None:
        if device is None:
            return None
        parsed = _parse_device(device, stage)
        if parsed.type != "cuda":
            raise ValueError(f"{stage}: device must be a CUDA device, got {device!r}; use to_device({device!r})")
        return str(parsed)
