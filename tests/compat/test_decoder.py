"""datapipes.utils (common, decoder) and datapipes/iter/decoding.py (RoutedDecoder [routed_decode],
StreamReader [read_from_stream]) against torch's own implementations on the same inputs."""

import importlib.util
import io
import json
import os
import pickle
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data.datapipes import iter as tdp
from torch.utils.data.datapipes.utils import common as tcommon
from torch.utils.data.datapipes.utils import decoder as tdec

from datapipes import IterDataPipe
from datapipes.iter import FileLister, IterableWrapper, RoutedDecoder, StreamReader
from datapipes.testing import check_datapipe, check_resume
from datapipes.utils import common, decoder
from datapipes.utils.common import StreamWrapper
from datapipes.utils.decoder import (
    Decoder,
    ImageHandler,
    audiohandler,
    basichandlers,
    extension_extract_fn,
    handle_extension,
    imagehandler,
    imagespecs,
    mathandler,
    videohandler,
)

EVERY_K = lambda n: range(n + 1)  # noqa: E731 - check_resume's ks: every number of items


def same(a, b):
    """Equal values of the same type, arrays and tensors and images included (dtype and shape too)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, Image.Image):
        return isinstance(b, Image.Image) and (a.mode, a.size, a.tobytes()) == (b.mode, b.size, b.tobytes())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def image_bytes(fmt, mode="RGB", size=(5, 3)):
    rng = np.random.default_rng(0)
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    arr = rng.integers(0, 256, size=(size[1], size[0], channels), dtype=np.uint8)
    img = Image.fromarray(arr[:, :, 0] if channels == 1 else arr, mode)
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


def tensor_bytes(t):
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def npy_bytes(a):
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


FILES = {
    "a.png": image_bytes("PNG"),
    "b.jpg": image_bytes("JPEG"),
    "c.JPEG": image_bytes("JPEG"),
    "g.png": image_bytes("PNG", "L"),
    "h.png": image_bytes("PNG", "RGBA"),
    "d.json": json.dumps({"x": [1, 2], "y": "z"}).encode(),
    "e.txt": "héllo\nworld".encode(),
    "f.cls": b"7",
    "f2.cls": b"not a number",
    "i.pyd": pickle.dumps({"k": (1, 2)}),
    "j.pickle": pickle.dumps([1, "two"]),
    "k.npy": npy_bytes(np.arange(6, dtype=np.int16).reshape(2, 3)),
    "l.ten": tensor_bytes(torch.arange(4)),
    "m.pt": tensor_bytes(torch.arange(5.0)),
    "n.bin": b"\x00\x01\x02",
    "empty.txt": b"",
}


@pytest.fixture
def files(tmp_path):
    for name, data in FILES.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


def torch_routed(pairs, *handlers, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's RoutedDecoder is deprecated
        return list(tdp.RoutedDecoder(tdp.IterableWrapper(pairs, deepcopy=False), *handlers, **kw))


# -- datapipes.utils.common ------------------------------------------------------------------------


class TestCommon:
    def test_stream_wrapper_is_ours(self):
        from datapipes.iter.fileio import StreamWrapper as Ours

        assert StreamWrapper is Ours
        assert set(common.__all__) >= {"StreamWrapper", "validate_input_col", "get_file_pathnames_from_root",
                                       "get_file_binaries_from_pathnames", "match_masks"}

    @pytest.mark.parametrize("input_col", [None, 0, [0], [0, 1], (0, 1, 2), [0, 1, 2, 3]])
    @pytest.mark.parametrize(
        "fn",
        [
            lambda a: a,
            lambda a, b: a,
            lambda a, b=1: a,
            lambda a, *args: a,
            lambda *args: args,
            lambda a, b, c=1, *, d=2: a,
            lambda a, *, k: a,
            len,
        ],
    )
    def test_validate_input_col_as_torch(self, fn, input_col):
        try:
            tcommon.validate_input_col(fn, input_col)
            want = None
        except ValueError as e:
            want = str(e)
        if want is None:
            assert common.validate_input_col(fn, input_col) is None
        else:
            with pytest.raises(ValueError) as info:
                common.validate_input_col(fn, input_col)
            assert want in str(info.value)

    @pytest.mark.parametrize("name", ["a.jpg", "a.JPG", "b.png", "c.txt", "dir.x"])
    @pytest.mark.parametrize("masks", ["", [], "*.jpg", ["*.png", "*.jpg"], "a.*", ["*.txt"]])
    def test_match_masks_as_torch(self, name, masks):
        assert common.match_masks(name, masks) == tcommon.match_masks(name, masks)

    @pytest.mark.parametrize("recursive", [False, True])
    @pytest.mark.parametrize("abspath", [False, True])
    @pytest.mark.parametrize("masks", ["", "*.txt", ["*.txt", "*.md"]])
    def test_get_file_pathnames_from_root_as_torch(self, tmp_path, recursive, abspath, masks):
        for name in ("b.txt", "a.txt", "c.md", "sub/z.txt", "sub/y.bin", "sub/deep/x.txt", "other/w.md"):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(name)
        root = str(tmp_path)
        ours = list(common.get_file_pathnames_from_root(root, masks, recursive, abspath))
        assert ours == list(tcommon.get_file_pathnames_from_root(root, masks, recursive, abspath))
        one = str(tmp_path / "a.txt")
        assert list(common.get_file_pathnames_from_root(one, masks, abspath=abspath)) == list(
            tcommon.get_file_pathnames_from_root(one, masks, abspath=abspath)
        )

    def test_get_file_pathnames_from_root_is_lazy_and_fails_on_missing_root(self, tmp_path):
        gen = common.get_file_pathnames_from_root(str(tmp_path / "missing"), "")
        with pytest.raises(FileNotFoundError):
            next(gen)

    @pytest.mark.parametrize("mode", ["b", "rb", "t", "r"])
    def test_get_file_binaries_from_pathnames_as_torch(self, tmp_path, mode):
        paths = []
        for name in ("a.txt", "b.txt"):
            (tmp_path / name).write_text(name * 2)
            paths.append(str(tmp_path / name))
        ours = [(p, s.read()) for p, s in common.get_file_binaries_from_pathnames(paths, mode)]
        theirs = [(p, s.read()) for p, s in tcommon.get_file_binaries_from_pathnames(paths, mode)]
        assert ours == theirs
        _, stream = next(common.get_file_binaries_from_pathnames(paths, mode))
        assert isinstance(stream, StreamWrapper)
        stream.close()

    def test_get_file_binaries_from_pathnames_errors(self, tmp_path):
        with pytest.raises(TypeError, match="Expected string type for pathname"):
            next(common.get_file_binaries_from_pathnames([1], "b"))
        with pytest.raises(FileNotFoundError):
            next(common.get_file_binaries_from_pathnames([str(tmp_path / "no")], "b"))
        (tmp_path / "one").write_bytes(b"1")
        single = common.get_file_binaries_from_pathnames(str(tmp_path / "one"), "b")  # one path, not its letters
        assert [s.read() for _, s in single] == [b"1"]

    def test_validate_pathname_binary_tuple(self):
        common.validate_pathname_binary_tuple(("a", io.BytesIO()))
        common.validate_pathname_binary_tuple(("a", StreamWrapper(io.BytesIO())))
        for bad in (["a", io.BytesIO()], ("a",), (1, io.BytesIO()), ("a", b"x")):
            with pytest.raises(TypeError) as ours:
                common.validate_pathname_binary_tuple(bad)
            with pytest.raises(TypeError) as theirs:
                tcommon.validate_pathname_binary_tuple(bad)
            assert str(ours.value).split(",")[0][:30] == str(theirs.value).split(",")[0][:30]


# -- datapipes.utils.decoder: the handlers ---------------------------------------------------------


class TestBasichandlers:
    # torch's handler decodes .pt as text ("pt" is a substring of "transcript"): compared apart below
    @pytest.mark.parametrize("name", sorted(n for n in FILES if n not in ("empty.txt", "m.pt")))
    def test_as_torch(self, name):
        ext = extension_extract_fn(name)
        # torch's unpickles unasked; ours does with allow_pickle=True (docs/howto/security.rst)
        assert same(basichandlers(ext, FILES[name], allow_pickle=True), tdec.basichandlers(ext, FILES[name]))

    @pytest.mark.parametrize("ext", ["txt", "text", "transcript"])
    def test_text(self, ext):
        assert basichandlers(ext, "é".encode()) == "é" == tdec.basichandlers(ext, "é".encode())

    @pytest.mark.parametrize("ext", ["cls", "cls2", "class", "count", "index", "inx", "id"])
    def test_int(self, ext):
        assert basichandlers(ext, b" 12\n") == 12 == tdec.basichandlers(ext, b" 12\n")
        assert basichandlers(ext, b"x") is None

    def test_json_pickle_pt(self):
        assert basichandlers("jsn", b"[1]") == [1]
        t = torch.arange(3)
        assert torch.equal(basichandlers("pt", tensor_bytes(t)), t)
        assert basichandlers("ten", tensor_bytes(t)) is None  # as torch: no tenbin handler
        assert basichandlers("npy", npy_bytes(np.zeros(2))) is None

    def test_exact_words_only(self):
        # torch tests "in 'txt text transcript'" (a substring test): "" and "xt" decode as text there.
        assert tdec.basichandlers("", b"x") == "x"
        with pytest.raises(UnicodeDecodeError):
            tdec.basichandlers("pt", FILES["m.pt"])  # its torch.load branch is never reached
        assert basichandlers("", b"x") is None
        assert basichandlers("xt", b"x") is None

    def test_errors_pass_through(self):
        with pytest.raises(json.JSONDecodeError):
            basichandlers("json", b"{")
        with pytest.raises(UnicodeDecodeError):
            basichandlers("txt", b"\xff")


class TestImageHandler:
    @pytest.mark.parametrize("spec", sorted(imagespecs))
    @pytest.mark.parametrize("name", ["a.png", "b.jpg", "c.JPEG", "g.png", "h.png"])
    def test_as_torch(self, spec, name):
        ext = extension_extract_fn(name)
        ours = ImageHandler(spec)(ext, FILES[name])
        if spec in ("torchl8", "torchl"):  # torch's fails: it transposes a 2-D array
            with pytest.raises(ValueError):
                tdec.ImageHandler(spec)(ext, FILES[name])
            grey = ImageHandler("l8" if spec == "torchl8" else "l")(ext, FILES[name])
            assert ours.shape == (1, *grey.shape)
            assert same(ours, torch.from_numpy(grey.copy())[None])
            return
        assert same(ours, tdec.ImageHandler(spec)(ext, FILES[name]))

    def test_types(self):
        data = FILES["a.png"]
        assert imagehandler("rgb8")("png", data).shape == (3, 5, 3)
        assert imagehandler("rgb")("png", data).dtype == np.float32
        assert imagehandler("torch")("png", data).dtype == torch.float32
        assert imagehandler("torchrgba8")("png", data).shape == (4, 3, 5)
        assert imagehandler("pill")("png", data).mode == "L"
        assert 0.0 <= float(imagehandler("torch")("png", data).max()) <= 1.0

    @pytest.mark.parametrize("ext", ["txt", "gif", "", "npy"])
    def test_other_extensions(self, ext):
        assert ImageHandler("rgb8")(ext, b"xx") is None

    @pytest.mark.parametrize("spec", ["RGB8", "bgr", "", "numpy"])
    def test_unknown_spec(self, spec):
        with pytest.raises(ValueError, match="unknown image specification") as info:
            ImageHandler(spec)
        assert isinstance(info.value, AssertionError)  # torch's type, for code that catches it
        with pytest.raises(AssertionError):
            tdec.ImageHandler(spec)

    def test_bad_image(self):
        with pytest.raises(Exception) as ours:
            ImageHandler("rgb8")("png", b"not an image")
        with pytest.raises(Exception) as theirs:
            tdec.ImageHandler("rgb8")("png", b"not an image")
        assert type(ours.value) is type(theirs.value)

    def test_pickle(self):
        h = pickle.loads(pickle.dumps(imagehandler("torchrgb8")))
        assert same(h("png", FILES["a.png"]), imagehandler("torchrgb8")("png", FILES["a.png"]))


class TestOtherHandlers:
    def test_handle_extension(self):
        h = handle_extension("jpg jpeg", len)
        assert (h("x.jpg", b"ab"), h("X.JPEG", b"abc"), h("x.png", b"a")) == (2, 3, None)
        assert handle_extension("seg.jpg", len)("a.seg.jpg", b"a") == 1
        assert handle_extension("seg.jpg", len)("a.jpg", b"a") is None
        assert handle_extension("jpg", len)("a.jpg", b"a") == tdec.handle_extension("jpg", len)("a.jpg", b"a")
        # torch's only looks at the first extension of its list
        assert tdec.handle_extension("png jpg", len)("a.jpg", b"a") is None
        assert handle_extension("png jpg", len)("a.jpg", b"a") == 1
        assert pickle.loads(pickle.dumps(h))("x.jpg", b"a") == 1

    def test_extension_extract_fn_as_torch(self):
        for p in ("a.jpg", "dir/a.tar.gz", "README", ".hidden", "dir.d/file", "a.", "/x/y.JSON"):
            assert extension_extract_fn(p) == tdec.extension_extract_fn(p)

    @pytest.mark.skipif(importlib.util.find_spec("scipy") is not None, reason="scipy is installed")
    def test_mathandler_needs_scipy_only_when_used(self):
        h = mathandler(squeeze_me=True)  # made without scipy
        assert h("txt", b"") is None
        with pytest.raises(ModuleNotFoundError, match="scipy"):
            h("mat", b"...")
        pickle.dumps(h)

    @pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision is installed")
    def test_videohandler_needs_torchvision_only_when_used(self):
        assert videohandler("txt", b"") is None
        with pytest.raises(ModuleNotFoundError, match="torchvision"):
            videohandler("mp4", b"...")

    @pytest.mark.skipif(importlib.util.find_spec("torchaudio") is not None, reason="torchaudio is installed")
    def test_audiohandler_needs_torchaudio_only_when_used(self):
        assert audiohandler("txt", b"") is None
        with pytest.raises(ModuleNotFoundError, match="torchaudio"):
            audiohandler("wav", b"...")

    def test_all_torch_names_exist(self):
        assert set(tdec.__all__) <= set(decoder.__all__)
        assert set(tcommon.__all__) <= set(common.__all__)


# -- datapipes.utils.decoder: Decoder --------------------------------------------------------------


class TestDecoder:
    handlers = (basichandlers, imagehandler("rgb8"))

    def test_pairs_as_torch(self):
        pairs = [x for x in FILES.items() if x[0] != "m.pt"] + [("_meta", b"raw"), ("_n.cls", b"3"), ("o.txt", None)]
        ours = Decoder(*self.handlers, allow_pickle=True)(pairs)  # torch's unpickles unasked
        theirs = tdec.Decoder(tdec.basichandlers, tdec.imagehandler("rgb8"))(pairs)
        assert same(ours, theirs)
        assert ours["_meta"] == "raw" and ours["_n.cls"] == "3" and ours["empty.txt"] == b""

    def test_streams_are_read_and_closed(self):
        files = {name: data for name, data in FILES.items() if name != "m.pt"}  # torch's reads .pt as text
        streams = {name: io.BytesIO(data) for name, data in files.items()}
        wrapped = StreamWrapper(io.BytesIO(FILES["d.json"]))
        ours = Decoder(*self.handlers, allow_pickle=True)([*streams.items(), ("w.json", wrapped)])
        theirs = tdec.Decoder(tdec.basichandlers, tdec.imagehandler("rgb8"))(
            [(name, io.BytesIO(data)) for name, data in files.items()]
        )
        assert same({k: v for k, v in ours.items() if k != "w.json"}, theirs)
        assert ours["w.json"] == json.loads(FILES["d.json"])
        assert all(s.closed for s in streams.values()) and wrapped.closed

    def test_one_pair_dict_and_none(self):
        d = Decoder(basichandlers)
        assert d(("a.cls", b"1")) == {"a.cls": 1}
        assert d({"a.cls": b"1", "b.txt": b"x"}) == {"a.cls": 1, "b.txt": "x"}
        assert d(None) == {}
        assert d.decode([("a.cls", b"2")]) == {"a.cls": 2}

    def test_text_stream_is_passed_as_is(self):
        s = io.StringIO("abc")
        assert Decoder(lambda ext, data: data)([("a.txt", s)])["a.txt"] is s

    def test_handler_order_and_add_handler(self):
        calls = []

        def first(ext, data):
            calls.append("first")
            return None

        d = Decoder(first, basichandlers)
        d.add_handler(lambda ext, data: "mine" if ext == "txt" else None)
        assert d.handlers[1] is first
        assert d([("a.txt", b"x"), ("b.cls", b"2")]) == {"a.txt": "mine", "b.cls": 2}
        assert calls == ["first"]
        d.add_handler()
        assert len(d.handlers) == 3

    def test_key_fn(self):
        d = Decoder(lambda key, data: key, key_fn=lambda path: path.upper())
        assert d(("a.txt", b"x")) == {"a.txt": "A.TXT"}

    def test_unhandled_data_unchanged(self):
        assert Decoder()(("a.xyz", b"\x00")) == {"a.xyz": b"\x00"}

    def test_pickle(self):
        d = pickle.loads(pickle.dumps(Decoder(*self.handlers)))
        assert d(("a.cls", b"5")) == {"a.cls": 5}


# -- RoutedDecoder ---------------------------------------------------------------------------------


def decoded_files(root):
    return FileLister(str(root)).open_files(mode="b").routed_decode(allow_pickle=True)  # FILES has pickles


class TestRoutedDecoder:
    def test_default_handlers_as_torch(self, files):
        paths = sorted(str(p) for p in files.iterdir())
        ours = list(decoded_files(files))
        assert [p for p, _ in ours] == paths
        # torch's decodes .pt as text (see TestBasichandlers.test_exact_words_only): compared apart
        cmp = [p for p in paths if not p.endswith(".pt")]
        theirs = torch_routed([(p, open(p, "rb")) for p in cmp])  # noqa: SIM115 - torch closes them
        assert same([x for x in ours if not x[0].endswith(".pt")], theirs)
        by_name = {os.path.basename(p): v for p, v in ours}
        assert by_name["a.png"].dtype == torch.float32 and by_name["a.png"].shape == (3, 3, 5)
        assert by_name["k.npy"] == FILES["k.npy"] and by_name["l.ten"] == FILES["l.ten"]
        assert torch.equal(by_name["m.pt"], torch.arange(5.0))

    def test_custom_handlers_and_key_fn_as_torch(self):
        pairs = [(name, data) for name, data in FILES.items() if name.endswith(("png", "jpg"))]
        for handlers in [(imagehandler("pil"),), (imagehandler("l8"), basichandlers)]:
            ours = list(IterableWrapper(pairs).routed_decode(*handlers))
            assert same(ours, torch_routed(pairs, *handlers))
        key_fn = lambda p: p.split(".")[0]  # noqa: E731
        h = lambda key, data: key * 2  # noqa: E731
        assert list(IterableWrapper(pairs).routed_decode(h, key_fn=key_fn)) == torch_routed(pairs, h, key_fn=key_fn)

    def test_add_handler(self):
        pipe = IterableWrapper([("a.txt", b"x"), ("b.cls", b"1")]).routed_decode()
        it = iter(pipe)
        pipe.add_handler(lambda ext, data: "mine" if ext == "txt" else None)
        assert list(pipe) == [("a.txt", "mine"), ("b.cls", 1)]
        assert list(it) == [("a.txt", "x"), ("b.cls", 1)]  # a pass keeps the handlers it started with

    def test_functional_and_class(self):
        src = IterableWrapper([("a.cls", b"1")])
        assert isinstance(src.routed_decode(), RoutedDecoder)
        assert list(RoutedDecoder(src, basichandlers)) == [("a.cls", 1)]
        assert IterDataPipe.routed_decode is not None

    def test_len(self, files):
        assert len(IterableWrapper([("a.cls", b"1")] * 3).routed_decode()) == 3
        with pytest.raises(TypeError, match="RoutedDecoder instance doesn't have valid length|valid length"):
            len(decoded_files(files))

    def test_errors_name_stage_and_file(self):
        pipe = IterableWrapper([("a.json", b"{}"), ("b.json", b"{")]).routed_decode()
        it = iter(pipe)
        assert next(it) == ("a.json", {})
        with pytest.raises(json.JSONDecodeError) as info:
            next(it)
        assert any("RoutedDecoder" in n and "'b.json'" in n for n in info.value.__notes__)
        with pytest.raises(TypeError, match="RoutedDecoder.*pairs"):
            list(IterableWrapper([1]).routed_decode())

    def test_argument_errors(self):
        src = IterableWrapper([])
        with pytest.raises(TypeError, match="RoutedDecoder: datapipe must be an IterDataPipe or an iterable"):
            RoutedDecoder(3)  # a list of pairs is taken, as torch's (tests/compat/test_reference_misc.py)
        with pytest.raises(TypeError, match="RoutedDecoder.*handlers\\[1\\]"):
            RoutedDecoder(src, basichandlers, "rgb8")
        with pytest.raises(TypeError, match="RoutedDecoder.*key_fn"):
            RoutedDecoder(src, key_fn=None)
        with pytest.raises(TypeError, match="add_handler"):
            RoutedDecoder(src).add_handler(1)

    def test_check_datapipe(self, files):
        check_datapipe(
            IterableWrapper(list(FILES.items())).routed_decode(allow_pickle=True),
            build=lambda src: src.map(lambda i: (f"{i}.cls", str(i).encode())).routed_decode(),
        )
        check_datapipe(decoded_files(files))

    def test_resume(self, files):
        check_resume(lambda: decoded_files(files), EVERY_K)
        assert RoutedDecoder._stateless is True

    def test_pickle_with_lambda(self):
        pipe = IterableWrapper([("a.txt", b"x")]).routed_decode(lambda ext, data: data * 2, key_fn=lambda p: p)
        assert list(pickle.loads(pickle.dumps(pipe))) == [("a.txt", b"xx")]
        assert list(pickle.loads(pickle.dumps(IterableWrapper([("a.cls", b"4")]).routed_decode()))) == [("a.cls", 4)]


# -- StreamReader ----------------------------------------------------------------------------------


class Unreopenable(IterDataPipe):
    """Open files from paths, but not an opener: no way to open one again."""

    stateless = True  # its position is its source's: it opens each file as it yields it

    def __init__(self, paths):
        self.paths = paths

    def __iter__(self):
        return ((p, open(p, "rb")) for p in self.paths)  # noqa: SIM115


def bin_files(tmp_path):
    for name, data in (("a.bin", b"abcdefgh"), ("b.bin", b""), ("c.bin", b"0123456789x")):
        (tmp_path / name).write_bytes(data)
    return tmp_path


class TestStreamReader:
    @pytest.mark.parametrize("chunk", [None, 1, 3, 100])
    def test_as_torch(self, chunk):
        def pairs():
            return [("a", io.BytesIO(b"abcdefg")), ("e", io.BytesIO(b"")), ("t", io.StringIO("hello world"))]

        ours = list(IterableWrapper(pairs(), deepcopy=False).read_from_stream(chunk))
        theirs = list(tdp.StreamReader(tdp.IterableWrapper(pairs(), deepcopy=False), chunk))
        assert ours == theirs

    def test_files_and_closing(self, tmp_path):
        root = bin_files(tmp_path)
        pipe = FileLister(str(root)).open_files(mode="b").read_from_stream(chunk=4)
        got = [(os.path.basename(p), d) for p, d in pipe]
        assert got == [("a.bin", b"abcd"), ("a.bin", b"efgh"), ("c.bin", b"0123"), ("c.bin", b"4567"), ("c.bin", b"89x")]
        streams = [io.BytesIO(b"ab"), io.BytesIO(b"c")]
        assert list(StreamReader(IterableWrapper(list(zip("xy", streams)), deepcopy=False))) == [("x", b"ab"), ("y", b"c")]
        assert all(s.closed for s in streams)

    def test_close_inside_a_stream_closes_it(self):
        s = io.BytesIO(b"abcdef")
        it = iter(IterableWrapper([("x", s)], deepcopy=False).read_from_stream(2))
        assert next(it) == ("x", b"ab")
        it.close()
        assert s.closed

    def test_len(self):
        # torch's StreamReader defines no __len__: Python's "has no len()" is what ported code matches
        with pytest.raises(TypeError, match=r"^StreamReader\(None\) has no len\(\): the number of chunks"):
            len(IterableWrapper([("a", io.BytesIO())]).read_from_stream())

    def test_argument_errors(self):
        src = IterableWrapper([])
        for bad in (0, -1, "3", 1.5):
            with pytest.raises((TypeError, ValueError), match="StreamReader.*chunk"):
                StreamReader(src, bad)
        with pytest.raises(TypeError, match="StreamReader.*datapipe"):
            StreamReader([("a", io.BytesIO())])

    def test_errors(self):
        class Failing(io.RawIOBase):
            def readable(self):
                return True

            def readinto(self, b):
                raise OSError("disk gone")

        with pytest.raises(OSError, match="disk gone") as info:
            list(IterableWrapper([("bad.bin", Failing())], deepcopy=False).read_from_stream(2))
        assert any("StreamReader" in n and "'bad.bin'" in n for n in info.value.__notes__)
        with pytest.raises(TypeError, match="StreamReader.*pairs"):
            list(IterableWrapper([b"x"]).read_from_stream())

    def test_check_datapipe(self, tmp_path):
        root = bin_files(tmp_path)
        check_datapipe(
            IterableWrapper([("a", io.BytesIO(b"abcde")), ("b", io.StringIO("xyz"))], deepcopy=True).read_from_stream(2),
            [("a", b"ab"), ("a", b"cd"), ("a", b"e"), ("b", "xy"), ("b", "z")],
            build=lambda src: src.map(lambda i: (str(i), io.BytesIO(b"x" * i))).read_from_stream(1),
        )
        check_datapipe(FileLister(str(root)).open_files(mode="b").read_from_stream(3))

    @pytest.mark.parametrize("chunk", [1, 3, None])
    def test_resume_through_the_opener(self, tmp_path, chunk):
        root = bin_files(tmp_path)
        check_resume(lambda: FileLister(str(root)).open_files(mode="b").read_from_stream(chunk), EVERY_K)
        check_resume(lambda: FileLister(str(root)).open_files(mode="r").read_from_stream(chunk), EVERY_K)

    def test_resume_in_memory(self):
        def build():
            return IterableWrapper([("a", io.BytesIO(b"abcdefg")), ("t", io.StringIO("hi\r\nthere"))]).read_from_stream(2)

        check_resume(build, EVERY_K)
        check_resume(build, EVERY_K, through="torch")

    def test_resume_inside_stream(self, tmp_path):
        root = bin_files(tmp_path)
        pipe = FileLister(str(root)).open_files(mode="b").read_from_stream(3)
        it = iter(pipe)
        first = [next(it) for _ in range(4)]
        state = pickle.loads(pickle.dumps(it.state_dict()))
        it.close()
        it2 = iter(FileLister(str(root)).open_files(mode="b").read_from_stream(3))
        it2.load_state_dict(state)
        rest = list(it2)
        assert [d for _, d in first + rest] == [b"abc", b"def", b"gh", b"012", b"345", b"678", b"9x"]

    def test_unreopenable_stream_refuses_state(self, tmp_path):
        root = bin_files(tmp_path)
        pipe = Unreopenable([str(root / "a.bin")]).read_from_stream(3)
        it = iter(pipe)
        next(it)
        with pytest.raises(TypeError, match="StreamReader"):
            it.state_dict()
        it.close()
        it = iter(pipe)
        it.state_dict()  # before any stream, the position is the source's: fine
        assert [d for _, d in it] == [b"abc", b"def", b"gh"]

    def test_pickle(self):
        pipe = IterableWrapper([("a", io.BytesIO(b"abc"))]).read_from_stream(2)
        assert list(pickle.loads(pickle.dumps(pipe))) == [("a", b"ab"), ("a", b"c")]
