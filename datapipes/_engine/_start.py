"""How a process stage's workers start: forked from the consumer's process where that is clean,
else a fresh interpreter (docs/architecture.rst, "Process stages").

A fresh interpreter runs ``_procworker.py`` by path, so its start-up imports only the standard
library and cloudpickle, not torch; a forked worker finds whatever the consumer imported (numpy,
Pillow, torch) already there, which is what makes a process stage's first batch come fast.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from . import _procworker

__all__ = ["START_METHODS", "ForkedWorker", "start_method", "start_worker"]

_WORKER_PATH = os.path.abspath(_procworker.__file__)

#: how worker processes start: ``"auto"`` forks them when that is safe (see :func:`start_method`),
#: ``"spawn"`` always starts fresh interpreters; read from ``DATAPIPES_PROCESS_START`` when a pool starts
START_METHODS = ("auto", "spawn")


def _os_threads() -> int:
    """The threads of this process, native ones included (0 where that cannot be read)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def start_method() -> str:
    """How the next pool tries to start its workers: ``"fork"`` or ``"spawn"`` (a fresh interpreter).

    ``"fork"`` on Linux, where no other Python thread runs, unless ``DATAPIPES_PROCESS_START`` says
    ``spawn``. Each fork is then checked (:func:`_fork_clean`): a worker is forked only where the
    fork is clean, and started fresh otherwise.
    """
    wanted = os.environ.get("DATAPIPES_PROCESS_START", "auto")
    if wanted not in START_METHODS:
        raise ValueError(f"DATAPIPES_PROCESS_START must be one of {', '.join(START_METHODS)}, got {wanted!r}")
    if (wanted == "auto" and sys.platform.startswith("linux") and hasattr(os, "fork")
            and threading.active_count() == 1 and _os_threads() >= 1):
        return "fork"
    return "spawn"


def _fork_clean() -> int | None:
    """Fork a worker if the fork is clean; return its pid in the parent, ``None`` if it was not.

    A fork is clean when this process ran one thread as it forked: the kernel's count, taken in the
    parent just after the fork, after the libraries' at-fork handlers ran (OpenBLAS, which numpy
    loads, stops its thread pool there and starts it again on its next call), which is what
    Python 3.12+ checks before warning that a fork may deadlock. A thread still running then (an
    OpenMP pool after a torch op, a library's own thread) may hold a lock the child would wait for
    forever: that child is told to exit before it runs anything, and the caller starts a fresh
    interpreter instead. In the child, returns 0 once the parent said the fork is clean.
    """
    import warnings

    go_r, go_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):  # nothing buffered here is written twice
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    with warnings.catch_warnings():  # no other Python thread runs (start_method), so this is safe
        warnings.simplefilter("ignore", DeprecationWarning)  # the unclean case is handled below
        pid = os.fork()
    if pid == 0:
        os.close(go_w)
        if os.read(go_r, 1) != b"1":
            os._exit(0)
        os.close(go_r)
        return 0
    clean = _os_threads() == 1
    os.close(go_r)
    if clean:
        os.write(go_w, b"1")
    os.close(go_w)
    if not clean:
        os.waitpid(pid, 0)
        return None
    return pid


class ForkedWorker:
    """A worker forked from this process: what the pool uses of ``subprocess.Popen`` (``pid``,
    ``poll``, ``wait``, ``kill``), thread-safe as Popen is."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def _reap(self, flags: int) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, flags)
                except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler set to ignore)
                    self.returncode = -1
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            code = self._reap(0)
            assert code is not None
            return code
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while (code := self.poll()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.02)
        return code

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _reseed_global_generators() -> None:
    """Give a forked worker fresh global generators, as a fresh interpreter has: otherwise every
    worker would draw the parent's sequence from numpy's and torch's (Python's ``random`` reseeds
    itself at a fork). ``fn``'s per-item generator (``rng=``) is seeded by position, not here.

    numpy's is reseeded only where the parent imported ``numpy.random``: numpy 2 imports it on first
    use, and a worker that would import it here paid about 11 ms of CPU before its first item (a
    module the worker imports later seeds itself from the OS, as in a fresh interpreter)."""
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def _forked_worker_main(rfd: int, wfd: int, close: list[int]) -> None:
    """The body of a forked worker; never returns."""
    code = 0
    try:
        for fd in close:  # the parent's ends of this pool's channels: EOF must reach each worker
            os.close(fd)
        gc.freeze()  # the collector of this process leaves the parent's objects (and their pages) alone
        _reseed_global_generators()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        _procworker.main(rfd, wfd)
    except BaseException:  # noqa: BLE001 - reported on stderr; the parent sees the worker die
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)


def start_worker(fork: bool, oob: bool, parent_ends: list[Any]) -> tuple[Any, Any, Any]:
    """Start one worker, forked if ``fork`` and the fork is clean (:func:`_fork_clean`), else as a fresh
    interpreter; return it and the parent's ends of its two channels (``multiprocessing`` connections):
    a pipe to it, and from it a pipe, or a Unix socket when results pass memfds (``oob``).
    ``parent_ends``: the parent's ends of the workers started before (a forked one closes them)."""
    from multiprocessing.connection import Connection

    to_child_r, to_child_w = os.pipe()
    if oob:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        from_child_r, from_child_w = a.detach(), b.detach()
    else:
        from_child_r, from_child_w = os.pipe()
    proc: Any = None
    try:
        pid = _fork_clean() if fork else None
        if pid == 0:
            _forked_worker_main(to_child_r, from_child_w, [to_child_w, from_child_r, *(c.fileno() for c in parent_ends)])
        if pid is not None:
            proc = ForkedWorker(pid)
        else:
            proc = subprocess.Popen(
                [sys.executable, "-P", _WORKER_PATH, str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w),
                stdin=subprocess.DEVNULL,
            )
    except BaseException:
        os.close(to_child_w)
        os.close(from_child_r)
        raise
    finally:
        os.close(to_child_r)
        os.close(from_child_w)
    return proc, Connection(to_child_w, readable=False), Connection(from_child_r, writable=False)
