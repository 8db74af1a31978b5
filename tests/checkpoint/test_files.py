"""Checkpoint and resume of the file stages: listers, openers, savers, parsers, archives, images.

The law (docs/howto/checkpoint.rst): a pass stopped after k items and resumed from its state yields exactly
what the uninterrupted pass yields after its first k items. A reader stopped inside a file goes on
inside that file: it opens it again through its source (an opener) or from the in-memory copy the
state holds, and skips what it had read.
"""

import bz2
import gzip
import io
import lzma
import os
import pickle
from pathlib import Path

import fsspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datapipes.iter import (
    CSVDictParser,
    CSVFilesParser,
    CSVParser,
    Decompressor,
    FileLister,
    FileOpener,
    FSSpecFileLister,
    FSSpecFileOpener,
    FSSpecSaver,
    ImageDecoder,
    IterableWrapper,
    JsonParser,
    LineReader,
    Saver,
)
from datapipes._runtime.held import MARK
from datapipes.testing import check_resume

from helpers import StatefulSource, make_tar, make_zip, png

# -- helpers ---------------------------------------------------------------------------------------


def norm(x):
    """An item as comparable data: streams read (the pass closes them when it is closed)."""
    if isinstance(x, (tuple, list)):
        return type(x)(norm(v) for v in x)
    if isinstance(x, dict):
        return {k: norm(v) for k, v in x.items()}
    if hasattr(x, "read"):
        return ("stream", x.read())
    if hasattr(x, "tolist"):
        return ("array", x.shape, x.tolist())
    return x


