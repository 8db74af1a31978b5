"""How a process stage's workers start: forked where that is clean (a large pool by a *zygote* forked
from the consumer's process, a small one by the consumer itself), else each a fresh interpreter
(docs/architecture.rst, "Process stages").

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
from typing import Any, Callable

from . import _procworker

__all__ = ["START_METHODS", "ZYGOTE_MIN_WORKERS", "ForkedWorker", "Zygote", "start_method", "start_worker",
           "use_zygote"]

_WORKER_PATH = os.path.abspath(_procworker.__file__)

#: how worker processes start, read from ``DATAPIPES_PROCESS_START`` when a pool starts: ``"auto"``
#: forks them where that is clean (see :func:`start_method`), a pool of ``ZYGOTE_MIN_WORKERS`` or more
#: through a :class:`Zygote`; ``"fork"`` the same, every worker forked by the consumer itself (no
#: zygote); ``"spawn"`` always starts fresh interpreters
START_METHODS = ("auto", "fork", "spawn")
#: pools of this many workers or more are forked by a zygote under ``"auto"``, smaller ones by the
#: consumer itself: the zygote costs one fork more before the first worker exists, and saves the
#: consumer's waiting for every fork before its threads start. On 2 CPUs the first batch was 18%
#: sooner with 8 and 16 workers (``benchmarks/transfer.py --work-ms 5 --workers 16 --only
#: threads_collate,datapipes_collate,datapipes_collate_direct``), even with 6, and 3-4 ms later with
#: 3-4 (docs/performance.rst, "The zygote")
ZYGOTE_MIN_WORKERS = 6
#: seconds a worker still to be forked by its zygote is waited for, when its pool is shut down,
#: before the zygote is killed (it forks a worker in milliseconds: a zygote this slow hangs)
ZYGOTE_WAIT_S = 10.0


def _os_threads() -> int:
    """The threads of this process, native ones included (0 where that cannot be read)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def start_method() -> str:
    """How the next pool tries to start its workers: ``"fork"`` or ``"spawn"`` (a fresh interpreter).

    ``"fork"`` on Linux, where no other Python thread runs, unless ``DATAPIPES_PROCESS_START`` says
    ``spawn``. Each fork is then checked (:func:`_fork_clean`): a worker (or the zygote that forks a
    large pool: :func:`use_zygote`) is forked only where the fork is clean, and started fresh
    otherwise.
    """
    wanted = _wanted()
    if (wanted != "spawn" and sys.platform.startswith("linux") and hasattr(os, "fork")
            and threading.active_count() == 1 and _os_threads() >= 1):
        return "fork"
    return "spawn"


def _wanted() -> str:
    wanted = os.environ.get("DATAPIPES_PROCESS_START", "auto")
    if wanted not in START_METHODS:
        raise ValueError(f"DATAPIPES_PROCESS_START must be one of {', '.join(START_METHODS)}, got {wanted!r}")
    return wanted


def use_zygote(n: int) -> bool:
    """Whether a pool of ``n`` workers that forks them does so through a :class:`Zygote`."""
    return n >= ZYGOTE_MIN_WORKERS and _wanted() == "auto"


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
    """A forked worker: what the pool uses of ``subprocess.Popen`` (``pid``, ``poll``, ``wait``,
    ``kill``), thread-safe as Popen is.

    A worker forked by a pool's :class:`Zygote` has no pid until the zygote reports it or the worker
    says it in its hello (:meth:`announce`; ``born`` is set then, or when the zygote failed to fork
    it, ``returncode`` then set), and is this process's child only once the zygote has exited
    (``adopted``): until then ``poll`` says it runs and ``wait`` waits; ``kill`` waits for a worker
    not forked yet (``ZYGOTE_WAIT_S``), and kills the zygote only if it hangs."""

    def __init__(self, pid: int | None, zygote: Zygote | None = None) -> None:
        self.pid = pid
        self.returncode: int | None = None
        #: why the worker does not exist (its zygote could not fork it), else None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self.zygote = zygote
        self.born = threading.Event()
        self.adopted = threading.Event()
        #: the pool's reader has read this worker's hello or the end of its channel: which of the two
        #: tells a worker its zygote did not report (``error`` set) from one it never forked
        self.heard = threading.Event()
        if zygote is None:
            self.born.set()
            self.adopted.set()

    def announce(self, pid: int) -> bool:
        """The worker's hello said its pid: True if that is news. A zygote killed between a fork and
        its report leaves that worker running with no pid known here; once it says its pid, it is
        waited for, killed and reaped as the others (an orphan, it is this process's child)."""
        with self._lock:
            news = self.zygote is not None and self.pid is None
            if news:
                self.pid, self.error, self.returncode = pid, None, None
        self.born.set()
        self.heard.set()
        return news

    def lost(self, why: BaseException) -> None:
        """The zygote exited without reporting this worker: it was never forked (``why`` says why),
        unless its hello says otherwise (:meth:`announce`)."""
        with self._lock:
            if self.pid is None:
                self.error, self.returncode = why, -1
        self.born.set()

    def _reap(self, flags: int) -> int | None:
        with self._lock:
            if self.returncode is None and self.adopted.is_set():
                try:
                    pid, status = os.waitpid(self.pid, flags)  # type: ignore[arg-type]
                except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler set to ignore)
                    self.returncode = -1
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        deadline = time.monotonic() + (timeout or 0.0)
        if not self.adopted.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        if timeout is None:
            code = self._reap(0)
            assert code is not None
            return code
        delay = 0.0005
        while (code := self.poll()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.02)
        return code

    def kill(self) -> None:
        if self.poll() is not None:
            return
        if self.pid is None and self.zygote is not None:
            # Not forked yet. A zygote's forks take milliseconds; killed now, it could leave a worker
            # it forked and had not reported yet, which this process would never reap. So it is
            # waited for, and killed only if it hangs.
            if not self.born.wait(ZYGOTE_WAIT_S):
                self.zygote.kill()
                return
            if self.pid is None:  # the zygote could not fork it
                return
        try:  # never reaped by the zygote, so the pid is this worker's until this process reaps it
            os.kill(self.pid, signal.SIGKILL)  # type: ignore[arg-type]
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


