"""datapipes.DataLoader as a drop-in for torch's DataLoader, continued: ``in_order=False`` with worker
processes (completion order, resumed exactly), the private attributes torch's tests and some user
code read (``_auto_collation``, ``_iterator``, ``iter(loader)._workers``), where torch's warning for
too many workers is given, torch's order of checks for an IterableDataset, a
``LoaderTimeoutError`` rebuilt from its message, and torch's error at the open-file limit."""

import multiprocessing
import os
import pickle
import random
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch
from torch.utils.data import BatchSampler, IterableDataset, SequentialSampler, get_worker_info
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data._utils import ExceptionWrapper

from datapipes._runtime import tuning
from datapipes.iter import IterableWrapper
from datapipes.loader import DataLoader
from datapipes.loader.buffer import LoaderTimeoutError

from helpers import Boom, needs_torch_in_order, plain_process  # noqa: F401 - an autouse fixture

#: seconds any wait of these tests may take before it fails the test instead of hanging it
WAIT = 60.0


def ints(batches):
    return [x for b in batches for x in (b.tolist() if isinstance(b, torch.Tensor) else [b])]


# -- 1. in_order=False with workers ----------------------------------------------------------------


class HeldBack(torch.utils.data.Dataset):
    """``0 .. n-1``, read by index; in DataLoader worker 0, each item waits until ``release`` is set
    (by the consumer, once it has the batches it expects before any of worker 0's)."""

    def __init__(self, n, release):
        self.n, self.release = n, release

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        if info is not None and info.id == 0 and not self.release.wait(WAIT):
            raise TimeoutError(f"worker 0 was not released within {WAIT} s")
        return i


