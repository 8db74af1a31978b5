"""The process backend: ``fn`` on worker processes, items travelling in chunks.

Workers are forked where the fork is clean (a pool of 6 or more by a zygote forked from the
consumer's process, a smaller one by the consumer itself), else fresh interpreters running
``_procworker.py`` by path (``_start.py``; docs/architecture.rst, "Process stages"). Items travel in
chunks to amortise the inter-process cost (about 50-100 us per message here, more than a small
item's work). Each worker has two chunks in flight at most, so
one is queued in its pipe while it works on the other.

Lifetime of the workers (a *pool*): a pass starts its pool at its first ``next()``. A stage that
names an ``owner`` (the pipe) keeps its pool *warm* across passes: when a pass ends, its pool is
parked with the owner and the next pass of that owner (the next epoch) takes it instead of starting
processes again (about 80 ms for two workers here, plus whatever unpickling ``fn`` imports: torch,
for a ``fn`` defined in a module that imports it). A parked pool is
shut down when its owner is garbage-collected, when it has been idle for ``IDLE_S`` seconds (60), or
at interpreter exit, whichever comes first. ``fn`` travels again with every pass (each worker
unpickles it before its first chunk of the pass), so a pass never sees a previous pass's ``fn``
object; what ``fn`` leaves in its worker's modules (caches, imports) stays, as with persistent
DataLoader workers. Without an owner, a pass's pool is shut down when the pass ends.

A pass ends in one of two ways for its pool:

- exhausted, or closed early by its consumer (``break``, ``close()``, a ``header``): the chunks still
  in flight are waited for and dropped (at most ``GRACE_S``, 1 s), so the pool is parked clean and
  nothing of this pass reaches the next one; a pool whose chunks do not come back in time is shut
  down instead;
- failed: ``fn`` raised (fail fast), a worker died, the consumer was interrupted, or the pass was
  closed by a consumer that is itself failing (:func:`datapipes._engine.lifecycle.abandon`): the
  pool is shut down at once, as nothing of a failing program should be kept (workers still busy
  after ``GRACE_S`` are killed).

Chunk size: ``chunksize`` items, or chosen automatically: the first chunk of each pass holds one item,
then each chunk aims at :func:`chunk_target_s` of work in ``fn`` (measured by the workers: 10 ms up to
4 active workers, then growing with them, so that the pool returns about ``_MAX_CHUNKS_PER_S``
chunks a second at most), at most 4 MiB of pickled items and at most 4 MiB of results, between 1 and
4096 items.

Exceptions raised by ``fn`` come back as pickled copies (a process cannot share objects) with the
worker's traceback as a note; an item or ``fn`` that cannot be pickled stops the pass with a
``TypeError`` naming the stage (and the item's position), whatever ``on_error`` says.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import selectors
import socket
import subprocess
import sys
import threading
import time
import weakref
from itertools import islice
from typing import Any, Callable, Iterable, Iterator

from . import _procworker
from ._start import ForkedWorker, Zygote, start_method, start_worker, use_zygote
from .core import EngineRun, resumed_source
from .lifecycle import Closeable, abandon
from .stats import StageStats

__all__ = ["IDLE_S", "ProcessWorkers", "run_process_stage", "live_worker_pids"]

_TARGET_CHUNK_S = 0.010
#: chunks a second that a pool's results may cost the consumer's process at most (see chunk_target_s)
_MAX_CHUNKS_PER_S = 400.0
_MAX_CHUNK = 4096
_MAX_CHUNK_BYTES = 4 << 20
_IN_FLIGHT_PER_WORKER = 2
GRACE_S = 1.0
#: seconds a parked (warm) pool waits for its owner's next pass before it is shut down
IDLE_S = 60.0

_STOP = object()
_DIED = object()
_live_pids: set[int] = set()
_live_lock = threading.Lock()

# Parked pools, one per owner at most: id(owner) -> pool. Re-entrant: an owner collected while this
# module holds the lock (a collection runs inside an allocation) finalises on the same thread.
_parked: dict[int, _Pool] = {}
_watched: dict[int, weakref.finalize] = {}  # id(owner) -> the finaliser that unparks at its collection
_park_lock = threading.RLock()


def live_worker_pids() -> set[int]:
    """Pids of worker processes this process started that have not been reaped yet (parked pools
    included)."""
    with _live_lock:
        return set(_live_pids)


def _known(info: dict[str, Any], pid: int) -> None:
    """A worker's pid has become known (its zygote reported it, or the worker said it in its hello)."""
    with _live_lock:
        _live_pids.add(pid)
    info["pid"] = pid