def _channels(oob: bool) -> tuple[int, int, int, int]:
    """A worker's two channels: a pipe to it, and from it a pipe, or a Unix socket when results pass
    memfds (``oob``); their descriptors, ``(to_child_r, to_child_w, from_child_r, from_child_w)``."""
    to_child_r, to_child_w = os.pipe()
    if oob:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        return to_child_r, to_child_w, a.detach(), b.detach()
    return (to_child_r, to_child_w, *os.pipe())


def start_worker(fork: bool, oob: bool, parent_ends: list[Any]) -> tuple[Any, Any, Any]:
    """Start one worker, forked if ``fork`` and the fork is clean (:func:`_fork_clean`), else as a fresh
    interpreter; return it and the parent's ends of its two channels (``multiprocessing`` connections):
    a pipe to it, and from it a pipe, or a Unix socket when results pass memfds (``oob``).
    ``parent_ends``: the parent's ends of the workers started before (a forked one closes them)."""
    from multiprocessing.connection import Connection

    to_child_r, to_child_w, from_child_r, from_child_w = _channels(oob)
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


# The zygote. Forking a worker from a process that imported torch costs 2-5 ms (its page tables),
# and a pool's own threads may start only after its last fork: forked from the consumer one by one,
# 16 workers kept the first chunk waiting for all 16 forks. A zygote is forked once; it forks the
# workers one after the other and exits, while the consumer starts the pool's threads at once and
# each worker takes chunks as soon as it exists. This process is made the reaper of its orphans
# while a zygote runs (PR_SET_CHILD_SUBREAPER), so the workers become its own children when the
# zygote exits: they are reaped, waited for and killed as before, and none is left to a
# container's PID 1.

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_reaper_lock = threading.Lock()
_reaper_holds = 0  # zygotes running (a pool's start holds it until its zygote is reaped)
_reaper_was_set = False  # this process was a subreaper before: it stays one


def _prctl(option: int, arg: Any) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):  # no libc prctl (another OS, a static interpreter)
        return False


