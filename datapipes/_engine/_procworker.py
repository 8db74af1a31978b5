"""The entry point of a process-executor worker.

Run as a script by path (``python .../_procworker.py RFD WFD``), never imported as part of the
``datapipes`` package in the worker, so a worker's start-up imports only the standard library and
cloudpickle, not torch (the parent imports this module too, for :func:`make_rng` and the protocol).

Protocol over two pipes (length-framed messages of ``multiprocessing.connection.Connection``):

1. parent -> worker, once: ``pickle`` of ``{"sys_path": [...]}``; worker -> parent: ``pickle`` of
   ``("hello", torch_imported, pid)`` (the pid tells the parent of a worker whose zygote died before
   reporting it);
2. parent -> worker, at the start of each pass that uses this worker (before its first chunk):
   ``pickle`` of ``("fn", sys_path, fn_payload, rng_kind)`` where ``fn_payload`` is the cloudpickle
   of ``fn``; worker -> parent: ``pickle`` of ``("fn", torch_imported)`` once ``fn`` is loaded;
3. parent -> worker, repeatedly: ``pickle`` of ``(chunk_id, items)``; worker -> parent:
   ``pickle`` of ``(chunk_id, seconds_in_fn, values, failures)``: ``values[j]`` is ``fn(items[j])``
   and ``failures`` maps the index of each item whose call raised to the exception (its value is
   ``None``), usually an empty dict;
4. parent -> worker: an empty message, or end of file: the worker exits.

Results without copies (docs/architecture.rst, "Process stages"): when the setup says ``"oob"``,
the worker -> parent channel is a Unix socket, and a result message whose pickle (protocol 5) has
buffers of ``OOB_MIN`` bytes or more (numpy arrays, and torch CPU tensors, which are pickled as the
arrays they share memory with) is sent as ``b"B"``, the count and ``(offset, size)`` of each such
buffer (``"<I"`` then ``"<QQ"`` each), then the pickle with those buffers left out; the buffers
themselves are written into one memfd that follows the message over the socket (``SCM_RIGHTS``).
The parent maps it and hands the arrays out as views of that mapping, which is unmapped when the
last of them is dropped. A descriptor in flight is owned by the socket, so nothing outlives the two
processes whatever stops them (no named shared memory to clean up). Without ``memfd_create`` or
descriptor passing (not Linux), or when the memfd cannot be written (memory full), the message
carries its buffers in band, as ever.

A worker outlives the pass that started it when its stage keeps a warm pool
(:mod:`datapipes._engine.process`): step 2 then comes again for the next pass, and each pass calls
the ``fn`` it sent (a fresh copy), never a previous pass's.

SIGINT is ignored in the worker: Ctrl-C reaches the parent, which stops its workers.
"""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import signal
import struct
import sys
import time
import traceback
from typing import Any, Callable

_PROTOCOL = pickle.HIGHEST_PROTOCOL
#: the smallest buffer that a result sends out of band (a smaller one is copied into the message)
OOB_MIN = 32 << 10
_ALIGN = 64  # each buffer's offset in the memfd, so that arrays of any dtype are aligned
#: whether this system can pass results' buffers in a memfd (Linux)
OOB_SUPPORTED = hasattr(os, "memfd_create") and sys.platform.startswith("linux")


def make_rng(kind: str, seed: int) -> Any:
    """A random generator of ``kind`` (``"python"``, ``"numpy"`` or ``"torch"``) seeded with ``seed``."""
    if kind == "python":
        import random

        return random.Random(seed)
    if kind == "numpy":
        import numpy

        return numpy.random.default_rng(seed)
    if kind == "torch":
        import torch

        return torch.Generator().manual_seed(seed)
    raise ValueError(f"unknown rng kind {kind!r}")


def seeded_call(fn: Callable[..., Any], kind: str) -> Callable[[Any], Any]:
    """``fn(x, rng=make_rng(kind, seed))`` for an item ``(x, seed)``."""

    def call(pair: Any) -> Any:
        return fn(pair[0], rng=make_rng(kind, pair[1]))

    return call


def dumps(obj: Any) -> bytes:
    """pickle, falling back to cloudpickle for lambdas and local classes."""
    try:
        return pickle.dumps(obj, _PROTOCOL)
    except Exception:  # noqa: BLE001 - retry with cloudpickle, which raises its own clear error
        import cloudpickle

        return cloudpickle.dumps(obj, _PROTOCOL)