def chunk_target_s(active: int) -> float:
    """Seconds of ``fn``'s work that an automatically sized chunk aims at, with ``active`` workers
    taking chunks: ``_TARGET_CHUNK_S`` (10 ms), or ``active / _MAX_CHUNKS_PER_S`` where that is more
    (16 workers: 40 ms).

    Each chunk costs the consumer's process a message, a memfd mapping and a turn of the pool's
    reader thread (which shares its GIL with the consumer), and the ordered window holds two chunks
    per worker. With 10 ms chunks, 16 workers would send 1,600 messages a second and keep only 20 ms
    of work each ahead of the consumer, so one slow item or a consumer's pause left the others idle:
    ``benchmarks/transfer.py --work-ms 4 --workers 16`` (items of 2-12 ms) read 62% of the workers'
    rate with 10 ms chunks and 79% with 40 ms ones (docs/architecture.rst, "Process stages"). Up to
    four workers nothing changes, so a small pool's first batch and its tail at the end of a pass
    stay as they were.
    """
    return max(_TARGET_CHUNK_S, active / _MAX_CHUNKS_PER_S)


def in_dataloader_worker() -> bool:
    """True inside a torch DataLoader worker or any daemon process (which may not have children)."""
    if multiprocessing.current_process().daemon:
        return True
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return torch.utils.data.get_worker_info() is not None
        except AttributeError:  # pragma: no cover - a torch without utils.data
            return False
    return False


class _Gate:
    """Which workers take chunks from the pool's queue: those numbered below ``active`` (all of them,
    unless the tuner of a ``concurrency="auto"`` stage set fewer)."""

    def __init__(self, n: int) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.active = n

    def set(self, n: int) -> None:
        with self.cond:
            self.active = n
            self.cond.notify_all()

    def wait(self, k: int) -> None:
        with self.cond:
            while k >= self.active:
                self.cond.wait()


def _writer(conn: Any, inq: Any, slots: threading.Semaphore, gate: _Gate, k: int, spec: list[Any],
            proc: Any) -> None:
    """Feed worker ``k`` (``proc``) from the pool's queue, ``_IN_FLIGHT_PER_WORKER`` chunks at most
    at a time (a free worker takes the next chunk, whichever it is), while the gate lets it: the
    pass's ``fn`` before the first chunk of each pass, then chunks. Nothing is taken before the
    worker exists (a zygote forks the workers one after the other), so the first chunks go to the
    workers already running; nothing at all where its zygote did not fork it (the reader reports
    the failure), which the reader tells from a worker forked and not reported, its zygote killed:
    that one says its pid in its hello (``ForkedWorker.announce``) and is fed as the others."""
    sent = None
    try:
        if isinstance(proc, ForkedWorker):
            proc.born.wait()
            if proc.error is not None:  # not reported: its hello, or the end of its channel, says why
                proc.heard.wait()
                if proc.error is not None:
                    return
        while True:
            slots.acquire()
            gate.wait(k)
            payload = inq.get()
            if payload is _STOP:
                conn.send_bytes(b"")
                return
            current = spec[0]  # set before the pass put its first chunk (the queue orders the two)
            if current is not sent:
                conn.send_bytes(current)
                sent = current
            conn.send_bytes(payload)
            payload = None
    except OSError:
        return
    finally:
        conn.close()


def _receive(conn: Any, sock: Any) -> tuple[Any, int]:
    """One message of a worker: its record and the bytes it cost (the message and its memfd)."""
    data = conn.recv_bytes()
    nbytes = len(data)
    if data[:1] == b"B":  # results whose large buffers follow in a memfd (see _procworker)
        _, fds, _, _ = socket.recv_fds(sock, 1, 1)
        if not fds:
            raise EOFError
        rec, mapped = _procworker.load_out_of_band(data, fds[0])
        return rec, nbytes + mapped
    return pickle.loads(data), nbytes


class _Ends:
    """What the reader holds of each worker: its results channel (and, for memfds, a socket on the
    same descriptor), its slots, its info and its process."""

    __slots__ = ("conn", "sock", "slots", "info", "proc")

    def __init__(self, conn: Any, sock: Any, slots: threading.Semaphore, info: dict[str, Any], proc: Any) -> None:
        self.conn, self.sock, self.slots, self.info, self.proc = conn, sock, slots, info, proc

    def close(self) -> None:
        self.conn.close()
        if self.sock is not None:
            self.sock.close()


