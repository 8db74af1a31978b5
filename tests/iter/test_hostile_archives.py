"""Archives and the on-disk cache against crafted input: member paths that leave their archive,
cache lists a member name could forge, members bigger than their limit, truncated tars and
corrupt gzip streams (issue 37), and what already held (links skipped, truncation named, nothing
left behind by an abandoned pass).

Every archive is made here, in memory or under ``tmp_path``; a bomb is a few KiB of zeros
compressed, read against a small explicit ``max_member_size`` (the default's test uses a header
that claims a huge size and allocates nothing).
"""

import bz2
import gzip
import io
import json
import os
import re
import struct
import tarfile
import tracemalloc
import zipfile
from pathlib import Path

import fsspec
import pytest

from datapipes.iter import FileOpener, IterableWrapper, Saver, TarArchiveLoader, ZipArchiveLoader
from datapipes.iter.archive import MAX_MEMBER_SIZE

from helpers import make_tar, make_zip

MiB = 1 << 20


def pairs(contents):
    names = list(contents)
    return IterableWrapper(names).map(lambda n: (n, io.BytesIO(contents[n])))


def read_all(pipe):
    return [(path, stream.read()) for path, stream in pipe]


def notes(e):
    return getattr(e, "__notes__", [])


def tar_of(entries, mode="w", format=tarfile.GNU_FORMAT):
    """A tar of ``(name, bytes)`` files, or ``(name, TarInfo type, linkname)`` links, as bytes;
    names go into the headers as they are (no sanitising)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode, format=format) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry[0])
            if len(entry) == 2:
                info.size = len(entry[1])
                tar.addfile(info, io.BytesIO(entry[1]))
            else:
                info.type, info.linkname = entry[1], entry[2]
                tar.addfile(info)
    return buf.getvalue()


def zip_of(entries):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            zf.writestr(zipfile.ZipInfo(name), data)
    return buf.getvalue()


def leftovers(root):
    return sorted(p.name for p in Path(root).rglob("*") if p.name.endswith((".tmp", ".promise")))


def files_under(root):
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file())


ESCAPING = {
    "../../x": "leaves the archive",
    "sub/../../../../x": "leaves the archive",
    "..": "leaves the archive",
    "a/../..": "leaves the archive",
    "/etc/x": "is absolute",
    "//x": "is absolute",
    "C:\\x": "starts with a drive letter",
    "C:x": "starts with a drive letter",
    "..\\..\\x": "leaves the archive",
    "a\\..\\..\\x": "leaves the archive",
    "\\x": "is absolute",
    ".": "names no file inside the archive",
    "a/..": "names no file inside the archive",
}


# -- finding 3: member paths stay inside their archive; writers stay inside their folder ------------


class TestMemberPaths:
    @pytest.mark.parametrize("name", sorted(ESCAPING))
    def test_tar_member_leaving_the_archive_is_refused(self, name):
        tar = tar_of([("ok.txt", b"ok"), (name, b"evil")])
        with pytest.raises(ValueError) as info:
            read_all(pairs({"root/x.tar": tar}).load_from_tar())
        assert str(info.value) == (
            f"TarArchiveLoader('r:*'): refused member {name!r} of archive 'root/x.tar': its path {ESCAPING[name]}"
        )
        assert notes(info.value) == [
            f"[datapipes] raised in stage TarArchiveLoader('r:*') at archive 'root/x.tar', member {name!r}, entry 1"
        ]

    @pytest.mark.parametrize("name, why", [("../../x", "leaves the archive"),
                                           ("sub/../../../../x", "leaves the archive"),
                                           ("/abs.txt", "is absolute"), ("C:x", "starts with a drive letter"),
                                           ("..\\x", "leaves the archive")])
    def test_zip_member_leaving_the_archive_is_refused(self, name, why):
        zp = zip_of([("ok.txt", b"ok"), (name, b"evil")])
        with pytest.raises(ValueError, match="refused member") as info:
            read_all(pairs({"root/x.zip": zp}).load_from_zip())
        assert str(info.value) == f"ZipArchiveLoader: refused member {name!r} of archive 'root/x.zip': its path {why}"
        assert notes(info.value) == [
            f"[datapipes] raised in stage ZipArchiveLoader at archive 'root/x.zip', member {name!r}, entry 1"
        ]

    def test_paths_that_stay_inside_are_normalised_as_before(self):
        tar = tar_of([("./a.txt", b"1"), ("d//e.txt", b"2"), ("d/../f.txt", b"3"), ("d/./g.txt", b"4")])
        assert [p for p, _ in pairs({"r/x.tar": tar}).load_from_tar()] == [
            os.path.normpath(p) for p in ("r/x.tar/a.txt", "r/x.tar/d/e.txt", "r/x.tar/f.txt", "r/x.tar/d/g.txt")
        ]
        zp = zip_of([("d/../f.txt", b"3")])
        assert [p for p, _ in pairs({"r/x.zip": zp}).load_from_zip()] == [os.path.normpath("r/x.zip/f.txt")]

    def test_skip_counts_the_refused_member_and_goes_on(self):
        tar = tar_of([("a.txt", b"a"), ("../../x", b"evil"), ("b.txt", b"b")])
        zp = zip_of([("a.txt", b"a"), ("../../x", b"evil"), ("b.txt", b"b")])
        pipe = pairs({"t.tar": tar}).load_from_tar(on_error="skip")
        assert read_all(pipe) == [("t.tar/a.txt", b"a"), ("t.tar/b.txt", b"b")]
        assert pipe.failures.count == 1 and [f.position for f in pipe.failures.recent] == [1]
        pipe = pairs({"t.zip": zp}).load_from_zip(on_error="skip")
        assert read_all(pipe) == [("t.zip/a.txt", b"a"), ("t.zip/b.txt", b"b")]
        assert pipe.failures.count == 1
        with pytest.raises(ExceptionGroup, match="max_failures=0"):
            list(pairs({"t.tar": tar}).load_from_tar(on_error="skip", max_failures=0))

    def test_extract_refuses_too(self):
        with pytest.raises(ValueError, match=r"refused member '\.\./x' of archive 'x\.tar\.gz'"):
            list(pairs({"x.tar.gz": tar_of([("../x", b"evil")], "w:gz")}).extract())

    def test_end_caching_writes_nothing_outside_the_cache(self, tmp_path):
        cache = tmp_path / "a" / "cache"
        tar = tar_of([("ok.txt", b"ok"), ("../../x", b"evil"), ("sub/../../../../y", b"evil")])
        pipe = (IterableWrapper(["x.tar"]).on_disk_cache(filepath_fn=lambda n: str(cache / n))
                .map(lambda n: (n, io.BytesIO(tar))).load_from_tar(on_error="skip")
                .end_caching(filepath_fn=lambda m: str(cache / "out" / m)))
        assert list(pipe) == [str(cache / "out" / "x.tar" / "ok.txt")]
        assert files_under(tmp_path) == [os.path.join("a", "cache", "out", "x.tar", "ok.txt"),
                                         os.path.join("a", "cache", "x.tar.torchdata_list")]

    def test_end_caching_refuses_a_target_outside_the_items_folder(self, tmp_path):
        cache = tmp_path / "cache"
        cache.mkdir()
        pipe = (IterableWrapper(["x.tar"]).on_disk_cache(filepath_fn=lambda n: str(cache / n))
                .flatmap(lambda n: [("ok.txt", b"1"), ("../escaped.txt", b"2")])
                .end_caching(filepath_fn=lambda m: os.path.join(str(cache), m)))
        with pytest.raises(ValueError) as info:
            list(pipe)
        target = os.path.join(str(cache), "../escaped.txt")
        assert str(info.value) == (
            f"EndOnDiskCacheHolder('wb'): refusing to write {target!r}: it is outside the folder {str(cache)!r} "
            "(the folder of the path on_disk_cache named for its item; pass root=... to name another)"
        )
        assert "[datapipes] raised in stage EndOnDiskCacheHolder('wb') at item 1" in notes(info.value)
        assert not (tmp_path / "escaped.txt").exists() and leftovers(tmp_path) == []

    def test_end_caching_root(self, tmp_path):
        cache = tmp_path / "cache"
        # Files extracted beside the folder of the path on_disk_cache names: allowed by root.
        pipe = (IterableWrapper(["x"]).on_disk_cache(filepath_fn=lambda n: str(cache / "marks" / n))
                .flatmap(lambda n: [("a.txt", b"1"), ("b.txt", b"2")])
                .end_caching(filepath_fn=lambda m: str(cache / "files" / m), root=str(cache)))
        assert list(pipe) == [str(cache / "files" / "a.txt"), str(cache / "files" / "b.txt")]
        assert list(pipe) == [str(cache / "files" / "a.txt"), str(cache / "files" / "b.txt")]  # from the list
        pipe = (IterableWrapper(["y"]).on_disk_cache(filepath_fn=lambda n: str(cache / n))
                .map(lambda n: (n, b"1")).end_caching(filepath_fn=lambda m: str(tmp_path / m), root=str(cache)))
        with pytest.raises(ValueError, match=r"refusing to write '.*/y': it is outside the folder '.*/cache'"):
            list(pipe)
        with pytest.raises(TypeError, match="EndOnDiskCacheHolder: root must be a str or os.PathLike path or None"):
            IterableWrapper(["y"]).on_disk_cache().end_caching(root=3)

    def test_save_to_disk_refuses_a_path_climbing_out_of_its_folder(self, tmp_path):
        out = tmp_path / "out"
        pipe = IterableWrapper([("x.tar/a.txt", "a"), ("x.tar/../../b.txt", "b")]).save_to_disk(
            filepath_fn=lambda m: os.path.join(str(out), m))
        with pytest.raises(ValueError) as info:
            list(pipe)
        target = os.path.join(str(out), "x.tar/../../b.txt")
        folder = os.path.join(str(out), "x.tar")
        assert str(info.value) == (
            f"Saver('w'): refusing to write {target!r}: it is outside the folder {folder!r} "
            "(which the path names before its '..'; normalise the path, or pass root=... to name the folder)"
        )
        assert notes(info.value) == ["[datapipes] raised in stage Saver('w') at item 1"]
        assert files_under(tmp_path) == [os.path.join("out", "x.tar", "a.txt")]
        with pytest.raises(ValueError, match="outside the folder"):  # the rule: not out of what it names first
            list(IterableWrapper([(str(out / "d" / ".." / "c.txt"), "c")]).save_to_disk())

    def test_save_to_disk_writes_paths_that_stay_inside_as_before(self, tmp_path, monkeypatch):
        (tmp_path / "work").mkdir()
        monkeypatch.chdir(tmp_path / "work")
        targets = ["../up.txt", str(tmp_path / "d" / ".." / "d" / "e.txt"), str(tmp_path / "abs.txt")]
        assert list(IterableWrapper([(t, "x") for t in targets]).save_to_disk()) == targets
        assert files_under(tmp_path) == ["abs.txt", os.path.join("d", "e.txt"), "up.txt"]

    def test_save_to_disk_root(self, tmp_path):
        out = tmp_path / "out"
        pipe = IterableWrapper([("a.txt", "a"), ("/etc/b.txt", "b")]).save_to_disk(
            filepath_fn=lambda m: os.path.join(str(out), m), root=str(out))
        with pytest.raises(ValueError) as info:
            list(pipe)
        assert str(info.value) == f"Saver('w'): refusing to write '/etc/b.txt': it is outside the folder {str(out)!r}"
        assert files_under(tmp_path) == [os.path.join("out", "a.txt")]
        assert list(Saver(IterableWrapper([(str(out / "s" / "c.txt"), "c")]), root=out)) == [str(out / "s" / "c.txt")]
        with pytest.raises(TypeError, match="Saver: root must be a str or os.PathLike path or None, got int"):
            IterableWrapper([]).save_to_disk(root=1)

    @pytest.mark.parametrize(("url", "root", "folder"), [
        ("memory://hostile-out/x.tar/../../elsewhere/y", None, "memory://hostile-out/x.tar"),
        ("memory://elsewhere/y", "memory://hostile-out", "memory://hostile-out"),
        ("memory://hostile-out/../elsewhere/y", "memory://hostile-out", "memory://hostile-out"),
        ("file:///tmp/y", "memory://hostile-out", "memory://hostile-out"),
    ])
    def test_save_by_fsspec_refuses_a_url_outside_its_folder(self, url, root, folder):
        fs = fsspec.filesystem("memory")
        pipe = IterableWrapper([("a", b"a"), ("b", b"b")]).save_by_fsspec(
            mode="wb", filepath_fn=lambda m: "memory://hostile-out/a" if m == "a" else url, root=root)
        try:
            with pytest.raises(ValueError, match=rf"FSSpecSaver\('wb'\): refusing to write '{re.escape(url)}': it is "
                                                 rf"outside the folder '{re.escape(folder)}'"):
                list(pipe)
            assert fs.exists("/hostile-out/a") and not fs.exists("/elsewhere/y")  # the first written, nothing else
        finally:
            for d in ("/hostile-out", "/elsewhere"):
                if fs.exists(d):
                    fs.rm(d, recursive=True)

    def test_save_by_fsspec_writes_urls_that_stay_inside_as_before(self):
        fs = fsspec.filesystem("memory")
        urls = ["memory://hostile-in/a", "memory://hostile-in/d/../d/b"]
        try:
            pipe = IterableWrapper(list(zip(urls, [b"a", b"b"]))).save_by_fsspec(mode="wb")
            assert list(pipe) == urls and fs.cat("/hostile-in/a") == b"a"
            pipe = IterableWrapper(list(zip(urls, [b"a", b"b"]))).save_by_fsspec(mode="wb", root="memory://hostile-in")
            assert list(pipe) == urls
        finally:
            fs.rm("/hostile-in", recursive=True)


# -- finding 4: the cache list cannot be forged by a member name -------------------------------------


class TestCacheList:
    def build(self, cache, tar, fetched):
        def fetch(n):
            fetched.append(n)
            return n, io.BytesIO(tar)

        return (IterableWrapper(["x.tar"]).on_disk_cache(filepath_fn=lambda n: str(cache / n))
                .map(fetch).load_from_tar().end_caching(filepath_fn=lambda m: str(cache / "out" / m)))

    def test_a_newline_in_a_member_name_forges_nothing(self, tmp_path):
        secret = tmp_path / "outside" / "secret"
        secret.parent.mkdir()
        secret.write_text("not for the cache")
        cache = tmp_path / "cache"
        name = f"f\n{secret}"
        # Listed one per line, "f" and this name would make the lines ".../f", ".../f", "<secret>".
        tar = tar_of([("f", b"f"), (name, b"member")])
        fetched = []
        first = list(self.build(cache, tar, fetched))
        assert first == [str(cache / "out" / "x.tar" / "f"), str(cache / "out" / "x.tar" / name)]
        again = list(self.build(cache, tar, fetched))
        assert again == first and fetched == ["x.tar"]  # read from the list, and nothing else
        listed = json.loads((cache / "x.tar.torchdata_list").read_text())
        assert listed == {"datapipes_cache_list": 1, "files": first}

    def test_an_old_newline_list_is_read_when_its_files_are_inside(self, tmp_path):
        cache = tmp_path / "cache"
        tar = tar_of([("a.txt", b"a"), ("b.txt", b"b")])
        fetched = []
        first = list(self.build(cache, tar, fetched))
        (cache / "x.tar.torchdata_list").write_text("".join(f"{p}\n" for p in first))  # as torchdata writes it
        assert list(self.build(cache, tar, fetched)) == first and fetched == ["x.tar"]

    @pytest.mark.parametrize("old_format", [True, False])
    def test_a_list_naming_a_file_outside_is_not_trusted(self, tmp_path, old_format):
        secret = tmp_path / "secret"
        secret.write_text("x")
        cache = tmp_path / "cache"
        tar = tar_of([("a.txt", b"a")])
        fetched = []
        first = list(self.build(cache, tar, fetched))
        forged = first + [str(secret)]
        text = "".join(f"{p}\n" for p in forged) if old_format else json.dumps(
            {"datapipes_cache_list": 1, "files": forged})
        (cache / "x.tar.torchdata_list").write_text(text)
        assert list(self.build(cache, tar, fetched)) == first and fetched == ["x.tar", "x.tar"]  # made again
        assert json.loads((cache / "x.tar.torchdata_list").read_text())["files"] == first  # and listed anew

    @pytest.mark.parametrize("text", ["{", "{}", '{"datapipes_cache_list": 2, "files": []}',
                                      '{"datapipes_cache_list": 1, "files": [3]}', "[]"])
    def test_a_list_in_an_unknown_form_is_not_trusted(self, tmp_path, text):
        cache = tmp_path / "cache"
        tar = tar_of([("a.txt", b"a")])
        fetched = []
        first = list(self.build(cache, tar, fetched))
        (cache / "x.tar.torchdata_list").write_text(text)
        assert list(self.build(cache, tar, fetched)) == first and fetched == ["x.tar", "x.tar"]


# -- finding 6: members are bounded --------------------------------------------------------------------


def bomb_tar(size=4 * MiB, mode="w:gz"):
    return tar_of([("a.txt", b"a"), ("big.bin", bytes(size)), ("b.txt", b"b")], mode)


def peak_while(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


class TestMemberSize:
    def test_the_default_is_documented_and_generous(self):
        assert MAX_MEMBER_SIZE == 1 << 30
        assert "max_member_size" in TarArchiveLoader.__doc__ and "max_member_size" in ZipArchiveLoader.__doc__

    def test_tar_member_over_the_limit(self):
        tar = bomb_tar()
        assert len(tar) < 20_000

        def run():
            with pytest.raises(ValueError) as info:
                read_all(pairs({"bomb.tar.gz": tar}).load_from_tar(max_member_size=MiB))
            assert str(info.value) == (
                "TarArchiveLoader('r:*'): member 'big.bin' of archive 'bomb.tar.gz' is 4194304 bytes, more than "
                "max_member_size=1048576 (pass a larger max_member_size, or None for no limit)"
            )
            assert notes(info.value) == ["[datapipes] raised in stage TarArchiveLoader('r:*') at archive "
                                         "'bomb.tar.gz', member 'big.bin', entry 1"]

        assert peak_while(run) < MiB

    def test_tar_member_over_the_limit_skipped(self):
        pipe = pairs({"bomb.tar.gz": bomb_tar()}).load_from_tar(max_member_size=MiB, on_error="skip")
        got = []
        assert peak_while(lambda: got.extend(read_all(pipe))) < MiB
        assert got == [("bomb.tar.gz/a.txt", b"a"), ("bomb.tar.gz/b.txt", b"b")] and pipe.failures.count == 1

    def test_tar_header_claiming_more_than_the_default(self):
        info = tarfile.TarInfo("huge.bin")
        info.size = MAX_MEMBER_SIZE + 1
        tar = info.tobuf(tarfile.GNU_FORMAT) + bytes(512)  # the header, and nothing of its data
        with pytest.raises(ValueError, match=r"member 'huge\.bin' of archive 'h\.tar' is 1073741825 bytes, more "
                                             r"than max_member_size=1073741824"):
            read_all(pairs({"h.tar": tar}).load_from_tar())

    def test_no_limit(self):
        tar = bomb_tar(2 * MiB)
        got = read_all(pairs({"x.tar.gz": tar}).load_from_tar(max_member_size=None))
        assert [len(d) for _, d in got] == [1, 2 * MiB, 1]

    def test_zip_member_over_the_limit(self):
        zp = make_zip([("a.txt", b"a"), ("big.bin", bytes(4 * MiB)), ("b.txt", b"b")])
        assert len(zp) < 20_000

        def run():
            with pytest.raises(ValueError) as info:
                read_all(pairs({"bomb.zip": zp}).load_from_zip(max_member_size=MiB))
            assert str(info.value) == (
                "ZipArchiveLoader: member 'big.bin' of archive 'bomb.zip' is 4194304 bytes, more than "
                "max_member_size=1048576 (pass a larger max_member_size, or None for no limit)"
            )
            assert notes(info.value) == [
                "[datapipes] raised in stage ZipArchiveLoader at archive 'bomb.zip', member 'big.bin', entry 1"
            ]

        assert peak_while(run) < MiB
        pipe = pairs({"bomb.zip": zp}).load_from_zip(max_member_size=MiB, on_error="skip")
        assert read_all(pipe) == [("bomb.zip/a.txt", b"a"), ("bomb.zip/b.txt", b"b")] and pipe.failures.count == 1

    @staticmethod
    def with_central_size(zp, size):
        """``zp`` (one member) with the uncompressed size of its central directory entry replaced."""
        at = zp.index(b"PK\x01\x02")
        return zp[: at + 24] + struct.pack("<I", size) + zp[at + 28:]

    def test_zip_header_claiming_more_than_the_default(self):
        zp = self.with_central_size(make_zip([("huge.bin", b"small")]), 0xFFFF_FFF0)
        with pytest.raises(ValueError, match=r"member 'huge\.bin' of archive 'h\.zip' is 4294967280 bytes, more "
                                             r"than max_member_size=1073741824"):
            read_all(pairs({"h.zip": zp}).load_from_zip())

    def test_zip_header_understating_its_size(self):
        # The directory says 100 bytes, the data inflates to 4 MiB: never more than the limit is read.
        zp = self.with_central_size(make_zip([("big.bin", bytes(4 * MiB))]), 100)

        def run():
            with pytest.raises(zipfile.BadZipFile) as info:
                read_all(pairs({"lie.zip": zp}).load_from_zip(max_member_size=MiB))
            assert "member 'big.bin'" in notes(info.value)[0]

        assert peak_while(run) < MiB

    def test_webdataset_and_extract_pass_the_limit(self):
        with pytest.raises(ValueError, match="max_member_size=1048576"):
            list(pairs({"bomb.tar.gz": bomb_tar()}).load_from_tar(max_member_size=MiB).webdataset())
        with pytest.raises(ValueError, match="max_member_size=1048576") as info:
            list(pairs({"bomb.tar.gz": bomb_tar()}).extract(max_member_size=MiB))
        assert notes(info.value) == [
            "[datapipes] raised in stage Extractor at archive 'bomb.tar.gz', member 'big.bin', entry 1"
        ]
        with pytest.raises(ValueError, match="max_member_size=1048576"):
            list(pairs({"bomb.zip": make_zip([("big.bin", bytes(2 * MiB))])}).extract(max_member_size=MiB))

    @pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError), ("1", TypeError)])
    def test_bad_limits(self, bad, error):
        with pytest.raises(error, match="TarArchiveLoader: max_member_size"):
            pairs({}).load_from_tar(max_member_size=bad)
        with pytest.raises(error, match="ZipArchiveLoader: max_member_size"):
            pairs({}).load_from_zip(max_member_size=bad)
        with pytest.raises(error, match="Extractor: max_member_size"):
            pairs({}).extract(max_member_size=bad)


# -- finding 9: a tar cut at a member boundary ------------------------------------------------------------


class TestTruncatedTar:
    TAR = tar_of([("0.jpg", b"j" * 600), ("0.cls", b"1"), ("1.jpg", b"k" * 600), ("1.cls", b"2")])
    CUT = 512 + 1024 + 512 + 512  # the first two members, headers and data, and nothing after
    END = 2 * CUT  # the four members, before the end-of-archive blocks

    def test_cut_at_a_member_boundary_raises(self):
        got = []
        with pytest.raises(tarfile.ReadError) as info:
            for path, stream in pairs({"s.tar": self.TAR[: self.CUT]}).load_from_tar():
                got.append(path)
        assert got == ["s.tar/0.jpg", "s.tar/0.cls"]  # what was there, then the error
        assert str(info.value) == (
            "archive 's.tar' ends after 2 entries without the end-of-archive blocks: it is truncated"
        )
        assert notes(info.value) == ["[datapipes] raised in stage TarArchiveLoader('r:*') at archive 's.tar', entry 2"]

    def test_through_webdataset_and_gzip(self):
        with pytest.raises(tarfile.ReadError, match="archive 's.tar' ends after 2 entries"):
            list(pairs({"s.tar": self.TAR[: self.CUT]}).load_from_tar().webdataset())
        with pytest.raises(tarfile.ReadError, match="archive 's.tar.gz' ends after 2 entries"):
            list(pairs({"s.tar.gz": gzip.compress(self.TAR[: self.CUT])}).load_from_tar())

    def test_skip_counts_it(self):
        pipe = pairs({"s.tar": self.TAR[: self.CUT], "t.tar": self.TAR}).load_from_tar(on_error="skip")
        assert len(list(pipe)) == 6 and pipe.failures.count == 1

    def test_end_blocks_with_or_without_padding(self):
        assert len(self.TAR) == 10240 and self.TAR[self.END:] == bytes(len(self.TAR) - self.END)
        for end in (10240, self.END + 1024, self.END + 700, self.END + 512):  # padded, two zero blocks, one
            assert len(read_all(pairs({"s.tar": self.TAR[:end]}).load_from_tar())) == 4

    def test_empty_and_end_only(self):
        assert read_all(pairs({"e.tar": make_tar([])}).load_from_tar()) == []
        with pytest.raises(tarfile.ReadError, match="empty file"):
            read_all(pairs({"e.tar": b""}).load_from_tar())


# -- finding 10: the gzip stream of a .tar.gz is checked ----------------------------------------------------


class TestGzipTar:
    TAR = tar_of([("a.bin", b"a" * 3000), ("b.bin", b"b" * 3000)])

    def stored(self):
        """The tar gzipped without compression (stored deflate blocks): a flipped data bit is no
        deflate error, only the CRC-32 can tell."""
        return gzip.compress(self.TAR, compresslevel=0, mtime=0)

    def test_a_flipped_bit_raises(self):
        gz = bytearray(self.stored())
        at = 10 + 5 + 512 + 100  # the gzip header, the stored block's header, a.bin's header, into its data
        assert gz[at] == ord("a")
        gz[at] ^= 0x01
        with pytest.raises(tarfile.ReadError) as info:
            read_all(pairs({"s.tar.gz": bytes(gz)}).load_from_tar())
        assert str(info.value).startswith(
            "archive 's.tar.gz': the gzip stream is corrupt or truncated: CRC check failed")
        assert notes(info.value) == [
            "[datapipes] raised in stage TarArchiveLoader('r:*') at archive 's.tar.gz', entry 2"]

    @pytest.mark.parametrize("cut", [8, 4, 1])
    def test_a_missing_or_cut_trailer_raises(self, cut):
        gz = gzip.compress(self.TAR)[:-cut]
        with pytest.raises(tarfile.ReadError, match="archive 's.tgz': the gzip stream is corrupt or truncated"):
            read_all(pairs({"s.tgz": gz}).load_from_tar())

    def test_a_wrong_size_in_the_trailer_raises(self):
        gz = bytearray(gzip.compress(self.TAR))
        gz[-1] ^= 0x01
        with pytest.raises(tarfile.ReadError, match="Incorrect length of data produced"):
            read_all(pairs({"s.tar.gz": bytes(gz)}).load_from_tar(mode="r:gz"))

    def test_zero_padding_passes_and_garbage_raises(self):
        gz = gzip.compress(self.TAR)
        assert len(list(pairs({"s.tar.gz": gz + bytes(1000)}).load_from_tar())) == 2
        with pytest.raises(tarfile.ReadError, match=r"the gzip stream is corrupt or truncated: Not a gzipped file"):
            list(pairs({"s.tar.gz": gz + b"garbage"}).load_from_tar())

    @pytest.mark.parametrize("mode, kind", [("w:bz2", "bzip2"), ("w:xz", "xz")])
    def test_truncated_bz2_and_xz_raise(self, mode, kind):
        data = tar_of([("a.bin", b"a" * 3000)], mode)[:-12]
        with pytest.raises(tarfile.ReadError, match=f"archive 's.tar': the {kind} stream is corrupt or truncated"):
            list(pairs({"s.tar": data}).load_from_tar())

    def test_good_streams_still_read(self):
        two_members = gzip.compress(self.TAR[:4096]) + gzip.compress(self.TAR[4096:])
        for mode in ("r:*", "r|gz", "r:gz"):
            got = [p for p, _ in pairs({"s.tar.gz": two_members}).load_from_tar(mode)]
            assert got == ["s.tar.gz/a.bin", "s.tar.gz/b.bin"]
        for level in (1, 9):  # any bzip2 block size is told apart (tarfile's own detection knows only 9)
            assert len(read_all(pairs({"s.tbz": bz2.compress(self.TAR, level)}).load_from_tar())) == 2

    def test_decompress_checks_the_crc(self):
        gz = bytearray(gzip.compress(b"x" * 1000, compresslevel=0))
        gz[20] ^= 0x01
        (path, reader), = list(pairs({"f.txt.gz": bytes(gz)}).decompress())
        with pytest.raises(gzip.BadGzipFile, match="CRC check failed") as info:
            reader.read()
        assert notes(info.value) == ["[datapipes] raised in stage Decompressor at file 'f.txt.gz', item 0"]

    def test_errors_of_the_source_pass_through(self):
        class Failing(io.RawIOBase):
            def __init__(self):
                self.inner = io.BytesIO(gzip.compress(make_tar([("r.bin", os.urandom(5000))])))

            def readable(self):
                return True

            def readinto(self, b):
                if self.inner.tell() > 100:
                    raise ConnectionResetError("reset by peer")
                return self.inner.readinto(memoryview(b)[:50])

        with pytest.raises(ConnectionResetError, match="reset by peer"):
            list(IterableWrapper([("s.tar.gz", Failing())], deepcopy=False).load_from_tar())


# -- what held already, and must go on holding ---------------------------------------------------------------


class TestStillHolds:
    def test_tar_links_are_skipped(self):
        tar = tar_of([("a.txt", b"a"), ("sym", tarfile.SYMTYPE, "../../../etc/passwd"),
                      ("hard", tarfile.LNKTYPE, "a.txt"), ("hard2", tarfile.LNKTYPE, "/etc/passwd"),
                      ("b.txt", b"b")])
        assert read_all(pairs({"x.tar": tar}).load_from_tar()) == [("x.tar/a.txt", b"a"), ("x.tar/b.txt", b"b")]

    def test_truncated_zip_and_gzip_name_the_file_and_position(self):
        zp = make_zip([("a.txt", b"a" * 100)])
        with pytest.raises(zipfile.BadZipFile) as info:
            read_all(pairs({"z.zip": zp[:-30]}).load_from_zip())
        assert notes(info.value) == ["[datapipes] raised in stage ZipArchiveLoader at archive 'z.zip', item 0"]
        gz = gzip.compress(os.urandom(50_000))[:20_000]
        (path, reader), = list(pairs({"t.gz": gz}).decompress())
        with pytest.raises(EOFError) as info:
            reader.read()
        assert notes(info.value) == ["[datapipes] raised in stage Decompressor at file 't.gz', item 0"]
        tgz = gzip.compress(tar_of([("a.bin", os.urandom(20_000))]))[:8000]
        with pytest.raises(tarfile.ReadError) as info:
            read_all(pairs({"t.tar.gz": tgz}).load_from_tar())
        assert notes(info.value) == [
            "[datapipes] raised in stage TarArchiveLoader('r:*') at archive 't.tar.gz', member 'a.bin', entry 0"
        ]

    @pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")
    @pytest.mark.parametrize("name, data", [("x.tar.gz", gzip.compress(make_tar([("a", b"a"), ("b", b"b")]))),
                                            ("x.tar.xz", make_tar([("a", b"a"), ("b", b"b")], "w:xz")),
                                            ("x.zip", make_zip([("a", b"a"), ("b", b"b")]))])
    def test_an_abandoned_pass_leaves_no_descriptor(self, tmp_path, name, data, no_thread_leak):
        (tmp_path / name).write_bytes(data)
        before = len(os.listdir("/proc/self/fd"))
        pipe = FileOpener([str(tmp_path / name)], mode="b")
        pipe = pipe.load_from_zip() if name.endswith(".zip") else pipe.load_from_tar()
        it = iter(pipe)
        next(it)
        it.close()
        assert len(os.listdir("/proc/self/fd")) == before
        with pytest.raises(tarfile.ReadError):  # and a failing one
            list(FileOpener([str(tmp_path / name)], mode="b").load_from_tar(mode="r:bz2"))
        assert len(os.listdir("/proc/self/fd")) == before

    def test_a_refused_write_leaves_no_temporary_file(self, tmp_path):
        cache = tmp_path / "cache"
        pipe = (IterableWrapper(["x"]).on_disk_cache(filepath_fn=lambda n: str(cache / n))
                .flatmap(lambda n: [("a", b"1"), ("../../b", b"2")])
                .end_caching(filepath_fn=lambda m: os.path.join(str(cache), m)))
        it = iter(pipe)
        assert next(it) == str(cache / "a")
        with pytest.raises(ValueError, match="refusing to write"):
            next(it)
        assert leftovers(tmp_path) == [] and files_under(tmp_path) == [os.path.join("cache", "a")]

