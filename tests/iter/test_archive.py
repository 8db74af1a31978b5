"""TarArchiveLoader, ZipArchiveLoader, WebDatasetGrouper, Decompressor over generated archives."""

import bz2
import gzip
import io
import lzma
import os
import random
import tarfile
import zipfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from datapipes._runtime import passes as _pass
from datapipes.iter import Decompressor, IterableWrapper, TarArchiveLoader, WebDatasetGrouper, ZipArchiveLoader
from datapipes.testing import check_datapipe

from helpers import Guarded, NonSeekable, error_of_pass, gc_off, make_tar, make_zip  # noqa: F401 - gc_off is a fixture


def pairs(contents, wrap=io.BytesIO):
    names = list(contents)
    return IterableWrapper(names).map(lambda n: (n, wrap(contents[n])))


def read_all(pipe):
    return [(path, stream.read()) for path, stream in pipe]


def notes(e):
    return getattr(e, "__notes__", [])


MEMBERS = [("d/a.txt", b"alpha"), ("d/b.bin", bytes(range(256)) * 20), ("c.txt", b"")]


class TestTarArchiveLoader:
    def test_contract(self):
        tar = make_tar(MEMBERS)
        pipe = pairs({"x.tar": tar, "y.tar": tar}).load_from_tar().map(lambda p: (p[0], p[1].read()))
        want = [(f"x.tar/{n}", d) for n, d in MEMBERS] + [(f"y.tar/{n}", d) for n, d in MEMBERS]
        check_datapipe(pipe, expected=want, build=lambda src: src.map(lambda i: (f"{i}.tar", io.BytesIO(tar))).load_from_tar())

    @pytest.mark.parametrize("write, read", [("w", "r:*"), ("w:gz", "r:*"), ("w:bz2", "r:bz2"), ("w:xz", "r|*"), ("w", "r:"), ("w:gz", "r")])
    def test_compressions_and_modes(self, write, read):
        tar = make_tar(MEMBERS, write)
        assert read_all(pairs({"x.tar": tar}).load_from_tar(read)) == [(f"x.tar/{n}", d) for n, d in MEMBERS]

    def test_non_seekable_stream(self):
        tar = make_tar(MEMBERS, "w:gz")
        assert read_all(pairs({"x.tgz": tar}, NonSeekable).load_from_tar()) == [(f"x.tgz/{n}", d) for n, d in MEMBERS]

    def test_paths_directories_and_links(self):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            # An absolute name is refused (test_hostile_archives.py).
            for name in ("./top.txt", "e/../abs.txt", "d//e.txt"):
                info = tarfile.TarInfo(name)
                info.size = 1
                tar.addfile(info, io.BytesIO(b"1"))
            info = tarfile.TarInfo("dir")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
            info = tarfile.TarInfo("link")
            info.type = tarfile.SYMTYPE
            info.linkname = "top.txt"
            tar.addfile(info)
        got = [p for p, _ in pairs({"root/x.tar": buf.getvalue()}).load_from_tar()]
        assert got == [os.path.normpath(p) for p in ("root/x.tar/top.txt", "root/x.tar/abs.txt", "root/x.tar/d/e.txt")]

    def test_members_stay_valid_after_the_archive_moves_on(self):
        tar = make_tar([(f"{i}.bin", os.urandom(700)) for i in range(20)])
        source = io.BytesIO(tar)
        members = list(IterableWrapper([("x.tar", source)], deepcopy=False).load_from_tar())
        assert source.closed  # the archive's stream is closed once read
        random.Random(0).shuffle(members)
        for path, stream in members:
            stream.seek(0)
            assert len(stream.read()) == 700

    def test_truncated_member_names_archive_and_member(self):
        tar = make_tar([("a.bin", b"a" * 3000), ("b.bin", b"b" * 3000)])
        with pytest.raises(tarfile.ReadError, match="unexpected end of data") as info:
            read_all(pairs({"s.tar": tar[:5000]}).load_from_tar())
        assert notes(info.value) == ["[datapipes] raised in stage TarArchiveLoader('r:*') at archive 's.tar', member 'b.bin', entry 1"]

    def test_truncated_or_corrupt_header_is_not_taken_for_the_end(self):
        tar = make_tar([("a.bin", b"a" * 3000), ("b.bin", b"b" * 3000)])
        header_at = 512 + 3072
        with pytest.raises(tarfile.ReadError, match="truncated header") as info:
            read_all(pairs({"s.tar": tar[: header_at + 100]}).load_from_tar())
        assert notes(info.value) == ["[datapipes] raised in stage TarArchiveLoader('r:*') at archive 's.tar', entry 1"]
        bad = bytearray(tar)
        bad[header_at + 10] ^= 0xFF
        with pytest.raises(tarfile.ReadError, match="bad checksum"):
            read_all(pairs({"s.tar": bytes(bad)}).load_from_tar())

    def test_truncated_gzip_and_garbage(self):
        tar = make_tar([("a.bin", os.urandom(20_000))], "w:gz")
        with pytest.raises(tarfile.ReadError) as info:
            read_all(pairs({"s.tar.gz": tar[:8000]}).load_from_tar())
        assert "archive 's.tar.gz', member 'a.bin'" in notes(info.value)[0]
        with pytest.raises(tarfile.ReadError) as info:
            read_all(pairs({"ok.tar": make_tar(MEMBERS), "junk.tar": b"not a tar" * 100}).load_from_tar())
        assert notes(info.value) == ["[datapipes] raised in stage TarArchiveLoader('r:*') at archive 'junk.tar', item 1"]

    def test_skip_bad_archives(self):
        good = make_tar([("a.bin", b"a" * 3000), ("b.bin", b"b" * 3000)])
        source = {"t1.tar": good[:5000], "junk.tar": b"\x01" * 1024, "t3.tar": good}
        pipe = pairs(source).load_from_tar(on_error="skip")
        assert [p for p, _ in pipe] == ["t1.tar/a.bin", "t3.tar/a.bin", "t3.tar/b.bin"]
        assert pipe.failures.count == 2
        assert [f.position for f in pipe.failures.recent] == [1, 1]  # entry 1 of t1.tar, item 1 (junk.tar)
        with pytest.raises(ExceptionGroup):
            list(pairs(source).load_from_tar(on_error="skip", max_failures=1))

    def test_closes_streams_on_error(self):
        bad = io.BytesIO(b"garbage" * 200)
        with pytest.raises(tarfile.ReadError):
            list(IterableWrapper([("x.tar", bad)], deepcopy=False).load_from_tar())
        assert bad.closed

    def test_len(self):
        tar = make_tar(MEMBERS)
        assert len(pairs({"x.tar": tar}).load_from_tar(length=3)) == 3
        with pytest.raises(TypeError, match="TarArchiveLoader"):
            len(pairs({"x.tar": tar}).load_from_tar())

    def test_torchdata_keyword_call_and_empty(self):
        pipe = TarArchiveLoader(datapipe=pairs({"e.tar": make_tar([])}), mode="r:*", length=-1)
        check_datapipe(pipe, expected=[])

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="mode"):
            pairs({}).load_from_tar("w")
        with pytest.raises(TypeError, match="mode"):
            pairs({}).load_from_tar(3)
        with pytest.raises(ValueError, match="length"):
            pairs({}).load_from_tar(length=-2)
        with pytest.raises(TypeError, match="TarArchiveLoader: datapipe"):
            TarArchiveLoader(["x.tar"])
        with pytest.raises(TypeError, match=r"\(path, stream\) pairs"):
            list(IterableWrapper([b"tar"]).load_from_tar())

    @given(st.lists(st.tuples(st.lists(st.text("abcxyz_-", min_size=1, max_size=5), min_size=1, max_size=3),
                              st.binary(max_size=600)), max_size=8))
    def test_round_trip_in_order(self, members):
        members = [("/".join(parts), data) for parts, data in members]
        tar = make_tar(members)
        assert read_all(pairs({"r.tar": tar}).load_from_tar()) == [(f"r.tar/{n}", d) for n, d in members]


