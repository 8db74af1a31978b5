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
batch's storage cannot be shared this way, the batch travels through torch's queue as it is.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import sys
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Channel", "Exported", "close_senders", "enabled", "export", "imported", "send"]

#: seconds the main process waits for a message or a worker's connection that must already be there
WAIT = 60.0
#: the most descriptors one message carries (a batch with more storages goes through torch's queue)
MAX_FDS = 250


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
    (the descriptors are closed here; the storages keep the memory)."""
    try:
        storages = [torch.UntypedStorage._new_shared_fd_cpu(fd, size)  # type: ignore[attr-defined]
                    for fd, size in zip(fds, exported.sizes)]
    finally:
        for fd in fds:
            os.close(fd)

    def leaf(t: Any) -> Any:
        if type(t) is not _Tensor:
            return t
        return torch.empty((0,), dtype=t.dtype).set_(storages[t.index], t.offset, t.shape, t.stride)

    return _walk(exported.tree, leaf)


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
