"""Helpers shared by test modules in several folders, imported explicitly (``from helpers import
...``: tests/ is on ``sys.path`` through tests/conftest.py): a custom exception and a function that
raises it at one item, the live children of this process, the ``plain_process`` fixture, a
user-written source with the checkpoint protocol and a stateless stage written elsewhere, and what
the "a failing pass releases its source" tests share (the ``gc_off`` fixture, a source that
records its close, a pass run to its error), and ``import_or_skip`` for the test packages that a
free-threaded interpreter cannot install."""

import gc
import glob
import inspect
import io
import os
import pickle
import struct
import sysconfig
import tarfile
import zipfile

import pytest
import torch
from PIL import Image

from datapipes import IterDataPipe
from datapipes._runtime import worker as _worker


FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))

# The test packages with no free-threaded build (requirements-test-gil.txt), and why: on the
# free-threaded leg of CI the tests that need them skip with this reason, and run on every other leg.
NO_FREE_THREADED_BUILD = {
    "ray": "Ray publishes no free-threaded (cp313t) wheel",
    "moto": "moto needs cryptography, which publishes no free-threaded (cp313t) wheel and whose source "
            "build needs Rust crates from a registry CI cannot reach",
    "flask": "flask only serves moto here, which cannot be installed free-threaded",
    "flask_cors": "flask-cors only serves moto here, which cannot be installed free-threaded",
}


#: torch's DataLoader takes ``in_order`` (torch 2.6+; the oldest torch CI runs, 2.5.1, has none)
TORCH_IN_ORDER = "in_order" in inspect.signature(torch.utils.data.DataLoader.__init__).parameters
needs_torch_in_order = pytest.mark.skipif(not TORCH_IN_ORDER, reason="torch's DataLoader has in_order from 2.6")


def import_or_skip(name, reason):
    """``pytest.importorskip(name, reason=reason)``; on a free-threaded interpreter, a package of
    ``NO_FREE_THREADED_BUILD`` skips with the reason it cannot be installed there."""
    top = name.partition(".")[0]
    if FREE_THREADED and top in NO_FREE_THREADED_BUILD:
        reason = f"{top} is not installed on free-threaded CPython: {NO_FREE_THREADED_BUILD[top]}"
    return pytest.importorskip(name, reason=reason)


class Boom(Exception):
    def __init__(self, code, detail):
        super().__init__(code, detail)
        self.code = code


def fail_at(k):
    def fn(x):
        if x == k:
            raise Boom(k, "custom")
        return x

    return fn


def square(x):
    return x * x


def fails_on_7(x):
    """``x``, but ``KeyError('item-7')`` for 7: an executor stage's failure at a known position."""
    if x == 7:
        raise KeyError(f"item-{x}")
    return x


def child_pids():
    """Pids of this process's live children (from /proc: every thread's children list)."""
    pids = set()
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        try:
            with open(path) as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            pass
    return pids


@pytest.fixture(autouse=True)
def plain_process(monkeypatch):
    """No distributed rank from the environment, and the once-per-process warning not yet given
    (autouse in the modules that import it)."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(_worker, "_checked", False)


# -- a source written elsewhere, with the checkpoint protocol ---------------------------------------


class StatefulCursor:
    """An iterator over a sequence with the two-method checkpoint protocol (``state_dict()`` and
    ``load_state_dict(state)``), as a stage written elsewhere gives its iterator."""

    def __init__(self, items):
        self.items, self.i = items, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= len(self.items):
            raise StopIteration
        self.i += 1
        return self.items[self.i - 1]

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]


class StatefulSource(IterDataPipe):
    """A user-written source whose iterator (a :class:`StatefulCursor`) keeps its own state.

    ``StatefulSource(n, start=0)`` yields ``start, ..., start + n - 1`` and has a ``len``;
    ``StatefulSource(make)`` yields the list ``make()`` returns, made anew at each pass (fresh
    in-memory streams), and has none.
    """

    def __init__(self, items, start=0):
        self.items, self.start = items, start

    def __iter__(self):
        if callable(self.items):
            return StatefulCursor(self.items())
        return StatefulCursor(range(self.start, self.start + self.items))

    def __len__(self):
        if callable(self.items):
            raise TypeError("StatefulSource(make) has no len()")
        return self.items


class PlusOne(IterDataPipe):
    """A stage written elsewhere that keeps no state (a generator adding 1 to each item), and says
    so: it creates its source's iterator at its first ``next()``."""

    stateless = True  # its position is its source's

    def __init__(self, dp):
        self.dp = dp

    def __iter__(self):
        for x in self.dp:
            yield x + 1


