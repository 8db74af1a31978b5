"""Thread backends: our own worker threads, and an executor the user built.

Workers block on a queue and stop on a sentinel. A worker catches whatever ``fn``
raises into its result record, and the consumer re-raises the very same object.

Our threads take items in *chunks* (lists of jobs; one queue put, one wake-up and one result list
per chunk), sized from the measured cost of ``fn`` so that a chunk holds about
:data:`CHUNK_TARGET_S` of work: one item where ``fn`` takes a millisecond or more (an I/O wait, a
decode) or where the stage waits on its source as long (:meth:`ThreadWorkers.pulled`), dozens where
it takes microseconds. Handing over items one by one costs two cross-thread
wake-ups per item, which on a free-threaded interpreter, where the workers really run in parallel,
cost more than a 20 us item (docs/performance.rst, "Free-threaded CPython").
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections import deque
import time
import weakref
from concurrent.futures import Executor, Future
from typing import Any, Callable

from ._procworker import portable
from .lifecycle import Closeable

__all__ = ["ThreadWorkers", "ExecutorWorkers", "InlineWorkers", "JOIN_GRACE_S", "CHUNK_TARGET_S", "MAX_CHUNK"]

#: How long ``close()`` waits for workers to exit. An idle worker exits at once; one still inside
#: ``fn`` exits as soon as ``fn`` returns, on its own (it is a daemon thread).
JOIN_GRACE_S = 1.0

_STOP = object()  # worker sentinel

#: Seconds of ``fn``'s work an automatically sized chunk of a thread stage aims at. A chunk costs
#: two wake-ups (tens of microseconds on a busy machine), so 1 ms keeps them to a few percent, and
#: an ordered stage waits at most about that long for the rest of the chunk of its next item.
CHUNK_TARGET_S = 0.001
#: The most items in an automatically sized chunk: with the window of ``2 * concurrency`` chunks,
#: a cheap ``fn`` keeps at most ``128 * concurrency`` items in flight.
MAX_CHUNK = 64
#: The most bytes of items (as :func:`approx_nbytes` estimates them) an automatic chunk holds: a
#: cheap ``fn`` over large items (arrays, images, blobs) keeps them one by one.
MAX_CHUNK_BYTES = 4 << 20
#: The weight of a finished chunk in the moving average of ``fn``'s cost per item.
_SMOOTHING = 0.25
#: How often a consumer waiting on chunks of several items looks for the records already done (a
#: chunk wakes it only once it is finished).
_POLL_S = 0.002


def approx_nbytes(x: Any) -> int:
    """A cheap estimate of the memory an item holds: its ``nbytes`` (numpy arrays, torch tensors),
    its size for bytes-like and strings, the sum of those of its values one level down (a dict
    sample, a tuple), else ``sys.getsizeof``. Never raises."""
    try:
        n = getattr(x, "nbytes", None)
        if isinstance(n, int):
            return n
        if isinstance(x, (bytes, bytearray, memoryview, str)):
            return len(x)
        if isinstance(x, dict):
            parts: Any = list(x.values())[:16]
        elif isinstance(x, (list, tuple)):
            parts = x[:16]
        else:
            return sys.getsizeof(x)
        total = sys.getsizeof(x)
        for v in parts:
            n = getattr(v, "nbytes", None)
            total += n if isinstance(n, int) else len(v) if isinstance(v, (bytes, bytearray, str)) else sys.getsizeof(v)
        return total
    except Exception:  # noqa: BLE001 - an estimate: an item whose attributes fail counts as small
        return 0


def chunk_for(cost: float, item: Any, source_cost: float = 0.0) -> int:
    """Items per automatically sized chunk, ``fn`` taking ``cost`` seconds an item (0: not
    measured yet, one item) and ``item`` the chunk's first: :data:`CHUNK_TARGET_S` of work, at most
    :data:`MAX_CHUNK` items and :data:`MAX_CHUNK_BYTES`. One item where pulling an item from the
    source takes as long as ``fn`` does (``source_cost``: the stage waits on its source, where
    chunks would only make it pull ahead in bursts)."""
    if cost <= 0.0 or source_cost >= cost:
        return 1
    n = min(MAX_CHUNK, int(CHUNK_TARGET_S / cost))
    if n > 1:
        n = min(n, MAX_CHUNK_BYTES // max(1, approx_nbytes(item)))
    return max(1, n)


def _chunk_worker(inq: Any, done: deque[Any], ready: threading.Event, fn: Callable[[Any], Any], busy: list[float],
                  slot: int, cost: list[float], halt: list[bool], fail_fast: bool) -> None:
    """A worker taking chunks (lists of jobs) from ``inq``. Each record goes onto ``done`` as soon as
    its item is done (no wake-up: the consumer takes it the next time it looks), and ``ready`` is set
    once a chunk (a wake-up for a consumer waiting on it). So an item that blocks never holds back
    the records of the items before it in its chunk: a consumer waiting on a chunk looks again every
    :data:`_POLL_S` seconds.

    ``cost[0]``: the seconds an item takes, a moving average over the chunks the workers finished
    (read to size the next chunks; one item failing at once does not make a chunk of 64). A chunk
    stops early once ``halt[0]`` is set (the pool is closing: the rest is not wanted), and at its
    first failure with ``fail_fast`` (the pass raises it: the items after it would be thrown away)
    or at a ``BaseException`` that is not an ``Exception`` (an interrupt)."""
    get, add, clock, wake = inq.get, done.append, time.perf_counter, ready.set
    while True:
        jobs = get()
        if jobs is _STOP:
            return
        t = clock()
        n = 0
        for i, x in jobs:
            n += 1
            try:
                add((i, True, fn(x)))
            except BaseException as e:  # noqa: BLE001 - the consumer re-raises it, KeyboardInterrupt included
                add((i, False, e))
                if fail_fast or not isinstance(e, Exception):
                    break
            if halt[0]:
                break
        took = clock() - t
        busy[slot] += took
        cost[0] += (took / n - cost[0]) * (_SMOOTHING if cost[0] else 1.0)
        wake()
        jobs = x = None


def _worker(inq: Any, outq: Any, fn: Callable[[Any], Any], busy: list[float], slot: int) -> None:
    get, put, clock = inq.get, outq.put, time.perf_counter
    rec: tuple[int, bool, Any] | None  # cleared after each put (no reference kept to the result)
    while True:
        job = get()
        if job is _STOP:
            return
        i, x = job
        t = clock()
        try:
            rec = (i, True, fn(x))
        except BaseException as e:  # noqa: BLE001 - the consumer re-raises it, KeyboardInterrupt included
            rec = (i, False, e)
        busy[slot] += clock() - t
        put(rec)
        job = x = rec = None


def _timed_worker(inq: Any, outq: Any, fn: Callable[[Any], Any], busy: list[float], slot: int,
                  running: list[Any], abandoned: list[bool], lock: threading.Lock) -> None:
    get, put, clock = inq.get, outq.put, time.monotonic
    rec: tuple[int, bool, Any] | None  # cleared after each put (no reference kept to the result)
    while True:
        job = get()
        if job is _STOP:
            return
        i, x = job
        t = clock()
        with lock:
            running[slot] = (i, t)
        try:
            rec = (i, True, fn(x))
        except BaseException as e:  # noqa: BLE001
            rec = (i, False, e)
        with lock:
            if abandoned[slot]:  # the consumer gave up on this item: drop it and leave
                return
            running[slot] = None
        busy[slot] += clock() - t
        put(rec)
        job = x = rec = None


def _join(threads: list[threading.Thread], grace: float) -> None:
    deadline = time.monotonic() + grace
    me = threading.current_thread()
    for t in threads:
        if t is not me:
            t.join(max(0.0, deadline - time.monotonic()))


def _shutdown(inq: Any, threads: list[threading.Thread], abandoned: list[bool], halt: list[bool]) -> None:
    # Cancel queued work (and the rest of the chunks being run), then one sentinel per worker that
    # may still take a job.
    halt[0] = True
    while True:
        try:
            inq.get_nowait()
        except queue.Empty:
            break
    live = [t for t, gone in zip(threads, abandoned) if not gone]
    for _ in live:
        inq.put(_STOP)
    _join(live, JOIN_GRACE_S)


class ThreadWorkers(Closeable):
    """``n`` daemon threads calling ``fn`` on submitted items (the default backend).

    ``chunksize``: items per chunk a worker takes at once; ``None`` sizes each chunk from the measured
    cost of ``fn`` and its first item (:func:`chunk_for`: one item until an item has been timed). ``chunk`` is the
    size in force, which the consumer's loop multiplies its window by (a window of chunks). A chunk
    is handed to the workers when it is full, or when the consumer waits and nothing is ready.
    With ``timeout``, items go one by one (a deadline is an item's). ``fail_fast``: the pass raises
    its first failure (no ``on_error="skip"``), so a chunk stops there.

    With ``timeout``, :meth:`get` gives up on an item that has been inside ``fn`` longer than
    ``timeout`` seconds: it returns a failure record holding a :class:`TimeoutError` naming the stage
    and the item's position, abandons the stuck worker (a daemon thread that drops its result and
    exits when ``fn`` returns; it never blocks interpreter exit) and starts a replacement.

    Owner of its threads: :meth:`close` is idempotent, the object is a context manager, and a
    ``weakref.finalize`` stops the threads if it is dropped without being closed.
    """

    kind = "thread"

    def __init__(self, fn: Callable[[Any], Any], n: int, label: str, timeout: float | None = None,
                 chunksize: int | None = None, fail_fast: bool = False) -> None:
        self.fn = fn
        self.n = n
        self.label = label
        self.timeout = timeout
        self.busy: list[float] = [0.0] * n
        #: items per chunk: fixed (``chunksize``; 1 under a timeout), or sized as items are timed
        self.chunk = 1 if timeout is not None else (chunksize or 1)
        self._auto = timeout is None and chunksize is None
        self._cost = [0.0]  # seconds per item, averaged over the chunks the workers finished
        self._source_cost = 0.0  # seconds the consumer's loop takes to pull an item (see pulled)
        self._halt = [False]  # set as the pool closes: chunks being run stop after their current item
        self._fail_fast = fail_fast  # a chunk stops at its first failure (the pass raises it)
        self._buffer: list[tuple[int, Any]] = []  # the chunk being filled
        self._done: deque[tuple[int, bool, Any]] = deque()  # records of chunked items, as they are done
        #: the records ready, taken by the consumer without get() (chunked), or None (one by one)
        self.records: deque[tuple[int, bool, Any]] | None = None
        self._ready = threading.Event()  # set by a worker that finished a chunk
        self._several = False  # whether a chunk of several items has been handed over
        self._threads: list[threading.Thread] = []
        self._abandoned: list[bool] = []
        self._running: list[Any] = []
        self._lock = threading.Lock()
        self._finalizer: weakref.finalize | None = None

    def start(self) -> None:
        self._inq: Any = queue.SimpleQueue()
        self._outq: Any = queue.SimpleQueue()
        self.submit: Callable[[tuple[int, Any]], None]
        if self._chunked:
            done = self._done
            self.submit = self._submit_chunk
            self.get = self._get_chunk  # type: ignore[method-assign]
            self.records = done
            self.ready = done.__len__
        else:
            self.submit = self._inq.put
            self.ready = self._outq.qsize
            if self.timeout is None:
                # the queue's own get shadows the timed method on purpose (no deadline bookkeeping)
                self.get = self._outq.get  # type: ignore[method-assign]
        self._finalizer = weakref.finalize(self, _shutdown, self._inq, self._threads, self._abandoned, self._halt)
        for _ in range(self.n):
            self._spawn()

    def _spawn(self) -> None:
        slot = len(self._threads)
        if slot >= len(self.busy):
            self.busy.append(0.0)
        self._abandoned.append(False)
        self._running.append(None)
        if self._chunked:
            args: tuple[Any, ...] = (self._inq, self._done, self._ready, self.fn, self.busy, slot, self._cost,
                                     self._halt, self._fail_fast)
            target: Callable[..., None] = _chunk_worker
        elif self.timeout is None:
            args = (self._inq, self._outq, self.fn, self.busy, slot)
            target = _worker
        else:
            args = (self._inq, self._outq, self.fn, self.busy, slot, self._running, self._abandoned, self._lock)
            target = _timed_worker
        t = threading.Thread(target=target, args=args, name=f"datapipes {self.label} worker {slot}", daemon=True)
        self._threads.append(t)
        t.start()

    def resize(self, n: int) -> None:
        """Run ``n`` workers from now on (>= 1): start more at once, or stop the surplus as each
        finishes the item it holds (one sentinel per worker to stop, queued behind the items
        already submitted). Called by the autotuner's thread while the pass runs."""
        if n < 1:
            raise ValueError(f"resize: n must be >= 1, got {n}")
        with self._lock:
            if self._finalizer is None or not self._finalizer.alive:
                self.n = n  # not started, or closed: the next start runs n
                return
            live = self.n
            self.n = n
            if n > live:
                for _ in range(n - live):
                    self._spawn_more()
            else:
                for _ in range(live - n):
                    self._inq.put(_STOP)

    def close(self) -> None:
        """Stop the workers (idempotent). The finaliser is detached under the lock that
        :meth:`resize` holds while it starts workers, so a resize racing with close either finishes
        first (its threads are then stopped too) or finds the pool closed and starts none; the
        threads are joined outside the lock (a timed worker takes it as it finishes an item)."""
        with self._lock:
            finalizer = self._finalizer
            detached = None if finalizer is None else finalizer.detach()
        if detached is not None:
            _, shutdown, args, _ = detached
            shutdown(*args)
        self._buffer = []
        self._done.clear()

    @property
    def _chunked(self) -> bool:
        return self._auto or self.chunk > 1

    def _submit_chunk(self, job: tuple[int, Any]) -> None:
        buffer = self._buffer
        if not buffer and self._auto:  # a new chunk: sized from the cost measured so far and its first item
            self.chunk = chunk_for(self._cost[0], job[1], self._source_cost)
        buffer.append(job)
        if len(buffer) >= self.chunk:
            self._send()

    def _send(self) -> None:
        """Hand the chunk being filled to the workers."""
        buffer = self._buffer
        if len(buffer) > 1:
            self._several = True
        self._inq.put(buffer)
        self._buffer = []

    def _get_chunk(self) -> tuple[int, bool, Any]:
        done, ready = self._done, self._ready
        while True:
            ready.clear()  # before looking: a chunk finished from here on sets it again
            if done:
                return done.popleft()
            if self._buffer:  # the consumer is about to wait: hand over the chunk being filled
                self._send()
            # a chunk of several items wakes the consumer once it is finished: until then, look again
            # now and then for the records of its items already done (an item may block for long)
            ready.wait(_POLL_S if self._several else None)

    def pulled(self, seconds: float, items: int) -> None:
        """The consumer's loop took ``seconds`` to pull ``items`` from the source: a moving average
        of the cost per item, which sizes the chunks (:func:`chunk_for`)."""
        if items:
            cost = seconds / items
            self._source_cost += (cost - self._source_cost) * (_SMOOTHING if self._source_cost else 1.0)

    def _spawn_more(self) -> None:
        # A worker stopped by a sentinel leaves its slot; a new one takes a fresh slot (slots index
        # the busy-time accumulators, which keep their sums).
        self._spawn()

    def get(self) -> tuple[int, bool, Any]:
        """The next result record; with a timeout, a failure record for an item past its deadline."""
        timeout = self.timeout
        assert timeout is not None  # without a timeout, start() binds get to the queue's own get
        while True:
            with self._lock:
                now = time.monotonic()
                soonest = now + timeout
                for slot, cur in enumerate(self._running):
                    if cur is None or self._abandoned[slot]:
                        continue
                    due = cur[1] + timeout
                    if due <= now:
                        self._abandoned[slot] = True
                        self._running[slot] = None
                        self._spawn()
                        err = TimeoutError(
                            f"stage {self.label}: item {cur[0]} did not finish within timeout={timeout} s; "
                            f"its worker thread was abandoned (it ends when fn returns)"
                        )
                        return (cur[0], False, err)
                    soonest = min(soonest, due)
            try:
                return self._outq.get(timeout=max(0.0, soonest - now))
            except queue.Empty:
                pass


