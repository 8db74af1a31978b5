"""datapipes.DataLoader over a map-style dataset, as torch's DataLoader: a batch whose loading
(``__getitem__``, ``__getitems__``) or ``collate_fn`` raises reaches ``next()`` as that exception, and
the pass goes on with the next batch, which counts the failed one as delivered (a state resumes after
it). An iterable pipe, or a torch ``IterableDataset``, still ends its pass at its first error."""

import contextlib
import gc
import math
import pickle
import time

import pytest
import torch
from torch.utils.data import BatchSampler, Dataset, IterableDataset, SequentialSampler

from datapipes.iter import IterableWrapper
from datapipes.iter import device as device_mod
from datapipes.loader import DataLoader

from helpers import Boom, child_pids, plain_process  # noqa: F401 - an autouse fixture

pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*pinning is skipped:RuntimeWarning"),
]

WORKERS = [0, 2]
N = 20
BAD = (5, 13)


class Flaky(Dataset):
    """``0 .. n-1``, but ``Boom(i, "bad sample")`` for the indices in ``bad``; with ``num_workers=0``
    the exceptions it raised are kept in ``raised``."""

    def __init__(self, n=N, bad=BAD):
        self.n, self.bad = n, frozenset(bad)
        self.raised = []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            error = Boom(i, "bad sample")
            self.raised.append(error)
            raise error
        return i


class FlakyMany(Flaky):
    """:class:`Flaky` read a batch at a time (``__getitems__``, as torch's fetcher calls it)."""

    def __getitems__(self, indices):
        if any(i in self.bad for i in indices):
            error = Boom(list(indices), "bad batch")
            self.raised.append(error)
            raise error
        return list(indices)


