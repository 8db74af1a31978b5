"""Async: one event-loop thread shared by every async stage that runs, and async sources.

The loop thread starts when the first :class:`LoopRef` is taken and stops when the last one is
released, so it lives exactly as long as some pass needs it (no loop or thread is left behind).

- :class:`AsyncWorkers` runs ``async def fn`` with at most ``n`` tasks in flight on that loop.
- :func:`iterate_async` turns an async iterable into a plain iterator driven on that loop, with a
  bounded read-ahead buffer (this is what ``IterableWrapper`` over an async iterable and ``flatmap``
  with an async generator function use).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import queue
import threading
import time
import weakref
from collections import deque
from typing import Any, AsyncIterable, Callable, Iterator

from .lifecycle import Closeable

__all__ = ["AsyncWorkers", "LoopRef", "is_async_callable", "is_async_gen_callable", "iterate_async", "loop_running"]

_STOP_GRACE_S = 2.0  # how long a stop waits for tasks to end after being cancelled
_QUEUED = object()  # a timed item submitted and not started yet
_ENDED = object()  # a timed item whose record is on its way to the consumer

# Re-entrant: a garbage collection inside _acquire (which allocates) may run the finalizer of an
# unreachable LoopRef on the same thread, and that finalizer takes the lock again in _release.
_lock = threading.RLock()
_shared: _SharedLoop | None = None


def is_async_callable(fn: Any) -> bool:
    """True for ``async def`` functions, partials of them, and objects whose ``__call__`` is async."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def is_async_gen_callable(fn: Any) -> bool:
    """True for async generator functions (and objects whose ``__call__`` is one)."""
    return inspect.isasyncgenfunction(fn) or inspect.isasyncgenfunction(getattr(fn, "__call__", None))


class _SharedLoop:
    def __init__(self) -> None:
        self.users = 0
        self.loop = asyncio.new_event_loop()
        # Tasks given up on (a fn that ignores its cancellation or blocks the loop): the loop's
        # shutdown does not wait for them, and whoever stops the loop does not join its thread.
        self.abandoned: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        self.closing = False  # the loop is shutting down: stages start no new tasks
        ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(ready,), name="datapipes event loop", daemon=True)
        self.thread.start()
        ready.wait()

    def _main(self, ready: threading.Event) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            try:
                self.closing = True
                tasks = asyncio.all_tasks(loop)
                for t in tasks:
                    t.cancel()
                waited = [t for t in tasks if t not in self.abandoned]
                if waited:
                    loop.run_until_complete(asyncio.wait(waited, timeout=_STOP_GRACE_S))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def abandon(self, task: asyncio.Task[Any] | None, blocked: bool) -> None:
        """Give up on ``task``; with ``blocked`` (a fn blocks the loop), new passes get a new loop."""
        global _shared
        if task is not None:
            task._log_destroy_pending = False  # type: ignore[attr-defined]  # it may outlive the loop
            self.abandoned.add(task)
        if blocked:
            with _lock:
                if _shared is self:
                    _shared = None

    def stop(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # closed already
            return
        if threading.current_thread() is not self.thread and not self.abandoned:
            self.thread.join(_STOP_GRACE_S + 1.0)


def _acquire() -> _SharedLoop:
    global _shared
    with _lock:
        if _shared is None:
            _shared = _SharedLoop()
        _shared.users += 1
        return _shared


def _release(shared: _SharedLoop) -> None:
    global _shared
    with _lock:
        shared.users -= 1
        last = shared.users == 0
        if last and _shared is shared:
            _shared = None
    if last:
        shared.stop()  # outside the lock: stopping may run finalizers that release other refs


def _forget_loop_after_fork() -> None:
    # A forked child (a torch DataLoader worker, say) inherits the module state but not the loop's
    # thread: start afresh there, or async stages in the child would wait on a loop nobody runs.
    global _shared, _lock
    _shared = None
    _lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_loop_after_fork)


def loop_running() -> bool:
    """True while the shared event-loop thread is running (some pass holds a :class:`LoopRef`)."""
    return _shared is not None


class LoopRef(Closeable):
    """A handle on the shared event loop: the loop thread runs while at least one handle is open.

    :meth:`close` is idempotent; the handle is a context manager; a ``weakref.finalize`` releases it
    if it is dropped unclosed.
    """

    def __init__(self) -> None:
        shared = self.shared = _acquire()
        self.loop = shared.loop
        self.thread = shared.thread
        self._finalizer = weakref.finalize(self, _release, shared)

    def on_loop_thread(self) -> bool:
        return threading.current_thread() is self.thread