class Jittery(torch.utils.data.Dataset):
    """``0 .. n-1``, read by index, each item taking a few random milliseconds (seeded by the item),
    so that workers finish their batches in an order of their own."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(random.Random(i).uniform(0, 0.004))
        return i


def jitter(i):
    time.sleep(random.Random(i).uniform(0, 0.004))
    return i


def jittery_pipe(n):
    return IterableWrapper(range(n)).sharding_filter().map(jitter)


def first_then_rest(loader, k, make):
    """The first ``k`` batches of a pass of ``loader``, and what a new loader (``make()``) given the
    state saved after them yields."""
    it = iter(loader)
    first = [next(it) for _ in range(k)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    it.close()
    again = make()
    again.load_state_dict(state)
    return ints(first), ints(again)


@needs_torch_in_order
class TestOutOfOrder:
    def test_a_slow_worker_does_not_hold_back_the_others(self):
        release = multiprocessing.Event()
        loader = DataLoader(HeldBack(20, release), num_workers=2, in_order=False)
        assert loader.in_order is False
        it = iter(loader)
        # worker 0 reads items 0, 2, 4, ... and is held back until the consumer has five batches:
        # in torch's order (in_order=True) the first batch would be worker 0's and never come
        first = [int(next(it)) for _ in range(5)]
        release.set()
        rest = ints(it)
        assert all(x % 2 == 1 for x in first)
        assert sorted(first + rest) == list(range(20))

    def test_a_state_saved_while_a_worker_is_held_back_resumes_exactly(self):
        release = multiprocessing.Event()
        loader = DataLoader(HeldBack(20, release), num_workers=2, in_order=False)
        it = iter(loader)
        first = [int(next(it)) for _ in range(4)]
        state = pickle.loads(pickle.dumps(loader.state_dict()))
        release.set()
        it.close()
        assert all(x % 2 == 1 for x in first)
        again = DataLoader(HeldBack(20, release), num_workers=2, in_order=False)
        again.load_state_dict(state)
        rest = ints(again)
        assert sorted(first + rest) == list(range(20)), (first, rest)  # each batch once: none lost, none twice

    @pytest.mark.parametrize("persistent", [False, True])
    @pytest.mark.parametrize("kind", ["map-style", "pipe"])
    def test_every_batch_not_delivered_comes_once_after_resume(self, kind, persistent):
        n = 40

        def make():
            data = Jittery(n) if kind == "map-style" else jittery_pipe(n)
            return DataLoader(data, batch_size=3, num_workers=2, in_order=False, persistent_workers=persistent,
                              seed=7)

        everything = ints(make())
        assert sorted(everything) == list(range(n))
        for k in (0, 5, 13, 14):  # 14 batches in all (the pass not run out yet: nothing left after 14)
            first, rest = first_then_rest(make(), k, make)
            assert sorted(first + rest) == list(range(n)), (k, first, rest)

    def test_persistent_workers_serve_every_epoch_in_completion_order(self):
        loader = DataLoader(Jittery(30), batch_size=2, num_workers=2, in_order=False, persistent_workers=True)
        try:
            for _ in range(3):
                assert sorted(ints(loader)) == list(range(30))
            it = iter(loader)
            first = ints([next(it) for _ in range(6)])
            state = loader.state_dict()
            it.close()
            loader.load_state_dict(state)
            assert sorted(first + ints(loader)) == list(range(30))
        finally:
            loader.close()

    def test_with_timeout_the_batches_held_ahead_are_not_counted(self):
        # the timed buffer reads ahead of the consumer: what it holds is not delivered yet
        def make():
            return DataLoader(Jittery(24), batch_size=2, num_workers=2, in_order=False, timeout=30)

        first, rest = first_then_rest(make(), 5, make)
        assert sorted(first + rest) == list(range(24))

    def test_a_failure_reaches_the_consumer_as_its_own_object(self):
        def fails(x):
            if x == 9:
                raise Boom(x, "fails here")
            return x

        loader = DataLoader(IterableWrapper(range(20)).sharding_filter().map(fails), batch_size=None, num_workers=2,
                            in_order=False)
        with pytest.raises(Boom, match="fails here"):
            list(loader)

    def test_true_keeps_torchs_round_robin(self):
        loader = DataLoader(Jittery(12), num_workers=2, in_order=True)
        assert ints(loader) == list(range(12))


# -- 2. torch's private attributes -------------------------------------------------------------------


class TestPrivateAttributes:
    @pytest.mark.parametrize("kw", [{}, {"batch_size": None}, {"batch_size": 4},
                                    {"batch_sampler": BatchSampler(SequentialSampler(range(10)), 3, False)}])
    def test_auto_collation_as_torch(self, kw):
        data = list(range(10))
        assert DataLoader(data, **kw)._auto_collation is TorchDataLoader(data, **kw)._auto_collation

    def test_iterator_is_none_without_persistent_workers(self):
        for loader in (DataLoader(list(range(6))), DataLoader(list(range(6)), num_workers=2)):
            assert loader._iterator is None
            list(loader)
            assert loader._iterator is None

    def test_iterator_holds_the_persistent_workers_as_torchs(self):
        loader = DataLoader(list(range(6)), num_workers=2, persistent_workers=True)
        try:
            assert loader._iterator is None
            assert ints(loader) == list(range(6))
            it = loader._iterator
            assert isinstance(it, torch.utils.data.dataloader._MultiProcessingDataLoaderIter)
            workers = list(it._workers)
            assert ints(loader) == list(range(6)) and loader._iterator is it  # the same workers again
            # what torch's tests do to stop them: shut down, then forget the iterator
            it._shutdown_workers()
            loader._iterator = None
            assert loader._iterator is None
            for w in workers:
                w.join(WAIT)
                assert not w.is_alive()
            assert ints(loader) == list(range(6))  # new workers
            assert {w.pid for w in loader._iterator._workers}.isdisjoint(w.pid for w in workers)
        finally:
            loader.close()

    def test_the_workers_of_a_pass_start_at_iter_and_stop_when_it_is_dropped(self):
        loader = DataLoader(list(range(40)), batch_size=2, num_workers=3)
        it = iter(loader)
        workers = it._workers
        assert len(workers) == 3
        assert all(isinstance(w, multiprocessing.process.BaseProcess) and w.is_alive() for w in workers)
        for i, _ in enumerate(it):
            if i == 4:
                break
        del it
        for w in workers:
            w.join(WAIT)
            assert not w.is_alive(), "worker process not stopped"

    def test_persistent_workers_are_the_same_in_every_pass(self):
        loader = DataLoader(list(range(8)), num_workers=2, persistent_workers=True)
        try:
            it = iter(loader)
            pids = [w.pid for w in it._workers]
            list(it)
            assert [w.pid for w in iter(loader)._workers] == pids
        finally:
            loader.close()

    def test_without_workers_the_iterator_has_none(self):
        with pytest.raises(AttributeError, match="_workers"):
            iter(DataLoader(list(range(3))))._workers


# -- 3. torch's warning for more workers than CPUs: at construction and iter(), not next() ----------


@pytest.fixture
def one_cpu(monkeypatch):
    """This process may use one CPU, as the loader reads it and as torch's loader does."""
    monkeypatch.setattr(tuning, "usable_cpus", lambda: 1)
    if hasattr(torch._utils, "cpu_count"):
        monkeypatch.setattr(torch._utils, "cpu_count", lambda: 1)
    else:  # torch before 2.7 reads the affinity mask itself
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})


WARNING = "This DataLoader will create 2 worker processes in total"