def _reader(ends: list[_Ends], outq: Any, closing: threading.Event) -> None:
    """The pool's one reader thread: every worker's results, as they arrive (a selector over their
    channels), onto ``outq``. A worker whose channel ends (it exited, or was never forked; unless the
    pool is closing) or whose results do not unpickle here is reported there as ``_DIED``; the
    others are read on. One thread for all: the results are unpickled under the consumer's GIL
    anyway, so a thread per worker only added threads (docs/architecture.rst, "Process stages")."""
    sel = selectors.DefaultSelector()
    try:
        for end in ends:
            sel.register(end.conn.fileno(), selectors.EVENT_READ, end)
        while sel.get_map():
            for key, _ in sel.select():
                end = key.data
                try:
                    rec, nbytes = _receive(end.conn, end.sock)
                except (EOFError, OSError):  # the worker exited, was killed, or was never forked
                    sel.unregister(key.fd)
                    end.close()
                    forked = isinstance(end.proc, ForkedWorker)
                    if forked:
                        end.proc.heard.set()
                    if not closing.is_set():
                        why = None
                        if forked:
                            end.proc.born.wait(GRACE_S)  # a worker its zygote did not fork: it says why
                            end.info["pid"], why = end.proc.pid, end.proc.error
                        outq.put((_DIED, end.info["pid"], why, False))
                    continue
                except BaseException as e:  # noqa: BLE001 - a result that does not unpickle here
                    sel.unregister(key.fd)
                    end.close()  # the worker sees its channel end
                    outq.put((_DIED, end.info["pid"], e, True))
                    continue
                if type(rec[0]) is str:  # ("hello", torch_imported, pid) | ("fn", torch_imported)
                    end.info["torch_imported"] = rec[1]
                    if rec[0] == "hello" and isinstance(end.proc, ForkedWorker) and end.proc.announce(rec[2]):
                        _known(end.info, rec[2])  # a worker its zygote did not report (yet)
                    continue
                end.slots.release()
                outq.put((*rec, nbytes))  # (chunk_id, seconds, values, failures, bytes of the results)
                rec = None  # the consumer alone holds the results (and their mappings) from here
    finally:
        for end in ends:
            end.close()
            if isinstance(end.proc, ForkedWorker):
                end.proc.heard.set()
        sel.close()


def _shutdown(parent: int, procs: list[Any], inq: Any, slots: list[threading.Semaphore], gate: _Gate,
              threads: list[threading.Thread], closing: threading.Event, idle: _Idle) -> None:
    if os.getpid() != parent:  # a forked child inherited this pool: the workers are not its own
        return
    closing.set()
    idle.stop()
    while True:
        try:
            inq.get_nowait()
        except queue.Empty:
            break
    gate.set(len(slots))  # every writer takes its stop
    for s in slots:
        inq.put(_STOP)
        s.release()
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
    for p in procs:
        p.wait()
    me = threading.current_thread()
    for t in threads:
        if t is not me and t.ident is not None:  # a pool that failed to start never started its threads
            t.join(GRACE_S)
    for p in procs:  # one whose zygote died before reporting it is known once the reader read its hello
        if p.poll() is None:
            p.kill()
            p.wait()
        with _live_lock:
            _live_pids.discard(p.pid)


class _Idle:
    """The parked state of a pool, watched by the pool's idle thread: while the pool is parked
    (``key`` is its owner's id) the thread waits ``IDLE_S`` for it to be taken, then shuts it down."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.key: int | None = None
        self.turn = 0  # changes at every park and take, so a wait knows it was overtaken
        self.stopped = False

    def park(self, key: int) -> None:
        with self.cond:
            self.key, self.turn = key, self.turn + 1
            self.cond.notify()

    def take(self) -> None:
        with self.cond:
            self.key, self.turn = None, self.turn + 1
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()


def _idle_watch(idle: _Idle, pool: _Pool) -> None:
    """The pool's idle thread: blocks while the pool is in use; expires it when parked too long."""
    while True:
        with idle.cond:
            while not idle.stopped and idle.key is None:
                idle.cond.wait()
            if idle.stopped or idle.key is None:
                return
            key, turn = idle.key, idle.turn
            if idle.cond.wait_for(lambda: idle.stopped or idle.turn != turn, IDLE_S):
                continue  # taken (or stopped) before the time ran out
        if _expire(key, pool):
            return


