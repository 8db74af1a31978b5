"""datapipes.DataLoader as a drop-in for torch.utils.data.DataLoader and torchdata's StatefulDataLoader:
torch's argument names, defaults, attributes, checks and messages, and the loader's answers where
they differ on purpose (docs/from_dataloader.rst, "torch's arguments, one by one")."""

import multiprocessing
import pickle
import re
import time
import warnings

import pytest
import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import default_collate

from datapipes import collate
from datapipes._runtime import tuning
from datapipes.iter import IterableWrapper
from datapipes.loader import DataLoader

from helpers import TORCH_IN_ORDER, needs_torch_in_order, plain_process  # noqa: F401 - an autouse fixture


class Squares(torch.utils.data.Dataset):
    """A map-style dataset: ``i * i`` for ``i < n``."""

    def __init__(self, n=10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i * i


class SplitsItself(IterableDataset):
    """An IterableDataset of ``n`` items that splits them across DataLoader workers itself."""

    def __init__(self, n=24):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        step, first = (1, 0) if info is None else (info.num_workers, info.id)
        return iter(range(first, self.n, step))

    def __len__(self):
        return self.n


class Slow(torch.utils.data.Dataset):
    """A map-style dataset whose every item takes ``seconds``."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return i


def lists(batches):
    return [b.tolist() for b in batches]


def torch_error(make):
    """The exception torch's own DataLoader raises for ``make(TorchDataLoader)``."""
    try:
        make(TorchDataLoader)
    except Exception as e:  # noqa: BLE001 - whatever torch raises is what ours is compared with
        return e
    raise AssertionError("torch's DataLoader accepted it")


# -- 1. the data: dataset=, pipe= or src= -------------------------------------------------------------


class TestTheData:
    def test_dataset_by_keyword_as_torch(self):
        assert lists(DataLoader(dataset=Squares(), batch_size=4)) == [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81]]
        assert list(DataLoader(dataset=IterableWrapper(range(3)), batch_size=None)) == [0, 1, 2]

    def test_pipe_and_src_still_name_it(self):
        assert list(DataLoader(pipe=IterableWrapper(range(3)), batch_size=None)) == [0, 1, 2]
        assert list(DataLoader(src=range(3), preprocessor=abs)) == [0, 1, 2]

    @pytest.mark.parametrize("first, second", [("dataset", "pipe"), ("dataset", "src"), ("pipe", "src")])
    def test_two_names_at_once_is_a_type_error_naming_both(self, first, second):
        with pytest.raises(TypeError, match="give the data once") as info:
            DataLoader(**{first: [1], second: [2]})
        assert f"as {first} or as {second}, not both" in str(info.value)

    def test_positional_data_and_a_keyword_name_both(self):
        with pytest.raises(TypeError, match="as dataset or as pipe, not both"):
            DataLoader([1], pipe=[2])

    def test_missing_data_is_torchs_type_error(self):
        with pytest.raises(TypeError, match="missing 1 required positional argument: 'dataset'"):
            DataLoader(batch_size=2)

    def test_torchs_positional_order(self):
        # DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
        # pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator)
        args = (Squares(), 3, False, None, None, 0, list, False, True, 0, None, None, None)
        assert list(DataLoader(*args)) == list(TorchDataLoader(*args)) == [[0, 1, 4], [9, 16, 25], [36, 49, 64]]


# -- 2. loader.dataset ----------------------------------------------------------------------------------


class TestDatasetAttribute:
    @pytest.mark.parametrize("data", [Squares(), [1, 2, 3], IterableWrapper(range(3)), SplitsItself()],
                             ids=["map-style", "list", "pipe", "iterable-dataset"])
    def test_the_object_given(self, data):
        assert DataLoader(data).dataset is data
        assert DataLoader(dataset=data, batch_size=None).dataset is data
        assert DataLoader(pipe=data).dataset is data

    def test_the_spdl_spelling_keeps_src(self):
        data = [1, 2, 3]
        assert DataLoader(src=data, preprocessor=abs).dataset is data
        assert DataLoader(data, preprocessor=abs).dataset is data