class InlineWorkers(Closeable):
    """Runs ``fn`` on the consumer's thread as each item is submitted: a concurrent stage that its
    pass's thread budget left no worker thread (see ``set_budget``)."""

    kind = "inline"
    chunk = 1

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.busy: list[float] = [0.0]
        self._done: deque[tuple[int, bool, Any]] = deque()
        self.records = self._done  # each submit leaves its record here: the consumer takes it without get()
        self._finalizer: weakref.finalize | None = None

    def start(self) -> None:
        self.ready = self._done.__len__

    def submit(self, job: tuple[int, Any]) -> None:
        t = time.perf_counter()
        try:
            rec = (job[0], True, self.fn(job[1]))
        except BaseException as e:  # noqa: BLE001 - the consumer's loop re-raises it, with its note
            rec = (job[0], False, e)
        self.busy[0] += time.perf_counter() - t
        self._done.append(rec)

    def get(self) -> tuple[int, bool, Any]:
        return self._done.popleft()

    def close(self) -> None:
        self._done.clear()


def _run_job(fn: Callable[[Any], Any], job: tuple[int, Any], origin: int | None = None) -> tuple[int, bool, Any, float]:
    """Run one job where the executor runs it (a thread, or a process of a process pool or a
    cluster: only ``fn`` and the job travel, so this is a module-level function and its result plain
    data): the result record and the seconds ``fn`` took. Run in a process other than ``origin``
    (the consumer's pid), an exception gets that process's traceback as a note, which pickling
    drops, or travels as a stand-in if it cannot be pickled (:func:`~datapipes._engine._procworker.portable`)."""
    t = time.perf_counter()
    try:
        rec = (job[0], True, fn(job[1]))
    except BaseException as e:  # noqa: BLE001
        rec = (job[0], False, e if origin is None or os.getpid() == origin else portable(e))
    return (*rec, time.perf_counter() - t)