class _Pool(Closeable):
    """``n`` worker processes, each fed by a writer thread, all read by one reader thread; the pass
    using the pool sets ``spec[0]`` (its pickled ``fn``) before putting chunks on ``inq``; the gate
    says how many of the workers take them; results come back on ``outq``.

    Owner of its processes and threads (a writer per worker, the reader, and an idle thread that
    shuts the pool down once it has been parked for ``IDLE_S``): :meth:`close` is
    idempotent (it asks the workers to exit, kills those still busy after ``GRACE_S``, and reaps
    them), and a ``weakref.finalize`` does the same at interpreter exit.
    """

    def __init__(self, n: int, label: str) -> None:
        self.n = n
        self.parent = os.getpid()
        self.inq: Any = queue.SimpleQueue()
        self.gate = _Gate(n)
        slots: list[threading.Semaphore] = []
        self.outq: Any = queue.SimpleQueue()
        self.spec: list[Any] = [None]
        self.infos: list[dict[str, Any]] = []
        self.procs: list[Any] = []  # subprocess.Popen or ForkedWorker
        self.idle = _Idle()
        self._closing = threading.Event()
        threads: list[threading.Thread] = []
        self._finalizer: weakref.finalize | None = weakref.finalize(
            self, _shutdown, self.parent, self.procs, self.inq, slots, self.gate, threads, self._closing, self.idle)
        oob = _procworker.OOB_SUPPORTED
        setup = pickle.dumps({"sys_path": list(sys.path), "oob": oob})
        fork = start_method() == "fork"
        zygote = Zygote.start(n, oob) if fork and use_zygote(n) else None
        ends: list[tuple[Any, Any]] = []
        if zygote is not None:  # it forks the workers while this thread starts the pool's threads
            self.procs.extend(zygote.workers)
            ends = zygote.ends
            infos = self.infos

            def born(k: int, proc: ForkedWorker) -> None:
                _known(infos[k], proc.pid)  # type: ignore[arg-type]

            t = threading.Thread(target=zygote.watch, args=(born,), name=f"datapipes {label} zygote", daemon=True)
            threads.append(t)
        for _ in range(0 if zygote else n):  # every worker, then the threads: a fork must see this thread alone
            try:
                proc, tx, rx = start_worker(fork, oob, [end for pair in ends for end in pair])
            except BaseException:
                for tx, rx in ends:
                    tx.close()
                    rx.close()
                self.close()
                raise
            self.procs.append(proc)
            with _live_lock:
                _live_pids.add(proc.pid)
            ends.append((tx, rx))
        readable: list[_Ends] = []
        for k, (tx, rx) in enumerate(ends):
            sock = socket.socket(fileno=os.dup(rx.fileno())) if oob else None  # to receive the memfds
            try:
                tx.send_bytes(setup)  # a few hundred bytes: the pipe holds them until the worker exists
            except OSError:  # the worker is gone (or was never forked): the reader reports it
                pass
            proc = self.procs[k]
            info: dict[str, Any] = {"pid": proc.pid, "torch_imported": None, "forked": isinstance(proc, ForkedWorker)}
            self.infos.append(info)
            sem = threading.Semaphore(_IN_FLIGHT_PER_WORKER)
            slots.append(sem)
            readable.append(_Ends(rx, sock, sem, info, proc))
            threads.append(threading.Thread(target=_writer, args=(tx, self.inq, sem, self.gate, k, self.spec, proc),
                                            name=f"datapipes {label} writer {k}", daemon=True))
        threads.append(threading.Thread(target=_reader, args=(readable, self.outq, self._closing),
                                        name=f"datapipes {label} reader", daemon=True))
        threads.append(threading.Thread(target=_idle_watch, args=(self.idle, self), name=f"datapipes {label} idle pool",
                                        daemon=True))
        self._threads = threads
        self._launched = False

    def launch(self) -> None:
        """Start the pool's threads (once): its zygote's watcher first, then each worker's writer,
        then the reader. The first pass puts its ``fn`` and first chunks on the queue before (see
        :meth:`ProcessWorkers.launch`), so each writer feeds its worker from its first moment, while
        the others start (on a busy machine a thread's start costs a few milliseconds)."""
        if not self._launched:
            self._launched = True
            for t in self._threads:
                t.start()

    def usable(self) -> bool:
        """Every worker alive and nothing waiting on the result queue (a death is reported there)."""
        return self.outq.empty() and all(p.poll() is None for p in self.procs)

    def drain(self, in_flight: int) -> bool:
        """Drop the chunks of an ended pass: those not handed to a worker yet, and the results of
        the ``in_flight`` others (waited for, ``GRACE_S`` at most). True when the pool is clean."""
        inq, outq = self.inq, self.outq
        while in_flight > 0:
            try:
                inq.get_nowait()
            except queue.Empty:
                break
            in_flight -= 1
        deadline = time.monotonic() + GRACE_S
        while in_flight > 0:
            try:
                rec = outq.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return False
            if rec[0] is _DIED:
                return False
            in_flight -= 1
        return self.usable()


