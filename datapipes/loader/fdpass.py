"""Batches from DataLoader worker processes with one message per batch instead of one connection
per tensor (docs/architecture.rst, "The loader").

A batch ``collate`` builds in a worker already lives in shared memory (a file descriptor's
segment, torch's default sharing strategy). torch's worker queue hands each of its storages to the
main process through a connection of its own to a listener thread in the worker
(``multiprocessing.reduction.DupFd``: connect, authenticate, receive the descriptor), while that
worker is busy with the next batch. Here the worker sends all the descriptors of a batch at once,
over a Unix socket it keeps open to the main process (``SCM_RIGHTS``), and the record on torch's
queue carries only the tensors' shapes and the message's sequence number (:class:`Exported`).

Per worker, messages and records keep their order; a record finds its message by sequence
number, so messages whose records torch dropped (a pass ended early, persistent workers starting
the next one) are closed, not mistaken for the next batch's. A descriptor in flight belongs to the
socket: closing the channel (or a process ending) frees it, so nothing leaks whatever stops the
pass. Where this cannot run (not Linux, another sharing strategy, ``DATAPIPES_WORKER_FDS=0``) or a
batch's storage cannot be shared this way, the batch travels through torch's queue as it is. Every
storage received keeps a descriptor open while it lives; at the open-file limit the loader raises
torch's ``RuntimeError`` with its advice (``ulimit -n``, or the ``file_system`` sharing strategy).
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import struct
import sys
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Channel", "Exported", "close_senders", "enabled", "export", "fd_limit_reached", "imported", "send",
           "too_many_open_files"]

#: seconds the main process waits for a message or a worker's connection that must already be there
WAIT = 60.0
#: the most descriptors one message carries (a batch with more storages goes through torch's queue)
MAX_FDS = 250
#: descriptors this process must still be able to open when a batch cannot be mapped, or else the
#: open-file limit is to blame (torch's loader checks the same margin)
FD_MARGIN = 10

#: torch's DataLoader's words at the open-file limit (kept whole, so code that matches them still does)
TOO_MANY_OPEN_FILES = ("Too many open files. Communication with the workers is no longer possible. Please increase the "
                       "limit using `ulimit -n` in the shell or change the sharing strategy by calling "
                       "`torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of your code")


def enabled() -> bool:
    """Whether DataLoader workers send their batches' descriptors over a channel of their own."""
    if os.environ.get("DATAPIPES_WORKER_FDS", "1") == "0":
        return False
    if not sys.platform.startswith("linux") or not hasattr(socket, "send_fds"):
        return False
    import torch.multiprocessing

    strategy = torch.multiprocessing.get_sharing_strategy()  # type: ignore[no-untyped-call]
    return bool(strategy == "file_descriptor")


@dataclass(frozen=True)
class _Tensor:
    """Where a tensor of an exported batch lives: storage ``index`` of its message, and its view."""

    index: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class Exported:
    """A worker's batch whose tensors' storages travel as descriptors: the batch with each tensor
    replaced by a :class:`_Tensor`, the sizes of the storages, and the message's number."""

    tree: Any
    sizes: tuple[int, ...]
    seq: int


