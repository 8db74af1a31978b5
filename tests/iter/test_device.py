"""PinMemory [pin_memory], DeviceMover [to_device] and CudaMover [to_cuda].

Tests marked ``gpu`` need CUDA and skip cleanly without it; the others run everywhere (where they
depend on CUDA being absent they say so by patching ``torch.cuda.is_available``).
"""

import collections
import dataclasses
import pickle
import threading
import time
import warnings

import numpy as np
import pytest
import torch

import datapipes.iter.device as device_mod
from datapipes._runtime import passes as _pass
from datapipes.graph import stages
from datapipes.iter import CudaMover, DeviceMover, IterableWrapper, PinMemory
from datapipes.testing import check_datapipe, threads_started_since

from helpers import Guarded, error_of_pass, gc_off  # noqa: F401 - gc_off is a fixture

HAS_CUDA = torch.cuda.is_available()


def gpu(test):
    """Mark a test as needing CUDA: skipped cleanly without it."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")(test))


Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass
class Batch:
    image: torch.Tensor
    label: torch.Tensor
    name: list


def nested(i=0):
    """One item of every structure the stages walk, with tensors, an array and strings in it."""
    return {
        "t": torch.full((2, 3), float(i)),
        "tuple": (torch.arange(3) + i, "s"),
        "list": [torch.ones(2, dtype=torch.uint8), 7],
        "pair": Pair(torch.zeros(1), np.ones(2)),
        "batch": Batch(torch.full((1, 2), i, dtype=torch.int64), torch.tensor([i]), ["n"]),
    }


def plain(i=0):
    """As :func:`nested` without the dataclass (which the contract checker compares with ``==``)."""
    item = nested(i)
    del item["batch"]
    return item


def tensors_of(item):
    found = [item["t"], item["tuple"][0], item["list"][0], item["pair"].a]
    return found + [item["batch"].image, item["batch"].label] if "batch" in item else found


class CountingPipe:
    """A re-iterable source that records how many items were pulled."""

    def __init__(self, items):
        self.items = items
        self.pulled = 0

    def __iter__(self):
        for x in self.items:
            self.pulled += 1
            yield x


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget which one-time warnings this process has already given."""
    monkeypatch.setattr(device_mod, "_warned", set())


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def in_worker(monkeypatch):
    monkeypatch.setattr(device_mod, "get_worker_info", lambda: object())


@pytest.fixture
def fake_cuda(monkeypatch):
    """Pretend CUDA is there, so the pinning thread runs (with a custom pin_memory_fn) on any machine.

    The current device is 3; ``torch.cuda.set_device`` calls are recorded as ``(thread name, device)``
    in the list the fixture returns.
    """
    set_device_calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda device: set_device_calls.append((threading.current_thread().name, device)))
    return set_device_calls


