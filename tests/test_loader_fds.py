"""DataLoader workers send their batches' descriptors over a channel of their own
(``datapipes.loader.fdpass``): the batches are what torch's queue gives, nothing leaks whatever ends
the pass, and a channel out of step or silent raises instead of hanging or mixing batches."""

from __future__ import annotations

import collections
import gc
import os
import subprocess
import sys
import time

import pytest
import torch

import datapipes
from datapipes.iter import IterableWrapper
from datapipes.loader import fdpass
from helpers import FREE_THREADED

pytestmark = pytest.mark.skipif(not fdpass.enabled(), reason="descriptor passing needs Linux and torch's "
                                                               "file_descriptor sharing strategy")

Pair = collections.namedtuple("Pair", "image label")


def sample(i):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) + i
    return {"image": base, "view": base[1:, ::2], "pair": Pair(torch.full((2,), i), i), "name": f"n{i}",
            "empty": torch.zeros(0), "flag": torch.tensor(i % 2 == 0)}


def pipe(n=24):
    return IterableWrapper(range(n)).sharding_filter().map(sample)


def _connected(channel):
    """Whether a connection waits on ``channel``'s listener (without taking it)."""
    import select

    return bool(select.select([channel._listener], [], [], 0)[0])


def open_fds():
    gc.collect()
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor
            pass
    return sorted(found)


def left_open(before, grace=5.0):
    """The descriptors open now that were not open at ``before`` (each counted: two ends of one pipe
    are two). One closed meanwhile is not this test's: an earlier test's object may be freed while
    this one runs. On free-threaded CPython an object is freed by the thread that made it (biased
    reference counting: a batch received on one of the loader's threads, dropped on this one, is
    freed as that thread next runs or ends), so there the descriptors get ``grace`` seconds to go."""
    deadline = time.monotonic() + (grace if FREE_THREADED else 0.0)
    while True:
        left = sorted((collections.Counter(open_fds()) - collections.Counter(before)).elements())
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def batches(monkeypatch, on, **kwargs):
    monkeypatch.setenv("DATAPIPES_WORKER_FDS", "1" if on else "0")
    return list(datapipes.DataLoader(pipe(), batch_size=4, num_workers=2, **kwargs))


class TestLoader:
    def test_the_batches_are_those_torchs_queue_gives(self, monkeypatch):
        through_channel = batches(monkeypatch, True)
        through_queue = batches(monkeypatch, False)
        assert len(through_channel) == 6
        assert same(through_channel, through_queue)
        first = through_channel[0]
        assert isinstance(first["pair"], Pair) and first["image"].is_shared()

    def test_the_channel_carries_them(self, monkeypatch):
        received = []
        real = fdpass.Channel.receive

        def spy(self, worker, exported):
            received.append(worker)
            return real(self, worker, exported)

        monkeypatch.setattr(fdpass.Channel, "receive", spy)
        batches(monkeypatch, True)
        assert sorted(received) == [0, 0, 0, 1, 1, 1]
        received.clear()
        batches(monkeypatch, False)
        assert received == []

    def test_persistent_workers_skip_the_messages_of_a_pass_ended_early(self, monkeypatch):
        monkeypatch.setenv("DATAPIPES_WORKER_FDS", "1")
        loader = datapipes.DataLoader(pipe(), batch_size=4, num_workers=2, persistent_workers=True)
        try:
            full = list(loader)
            for stop in (1, 3, 0):
                for i, batch in enumerate(loader):
                    assert same(batch, full[i])
                    if i == stop:
                        break
            assert same(list(loader), full)
        finally:
            loader.close()

    def test_no_descriptor_is_left_open(self, monkeypatch):
        monkeypatch.setenv("DATAPIPES_WORKER_FDS", "1")

        def passes():
            kept = batches(monkeypatch, True)
            del kept
            for batch in datapipes.DataLoader(pipe(), batch_size=4, num_workers=2):
                break
            del batch  # its storages keep their segments' descriptors, as torch's do
            loader = datapipes.DataLoader(pipe(), batch_size=4, num_workers=2, persistent_workers=True)
            next(iter(loader))
            loader.close()

        passes()  # what torch keeps once made (its epoch's shared memory for persistent workers, ...)
        before = open_fds()
        for _ in range(3):
            passes()
        assert left_open(before) == []

    def test_a_worker_that_dies_raises_and_leaves_nothing_open(self, monkeypatch):
        monkeypatch.setenv("DATAPIPES_WORKER_FDS", "1")

        def die_at_9(x):
            if x == 9:
                os._exit(3)
            return sample(x)

        batches(monkeypatch, True)
        before = open_fds()
        loader = datapipes.DataLoader(IterableWrapper(range(24)).sharding_filter().map(die_at_9), batch_size=2,
                                      num_workers=2)
        with pytest.raises(RuntimeError, match="exited unexpectedly"):
            list(loader)
        assert left_open(before) == []