class Unimplemented(Dataset):
    """torch's ``ErrorDataset``: a length and no ``__getitem__`` (``Dataset``'s raises)."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size


class FailsIn(IterableDataset):
    def __iter__(self):
        for i in range(N):
            if i == 5:
                raise Boom(i, "bad sample")
            yield i


class ValueErrorAt(Dataset):
    """``0 .. 9`` but ``ValueError`` at 3 and 7 (torch's workers re-raise it as a ValueError too)."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i in (3, 7):
            raise ValueError(f"bad sample {i}")
        return i


def fails_at_5(x):
    if x == 5:
        raise Boom(x, "bad sample")
    return x


def collate_refusing_8(samples):
    if 8 in samples:
        raise ValueError(f"cannot collate {samples}")
    return torch.tensor(samples)


def unpicklable_at_5(x):
    if x == 5:
        raise NeedsTwo("bad", x)
    return x


class NeedsTwo(Exception):
    """An exception whose ``__init__`` wants two arguments: it does not unpickle from its args."""

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


class FlakyUnpicklable(Flaky):
    def __getitem__(self, i):
        return unpicklable_at_5(i)


def outcomes(it, limit=500):
    """Each ``next(it)`` until ``StopIteration``: the batch (as lists), or the exception it raised."""
    out = []
    for _ in range(limit):
        try:
            batch = next(it)
        except StopIteration:
            return out
        except Exception as e:  # noqa: BLE001 - what the loader raised is the outcome
            out.append(e)
        else:
            out.append(batch.tolist() if isinstance(batch, torch.Tensor) else batch)
    raise AssertionError(f"the pass did not end after {limit} next() calls")


def shape(results):
    """``outcomes`` with each exception as its type's name."""
    return [type(x).__name__ if isinstance(x, BaseException) else x for x in results]


def expected(reference, bad=BAD):
    """What a pass over :class:`Flaky` gives, from the same pass over one that never fails: each batch
    holding a bad index is a ``Boom``."""
    def failed(batch):
        return any(i in bad for i in (batch if isinstance(batch, list) else [batch]))

    return ["Boom" if failed(batch) else batch for batch in reference]


def children_left(before, timeout=20.0):
    from multiprocessing import resource_tracker

    def alive():
        pids = child_pids()
        pids.discard(getattr(resource_tracker._resource_tracker, "_pid", None))
        return pids - before

    deadline = time.monotonic() + timeout
    while alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    return alive()


SPELLINGS = {
    "batch_size": dict(batch_size=4),
    "drop_last": dict(batch_size=3, drop_last=True),
    "batch_size=1": dict(),
    "batch_size=None": dict(batch_size=None),
    "shuffle": dict(batch_size=3, shuffle=True, seed=1),
    "shuffle, batch_size=None": dict(batch_size=None, shuffle=True, seed=1),
    "sampler": dict(batch_size=3, sampler=list(reversed(range(N)))),
    "sampler, batch_size=None": dict(batch_size=None, sampler=list(reversed(range(N)))),
    "batch_sampler": dict(batch_sampler=BatchSampler(SequentialSampler(range(N)), 6, False)),
    "collate_fn, batch_size=None": dict(batch_size=None, collate_fn=lambda x: x * 10),
}


class TestTheFailingBatchRaisesAndThePassGoesOn:
    @pytest.mark.parametrize("spelling", list(SPELLINGS))
    @pytest.mark.parametrize("workers", WORKERS)
    def test_every_good_batch_comes_in_its_order(self, workers, spelling):
        kw = SPELLINGS[spelling]
        reference = outcomes(iter(DataLoader(Flaky(bad=()), num_workers=workers, **kw)))
        got = outcomes(iter(DataLoader(Flaky(), num_workers=workers, **kw)))
        if "collate_fn" in kw:  # collate_fn multiplies by 10: the bad items are those of index 5 and 13
            assert shape(got) == ["Boom" if x in (50, 130) else x for x in reference]
        else:
            assert shape(got) == expected(reference)
        assert "Boom" in shape(got)

    @pytest.mark.parametrize("workers", WORKERS)
    def test_len_is_unchanged(self, workers):
        loader = DataLoader(Flaky(), batch_size=3, num_workers=workers)
        assert len(loader) == math.ceil(N / 3) == len(outcomes(iter(loader)))

    def test_in_process_the_exception_is_the_object_the_dataset_raised(self):
        data = Flaky()
        got = outcomes(iter(DataLoader(data, batch_size=4)))
        errors = [x for x in got if isinstance(x, BaseException)]
        assert len(errors) == len(data.raised) == 2
        assert all(ours is theirs for ours, theirs in zip(errors, data.raised))
        assert errors[0].args == (5, "bad sample") and errors[0].code == 5
        # a note names what failed: the batch's indices
        assert any("[4, 5, 6, 7]" in note for note in errors[0].__notes__)

    @pytest.mark.parametrize("workers", WORKERS)
    def test_a_for_loop_stops_at_the_error_and_the_iterator_goes_on(self, workers):
        it = iter(DataLoader(Flaky(), batch_size=4, num_workers=workers))
        seen = []
        with pytest.raises(Boom):
            for batch in it:
                seen.append(batch.tolist())
        assert seen == [[0, 1, 2, 3]]
        assert next(it).tolist() == [8, 9, 10, 11]
        assert shape(outcomes(it)) == ["Boom", [16, 17, 18, 19]]

    def test_from_a_worker_type_args_worker_and_traceback_are_kept(self):
        got = outcomes(iter(DataLoader(Flaky(), batch_size=4, num_workers=2)))
        errors = [x for x in got if isinstance(x, BaseException)]
        assert [type(e) for e in errors] == [Boom, Boom]
        assert errors[0].args == (5, "bad sample") and errors[1].args == (13, "bad sample")
        notes = errors[0].__notes__
        assert any("[4, 5, 6, 7]" in note for note in notes)
        # the batch of indices 4..7 is worker 1's (the workers take the batches in turn)
        assert any(note.startswith("[datapipes] raised in DataLoader worker process 1 of 2") for note in notes)
        assert any(note.startswith("worker process traceback") and "__getitem__" in note for note in notes)

    def test_an_exception_that_cannot_come_back_from_a_worker_is_replaced_and_the_pass_goes_on(self):
        got = outcomes(iter(DataLoader(FlakyUnpicklable(), batch_size=2, num_workers=2)))
        assert shape(got) == [[0, 1], [2, 3], "RuntimeError", *[[i, i + 1] for i in range(6, N, 2)]]
        assert "NeedsTwo raised in DataLoader worker process 0" in str(got[2])

    @pytest.mark.parametrize("workers", WORKERS)
    def test_getitems_that_raises(self, workers):
        data = FlakyMany()
        got = outcomes(iter(DataLoader(data, batch_size=4, num_workers=workers)))
        assert shape(got) == [[0, 1, 2, 3], "Boom", [8, 9, 10, 11], "Boom", [16, 17, 18, 19]]
        assert got[1].args == ([4, 5, 6, 7], "bad batch")
        if not workers:
            assert got[1] is data.raised[0]

    @pytest.mark.parametrize("workers", WORKERS)
    def test_a_collate_fn_that_raises(self, workers):
        loader = DataLoader(Flaky(bad=()), batch_size=4, num_workers=workers, collate_fn=collate_refusing_8)
        got = outcomes(iter(loader))
        assert shape(got) == [[0, 1, 2, 3], [4, 5, 6, 7], "ValueError", [12, 13, 14, 15], [16, 17, 18, 19]]
        assert got[2].args == ("cannot collate [8, 9, 10, 11]",)

    @pytest.mark.parametrize("workers", WORKERS)
    def test_the_same_outcomes_as_torchs_loader(self, workers):
        kw = dict(batch_size=2, num_workers=workers)
        theirs = shape(outcomes(iter(torch.utils.data.DataLoader(ValueErrorAt(), **kw))))
        ours = shape(outcomes(iter(DataLoader(ValueErrorAt(), **kw))))
        assert ours == theirs == [[0, 1], "ValueError", [4, 5], "ValueError", [8, 9]]

    @pytest.mark.parametrize("workers", WORKERS)
    def test_torchs_test_error(self, workers):
        # PyTorch's test_dataloader.py test_error / test_error_workers, with our loader: every batch
        # raises NotImplementedError, and the pass goes on to the last one
        size = 41 if workers else 100
        loader = DataLoader(Unimplemented(size), batch_size=2, shuffle=True, num_workers=workers)
        got = outcomes(iter(loader))
        assert shape(got) == ["NotImplementedError"] * math.ceil(size / 2)

    @pytest.mark.parametrize("workers", WORKERS)
    def test_the_last_batch_failing_ends_the_pass_after_it(self, workers):
        loader = DataLoader(Flaky(bad=(19,)), batch_size=4, num_workers=workers)
        it = iter(loader)
        assert shape(outcomes(it)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], "Boom"]
        with pytest.raises(StopIteration):
            next(it)
        assert loader.state_dict()["pass"][0]["ended"] is True

    @pytest.mark.parametrize("workers", WORKERS)
    def test_a_pass_dropped_after_an_error_stops_its_workers(self, workers):
        before = child_pids()
        it = iter(DataLoader(Flaky(), batch_size=4, num_workers=workers))
        next(it)
        with pytest.raises(Boom):
            next(it)
        del it
        gc.collect()
        assert not children_left(before)