# -- 3. batch_size defaults to 1 -------------------------------------------------------------------------


class TestBatchSizeDefault:
    def test_batches_of_one_as_torch(self):
        ours, theirs = DataLoader(Squares(4)), TorchDataLoader(Squares(4))
        assert ours.batch_size == theirs.batch_size == 1
        assert lists(ours) == lists(theirs) == [[0], [1], [4], [9]]
        assert len(ours) == len(theirs) == 4

    def test_over_a_pipe_too(self):
        pipe = IterableWrapper(range(3))
        assert lists(DataLoader(pipe)) == lists(TorchDataLoader(pipe)) == [[0], [1], [2]]

    def test_none_gives_the_items_as_they_are(self):
        loader = DataLoader(Squares(4), batch_size=None)
        assert loader.batch_size is None and list(loader) == [0, 1, 4, 9]

    def test_drop_last_with_the_default_as_torch(self):
        assert len(DataLoader(Squares(3), drop_last=True)) == len(TorchDataLoader(Squares(3), drop_last=True)) == 3

    def test_the_spdl_spelling_keeps_its_default(self):
        loader = DataLoader(range(3), preprocessor=abs)
        assert loader.batch_size is None and list(loader) == [0, 1, 2]

    def test_batch_sampler_with_the_default_batch_size(self):
        sampler = BatchSampler(SequentialSampler(range(5)), 2, False)
        ours, theirs = DataLoader(Squares(5), batch_sampler=sampler), TorchDataLoader(Squares(5), batch_sampler=sampler)
        assert ours.batch_size is theirs.batch_size is None  # as torch: the batch sampler sizes the batches
        assert lists(ours) == lists(theirs) == [[0, 1], [4, 9], [16]]


# -- 4. in_order ---------------------------------------------------------------------------------------


class TestInOrder:
    @pytest.mark.parametrize("workers", [0, 2])
    def test_true_is_what_the_loader_does(self, workers):
        loader = DataLoader(Squares(), batch_size=3, num_workers=workers, in_order=True)
        assert loader.in_order is True
        assert lists(loader) == [[0, 1, 4], [9, 16, 25], [36, 49, 64], [81]]

    @needs_torch_in_order
    def test_false_without_workers_changes_nothing_as_torch(self):
        loader = DataLoader(Squares(), batch_size=3, in_order=False)
        assert loader.in_order is False and lists(loader) == lists(TorchDataLoader(Squares(), 3, in_order=False))

    @needs_torch_in_order
    def test_false_with_workers_is_taken(self):
        # batches as the workers finish them (tests/test_loader_dropin_more.py::TestOutOfOrder)
        loader = DataLoader(Squares(), batch_size=3, num_workers=2, in_order=False)
        assert loader.in_order is False
        assert sorted(map(tuple, lists(loader))) == [(0, 1, 4), (9, 16, 25), (36, 49, 64), (81,)]

    @pytest.mark.skipif(TORCH_IN_ORDER, reason="checks a torch older than 2.6 (the oldest-torch leg of .ci/run)")
    def test_false_with_workers_names_the_torch_it_needs(self):
        with pytest.raises(ValueError, match=r"in_order=False with num_workers > 0 needs torch 2.6 or later"):
            DataLoader(Squares(), batch_size=3, num_workers=2, in_order=False)

    def test_a_non_bool_is_refused(self):
        with pytest.raises(TypeError, match="in_order must be a bool, got str"):
            DataLoader(Squares(), in_order="no")


# -- 5. snapshot_every_n_steps ---------------------------------------------------------------------------