def _cloud_dumps(obj: Any) -> bytes:
    # cloudpickle, not pickle, for exceptions: pickle imports the module of a class it saves by
    # reference (e.g. a test module, and with it torch); cloudpickle looks only at sys.modules.
    import cloudpickle

    return cloudpickle.dumps(obj, _PROTOCOL)


def portable(exc: BaseException) -> BaseException:
    """``exc`` with the worker's traceback as a note, or a stand-in when it cannot travel."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        exc.add_note(f"[datapipes] traceback in worker process {os.getpid()}:\n{text.rstrip()}")
        pickle.loads(_cloud_dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - the exception does not pickle: send what it said
        stand_in = RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
        stand_in.add_note(f"[datapipes] the original exception could not be pickled; traceback in worker "
                          f"process {os.getpid()}:\n{text.rstrip()}")
        return stand_in


def _reduce_tensor(t: Any) -> Any:
    """Pickle a torch CPU tensor as ``torch.from_numpy`` of the array sharing its memory, so that
    its data is a protocol-5 buffer (torch's own pickling copies it into the message)."""
    import torch

    if (t.device.type == "cpu" and t.layout == torch.strided and not t.requires_grad and type(t) is torch.Tensor
            and not t.is_conj() and not t.is_neg()):
        try:
            return torch.from_numpy, (t.contiguous().numpy(),)
        except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16, ...)
            pass
    return t.__reduce_ex__(_PROTOCOL)


def _dumps_out_of_band(obj: Any) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """``obj`` pickled with its buffers of ``OOB_MIN`` bytes or more left out (returned apart)."""
    big: list[pickle.PickleBuffer] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes < OOB_MIN:
            return True  # in band
        big.append(buf)
        return False

    out = io.BytesIO()
    pickler = pickle.Pickler(out, _PROTOCOL, buffer_callback=keep)
    torch = sys.modules.get("torch")
    if torch is not None:
        table = copyreg.dispatch_table.copy()
        table[torch.Tensor] = _reduce_tensor
        pickler.dispatch_table = table
    pickler.dump(obj)
    return out.getvalue(), big


def _to_memfd(buffers: list[pickle.PickleBuffer]) -> tuple[int, bytes]:
    """A memfd holding ``buffers`` one after the other (aligned), and the header that places them."""
    spans = []
    offset = 0
    for buf in buffers:
        size = buf.raw().nbytes
        spans.append((offset, size))
        offset += (size + _ALIGN - 1) // _ALIGN * _ALIGN
    fd = os.memfd_create("datapipes-result", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, offset)
        for buf, (at, size) in zip(buffers, spans):
            raw = buf.raw()
            done = 0
            while done < size:
                done += os.pwrite(fd, raw[done:], at + done)
    except BaseException:
        os.close(fd)
        raise
    header = b"B" + struct.pack("<I", len(spans)) + b"".join(struct.pack("<QQ", at, size) for at, size in spans)
    return fd, header


def load_out_of_band(message: bytes, fd: int) -> tuple[Any, int]:
    """The parent's side of a ``b"B"`` message: the object, its arrays viewing a mapping of ``fd``
    (closed here; the mapping lives as long as the arrays), and the bytes of the mapping."""
    import mmap

    try:
        (count,) = struct.unpack_from("<I", message, 1)
        spans = [struct.unpack_from("<QQ", message, 5 + 16 * k) for k in range(count)]
        size = max(at + n for at, n in spans)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        try:
            mapped: Any = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:  # out of mappings (vm.max_map_count) or address space: copy the buffers instead
            mapped = bytearray(size)
            done = 0
            while done < size:
                got = os.preadv(fd, [memoryview(mapped)[done:]], done)
                if got == 0:
                    raise EOFError("a result's memfd ended early") from None
                done += got
    finally:
        os.close(fd)
    view = memoryview(mapped)
    return pickle.loads(memoryview(message)[5 + 16 * count:], buffers=[view[at:at + n] for at, n in spans]), size