class TestZipArchiveLoader:
    def test_contract(self):
        zp = make_zip(MEMBERS)
        pipe = pairs({"x.zip": zp}).load_from_zip().map(lambda p: (p[0], p[1].read()))
        check_datapipe(pipe, expected=[(f"x.zip/{n}", d) for n, d in MEMBERS],
                       build=lambda src: src.map(lambda i: (f"{i}.zip", io.BytesIO(zp))).load_from_zip())

    def test_non_seekable_and_directories(self):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.mkdir("sub")
            zf.writestr("sub/a.txt", b"A")
        assert read_all(pairs({"x.zip": buf.getvalue()}, NonSeekable).load_from_zip()) == [("x.zip/sub/a.txt", b"A")]

    def corrupt_first(self):
        zp = bytearray(make_zip([("a.txt", b"a" * 100), ("b.txt", b"b" * 100)], zipfile.ZIP_STORED))
        zp[30 + len("a.txt") + 10] ^= 0xFF  # a byte of a.txt's data: its CRC no longer matches
        return bytes(zp)

    def test_bad_member_names_archive_and_member(self):
        with pytest.raises(zipfile.BadZipFile, match="Bad CRC-32") as info:
            read_all(pairs({"z.zip": self.corrupt_first()}).load_from_zip())
        assert notes(info.value) == ["[datapipes] raised in stage ZipArchiveLoader at archive 'z.zip', member 'a.txt', entry 0"]

    def test_truncated_archive(self):
        zp = make_zip(MEMBERS)
        with pytest.raises(zipfile.BadZipFile) as info:
            read_all(pairs({"z.zip": zp[:-30]}).load_from_zip())
        assert notes(info.value) == ["[datapipes] raised in stage ZipArchiveLoader at archive 'z.zip', item 0"]

    def test_skip_bad_member_keeps_the_others(self):
        source = {"z.zip": self.corrupt_first(), "t.zip": make_zip(MEMBERS)[:-30], "ok.zip": make_zip([("c", b"C")])}
        pipe = pairs(source).load_from_zip(on_error="skip")
        assert read_all(pipe) == [("z.zip/b.txt", b"b" * 100), ("ok.zip/c", b"C")]
        assert pipe.failures.count == 2

    def test_skip_budget_spans_archives(self):
        source = {"z.zip": self.corrupt_first(), "t.zip": make_zip(MEMBERS)[:-30], "u.zip": self.corrupt_first()}
        got = []
        with pytest.raises(ExceptionGroup, match="ZipArchiveLoader: 3 failures, more than max_failures=2") as info:
            for path, stream in pairs(source).load_from_zip(on_error="skip", max_failures=2):
                got.append(path)
        assert got == ["z.zip/b.txt"]
        assert [notes(e) for e in info.value.exceptions] == [
            ["[datapipes] raised in stage ZipArchiveLoader at archive 'z.zip', member 'a.txt', entry 0"],
            ["[datapipes] raised in stage ZipArchiveLoader at archive 't.zip', item 1"],
            ["[datapipes] raised in stage ZipArchiveLoader at archive 'u.zip', member 'a.txt', entry 0"],
        ]

    def test_len_and_keyword_call(self):
        pipe = ZipArchiveLoader(datapipe=pairs({"x.zip": make_zip(MEMBERS)}), length=3)
        assert len(pipe) == 3
        with pytest.raises(TypeError, match="ZipArchiveLoader"):
            len(pairs({}).load_from_zip())
        check_datapipe(pairs({}).load_from_zip(), expected=[])

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="length"):
            pairs({}).load_from_zip(length=-5)
        with pytest.raises(TypeError, match="ZipArchiveLoader: datapipe"):
            ZipArchiveLoader([])