@pytest.mark.usefixtures("no_thread_leak", "fresh_warnings")
class TestPinMemory:
    # -- where pinning is not available: pass-through with a one-time warning ---------------------------
    @pytest.mark.usefixtures("no_cuda")
    def test_passes_through_without_cuda_and_warns_once_per_process(self):
        items = [nested(i) for i in range(3)]
        pipe = IterableWrapper(items, deepcopy=False).pin_memory()
        with pytest.warns(RuntimeWarning, match=r"^PinMemory\(2\): pinning is skipped, items pass through unpinned: "
                                                r"CUDA is not available \(torch.cuda.is_available\(\) is False\)$") as record:
            first = list(pipe.map(lambda x: x))
        assert len(record) == 1 and record[0].filename == __file__  # points at the code running the pipe
        assert all(a is b for a, b in zip(first, items))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert list(pipe) == items  # a second pass: no second warning
            assert list(IterableWrapper(items, deepcopy=False).pin_memory(buffer_size=1)) == items  # nor from another pipe

    @pytest.mark.usefixtures("no_cuda")
    def test_pass_through_starts_no_thread(self):
        seen = []
        pipe = IterableWrapper(range(3)).map(lambda x: seen.append(threading.current_thread())).pin_memory()
        with pytest.warns(RuntimeWarning):
            list(pipe)
        assert seen == [threading.main_thread()] * 3 and pipe.stats is None

    @pytest.mark.usefixtures("fake_cuda", "in_worker")
    def test_passes_through_inside_a_dataloader_worker(self):
        pipe = IterableWrapper([torch.ones(1)]).pin_memory()
        with pytest.warns(RuntimeWarning, match="inside a DataLoader worker process; pin in the main process"):
            out = list(pipe)
        assert out[0].tolist() == [1.0]

    def test_real_dataloader_worker_passes_through(self):
        pipe = IterableWrapper([torch.full((2,), float(i)) for i in range(4)]).pin_memory()
        loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=1)
        assert [t.tolist() for t in loader] == [[float(i)] * 2 for i in range(4)]

    @pytest.mark.usefixtures("no_cuda")
    def test_contract_when_passing_through(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            pipe = IterableWrapper([torch.arange(2) + i for i in range(5)]).pin_memory()
            check_datapipe(pipe, expected=[torch.arange(2) + i for i in range(5)], build=lambda src: src.pin_memory())
            assert len(pipe) == 5 and repr(pipe) == "IterableWrapper -> PinMemory(2)"
            check_datapipe(IterableWrapper([]).pin_memory(), expected=[])

    # -- the pinning thread (run with a custom pin_memory_fn where there is no CUDA) -------------------
    @pytest.mark.usefixtures("fake_cuda")
    def test_pins_on_a_background_thread(self):
        names = []

        def pin(x):
            names.append(threading.current_thread().name)
            return x * 10

        pipe = IterableWrapper(range(6)).pin_memory(pin_memory_fn=pin, buffer_size=3)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = check_datapipe(pipe, expected=[x * 10 for x in range(6)], build=lambda src: src.pin_memory(lambda x: x))
        assert out == [0, 10, 20, 30, 40, 50]
        assert names and all(n == "datapipes PinMemory(3) producer" for n in names)
        assert list(pipe) == out and pipe.stats.items_out == 6 and pipe.stats.kind == "prefetch"

    @pytest.mark.usefixtures("fake_cuda")
    def test_buffer_bounds_how_far_pinning_runs_ahead(self):
        src = CountingPipe(list(range(100)))
        it = iter(IterableWrapper(src).pin_memory(pin_memory_fn=lambda x: x, buffer_size=2))
        for consumed in range(1, 21):
            next(it)
            assert consumed <= src.pulled <= consumed + 3  # buffer_size + the item being pinned
        time.sleep(0.02)
        assert src.pulled <= 23
        it.close()

    @pytest.mark.usefixtures("fake_cuda")
    def test_pin_fn_error_is_the_same_object_with_a_note(self):
        err = ValueError("cannot pin")

        def pin(x):
            if x == 2:
                raise err
            return x

        got = []
        with pytest.raises(ValueError) as info:
            for x in IterableWrapper(range(5)).pin_memory(pin):
                got.append(x)
        assert info.value is err and got == [0, 1]
        assert info.value.__notes__ == ["[datapipes] raised in stage PinMemory(2) at item 2"]

    @pytest.mark.usefixtures("fake_cuda")
    def test_upstream_error_passes_through_unchanged(self):
        err = KeyError("upstream")

        def gen():
            yield 1
            raise err

        with pytest.raises(KeyError) as info:
            list(IterableWrapper(gen()).pin_memory(lambda x: x))
        assert info.value is err and not getattr(err, "__notes__", [])

    @pytest.mark.usefixtures("fake_cuda")
    def test_early_close_stops_the_thread(self):
        it = iter(IterableWrapper(CountingPipe(list(range(1000)))).pin_memory(lambda x: x))
        next(it)
        it.close()
        for x in IterableWrapper(range(1000)).pin_memory(lambda x: x):
            break

    def test_pin_tensors_leaves_non_tensors_alone(self):
        item = {"a": np.zeros(2), "s": "x", "n": (1, None)}
        assert device_mod.pin_tensors(item) == {"a": item["a"], "s": "x", "n": (1, None)}

    def test_bad_arguments(self):
        src = IterableWrapper([1])
        with pytest.raises(TypeError, match="PinMemory: source_datapipe must be an IterDataPipe, got list"):
            PinMemory([1])
        with pytest.raises(TypeError, match="PinMemory: pin_memory_fn must be callable, got str"):
            src.pin_memory("yes")
        with pytest.raises(ValueError, match="^PinMemory\\(buffer_size=0\\): 'buffer_size' is required to be a positive integer.$"):
            src.pin_memory(buffer_size=0)
        with pytest.raises(TypeError, match="PinMemory: buffer_size must be an int, got float"):
            PinMemory(source_datapipe=src, buffer_size=2.0)

    # -- GPU -------------------------------------------------------------------------------------------
    @gpu
    def test_pins_nested_tensors(self):
        items = [nested(i) for i in range(4)]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            # deepcopy=False: what is kept (the numpy array, the strings) must be the source's own objects
            out = list(IterableWrapper(items, deepcopy=False).pin_memory())
        for i, (got, want) in enumerate(zip(out, items)):
            for g, w in zip(tensors_of(got), tensors_of(want)):
                assert g.is_pinned() and not w.is_pinned() and torch.equal(g, w)
            assert got["pair"].b is want["pair"].b and got["tuple"][1] == "s" and got["batch"].name == ["n"]
            assert type(got["pair"]) is Pair and type(got["batch"]) is Batch

    @gpu
    def test_pinned_and_cuda_tensors_are_left_as_they_are(self):
        pinned, on_gpu = torch.ones(3).pin_memory(), torch.ones(3, device="cuda")
        # deepcopy=False: a deep copy would be a new CUDA tensor and an unpinned host one (pinned again)
        [(a, b)] = list(IterableWrapper([(pinned, on_gpu)], deepcopy=False).pin_memory())
        assert a.data_ptr() == pinned.data_ptr() and b is on_gpu

    @gpu
    def test_contract_on_gpu(self):
        check_datapipe(IterableWrapper([torch.arange(3) + i for i in range(6)]).pin_memory(),
                       expected=[torch.arange(3) + i for i in range(6)], build=lambda src: src.pin_memory())


class FakeStream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_event(self, event):
        self.log.append(("wait", self.name, event.n))

    def wait_stream(self, other):
        self.log.append(("wait_stream", self.name, other.name))


class FakeEvent:
    count = 0

    def __init__(self, log):
        self.log = log
        FakeEvent.count += 1
        self.n = FakeEvent.count

    def record(self, stream):
        self.log.append(("record", stream.name, self.n))


class FakeCuda:
    """Stands in for the CUDA calls of DeviceMover's CUDA path, logging them; copies go to ``meta``."""

    def __init__(self):
        self.log = []
        self.current = None

    def Stream(self, device):  # noqa: N802 - torch.cuda's name
        self.log.append(("new stream", str(device)))
        return FakeStream(self.log, "copy")

    def stream(self, s):
        cuda = self

        class Ctx:
            def __enter__(self):
                cuda.current = s.name

            def __exit__(self, *exc):
                cuda.current = None

        return Ctx()

    def current_stream(self, device):
        return FakeStream(self.log, "consumer")

    def Event(self):  # noqa: N802
        return FakeEvent(self.log)

    def record_stream(self, t, stream):
        self.log.append(("record_stream", tuple(t.shape), stream.name))

    def pin(self, t):
        self.log.append(("pin", tuple(t.shape), self.current))
        return t


def cuda_path(items, fake, **kwargs):
    """Run DeviceMover's CUDA path over ``items`` with ``fake`` standing in for CUDA, to ``meta``."""
    pipe = DeviceMover(IterableWrapper(items), "cpu", **kwargs)
    return device_mod._move_cuda(pipe, torch.device("meta"), fake)


@pytest.mark.usefixtures("no_thread_leak")
class TestDeviceMover:
    def test_to_cpu_keeps_structure_and_tensors(self):
        probe = [torch.ones(1)] * 4
        check_datapipe(IterableWrapper([plain(i) for i in range(3)]).to_device("cpu", collate=False),
                       expected=[plain(i) for i in range(3)], build=lambda src: src.to_device("cpu", collate=False),
                       probe_data=probe)
        items = [nested(i) for i in range(3)]
        pipe = IterableWrapper(items, deepcopy=False).to_device("cpu", collate=False)
        for got, want in zip(pipe, items):
            assert all(g is w for g, w in zip(tensors_of(got), tensors_of(want)))  # already there: no copy
            assert type(got["pair"]) is Pair and type(got["batch"]) is Batch and got["pair"].b is want["pair"].b
            assert got["batch"].name == ["n"] and got["tuple"][1] == "s" and got["list"][1] == 7
        assert len(pipe) == 3 and repr(pipe) == "IterableWrapper -> DeviceMover('cpu')"
        check_datapipe(IterableWrapper([]).to_device("cpu"), expected=[])
        check_datapipe(IterableWrapper([torch.arange(2) + i for i in range(4)]).to_device("cpu"),
                       expected=[torch.arange(2) + i for i in range(4)], build=lambda src: src.to_device("cpu"),
                       probe_data=probe)

    def test_default_converts_an_item_without_stacking_it(self):
        items = [nested(i) for i in range(3)]
        for got, want in zip(DeviceMover(source_datapipe=IterableWrapper(items, deepcopy=False), device=torch.device("cpu")), items):
            assert all(g is w for g, w in zip(tensors_of(got), tensors_of(want)))  # a batch already: kept
            b = got["pair"].b
            assert type(b) is torch.Tensor and b.dtype == torch.float64 and b.tolist() == [1.0, 1.0]
            assert type(got["pair"]) is Pair and type(got["batch"]) is Batch and got["batch"].name == ["n"]
            assert got["tuple"][1] == "s" and got["list"][1] == 7 and type(got["list"][1]) is int

    def test_moves_tensors_to_another_device(self):
        out = list(IterableWrapper([nested(1)]).to_device("meta"))[0]
        assert all(t.device.type == "meta" for t in tensors_of(out))
        assert out["t"].shape == (2, 3) and out["list"][0].dtype == torch.uint8 and out["list"][1] == 7
        assert type(out["batch"]) is Batch and out["batch"].name == ["n"] and out["pair"].b.device.type == "meta"
        kept = list(IterableWrapper([nested(1)]).to_device("meta", collate=False))[0]
        assert all(t.device.type == "meta" for t in tensors_of(kept)) and isinstance(kept["pair"].b, np.ndarray)

    def test_runs_on_the_consumer_thread_without_threads(self):
        before = threading.active_count()
        for _ in IterableWrapper([torch.ones(1)] * 3).to_device("cpu"):
            assert threading.active_count() == before

    @pytest.mark.usefixtures("no_cuda")
    def test_cuda_device_without_cuda_raises_when_a_pass_starts(self):
        pipe = IterableWrapper([torch.ones(1)]).to_device("cuda:1")
        assert repr(pipe) == "IterableWrapper -> DeviceMover('cuda:1')"
        clone = pickle.loads(pickle.dumps(pipe))
        for p in (pipe, clone):
            with pytest.raises(RuntimeError, match=r"^DeviceMover: cannot copy to a CUDA device: CUDA is not available"):
                iter(p)
        assert IterableWrapper([1]).to_device(0).device == "cuda:0"

    @pytest.mark.usefixtures("fake_cuda", "in_worker")
    def test_cuda_device_inside_a_worker_raises(self):
        with pytest.raises(RuntimeError, match="DeviceMover: CUDA copies belong in the main process, but this pass "
                                               "runs inside a DataLoader worker process"):
            iter(IterableWrapper([1]).to_device("cuda"))
        assert list(IterableWrapper([torch.ones(1)]).to_device("cpu"))[0].tolist() == [1.0]  # the CPU is fine there

    def test_bad_arguments(self):
        src = IterableWrapper([1])
        with pytest.raises(TypeError, match="DeviceMover: source_datapipe must be an IterDataPipe, got list"):
            DeviceMover([1], "cpu")
        with pytest.raises(ValueError, match=r"DeviceMover: device 'gpu' is not a device"):
            src.to_device("gpu")
        with pytest.raises(TypeError, match="DeviceMover: device must be a str, an int or a torch.device, got NoneType"):
            src.to_device(None)
        with pytest.raises(TypeError, match="DeviceMover: device must be a str, an int or a torch.device, got float"):
            src.to_device(1.5)
        with pytest.raises(ValueError, match="DeviceMover: device index must be >= 0, got -1"):
            src.to_device(-1)
        with pytest.raises(TypeError, match="DeviceMover: non_blocking must be a bool, got str"):
            src.to_device("cpu", non_blocking="yes")
        with pytest.raises(TypeError, match="DeviceMover: collate must be a bool, got int"):
            src.to_device("cpu", collate=1)
        with pytest.raises(TypeError, match="positional"):
            src.to_device("cpu", True, False)  # collate is keyword-only

    # -- the CUDA path's logic, with the CUDA calls stood in for ------------------------------------------
    def test_cuda_path_copies_one_item_ahead_and_hands_over_with_an_event(self):
        fake = FakeCuda()
        src = CountingPipe([(torch.ones(2), "a"), (torch.zeros(3), "b"), (torch.ones(1), "c")])
        pipe = DeviceMover(IterableWrapper(src), "cpu")
        it = device_mod._move_cuda(pipe, torch.device("meta"), fake)
        first = next(it)
        assert src.pulled == 2  # the copy of item 1 was issued before item 0 was handed over
        assert first[0].device.type == "meta" and first[0].shape == (2,) and first[1] == "a"
        rest = list(it)
        assert [r[1] for r in rest] == ["b", "c"]
        e1, e2, e3 = (entry[2] for entry in fake.log if entry[0] == "record")
        assert fake.log == [
            ("new stream", "meta"),
            ("pin", (2,), "copy"), ("record", "copy", e1),  # CPU tensors are pinned, then copied
            ("pin", (3,), "copy"), ("record", "copy", e2),
            ("wait", "consumer", e1), ("record_stream", (2,), "consumer"),
            ("pin", (1,), "copy"), ("record", "copy", e3),
            ("wait", "consumer", e2), ("record_stream", (3,), "consumer"),
            ("wait", "consumer", e3), ("record_stream", (1,), "consumer"),
        ]

    def test_cuda_path_copies_on_its_stream(self):
        fake = FakeCuda()
        streams = []
        real_to = torch.Tensor.to

        class Probe(torch.Tensor):
            def to(self, *args, **kwargs):
                streams.append(fake.current)
                return real_to(torch.Tensor(self), *args, **kwargs)

        list(cuda_path([{"x": torch.ones(1).as_subclass(Probe)}], fake))
        assert streams == ["copy"]

    def test_cuda_path_items_without_tensors_and_empty_source(self):
        got = []
        with pytest.raises(TypeError, match=r"^DeviceMover\('cpu'\): item 1 has no tensor to move to cpu: found "
                                            r"list of str; it holds no tensor even after conversion") as info:
            for x in cuda_path([[torch.ones(2), torch.zeros(2)], ["a", "b"], [torch.ones(2)]], FakeCuda()):
                got.append(x)
        assert len(got) == 1 and got[0].shape == (2, 2)  # the item before is handed over first
        assert not getattr(info.value, "__notes__", [])  # the message names the stage and item already
        with pytest.raises(TypeError, match=r"item 0 has no tensor to move to cpu: found NoneType; with collate=False"):
            list(cuda_path([None], FakeCuda(), collate=False))
        assert list(cuda_path([], FakeCuda())) == []

    def test_cuda_path_pins_only_unpinned_cpu_tensors_of_non_blocking_copies(self):
        fake = FakeCuda()
        list(cuda_path([(torch.ones(2), torch.ones(3, device="meta"))], fake))
        assert [e for e in fake.log if e[0] == "pin"] == [("pin", (2,), "copy")]  # not the one already there
        fake = FakeCuda()
        list(cuda_path([torch.ones(2)], fake, non_blocking=False))
        assert not [e for e in fake.log if e[0] == "pin"]  # a blocking copy gains nothing from pinning

    def test_pin_host_skips_pinned_tensors(self):
        class Host:
            def __init__(self, pinned):
                self.pinned, self.copies = pinned, 0

            def is_pinned(self):
                return self.pinned

            def pin_memory(self):
                self.copies += 1
                return Host(True)

        pinned, pageable = Host(True), Host(False)
        assert device_mod._pin_host(pinned) is pinned and pinned.copies == 0
        out = device_mod._pin_host(pageable)
        assert out.pinned and pageable.copies == 1

    def test_cuda_path_collates_on_the_consumer_stream_before_copying(self):
        fake = FakeCuda()
        streams = []
        pipe = DeviceMover(IterableWrapper([[np.zeros(2), np.ones(2)]]), "cpu")
        real_walk = pipe._walk
        pipe._walk = lambda x, fn: (streams.append(fake.current), real_walk(x, fn))[1]
        [out] = list(device_mod._move_cuda(pipe, torch.device("meta"), fake))
        assert streams == [None] and out.shape == (2, 2) and out.device.type == "meta"
        assert [e for e in fake.log if e[0] == "pin"] == [("pin", (2, 2), "copy")]

    def test_cuda_path_hands_over_copied_items_before_a_source_error(self):
        err = ValueError("source")

        def gen():
            yield torch.ones(1)
            yield torch.ones(2)
            raise err

        got = []
        with pytest.raises(ValueError) as info:
            for x in cuda_path(gen(), FakeCuda()):
                got.append(x.shape)
        assert info.value is err and got == [(1,), (2,)] and not getattr(err, "__notes__", [])

    def test_cuda_path_copy_error_names_the_item(self):
        class Bad:
            pass

        @dataclasses.dataclass
        class Holder:
            t: torch.Tensor

        def explode(self, *args, **kwargs):
            raise RuntimeError("copy failed")

        bad = torch.ones(1).as_subclass(type("Exploding", (torch.Tensor,), {"to": explode}))
        got = []
        with pytest.raises(RuntimeError, match="copy failed") as info:
            for x in cuda_path([Holder(torch.ones(1)), Holder(bad)], FakeCuda()):
                got.append(x)
        assert len(got) == 1 and got[0].t.device.type == "meta"
        assert info.value.__notes__ == ["[datapipes] raised in stage DeviceMover('cpu') at item 1"]

    def test_cuda_path_stops_cleanly_when_closed(self):
        src = CountingPipe([torch.ones(1)] * 10)
        it = device_mod._move_cuda(DeviceMover(IterableWrapper(src), "cpu"), torch.device("meta"), FakeCuda())
        next(it)
        it.close()
        assert src.pulled == 2

    # -- GPU -------------------------------------------------------------------------------------------
    @gpu
    def test_to_cuda_device_values_and_structure(self):
        check_datapipe(IterableWrapper([plain(i) for i in range(3)]).to_device("cuda"),
                       build=lambda src: src.to_device("cuda"), probe_data=[torch.ones(1)] * 4)
        items = [nested(i) for i in range(3)]
        for got, want in zip(IterableWrapper(items).to_device("cuda"), items):
            for g, w in zip(tensors_of(got), tensors_of(want)):
                assert g.is_cuda and torch.equal(g.cpu(), w)
            assert type(got["batch"]) is Batch and got["pair"].b.is_cuda and got["pair"].b.tolist() == [1.0, 1.0]
        # deepcopy=False: with collate=False the numpy array is kept, the source's own object
        for got, want in zip(IterableWrapper(items, deepcopy=False).to_device("cuda", collate=False), items):
            assert got["pair"].b is want["pair"].b and got["t"].is_cuda

    @gpu
    def test_back_to_cpu_is_blocking_and_correct(self):
        src = [torch.arange(1_000_000, device="cuda") + i for i in range(3)]
        out = list(IterableWrapper(src).to_device("cpu"))
        assert all(o.device.type == "cpu" and int(o[-1]) == 999_999 + i for i, o in enumerate(out))


@pytest.mark.usefixtures("no_thread_leak", "fresh_warnings")
class TestCudaMover:
    @pytest.mark.usefixtures("no_cuda")
    def test_builds_and_pickles_without_cuda_then_raises_clearly(self):
        pipe = IterableWrapper([torch.ones(1)]).to_cuda()
        assert isinstance(pipe, DeviceMover) and pipe.device is None and len(pipe) == 1
        assert repr(pipe) == "IterableWrapper -> CudaMover(None)"
        clone = pickle.loads(pickle.dumps(pipe))
        for p in (pipe, clone, CudaMover(IterableWrapper([1]), device="cuda:1", non_blocking=False)):
            with pytest.raises(RuntimeError, match=r"^CudaMover: cannot copy to a CUDA device: CUDA is not available "
                                                   r"\(torch.cuda.is_available\(\) is False\); use to_device\('cpu'\)"):
                list(p)

    @pytest.mark.usefixtures("fake_cuda", "in_worker")
    def test_inside_a_worker_raises(self):
        with pytest.raises(RuntimeError, match="CudaMover: CUDA copies belong in the main process"):
            iter(IterableWrapper([1]).to_cuda())

    @pytest.mark.skipif(HAS_CUDA, reason="checks the error raised where there is no CUDA")
    def test_real_dataloader_worker_without_cuda(self):
        loader = torch.utils.data.DataLoader(IterableWrapper([1]).to_cuda(), batch_size=None, num_workers=1)
        it = iter(loader)
        try:
            with pytest.raises(RuntimeError, match="CudaMover: CUDA copies belong in the main process"):
                next(it)
        finally:
            it._shutdown_workers()  # at once: collecting the failed iterator waits 5 s for its worker

    def test_devices(self):
        src = IterableWrapper([1])
        assert src.to_cuda(1).device == "cuda:1" and src.to_cuda("cuda").device == "cuda"
        assert src.to_cuda(torch.device("cuda", 2)).device == "cuda:2"
        with pytest.raises(ValueError, match=r"CudaMover: device must be a CUDA device, got 'cpu'; use to_device\('cpu'\)"):
            src.to_cuda("cpu")
        with pytest.raises(TypeError, match="CudaMover: non_blocking must be a bool, got int"):
            src.to_cuda(non_blocking=1)
        with pytest.raises(TypeError, match="CudaMover: source_datapipe must be an IterDataPipe, got list"):
            CudaMover([1])

    # -- GPU -------------------------------------------------------------------------------------------
    @gpu
    def test_pin_then_cuda_values(self):
        check_datapipe(IterableWrapper([plain(i) for i in range(5)]).pin_memory().to_cuda(),
                       build=lambda src: src.pin_memory().to_cuda(), probe_data=[torch.ones(1)] * 4)
        items = [nested(i) for i in range(5)]
        for got, want in zip(IterableWrapper(items).pin_memory().to_cuda(), items):
            for g, w in zip(tensors_of(got), tensors_of(want)):
                assert g.device == torch.device("cuda", torch.cuda.current_device()) and torch.equal(g.cpu(), w)

    @gpu
    def test_consumer_kernel_right_away_sees_the_copied_values(self):
        # Large pinned batches and a kernel launched at once on the consumer's stream: without the event
        # the sum could read memory the copy has not written yet; without record_stream a freed batch's
        # memory could be reused for the next copy while the consumer still reads it.
        # deepcopy=False: the copies start from these pinned batches; a deep copy would be unpinned
        # memory, pinned again by to_cuda, and so not the case this test is about.
        n = 1 << 24
        batches = [torch.full((n,), float(i)).pin_memory() for i in range(8)]
        sums = [float(b.sum(dtype=torch.float64)) for b in IterableWrapper(batches, deepcopy=False).to_cuda()]
        assert sums == [float(i) * n for i in range(8)]
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            sums = [(b * 2).sum(dtype=torch.float64) for b in IterableWrapper(batches, deepcopy=False).to_cuda()]
        side.synchronize()
        assert [float(s) for s in sums] == [2.0 * i * n for i in range(8)]

    @gpu
    def test_copies_on_a_dedicated_stream_that_the_consumer_waits_on(self, monkeypatch):
        copy_streams, waits, records = [], [], []
        real_to, real_wait, real_record = torch.Tensor.to, torch.cuda.Stream.wait_event, torch.Tensor.record_stream

        def to(self, *args, **kwargs):
            copy_streams.append(torch.cuda.current_stream())
            return real_to(self, *args, **kwargs)

        def wait_event(self, event):
            waits.append(self)
            return real_wait(self, event)

        def record_stream(self, stream):
            records.append(stream)
            return real_record(self, stream)

        monkeypatch.setattr(torch.Tensor, "to", to)
        monkeypatch.setattr(torch.cuda.Stream, "wait_event", wait_event)
        monkeypatch.setattr(torch.Tensor, "record_stream", record_stream)
        consumer = torch.cuda.current_stream()
        out = list(IterableWrapper([(torch.ones(4), torch.zeros(2)) for _ in range(3)]).to_cuda())
        assert len(out) == 3 and all(a.is_cuda and b.is_cuda for a, b in out)
        assert len(copy_streams) == 6 and len(set(copy_streams)) == 1 and copy_streams[0] != consumer
        assert waits == [consumer] * 3 and records == [consumer] * 6

    @gpu
    def test_one_item_ahead_on_gpu(self):
        src = CountingPipe([torch.ones(2) * i for i in range(5)])
        it = iter(IterableWrapper(src).to_cuda())
        assert next(it).is_cuda and src.pulled == 2
        it.close()


# -- collate=True: what to_device / to_cuda turn into tensors ---------------------------------------------


def sample(i):
    return {"image": np.full((2, 3), i, np.uint8), "label": i, "id": f"s{i}"}


@pytest.mark.usefixtures("no_thread_leak")
class TestConversion:
    def test_batch_of_samples_becomes_batched_tensors(self):
        out = list(IterableWrapper(range(5)).map(sample).batch(2).to_device("cpu"))
        assert len(out) == 3 and [b["id"] for b in out] == [["s0", "s1"], ["s2", "s3"], ["s4"]]
        first = out[0]
        assert type(first["image"]) is torch.Tensor and first["image"].shape == (2, 2, 3)
        assert first["image"].dtype == torch.uint8 and first["image"][1].tolist() == [[1] * 3] * 2
        assert first["label"].tolist() == [0, 1] and first["label"].dtype == torch.int64
        assert out[2]["image"].shape == (1, 2, 3)

    def test_same_as_collate_then_to_device_with_collate_off(self):
        pipe = IterableWrapper(range(6)).map(lambda i: (np.full(2, i, np.float32), i, float(i))).batch(3)
        ours = list(pipe.to_device("cpu"))
        theirs = list(pipe.collate().to_device("cpu", collate=False))
        assert len(ours) == len(theirs) == 2
        for a, b in zip(ours, theirs):
            assert type(a) is list and all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(a, b))

    def test_a_batch_already_collated_is_not_stacked_again(self):
        # samples that are lists of two same-shaped arrays: collate() makes [images, masks], a list that
        # stacking again would silently turn into one (2, batch, ...) tensor
        pipe = IterableWrapper(range(4)).map(lambda i: [np.full(3, i), np.full(3, -i)]).batch(2).collate()
        for mover in (pipe.to_device("cpu"), pipe.pin_memory().to_device("cpu")):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # pin_memory without CUDA
                out = list(mover)
            assert [type(b) for b in out] == [list, list]
            images, masks = out[1]
            assert images.shape == (2, 3) and images[:, 0].tolist() == [2, 3] and masks[:, 0].tolist() == [-2, -3]

    def test_tensors_and_dicts_of_tensors_pass_as_they_are(self):
        t, d = torch.arange(6).reshape(2, 3), {"x": torch.ones(2, 2), "n": torch.tensor([1, 2])}
        out = list(IterableWrapper([t, d, (t, "a")], deepcopy=False).to_device("cpu"))
        assert out[0] is t and out[1]["x"] is d["x"] and out[1]["n"] is d["n"] and out[2][0] is t

    def test_batches_of_collated_batches_are_stacked(self):
        # a batch() after collate() makes lists of samples again: those are collated
        pipe = IterableWrapper(range(8)).map(lambda i: {"x": torch.full((3,), i)}).batch(2).collate().batch(2)
        out = list(pipe.to_device("cpu"))
        assert len(out) == 2 and out[0]["x"].shape == (2, 2, 3) and out[1]["x"][1, 1, 0].item() == 7

    def test_the_dataloader_batches_are_collated_once(self):
        from datapipes import DataLoader

        samples = IterableWrapper([[np.full(2, i), np.full(2, 10 * i)] for i in range(4)])
        batches = list(DataLoader(samples, batch_size=2, device="cpu"))
        assert [type(b) for b in batches] == [list, list]
        assert batches[1][0].tolist() == [[2, 2], [3, 3]] and batches[1][1].tolist() == [[20, 20], [30, 30]]

    def test_numpy_values_become_tensors(self):
        read_only = np.arange(3)
        read_only.flags.writeable = False
        items = [np.arange(4)[::-1], read_only, {"s": np.float32(1.5), "names": np.array(["a", "b"])}]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a read-only array is copied, not aliased with a warning
            out = list(IterableWrapper(items, deepcopy=False).to_device("cpu"))
        assert out[0].tolist() == [3, 2, 1, 0] and out[1].tolist() == [0, 1, 2]
        out[1][0] = 9
        assert read_only[0] == 0
        assert out[2]["s"].dtype == torch.float32 and out[2]["s"].item() == 1.5
        assert isinstance(out[2]["names"], np.ndarray)  # strings have no tensor: left as they are
        writable = np.zeros(2)
        assert np.shares_memory(list(IterableWrapper([writable], deepcopy=False).to_device("cpu"))[0].numpy(), writable)  # no copy

    def test_items_without_any_tensor_raise_naming_stage_item_and_type(self):
        got = []
        with pytest.raises(TypeError, match=r"^DeviceMover\('cpu'\): item 1 has no tensor to move to cpu: found "
                                            r"NoneType; it holds no tensor even after conversion") as info:
            for x in IterableWrapper([torch.ones(1), None, torch.ones(1)]).to_device("cpu"):
                got.append(x)
        assert len(got) == 1 and not getattr(info.value, "__notes__", [])
        cases = [
            (IterableWrapper(["a", "b", "c"]).batch(2).to_device("cpu"), "item 0 .* found list of str"),
            (IterableWrapper([3]).to_device("cpu"), "item 0 .* found int"),
            (IterableWrapper([{"id": "a", "path": "p"}]).to_device("cpu"), r"found dict with keys \['id', 'path'\]"),
            (IterableWrapper([np.zeros(2)]).to_device("cpu", collate=False), "found numpy.ndarray; with collate=False"),
            (IterableWrapper([[1, 2]]).to_device("cpu", collate=False), "found list of int; with collate=False"),
        ]
        for pipe, message in cases:
            with pytest.raises(TypeError, match=message):
                list(pipe)

    def test_collate_errors_keep_their_type_with_a_note(self):
        pipe = IterableWrapper([{"y": 1}, {"y": 2}, {"y": 3}, {"y": "x"}]).batch(2).to_device("cpu")
        with pytest.raises(TypeError, match=r"collate: field 'y' \(sample 1\): str differs from int") as info:
            list(pipe)
        assert info.value.__notes__ == ["[datapipes] raised in stage DeviceMover('cpu') at item 1"]
        with pytest.raises(TypeError, match="numpy array of dtype datetime64") as info:
            list(IterableWrapper([np.array(["2020-01-01"], dtype="datetime64[D]")]).to_device("cpu"))
        assert info.value.__notes__ == ["[datapipes] raised in stage DeviceMover('cpu') at item 0"]

    def test_upstream_errors_pass_unchanged(self):
        err = KeyError("upstream")

        def gen():
            yield [np.zeros(1)]
            raise err

        with pytest.raises(KeyError) as info:
            list(IterableWrapper(gen()).to_device("cpu"))
        assert info.value is err and not getattr(err, "__notes__", [])

    def test_collate_method_is_not_hidden_by_the_flag(self):
        mover = IterableWrapper([[torch.ones(2)], [torch.zeros(2)]]).to_device("cpu", collate=False)
        assert mover.collate().__class__.__name__ == "Collator"
        assert pickle.loads(pickle.dumps(mover))._collate is False

    def test_cuda_mover_takes_the_flag(self):
        assert IterableWrapper([1]).to_cuda(collate=False)._collate is False
        assert IterableWrapper([1]).to_cuda()._collate is True
        with pytest.raises(TypeError, match="CudaMover: collate must be a bool, got str"):
            IterableWrapper([1]).to_cuda(collate="no")