class AsyncWorkers(Closeable):
    """Runs ``async def fn`` on the shared loop with at most ``n`` calls in flight.

    Items cross from the consumer's thread to the loop in batches: the consumer appends them to an
    inbox and wakes the loop only when the loop is idle and the consumer is about to wait (or a batch
    of ``n // 32`` items has gathered). Results cross back in batches too: they are appended to a
    deque, and the consumer is woken once per loop iteration that finished calls (one queue put for
    the whole burst), then takes them without any further cross-thread wake-up.

    Without ``timeout``, each of the (up to ``n``) tasks is a *runner*: it calls ``fn`` on its item,
    hands the result over, and goes on with the next item of the inbox itself, so a busy stage creates
    no task per item (a runner whose inbox is empty ends, and a new one starts when items arrive).
    ``fn`` calls made by one runner share the runner's ``contextvars`` context, as in a pool of
    worker tasks. A runner gives the loop a turn every 32 items, so a ``fn`` that never suspends does
    not hold the loop. With ``timeout``, each item runs in a task of its own: a call running longer
    is cancelled and reported as a :class:`TimeoutError` naming the stage and the item's position (a
    ``TimeoutError`` raised by ``fn`` itself passes unchanged).

    :meth:`resize` changes ``n`` while the stage runs (from any thread).
    """

    chunk = 1  # items go one by one (in batches the loop takes, see above)
    records = None  # the consumer waits in get() for each record

    kind = "async"

    def __init__(self, fn: Callable[[Any], Any], n: int, label: str, timeout: float | None = None) -> None:
        self.fn = fn
        self.n = n
        self.label = label
        self.timeout = timeout
        self.busy: list[float] = [0.0]
        self._ref: LoopRef | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._batch = max(1, n // 32)
        self._started = False
        self._blocked = False  # a fn held the loop past its deadline (timed runs): close() does not wait

    def start(self) -> None:
        self._ref = LoopRef()
        self._loop = self._ref.loop
        # Results go to a deque; the consumer is woken through a queue once per loop iteration that
        # finished tasks (not once per task), so a burst of results costs one cross-thread wake-up.
        self._done: deque[Any] = deque()
        self._signal: Any = queue.SimpleQueue()
        self._flush_scheduled = False
        self.ready = self._done.__len__
        self._inbox: deque[Any] = deque()
        with self._lock:
            # Slots: _cap is the limit the loop applies, _free the slots not in use. After a shrink
            # _free is negative until enough calls have ended (see _resize_on_loop).
            self._cap = self._free = self.n
            self._started = True
        self._idle = True
        self._unkicked = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._run = self._run_plain if self.timeout is None else self._run_timed
        if self.timeout is not None:
            # The deadline is also enforced from the consumer's side, for a fn that swallows its
            # cancellation or blocks the loop: see _get_timed.
            self._grace = min(1.0, max(0.05, 0.25 * self.timeout))
            self._state: dict[int, Any] = {}  # position -> _QUEUED, its start time, or _ENDED
            self._abandoned: set[int] = set()
            self._task_at: dict[int, asyncio.Task[Any]] = {}  # position -> its running task
            self._blocked = False
            self._pong = threading.Event()
            self._ping_at: float | None = None
            self.submit = self._submit_timed  # type: ignore[method-assign]
            self.get = self._get_timed  # type: ignore[method-assign]

    def resize(self, n: int) -> None:
        """Allow at most ``n`` calls of ``fn`` in flight from now on (thread-safe; any thread).

        Growing starts queued items at once; shrinking lets running calls finish (none is
        cancelled) and starts no new one until fewer than ``n`` run. How many items can be queued
        is the consumer's window, not this limit. Before :meth:`start` it sets the limit the stage
        starts with; after :meth:`close` it does nothing.

        >>> async def double(x):
        ...     return 2 * x
        >>> w = AsyncWorkers(double, 4, "S")
        >>> w.resize(2)
        >>> w.n
        2
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"stage {self.label}: resize(n) needs an int >= 1, got {n!r}")
        with self._lock:
            self.n = n
            self._batch = max(1, n // 32)
            if not self._started or self._closed:
                return
            if self._ref is not None and self._ref.on_loop_thread():
                on_loop = True
            else:
                on_loop = False
                try:
                    self._loop.call_soon_threadsafe(self._resize_on_loop)
                except RuntimeError:  # the loop closed: the stage is ending
                    pass
        if on_loop:
            self._resize_on_loop()

    # -- consumer side ------------------------------------------------------------------------------
    def submit(self, job: tuple[int, Any]) -> None:
        self._inbox.append(job)
        self._unkicked += 1

    def get(self) -> tuple[int, bool, Any]:
        done = self._done
        while True:
            if self._unkicked and (self._unkicked >= self._batch or not done):
                self._kick()
            if done:
                return done.popleft()
            self._signal.get()  # a batch of results arrived (or a stale signal: look again)

    def _submit_timed(self, job: tuple[int, Any]) -> None:
        with self._lock:
            self._state[job[0]] = _QUEUED
        self._inbox.append(job)
        self._unkicked += 1

    def _get_timed(self) -> tuple[int, bool, Any]:
        """:meth:`get` with the deadline held from the consumer's side.

        ``asyncio.timeout`` cancels a task at its deadline, but a ``fn`` that swallows the
        cancellation (a catch-all ``except`` that retries) or blocks the loop (``time.sleep``, a
        blocking call) would still run on. So the consumer also watches: an item running longer
        than ``timeout`` plus a grace (a quarter of ``timeout``, 0.05 to 1 s) is abandoned like a
        stuck thread (its eventual result is dropped and its slot is given to the next item) and
        fails with a ``TimeoutError``. The consumer pings the loop while it waits; when the loop has
        not answered within ``timeout`` plus the grace, it is blocked, and the oldest outstanding
        item fails with a ``TimeoutError`` that says so, whether or not it had started.
        """
        done, clock, lock, state = self._done, time.monotonic, self._lock, self._state
        limit = self.timeout + self._grace  # type: ignore[operator]
        while True:
            if self._unkicked and (self._unkicked >= self._batch or not done):
                self._kick()
            if done:
                rec = done.popleft()
                with lock:
                    state.pop(rec[0], None)
                return rec
            now = clock()
            if self._ping_at is not None and self._pong.is_set():
                self._ping_at = None  # the loop answered: it is running
            if self._ping_at is None:
                self._ping_at = now
                self._pong.clear()
                try:
                    self._loop.call_soon_threadsafe(self._pong.set)
                except RuntimeError:  # the loop was closed under us: nothing will ever arrive
                    self._ping_at = -float("inf")
            blocked = now - self._ping_at >= limit
            overdue = None
            wake = self._ping_at + limit
            with lock:
                for i, st in state.items():
                    if blocked:
                        if st is not _ENDED:
                            overdue = (i, st)
                            break
                    elif st is not _QUEUED and st is not _ENDED:
                        if st + limit <= now:
                            overdue = (i, st)
                            break
                        wake = min(wake, st + limit)
                if overdue is not None:
                    del state[overdue[0]]
                    self._abandoned.add(overdue[0])
                    task = self._task_at.pop(overdue[0], None)
            if overdue is not None:
                blocked = blocked or not self._pong.wait(self._grace)
                if blocked:
                    self._ping_at = clock()  # the next waiting item gets a window of its own
                return self._abandon(overdue[0], overdue[1], task, blocked)
            try:
                self._signal.get(True, max(0.0, wake - now))
            except queue.Empty:
                pass

    def _abandon(self, i: int, started: Any, task: asyncio.Task[Any] | None, blocked: bool) -> tuple[int, bool, Any]:
        """The failure record of item ``i``, given up on; a started item's slot goes to the next."""
        self._blocked = self._blocked or blocked
        self._ref.shared.abandon(task, blocked)  # type: ignore[union-attr]
        if started is not _QUEUED:
            try:
                self._loop.call_soon_threadsafe(self._replace_slot)
            except RuntimeError:
                pass
        if started is _QUEUED:
            what = f"stage {self.label}: item {i} could not start within timeout={self.timeout} s"
        else:
            what = f"stage {self.label}: item {i} did not finish within timeout={self.timeout} s"
        if blocked:
            msg = (f"{what}: the event loop has not run for more than {self.timeout + self._grace:.3g} s, so fn "  # type: ignore[operator]
                   f"blocks the event loop (a synchronous call such as time.sleep, blocking I/O or long CPU "
                   f"work inside async def fn); await asynchronous calls instead, or run blocking code with "
                   f"asyncio.to_thread(...); the item was abandoned")
        else:
            msg = (f"{what} and did not stop when cancelled (fn swallows asyncio.CancelledError); its task "
                   f"was abandoned and runs on until fn returns")
        return (i, False, TimeoutError(msg))

    def _replace_slot(self) -> None:
        """Loop side: the consumer abandoned a running item; its slot takes the next one."""
        if self._closed:
            return
        if self._free >= 0 and self._inbox:
            self._start(self._inbox.popleft())
        else:
            self._free += 1
            self._pump()

    def _kick(self) -> None:
        self._unkicked = 0
        with self._lock:
            idle, self._idle = self._idle, False
        if idle:
            self._loop.call_soon_threadsafe(self._pump)

    # -- loop side ----------------------------------------------------------------------------------
    def _resize_on_loop(self) -> None:
        """Loop side of :meth:`resize`: apply the latest limit. A shrink makes ``_free`` negative;
        each call that ends then gives its slot up instead of starting the next item."""
        if self._closed:
            return
        with self._lock:
            n = self.n
        self._free += n - self._cap
        self._cap = n
        if self._free > 0:
            self._pump()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _finish(self, rec: tuple[int, bool, Any]) -> None:
        """A per-item task (``timeout`` set) ended: hand its record over, give its slot on."""
        self._done.append(rec)
        self._schedule_flush()
        if self._free >= 0 and self._inbox and not self._closed:
            # Fast path: hand the freed slot to the next queued item, no lock (only the loop thread
            # takes from the inbox; the consumer only appends).
            self._start(self._inbox.popleft())
        else:
            self._free += 1
            self._pump()

    def _start(self, job: tuple[int, Any]) -> None:
        task = self._loop.create_task(self._run(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._signal.put(None)

    def _pump(self) -> None:
        if self._closed:
            return
        inbox = self._inbox
        while True:
            while self._free > 0 and inbox:
                self._free -= 1
                self._start(inbox.popleft())
            with self._lock:
                if self._free > 0 and inbox:
                    continue
                self._idle = self._free > 0
                return

    async def _run_plain(self, job: tuple[int, Any]) -> None:
        """A runner: call ``fn`` on ``job``, then on the next items of the inbox while there are any."""
        fn, done, inbox, busy, lock = self.fn, self._done, self._inbox, self.busy, self._lock
        clock = time.perf_counter
        shared = self._ref.shared  # type: ignore[union-attr]
        turn = 0
        while True:
            t = clock()
            try:
                rec = (job[0], True, await fn(job[1]))
            except asyncio.CancelledError as e:
                if self._closed or shared.closing:
                    self._closed = True  # the loop is shutting down under the stage: start nothing new
                    raise
                rec = (job[0], False, e)  # fn cancelled something of its own: an ordinary failure
            except GeneratorExit:  # the task is being destroyed: there is no one to report to
                raise
            except BaseException as e:  # noqa: BLE001 - the consumer re-raises it
                rec = (job[0], False, e)
            busy[0] += clock() - t
            done.append(rec)
            rec = job = None  # type: ignore[assignment]
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
            turn += 1
            if turn == 32:  # let the loop run its other callbacks, in case fn never suspends
                turn = 0
                await asyncio.sleep(0)
            if self._closed:
                return
            if self._free < 0:  # the stage was shrunk: give this slot up
                self._free += 1
                return
            if not inbox:
                with lock:
                    if not inbox:  # the consumer kicks the loop (see _kick) for what it adds next
                        self._free += 1
                        self._idle = True
                        return
            job = inbox.popleft()

    async def _run_timed(self, job: tuple[int, Any]) -> None:
        i = job[0]
        with self._lock:
            if i in self._abandoned:  # given up on before it could start (the loop was blocked)
                self._abandoned.discard(i)
                skip = True
            else:
                self._state[i] = time.monotonic()
                self._task_at[i] = asyncio.current_task()  # type: ignore[assignment]
                skip = False
        if skip:
            self._replace_slot()
            return
        t = time.perf_counter()
        cm = asyncio.timeout(self.timeout)
        try:
            async with cm:
                rec = (i, True, await self.fn(job[1]))
        except asyncio.CancelledError as e:
            if self._closed or self._ref.shared.closing:  # type: ignore[union-attr]
                self._closed = True
                raise
            rec = (i, False, e)
        except GeneratorExit:
            raise
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, TimeoutError) and cm.expired():
                err = TimeoutError(f"stage {self.label}: item {i} did not finish within timeout={self.timeout} s")
                err.__cause__ = None
                e = err
            rec = (i, False, e)
        self.busy[0] += time.perf_counter() - t
        with self._lock:
            if i in self._abandoned:  # the consumer gave up on it and gave its slot away: drop it
                self._abandoned.discard(i)
                return
            self._state[i] = _ENDED
            self._task_at.pop(i, None)
        self._finish(rec)

    def _cancel_on_loop(self, stopped: threading.Event) -> None:
        """Loop side of :meth:`close`: cancel every task; ``stopped`` is set once all have ended."""
        self._closed = True
        self._inbox.clear()
        abandoned = self._ref.shared.abandoned  # type: ignore[union-attr]
        tasks = [t for t in self._tasks if not t.done() and t not in abandoned]
        if not tasks:
            stopped.set()
            return
        left = [len(tasks)]

        def one_ended(_: Any) -> None:
            left[0] -= 1
            if left[0] == 0:
                stopped.set()

        for task in tasks:
            task.add_done_callback(one_ended)
            task.cancel()

    def close(self) -> None:
        """Cancel the stage's tasks, wait for them (bounded) and release the loop (idempotent).

        Quiet whenever it runs, the garbage collector's finalizers included: when the loop has
        already stopped (its own shutdown cancelled the tasks) there is nothing left to cancel, and
        no coroutine is ever created that might not be awaited.
        """
        ref = self._ref
        if ref is None or self._closed:
            return
        try:
            if ref.on_loop_thread():
                self._closed = True
                self._inbox.clear()
                for task in list(self._tasks):
                    task.cancel()
            elif self._loop.is_running():
                stopped = threading.Event()
                try:
                    self._loop.call_soon_threadsafe(self._cancel_on_loop, stopped)
                except RuntimeError:  # the loop closed in between: its shutdown cancelled the tasks
                    pass
                else:
                    if not self._blocked:  # a blocked loop cannot answer: don't wait
                        stopped.wait(_STOP_GRACE_S)
        finally:
            self._closed = True
            ref.close()


# -- async iterables ---------------------------------------------------------------------------------

_ITEM, _END, _ERR, _DONE = (object() for _ in range(4))


async def _produce(aiterable: Any, put: Callable[[Any], None], state: dict[str, Any], size: int) -> None:
    ait = None
    try:
        state["task"] = asyncio.current_task()
        sem = state["credits"] = asyncio.Semaphore(size)
        if state["stop"]:
            return
        ait = aiterable.__aiter__()
        while True:
            await sem.acquire()
            try:
                x = await ait.__anext__()
            except StopAsyncIteration:
                put((_END, None))
                return
            put((_ITEM, x))
    except asyncio.CancelledError:
        raise
    except BaseException as e:  # noqa: BLE001 - the consumer re-raises the same object
        put((_ERR, e))
    finally:
        try:
            aclose = getattr(ait, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            put((_DONE, None))


def _give_credits(state: dict[str, Any], k: int) -> None:
    sem = state["credits"]
    for _ in range(k):
        sem.release()


def _stop_producer(state: dict[str, Any]) -> None:
    state["stop"] = True
    task = state["task"]
    if task is not None and not task.done():
        task.cancel()


def iterate_async(aiterable: AsyncIterable[Any], buffer_size: int = 16) -> Iterator[Any]:
    """A plain iterator over ``aiterable``, driven on the engine's shared event loop.

    The loop reads at most ``buffer_size`` items ahead of the consumer (credits are returned in
    batches of ``buffer_size // 2``, so the consumer wakes the loop once per batch). An exception
    raised by the async iterable reaches the consumer as the same object. Closing the iterator (or
    dropping it) cancels the reading task and closes the async generator (``aclose``) on the loop.
    Nothing starts before the first ``next()``.

    >>> async def agen():
    ...     for i in range(3):
    ...         yield i
    >>> list(iterate_async(agen()))
    [0, 1, 2]
    """
    ref = LoopRef()
    q: Any = queue.SimpleQueue()
    state: dict[str, Any] = {"task": None, "stop": False, "credits": None}
    started = finished = False
    try:
        asyncio.run_coroutine_threadsafe(_produce(aiterable, q.put, state, buffer_size), ref.loop)
        started = True
        step = max(1, buffer_size // 2)
        taken = 0
        get = q.get
        while True:
            kind, value = get()
            if kind is _ITEM:
                taken += 1
                if taken == step:
                    ref.loop.call_soon_threadsafe(_give_credits, state, taken)
                    taken = 0
                yield value
            elif kind is _END:
                return
            elif kind is _ERR:
                raise value
            else:  # _DONE before _END: cancelled from elsewhere (the loop is stopping)
                finished = True
                return
    finally:
        if started and not finished and not ref.on_loop_thread() and ref.loop.is_running():
            try:
                ref.loop.call_soon_threadsafe(_stop_producer, state)
            except RuntimeError:  # the loop closed in between; its shutdown cancelled the reader
                finished = True
            deadline = time.monotonic() + _STOP_GRACE_S
            while not finished:
                try:
                    kind, _ = q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                finished = kind is _DONE
        ref.close()
