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
from datapipes.iter import CudaMover, DeviceMover, IterableWrapper, PinMemory
from datapipes.testing import check_datapipe

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
    """Pretend CUDA is there, so the pinning thread runs (with a custom pin_memory_fn) on any machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


@pytest.mark.usefixtures("no_thread_leak", "fresh_warnings")
class TestPinMemory:
    # -- where pinning is not available: pass-through with a one-time warning ---------------------------
    @pytest.mark.usefixtures("no_cuda")
    def test_passes_through_without_cuda_and_warns_once_per_process(self):
        items = [nested(i) for i in range(3)]
        pipe = IterableWrapper(items).pin_memory()
        with pytest.warns(RuntimeWarning, match=r"^PinMemory\(2\): pinning is skipped, items pass through unpinned: "
                                                r"CUDA is not available \(torch.cuda.is_available\(\) is False\)$") as record:
            first = list(pipe.map(lambda x: x))
        assert len(record) == 1 and record[0].filename == __file__  # points at the code running the pipe
        assert all(a is b for a, b in zip(first, items))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert list(pipe) == items  # a second pass: no second warning
            assert list(IterableWrapper(items).pin_memory(buffer_size=1)) == items  # nor from another pipe

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
        with pytest.raises(ValueError, match="PinMemory: buffer_size must be >= 1, got 0"):
            src.pin_memory(buffer_size=0)
        with pytest.raises(TypeError, match="PinMemory: buffer_size must be an int, got float"):
            PinMemory(source_datapipe=src, buffer_size=2.0)

    # -- GPU -------------------------------------------------------------------------------------------
    @gpu
    def test_pins_nested_tensors(self):
        items = [nested(i) for i in range(4)]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = list(IterableWrapper(items).pin_memory())
        for i, (got, want) in enumerate(zip(out, items)):
            for g, w in zip(tensors_of(got), tensors_of(want)):
                assert g.is_pinned() and not w.is_pinned() and torch.equal(g, w)
            assert got["pair"].b is want["pair"].b and got["tuple"][1] == "s" and got["batch"].name == ["n"]
            assert type(got["pair"]) is Pair and type(got["batch"]) is Batch

    @gpu
    def test_pinned_and_cuda_tensors_are_left_as_they_are(self):
        pinned, on_gpu = torch.ones(3).pin_memory(), torch.ones(3, device="cuda")
        [(a, b)] = list(IterableWrapper([(pinned, on_gpu)]).pin_memory())
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


def cuda_path(items, fake):
    """Run DeviceMover's CUDA path over ``items`` with ``fake`` standing in for CUDA, to ``meta``."""
    pipe = DeviceMover(IterableWrapper(items), "cpu")
    return device_mod._move_cuda(pipe, torch.device("meta"), fake)


@pytest.mark.usefixtures("no_thread_leak")
class TestDeviceMover:
    def test_to_cpu_keeps_structure_and_tensors(self):
        check_datapipe(IterableWrapper([plain(i) for i in range(3)]).to_device("cpu"),
                       expected=[plain(i) for i in range(3)], build=lambda src: src.to_device("cpu"))
        items = [nested(i) for i in range(3)]
        pipe = IterableWrapper(items).to_device("cpu")
        for got, want in zip(pipe, items):
            assert all(g is w for g, w in zip(tensors_of(got), tensors_of(want)))  # already there: no copy
            assert type(got["pair"]) is Pair and type(got["batch"]) is Batch and got["pair"].b is want["pair"].b
            assert got["batch"].name == ["n"] and got["tuple"][1] == "s" and got["list"][1] == 7
        assert len(pipe) == 3 and repr(pipe) == "IterableWrapper -> DeviceMover('cpu')"
        assert list(DeviceMover(source_datapipe=IterableWrapper([1, None]), device=torch.device("cpu"))) == [1, None]
        check_datapipe(IterableWrapper([]).to_device("cpu"), expected=[])

    def test_moves_tensors_to_another_device(self):
        out = list(IterableWrapper([nested(1)]).to_device("meta"))[0]
        assert all(t.device.type == "meta" for t in tensors_of(out))
        assert out["t"].shape == (2, 3) and out["list"][0].dtype == torch.uint8 and out["list"][1] == 7
        assert type(out["batch"]) is Batch and out["batch"].name == ["n"] and isinstance(out["pair"].b, np.ndarray)

    def test_runs_on_the_consumer_thread_without_threads(self):
        before = threading.active_count()
        for _ in IterableWrapper(range(3)).to_device("cpu"):
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
            ("record", "copy", e1),
            ("record", "copy", e2),
            ("wait", "consumer", e1), ("record_stream", (2,), "consumer"),
            ("record", "copy", e3),
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
        fake = FakeCuda()
        assert list(cuda_path([1, "a", None], fake)) == [1, "a", None]
        assert not [e for e in fake.log if e[0] == "record_stream"]
        assert list(cuda_path([], FakeCuda())) == []

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
                       build=lambda src: src.to_device("cuda"))
        items = [nested(i) for i in range(3)]
        for got, want in zip(IterableWrapper(items).to_device("cuda"), items):
            for g, w in zip(tensors_of(got), tensors_of(want)):
                assert g.is_cuda and torch.equal(g.cpu(), w)
            assert type(got["batch"]) is Batch and got["pair"].b is want["pair"].b

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
                       build=lambda src: src.pin_memory().to_cuda())
        items = [nested(i) for i in range(5)]
        for got, want in zip(IterableWrapper(items).pin_memory().to_cuda(), items):
            for g, w in zip(tensors_of(got), tensors_of(want)):
                assert g.device == torch.device("cuda", torch.cuda.current_device()) and torch.equal(g.cpu(), w)

    @gpu
    def test_consumer_kernel_right_away_sees_the_copied_values(self):
        # Large pinned batches and a kernel launched at once on the consumer's stream: without the event
        # the sum could read memory the copy has not written yet; without record_stream a freed batch's
        # memory could be reused for the next copy while the consumer still reads it.
        n = 1 << 24
        batches = [torch.full((n,), float(i)).pin_memory() for i in range(8)]
        sums = [float(b.sum(dtype=torch.float64)) for b in IterableWrapper(batches).to_cuda()]
        assert sums == [float(i) * n for i in range(8)]
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            sums = [(b * 2).sum(dtype=torch.float64) for b in IterableWrapper(batches).to_cuda()]
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