def _unpark(key: int) -> None:
    """The owner ``key`` was collected: shut its parked pool down."""
    with _park_lock:
        _watched.pop(key, None)
        pool = _parked.pop(key, None)
    if pool is not None:
        pool.close()


def _expire(key: int, pool: _Pool) -> bool:
    """``pool`` has been parked for ``IDLE_S``: shut it down, unless a pass just took it."""
    with _park_lock:
        if _parked.get(key) is not pool:
            return False
        del _parked[key]
    pool.close()
    return True


def _take_parked(owner: Any, n: int) -> _Pool | None:
    """The pool ``owner`` parked, if any and usable with ``n`` workers."""
    with _park_lock:
        pool = _parked.pop(id(owner), None)
    if pool is None:
        return None
    pool.idle.take()
    if pool.n != n or not pool.usable():
        pool.close()
        return None
    return pool


def _park(owner_ref: weakref.ref[Any], pool: _Pool) -> bool:
    """Park ``pool`` with its owner for the owner's next pass; False if it cannot be (the owner
    is gone, or another pass of it parked a pool first)."""
    if os.getpid() != pool.parent:
        return False
    with _park_lock:
        owner = owner_ref()
        if owner is None:
            return False
        key = id(owner)
        if key in _parked:
            return False
        if key not in _watched:
            _watched[key] = weakref.finalize(owner, _unpark, key)
            # (the ignore: mypy 1.x's typeshed, on the free-threaded leg, leaves atexit out of finalize's slots)
            _watched[key].atexit = False  # type: ignore[misc]  # the pools' own finalisers stop them at exit
        _parked[key] = pool
        pool.idle.park(key)
        return True


def _forget_after_fork() -> None:
    # A forked child (a torch DataLoader worker, say) inherits the parked pools but not their
    # threads, and their workers are not its children: forget them there (their finalisers check
    # the pid and do nothing in the child).
    global _park_lock, _live_lock
    _parked.clear()
    for f in list(_watched.values()):
        f.detach()
    _watched.clear()
    _live_pids.clear()
    _park_lock = threading.RLock()
    _live_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


class _Tally:
    """What the pass tells its pool's next user: chunks handed over and not back yet, and whether
    the pass failed (the pool is then shut down rather than parked)."""

    __slots__ = ("in_flight", "failed")

    def __init__(self) -> None:
        self.in_flight = 0
        self.failed = False


def _end_pass(pool: _Pool, owner_ref: weakref.ref[Any] | None, tally: _Tally) -> None:
    pool.launch()  # after a pass that failed before its first chunks: the writers take a stop, or the next fn
    if owner_ref is not None and not tally.failed and pool.drain(tally.in_flight) and _park(owner_ref, pool):
        return
    pool.close()