def warnings_of(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return [w for w in caught if WARNING in str(w.message)], result


class TestWorkerNumberWarning:
    def test_at_construction_and_iter_never_at_next(self, one_cpu):
        found, loader = warnings_of(lambda: DataLoader(list(range(6)), num_workers=2))
        assert len(found) == 1 and found[0].filename == __file__
        found, it = warnings_of(lambda: iter(loader))
        assert len(found) == 1 and found[0].filename == __file__
        for _ in range(6):
            found, _ = warnings_of(lambda: next(it))
            assert found == []

    def test_persistent_workers_warn_at_the_iter_that_starts_them(self, one_cpu):
        loader = DataLoader(list(range(6)), num_workers=2, persistent_workers=True)
        try:
            found, batches = warnings_of(lambda: list(loader))
            assert len(found) == 1 and ints(batches) == list(range(6))
            found, batches = warnings_of(lambda: list(loader))  # the same workers: as torch, no warning
            assert found == [] and ints(batches) == list(range(6))
        finally:
            loader.close()

    def test_none_without_workers(self, one_cpu):
        found, loader = warnings_of(lambda: DataLoader(list(range(6))))
        assert found == []
        found, batches = warnings_of(lambda: list(loader))
        assert found == []


# -- 4. an IterableDataset refuses sampler= and batch_sampler= first, with torch's ValueError ---------


class Counting(IterableDataset):
    def __iter__(self):
        return iter(range(5))


class TestIterableDatasetSamplers:
    @pytest.mark.parametrize("name", ["sampler", "batch_sampler"])
    @pytest.mark.parametrize("value", [3, "abc", SequentialSampler(range(5))])
    def test_any_value_is_refused_as_torch(self, name, value):
        with pytest.raises(ValueError, match=f"DataLoader with IterableDataset: expected unspecified {name} option"):
            TorchDataLoader(Counting(), **{name: value})
        with pytest.raises(ValueError, match=f"DataLoader with IterableDataset: expected unspecified {name} option"):
            DataLoader(Counting(), **{name: value})

    def test_a_map_style_dataset_still_refuses_a_sampler_that_is_no_iterable(self):
        with pytest.raises(TypeError, match="sampler must be an iterable of indices"):
            DataLoader(list(range(5)), sampler=3)


# -- 5. LoaderTimeoutError rebuilt from its message --------------------------------------------------


class TestLoaderTimeoutError:
    def test_built_from_a_message_alone(self):
        e = LoaderTimeoutError("DataLoader timed out after 5 seconds")
        assert isinstance(e, RuntimeError) and isinstance(e, TimeoutError)
        assert str(e) == "DataLoader timed out after 5 seconds"
        assert e.timeout is None and e.batch is None
        again = pickle.loads(pickle.dumps(e))
        assert type(again) is LoaderTimeoutError and str(again) == str(e)

    def test_the_loaders_keeps_its_detail_and_rebuilds_as_torch_rebuilds(self):
        class Stuck(torch.utils.data.Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                time.sleep(3)
                return i

        with pytest.raises(LoaderTimeoutError, match=r"DataLoader timed out after 1 seconds") as info:
            next(iter(DataLoader(Stuck(), timeout=1)))
        e = info.value
        assert e.timeout == 1 and e.batch == 0
        again = pickle.loads(pickle.dumps(e))
        assert (again.timeout, again.batch, str(again)) == (1, 0, str(e))
        rebuilt = type(e)(str(e))  # torch's ExceptionWrapper.reraise: exc_type(message)
        assert str(rebuilt) == str(e)
        try:
            raise e
        except LoaderTimeoutError:
            wrapper = ExceptionWrapper(sys.exc_info(), where="in the test")
        with pytest.raises(LoaderTimeoutError, match="DataLoader timed out after 1 seconds"):
            wrapper.reraise()


# -- 6. torch's error at the open-file limit ---------------------------------------------------------


FD_LIMIT_SCRIPT = textwrap.dedent("""
    import resource
    import torch
    from torch.utils.data import IterableDataset
    from datapipes import DataLoader

    class Tensors(IterableDataset):
        def __iter__(self):
            return (torch.randn(2, 2) for _ in range(200))

    kept = []  # each received tensor keeps a descriptor open (torch's file_descriptor strategy)
    resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))
    try:
        for t in DataLoader(Tensors(), multiprocessing_context="fork", num_workers=1):
            kept.append(t)
    except RuntimeError as e:
        print("RAISED", repr(str(e)))
    else:
        print("NOT RAISED", len(kept))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="file descriptors passed between processes: Linux")
class TestOpenFileLimit:
    @pytest.mark.parametrize("channel", ["1", "0"])  # our descriptor channel, or torch's queue (fdpass off)
    def test_torchs_advice_then_ours(self, channel):
        env = {**os.environ, "DATAPIPES_WORKER_FDS": channel}
        out = subprocess.run([sys.executable, "-c", FD_LIMIT_SCRIPT], env=env, capture_output=True, text=True,
                             timeout=WAIT * 2)
        assert "RAISED" in out.stdout, (out.stdout, out.stderr[-3000:])
        message = out.stdout
        assert "Too many open files. Communication with the workers is no longer possible. Please increase the " \
               "limit using `ulimit -n` in the shell or change the sharing strategy by calling " \
               "`torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of your code" in message
        if channel == "1":
            assert "RLIMIT_NOFILE" in message  # our detail follows torch's words