class TestStateAfterAnError:
    """The failed batch counts as delivered: a state taken after it resumes with the next batch."""

    @pytest.mark.parametrize("timeout", [None, 30])  # 30: a buffer reads ahead of the user
    @pytest.mark.parametrize("workers", WORKERS)
    def test_a_state_taken_right_after_the_error_resumes_after_the_failed_batch(self, workers, timeout):
        kw = dict(batch_size=2, shuffle=True, seed=3, num_workers=workers, timeout=timeout)
        whole = expected(outcomes(iter(DataLoader(Flaky(bad=()), **kw))))
        loader = DataLoader(Flaky(), **kw)
        it = iter(loader)
        head = []
        while True:
            try:
                head.append(next(it).tolist())
            except Boom:
                head.append("Boom")
                break
        state = loader.state_dict()
        rest = shape(outcomes(it))
        assert head + rest == whole
        again = DataLoader(Flaky(), **kw)
        again.load_state_dict(pickle.loads(pickle.dumps(state)))
        assert shape(outcomes(iter(again))) == rest  # not the failed batch again, nor one lost

    @pytest.mark.parametrize("workers", WORKERS)
    def test_a_state_taken_after_more_batches(self, workers):
        kw = dict(batch_size=3, num_workers=workers)
        loader = DataLoader(Flaky(), **kw)
        it = iter(loader)
        head = [next(it).tolist()]
        with pytest.raises(Boom):
            next(it)  # [3, 4, 5]
        head += ["Boom", next(it).tolist(), next(it).tolist()]
        state = loader.state_dict()
        rest = shape(outcomes(it))
        assert head + rest == expected([list(range(i, min(i + 3, N))) for i in range(0, N, 3)])
        again = DataLoader(Flaky(), **kw)
        again.load_state_dict(state)
        assert shape(outcomes(iter(again))) == rest