# -- handing items from one thread to another downstream of a CUDA mover ----------------------------------


class RecordingOps:
    """A StreamOps double: logs ``(thread name, call, argument)``; events are numbers."""

    def __init__(self):
        self.log = []
        self.lock = threading.Lock()
        self.events = 0

    def _add(self, *entry):
        with self.lock:
            self.log.append((threading.current_thread().name, *entry))

    def bind(self):
        self._add("bind", None)
        return self

    def enter_thread(self):
        self._add("enter", None)

    def record(self):
        with self.lock:
            self.events += 1
            event = self.events
        self._add("record", event)
        return event

    def wait(self, event):
        self._add("wait", event)

    def mark_used(self, item):
        self._add("mark", ident(item))


def ident(item):
    """The number an item of these tests carries."""
    while isinstance(item, tuple):
        item = item[0]
    return int(item.reshape(-1)[0])


def recorded_mover(n=6, ops=None):
    mover = IterableWrapper([torch.tensor([i]) for i in range(n)]).to_device("cpu")
    mover._handover_ops = ops if ops is not None else RecordingOps()
    return mover, mover._handover_ops


MAIN = threading.main_thread().name


def entries(log, call):
    return [e for e in log if e[1] == call]


@pytest.mark.usefixtures("no_thread_leak")
class TestHandOver:
    def test_found_when_built_through_other_stages_and_stopped_by_a_cpu_mover(self):
        mover, ops = recorded_mover()
        assert device_mod.cuda_upstream(mover.map(lambda x: x).batch(2).prefetch(1)) is mover
        assert mover.map(lambda x: x).prefetch(2)._crossing_ops is ops
        assert mover.to_device("cpu").prefetch(2)._crossing_ops is None  # back on the host
        assert IterableWrapper(range(3)).prefetch(2)._crossing_ops is None
        assert IterableWrapper([1]).to_cuda()._handover_ops.device is None
        assert isinstance(IterableWrapper([1]).to_device("cuda:1")._handover_ops, device_mod.CudaStreamOps)
        assert IterableWrapper([1]).to_device("cpu")._handover_ops is None
        assert IterableWrapper([1]).to_device("cpu").map(abs, concurrency=2)._crossing_ops is None

    def test_prefetch_records_on_the_producer_and_waits_on_the_consumer(self):
        mover, ops = recorded_mover()
        pipe = mover.prefetch(2)
        assert [ident(x) for x in pipe] == list(range(6))
        log = ops.log
        producer = "datapipes Prefetcher(2) producer"
        assert log[0] == (MAIN, "bind", None)
        assert [e for e in log if e[0] == producer][0] == (producer, "enter", None)  # before it pulls anything
        records = entries(log, "record")
        assert [e[0] for e in records] == [producer] * 6 and [e[2] for e in records] == list(range(1, 7))
        assert [e[0] for e in entries(log, "wait") + entries(log, "mark")] == [MAIN] * 12
        for i, event in enumerate(range(1, 7)):
            r, w = log.index((producer, "record", event)), log.index((MAIN, "wait", event))
            m = log.index((MAIN, "mark", i))
            assert r < w < m  # recorded by the sender, then waited on and marked by the receiver

    @pytest.mark.parametrize("ordered", [True, False])
    def test_concurrent_map_hands_over_both_ways(self, ordered):
        mover, ops = recorded_mover(8)

        def fn(x):
            time.sleep(0.001 * (7 - ident(x)) / 2)  # later items finish first: completion order differs
            ops._add("fn", ident(x))
            return x * 10

        out = list(mover.map(fn, concurrency=3, ordered=ordered))
        assert sorted(ident(y) for y in out) == [10 * i for i in range(8)]
        if ordered:
            assert [ident(y) for y in out] == [10 * i for i in range(8)]
        log = ops.log
        assert log[0] == (MAIN, "bind", None)
        workers = {e[0] for e in log if e[1] == "fn"}
        for worker in workers:  # each worker thread sets its device once, before its first item
            mine = [e[1] for e in log if e[0] == worker]
            assert mine[0] == "enter" and mine.count("enter") == 1
        for i in range(8):
            fn_at = log.index(next(e for e in log if e[1:] == ("fn", i)))
            worker = log[fn_at][0]
            assert worker != MAIN
            mine = [(k, e[1:]) for k, e in enumerate(log) if e[0] == worker]  # the worker's own calls, in order
            j = mine.index((fn_at, ("fn", i)))
            (_, (w, event_in)), (_, mark_in), (back_at, (r, event_out)) = mine[j - 2], mine[j - 1], mine[j + 1]
            # consumer -> worker: recorded on the consumer, then waited on and marked by the worker before fn
            assert w == "wait" and mark_in == ("mark", i) and log.index((MAIN, "record", event_in)) < fn_at
            # worker -> consumer: recorded by the worker after fn, then waited on and marked by the consumer
            assert r == "record"
            got = log.index((MAIN, "wait", event_out))
            assert back_at < got and (MAIN, "mark", 10 * i) in log[got + 1:]
            consumer = [e[1:] for e in log if e[0] == MAIN]
            assert consumer[consumer.index(("wait", event_out)) + 1] == ("mark", 10 * i)

    def test_async_map_hands_over_on_the_loop_thread(self):
        mover, ops = recorded_mover(4)

        async def fn(x):
            ops._add("fn", ident(x))
            return x + 100

        assert [ident(y) for y in mover.map(fn, concurrency=2)] == [100, 101, 102, 103]
        loop_thread = next(e[0] for e in ops.log if e[1] == "fn")
        assert loop_thread != MAIN
        assert {e[0] for e in entries(ops.log, "wait")} == {MAIN, loop_thread}
        assert not entries(ops.log, "enter")  # the shared event loop thread keeps its device
        assert len(entries(ops.log, "record")) == 8 and len(entries(ops.log, "wait")) == 8

    def test_seeded_and_column_maps_still_work(self):
        mover, ops = recorded_mover(4)
        pipe = mover.map(lambda x: (x, 0)).map(lambda v, rng: v + rng.randint(0, 0), input_col=0, rng="python",
                                                concurrency=2, timeout=5)
        assert [ident(y) for y in pipe.set_seed(1)] == [0, 1, 2, 3]
        assert len(entries(ops.log, "wait")) == 8

    def test_serial_stages_do_no_hand_over(self):
        mover, ops = recorded_mover(3)
        assert [ident(y) for y in mover.map(lambda x: x + 1).batch(1).collate()] == [1, 2, 3]
        assert ops.log == []

    def test_process_executor_downstream_raises_when_built(self):
        from concurrent.futures import ProcessPoolExecutor

        mover, _ = recorded_mover(2)
        with pytest.raises(ValueError, match=r"^Mapper: executor='process' cannot run downstream of "
                                             r"DeviceMover\('cpu'\): CUDA tensors are not sent to worker processes"):
            mover.map(abs, concurrency=2, executor="process")
        with ProcessPoolExecutor(1) as pool:
            with pytest.raises(ValueError, match="cannot run downstream of DeviceMover"):
                mover.batch(1).map(abs, concurrency=2, executor=pool)
        IterableWrapper([1]).to_device("cpu").map(abs, concurrency=2, executor="process")  # no CUDA mover: fine

    def test_errors_and_early_close_through_the_hand_over(self):
        err = ValueError("boom")

        def fn(x):
            if ident(x) == 2:
                raise err
            return x

        mover, _ = recorded_mover(6)
        with pytest.raises(ValueError) as info:
            list(mover.map(fn, concurrency=2))
        assert info.value is err and info.value.__notes__[-1].endswith("at item 2")
        out = list(recorded_mover(6)[0].map(fn, concurrency=2, on_error="skip"))
        assert [ident(x) for x in out] == [0, 1, 3, 4, 5]
        for pipe in (recorded_mover(100)[0].prefetch(2), recorded_mover(100)[0].map(fn, concurrency=2)):
            it = iter(pipe)
            next(it)
            it.close()
        upstream = KeyError("upstream")

        def gen():
            yield torch.tensor([0])
            raise upstream

        mover = IterableWrapper(gen()).to_device("cpu")
        mover._handover_ops = RecordingOps()
        with pytest.raises(KeyError) as info:
            list(mover.prefetch(1))
        assert info.value is upstream

    @pytest.mark.usefixtures("fake_cuda")
    def test_pin_memory_after_a_cuda_mover_hands_over_too(self, fake_cuda):
        mover, ops = recorded_mover(3)
        out = list(mover.pin_memory(pin_memory_fn=lambda x: x + 1))
        assert [ident(x) for x in out] == [1, 2, 3]
        producer = "datapipes PinMemory(2) producer"
        assert [e[0] for e in entries(ops.log, "record")] == [producer] * 3
        assert [e[2] for e in entries(ops.log, "mark")] == [1, 2, 3]  # the pinned items
        assert fake_cuda == [(producer, 3)]

    def test_cuda_stream_ops_without_cuda_do_nothing(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        bound = device_mod.CudaStreamOps("cuda:0").bind()
        bound.enter_thread()
        bound.wait(bound.record())
        bound.mark_used(torch.ones(1))
        assert repr(device_mod.CudaStreamOps(None)) == "CudaStreamOps(None)"
        # the mover upstream is the one that says CUDA is missing
        with pytest.raises(RuntimeError, match="CudaMover: cannot copy to a CUDA device"):
            list(IterableWrapper([torch.ones(1)]).to_cuda().prefetch(1))


@pytest.mark.usefixtures("no_thread_leak", "fresh_warnings")
class TestPinThreadDevice:
    def test_pinning_thread_sets_the_consumers_device_first(self, fake_cuda):
        seen = []

        def pin(x):
            seen.append((threading.current_thread().name, list(fake_cuda)))
            return x

        assert list(IterableWrapper(range(3)).pin_memory(pin)) == [0, 1, 2]
        producer = "datapipes PinMemory(2) producer"
        assert fake_cuda == [(producer, 3)]  # the consumer's current device, set on the pinning thread
        assert all(name == producer and calls == [(producer, 3)] for name, calls in seen)  # before any pin


# -- GPU: the real CUDA path ------------------------------------------------------------------------


@pytest.mark.usefixtures("no_thread_leak")
class TestGpuPath:
    @gpu
    def test_batched_chain_ends_on_cuda(self):
        pipe = IterableWrapper(range(64)).map(lambda i: (np.full((3, 4), i, np.float32), i)).batch(32).to_cuda()
        out = list(pipe)
        assert len(out) == 2
        for k, (images, labels) in enumerate(out):
            assert images.is_cuda and labels.is_cuda and images.shape == (32, 3, 4) and labels.dtype == torch.int64
            assert labels.tolist() == list(range(32 * k, 32 * k + 32))
            assert images[:, 0, 0].tolist() == [float(i) for i in range(32 * k, 32 * k + 32)]

    @gpu
    def test_auto_pins_the_source_before_the_copy(self, monkeypatch):
        pinned_at_copy = []
        real_to = torch.Tensor.to

        def to(self, *args, **kwargs):
            if self.device.type == "cpu":
                pinned_at_copy.append((self.is_pinned(), kwargs.get("non_blocking")))
            return real_to(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", to)
        # deepcopy=False throughout: to_cuda itself must pin a copy and leave the source's tensors
        # unpinned, and take the source's pinned tensors as they are (a deep copy would be unpinned)
        src = [torch.full((1000,), float(i)) for i in range(3)]
        out = list(IterableWrapper(src, deepcopy=False).to_cuda())
        assert pinned_at_copy == [(True, True)] * 3 and not any(t.is_pinned() for t in src)
        assert [float(o.sum()) for o in out] == [0.0, 1000.0, 2000.0]
        pinned_at_copy.clear()
        list(IterableWrapper(src, deepcopy=False).to_cuda(non_blocking=False))
        assert pinned_at_copy == [(False, False)] * 3
        pinned_at_copy.clear()
        already = [t.pin_memory() for t in src]
        ptrs = []
        monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: (ptrs.append(self.data_ptr()), real_to(self, *a, **k))[1])
        list(IterableWrapper(already, deepcopy=False).to_cuda(collate=False))
        assert ptrs == [t.data_ptr() for t in already]  # already pinned: not pinned again

    @gpu
    def test_prefetch_and_threads_after_to_cuda_under_a_consumer_side_stream(self, monkeypatch):
        n = 1 << 22
        batches = [torch.full((n,), float(i)) for i in range(8)]
        side = torch.cuda.Stream()
        waits = []
        real_wait = torch.cuda.Stream.wait_event

        def wait_event(self, event):
            waits.append((threading.current_thread().name, self == side))
            return real_wait(self, event)

        monkeypatch.setattr(torch.cuda.Stream, "wait_event", wait_event)
        for build, factor in ((lambda p: p.prefetch(2), 2.0), (lambda p: p.map(lambda b: b * 3, concurrency=2), 6.0)):
            waits.clear()
            with torch.cuda.stream(side):
                sums = [(b * 2).sum(dtype=torch.float64) for b in build(IterableWrapper(batches).to_cuda())]
            side.synchronize()
            assert [float(s) for s in sums] == [factor * i * n for i in range(8)]
            assert (MAIN, True) in waits  # the consumer's side stream waited before it read a batch
            assert any(name != MAIN for name, _ in waits)  # and another thread's stream waited too

    @gpu
    def test_pin_thread_sets_the_device(self, monkeypatch):
        calls = []
        real = torch.cuda.set_device
        monkeypatch.setattr(torch.cuda, "set_device",
                            lambda d: (calls.append((threading.current_thread().name, d)), real(d))[1])
        out = list(IterableWrapper([torch.ones(2)] * 3).pin_memory())
        assert all(t.is_pinned() for t in out)
        assert calls == [("datapipes PinMemory(2) producer", torch.cuda.current_device())]

    @gpu
    def test_cuda_stream_ops_wait_on_the_calling_threads_stream(self):
        ops = device_mod.CudaStreamOps(None).bind()
        side = torch.cuda.Stream()
        x = torch.ones(1 << 20, device="cuda")
        event = ops.record()
        with torch.cuda.stream(side):
            ops.wait(event)
            ops.mark_used(x)
            y = x * 2
        side.synchronize()
        assert float(y.sum()) == 2.0 * (1 << 20)


# -- passes: built at iter(), nothing started, upstream released on failure --------------------------------


def _pin_fn(x):
    return x


#: one small pipe per stage class and path: name -> (fixtures it needs, the pipe, whether it runs here)
BUILT_AT_ITER = {
    "DeviceMover-cpu": ((), lambda: IterableWrapper([plain(0)]).to_device("cpu"), True),
    "DeviceMover-cpu-collate-off": ((), lambda: IterableWrapper([torch.ones(2)]).to_device("cpu", collate=False), True),
    "DeviceMover-after-collate": ((), lambda: IterableWrapper([torch.ones(2)] * 2).batch(2).collate()
                                  .to_device("cpu", non_blocking=False), True),
    "DeviceMover-meta": ((), lambda: IterableWrapper([[np.ones(2)]]).to_device("meta"), True),
    "DeviceMover-cuda": (("fake_cuda",), lambda: IterableWrapper([torch.ones(2)]).to_device("cuda:0"), False),
    "CudaMover": (("fake_cuda",), lambda: IterableWrapper([torch.ones(2)]).batch(1).to_cuda(), False),
    "CudaMover-blocking-collate-off": (("fake_cuda",), lambda: IterableWrapper([torch.ones(2)]).to_cuda(
        "cuda:1", non_blocking=False, collate=False), False),
    "PinMemory-without-cuda": (("no_cuda",), lambda: IterableWrapper([torch.ones(2)]).pin_memory(), True),
    "PinMemory-in-worker": (("fake_cuda", "in_worker"), lambda: IterableWrapper([torch.ones(2)]).pin_memory(), True),
    "PinMemory-pinning": (("fake_cuda",), lambda: IterableWrapper([torch.ones(2)]).map(_pin_fn).pin_memory(
        _pin_fn, buffer_size=1), True),
    "PinMemory-after-to_cuda": (("fake_cuda",), lambda: IterableWrapper([torch.ones(2)]).to_cuda("cuda:0")
                                .pin_memory(_pin_fn), False),
}


@pytest.mark.usefixtures("no_thread_leak", "fresh_warnings")
class TestPasses:
    """``iter(pipe)`` builds its whole pass at once (every stage creates its upstream's iterator in its
    ``__iter__``), while nothing starts before the first ``next()``: no thread, no CUDA stream, no item
    pulled; a failing mover releases its upstream at once."""

    @pytest.mark.parametrize("case", sorted(BUILT_AT_ITER))
    def test_pass_is_built_at_iter(self, case, request, monkeypatch):
        fixtures, build, runs_here = BUILT_AT_ITER[case]
        for name in fixtures:
            request.getfixturevalue(name)
        streams = []
        monkeypatch.setattr(device_mod._CudaOps, "Stream", staticmethod(streams.append))
        pipe = build()
        threads = set(threading.enumerate())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # pinning skipped: warned once, not the point here
            it = iter(pipe)
            assert _pass.unbuilt(it) == [], _pass.unbuilt(it)
            assert set(threading.enumerate()) == threads and streams == []  # nothing started
            if runs_here:
                assert len(list(it)) == 1
        it.close()

    def test_cuda_path_creates_its_upstream_at_once_and_nothing_else(self):
        fake, src = FakeCuda(), CountingPipe([torch.ones(1)] * 3)
        pipe = DeviceMover(IterableWrapper(src, deepcopy=False), "cpu")
        it = device_mod._move_cuda(pipe, torch.device("meta"), fake)
        assert _pass.owner(pipe.source_datapipe) is not None  # its iterator is made: it joined a pass
        assert fake.log == [] and src.pulled == 0  # no stream made, nothing pulled
        assert len(list(it)) == 3 and fake.log[0] == ("new stream", "meta")

    def test_two_passes_at_once_each_build_their_own_upstream(self):
        pipe = IterableWrapper([torch.ones(1)] * 3).map(_pin_fn).to_device("cpu")
        first, second = iter(pipe), iter(pipe)
        assert first.pass_ is not second.pass_
        for it in (first, second):
            assert all(id(stage) in it.pass_.built for stage in stages(pipe))
        assert len(list(first)) == len(list(second)) == 3

    @pytest.mark.usefixtures("gc_off")
    @pytest.mark.parametrize("threaded", [False, True], ids=["serial", "threaded"])
    @pytest.mark.parametrize("wrong, error", [("text", TypeError), ([torch.ones(2), torch.ones(3)], ValueError)],
                             ids=["no-tensor", "collate-error"])
    def test_a_failing_mover_releases_its_upstream_while_the_error_is_held(self, wrong, error, threaded):
        source = Guarded([torch.ones(2), wrong] + [torch.ones(2)] * 100)
        upstream = IterableWrapper(source, deepcopy=False)
        if threaded:
            upstream = upstream.map(_pin_fn, concurrency=2)
        before = set(threading.enumerate())
        got = []
        held = error_of_pass(upstream.to_device("cpu"), error, r"DeviceMover\('cpu'\)", each=got.append)  # noqa: F841
        assert len(got) == 1
        assert source.closed == [True], "the source's pass was not closed"
        assert not threads_started_since(before, timeout=3.0)

    @pytest.mark.usefixtures("gc_off")
    def test_the_cuda_path_releases_its_upstream_on_failure_and_on_close(self):
        source = Guarded([torch.ones(1), "text", torch.ones(1)])
        mover = DeviceMover(IterableWrapper(source, deepcopy=False), "cpu")
        got = []
        with pytest.raises(TypeError, match="item 1 has no tensor") as info:
            for x in device_mod._move_cuda(mover, torch.device("meta"), FakeCuda()):
                got.append(x)
        held = info.value  # noqa: F841
        assert len(got) == 1 and source.closed == [True]
        source = Guarded([torch.ones(1)] * 10)
        it = device_mod._move_cuda(DeviceMover(IterableWrapper(source, deepcopy=False), "cpu"),
                                   torch.device("meta"), FakeCuda())
        next(it)
        it.close()
        assert source.closed == [True]


class TestCheckpointRefusals:
    """A CUDA mover (and a background stage after one) cannot save its position: the pass's
    state_dict() says so and why. CUDA is faked as available; the state is taken before any copy."""

    def test_a_cuda_mover_says_why(self, monkeypatch):
        monkeypatch.setattr(device_mod, "_cuda_unavailable", lambda name: None)
        it = iter(IterableWrapper([torch.ones(1)]).to_device("cuda:0"))
        with pytest.raises(TypeError, match=r"DeviceMover\('cuda:0'\) cannot save its position: it copies items to "
                                            r"the GPU one ahead .*datapipes.DataLoader\(pipe, device=...\)"):
            it.state_dict()
        it.close()

    def test_a_prefetch_after_it_says_why(self, monkeypatch):
        monkeypatch.setattr(device_mod, "_cuda_unavailable", lambda name: None)
        it = iter(IterableWrapper([torch.ones(1)]).to_device("cuda:0").prefetch(2))
        with pytest.raises(TypeError, match=r"Prefetcher\(2\) cannot save its position: it runs after a CUDA mover"):
            it.state_dict()
        it.close()
