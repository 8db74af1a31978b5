"""A stage lets go of a batch once it has handed it on: nothing of batch k is alive while batch k+1
is made, unless its consumer still holds it. A suspended generator keeps its locals, so a batching
loop written plainly keeps the last batch (its samples, or its collated tensors) alive until the
next one is complete: a DataLoader worker of 32 samples of 8 MiB held 949 MB where torch's holds
694 MB (``benchmarks/transfer.py --sizes 8388608 --only loader_batch,dataloader_batch``)."""

import weakref

import pytest
import torch

from datapipes import DataChunk, IterDataPipe
from datapipes.loader import DataLoader, fdpass
from datapipes.loader import workers as _workers
from datapipes.iter import IterableWrapper

N = 3  # samples per batch


class Sample:
    def __init__(self, i):
        self.i = i


class Holder:
    """What a collate function returns: it holds the batch (so the batch lives as long as it)."""

    def __init__(self, batch):
        self.batch = batch


class Probed(IterDataPipe):
    """Samples that can be watched (``refs``); ``alive[i]``: how many of the samples made before
    sample ``i`` were still alive when ``i`` was made."""

    def __init__(self, n):
        self.n = n
        self.refs = []
        self.alive = []

    def __iter__(self):
        for i in range(self.n):
            self.alive.append(sum(r() is not None for r in self.refs))
            s = Sample(i)
            self.refs.append(weakref.ref(s))
            yield s
            s = None


def taken(pipe, keep=lambda b: b.tolist()):
    """Take every batch and drop it at once, as a training step does (a ``for`` loop would hold
    each batch while it asks for the next); what ``keep`` keeps of each."""
    it = iter(pipe)
    out = []
    while True:
        try:
            b = next(it)
        except StopIteration:
            return out
        out.append(keep(b))
        del b


def drain(pipe):
    return len(taken(pipe, keep=lambda b: None))


@pytest.mark.parametrize("build", [
    lambda src: src.batch(N),
    lambda src: src.batch(N, drop_last=True),
    lambda src: src.batch(N, wrapper_class=list),
    lambda src: src.batch(N, wrapper_class=tuple),  # a wrapper called on each batch
    lambda src: src.batch(N).collate(Holder),
    lambda src: src.batch(N, wrapper_class=tuple).collate(Holder),
], ids=["batch", "drop_last", "list", "wrapped", "collate", "wrapped-collate"])
def test_a_batch_is_let_go_before_the_next_is_gathered(build):
    src = Probed(4 * N)
    assert drain(build(src)) == 4
    # sample i sees only the samples of its own batch made before it
    assert src.alive == [i % N for i in range(4 * N)]


@pytest.mark.parametrize("build, kept", [
    (lambda src: src.batch(N).filter(lambda b: True), 4),
    (lambda src: src.batch(N).filter(lambda b: b[0].i % (2 * N) == 0), 2),  # a batch left out too
    (lambda src: src.batch(N).filter(lambda s: s.i % (2 * N) == 0, input_col=0), 2),
    (lambda src: src.batch(N).filter(lambda b: b[0].i % (2 * N) == 0, on_error="skip"), 2),
], ids=["filter", "filter-out", "filter-col", "filter-skip"])
def test_a_filter_lets_go_of_a_batch_kept_or_not(build, kept):
    src = Probed(4 * N)
    assert drain(build(src)) == kept
    assert src.alive == [i % N for i in range(4 * N)]


def test_a_short_last_batch_too():
    src = Probed(2 * N + 1)
    assert drain(src.batch(N).collate(Holder)) == 3
    assert src.alive == [i % N for i in range(2 * N + 1)]


def test_a_batch_the_consumer_keeps_stays_whole():
    src = Probed(2 * N)
    kept = list(src.batch(N).collate(Holder))
    assert [[s.i for s in h.batch] for h in kept] == [[0, 1, 2], [3, 4, 5]]
    assert type(kept[0].batch) is DataChunk


# -- DataLoader worker processes ----------------------------------------------------------------------

#: weak references to the batches a worker's collate_fn made (each worker has its own, forked)
MADE = []


def collate_watched(samples):
    out = torch.tensor(samples)
    MADE.append(weakref.ref(out))
    return out


def alive_batches(x):
    """Sample ``x`` and how many batches its worker made before it are alive as it is made."""
    return [x, sum(r() is not None for r in MADE)]


@pytest.mark.skipif(not fdpass.enabled(), reason="the descriptor channel is Linux's, with torch's default sharing")
def test_a_worker_lets_go_of_a_batch_it_sent():
    # the batch's storage travels as a descriptor; the worker's tensor is its own to drop, and it
    # is dropped before the next batch is made (the storage lives on in the main process)
    pipe = IterableWrapper(range(12)).sharding_filter().map(alive_batches)
    got = list(DataLoader(pipe, batch_size=N, num_workers=1, collate_fn=collate_watched,
                          multiprocessing_context="fork"))
    assert torch.cat(got)[:, 0].tolist() == list(range(12))
    assert torch.cat(got)[:, 1].tolist() == [0] * 12


def test_the_main_process_lets_go_of_a_batch_before_awaiting_the_next(monkeypatch):
    # each batch goes to the user, who drops it: the loader holds none of them while it waits
    # for the next one from its workers
    given = []
    alive_at_wait = []
    make = _workers.WorkerProcesses._torch_loader

    class Watched:
        def __init__(self, it):
            self.it = it

        def __iter__(self):
            return self

        def __next__(self):
            alive_at_wait.append(sum(r() is not None for r in given))
            return next(self.it)

        def __getattr__(self, name):  # _shutdown_workers
            return getattr(self.it, name)

    class Loader:
        def __init__(self, loader):
            self.loader = loader

        def __iter__(self):
            return Watched(iter(self.loader))

    monkeypatch.setattr(_workers.WorkerProcesses, "_torch_loader",
                        lambda self, *a: (lambda pair: (Loader(pair[0]), pair[1]))(make(self, *a)))
    it = iter(DataLoader(IterableWrapper(range(12)).sharding_filter(), batch_size=N, num_workers=2,
                         multiprocessing_context="fork"))
    while True:
        try:
            b = next(it)
        except StopIteration:
            break
        given.append(weakref.ref(b))
        del b
    assert len(given) == 4 and alive_at_wait and not any(alive_at_wait)


def test_the_loader_in_process_lets_go_of_a_batch_before_making_the_next():
    # num_workers=0: the pipe runs in the loader's own process; no batch the user dropped is
    # alive while the next one's samples are made
    MADE.clear()
    try:
        got = taken(DataLoader(IterableWrapper(range(12)).map(alive_batches), batch_size=N,
                               collate_fn=collate_watched))
    finally:
        MADE.clear()
    assert [x for b in got for x, _ in b] == list(range(12))
    assert [alive for b in got for _, alive in b] == [0] * 12