def _run_chunk(fn: Callable[[Any], Any], jobs: list[tuple[int, Any]],
               origin: int | None = None) -> list[tuple[int, bool, Any, float]]:
    """Run several jobs in one executor task (``chunksize``): their records, in order."""
    return [_run_job(fn, job, origin) for job in jobs]


def _cancel_all(pending: dict[Future[Any], Any]) -> None:
    for f in list(pending):
        f.cancel()


class ExecutorWorkers(Closeable):
    """Runs ``fn`` on a ``concurrent.futures.Executor`` the user built; we never shut it down.

    A synchronous executor (``submit`` runs the call at once) works too, which makes a stage's logic
    testable without threads. ``close()`` cancels the futures that have not started.

    ``chunksize``: jobs per executor task (one ``submit`` carries up to that many items, whose
    results come back as one list), for executors whose cost per task outweighs a cheap ``fn``
    (a Ray task, a Dask future: a millisecond or more each). A chunk is sent when it is full, or when
    the consumer waits and nothing else is ready. ``timeout``: seconds a task may take from its
    submission to its result; past it, :meth:`get` cancels it and returns failure records holding a
    ``TimeoutError`` naming the stage for its items (a late result is dropped). It counts the time
    the task waits in the executor's queue too: keep ``concurrency`` near the executor's workers.
    """

    kind = "executor"

    def __init__(self, fn: Callable[[Any], Any], executor: Executor, label: str, chunksize: int | None = None,
                 timeout: float | None = None) -> None:
        self.fn = fn
        self.executor = executor
        self.label = label
        self.chunksize = chunksize
        self.chunk = chunksize or 1  # items per task: the consumer's window counts tasks
        self.records = None  # the consumer waits in get() for each record
        self.timeout = timeout
        self.busy: list[float] = [0.0]
        self._finalizer: weakref.finalize | None = None

    def start(self) -> None:
        outq: Any = queue.SimpleQueue()
        pending: dict[Future[Any], tuple[float, list[int]]] = {}  # task -> (sent at, its items' positions)
        lock = threading.Lock()
        put = outq.put
        fn, busy, submit, chunked = self.fn, self.busy, self.executor.submit, self.chunksize is not None
        size = self.chunksize or 1
        chunk: list[tuple[int, Any]] = []
        origin = os.getpid()

        def done(f: Future[Any]) -> None:
            with lock:
                entry = pending.pop(f, None)
            if entry is None or f.cancelled():  # timed out (its items failed already), or cancelled
                return
            try:
                result = f.result()
            except BaseException as e:  # noqa: BLE001 - the executor itself failed (e.g. a broken pool)
                for i in entry[1]:
                    put((i, False, e))
                return
            records = result if chunked else [result]
            with lock:  # done callbacks run on the executor's threads
                busy[0] += sum(r[3] for r in records)
            for i, ok, value, _ in records:
                put((i, ok, value))

        def send(jobs: list[tuple[int, Any]]) -> None:
            f = submit(_run_chunk, fn, jobs, origin) if chunked else submit(_run_job, fn, jobs[0], origin)
            with lock:
                pending[f] = (time.monotonic(), [job[0] for job in jobs])
            f.add_done_callback(done)

        def submit_job(job: tuple[int, Any]) -> None:
            if not chunked:
                send([job])
                return
            chunk.append(job)
            if len(chunk) >= size:
                send(chunk[:])
                chunk.clear()

        def flush() -> None:
            if chunk:
                send(chunk[:])
                chunk.clear()

        self.submit = submit_job
        self._outq, self._pending, self._lock, self._flush = outq, pending, lock, flush
        self.get = self._get if chunked or self.timeout is not None else outq.get
        self.ready = outq.qsize
        self._finalizer = weakref.finalize(self, _cancel_all, pending)

    def _get(self) -> tuple[int, bool, Any]:
        """The next result record: a partial chunk is sent when nothing is ready (the consumer
        waits for it); with a timeout, failure records for the items of a task past its deadline."""
        outq, timeout = self._outq, self.timeout
        while True:
            try:
                return outq.get_nowait()  # type: ignore[no-any-return]
            except queue.Empty:
                pass
            self._flush()
            if timeout is None:
                return outq.get()  # type: ignore[no-any-return]
            now = time.monotonic()
            soonest = now + timeout
            expired = None
            with self._lock:
                for f, (sent, positions) in self._pending.items():
                    if sent + timeout <= now:
                        expired = f, positions
                        break
                    soonest = min(soonest, sent + timeout)
                if expired is not None:
                    del self._pending[expired[0]]
            if expired is not None:
                expired[0].cancel()
                first, *rest = [
                    (i, False, TimeoutError(f"stage {self.label}: item {i} did not come back from the executor within "
                                            f"timeout={timeout} s (counted from its submission, queue time included); "
                                            f"its task was cancelled where it had not started"))
                    for i in expired[1]
                ]
                for record in rest:
                    outq.put(record)
                return first
            try:
                return outq.get(timeout=max(0.0, soonest - now))  # type: ignore[no-any-return]
            except queue.Empty:
                pass