def ks(n):
    return sorted({0, 1, 2, n // 2, max(n - 1, 0), n})


def check_exact(build, every=False):
    """``check_resume`` over the items as ``norm`` takes them, at every k if asked (else at ``ks``)."""
    return check_resume(build, (lambda n: range(n + 1)) if every else ks, convert=norm)


def until_error(it):
    """The items of ``it`` (normalised) and the type of the error that ended it (None at the end)."""
    out = []
    try:
        for x in it:
            out.append(norm(x))
    except Exception as e:  # noqa: BLE001 - the test compares error types
        return out, type(e)
    return out, None


def check_exact_until_error(build, error):
    """``check_exact`` at every k for a pass that ends with an exception of type ``error``: the
    resumed pass yields the rest and ends with that error too. Returns the items before it."""
    full, raised = until_error(iter(build()))
    assert raised is error, raised
    for k in range(len(full) + 1):
        it = iter(build())
        head = [norm(next(it)) for _ in range(k)]
        state = pickle.loads(pickle.dumps(it.state_dict()))
        it.close()
        again = iter(build())
        again.load_state_dict(state)
        assert (head, *until_error(again)) == (full[:k], full[k:], error), k
    return full


def tree_files():
    """The files every test reads: text, CSV, JSON, compressed, archives, images."""
    return {
        "text/a.txt": b"one\ntwo\nthree\nfour\nfive\n",
        "text/b.txt": b"",
        "text/c.txt": b"x\r\ny\r\nz",
        "text/sub/d.txt": b"d1\nd2\n",
        "text/sub/deeper/e.txt": b"e1\n",
        "csv/a.csv": b"key,n\na,1\nb,2\nc,3\nd,4\n",
        "csv/b.csv": b'key,n\n"multi\nline",5\n"q,uoted",6\n\ne,7\n',
        "csv/c.csv": b"key,n\n",
        "json/a.json": b'{"a": [1, 2]}',
        "json/b.json": b'[1, 2, 3]',
        "json/c.json": b'"text"',
        "gz/a.txt.gz": gzip.compress(b"g1\ng2\ng3\n"),
        "gz/b.txt.bz2": bz2.compress(b"b1\nb2\n"),
        "gz/c.txt.xz": lzma.compress(b"x1\n"),
        "tar/a.tar": make_tar([(f"s/{i}.{ext}", f"{i}{ext}".encode()) for i in range(4) for ext in ("jpg", "cls")]),
        "tar/b.tar.gz": make_tar([("t/0.txt", b"l1\nl2\n"), ("t/1.txt", b"m1\n"), ("t/1.cls", b"c")], "w:gz"),
        "zip/a.zip": make_zip([(f"z/{i}.txt", f"zip {i}\nline 2\n".encode()) for i in range(3)]),
        "zip/b.zip": make_zip([("y/0.txt", b"only\n")]),
        "img/a.png": png("red"),
        "img/b.png": png("green", (2, 5)),
        "img/c.png": png("blue"),
    }


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    for name, data in tree_files().items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


@pytest.fixture(scope="module")
def memtree():
    """The same files on fsspec's ``memory://`` file system."""
    fs = fsspec.filesystem("memory")
    base = "/ckpt-files-tree"
    for name, data in tree_files().items():
        fs.pipe(f"{base}/{name}", data)
    yield "memory:/" + base
    fs.rm(base, recursive=True)


class TreeRoot(type(Path())):  # a Path that also knows the memory:// copy of the tree
    memtree = ""


@pytest.fixture
def t(tree, memtree):
    """The tree's root, with ``t.memtree`` its ``memory://`` copy."""
    root = TreeRoot(tree)
    root.memtree = memtree
    return root


def paths(root, folder, *names):
    """A user-written source of the paths ``root/folder/name``."""
    full = [str(Path(root, folder, n)) for n in names]
    return StatefulSource(lambda: list(full))


def roots(*dirs):
    return StatefulSource(lambda: [str(d) for d in dirs])


def memory_pairs(tree, folder, *names, wrap=io.BytesIO):
    """A user-written source of ``(path, in-memory stream)`` pairs, new streams at every pass."""
    data = {n: Path(tree, folder, n).read_bytes() for n in names}
    return StatefulSource(lambda: [(f"{folder}/{n}", wrap(data[n])) for n in names])


# -- listers ---------------------------------------------------------------------------------------


class TestFileLister:
    @pytest.mark.parametrize("recursive", [False, True])
    @pytest.mark.parametrize("masks", ["", "*.txt", ["*.csv", "*.json"]])
    def test_resume_equals_the_uninterrupted_listing(self, tree, recursive, masks):
        build = lambda: FileLister(roots(tree / "text", tree / "csv", tree / "json"), masks, recursive=recursive)  # noqa: E731
        full = check_exact(build, every=True)
        assert full

    def test_abspath_and_a_file_root(self, tree, monkeypatch):
        monkeypatch.chdir(tree)
        build = lambda: FileLister(StatefulSource(lambda: ["text", "csv/a.csv", "json"]), abspath=True)  # noqa: E731
        full = check_exact(build, every=True)
        assert all(os.path.isabs(p) for p in full)

    def test_state_is_the_root_and_an_index(self, tree):
        it = iter(FileLister(roots(tree / "text"), recursive=True))
        [next(it) for _ in range(4)]
        state = it.state_dict()["stages"]["0:FileLister"]
        assert state == {"root": str(tree / "text"), "index": 4}

    def test_a_root_given_as_a_path(self, tree):
        check_exact(lambda: FileLister(str(tree / "text"), recursive=True), every=True)
        check_exact(lambda: FileLister([str(tree / "csv"), str(tree / "json")]))

    def test_non_deterministic_cannot_save(self, tree):
        it = iter(FileLister(roots(tree / "text"), non_deterministic=True))
        next(it)
        with pytest.raises(TypeError, match=r"FileLister.* cannot save its position: it lists files in the file "
                                            r"system's order \(non_deterministic=True\)"):
            it.state_dict()
        it.close()

    def test_load_after_the_first_item_is_refused(self, tree):
        it = iter(FileLister(roots(tree / "text")))
        state = it.state_dict()
        next(it)
        with pytest.raises(RuntimeError, match="before the first next"):
            it.load_state_dict(state)


class TestFSSpecFileLister:
    @pytest.mark.parametrize("recursive", [False, True])
    def test_resume_equals_the_uninterrupted_listing(self, memtree, recursive):
        build = lambda: FSSpecFileLister(  # noqa: E731
            StatefulSource(lambda: [f"{memtree}/text", f"{memtree}/csv"]), recursive=recursive
        )
        full = check_exact(build, every=True)
        assert full[0].startswith("memory://")

    def test_masks_and_a_url_root(self, memtree):
        check_exact(lambda: FSSpecFileLister(f"{memtree}/text", masks="*.txt", recursive=True), every=True)


# -- openers and savers ----------------------------------------------------------------------------


class TestOpeners:
    @pytest.mark.parametrize("mode", ["r", "rb"])
    def test_file_opener_is_stateless(self, tree, mode):
        build = lambda: FileLister(roots(tree / "text"), recursive=True).open_files(mode=mode)  # noqa: E731
        check_exact(build, every=True)
        it = iter(build())
        next(it)
        assert set(it.state_dict()["stages"]) == {"1:FileLister", "2:StatefulSource"}

    def test_fsspec_opener_is_stateless(self, memtree):
        build = lambda: FSSpecFileLister(f"{memtree}/csv").open_files_by_fsspec(mode="rb")  # noqa: E731
        check_exact(build, every=True)

    def test_skipped_files_come_before_the_position(self, tree):
        build = lambda: paths(tree, "text", "a.txt", "nope", "c.txt", "nope2", "b.txt").open_files(on_error="skip")  # noqa: E731
        full = check_exact(build, every=True)
        assert len(full) == 3

    def test_a_failure_budget_is_counted_across_the_resume(self, tree):
        names = ["a.txt", "gone1", "b.txt", "gone2", "c.txt", "gone3", "sub/d.txt"]
        build = lambda: paths(tree, "text", *names).open_files(on_error="skip", max_failures=2)  # noqa: E731
        assert len(check_exact_until_error(build, ExceptionGroup)) == 3

    def test_savers_are_stateless(self, tmp_path):
        data = [(f"f{i}.txt", f"data {i}") for i in range(6)]
        build = lambda: StatefulSource(lambda: list(data)).save_to_disk(  # noqa: E731
            filepath_fn=lambda n: str(tmp_path / n))
        check_exact(build, every=True)
        assert (tmp_path / "f5.txt").read_text() == "data 5"
        url = "memory://ckpt-files-saver/"
        build = lambda: StatefulSource(lambda: list(data)).save_by_fsspec(filepath_fn=lambda n: url + n)  # noqa: E731
        try:
            check_exact(build, every=True)
            assert fsspec.filesystem("memory").cat("/ckpt-files-saver/f3.txt") == b"data 3"
        finally:
            fsspec.filesystem("memory").rm("/ckpt-files-saver", recursive=True)

    def test_stage_classes(self):
        assert Saver._stateless and FSSpecSaver._stateless and Decompressor._stateless
        src = IterableWrapper(["x"])
        assert FileOpener(src)._stateless and FSSpecFileOpener(src)._stateless
        assert not FileOpener(src, on_error="skip", max_failures=1)._stateless


# -- parsers ---------------------------------------------------------------------------------------


def _csv_files(tree):
    return FileLister(roots(tree / "csv"), "*.csv")


PARSERS = {
    "csv text": lambda t: _csv_files(t).open_files().parse_csv(),
    "csv binary skip_lines": lambda t: _csv_files(t).open_files(mode="b").parse_csv(skip_lines=1),
    "csv strict tuple path": lambda t: _csv_files(t).open_files(mode="b").parse_csv(
        errors="strict", as_tuple=True, return_path=True),
    "csv files": lambda t: _csv_files(t).open_files(mode="b").parse_csv_files(),
    "csv dict": lambda t: _csv_files(t).open_files(mode="b").parse_csv_as_dict(),
    "csv dict fieldnames": lambda t: _csv_files(t).open_files().parse_csv_as_dict(
        fieldnames=["k", "v"], restval="-", skip_lines=1),
    "csv dict memory": lambda t: memory_pairs(t, "csv", "a.csv", "b.csv", "c.csv").parse_csv_as_dict(),
    "csv fsspec": lambda t: FSSpecFileLister(
        StatefulSource(lambda: [f"{t.memtree}/csv"])).open_files_by_fsspec().parse_csv(),
    "json": lambda t: FileLister(roots(t / "json")).open_files(mode="b").parse_json_files(),
    "lines text": lambda t: FileLister(roots(t / "text"), recursive=True).open_files().readlines(),
    "lines binary": lambda t: FileLister(roots(t / "text"), recursive=True).open_files(mode="b").readlines(
        strip_newline=False, return_path=False),
    "lines decode strict skip_lines": lambda t: FileLister(roots(t / "text"), recursive=True).open_files(
        mode="b").readlines(decode=True, errors="strict", skip_lines=1),
    "lines decode blocks": lambda t: FileLister(roots(t / "text")).open_files(mode="b").readlines(decode=True),
    "lines memory bytes": lambda t: memory_pairs(t, "text", "a.txt", "b.txt", "c.txt").readlines(),
    "lines memory text": lambda t: memory_pairs(
        t, "text", "a.txt", "c.txt", wrap=lambda b: io.StringIO(b.decode(), newline="\r\n")).readlines(
        strip_newline=False),
    "lines fsspec": lambda t: FSSpecFileLister(f"{t.memtree}/text", recursive=True).open_files_by_fsspec(
        mode="rb").readlines(),
    "decompress": lambda t: FileLister(roots(t / "gz")).open_files(mode="b").decompress().readlines(),
    "decompress memory": lambda t: memory_pairs(t, "gz", "a.txt.gz", "b.txt.bz2", "c.txt.xz").decompress().readlines(),
}


class TestParsers:
    @pytest.mark.parametrize("name", sorted(PARSERS))
    def test_resume_equals_the_uninterrupted_pass(self, t, name):
        assert check_exact(lambda: PARSERS[name](t), every=True)

    def test_state_through_torch_save(self, t):
        check_resume(lambda: PARSERS["csv dict"](t), [3, 6], through="torch", convert=norm)

    def test_a_reader_inside_a_file_saves_path_and_line(self, t):
        it = iter(PARSERS["csv dict"](t))
        [next(it) for _ in range(5)]
        state = it.state_dict()["stages"]["0:CSVDictParser"]
        assert state["file"] == {"path": str(t / "csv" / "b.csv"), "at": 3, "header": ["key", "n"], "memory": None}
        assert state["n"] == 1

    def test_an_in_memory_stream_is_copied(self, t):
        it = iter(PARSERS["lines memory bytes"](t))
        [next(it) for _ in range(2)]
        file = it.state_dict()["stages"]["0:LineReader"]["file"]
        assert file["memory"] == ["bytes", b"one\ntwo\nthree\nfour\nfive\n"] and file["at"] == 2

    def test_bad_lines_skipped_before_and_after_the_position(self, t, tmp_path):
        (tmp_path / "bad.txt").write_bytes(b"ok1\n\xff\xfe\nok2\n\xff\nok3\n")
        (tmp_path / "bad.csv").write_bytes(b"a,b\n1,2\n\xff,3\n4,5\n\"6,7\n")
        lines = lambda: FileLister(roots(tmp_path), "*.txt").open_files(mode="b").readlines(  # noqa: E731
            decode=True, errors="strict", on_error="skip")
        assert [x[1] for x in check_exact(lines, every=True)] == ["ok1", "ok2", "ok3"]
        rows = lambda: FileLister(roots(tmp_path), "*.csv").open_files(mode="b").parse_csv(  # noqa: E731
            errors="strict", on_error="skip", strict=True)
        assert check_exact(rows, every=True) == [["a", "b"], ["1", "2"], ["4", "5"]]

    def test_line_numbers_of_notes_go_on_after_a_resume(self, t, tmp_path):
        (tmp_path / "x.txt").write_bytes(b"a\nb\nc\n\xff\n")
        build = lambda: StatefulSource(lambda: [str(tmp_path / "x.txt")]).open_files(mode="b").readlines(  # noqa: E731
            decode=True, errors="strict")
        it = iter(build())
        next(it), next(it)
        state = it.state_dict()
        it.close()
        again = iter(build())
        again.load_state_dict(state)
        assert next(again) == (str(tmp_path / "x.txt"), "c")
        with pytest.raises(UnicodeDecodeError) as info:
            next(again)
        assert any("line 4" in note for note in info.value.__notes__)

    def test_a_json_failure_budget_is_counted_across_the_resume(self, tmp_path):
        for i, text in enumerate(['{"a": 1}', "bad", "[2]", "bad", "3", "bad", "4"]):
            (tmp_path / f"{i}.json").write_text(text)
        build = lambda: FileLister(roots(tmp_path)).open_files().parse_json_files(on_error="skip", max_failures=1)  # noqa: E731
        assert len(check_exact_until_error(build, ExceptionGroup)) == 2

    def test_a_stream_that_cannot_be_opened_again_cannot_be_saved(self, t):
        path = str(t / "text" / "a.txt")
        build = lambda: StatefulSource(lambda: [(path, open(path, "rb"))]).readlines()  # noqa: E731
        it = iter(build())
        assert it.state_dict()["stages"]["0:LineReader"]["file"] is None  # not inside a file yet: fine
        next(it)
        with pytest.raises(TypeError, match=r"LineReader cannot save its position inside .*a\.txt.*BufferedReader"):
            it.state_dict()
        it.close()

    def test_load_after_the_first_item_is_refused(self, t):
        for name in ("csv text", "lines text", "json"):
            it = iter(PARSERS[name](t))
            state = it.state_dict()
            next(it)
            with pytest.raises(RuntimeError, match="before the first next"):
                it.load_state_dict(state)
            it.close()

    def test_stage_classes(self):
        src = IterableWrapper([])
        for cls in (CSVParser, CSVFilesParser, CSVDictParser, LineReader):
            assert not getattr(cls(src), "_stateless", False)
        assert JsonParser(src)._stateless and not JsonParser(src, on_error="skip", max_failures=0)._stateless
        assert ImageDecoder(src)._stateless and not ImageDecoder(src, on_error="skip", max_failures=0)._stateless


# -- archives --------------------------------------------------------------------------------------

ARCHIVES = {
    "tar": lambda t: FileLister(roots(t / "tar")).open_files(mode="b").load_from_tar(),
    "tar memory": lambda t: memory_pairs(t, "tar", "a.tar", "b.tar.gz").load_from_tar(),
    "tar lines": lambda t: FileLister(roots(t / "tar"), "*.gz").open_files(mode="b").load_from_tar().readlines(),
    "tar fsspec": lambda t: FSSpecFileLister(f"{t.memtree}/tar").open_files_by_fsspec(mode="rb").load_from_tar(),
    "webdataset": lambda t: FileLister(roots(t / "tar")).open_files(mode="b").load_from_tar().webdataset(),
    "webdataset memory": lambda t: memory_pairs(t, "tar", "a.tar", "b.tar.gz").load_from_tar().webdataset(),
    "zip": lambda t: FileLister(roots(t / "zip")).open_files(mode="b").load_from_zip(),
    "zip memory": lambda t: memory_pairs(t, "zip", "a.zip", "b.zip").load_from_zip(),
    "zip lines": lambda t: FileLister(roots(t / "zip")).open_files(mode="b").load_from_zip().readlines(decode=True),
}


class TestArchives:
    @pytest.mark.parametrize("name", sorted(ARCHIVES))
    def test_resume_equals_the_uninterrupted_pass(self, t, name):
        assert check_exact(lambda: ARCHIVES[name](t), every=True)

    def test_state_is_the_archive_and_its_entry(self, t):
        it = iter(ARCHIVES["tar"](t))
        [next(it) for _ in range(3)]
        assert it.state_dict()["stages"]["0:TarArchiveLoader"]["file"] == {
            "path": str(t / "tar" / "a.tar"), "at": 3, "header": None, "memory": None}

    def test_a_webdataset_state_holds_the_next_sample_begun(self, t):
        it = iter(ARCHIVES["webdataset memory"](t))
        first = next(it)
        first[".jpg"].read()
        state = pickle.loads(pickle.dumps(it.state_dict()))["stages"]["0:WebDatasetGrouper"]
        # the member's stream is saved as plain data, by its contents (datapipes._runtime.held)
        assert set(state["sample"]) == {"__key__", ".jpg"}
        assert state["sample"][".jpg"] == {MARK: {"memory": ["bytes", b"1jpg"], "name": None, "wrapped": False}}

    def test_a_corrupt_archive_skipped(self, tmp_path):
        good = make_tar([("a/0.txt", b"0"), ("a/1.txt", b"1")])
        (tmp_path / "0.tar").write_bytes(good)
        (tmp_path / "1.tar").write_bytes(good[:700])
        (tmp_path / "2.tar").write_bytes(good)
        build = lambda: FileLister(roots(tmp_path)).open_files(mode="b").load_from_tar(on_error="skip")  # noqa: E731
        check_exact(build, every=True)

    def test_torch_save(self, t):
        check_resume(lambda: ARCHIVES["webdataset"](t), [2], through="torch", convert=norm)


# -- images ----------------------------------------------------------------------------------------


class TestImageDecoder:
    @pytest.mark.parametrize("kw", [{}, {"size": (2, 2), "layout": "chw"}, {"mode": "L", "output": "pil"}])
    def test_stateless(self, t, kw):
        build = lambda: FileLister(roots(t / "img")).open_files(mode="b").decode_image(**kw)  # noqa: E731
        if kw.get("output") == "pil":
            build = (lambda b: lambda: b().map(lambda pair: (pair[0], pair[1].size)))(build)
        check_exact(build, every=True)

    def test_a_failure_budget_is_counted_across_the_resume(self, t):
        blobs = [png("red"), b"no", png("blue"), b"nope", png("green"), b"nah", png("red")]
        build = lambda: StatefulSource(lambda: list(blobs)).decode_image(on_error="skip", max_failures=1)  # noqa: E731
        full, error = until_error(iter(build()))
        assert error is ExceptionGroup and len(full) == 2
        for k in range(len(full) + 1):
            it = iter(build())
            head = [norm(next(it)) for _ in range(k)]
            state = it.state_dict()
            assert state["stages"]["0:ImageDecoder"]["n"] >= k
            it.close()
            again = iter(build())
            again.load_state_dict(pickle.loads(pickle.dumps(state)))
            assert (head, *until_error(again)) == (full[:k], full[k:], ExceptionGroup), k


# -- the protocol ----------------------------------------------------------------------------------


STARTED = {
    # pipes whose root stage keeps a run of its own (their source's run accepts a late load)
    "FileLister": lambda t: FileLister(roots(t / "text")),
    "FSSpecFileLister": lambda t: FSSpecFileLister(StatefulSource(lambda: [f"{t.memtree}/text"])),
    "FileOpener budget": lambda t: paths(t, "text", "a.txt", "c.txt").open_files(on_error="skip", max_failures=1),
    "CSVParser": lambda t: memory_pairs(t, "csv", "a.csv").parse_csv(),
    "LineReader": lambda t: memory_pairs(t, "text", "a.txt").readlines(),
    "JsonParser budget": lambda t: memory_pairs(t, "json", "a.json").parse_json_files(on_error="skip", max_failures=1),
    "TarArchiveLoader": lambda t: memory_pairs(t, "tar", "a.tar").load_from_tar(),
    "ZipArchiveLoader": lambda t: memory_pairs(t, "zip", "a.zip").load_from_zip(),
    "WebDatasetGrouper": lambda t: memory_pairs(t, "tar", "a.tar").load_from_tar().webdataset(),
    "ImageDecoder budget": lambda t: memory_pairs(t, "img", "a.png").decode_image(on_error="skip", max_failures=1),
}


@pytest.mark.parametrize("name", sorted(STARTED))
def test_load_after_the_first_item_is_refused(t, name):
    it = iter(STARTED[name](t))
    state = it.state_dict()
    assert state["stages"][f"0:{name.split()[0]}"] is not None  # the root stage has a run
    next(it)
    with pytest.raises(RuntimeError, match="before the first next"):
        it.load_state_dict(state)
    it.close()


def test_a_reader_failure_budget_is_counted_across_the_resume(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"1\n\xff\n2\n")
    (tmp_path / "b.txt").write_bytes(b"3\n\xfe\n4\n\xfd\n5\n")
    build = lambda: FileLister(roots(tmp_path)).open_files(mode="b").readlines(  # noqa: E731
        decode=True, errors="strict", on_error="skip", max_failures=2, return_path=False)
    assert check_exact_until_error(build, ExceptionGroup) == ["1", "2", "3", "4"]


# -- the law over random compositions -------------------------------------------------------------


def _source(t, draw_kind, folder, mask):
    if draw_kind == "lister":
        return FileLister(roots(t / folder), mask, recursive=True)
    if draw_kind == "paths":
        names = sorted(p.relative_to(t / folder).as_posix() for p in (t / folder).rglob(mask or "*") if p.is_file())
        return paths(t, folder, *names)
    return FSSpecFileLister(f"{t.memtree}/{folder}", mask, recursive=True)


def _open(src, draw_kind, mode):
    return src.open_files_by_fsspec(mode=mode) if draw_kind == "fsspec" else src.open_files(mode=mode)


READERS = {
    # reader -> (folder, mask, opener mode, the stages after the opener)
    "lines": ("text", "*.txt", "b", lambda p: p.readlines()),
    "lines decoded": ("text", "*.txt", "b", lambda p: p.readlines(decode=True, errors="strict")),
    "csv": ("csv", "*.csv", "r", lambda p: p.parse_csv()),
    "csv dict": ("csv", "*.csv", "b", lambda p: p.parse_csv_as_dict()),
    "json": ("json", "*.json", "b", lambda p: p.parse_json_files()),
    "decompress": ("gz", "", "b", lambda p: p.decompress().readlines()),
    "tar": ("tar", "", "b", lambda p: p.load_from_tar()),
    "tar webdataset": ("tar", "", "b", lambda p: p.load_from_tar().webdataset()),
    "tar lines": ("tar", "*.gz", "b", lambda p: p.load_from_tar().readlines()),
    "zip lines": ("zip", "", "b", lambda p: p.load_from_zip().readlines()),
    "images": ("img", "", "b", lambda p: p.decode_image(size=(2, 2))),
    "listing": (None, None, None, None),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    source=st.sampled_from(["lister", "paths", "fsspec"]),
    reader=st.sampled_from(sorted(READERS)),
    k=st.integers(0, 40),
    torch_save=st.booleans(),
)
def test_law_resume_equals_the_uninterrupted_run(t, source, reader, k, torch_save):
    folder, mask, mode, tail = READERS[reader]

    def build():
        if tail is None:  # the listing alone
            return _source(t, source, "text", "")
        return tail(_open(_source(t, source, folder, mask), source, mode))

    check_resume(build, lambda n: [min(k, n)], through="torch" if torch_save else "pickle", convert=norm)