class TestWebDatasetGrouper:
    def test_contract(self):
        items = [("s/0.jpg", 1), ("s/0.cls", 2), ("s/1.jpg", 3), ("s/1.seg.png", 4)]
        check_datapipe(
            IterableWrapper(items).webdataset(),
            expected=[{"__key__": "s/0", ".jpg": 1, ".cls": 2}, {"__key__": "s/1", ".jpg": 3, ".seg.png": 4}],
            build=lambda src: src.map(lambda i: (f"k{i}.txt", i)).webdataset(),
        )

    def test_shard_end_to_end(self):
        members = []
        for i in range(3):
            members += [(f"train/{i:04d}.jpg", b"J%d" % i), (f"train/{i:04d}.cls", b"%d" % i)]
        members.append(("train/README", b"no suffix: left out"))
        samples = list(pairs({"shards/a.b.tar": make_tar(members)}).load_from_tar().webdataset())
        assert [s["__key__"] for s in samples] == [f"shards/a.b.tar/train/{i:04d}" for i in range(3)]
        assert [(s[".jpg"].read(), s[".cls"].read()) for s in samples] == [(b"J%d" % i, b"%d" % i) for i in range(3)]

    def test_only_consecutive_files_group(self):
        items = [("a.x", 1), ("b.x", 2), ("a.y", 3)]
        assert list(IterableWrapper(items).webdataset()) == [{"__key__": "a", ".x": 1}, {"__key__": "b", ".x": 2},
                                                              {"__key__": "a", ".y": 3}]
        assert list(IterableWrapper([("dir\\k.x", 1)]).webdataset()) == [{"__key__": "dir/k", ".x": 1}]

    def test_duplicate_suffix(self):
        with pytest.raises(ValueError, match=r"sample 'a' has two files with the suffix '\.x'"):
            list(IterableWrapper([("a.x", 1), ("a.x", 2)]).webdataset())

    def test_bad_items_len_and_empty(self):
        with pytest.raises(TypeError, match="WebDatasetGrouper"):
            list(IterableWrapper([(1, b"")]).webdataset())
        with pytest.raises(TypeError, match="WebDatasetGrouper"):
            list(IterableWrapper(["a.x"]).webdataset())
        with pytest.raises(TypeError, match="WebDatasetGrouper"):
            len(IterableWrapper([]).webdataset())
        with pytest.raises(TypeError, match="WebDatasetGrouper: source_datapipe"):
            WebDatasetGrouper([])
        check_datapipe(IterableWrapper([("README", 1)]).webdataset(), expected=[])