class ProcessWorkers(Closeable):
    """The worker processes of one pass of a process stage: a pool, started for this pass or taken
    warm from ``owner``'s previous pass (see the module's docstring for the lifetime).

    :meth:`close` is idempotent: it parks the pool with ``owner`` (after draining what is in flight)
    or shuts it down, as described above; the object is a context manager, and a ``weakref.finalize``
    does the same if it is dropped unclosed. ``owner`` is held weakly; one that cannot be weakly
    referenced keeps no pool.
    """

    kind = "process"

    def __init__(self, fn: Callable[[Any], Any], n: int, label: str, rng_kind: str | None = None,
                 owner: Any = None) -> None:
        self.fn = fn
        self.n = n
        #: the workers that are given chunks (``concurrency="auto"``: the tuner sets it, at most ``n``)
        self.active = n
        self.label = label
        self.rng_kind = rng_kind
        self.busy: list[float] = [0.0]
        self.infos: list[dict[str, Any]] = []
        self.tally = _Tally()
        self.warm = False  # whether this pass took a pool parked by a previous one
        #: called once the pool is running (the tuner's registration: a thread, so after the forks)
        self.started: Callable[[], None] | None = None
        self._gate: _Gate | None = None  # the pool's, once started (resize moves it)
        try:
            self._owner_ref: weakref.ref[Any] | None = None if owner is None else weakref.ref(owner)
        except TypeError:
            self._owner_ref = None
        self._finalizer: weakref.finalize | None = None

    def resize(self, n: int) -> None:
        """Give chunks to ``n`` of the pool's workers from now on (1 to the pool's size): the others
        finish what they hold and wait, started and warm, for a later step up."""
        self.active = max(1, min(n, self.n))
        if self._gate is not None:
            self._gate.set(self.active)

    def start(self) -> None:
        if in_dataloader_worker():
            raise RuntimeError(
                f"stage {self.label}: executor='process' cannot run inside a torch DataLoader worker or another "
                "daemon process (a daemon process may not have children); use executor='thread', or "
                "DataLoader(num_workers=0) and let this stage provide the parallelism"
            )
        try:
            import cloudpickle

            fn_payload = cloudpickle.dumps(self.fn, pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise TypeError(f"stage {self.label}: fn cannot be pickled to go to worker processes: {e}") from e
        spec = pickle.dumps(("fn", list(sys.path), fn_payload, self.rng_kind))
        owner = None if self._owner_ref is None else self._owner_ref()
        pool = None if owner is None else _take_parked(owner, self.n)
        self.warm = pool is not None
        if pool is None:
            pool = _Pool(self.n, self.label)
        self._pool = pool
        pool.spec[0] = spec
        self.infos = pool.infos
        self._inq: Any = pool.inq
        self._gate = pool.gate
        pool.gate.set(self.active)  # a warm pool may come from a pass its tuner had narrowed
        self._outq: Any = pool.outq
        self._finalizer = weakref.finalize(self, _end_pass, pool, self._owner_ref, self.tally)
        # (the ignore: mypy 1.x's typeshed, on the free-threaded leg, leaves atexit out of finalize's slots)
        self._finalizer.atexit = False  # type: ignore[misc]  # at exit the pool's own finaliser stops it; nothing is parked
        if self.started is not None:
            self.started()

    def launch(self) -> None:
        """Start the pool's threads, if :meth:`start` started a new pool: called once the pass's
        first chunks are queued (a warm pool's threads already run)."""
        self._pool.launch()


def _encode(chunk_id: int, items: list[Any], first: int, label: str) -> bytes:
    try:
        return _procworker.dumps((chunk_id, items))
    except Exception:
        for j, x in enumerate(items):
            try:
                _procworker.dumps(x)
            except Exception as e:
                raise TypeError(f"stage {label}: item {first + j} cannot be pickled to go to a worker process: {e}") from e
        raise


def _died(label: str, rec: tuple[Any, ...]) -> None:
    """Raise the error of a pass whose worker died or sent results that do not unpickle here
    (``rec``: ``(_DIED, pid, why or None, unreadable)``)."""
    _, pid, why, unreadable = rec
    if unreadable:
        raise RuntimeError(f"stage {label}: the results of worker process {pid} could not be unpickled in this "
                           f"process: {why!r}") from why
    if pid is None:  # its zygote could not fork it
        why = why or "its zygote did not report it"
        raise RuntimeError(f"stage {label}: a worker process could not be started: {why}")
    raise RuntimeError(f"stage {label}: worker process {pid} died unexpectedly" + (f": {why!r}" if why else ""))


def _closed_by_failure(exc: GeneratorExit) -> bool:
    """Whether a pass is being closed by a consumer that is handling an exception (as
    :func:`~datapipes._engine.lifecycle.abandon` does), rather than by a ``break`` or ``close()``."""
    seen = exc.__context__
    while seen is not None:
        if not isinstance(seen, GeneratorExit):
            return True
        seen = seen.__context__
    return False


def run_process_stage(
    workers: ProcessWorkers,
    source: Iterable[Any],
    ordered: bool,
    chunksize: int | None,
    on_fail: Callable[[BaseException, int], None],
    count: Any,
    stats: StageStats,
    run: EngineRun | None = None,
) -> Iterator[Any]:
    """Yield ``fn(x)`` for each source item, computed on worker processes in chunks.

    Bound: at most ``2 * concurrency`` chunks in flight (two per active worker; a free worker takes
    the next chunk, whichever it is) plus the chunk being yielded, so at most ``(2 * concurrency + 1) * chunksize``
    items pulled ahead of the consumer. ``run`` tracks the
    inputs pulled and not yet yielded, as for threads (:class:`~datapipes._engine.core.EngineRun`).
    """
    label = workers.label
    tally = workers.tally
    n_in = n_out = fill = done = 0
    pulling = waiting = 0.0
    size = chunksize or 1
    src: Any = None
    stash: dict[int, Any] = {}
    run = run if run is not None else EngineRun()
    inputs = run.inputs
    try:
        src, n_in = resumed_source(run, iter(source))
        workers.start()
        stats.begin(workers.busy, run.live(count))
        put, get, ready = workers._inq.put, workers._outq.get, workers._outq.qsize
        starts: dict[int, int] = {}  # chunk id -> position of its first item
        sent = 0
        deferred: BaseException | None = None
        more = True
        bytes_per_item = 0.0

        def send_one() -> None:
            nonlocal n_in, sent, more, deferred, bytes_per_item, pulling
            items: list[Any] = []
            t = time.perf_counter()
            try:
                items.extend(islice(src, size))  # keeps what was pulled before a failing item
            except Exception as e:
                deferred = e
            if len(items) < size:
                more = False
            pulling += time.perf_counter() - t
            stats.source_s = pulling
            if not items:
                return
            payload = _encode(sent, items, n_in, label)
            bytes_per_item = len(payload) / len(items)
            starts[sent] = n_in
            inputs.update(zip(range(n_in, n_in + len(items)), items))
            n_in += len(items)
            sent += 1
            tally.in_flight += 1
            put(payload)

        def fill_up() -> None:
            # the chunks not yielded yet (results stashed for order included): two per active worker
            while more and sent - done < _IN_FLIGHT_PER_WORKER * workers.active:
                send_one()

        try:
            fill_up()  # the first chunks wait on the queue for the pool's threads, started now
        finally:
            workers.launch()
        while done < sent:
            rec = stash.pop(done, None) if ordered else None
            if rec is None:
                t = time.perf_counter()
                rec = get()
                if rec[0] is _DIED:
                    _died(label, rec)
                tally.in_flight -= 1
                while ordered and rec[0] != done:
                    stash[rec[0]] = rec
                    rec = get()
                    if rec[0] is _DIED:
                        _died(label, rec)
                    tally.in_flight -= 1
                waiting += time.perf_counter() - t
                stats.wait_s = waiting
            chunk_id, seconds, values, failures, result_bytes = rec
            rec = None
            workers.busy[0] += seconds
            done += 1
            if chunksize is None and values:
                per_item = seconds / len(values)
                want = int(chunk_target_s(workers.active) / per_item) if per_item > 0 else _MAX_CHUNK
                if bytes_per_item > 0:
                    want = min(want, int(_MAX_CHUNK_BYTES / bytes_per_item))
                # large results too: a chunk's results come back whole, so a smaller chunk overlaps more
                want = min(want, int(_MAX_CHUNK_BYTES * len(values) / max(1, result_bytes)))
                size = max(1, min(_MAX_CHUNK, want))
            fill_up()
            first = starts.pop(chunk_id)
            fill += ready() + len(stash)
            run.pulled = n_in
            if failures:
                for j, value in enumerate(values):
                    n_out += 1
                    del inputs[first + j]
                    if j in failures:
                        on_fail(failures[j], first + j)
                    else:
                        yield value
            else:
                for j, value in enumerate(values, first):
                    n_out += 1
                    del inputs[j]
                    yield value
            values = failures = None
        if deferred is not None:
            raise deferred
    except GeneratorExit as e:
        tally.failed = _closed_by_failure(e)
        raise
    except BaseException:
        tally.failed = True
        abandon(src)
        raise
    finally:
        workers.close()
        stash.clear()
        stats.finish(n_in, n_out - count.n, count.n, fill, max(1, done), pulling, waiting)
        count.end(n_out)