def _walk(x: Any, leaf: Any) -> Any:
    """``x`` with ``leaf(tensor)`` in place of each tensor inside lists, tuples (named too) and dicts."""
    kind = type(x)
    if kind is torch.Tensor or kind is _Tensor:
        return leaf(x)
    if kind is list:
        return [_walk(v, leaf) for v in x]
    if kind is dict:
        return {k: _walk(v, leaf) for k, v in x.items()}
    if kind is tuple:
        return tuple(_walk(v, leaf) for v in x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return kind(*(_walk(v, leaf) for v in x))
    return x


def export(item: Any) -> tuple[Any, list[int], list[int]]:
    """``(item with its CPU tensors replaced, their storages' descriptors, their sizes)``: a tensor
    whose storage is not in shared memory is moved there first (as torch's queue would). Tensors
    that cannot travel so (a subclass, requiring grad, an empty storage) stay in the item."""
    fds: list[int] = []
    sizes: list[int] = []
    index: dict[int, int] = {}

    def leaf(t: Any) -> Any:
        if (t.device.type != "cpu" or t.layout != torch.strided or t.requires_grad or t.is_conj()
                or t.is_neg()):
            return t
        storage = t.untyped_storage()
        if storage.nbytes() == 0:
            return t
        if not storage.is_shared():
            storage.share_memory_()  # moves its data, so the views after it see the new address
        key = storage.data_ptr()
        at = index.get(key)
        if at is None:
            if len(fds) >= MAX_FDS:
                return t
            fd, size = storage._share_fd_cpu_()
            at = index[key] = len(fds)
            fds.append(fd)
            sizes.append(size)
        return _Tensor(at, t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())

    return _walk(item, leaf), fds, sizes


def imported(exported: Exported, fds: list[int]) -> Any:
    """The batch of ``exported``, its tensors viewing the storages the descriptors ``fds`` hold
    (the descriptors are closed here; each storage keeps a copy of its own: torch's
    ``file_descriptor`` sharing strategy). At the open-file limit, torch's ``RuntimeError``
    (:func:`too_many_open_files`)."""
    try:
        storages = [torch.UntypedStorage._new_shared_fd_cpu(fd, size)  # type: ignore[attr-defined]
                    for fd, size in zip(fds, exported.sizes)]
    except RuntimeError as e:  # torch's "could not duplicate a shared memory file descriptor", say
        if fd_limit_reached():
            raise too_many_open_files(f"a worker's batch arrived with the descriptors of its {len(fds)} tensor "
                                      f"storage(s), and mapping them failed ({e})") from e
        raise
    finally:
        for fd in fds:
            os.close(fd)

    def leaf(t: Any) -> Any:
        if type(t) is not _Tensor:
            return t
        return torch.empty((0,), dtype=t.dtype).set_(storages[t.index], t.offset, t.shape, t.stride)

    return _walk(exported.tree, leaf)


def fd_limit_reached() -> bool:
    """Whether this process cannot open :data:`FD_MARGIN` more descriptors."""
    opened: list[int] = []
    try:
        for _ in range(FD_MARGIN):
            opened.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as e:
        return e.errno == errno.EMFILE
    finally:
        for fd in opened:
            os.close(fd)
    return False


def too_many_open_files(detail: str) -> RuntimeError:
    """torch's ``RuntimeError`` at the open-file limit (:data:`TOO_MANY_OPEN_FILES`), then what
    happened and why: every storage received from a worker keeps a descriptor open while it lives."""
    import resource  # POSIX only, as this module's channel

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return RuntimeError(f"{TOO_MANY_OPEN_FILES} (DataLoader: {detail}; this process may have {soft} files open "
                        f"(RLIMIT_NOFILE), and each tensor storage received from a worker keeps one descriptor "
                        f"open while it lives, so batches kept add up)")


# -- the worker's side ----------------------------------------------------------------------------

#: (address, pid) -> [the connected socket, the last sequence number sent]
_SENDERS: dict[tuple[str, int], list[Any]] = {}


def send(address: str, worker: int, item: Any) -> Any:
    """``item`` as the record sends it: an :class:`Exported` whose descriptors went over the
    channel at ``address``, or ``item`` itself where none (or the channel) could take it."""
    try:
        tree, fds, sizes = export(item)
    except Exception:  # noqa: BLE001 - a storage that cannot be shared so: torch's queue takes it
        return item
    if not fds:
        return item
    key = (address, os.getpid())
    sender = _SENDERS.get(key)
    conn = None if sender is None else sender[0]
    try:
        if sender is None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            conn.connect(address)
            conn.sendall(struct.pack("<q", worker))
            sender = _SENDERS[key] = [conn, 0]
        sender[1] += 1
        socket.send_fds(sender[0], [struct.pack("<Q", sender[1])], fds)
    except OSError:  # the loader has gone (closed, or its process ended): nothing will read the record
        _SENDERS.pop(key, None)
        if conn is not None:
            conn.close()
        return item
    return Exported(tree, tuple(sizes), sender[1])


def close_senders() -> None:
    """Close this process's ends of the channels it has sent to. A worker keeps its end for its
    whole life (persistent workers serve several passes on one connection, numbered on)."""
    while _SENDERS:
        _, (conn, _) = _SENDERS.popitem()
        conn.close()


# -- the main process's side ----------------------------------------------------------------------


def _own_peer(conn: socket.socket) -> bool:
    """Whether the process at the other end of ``conn`` runs as this one's user. An abstract
    address has no file and so no permissions: any process that reads it (``/proc/net/unix`` lists
    them) can connect, and one of another user must not hand this loader batches. A process of the
    same user could read this one's memory anyway."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return False
    _, uid, _ = struct.unpack("3i", creds)
    return bool(uid == os.geteuid())


class Channel:
    """The main process's end: a listening Unix socket (an abstract address, nothing on disk) that
    each worker connects to once, and the connections, by worker id."""

    def __init__(self) -> None:
        self.address = f"\0datapipes-loader-{os.getpid()}-{secrets.token_hex(8)}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._listener.bind(self.address)
        self._listener.listen(256)
        self._listener.settimeout(WAIT)
        self._conns: dict[int, socket.socket] = {}

    def receive(self, worker: int, exported: Exported) -> Any:
        """The batch of ``exported``, a record of worker ``worker``: its message read (those before
        it, whose records were dropped, are closed)."""
        conn = self._conn(worker)
        while True:
            try:
                data, fds, flags, _ = socket.recv_fds(conn, 8, MAX_FDS)
            except TimeoutError:
                raise RuntimeError(f"DataLoader: worker {worker}'s batch {exported.seq} did not arrive within "
                                   f"{WAIT:.0f} s on its descriptor channel") from None
            if len(data) != 8:
                for fd in fds:
                    os.close(fd)
                raise RuntimeError(f"DataLoader: worker {worker}'s descriptor channel closed before its batch "
                                   f"{exported.seq} arrived")
            (seq,) = struct.unpack("<Q", data)
            if seq < exported.seq:  # its record was dropped: free its memory
                for fd in fds:
                    os.close(fd)
                continue
            if flags & socket.MSG_CTRUNC and fd_limit_reached():  # the kernel dropped what it could not install
                for fd in fds:
                    os.close(fd)
                raise too_many_open_files(f"worker {worker}'s batch {exported.seq} arrived without the "
                                          f"descriptors of its {len(exported.sizes)} storages")
            if seq != exported.seq or len(fds) != len(exported.sizes) or flags & socket.MSG_CTRUNC:
                for fd in fds:
                    os.close(fd)
                raise RuntimeError(f"DataLoader: worker {worker}'s descriptor channel is out of step (batch {seq} "
                                   f"with {len(fds)} descriptors, expected batch {exported.seq} with "
                                   f"{len(exported.sizes)})")
            return imported(exported, fds)

    def _conn(self, worker: int) -> socket.socket:
        """The connection of ``worker``, accepting those that have connected until it is found (a
        worker connects before it sends its first record, so its connection is waiting)."""
        while worker not in self._conns:
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                raise RuntimeError(f"DataLoader: worker {worker} did not connect its descriptor channel within "
                                   f"{WAIT:.0f} s") from None
            except OSError as e:
                if e.errno == errno.EMFILE:
                    raise too_many_open_files(f"worker {worker}'s descriptor channel could not be accepted "
                                              f"({e})") from e
                raise
            if not _own_peer(conn):  # an abstract address is open to every process of the host
                conn.close()
                continue
            conn.settimeout(WAIT)
            hello = conn.recv(8)
            if len(hello) != 8:
                conn.close()
                continue
            (who,) = struct.unpack("<q", hello)
            old = self._conns.pop(who, None)
            if old is not None:
                old.close()
            self._conns[who] = conn
        return self._conns[worker]

    def close(self) -> None:
        """Close the listener and every connection; descriptors still in flight are freed."""
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        self._listener.close()

    def __del__(self) -> None:
        # a loader dropped without close(): its persistent workers' channel goes with it
        if hasattr(self, "_listener"):
            self.close()
