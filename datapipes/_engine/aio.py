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

_lock = threading.Lock()
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
                tasks = asyncio.all_tasks(loop)
                for t in tasks:
                    t.cancel()
                if tasks:
                    loop.run_until_complete(asyncio.wait(tasks, timeout=_STOP_GRACE_S))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self.thread:
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
    _lock = threading.Lock()


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
        shared = _acquire()
        self.loop = shared.loop
        self.thread = shared.thread
        self._finalizer = weakref.finalize(self, _release, shared)

    def on_loop_thread(self) -> bool:
        return threading.current_thread() is self.thread


class AsyncWorkers(Closeable):
    """Runs ``async def fn`` on the shared loop with at most ``n`` tasks in flight.

    The consumer appends items to an inbox and wakes the loop only when it is idle and the consumer
    is about to wait (or a batch of items has gathered), so a cross-thread wake-up is paid per batch,
    not per item. Each task puts its result record on a queue the consumer blocks on. With
    ``timeout``, a task running longer is cancelled and reported as a :class:`TimeoutError` naming
    the stage and the item's position (a ``TimeoutError`` raised by ``fn`` itself passes unchanged).
    """

    kind = "async"

    def __init__(self, fn: Callable[[Any], Any], n: int, label: str, timeout: float | None = None) -> None:
        self.fn = fn
        self.n = n
        self.label = label
        self.timeout = timeout
        self.busy: list[float] = [0.0]
        self._ref: LoopRef | None = None
        self._closed = False

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
        self._free = self.n
        self._idle = True
        self._unkicked = 0
        self._batch = max(1, self.n // 32)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._lock = threading.Lock()
        self._run = self._run_plain if self.timeout is None else self._run_timed

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

    def _kick(self) -> None:
        self._unkicked = 0
        with self._lock:
            idle, self._idle = self._idle, False
        if idle:
            self._loop.call_soon_threadsafe(self._pump)

    # -- loop side ----------------------------------------------------------------------------------
    def _finish(self, rec: tuple[int, bool, Any]) -> None:
        self._done.append(rec)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        if self._inbox and not self._closed:
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
            while self._free and inbox:
                self._free -= 1
                self._start(inbox.popleft())
            with self._lock:
                if self._free and inbox:
                    continue
                self._idle = self._free > 0
                return

    async def _run_plain(self, job: tuple[int, Any]) -> None:
        t = time.perf_counter()
        try:
            rec = (job[0], True, await self.fn(job[1]))
        except asyncio.CancelledError as e:
            if self._closed:
                raise
            rec = (job[0], False, e)  # fn cancelled something of its own: an ordinary failure
        except BaseException as e:  # noqa: BLE001 - the consumer re-raises it
            rec = (job[0], False, e)
        self.busy[0] += time.perf_counter() - t
        self._finish(rec)

    async def _run_timed(self, job: tuple[int, Any]) -> None:
        t = time.perf_counter()
        cm = asyncio.timeout(self.timeout)
        try:
            async with cm:
                rec = (job[0], True, await self.fn(job[1]))
        except asyncio.CancelledError as e:
            if self._closed:
                raise
            rec = (job[0], False, e)
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, TimeoutError) and cm.expired():
                err = TimeoutError(f"stage {self.label}: item {job[0]} did not finish within timeout={self.timeout} s")
                err.__cause__ = None
                e = err
            rec = (job[0], False, e)
        self.busy[0] += time.perf_counter() - t
        self._finish(rec)

    async def _cancel_tasks(self) -> None:
        self._closed = True
        self._inbox.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_STOP_GRACE_S)

    def close(self) -> None:
        """Cancel the stage's tasks, wait for them (bounded) and release the loop (idempotent)."""
        ref = self._ref
        if ref is None or self._closed:
            return
        try:
            if ref.on_loop_thread():
                self._closed = True
                for task in list(self._tasks):
                    task.cancel()
            else:
                fut = asyncio.run_coroutine_threadsafe(self._cancel_tasks(), self._loop)
                try:
                    fut.result(_STOP_GRACE_S + 1.0)
                except Exception:  # noqa: BLE001 - best effort: the loop may already be stopping
                    pass
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
        if started and not finished and not ref.on_loop_thread():
            ref.loop.call_soon_threadsafe(_stop_producer, state)
            deadline = time.monotonic() + _STOP_GRACE_S
            while not finished:
                try:
                    kind, _ = q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                finished = kind is _DONE
        ref.close()
