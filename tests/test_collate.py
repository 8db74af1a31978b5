"""collate() (datapipes/_collate.py) and Collator [collate] (datapipes/iter/mapping/batches.py)."""

import collections
import dataclasses
import enum
import io
import types

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import default_collate

import datapipes._collate as collate_mod
from datapipes._collate import collate, map_collated, map_converted, map_tensors
from datapipes.iter import Collator, IterableWrapper
from datapipes.testing import check_datapipe

Point = collections.namedtuple("Point", "x y")


@dataclasses.dataclass
class Sample:
    image: np.ndarray
    label: int


@dataclasses.dataclass(frozen=True, slots=True)
class Checked:
    value: float
    name: str

    def __post_init__(self):
        if not isinstance(self.value, float):
            raise TypeError("value must be a float")


class Color(enum.IntEnum):
    RED = 1
    GREEN = 2


def rgb(w, h, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


class TestCollate:
    # -- leaves --------------------------------------------------------------------------------------
    def test_python_numbers_follow_default_collate_dtypes(self):
        ints, floats, bools = collate([1, 2, 3]), collate([0.5, 1.5]), collate([True, False])
        assert ints.dtype == torch.int64 and ints.tolist() == [1, 2, 3]
        assert floats.dtype == torch.float64 and floats.tolist() == [0.5, 1.5]
        assert bools.dtype == torch.bool and bools.tolist() == [True, False]
        for batch in ([1, 2, 3], [0.5, 1.5], [True, False]):
            assert collate(batch).dtype == default_collate(batch).dtype

    def test_ints_and_floats_mix_to_float64_and_int_subclasses_count_as_ints(self):
        mixed = collate([1, 2.5, 3])
        assert mixed.dtype == torch.float64 and mixed.tolist() == [1.0, 2.5, 3.0]
        assert collate([2.5, 1]).tolist() == [2.5, 1.0]
        colors = collate([Color.RED, Color.GREEN, 3])
        assert colors.dtype == torch.int64 and colors.tolist() == [1, 2, 3]

    def test_numpy_arrays_stack_with_their_dtype(self):
        arrays = [np.arange(6, dtype=np.uint8).reshape(2, 3) + i for i in range(4)]
        out = collate(arrays)
        assert out.dtype == torch.uint8 and out.shape == (4, 2, 3)
        assert torch.equal(out, default_collate(arrays))
        strided = [np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2].T for _ in range(2)]
        assert collate(strided).tolist() == [a.tolist() for a in strided]
        assert collate([np.zeros((0, 3), np.int16)] * 2).shape == (2, 0, 3)

    def test_numpy_scalars_keep_their_dtype(self):
        out = collate([np.float32(1.5), np.float32(2)])
        assert out.dtype == torch.float32 and out.tolist() == [1.5, 2.0]
        assert collate([np.int64(3), np.int64(4)]).dtype == torch.int64
        assert collate([np.float64(0.25)] * 2).dtype == torch.float64  # a numpy float64 is not a Python float
        assert collate([np.bool_(True), np.bool_(False)]).tolist() == [True, False]

    def test_tensors_are_stacked(self):
        ts = [torch.full((2, 2), i, dtype=torch.int32) for i in range(3)]
        out = collate(ts)
        assert out.dtype == torch.int32 and out.shape == (3, 2, 2) and torch.equal(out, torch.stack(ts))
        scalar = collate([torch.tensor(1.0), torch.tensor(2.0)])
        assert scalar.tolist() == [1.0, 2.0]

    def test_stacking_tensors_keeps_autograd(self):
        w = torch.ones(2, requires_grad=True)
        out = collate([w * 2, w * 3])
        out.sum().backward()
        assert w.grad.tolist() == [5.0, 5.0]

    def test_pil_images_become_nchw(self):
        images = [rgb(5, 4, seed=i) for i in range(3)]
        out = collate(images)
        assert out.dtype == torch.uint8 and out.shape == (3, 3, 4, 5)
        for i, im in enumerate(images):
            assert torch.equal(out[i], torch.from_numpy(np.array(im)).permute(2, 0, 1))
        gray = collate([im.convert("L") for im in images])
        assert gray.shape == (3, 1, 4, 5) and torch.equal(gray[1, 0], torch.from_numpy(np.array(images[1].convert("L"))))

    def test_decoded_jpeg_and_plain_images_mix(self):
        buf = io.BytesIO()
        rgb(6, 4).save(buf, format="JPEG")
        jpeg = Image.open(io.BytesIO(buf.getvalue()))
        plain = rgb(6, 4, seed=1)
        assert type(jpeg) is not type(plain)
        out = collate([jpeg, plain])
        assert out.shape == (2, 3, 4, 6) and torch.equal(out[1], torch.from_numpy(np.array(plain)).permute(2, 0, 1))

    def test_strings_and_bytes_stay_lists(self):
        assert collate(["a", "b"]) == ["a", "b"]
        assert collate([b"x", b"y"]) == [b"x", b"y"]
        assert collate([np.str_("a"), "b"]) == ["a", "b"]

    # -- structure -----------------------------------------------------------------------------------
    def test_tuples_and_lists_become_lists_as_default_collate(self):
        samples = [(np.zeros(2, np.float32), 1), (np.ones(2, np.float32), 2)]
        out = collate(samples)
        assert type(out) is list and out[1].tolist() == [1, 2] and out[0].tolist() == [[0, 0], [1, 1]]
        assert type(default_collate(samples)) is list
        out = collate([[1, "a"], [2, "b"]])
        assert type(out) is list and out[0].tolist() == [1, 2] and out[1] == ["a", "b"]
        assert collate([(), ()]) == [] == default_collate([(), ()])

    def test_same_containers_as_default_collate(self):
        nt = collections.namedtuple("NT", "a b")
        cases = [
            [(1, 2.0), (3, 4.0)],
            [{"x": (1, [2, 3])}, {"x": (4, [5, 6])}],
            [nt(1, (2, 3)), nt(4, (5, 6))],
            [collections.OrderedDict(a=(1, 2)), collections.OrderedDict(a=(3, 4))],
        ]

        def shape(v):
            if isinstance(v, torch.Tensor):
                return ("tensor", v.dtype, tuple(v.shape))
            if isinstance(v, dict):
                return (type(v), {k: shape(x) for k, x in v.items()})
            if isinstance(v, (list, tuple)):
                return (type(v), [shape(x) for x in v])
            return v

        for samples in cases:
            assert shape(collate(samples)) == shape(default_collate(samples)), samples

    def test_dicts_keep_their_keys_and_type(self):
        out = collate([{"x": 1, "y": "a"}, {"y": "b", "x": 2}])
        assert type(out) is dict and out["x"].tolist() == [1, 2] and out["y"] == ["a", "b"]
        ordered = collate([collections.OrderedDict(a=1.0), collections.OrderedDict(a=2.0)])
        assert type(ordered) is collections.OrderedDict and ordered["a"].tolist() == [1.0, 2.0]
        dd = collate([collections.defaultdict(list, a=1)] * 2)
        assert type(dd) is collections.defaultdict and dd.default_factory is list and dd["a"].tolist() == [1, 1]
        proxy = collate([types.MappingProxyType({"a": 1})] * 2)
        assert proxy["a"].tolist() == [1, 1]

    def test_namedtuples_and_dataclasses_keep_their_class(self):
        p = collate([Point(1, 0.5), Point(2, 1.5)])
        assert type(p) is Point and p.x.tolist() == [1, 2] and p.y.tolist() == [0.5, 1.5]
        s = collate([Sample(np.zeros((1, 2), np.uint8), 3), Sample(np.ones((1, 2), np.uint8), 4)])
        assert type(s) is Sample and s.image.shape == (2, 1, 2) and s.label.tolist() == [3, 4]

    def test_frozen_slotted_dataclass_batch_skips_post_init(self):
        out = collate([Checked(1.0, "a"), Checked(2.0, "b")])
        assert type(out) is Checked and out.value.tolist() == [1.0, 2.0] and out.name == ["a", "b"]

    def test_deep_nesting(self):
        def sample(i):
            return {"inputs": (Sample(np.full(2, i, np.int32), i), [Point(i, float(i))]), "meta": {"id": f"s{i}"}}

        out = collate([sample(0), sample(1), sample(2)])
        s, [p] = out["inputs"]
        assert s.image.tolist() == [[0, 0], [1, 1], [2, 2]] and s.label.tolist() == [0, 1, 2]
        assert type(p) is Point and p.y.dtype == torch.float64
        assert out["meta"] == {"id": ["s0", "s1", "s2"]}

    def test_a_batch_of_one(self):
        out = collate([{"a": np.zeros(3, np.float32), "b": 1}])
        assert out["a"].shape == (1, 3) and out["b"].tolist() == [1]

    def test_agrees_with_default_collate_on_common_batches(self):
        batch = [(np.full((3, 4), i, np.float32), i, float(i)) for i in range(5)]
        ours, theirs = collate(batch), default_collate(batch)
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
        dicts = [{"image": torch.rand(3, 4), "label": i} for i in range(5)]
        ours, theirs = collate(dicts), default_collate(dicts)
        assert torch.equal(ours["image"], theirs["image"]) and torch.equal(ours["label"], theirs["label"])

    # -- errors name the field -----------------------------------------------------------------------
    def test_shape_mismatch_names_field_and_sample(self):
        batch = [{"image": np.zeros((3, 224, 224), np.uint8)} for _ in range(5)]
        batch[3] = {"image": np.zeros((3, 224, 200), np.uint8)}
        with pytest.raises(ValueError) as info:
            collate(batch)
        assert str(info.value) == (
            "collate: field 'image' (sample 3): shape (3, 224, 200) differs from (3, 224, 224) of sample 0"
        )

    def test_mixed_types_name_field_and_sample(self):
        with pytest.raises(TypeError, match=r"^collate: field 'label' \(sample 2\): str differs from int of sample 0$"):
            collate([{"label": 1}, {"label": 2}, {"label": "3"}])
        with pytest.raises(TypeError, match=r"field '\[1\]' \(sample 1\): numpy.ndarray differs from int"):
            collate([(0, 1), (0, np.zeros(1))])
        with pytest.raises(TypeError, match=r"^collate: sample 1: int differs from bool of sample 0$"):
            collate([True, 1])
        with pytest.raises(TypeError, match=r"sample 1: numpy.float64 differs from numpy.float32"):
            collate([np.float32(1), np.float64(1)])
        with pytest.raises(TypeError, match=r"sample 1: NoneType differs from str"):
            collate(["a", None])

    def test_nested_paths(self):
        bad = [{"x": (Sample(np.zeros(2), 1),)}, {"x": (Sample(np.zeros(3), 1),)}]
        with pytest.raises(ValueError, match=r"field 'x\[0\]\.image' \(sample 1\): shape \(3,\) differs from \(2,\)"):
            collate(bad)
        with pytest.raises(TypeError, match=r"field 'meta\['a b'\]\.y' \(sample 1\): str differs from float"):
            collate([{"meta": {"a b": Point(1, 0.5)}}, {"meta": {"a b": Point(1, "z")}}])
        with pytest.raises(TypeError, match=r"field '\[0\]\[3\]' \(sample 0\)"):
            collate([([0, 1, 2, object()],), ([0, 1, 2, object()],)])

    def test_dtype_mismatch(self):
        with pytest.raises(TypeError, match=r"^collate: field 'a' \(sample 1\): dtype float32 differs from uint8 of sample 0$"):
            collate([{"a": np.zeros(2, np.uint8)}, {"a": np.zeros(2, np.float32)}])
        with pytest.raises(TypeError, match=r"sample 2: dtype torch.float64 differs from torch.float32"):
            collate([torch.zeros(2), torch.zeros(2), torch.zeros(2, dtype=torch.float64)])

    def test_tensor_shape_and_device_mismatch(self):
        with pytest.raises(ValueError, match=r"^collate: field 'x' \(sample 1\): shape \(3,\) differs from \(2,\) of sample 0$") as info:
            collate([{"x": torch.zeros(2)}, {"x": torch.zeros(3)}])
        assert isinstance(info.value.__cause__, RuntimeError)  # torch's own message is kept as the cause
        with pytest.raises(ValueError, match=r"sample 1: device meta differs from cpu of sample 0"):
            collate([torch.zeros(2), torch.zeros(2, device="meta")])
        with pytest.raises(TypeError, match=r"sample 1: list differs from torch.Tensor"):
            collate([torch.zeros(2), [0.0, 0.0]])

    def test_structure_mismatch(self):
        with pytest.raises(ValueError, match=r"^collate: sample 1: length 3 differs from 2 of sample 0$"):
            collate([(1, 2), (1, 2, 3)])
        with pytest.raises(ValueError, match=r"sample 1: keys differ from those of sample 0 \(missing \['b'\], extra \['c'\]\)"):
            collate([{"a": 1, "b": 2}, {"a": 1, "c": 2}])
        with pytest.raises(ValueError, match=r"sample 2: keys differ .*missing \['b'\], extra \[\]"):
            collate([{"a": 1, "b": 2}, {"a": 1, "b": 2}, {"a": 1}])
        with pytest.raises(TypeError, match=r"sample 1: tuple differs from list"):
            collate([[1, 2], (1, 2)])
        with pytest.raises(TypeError, match=r"sample 1: tuple differs from test_collate.Point"):
            collate([Point(1, 2), (1, 2)])
        with pytest.raises(TypeError, match=r"sample 1: collections.OrderedDict differs from dict"):
            collate([{"a": 1}, collections.OrderedDict(a=1)])

    def test_image_mismatch(self):
        with pytest.raises(ValueError, match=r"^collate: field 'im' \(sample 1\): shape \(3, 4, 6\) differs from \(3, 4, 5\) of sample 0$"):
            collate([{"im": rgb(5, 4)}, {"im": rgb(6, 4)}])
        with pytest.raises(TypeError, match=r"sample 1: image mode 'L' differs from 'RGB' of sample 0"):
            collate([rgb(5, 4), rgb(5, 4).convert("L")])
        with pytest.raises(TypeError, match=r"sample 1: numpy.ndarray differs from PIL"):
            collate([rgb(5, 4), np.zeros((4, 5, 3), np.uint8)])

    def test_unbatchable_values(self):
        with pytest.raises(TypeError, match=r"^collate: field 'x' \(sample 0\): cannot batch NoneType; .*collate_fn="):
            collate([{"x": None}, {"x": None}])
        with pytest.raises(TypeError, match=r"field 'a' \(sample 0\): numpy arrays of dtype <U1 cannot become a tensor"):
            collate([{"a": np.array(["x"])}, {"a": np.array(["y"])}])
        with pytest.raises(TypeError, match=r"numpy arrays of dtype object cannot become a tensor"):
            collate([np.array([None]), np.array([None])])
        with pytest.raises(ValueError, match=r"^collate: field 'n' \(sample 1\): int 36893488147419103232 does not fit in int64$"):
            collate([{"n": 1}, {"n": 2**65}])
        with pytest.raises(ValueError, match=r"^collate: the batch is empty$"):
            collate([])

    # -- shared memory in DataLoader workers ---------------------------------------------------------
    def test_outputs_in_shared_memory_inside_a_worker(self, monkeypatch):
        arrays = [np.full((2, 3), i, np.int16) for i in range(4)]
        assert not collate(arrays).is_shared()
        monkeypatch.setattr(collate_mod, "get_worker_info", lambda: object())
        out = collate({"a": arrays, "t": [torch.full((2,), float(i)) for i in range(4)]}["a"])
        assert out.is_shared() and out.dtype == torch.int16 and out[3].tolist() == [[3] * 3] * 2
        ts = collate([torch.full((2,), float(i)) for i in range(4)])
        assert ts.is_shared() and ts[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
        images = collate([rgb(3, 2), rgb(3, 2, seed=1)])
        assert images.is_shared() and images.shape == (2, 3, 2, 3)

    def test_as_collate_fn_of_a_torch_dataloader_with_a_worker(self):
        data = [(np.full((2, 3), i, np.uint8), i, f"s{i}") for i in range(8)]
        loader = torch.utils.data.DataLoader(data, batch_size=4, collate_fn=collate, num_workers=1)
        batches = list(loader)
        assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert batches[1][0][:, 0, 0].tolist() == [4, 5, 6, 7] and batches[0][2] == ["s0", "s1", "s2", "s3"]


class TestMapTensors:
    def test_walks_every_structure(self):
        item = {
            "a": (torch.ones(1), [torch.zeros(1), "s"]),
            "p": Point(torch.ones(1), 2),
            "d": Sample(torch.ones(1), 3),
            "o": collections.OrderedDict(t=torch.ones(1)),
            "n": np.ones(1),
        }
        out = map_tensors(item, lambda t: t + 1)
        assert out["a"][0].tolist() == [2.0] and out["a"][1][0].tolist() == [1.0] and out["a"][1][1] == "s"
        assert type(out["p"]) is Point and out["p"].x.tolist() == [2.0] and out["p"].y == 2
        assert type(out["d"]) is Sample and out["d"].image.tolist() == [2.0] and out["d"].label == 3
        assert type(out["o"]) is collections.OrderedDict and out["o"]["t"].tolist() == [2.0]
        assert out["n"] is item["n"]
        assert item["a"][0].tolist() == [1.0] and item["d"].image.tolist() == [1.0]  # the input is not changed

    def test_leaves_other_values_alone(self):
        for value in (None, 3, "x", b"y", 1.5, np.zeros(2), object()):
            assert map_tensors(value, lambda t: 1 / 0) is value


class TestAlreadyCollated:
    def test_a_batch_is_returned_as_it_is(self):
        t = torch.arange(6).reshape(2, 3)
        d = {"x": torch.ones(2, 2), "y": torch.tensor([1, 2])}
        s = Sample(torch.ones(2, 3), torch.tensor([0, 1]))
        for batch in (t, d, collections.OrderedDict(d), s):
            assert collate(batch) is batch
        again = collate(collate([{"x": torch.ones(2)}, {"x": torch.zeros(2)}]))
        assert again["x"].shape == (2, 2)  # collating twice stacks nothing twice
        assert collate([t, t]).shape == (2, 2, 3)  # a list of tensors is still a list of samples

    def test_a_collator_after_a_collator_changes_nothing(self):
        pipe = IterableWrapper([{"x": torch.full((2,), i)} for i in range(4)]).batch(2).collate().collate()
        assert [b["x"].shape for b in pipe] == [(2, 2), (2, 2)]


class TestMapConverted:
    def test_numpy_values_become_tensors_and_the_rest_is_kept(self):
        t = torch.ones(2)
        item = {"t": t, "a": np.arange(3, dtype=np.int16), "s": np.bool_(True), "n": 3, "names": np.array(["a"]),
                "p": Point(np.zeros(1), "q"), "d": Sample(np.ones(1), np.int64(4))}
        out = map_converted(item, lambda x: x)
        assert out["t"] is t and out["a"].dtype == torch.int16 and out["a"].tolist() == [0, 1, 2]
        assert out["s"].dtype == torch.bool and out["s"].ndim == 0 and out["n"] == 3 and type(out["n"]) is int
        assert isinstance(out["names"], np.ndarray) and type(out["p"]) is Point and out["p"].y == "q"
        assert out["p"].x.tolist() == [0.0] and type(out["d"]) is Sample and out["d"].label.item() == 4
        assert isinstance(item["a"], np.ndarray)  # the input is not changed

    def test_fn_sees_every_tensor_once(self):
        seen = []
        map_converted([np.zeros(1), (torch.ones(1), np.float64(2.0))], lambda x: seen.append(x.dtype) or x)
        assert seen == [torch.float64, torch.float32, torch.float64]

    @pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                                       "float16", "float32", "float64", "complex64", "complex128"])
    def test_every_numeric_numpy_scalar_becomes_a_0d_tensor(self, dtype):
        # torch.as_tensor refuses a uint64 scalar, and numpy 2's bool on torch 2.5
        x = np.ones((), dtype=dtype)[()]
        out = map_converted(x, lambda t: t)
        assert type(out) is torch.Tensor and out.ndim == 0 and out.dtype == torch.from_numpy(np.ones(1, dtype)).dtype
        assert out.item() == x.item()

    def test_unconvertible_numpy_dtypes_raise(self):
        with pytest.raises(TypeError, match="numpy scalar of dtype datetime64"):
            map_converted(np.datetime64("2020-01-01"), lambda x: x)
        with pytest.raises(TypeError, match="numpy scalar of dtype timedelta64"):
            map_converted(np.timedelta64(3, "s"), lambda x: x)


