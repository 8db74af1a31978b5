"""ImageDecoder over JPEG/PNG images generated with Pillow."""

import io
import tarfile

import numpy as np
import pytest
from PIL import Image, UnidentifiedImageError

from datapipes._runtime import passes as _pass
from datapipes.iter import IterableWrapper, ImageDecoder
from datapipes.testing import check_datapipe

from helpers import Guarded, error_of_pass, gc_off  # noqa: F401 - gc_off is a fixture


def noise(w, h, mode="RGB", seed=0):
    rng = np.random.default_rng(seed)
    shape = (h, w) if mode == "L" else (h, w, len(mode))
    return Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)


def encode(img, fmt="PNG", **kw):
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


PNG = encode(noise(12, 8))
JPEG = encode(noise(256, 192, seed=1), "JPEG", quality=90)


def notes(e):
    return getattr(e, "__notes__", [])


class TestImageDecoder:
    def test_contract(self):
        want = [np.asarray(Image.open(io.BytesIO(PNG)).convert("RGB"))] * 2
        check_datapipe(IterableWrapper([PNG, PNG]).decode_image(), expected=want,
                       build=lambda src: src.map(lambda i: PNG).decode_image())

    def test_inputs_and_paths(self):
        want = np.asarray(Image.open(io.BytesIO(PNG)))
        streams = [io.BytesIO(PNG), io.BytesIO(PNG)]
        items = [PNG, bytearray(PNG), memoryview(PNG), streams[0], ("p.png", streams[1]), ("q.png", PNG)]
        out = list(IterableWrapper(items, deepcopy=False).decode_image())
        for a in out[:4]:
            assert np.array_equal(a, want)
        assert [p for p, _ in out[4:]] == ["p.png", "q.png"]
        assert all(np.array_equal(a, want) for _, a in out[4:])
        assert all(s.closed for s in streams)

    def test_numpy_layouts(self):
        (a,) = IterableWrapper([PNG]).decode_image()
        assert a.shape == (8, 12, 3) and a.dtype == np.uint8
        assert a.flags.writeable and a.flags.c_contiguous
        (c,) = IterableWrapper([PNG]).decode_image(layout="chw")
        assert c.shape == (3, 8, 12) and c.flags.c_contiguous and c.flags.writeable
        assert np.array_equal(c, a.transpose(2, 0, 1))

    def test_modes(self):
        grey = np.asarray(Image.open(io.BytesIO(PNG)).convert("L"))
        (l_hwc,) = IterableWrapper([PNG]).decode_image(mode="L")
        (l_chw,) = IterableWrapper([PNG]).decode_image(mode="L", layout="chw")
        assert l_hwc.shape == (8, 12, 1) and np.array_equal(l_hwc[:, :, 0], grey)
        assert l_chw.shape == (1, 8, 12) and np.array_equal(l_chw[0], grey)
        rgba = encode(noise(5, 4, "RGBA"))
        (kept,) = IterableWrapper([rgba]).decode_image(mode=None)
        assert kept.shape == (4, 5, 4)
        (rgb,) = IterableWrapper([rgba]).decode_image()
        assert rgb.shape == (4, 5, 3)

    def test_pil_output(self):
        (img,) = IterableWrapper([JPEG]).decode_image(output="pil", mode="L", size=(30, 40))
        assert isinstance(img, Image.Image) and img.mode == "L" and img.size == (40, 30)

    @pytest.mark.parametrize("resample", [Image.Resampling.NEAREST, Image.Resampling.BICUBIC])
    def test_exact_resize_with_filter(self, resample):
        (a,) = IterableWrapper([JPEG]).decode_image(size=(50, 70), resample=resample)
        want = np.asarray(Image.open(io.BytesIO(JPEG)).convert("RGB").resize((70, 50), resample))
        assert a.shape == (50, 70, 3) and np.array_equal(a, want)

    def test_draft_downscales_in_the_jpeg_decoder(self):
        (drafted,) = IterableWrapper([JPEG]).decode_image(size=(48, 64), draft=True)
        (full,) = IterableWrapper([JPEG]).decode_image(size=(48, 64))
        img = Image.open(io.BytesIO(JPEG))
        img.draft("RGB", (64, 48))
        assert img.size == (64, 48)  # 1/4 scale: the target is at most half the source
        want = np.asarray(img.convert("RGB"))
        assert np.array_equal(drafted, want)
        assert drafted.shape == full.shape and not np.array_equal(drafted, full)
        # a target more than half the source: no draft scaling, the same pixels as without draft
        (near,) = IterableWrapper([JPEG]).decode_image(size=(100, 200), draft=True)
        (near_full,) = IterableWrapper([JPEG]).decode_image(size=(100, 200))
        assert np.array_equal(near, near_full)
        (png,) = IterableWrapper([PNG]).decode_image(size=(4, 6), draft=True)  # a no-op for PNG
        assert png.shape == (4, 6, 3)

    def test_corrupt_jpeg_names_file(self):
        bad = io.BytesIO(JPEG[:400])
        with pytest.raises(OSError) as info:
            list(IterableWrapper([("ok.jpg", io.BytesIO(JPEG)), ("bad.jpg", bad)], deepcopy=False).decode_image())
        assert notes(info.value) == ["[datapipes] raised in stage ImageDecoder at file 'bad.jpg', item 1"]
        assert bad.closed
        with pytest.raises(UnidentifiedImageError) as info:
            list(IterableWrapper([PNG, b"not an image"]).decode_image())
        assert notes(info.value) == ["[datapipes] raised in stage ImageDecoder at item 1"]

    def test_skip_and_count(self):
        items = [("a.jpg", JPEG), ("b.jpg", JPEG[:400]), ("c.png", b"junk"), ("d.png", PNG)]
        pipe = IterableWrapper(items).decode_image(on_error="skip", size=(4, 4))
        assert [p for p, _ in pipe] == ["a.jpg", "d.png"]
        assert pipe.failures.count == 2 and [f.position for f in pipe.failures.recent] == [1, 2]
        with pytest.raises(ExceptionGroup, match="ImageDecoder"):
            list(IterableWrapper(items).decode_image(on_error="skip", max_failures=1))

    def test_source_error_passes_through(self):
        def gen():
            yield PNG
            raise KeyError("source")

        with pytest.raises(KeyError) as info:
            list(IterableWrapper(gen()).decode_image())
        assert not notes(info.value)

    def test_bad_items(self):
        with pytest.raises(TypeError, match="ImageDecoder: items must be bytes") as info:
            list(IterableWrapper([PNG, 3]).decode_image())
        assert notes(info.value) == ["[datapipes] raised in stage ImageDecoder at item 1"]

    def test_len_and_empty(self):
        assert len(IterableWrapper([PNG, PNG, PNG]).decode_image()) == 3
        check_datapipe(IterableWrapper([]).decode_image(), expected=[])

    @pytest.mark.parametrize(
        "kwargs, exc, match",
        [
            ({"mode": "XYZ"}, ValueError, "mode"),
            ({"mode": 3}, TypeError, "mode"),
            ({"size": (0, 4)}, ValueError, "size"),
            ({"size": 224}, TypeError, "size"),
            ({"size": (2.0, 3)}, TypeError, "size"),
            ({"resample": 99}, ValueError, "resample"),
            ({"draft": True}, ValueError, "draft"),
            ({"draft": "yes", "size": (2, 2)}, TypeError, "draft"),
            ({"output": "torch"}, ValueError, "output"),
            ({"layout": "hw"}, ValueError, "layout"),
            ({"output": "pil", "layout": "chw"}, ValueError, "layout"),
            ({"on_error": "drop"}, ValueError, "on_error"),
        ],
    )
    def test_bad_arguments(self, kwargs, exc, match):
        with pytest.raises(exc, match=match):
            IterableWrapper([]).decode_image(**kwargs)

    def test_source_must_be_a_pipe(self):
        with pytest.raises(TypeError, match="ImageDecoder: datapipe"):
            ImageDecoder([PNG])

    def test_from_files_and_shards(self, tmp_path):
        from datapipes.iter import FileLister

        (tmp_path / "a.jpg").write_bytes(JPEG)
        (tmp_path / "b.png").write_bytes(PNG)
        pipe = FileLister(str(tmp_path)).open_files(mode="b").decode_image(size=(16, 16))
        assert [(p.rsplit("/", 1)[-1], a.shape) for p, a in pipe] == [("a.jpg", (16, 16, 3)), ("b.png", (16, 16, 3))]

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for i in range(3):
                for suffix, data in ((".jpg", JPEG), (".cls", b"%d" % i)):
                    info = tarfile.TarInfo(f"{i}{suffix}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        shards = IterableWrapper([("s.tar", io.BytesIO(buf.getvalue()))]).load_from_tar().webdataset()
        samples = shards.map(lambda s: (s["__key__"], s[".jpg"])).decode_image(size=(8, 8), draft=True, layout="chw")
        assert [(k, a.shape) for k, a in samples] == [(f"s.tar/{i}", (3, 8, 8)) for i in range(3)]


DECODERS = {
    "numpy": lambda src: src.decode_image(),
    "chw-grey-resized": lambda src: src.decode_image(mode="L", size=(4, 4), layout="chw"),
    "draft": lambda src: src.decode_image(size=(4, 4), draft=True),
    "pil-skip": lambda src: src.decode_image(output="pil", mode=None, on_error="skip", max_failures=1),
    "tar-pairs": lambda src: src.map(lambda p: (f"{p[0]}.tar", io.BytesIO(_tar_of(p[1])))).load_from_tar().decode_image(),
}


def _tar_of(data):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("0.png")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class TestPass:
    """The decoder creates its source's iterator when its pass is built (``iter(pipe)``), reads
    nothing before the first ``next()``, and releases its source when it fails."""

    @pytest.mark.parametrize("decoder", sorted(DECODERS))
    def test_pass_is_built_at_iter(self, decoder):
        opened = []

        def open_(name):
            opened.append(name)
            return name, io.BytesIO(PNG) if decoder != "tar-pairs" else PNG

        pipe = DECODERS[decoder](IterableWrapper(["a.png", "b.png"]).map(open_))
        it = iter(pipe)
        assert _pass.unbuilt(it) == [], _pass.unbuilt(it)
        assert opened == []  # built, not started
        assert len(list(it)) == 2 and opened == ["a.png", "b.png"]
        it1, it2 = iter(pipe), iter(pipe)  # two passes of one graph at once stay apart
        assert _pass.unbuilt(it1) == _pass.unbuilt(it2) == []
        assert len(list(zip(it1, it2))) == 2

    @pytest.mark.usefixtures("gc_off")
    def test_failing_pass_releases_its_source(self):
        source = Guarded([PNG, 3] + [PNG] * 100)  # 3, no image: the decoder raises TypeError there
        pipe = IterableWrapper(source, deepcopy=False).decode_image()
        held = error_of_pass(pipe, TypeError, "ImageDecoder: items must be bytes")  # noqa: F841
        assert source.closed == [True]  # while the consumer holds the error, and so the decoder's frame