class TestWithTheLoadersOptions:
    @pytest.mark.parametrize("options", [
        dict(timeout=30), dict(pin_memory=True), dict(device="cpu"), dict(pin_memory=True, device="cpu"),
        dict(even_batches="drop"), dict(even_batches="pad"), dict(timeout=30, device="cpu", even_batches="drop"),
    ], ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()))
    @pytest.mark.parametrize("workers", WORKERS)
    def test_the_pass_goes_on(self, workers, options):
        got = outcomes(iter(DataLoader(Flaky(), batch_size=4, num_workers=workers, **options)))
        assert shape(got) == [[0, 1, 2, 3], "Boom", [8, 9, 10, 11], "Boom", [16, 17, 18, 19]]

    def test_persistent_workers_serve_every_pass_to_its_end(self):
        loader = DataLoader(Flaky(), batch_size=4, num_workers=2, persistent_workers=True)
        with loader:
            for _ in range(2):
                assert shape(outcomes(iter(loader))) == [[0, 1, 2, 3], "Boom", [8, 9, 10, 11], "Boom",
                                                         [16, 17, 18, 19]]

    def test_persistent_workers_a_second_iter_ends_a_pass_that_goes_on_after_an_error(self):
        loader = DataLoader(Flaky(), batch_size=4, num_workers=2, persistent_workers=True)
        with loader:
            it = iter(loader)
            next(it)
            with pytest.raises(Boom):
                next(it)
            again = iter(loader)  # as torch's reset: the first pass ends
            assert outcomes(it) == []
            assert shape(outcomes(again)) == [[0, 1, 2, 3], "Boom", [8, 9, 10, 11], "Boom", [16, 17, 18, 19]]


class _Stand:
    """Stands in for CUDA's streams, events and calls (as tests/iter/test_device.py's FakeCuda)."""

    name = "stream"

    def Stream(self, device):  # noqa: N802 - torch.cuda's names
        return self

    def stream(self, s):
        return contextlib.nullcontext()

    def current_stream(self, device):
        return self

    def Event(self):  # noqa: N802
        return self

    def record(self, stream=None):
        pass

    def wait_event(self, event):
        pass

    def record_stream(self, t, stream):
        pass

    def pin(self, t):
        return t


class TestTheStagesHandTheFailedBatchOn:
    def test_the_pipe_has_the_stages_and_labels_it_had(self):
        # so that a state saved before failed batches went on still loads, and profiles read the same
        assert repr(DataLoader(Flaky(), batch_size=4).pipe) == (
            "IterableWrapper -> Batcher(4) -> ShardingFilter -> Mapper(Fetch) -> Collator(collate)")
        assert repr(DataLoader(Flaky(), batch_size=None, collate_fn=collate_refusing_8).pipe) == (
            "IterableWrapper -> ShardingFilter -> Mapper(Fetch) -> Collator(collate_refusing_8)")

    @pytest.mark.parametrize("workers", WORKERS)
    def test_to_device_on_the_cuda_path(self, workers):
        # the CUDA path of to_device, its CUDA calls stood in for, copying to "meta"
        loader = DataLoader(Flaky(), batch_size=4, num_workers=workers, device="cpu")
        mover = loader.pipe
        assert type(mover).__name__ == "DeviceMover"
        it = device_mod._move_cuda(mover, torch.device("meta"), _Stand())
        got = []
        for item in it:
            got.append("failed" if getattr(type(item), "_failed_batch", False) else item.device.type)
        assert got == ["meta", "failed", "meta", "failed", "meta"]


class TestIterablePipesEndAtTheirFirstError:
    """A generator that raised is finished; torch's IterableDataset iterator ends there too."""

    @pytest.mark.parametrize("workers", WORKERS)
    def test_a_pipe(self, workers):
        pipe = IterableWrapper(range(N)).sharding_filter().map(fails_at_5)
        got = outcomes(iter(DataLoader(pipe, batch_size=None, num_workers=workers)))
        assert shape(got) == [0, 1, 2, 3, 4, "Boom"]

    def test_a_torch_iterable_dataset_as_torchs_loader(self):
        theirs = shape(outcomes(iter(torch.utils.data.DataLoader(FailsIn(), batch_size=2))))
        ours = shape(outcomes(iter(DataLoader(FailsIn(), batch_size=2))))
        assert ours == theirs == [[0, 1], [2, 3], "Boom"]