class TestChannel:
    """Both ends in this process: the main process can send to its own channel."""

    def batch(self, i=0):
        return torch.utils.data.default_collate([sample(i), sample(i + 1)])

    def test_export_and_import_keep_the_batch_and_share_its_memory(self):
        batch = self.batch()
        tree, fds, sizes = fdpass.export(batch)
        assert len(fds) == 5  # image, view, the pair's tensor and label, flag; the empty one stays
        back = fdpass.imported(fdpass.Exported(tree, tuple(sizes), 1), [os.dup(fd) for fd in fds])
        assert same(back, batch)
        back["image"][0, 0, 0] = -1.0
        assert batch["image"][0, 0, 0] == -1.0

    def test_views_of_one_storage_travel_once_and_stay_views(self):
        base = torch.arange(12.0).reshape(3, 4)
        batch = [base, base[1:, ::2], base.t()]
        tree, fds, sizes = fdpass.export(batch)
        assert len(fds) == 1 and base.is_shared()  # moved to shared memory, as torch's queue would
        back = fdpass.imported(fdpass.Exported(tree, tuple(sizes), 1), [os.dup(fd) for fd in fds])
        assert same(back, batch) and back[1].stride() == (4, 2) and back[2].stride() == (1, 4)
        assert len({t.untyped_storage().data_ptr() for t in back}) == 1

    def test_a_message_whose_record_was_dropped_is_closed_not_taken(self):
        channel = fdpass.Channel()
        try:
            before = open_fds()
            dropped = fdpass.send(channel.address, 0, self.batch(0))
            kept = fdpass.send(channel.address, 0, self.batch(5))
            assert isinstance(dropped, fdpass.Exported) and kept.seq == dropped.seq + 1
            assert same(channel.receive(0, kept), self.batch(5))
        finally:
            channel.close()
            fdpass.close_senders()
        assert len(open_fds()) <= len(before)

    def test_a_message_that_never_comes_raises(self, monkeypatch):
        monkeypatch.setattr(fdpass, "WAIT", 0.2)
        channel = fdpass.Channel()
        try:
            sent = fdpass.send(channel.address, 0, self.batch())
            late = fdpass.Exported(sent.tree, sent.sizes, sent.seq + 1)
            channel.receive(0, sent)
            channel._conns[0].settimeout(0.2)
            with pytest.raises(RuntimeError, match="did not arrive within"):
                channel.receive(0, late)
            with pytest.raises(RuntimeError, match="worker 1 did not connect"):
                channel.receive(1, sent)
        finally:
            channel.close()
            fdpass.close_senders()

    @pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user takes root")
    def test_a_process_of_another_user_is_not_taken_for_a_worker(self, monkeypatch):
        """The channel's address is abstract (no file, no permissions) and listed in
        /proc/net/unix: a process of another user that connects and claims to be worker 0 is
        refused, and the real worker 0's batch is received."""
        monkeypatch.setattr(fdpass, "WAIT", 0.5)
        channel = fdpass.Channel()
        intruder = (
            "import os, socket, struct, sys\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
            "conn.connect(bytes.fromhex(sys.argv[1]).decode())\n"
            "conn.sendall(struct.pack('<q', 0))\n"
            "fd = os.memfd_create('forged')\n"
            "os.write(fd, b'x' * 64)\n"
            "socket.send_fds(conn, [struct.pack('<Q', 1)], [fd])\n"
            "sys.stdin.read()\n"
        )
        child = subprocess.Popen([sys.executable, "-c", intruder, channel.address.encode().hex()],
                                 stdin=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            while child.poll() is None and not _connected(channel) and time.monotonic() < deadline:
                time.sleep(0.05)
            with pytest.raises(RuntimeError, match="worker 0 did not connect"):
                channel._conn(0)
            sent = fdpass.send(channel.address, 0, self.batch(3))
            assert same(channel.receive(0, sent), self.batch(3))
        finally:
            child.communicate(b"")
            channel.close()
            fdpass.close_senders()

    def test_a_message_out_of_step_raises(self):
        channel = fdpass.Channel()
        try:
            sent = fdpass.send(channel.address, 0, self.batch())
            with pytest.raises(RuntimeError, match="out of step"):
                channel.receive(0, fdpass.Exported(sent.tree, sent.sizes[:2], sent.seq))
        finally:
            channel.close()
            fdpass.close_senders()

    def test_a_closed_channel_leaves_the_batch_to_torchs_queue(self):
        channel = fdpass.Channel()
        address = channel.address
        channel.close()
        batch = self.batch()
        assert fdpass.send(address, 0, batch) is batch
        fdpass.close_senders()

    def test_switched_off_by_the_environment(self, monkeypatch):
        monkeypatch.setenv("DATAPIPES_WORKER_FDS", "0")
        assert not fdpass.enabled()