class TestSnapshotEveryNSteps:
    def test_accepted_and_kept(self):
        assert DataLoader(Squares()).snapshot_every_n_steps == 1  # torchdata's default
        assert DataLoader(Squares(), snapshot_every_n_steps=100).snapshot_every_n_steps == 100

    @pytest.mark.parametrize("value, error", [(0, ValueError), (-2, ValueError), (1.5, TypeError),
                                              ("2", TypeError), (True, TypeError)])
    def test_checked(self, value, error):
        with pytest.raises(error, match="snapshot_every_n_steps should be a positive integer value, but got "
                                        f"snapshot_every_n_steps={value}"):
            DataLoader(Squares(), snapshot_every_n_steps=value)

    @pytest.mark.parametrize("workers, steps", [(0, range(6)), (2, (1, 3))])
    def test_a_state_taken_at_any_step_resumes_exactly(self, workers, steps):
        def make():
            return DataLoader(Squares(), batch_size=2, shuffle=True, seed=7, num_workers=workers,
                              snapshot_every_n_steps=4)

        whole = lists(make())
        for k in steps:
            loader = make()
            it = iter(loader)
            head = [next(it).tolist() for _ in range(k)]
            state = pickle.loads(pickle.dumps(loader.state_dict()))
            it.close()
            again = make()
            again.load_state_dict(state)
            assert head + lists(again) == whole, f"resumed after {k} batches"


# -- 6. timeout ---------------------------------------------------------------------------------------


class TestTimeout:
    @pytest.mark.parametrize("workers", [0, 2])
    def test_a_runtime_error_with_torchs_phrase_and_a_timeout_error(self, workers):
        loader = DataLoader(Slow(1.0), batch_size=2, num_workers=workers, timeout=0.2)
        it = iter(loader)
        try:
            with pytest.raises(RuntimeError, match=r"DataLoader timed out after 0.2 seconds") as info:
                next(it)
        finally:
            it.close()
        assert isinstance(info.value, TimeoutError)
        assert "batch 0 did not arrive within timeout=0.2 s" in str(info.value)  # and ours says which


# -- 7. len() of an IterableDataset ------------------------------------------------------------------------


class TestLenOfAnIterableDataset:
    @pytest.mark.parametrize("kwargs", [{"batch_size": None}, {}, {"batch_size": 5},
                                        {"batch_size": 5, "drop_last": True}])
    def test_torchs_count_whatever_the_workers(self, kwargs):
        # the dataset splits itself across the workers: its len() is the whole, as torch counts it
        theirs = len(TorchDataLoader(SplitsItself(24), num_workers=3, **kwargs))
        assert len(DataLoader(SplitsItself(24), num_workers=3, **kwargs)) == theirs
        assert len(DataLoader(SplitsItself(24), **kwargs)) == theirs

    def test_the_24_items_with_workers(self):
        loader = DataLoader(SplitsItself(24), batch_size=None, num_workers=2)
        assert len(loader) == 24 and sorted(loader) == list(range(24))


# -- 8. the smaller ones ------------------------------------------------------------------------------------


class TestWorkerNumberWarning:
    def test_more_workers_than_cpus_warns_as_torch(self, monkeypatch):
        monkeypatch.setattr(tuning, "usable_cpus", lambda: 1)
        with pytest.warns(UserWarning, match="This DataLoader will create 2 worker processes in total. Our suggested "
                                             "max number of worker in current system is 1, which is smaller than what "
                                             "this DataLoader is going to create.") as record:
            DataLoader(Squares(), num_workers=2)
        assert record[0].filename == __file__  # pointing at the call

    def test_no_warning_within_the_cpus(self, monkeypatch):
        monkeypatch.setattr(tuning, "usable_cpus", lambda: 4)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            DataLoader(Squares(), num_workers=2)
            DataLoader(Squares(), num_workers=0)