# -- a failing pass releases its source ------------------------------------------------------------


@pytest.fixture
def gc_off():
    """The cyclic GC off for the test (after a collection; on again, and run, after it): what a
    failing pass holds is then released by reference counting alone, or not at all."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


class Guarded:
    """A re-iterable source over ``items`` that records whether each pass's generator was closed
    (``closed``: one ``True`` per closed pass)."""

    def __init__(self, items):
        self.items = items
        self.closed = []

    def __iter__(self):
        try:
            yield from self.items
        finally:
            self.closed.append(True)


def error_of_pass(pipe, error, match=None, each=None):
    """Run a pass of ``pipe`` until it raises ``error`` (whose message matches ``match``; pytest
    fails the test otherwise) and return that exception, for the caller to hold as a consumer
    does, and with it its traceback and the stages' frames. ``each`` is called on each item."""
    with pytest.raises(error, match=match) as info:
        for x in pipe:
            if each is not None:
                each(x)
    return info.value


def run_ranks(fn, args, nprocs, seconds=120):
    """Run ``fn(rank, *args)`` in ``nprocs`` spawned processes (distributed ranks); fail, killing
    them, when they have not all finished in ``seconds``."""
    import time

    import torch.multiprocessing as tmp

    ctx = tmp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    try:
        deadline = time.monotonic() + seconds
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline, f"the ranks did not finish in {seconds} s"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join(5)


# -- file contents built in memory (archives, images, TFRecord) -------------------------------------


class NonSeekable(io.RawIOBase):
    """A binary stream that can only be read forward and has no size (an HTTP response, a pipe)."""

    def __init__(self, data):
        self._buf = io.BytesIO(data)

    def readable(self):
        return True

    def readinto(self, b):
        return self._buf.readinto(b)


def make_tar(members, mode="w"):
    """A tar archive (``mode``: "w", "w:gz", ...) of ``(name, bytes)`` members (``None`` for a
    directory), as bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_zip(members, compression=zipfile.ZIP_DEFLATED):
    """A zip archive of ``(name, bytes)`` members, as bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, data in members:
            zf.writestr(name, data)
    return buf.getvalue()


def png(color, size=(4, 3)):
    """A one-colour RGB PNG, as bytes."""
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def crc32c(data):
    """CRC-32C bit by bit (independent of the table the package uses)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def masked(data):
    """TFRecord's masked CRC-32C of ``data``."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(n):
    """A protobuf varint (negative int64s: two's complement, 10 bytes)."""
    n &= (1 << 64) - 1
    out = b""
    while n > 0x7F:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def ld(number, payload):
    """A protobuf length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def tfrecord(*records):
    """TFRecord framing of ``records`` (bytes each), with their lengths and masked CRCs."""
    out = b""
    for data in records:
        length = struct.pack("<Q", len(data))
        out += length + struct.pack("<I", masked(length)) + data + struct.pack("<I", masked(data))
    return out


def saved_after(it, k):
    """The first ``k`` items of pass ``it`` and its state then (through pickle); ``it`` is closed."""
    head = [next(it) for _ in range(k)]
    state = pickle.loads(pickle.dumps(it.state_dict()))
    it.close()
    return head, state


def resumed(pipe, state):
    """A new pass of ``pipe`` resumed from ``state``."""
    it = iter(pipe)
    it.load_state_dict(state)
    return it


def is_plain(x):
    """Whether a state is plain data only (str-keyed dicts, lists, tuples, str, int, float, bool, None):
    what ``torch.load(weights_only=True)`` and JSON take, and nothing to unpickle."""
    if isinstance(x, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return all(map(is_plain, x))
    return x is None or type(x) in (str, int, float, bool)
