"""Running an upstream iterator on a background thread with a bounded buffer (prefetch).

:func:`background_iter` is what ``prefetch`` uses, and what ``pin_memory`` and ``to_cuda`` can use:
a producer thread creates the upstream iterator, pulls it, optionally applies ``fn`` to each item, and
puts the results in a buffer of ``buffer_size`` items; the consumer takes them in order. The
producer blocks when the buffer is full (backpressure reaches the source) and wakes when the
consumer takes an item; the consumer blocks when it is empty. No polling.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
import time
import weakref
from typing import Any, Callable, Iterable, Iterator

from .lifecycle import Closeable, Resumable
from .stats import StageStats

__all__ = ["BackgroundRun", "background_iter"]

_GRACE_S = 1.0
_ITEM, _END, _ERR = 0, 1, 2


class BackgroundRun(Resumable):
    """The position of one background pass, readable between two items (checkpoint and resume).

    ``pending`` holds the items produced and not yet taken by the consumer. The producer holds
    ``lock`` while it pulls the upstream and records an item, so a snapshot taken under the lock
    sees the upstream between two items and every item it produced either pending or taken. A state
    saves the pending items themselves; a resumed pass yields them before anything new.
    """

    __slots__ = ("pending", "lock", "resume", "taken", "size")

    def __init__(self, size: int | None = None) -> None:
        self.size = size  # the stage's buffer_size: no more are ever pending (None: not checked)
        self.pending: deque[Any] = deque()
        self.lock = threading.Lock()
        self.resume: list[Any] | None = None
        self.started = False
        self.taken = 0  # items handed to the consumer (the live statistics read it)

    def live(self) -> tuple[int, int, int]:
        """``(items_in, items_out, failures)`` so far, for the pass's statistics."""
        taken = self.taken
        return taken + len(self.pending), taken, 0

    def state(self) -> dict[str, Any]:
        return {"pending": list(self.pending)}

    def load(self, state: dict[str, Any]) -> None:
        pending = state["pending"]
        if type(pending) is not list:  # the pass names the stage (passes._restore)
            raise ValueError(f"state['pending'] must be a list of the items produced and not yet taken, "
                             f"got {type(pending).__name__}")
        if self.size is not None and len(pending) > self.size:
            raise ValueError(f"state['pending'] holds {len(pending)} items, more than buffer_size={self.size} allows")
        self.resume = list(pending)


def _produce(make: Callable[[], Iterable[Any]], fn: Callable[[Any], Any] | None, put: Callable[[Any], None],
             slots: threading.Semaphore, stop: threading.Event, busy: list[float], run: BackgroundRun) -> None:
    clock = time.perf_counter
    it = None
    lock, record = run.lock, run.pending.append
    try:
        it = iter(make())
        while True:
            slots.acquire()
            if stop.is_set():
                return
            t = clock()
            with lock:
                x = next(it, _produce)  # the function itself: a private sentinel
                if x is _produce:
                    put((_END, None))
                    return
                if fn is not None:
                    x = fn(x)
                record(x)
            busy[0] += clock() - t
            put((_ITEM, x))
            x = None
    except BaseException as e:  # noqa: BLE001 - the consumer re-raises the same object
        put((_ERR, e))
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - an upstream error during close has nowhere to go
                pass


def _stop(stop: threading.Event, slots: threading.Semaphore, thread: threading.Thread) -> None:
    stop.set()
    slots.release()
    if thread is not threading.current_thread():
        thread.join(_GRACE_S)


class _Producer(Closeable):
    """Owner of one producer thread: idempotent :meth:`close`, context manager, finalize backstop."""

    def __init__(self, make: Callable[[], Iterable[Any]], fn: Callable[[Any], Any] | None, buffer_size: int,
                 label: str, busy: list[float], run: BackgroundRun) -> None:
        self.queue: Any = queue.SimpleQueue()
        self.slots = threading.Semaphore(buffer_size)
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=_produce, args=(make, fn, self.queue.put, self.slots, self.stop, busy, run),
            name=f"datapipes {label} producer", daemon=True,
        )
        self._finalizer = weakref.finalize(self, _stop, self.stop, self.slots, self.thread)
        self.thread.start()


def background_iter(make: Callable[[], Iterable[Any]], buffer_size: int, label: str, stats: StageStats,
                    fn: Callable[[Any], Any] | None = None, timeout: float | None = None,
                    on_timeout: Callable[[int], BaseException] | None = None,
                    run: BackgroundRun | None = None) -> Iterator[Any]:
    """Yield the items of ``make()`` (through ``fn`` when given), produced on a background thread.

    With ``timeout``, the consumer waits at most that many seconds for each item, then raises
    ``on_timeout(position)`` (default: a ``TimeoutError`` naming ``label``).

    Order is kept. At most ``buffer_size`` items are produced ahead of the consumer (taken from the
    source and not yet handed over), plus the one the producer is working on. An exception raised
    upstream (or by ``fn``) reaches the consumer as the same object, after the items before it.
    The thread starts at the first ``next()`` and stops when the iterator is exhausted, closed or
    collected; closing waits up to 1 s for a producer that is inside the upstream (it is a daemon
    thread and exits as soon as the upstream returns).
    """
    n = fill = 0
    waiting = 0.0
    clock = time.perf_counter
    busy = [0.0]
    producer = None
    run = run if run is not None else BackgroundRun()
    run.started = True
    taken = run.pending.popleft
    try:
        if run.resume:  # a resumed pass: what the interrupted one had produced comes first
            resumed, run.resume = run.resume, None
            run.pending.extend(resumed)
            for value in resumed:
                taken()
                n += 1
                yield value
        producer = _Producer(make, fn, buffer_size, label, busy, run)
        stats.begin(busy, run.live)
        get, ready, release = producer.queue.get, producer.queue.qsize, producer.slots.release
        while True:
            t = clock()
            try:
                kind, value = get(True, timeout)
            except queue.Empty:
                if on_timeout is not None:
                    raise on_timeout(n) from None
                raise TimeoutError(f"{label}: item {n} did not arrive within timeout={timeout} s") from None
            waiting += clock() - t
            fill += ready()
            if kind == _ITEM:
                release()
                taken()
                n += 1
                run.taken = n
                yield value
            elif kind == _END:
                return
            else:
                raise value
    finally:
        if producer is not None:
            producer.close()
        stats.finish(n, n, 0, fill, n, sum(busy), waiting)