class TestSetAfterInit:
    @pytest.mark.parametrize("attr", ["batch_size", "sampler", "batch_sampler", "drop_last", "dataset",
                                      "persistent_workers"])
    def test_refused_as_torch(self, attr):
        for loader in (DataLoader(Squares()), DataLoader(range(3), preprocessor=abs)):
            with pytest.raises(ValueError, match=f"^{attr} attribute should not be set after DataLoader is "
                                                 "initialized"):
                setattr(loader, attr, getattr(loader, attr))
        torch_loader = TorchDataLoader(Squares())
        with pytest.raises(ValueError, match=f"^{attr} attribute should not be set after DataLoader is initialized"):
            setattr(torch_loader, attr, getattr(torch_loader, attr))

    def test_other_attributes_may_be_set(self):
        loader = DataLoader(Squares())
        loader.note = "mine"
        assert lists(loader)[:2] == [[0], [1]]


class TestMultiprocessingContext:
    @pytest.mark.parametrize("kwargs", [
        {"num_workers": 2, "multiprocessing_context": "no-such-method"},
        {"num_workers": 2, "multiprocessing_context": 3},
        {"num_workers": 0, "multiprocessing_context": "fork"},
    ], ids=["unknown start method", "not a context", "without workers"])
    def test_refused_at_construction_as_torch(self, kwargs):
        theirs = torch_error(lambda loader: loader(Squares(), **kwargs))
        with pytest.raises(type(theirs)) as ours:
            DataLoader(Squares(), **kwargs)
        assert str(theirs) in str(ours.value)

    @pytest.mark.parametrize("context", ["fork", multiprocessing.get_context("fork")])
    def test_a_start_method_or_a_context(self, context):
        loader = DataLoader(Squares(4), batch_size=2, num_workers=2, multiprocessing_context=context)
        assert isinstance(loader.multiprocessing_context, multiprocessing.context.BaseContext)
        assert lists(loader) == [[0, 1], [4, 9]]