TEXT = b"".join(b"line %d\n" % i for i in range(2000))
COMPRESS = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}


def _has_zstandard():
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return False
    return True


class TestDecompressor:
    def test_contract(self):
        data = {f"a.txt.{ext}": fn(TEXT) for ext, fn in COMPRESS.items()}
        pipe = pairs(data).decompress().map(lambda p: (p[0], p[1].read()))
        check_datapipe(pipe, expected=[(name, TEXT) for name in data],
                       build=lambda src: src.map(lambda i: ("x.gz", io.BytesIO(gzip.compress(b"x")))).decompress())

    @pytest.mark.parametrize("ext", ["gz", "bz2", "xz"])
    def test_explicit_type_and_lines(self, ext):
        blob = COMPRESS[ext](TEXT)
        pipe = pairs({"noext": blob}).decompress(file_type={"gz": "gzip", "bz2": "bz2", "xz": "lzma"}[ext])
        assert read_all(pipe) == [("noext", TEXT)]
        lines = list(pairs({f"f.{ext.upper()}": blob}).decompress().readlines(decode=True, return_path=False))
        assert lines == TEXT.decode().splitlines()

    def test_lazy_and_closes_the_source(self):
        blob = gzip.compress(os.urandom(1 << 20))
        source = io.BytesIO(blob)
        (path, reader), = list(IterableWrapper([("r.gz", source)], deepcopy=False).decompress())
        assert reader.read(10) and source.tell() < len(blob) // 4
        reader.close()
        assert source.closed

    def test_truncated_names_file(self):
        blob = gzip.compress(os.urandom(50_000))[:20_000]
        (path, reader), = list(pairs({"t.bin.gz": blob}).decompress())
        with pytest.raises(EOFError) as info:
            reader.read()
        assert notes(info.value) == ["[datapipes] raised in stage Decompressor at file 't.bin.gz', item 0"]
        text = lzma.compress(TEXT)[:-40]
        with pytest.raises(EOFError) as info:
            list(pairs({"t.txt.xz": text}).decompress().readlines())
        assert "[datapipes] raised in stage LineReader at file 't.txt.xz', line" in notes(info.value)[1]

    def test_truncated_skip_in_reader(self):
        blob = lzma.compress(TEXT)[:-40]
        pipe = pairs({"t.txt.xz": blob, "u.txt.gz": gzip.compress(b"u\n")}).decompress().readlines(on_error="skip")
        got = list(pipe)
        assert got[-1] == ("u.txt.gz", b"u") and len(got) > 1000 and pipe.failures.count == 1

    def test_unknown_extension_names_file(self):
        s = io.BytesIO(b"x")
        with pytest.raises(ValueError, match="cannot tell the compression of 'data.bin'") as info:
            list(IterableWrapper([("data.bin", s)], deepcopy=False).decompress())
        assert s.closed and notes(info.value)

    def test_zstd(self):
        if _has_zstandard():
            import zstandard

            blob = zstandard.ZstdCompressor().compress(TEXT)
            two_frames = blob + zstandard.ZstdCompressor().compress(b"more\n")
            assert read_all(pairs({"a.zst": two_frames}).decompress()) == [("a.zst", TEXT + b"more\n")]
            assert read_all(pairs({"a": b""}).decompress(file_type="zstd")) == [("a", b"")]
            with pytest.raises(EOFError) as info:
                list(pairs({"t.zst": blob[:-10]}).decompress().readlines())
            assert "file 't.zst'" in notes(info.value)[0]
        else:
            with pytest.raises(ModuleNotFoundError, match="zstandard"):
                pairs({}).decompress(file_type="zstd")
            with pytest.raises(ModuleNotFoundError, match="zstandard") as info:
                list(pairs({"a.zst": b"(\xb5/\xfd"}).decompress())
            assert "file 'a.zst'" in notes(info.value)[0]

    def test_len_and_keyword_call(self):
        pipe = Decompressor(source_datapipe=pairs({"a.gz": gzip.compress(b"")}), file_type=None)
        assert len(pipe) == 1
        check_datapipe(pairs({}).decompress(), expected=[])

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="load_from_tar"):
            pairs({}).decompress(file_type="tar")
        with pytest.raises(ValueError, match="file_type"):
            pairs({}).decompress(file_type="rar")
        with pytest.raises(TypeError, match="file_type"):
            pairs({}).decompress(file_type=1)
        with pytest.raises(TypeError, match="Decompressor: source_datapipe"):
            Decompressor([])


