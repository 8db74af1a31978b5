"""The process backend: ``fn`` on worker processes, items travelling in chunks.

Workers are fresh interpreters (spawn semantics: fork-exec, safe however many threads the parent
runs) started on the first ``next()`` and running ``_procworker.py`` by path, so their start-up
imports only the standard library and cloudpickle, not torch. ``fn`` travels once per pass through
cloudpickle; items travel in chunks to amortise the inter-process cost (about 50-100 us per message
here, more than a small item's work). Each worker has two chunks in flight at most, so one is queued
in its pipe while it works on the other.

Chunk size: ``chunksize`` items, or chosen automatically: the first chunk of each pass holds one item,
then each chunk aims at about 10 ms of work in ``fn`` (measured by the workers) and at most 4 MiB of
pickled items, between 1 and 4096 items.

Exceptions raised by ``fn`` come back as pickled copies (a process cannot share objects) with the
worker's traceback as a note; an item or ``fn`` that cannot be pickled stops the pass with a
``TypeError`` naming the stage (and the item's position), whatever ``on_error`` says.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Iterator

from . import _procworker
from .core import EngineRun, resumed_source
from .lifecycle import Closeable, abandon
from .stats import StageStats

__all__ = ["ProcessWorkers", "run_process_stage", "live_worker_pids"]

_WORKER_PATH = os.path.abspath(_procworker.__file__)
_TARGET_CHUNK_S = 0.010
_MAX_CHUNK = 4096
_MAX_CHUNK_BYTES = 4 << 20
_IN_FLIGHT_PER_WORKER = 2
_GRACE_S = 1.0

_STOP = object()
_DIED = object()
_live_pids: set[int] = set()
_live_lock = threading.Lock()


def live_worker_pids() -> set[int]:
    """Pids of worker processes this process started that have not been reaped yet."""
    with _live_lock:
        return set(_live_pids)


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


def _writer(conn: Any, inq: Any, slots: threading.Semaphore) -> None:
    try:
        while True:
            slots.acquire()
            payload = inq.get()
            if payload is _STOP:
                conn.send_bytes(b"")
                return
            conn.send_bytes(payload)
    except OSError:
        return
    finally:
        conn.close()


def _reader(conn: Any, outq: Any, slots: threading.Semaphore, info: dict[str, Any], closing: threading.Event) -> None:
    try:
        hello = pickle.loads(conn.recv_bytes())
        info["torch_imported"] = hello[2]
        while True:
            msg = conn.recv_bytes()
            slots.release()
            outq.put(pickle.loads(msg))
    except (EOFError, OSError):
        if not closing.is_set():
            outq.put((_DIED, info["pid"], None))
    except BaseException as e:  # noqa: BLE001 - a result that does not unpickle here
        outq.put((_DIED, info["pid"], e))
    finally:
        conn.close()


def _shutdown(procs: list[subprocess.Popen[bytes]], inq: Any, slots: list[threading.Semaphore],
              threads: list[threading.Thread], closing: threading.Event) -> None:
    closing.set()
    while True:
        try:
            inq.get_nowait()
        except queue.Empty:
            break
    for s in slots:
        inq.put(_STOP)
        s.release()
    deadline = time.monotonic() + _GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
    for p in procs:
        p.wait()
        with _live_lock:
            _live_pids.discard(p.pid)
    me = threading.current_thread()
    for t in threads:
        if t is not me:
            t.join(_GRACE_S)


class ProcessWorkers(Closeable):
    """``n`` worker processes, each fed by a writer thread and read by a reader thread.

    Owner of its processes and threads: :meth:`close` is idempotent (it asks the workers to exit,
    kills those still busy after 1 s, and reaps them), the object is a context manager, and a
    ``weakref.finalize`` does the same if it is dropped unclosed.
    """

    kind = "process"

    def __init__(self, fn: Callable[[Any], Any], n: int, label: str, rng_kind: str | None = None) -> None:
        self.fn = fn
        self.n = n
        self.label = label
        self.rng_kind = rng_kind
        self.busy: list[float] = [0.0]
        self.infos: list[dict[str, Any]] = []
        self._finalizer: weakref.finalize | None = None

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
        setup = pickle.dumps({"sys_path": list(sys.path)})
        spec = pickle.dumps((fn_payload, self.rng_kind))
        self._inq: Any = queue.SimpleQueue()
        self._outq: Any = queue.SimpleQueue()
        self._closing = threading.Event()
        procs: list[subprocess.Popen[bytes]] = []
        slots: list[threading.Semaphore] = []
        threads: list[threading.Thread] = []
        self._finalizer = weakref.finalize(self, _shutdown, procs, self._inq, slots, threads, self._closing)
        from multiprocessing.connection import Connection

        for k in range(self.n):
            to_child_r, to_child_w = os.pipe()
            from_child_r, from_child_w = os.pipe()
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-P", _WORKER_PATH, str(to_child_r), str(from_child_w)],
                    pass_fds=(to_child_r, from_child_w),
                    stdin=subprocess.DEVNULL,
                )
            finally:
                os.close(to_child_r)
                os.close(from_child_w)
            procs.append(proc)
            with _live_lock:
                _live_pids.add(proc.pid)
            tx = Connection(to_child_w, readable=False)
            rx = Connection(from_child_r, writable=False)
            tx.send_bytes(setup)
            tx.send_bytes(spec)
            info: dict[str, Any] = {"pid": proc.pid, "torch_imported": None}
            self.infos.append(info)
            sem = threading.Semaphore(_IN_FLIGHT_PER_WORKER)
            slots.append(sem)
            for target, args, role in ((_writer, (tx, self._inq, sem), "writer"),
                                       (_reader, (rx, self._outq, sem, info, self._closing), "reader")):
                t = threading.Thread(target=target, args=args, name=f"datapipes {self.label} {role} {k}", daemon=True)
                threads.append(t)
                t.start()


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

    Bound: at most ``2 * concurrency`` chunks in flight plus the chunk being yielded, so at most
    ``(2 * concurrency + 1) * chunksize`` items pulled ahead of the consumer. ``run`` tracks the
    inputs pulled and not yet yielded, as for threads (:class:`~datapipes._engine.core.EngineRun`).
    """
    label = workers.label
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
        stats.begin(workers.busy)
        put, get, ready = workers._inq.put, workers._outq.get, workers._outq.qsize
        max_chunks = _IN_FLIGHT_PER_WORKER * workers.n
        starts: dict[int, int] = {}  # chunk id -> position of its first item
        sent = 0
        deferred: BaseException | None = None
        more = True
        bytes_per_item = 0.0

        def send_one() -> None:
            nonlocal n_in, sent, more, deferred, bytes_per_item, pulling
            items = []
            t = time.perf_counter()
            try:
                for _ in range(size):
                    x = next(src, _STOP)
                    if x is _STOP:
                        more = False
                        break
                    items.append(x)
            except Exception as e:
                deferred, more = e, False
            pulling += time.perf_counter() - t
            if not items:
                return
            payload = _encode(sent, items, n_in, label)
            bytes_per_item = len(payload) / len(items)
            starts[sent] = n_in
            for j, x in enumerate(items):
                inputs[n_in + j] = x
            n_in += len(items)
            sent += 1
            put(payload)

        while more and sent < max_chunks:
            send_one()
        while done < sent:
            rec = stash.pop(done, None) if ordered else None
            if rec is None:
                t = time.perf_counter()
                rec = get()
                if rec[0] is _DIED:
                    why = f": {rec[2]!r}" if rec[2] is not None else ""
                    raise RuntimeError(f"stage {label}: worker process {rec[1]} died unexpectedly{why}")
                while ordered and rec[0] != done:
                    stash[rec[0]] = rec
                    rec = get()
                    if rec[0] is _DIED:
                        raise RuntimeError(f"stage {label}: worker process {rec[1]} died unexpectedly")
                waiting += time.perf_counter() - t
            chunk_id, seconds, results = rec
            rec = None
            workers.busy[0] += seconds
            done += 1
            if chunksize is None and results:
                per_item = seconds / len(results)
                want = int(_TARGET_CHUNK_S / per_item) if per_item > 0 else _MAX_CHUNK
                if bytes_per_item > 0:
                    want = min(want, int(_MAX_CHUNK_BYTES / bytes_per_item))
                size = max(1, min(_MAX_CHUNK, want))
            if more:
                send_one()
            first = starts.pop(chunk_id)
            fill += ready() + len(stash)
            run.pulled = n_in
            for j, (ok, value) in enumerate(results):
                n_out += 1
                del inputs[first + j]
                if ok:
                    yield value
                else:
                    on_fail(value, first + j)
            results = None
        if deferred is not None:
            raise deferred
    except BaseException:
        abandon(src)
        raise
    finally:
        workers.close()
        stash.clear()
        stats.finish(n_in, n_out - count.n, count.n, fill, max(1, done), pulling, waiting)