class TestNestedTensors:
    @pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
    def test_default_collate_refuses_them_with_torchs_message(self, layout):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch: nested tensors are a prototype
            nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=layout)
        theirs = torch_error(lambda loader: default_collate([nested, nested]))
        with pytest.raises(RuntimeError) as ours:
            collate([nested, nested])
        assert str(theirs) in str(ours.value)
        with pytest.raises(RuntimeError, match="Batches of nested tensors are not currently supported"):
            list(DataLoader([nested, nested], batch_size=2))

    def test_a_nested_tensor_after_the_first_sample_is_named(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
        with pytest.raises(RuntimeError, match=r"collate: field '\[0\]' \(sample 1\): Batches of nested tensors"):
            collate([(torch.zeros(2),), (nested,)])


class TestTorchsMessages:
    """Where torch's DataLoader refuses an argument, ours refuses it with the same type and torch's
    message in its own (so code that matches torch's message keeps working)."""

    @pytest.mark.parametrize("kwargs", [
        {"num_workers": -1},
        {"timeout": -1},
        {"batch_size": 0},
        {"batch_size": -3},
        {"batch_size": None, "drop_last": True},
        {"persistent_workers": True},
        {"prefetch_factor": 2},
        {"num_workers": 2, "prefetch_factor": -1},
        {"shuffle": True, "sampler": SequentialSampler(range(10))},
        {"batch_sampler": BatchSampler(SequentialSampler(range(10)), 2, False), "batch_size": 2},
        {"batch_sampler": BatchSampler(SequentialSampler(range(10)), 2, False), "drop_last": True},
        {"batch_sampler": BatchSampler(SequentialSampler(range(10)), 2, False), "shuffle": True},
        {"batch_sampler": BatchSampler(SequentialSampler(range(10)), 2, False),
         "sampler": RandomSampler(range(10))},
    ], ids=lambda kwargs: ",".join(kwargs))
    def test_map_style(self, kwargs):
        theirs = torch_error(lambda loader: loader(Squares(), **kwargs))
        with pytest.raises(type(theirs)) as ours:
            DataLoader(Squares(), **kwargs)
        assert str(theirs) in str(ours.value)
        assert str(ours.value).startswith("DataLoader: ")

    @pytest.mark.parametrize("kwargs", [{"shuffle": True}, {"sampler": SequentialSampler(range(3))},
                                        {"batch_sampler": BatchSampler(SequentialSampler(range(3)), 2, False)}],
                             ids=lambda kwargs: ",".join(kwargs))
    def test_iterable_dataset(self, kwargs):
        data = SplitsItself(3)
        theirs = torch_error(lambda loader: loader(data, **kwargs))
        with pytest.raises(type(theirs)) as ours:
            DataLoader(data, **kwargs)
        assert str(theirs) in str(ours.value)

    def test_worker_init_fn_without_workers_is_ignored_as_torch(self):
        calls = []
        loader = DataLoader(Squares(3), worker_init_fn=calls.append)
        assert lists(loader) == lists(TorchDataLoader(Squares(3), worker_init_fn=calls.append)) and calls == []


class TestPinMemoryDevice:
    def test_accepted_and_ignored_with_torchs_warning(self):
        assert DataLoader(Squares(), pin_memory_device="cuda").pin_memory_device == "cuda"  # no pinning: silent
        with pytest.warns(UserWarning, match="pin_memory_device is deprecated, the current accelerator will be used as "
                                             "the device,ignore pin_memory_device='cuda'"):
            DataLoader(Squares(), pin_memory=True, pin_memory_device="cuda", device="cpu")

    def test_a_non_str_is_refused(self):
        with pytest.raises(TypeError, match="pin_memory_device must be a str, got int"):
            DataLoader(Squares(), pin_memory_device=0)


# -- a wrong type where torch raises ValueError; torch's warning past an IterableDataset's len() -----


class TestWrongTypesAreValueErrorsToo:
    @pytest.mark.parametrize("kwargs, name", [({"batch_size": "8"}, "batch_size"), ({"drop_last": "yes"}, "drop_last")])
    def test_caught_as_torchs_value_error_and_as_our_type_error(self, kwargs, name):
        with pytest.raises(ValueError) as theirs:
            TorchDataLoader(Squares(), **kwargs)
        for kind in (ValueError, TypeError):
            with pytest.raises(kind) as ours:
                DataLoader(Squares(), **kwargs)
            assert str(theirs.value) in str(ours.value) and name in str(ours.value)


class Counted(IterableDataset):
    """Yields ``range(n)`` in every worker (it does not split itself), and says ``len() == n``."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


def _length_warnings(loader, read_len):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if read_len:
            len(loader)
        got = [b for b in loader]
    return got, [str(w.message) for w in caught if "Length of IterableDataset" in str(w.message)]


class TestPastTheLengthOfAnIterableDataset:
    @pytest.mark.parametrize("workers", [0, 2])
    def test_warns_as_torch_once_past_its_len_after_len_loader(self, workers):
        theirs = _length_warnings(TorchDataLoader(Counted(6), batch_size=None, num_workers=workers), True)[1]
        got, ours = _length_warnings(DataLoader(Counted(6), batch_size=None, num_workers=workers), True)
        assert len(got) == 6 * max(workers, 1)
        assert len(ours) == len(theirs) == (6 if workers else 0)
        if workers:
            assert [re.sub(r"<[^>]*>", "<dataset>", m) for m in ours] == [re.sub(r"<[^>]*>", "<dataset>", m)
                                                                           for m in theirs]
            assert "was reported to be 6(when accessing len(dataloader)), but 7 samples" in ours[0]
            assert "not properly configuring the IterableDataset replica at each worker" in ours[0]

    def test_silent_when_len_loader_was_not_read(self):
        assert _length_warnings(DataLoader(Counted(6), batch_size=None, num_workers=2), False)[1] == []

    def test_silent_for_a_pipe(self):
        pipe = IterableWrapper(range(6)).sharding_filter()
        assert _length_warnings(DataLoader(pipe, batch_size=None, num_workers=2), True)[1] == []