TAR = make_tar(MEMBERS)
ZIP = make_zip(MEMBERS)
GZ = gzip.compress(b"x\ny\n")

# name -> (stage over a source of pairs, what the source's pairs hold: (path, bytes))
STAGES = {
    "tar": (lambda src: src.load_from_tar(), ("x.tar", TAR)),
    "tar-skip-mode": (lambda src: src.load_from_tar(mode="r|", length=3, on_error="skip", max_failures=1), ("x.tar", TAR)),
    "zip": (lambda src: src.load_from_zip(), ("x.zip", ZIP)),
    "zip-skip": (lambda src: src.load_from_zip(length=3, on_error="skip"), ("x.zip", ZIP)),
    "webdataset": (lambda src: src.webdataset(), ("s/a.cls", b"1")),
    "tar-webdataset": (lambda src: src.load_from_tar().webdataset(), ("x.tar", TAR)),
    "decompress": (lambda src: src.decompress(), ("a.txt.gz", GZ)),
    "decompress-typed": (lambda src: src.decompress(file_type="gzip"), ("a", GZ)),
    "decompress-readlines": (lambda src: src.decompress().readlines(decode=True), ("a.txt.gz", GZ)),
}


class TestPass:
    """Each stage creates its source's iterator when its pass is built (``iter(pipe)``), reads
    nothing before the first ``next()``, and releases its source when it fails."""

    @pytest.mark.parametrize("stage", sorted(STAGES))
    def test_pass_is_built_at_iter(self, stage):
        build, (path, data) = STAGES[stage]
        opened = []

        def open_(i):
            opened.append(i)
            return f"{i}/{path}", io.BytesIO(data)

        pipe = build(IterableWrapper(range(2)).map(open_))
        it = iter(pipe)
        assert _pass.unbuilt(it) == [], _pass.unbuilt(it)
        assert opened == []  # built, not started
        assert len(list(it)) >= 2 and opened == [0, 1]
        it1, it2 = iter(pipe), iter(pipe)  # two passes of one graph at once stay apart
        assert _pass.unbuilt(it1) == _pass.unbuilt(it2) == []
        assert len(list(zip(it1, it2))) == len(list(pipe))

    @pytest.mark.usefixtures("gc_off")
    @pytest.mark.parametrize("stage", sorted(s for s in STAGES if "skip" not in s))
    def test_failing_pass_releases_its_source(self, stage):
        build, (path, data) = STAGES[stage]
        # 42, no (path, stream) pair: every stage raises TypeError there
        source = Guarded([(path, io.BytesIO(data)), 42] + [(path, io.BytesIO(data)) for _ in range(100)])
        held = error_of_pass(build(IterableWrapper(source, deepcopy=False)), TypeError, "pair")  # noqa: F841
        assert source.closed == [True]  # while the consumer holds the error, and so the stage's frame