def _hold_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants while a zygote runs (the first
    hold sets it, the last release clears it, unless it was set before); False where it cannot be."""
    global _reaper_holds, _reaper_was_set
    import ctypes

    with _reaper_lock:
        if _reaper_holds == 0:
            flag = ctypes.c_int(0)
            if not _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag)):
                return False
            _reaper_was_set = bool(flag.value)
            if not _reaper_was_set and not _prctl(_PR_SET_CHILD_SUBREAPER, 1):
                return False
        _reaper_holds += 1
        return True


def _release_subreaper() -> None:
    global _reaper_holds
    with _reaper_lock:
        _reaper_holds -= 1
        if _reaper_holds == 0 and not _reaper_was_set:
            _prctl(_PR_SET_CHILD_SUBREAPER, 0)


def _forget_holds_after_fork() -> None:
    global _reaper_lock, _reaper_holds, _reaper_was_set
    _reaper_lock = threading.Lock()  # a child is not a subreaper, whatever its parent was
    _reaper_holds, _reaper_was_set = 0, False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_holds_after_fork)


def _zygote_main(children: list[tuple[int, int]], report: int, close: list[int]) -> None:
    """The body of a zygote; never returns. Forks a worker on each pair of ``children`` (its ends of
    the worker's two channels), writes each worker's pid on ``report`` (4 bytes), then exits. Where a
    fork fails, it writes 4 zero bytes and why, and exits: the workers not forked are reported dead."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the consumer decides what an interrupt stops
        for fd in close:  # the consumer's ends: EOF must reach each worker when the consumer dies
            os.close(fd)
        for k, (rfd, wfd) in enumerate(children):
            later = [fd for pair in children[k + 1:] for fd in pair]
            pid = os.fork()  # this process runs one thread: the fork is clean
            if pid == 0:
                _forked_worker_main(rfd, wfd, [report, *later])
            os.close(rfd)
            os.close(wfd)
            os.write(report, pid.to_bytes(4, "little"))
    except BaseException as e:  # noqa: BLE001 - reported to the consumer, which names the workers lost
        try:
            os.write(report, bytes(4) + repr(e).encode()[:4000])
        except BaseException:  # noqa: BLE001
            pass
        code = 1
    finally:
        os._exit(code)


class Zygote:
    """The process that forks a pool's workers (see above): :meth:`start` forks it, :meth:`watch`
    (a thread of the pool) records each worker's pid as it is reported, and once the zygote has
    exited (its workers then this process's children) reaps it and marks them adopted."""

    def __init__(self, pid: int, report: int, ours: list[int]) -> None:
        from multiprocessing.connection import Connection

        self.pid = pid
        #: the workers, in the order it forks them
        self.workers = [ForkedWorker(None, self) for _ in range(len(ours) // 2)]
        #: the consumer's ends of each worker's channels (``multiprocessing`` connections: to it, from it)
        self.ends = [(Connection(ours[2 * k], readable=False), Connection(ours[2 * k + 1], writable=False))
                     for k in range(len(self.workers))]
        self._report = report
        self._lock = threading.Lock()
        self._reaped = False

    @classmethod
    def start(cls, n: int, oob: bool) -> Zygote | None:
        """Fork the zygote of a pool of ``n`` workers, with their channels (a Unix socket from each
        when results pass memfds, ``oob``); ``None`` where it cannot be (the fork not clean, or this
        process cannot be a subreaper): the caller then starts its workers itself."""
        if not _hold_subreaper():
            return None
        ours: list[int] = []  # the consumer's ends
        theirs: list[tuple[int, int]] = []
        report_w = -1
        try:
            for _ in range(n):
                to_child_r, to_child_w, from_child_r, from_child_w = _channels(oob)
                ours += [to_child_w, from_child_r]
                theirs.append((to_child_r, from_child_w))
            report_r, report_w = os.pipe()
            pid = _fork_clean()
            if pid == 0:
                _zygote_main(theirs, report_w, [*ours, report_r])
        except BaseException:
            for fd in ours + [fd for pair in theirs for fd in pair] + ([report_r, report_w] if report_w >= 0 else []):
                os.close(fd)
            _release_subreaper()
            raise
        for fd in [report_w, *(fd for pair in theirs for fd in pair)]:
            os.close(fd)
        if pid is None:
            for fd in [*ours, report_r]:
                os.close(fd)
            _release_subreaper()
            return None
        return cls(pid, report_r, ours)

    def kill(self) -> None:
        """Kill the zygote: the last resort for one that hangs (a worker it forked and did not report
        yet would be left unreaped; the workers it reported are killed by their own pids)."""
        with self._lock:
            if not self._reaped:
                os.kill(self.pid, signal.SIGKILL)

    def watch(self, born: Callable[[int, ForkedWorker], None]) -> None:
        """Record each worker's pid as the zygote reports it (``born(k, worker)`` is called first,
        then ``worker.born`` set); once the zygote has exited, reap it and set every worker's
        ``adopted``. A worker the zygote did not report gets ``returncode`` -1 and ``error``, unless
        it says its pid (:meth:`ForkedWorker.announce`): killed between a fork and its report, the
        zygote leaves a worker running that only its hello makes known."""
        data = b""
        k = 0
        why = "the zygote that forks the pool's workers died"
        try:
            while k < len(self.workers):
                got = os.read(self._report, 4096)
                if not got:
                    break
                data += got
                while k < len(self.workers) and len(data) >= 4:
                    pid = int.from_bytes(data[:4], "little")
                    if pid == 0:
                        while got:  # the zygote's reason follows, up to its exit
                            got = os.read(self._report, 4096)
                            data += got
                        why = f"the zygote could not fork it: {data[4:].decode(errors='replace')}"
                        break
                    data = data[4:]
                    worker = self.workers[k]
                    worker.pid = pid
                    born(k, worker)
                    worker.born.set()
                    k += 1
                else:
                    continue
                break
        finally:
            os.close(self._report)
            try:  # wait for its exit without reaping it, so that kill never signals a reused pid
                os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                pass
            with self._lock:
                self._reaped = True
                try:
                    os.waitpid(self.pid, 0)
                except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler set to ignore)
                    pass
            _release_subreaper()
            for worker in self.workers[k:]:
                worker.lost(ChildProcessError(why))
            for worker in self.workers:
                worker.adopted.set()