class TestMapCollated:
    def test_lists_are_collated_other_items_converted(self):
        out = map_collated([(np.zeros(2), 1), (np.ones(2), 2)], lambda x: x)
        assert type(out) is list and out[0].shape == (2, 2) and out[1].tolist() == [1, 2]
        d = {"x": torch.ones(3)}
        assert map_collated(d, lambda x: x)["x"] is d["x"]
        assert map_collated(np.zeros((2, 2)), lambda x: x).shape == (2, 2)  # one item: converted, not split

    def test_list_subclasses_are_batches_too(self):
        class Chunk(list):
            pass

        assert map_collated(Chunk([1, 2, 3]), lambda x: x).tolist() == [1, 2, 3]


class TestCollator:
    def test_contract(self):
        samples = [(np.full(2, i, np.float32), i) for i in range(5)]
        expected = [
            [torch.tensor([[0.0, 0.0], [1.0, 1.0]]), torch.tensor([0, 1])],
            [torch.tensor([[2.0, 2.0], [3.0, 3.0]]), torch.tensor([2, 3])],
            [torch.tensor([[4.0, 4.0]]), torch.tensor([4])],
        ]
        pipe = IterableWrapper(samples).batch(2).collate()
        check_datapipe(pipe, expected=expected, build=lambda src: src.batch(2).collate())
        assert len(pipe) == 3 and repr(pipe) == "IterableWrapper -> Batcher(2) -> Collator(collate)"

    def test_len_follows_source(self):
        assert len(IterableWrapper(range(7)).batch(3, drop_last=True).collate()) == 2
        with pytest.raises(TypeError, match="Filter"):
            len(IterableWrapper(range(7)).filter(bool).batch(2).collate())
        check_datapipe(IterableWrapper([]).batch(2).collate(), expected=[])

    def test_custom_collate_fn_and_torch_style_conversion(self):
        batches = IterableWrapper(range(6)).batch(3)
        check_datapipe(batches.collate(collate_fn=lambda b: sum(b)), expected=[3, 12])
        assert list(Collator(batches, lambda b: max(b))) == [2, 5]  # torch DataPipes: conversion, positional
        assert list(Collator(datapipe=batches, conversion=min)) == [0, 3]
        assert repr(batches.collate(collate_fn=sum)) == "IterableWrapper -> Batcher(3) -> Collator(sum)"
        assert [t.tolist() for t in batches.collate(default_collate)] == [[0, 1, 2], [3, 4, 5]]

    def test_bad_arguments(self):
        src = IterableWrapper([[1]])
        with pytest.raises(TypeError, match="Collator: datapipe must be an IterDataPipe, got list"):
            Collator([[1]])
        with pytest.raises(TypeError, match="Collator: collate_fn must be callable, got int"):
            src.collate(collate_fn=3)
        with pytest.raises(TypeError, match="Collator: conversion must be callable, got str"):
            src.collate("stack")
        with pytest.raises(TypeError, match="Collator: conversion as a dict .* not supported"):
            src.collate({"a": sum})
        with pytest.raises(ValueError, match="Collator: give collate_fn or conversion, not both"):
            src.collate(sum, collate_fn=sum)

    def test_collate_errors_keep_the_object_and_name_the_batch(self):
        pipe = IterableWrapper([{"x": 1}, {"x": 2}, {"x": 3}, {"x": "4"}]).batch(2).collate()
        got = []
        with pytest.raises(TypeError) as info:
            for b in pipe:
                got.append(b)
        assert str(info.value) == "collate: field 'x' (sample 1): str differs from int of sample 0"
        assert info.value.__notes__ == ["[datapipes] raised in stage Collator(collate) at batch 1"]
        assert [b["x"].tolist() for b in got] == [[1, 2]]

    def test_custom_fn_error_is_the_same_object(self):
        err = KeyError("boom")

        def fail(batch):
            if batch[0] == 4:
                raise err
            return batch

        with pytest.raises(KeyError) as info:
            list(IterableWrapper(range(6)).batch(2).collate(collate_fn=fail))
        assert info.value is err and info.value.__notes__ == ["[datapipes] raised in stage Collator(fail) at batch 2"]

    def test_source_error_gets_no_collator_note(self):
        err = ValueError("upstream")

        def gen():
            yield [1]
            raise err

        with pytest.raises(ValueError) as info:
            list(IterableWrapper(gen()).collate())
        assert info.value is err and not getattr(err, "__notes__", [])