def _results_payload(chunk_id: int, seconds: float, values: list[Any], failures: dict[int, BaseException],
                     oob: bool = False) -> tuple[bytes, int | None]:
    """The message of a chunk's results, and the memfd holding its large buffers (or ``None``)."""
    if oob and not failures:
        try:
            data, big = _dumps_out_of_band((chunk_id, seconds, values, failures))
        except Exception:  # noqa: BLE001 - what pickle cannot take goes the general way below
            pass
        else:
            if not big:
                return data, None
            try:
                fd, header = _to_memfd(big)
            except OSError:  # memory full, or memfds refused: the buffers go in band
                return dumps((chunk_id, seconds, values, failures)), None
            return header + data, fd
    return _results_bytes(chunk_id, seconds, values, failures), None


def _results_bytes(chunk_id: int, seconds: float, values: list[Any], failures: dict[int, BaseException]) -> bytes:
    try:
        return _cloud_dumps((chunk_id, seconds, values, failures)) if failures else dumps((chunk_id, seconds, values, failures))
    except Exception:  # noqa: BLE001 - find the results that do not pickle and fail only those
        for j, value in enumerate(values):
            if j in failures:
                continue
            try:
                dumps(value)
            except Exception as e:  # noqa: BLE001
                values[j] = None
                failures[j] = TypeError(f"the result of fn cannot be pickled to return from the worker process: {e}")
        return _cloud_dumps((chunk_id, seconds, values, failures))


def run_chunk(fn: Callable[[Any], Any], items: list[Any]) -> tuple[list[Any], dict[int, BaseException]]:
    """``fn`` on each item: the values, and the exceptions of the calls that raised by index.

    The loop runs without a ``try`` per item (a chunk's calls rarely fail): a failure ends the loop,
    is recorded, and the loop resumes after the failed item.
    """
    values: list[Any] = []
    failures: dict[int, BaseException] = {}
    append = values.append
    start = 0
    while start < len(items):
        try:
            for x in items[start:] if start else items:
                append(fn(x))
            break
        except BaseException as e:  # noqa: BLE001 - reported to the parent with the item
            failures[len(values)] = portable(e)
            append(None)
            start = len(values)
    return values, failures


def _load_fn(spec: Any) -> Callable[[Any], Any]:
    """The ``fn`` of a pass from its ``("fn", sys_path, fn_payload, rng_kind)`` message."""
    _, sys_path, fn_payload, rng_kind = spec
    sys.path[:] = sys_path
    fn = pickle.loads(fn_payload)
    if rng_kind is not None:
        fn = seeded_call(fn, rng_kind)
    return fn  # type: ignore[no-any-return]


def main(rfd: int, wfd: int) -> None:
    from multiprocessing.connection import Connection

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rx = Connection(rfd, writable=False)
    tx = Connection(wfd, readable=False)
    try:
        setup = pickle.loads(rx.recv_bytes())
    except (EOFError, OSError):  # the pool was closed while starting (a later worker failed to start)
        return
    sys.path[:] = setup["sys_path"]
    sock = None
    if setup.get("oob"):
        import socket

        sock = socket.socket(fileno=os.dup(wfd))
    tx.send_bytes(pickle.dumps(("hello", "torch" in sys.modules, os.getpid())))
    fn: Callable[[Any], Any] | None = None
    clock = time.perf_counter
    while True:
        try:
            msg = rx.recv_bytes()
        except (EOFError, OSError):
            return
        if not msg:
            return
        obj = pickle.loads(msg)
        msg = None  # type: ignore[assignment]
        if type(obj[0]) is str:  # ("fn", ...): a new pass; its fn replaces the previous pass's
            fn = None
            fn = _load_fn(obj)
            obj = None
            tx.send_bytes(pickle.dumps(("fn", "torch" in sys.modules)))
            continue
        chunk_id, items = obj
        obj = None
        if fn is None:  # pragma: no cover - the parent always sends a pass's fn before its chunks
            raise RuntimeError("datapipes worker: a chunk arrived before the pass's fn")
        t = clock()
        values, failures = run_chunk(fn, items)
        seconds = clock() - t
        items = None  # type: ignore[assignment]
        message, fd = _results_payload(chunk_id, seconds, values, failures, sock is not None)
        values = failures = None  # type: ignore[assignment]
        tx.send_bytes(message)
        if fd is not None and sock is not None:
            import socket

            try:
                socket.send_fds(sock, [b"F"], [fd])
            finally:
                os.close(fd)
        message = None  # type: ignore[assignment]


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
