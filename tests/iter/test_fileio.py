"""Tests of datapipes.iter.fileio: listers, openers, savers, local and through fsspec.

Local files are generated in ``tmp_path``; http(s) reading runs against the real HTTP server of the
``http_server`` fixture (tests/iter/conftest.py); remote listing uses fsspec's ``memory://``.
Whether a file is still open is read from ``/proc/self/fd``: the descriptors of this process that
point under ``tmp_path``.
"""

from __future__ import annotations

import errno
import gc
import gzip
import io
import os
import pickle
import threading
import time
import types
import warnings
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.spec import AbstractFileSystem

from datapipes.iter import (
    FileLister,
    FileOpener,
    FSSpecFileLister,
    FSSpecFileOpener,
    FSSpecSaver,
    IterableWrapper,
    Saver,
    StreamWrapper,
)
from datapipes._runtime import passes as _pass
from datapipes.graph import stages
from datapipes.iter import fileio, remote
from datapipes.testing import check_datapipe, threads_started_since

from helpers import Guarded, error_of_pass, gc_off  # noqa: F401 - gc_off is a fixture


def open_fds_under(path: Path) -> list[str]:
    """The files under ``path`` this process holds open (from /proc/self/fd)."""
    prefix = str(path)
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor listdir itself used, closed meanwhile
        if target.startswith(prefix):
            found.append(target)
    return found


def read_item(item: tuple[Any, Any]) -> tuple[str, Any]:
    """``(name, contents)`` of an opener's ``(path, stream)``, closing the stream."""
    path, stream = item
    with stream:
        return os.path.basename(str(path).rstrip("/")), stream.read()


def notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


def make_tree(root: Path, files: dict[str, bytes | str]) -> Path:
    for name, data in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            p.write_bytes(data)
        else:
            p.write_text(data)
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """data/{b.txt, a.txt, c.csv, sub/d.txt, sub/deeper/e.txt, sub2/f.csv}"""
    return make_tree(
        tmp_path / "data",
        {
            "b.txt": "B",
            "a.txt": "A",
            "c.csv": "C",
            "sub/d.txt": "D",
            "sub/deeper/e.txt": "E",
            "sub2/f.csv": "F",
        },
    )


def three_paths(tree: Path) -> list[str]:
    return [str(tree / n) for n in ("a.txt", "b.txt", "c.csv")]


def rel(paths: list[str], root: Path | str) -> list[str]:
    return [os.path.relpath(p, root) for p in paths]


# -- FileLister ------------------------------------------------------------------------------------


class TestFileLister:
    def test_lists_the_files_of_a_folder_sorted(self, tree):
        out = list(FileLister(str(tree)))
        assert out == [str(tree / n) for n in ("a.txt", "b.txt", "c.csv")]

    def test_recursive_lists_files_before_subfolders_in_sorted_order(self, tree):
        out = rel(list(FileLister(tree, recursive=True)), tree)
        assert out == ["a.txt", "b.txt", "c.csv", "sub/d.txt", "sub/deeper/e.txt", "sub2/f.csv"]

    def test_masks_match_file_names(self, tree):
        assert rel(list(FileLister(tree, "*.txt")), tree) == ["a.txt", "b.txt"]
        assert rel(list(FileLister(tree, ["*.csv", "a.*"], recursive=True)), tree) == ["a.txt", "c.csv", "sub2/f.csv"]
        assert list(FileLister(tree, "*.json")) == []

    def test_paths_join_onto_the_root_as_given_or_absolute(self, tree, monkeypatch):
        monkeypatch.chdir(tree.parent)
        assert list(FileLister("data", "a.*")) == [os.path.join("data", "a.txt")]
        assert list(FileLister("data", "a.*", abspath=True)) == [str(tree / "a.txt")]

    def test_roots_as_list_path_and_pipe(self, tree):
        want = [str(tree / "a.txt"), str(tree / "sub" / "d.txt")]
        assert list(FileLister([tree, str(tree / "sub")], "*.txt"))[::2] == want
        assert list(IterableWrapper([str(tree / "sub")]).list_files()) == [str(tree / "sub" / "d.txt")]
        assert list(FileLister(root=IterableWrapper([tree / "sub"]))) == [str(tree / "sub" / "d.txt")]

    def test_a_file_root_is_listed_as_itself_when_it_matches(self, tree):
        f = str(tree / "a.txt")
        assert list(FileLister(f)) == [f]
        assert list(FileLister(f, "*.csv")) == []

    def test_empty_folder_and_no_roots(self, tmp_path):
        (tmp_path / "empty").mkdir()
        assert list(FileLister(tmp_path / "empty", recursive=True)) == []
        assert list(FileLister([])) == []

    def test_non_deterministic_yields_the_same_files(self, tree):
        a = list(FileLister(tree, recursive=True))
        b = list(FileLister(tree, recursive=True, non_deterministic=True))
        assert sorted(a) == sorted(b)

    def test_missing_root_raises_file_not_found_naming_it(self, tree):
        missing = str(tree / "nope")
        it = iter(FileLister([str(tree / "sub"), missing]))
        assert next(it) == str(tree / "sub" / "d.txt")
        with pytest.raises(FileNotFoundError) as info:
            next(it)
        assert info.value.filename == missing and missing in str(info.value)
        assert "FileLister" in notes(info.value)

    def test_permission_denied_on_a_folder_names_it(self, tree, monkeypatch):
        # Simulated: the suite may run as root, where chmod 000 does not stop reading.
        real_scandir = os.scandir
        locked = str(tree / "sub")

        def scandir(path: Any = ".") -> Any:
            if os.fspath(path) == locked:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), locked)
            return real_scandir(path)

        monkeypatch.setattr(os, "scandir", scandir)
        with pytest.raises(PermissionError) as info:
            list(FileLister(tree, recursive=True))
        assert locked in str(info.value) and "FileLister" in notes(info.value)
        with pytest.raises(PermissionError):
            list(FileLister(locked))

    def test_a_root_that_is_not_a_path_raises_type_error_at_iteration(self):
        with pytest.raises(TypeError, match="FileLister.*root.*int"):
            list(IterableWrapper([3]).list_files())

    def test_len_is_the_nominal_length_or_unknown(self, tree):
        with pytest.raises(TypeError, match="FileLister"):
            len(FileLister(tree))
        assert len(FileLister(tree, length=3)) == 3

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"root": 3}, TypeError, "root"),
            ({"root": ["a", 3]}, TypeError, "root.*int"),
            ({"root": ".", "masks": 3}, TypeError, "masks"),
            ({"root": ".", "masks": ["*.txt", None]}, TypeError, "masks"),
            ({"root": ".", "recursive": "yes"}, TypeError, "recursive"),
            ({"root": ".", "abspath": 1}, TypeError, "abspath"),
            ({"root": ".", "non_deterministic": None}, TypeError, "non_deterministic"),
            ({"root": ".", "length": -2}, ValueError, "length"),
            ({"root": ".", "length": "3"}, TypeError, "length"),
        ],
    )
    def test_bad_arguments(self, kwargs, error, match):
        with pytest.raises(error, match=f"FileLister.*{match}"):
            FileLister(**kwargs)

    def test_contract(self, tree):
        want = [str(tree / n) for n in ("a.txt", "b.txt", "c.csv")]
        check_datapipe(FileLister(tree), expected=want)
        check_datapipe(FileLister(tree, "*.txt", recursive=True, length=4))
        check_datapipe(
            FileLister(IterableWrapper([tree / "sub"])),
            build=lambda src: src.list_files(),
            probe_data=[str(tree / "sub"), str(tree / "sub2")],
        )


# -- StreamWrapper ---------------------------------------------------------------------------------


class TestStreamWrapper:
    def test_behaves_as_the_file(self, tmp_path):
        p = tmp_path / "f.txt"
        p.write_text("one\ntwo\nthree\n")
        with StreamWrapper(open(p), name=str(p)) as s:
            assert s.readline() == "one\n"
            assert next(s) == "two\n"
            assert list(s) == ["three\n"]
            s.seek(0)
            assert s.read(3) == "one" and s.tell() == 3
            assert s.name == str(p) and s.encoding and not s.closed
            assert "readline" in dir(s)
        assert s.closed

    def test_close_is_idempotent_and_collection_closes(self, tmp_path):
        p = tmp_path / "f.bin"
        p.write_bytes(b"x")
        f = open(p, "rb")
        s = StreamWrapper(f)
        s.close()
        s.close()
        assert f.closed
        f = open(p, "rb")
        s = StreamWrapper(f)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            del s
            gc.collect()
        assert f.closed

    def test_close_streams_finds_nested_streams(self):
        a, b, c = (StreamWrapper(io.BytesIO(b"x")) for _ in range(3))
        StreamWrapper.close_streams({"k": [a, (b,)], "n": 1, "s": c})
        assert a.closed and b.closed and c.closed

    def test_repr_and_pickle(self, tmp_path):
        s = StreamWrapper(io.BytesIO(b"abc"), name="mem")
        assert "mem" in repr(s)
        clone = pickle.loads(pickle.dumps(s))
        assert clone.read() == b"abc" and clone.name == "mem"
        p = tmp_path / "f.bin"
        p.write_bytes(b"x")
        with StreamWrapper(open(p, "rb")) as f, pytest.raises(TypeError):
            pickle.dumps(f)


# -- FileOpener ------------------------------------------------------------------------------------


class TestFileOpener:
    def test_text_and_binary(self, tree):
        paths = [str(tree / "a.txt"), str(tree / "b.txt")]
        assert [read_item(x) for x in FileOpener(IterableWrapper(paths))] == [("a.txt", "A"), ("b.txt", "B")]
        assert [read_item(x) for x in IterableWrapper(paths).open_files(mode="b")] == [("a.txt", b"A"), ("b.txt", b"B")]
        assert [read_item(x) for x in FileOpener(IterableWrapper(paths), mode="rb")][0] == ("a.txt", b"A")

    def test_yields_the_paths_as_given(self, tree):
        items = list(FileOpener([tree / "a.txt", str(tree / "b.txt")]))
        assert [p for p, _ in items] == [tree / "a.txt", str(tree / "b.txt")]
        assert all(isinstance(s, StreamWrapper) for _, s in items)
        StreamWrapper.close_streams(items)

    def test_encoding(self, tmp_path):
        p = tmp_path / "u16.txt"
        p.write_text("héllo", encoding="utf-16")
        out = [read_item(x) for x in FileOpener(IterableWrapper([str(p)]), encoding="utf-16")]
        assert out == [("u16.txt", "héllo")]

    def test_lister_then_opener_then_lines(self, tree):
        pipe = FileLister(tree, "*.txt", recursive=True).open_files()
        assert [read_item(x)[1] for x in pipe] == ["A", "B", "D", "E"]

    def test_missing_file_names_the_path_and_stage(self, tree):
        missing = str(tree / "nope.txt")
        pipe = FileOpener(IterableWrapper([str(tree / "a.txt"), missing]))
        with pytest.raises(FileNotFoundError) as info:
            [read_item(x) for x in pipe]
        assert info.value.filename == missing
        assert "FileOpener('r')" in notes(info.value) and "at item 1" in notes(info.value)

    def test_a_directory_raises_is_a_directory_naming_it(self, tree):
        with pytest.raises(IsADirectoryError) as info:
            list(FileOpener(IterableWrapper([str(tree / "sub")])))
        assert info.value.filename == str(tree / "sub")

    def test_permission_denied_names_the_path(self, tree, monkeypatch):
        locked = tree / "a.txt"
        locked.chmod(0)
        try:
            if os.geteuid() == 0:
                # root ignores file modes: the real check cannot fail here, the file opens.
                assert [read_item(x) for x in FileOpener([str(locked)])] == [("a.txt", "A")]
            else:
                with pytest.raises(PermissionError) as info:
                    list(FileOpener([str(locked)]))
                assert info.value.filename == str(locked)
        finally:
            locked.chmod(0o644)

        # Simulated, so it is checked whoever runs the suite: the opener's `open` refuses.
        def refuse(path: Any, *args: Any, **kwargs: Any) -> Any:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

        monkeypatch.setattr(fileio, "open", refuse, raising=False)
        with pytest.raises(PermissionError) as info:
            list(FileOpener([str(locked)]))
        assert info.value.filename == str(locked) and "FileOpener" in notes(info.value)

    def test_an_item_that_is_not_a_path_is_a_type_error_not_a_descriptor(self):
        # open(0) would read stdin: an int item must be refused.
        with pytest.raises(TypeError, match="FileOpener.*path.*int"):
            list(FileOpener(IterableWrapper([0])))

    def test_skip_bad_paths_and_count_them(self, tree):
        pipe = FileOpener(
            IterableWrapper([str(tree / "a.txt"), str(tree / "nope"), str(tree / "sub"), 7, str(tree / "b.txt")]),
            on_error="skip",
        )
        assert [read_item(x) for x in pipe] == [("a.txt", "A"), ("b.txt", "B")]
        assert pipe.failures.count == 3
        assert isinstance(pipe.failures.recent[0].exception, FileNotFoundError)
        assert [f.position for f in pipe.failures.recent] == [1, 2, 3]
        budget = FileOpener(IterableWrapper([str(tree / "nope"), str(tree / "sub")]), on_error="skip", max_failures=1)
        with pytest.raises(ExceptionGroup, match="FileOpener"):
            list(budget)

    def test_len(self, tree):
        paths = IterableWrapper([str(tree / "a.txt"), str(tree / "b.txt")])
        assert len(FileOpener(paths)) == 2
        assert len(FileOpener(paths, length=5)) == 5
        with pytest.raises(TypeError, match="FileOpener"):
            len(FileOpener(paths, on_error="skip"))
        with pytest.raises(TypeError, match="FileLister"):
            len(FileOpener(FileLister(tree)))

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"datapipe": "a.txt"}, TypeError, "datapipe"),
            ({"mode": "w"}, ValueError, "mode"),
            ({"mode": "rb", "encoding": "utf-8"}, ValueError, "encoding"),
            ({"encoding": 8}, TypeError, "encoding"),
            ({"length": -3}, ValueError, "length"),
            ({"on_error": "ignore"}, ValueError, "on_error"),
        ],
    )
    def test_bad_arguments(self, kwargs, error, match):
        kwargs = {"datapipe": IterableWrapper(["a.txt"]), **kwargs}
        with pytest.raises(error, match=match):
            FileOpener(**kwargs)

    # -- the stream rule of the module docstring, checked on the process's open descriptors --------

    def test_streams_read_and_dropped_are_closed(self, tree):
        contents = [s.read() for _, s in FileOpener(three_paths(tree))]
        assert contents == ["A", "B", "C"]
        assert open_fds_under(tree) == []

    def test_streams_stay_valid_after_the_pass_ran_to_the_end(self, tree):
        items = list(FileOpener(three_paths(tree)))  # as a shuffle or batch buffer holds them
        assert len(open_fds_under(tree)) == 3
        assert [s.read() for _, s in reversed(items)] == ["C", "B", "A"]
        del items
        assert open_fds_under(tree) == []

    def test_closing_after_the_end_leaves_streams_alone(self, tree):
        it = iter(FileOpener(three_paths(tree)))
        items = list(it)
        it.close()
        assert [s.read() for _, s in items] == ["A", "B", "C"]

    def test_a_dropped_pass_leaves_the_held_stream_valid(self, tree):
        _, stream = next(iter(FileOpener(three_paths(tree))))
        gc.collect()
        assert stream.read() == "A"
        del stream
        assert open_fds_under(tree) == []

    def test_early_close_of_the_iterator_closes_its_streams(self, tree):
        it = iter(FileOpener(three_paths(tree)))
        (_, s1), (_, s2) = next(it), next(it)
        it.close()
        assert s1.closed and s2.closed and open_fds_under(tree) == []
        assert list(it) == []
        it.close()  # idempotent

    def test_early_close_closes_the_source_iterator(self, tree):
        closed = []

        class Source:
            def __iter__(self):
                try:
                    yield from [str(tree / "a.txt"), str(tree / "b.txt")]
                finally:
                    closed.append(True)

        it = iter(FileOpener(IterableWrapper(Source())))
        next(it)
        it.close()
        assert closed == [True]

    def test_an_open_error_closes_the_streams_already_handed_out(self, tree):
        it = iter(FileOpener([str(tree / "a.txt"), str(tree / "nope")]))
        _, held = next(it)
        with pytest.raises(FileNotFoundError):
            next(it)
        assert held.closed and open_fds_under(tree) == []

    def test_a_source_error_closes_the_streams_already_handed_out(self, tree):
        def source():
            yield str(tree / "a.txt")
            raise KeyError("source broke")

        it = iter(FileOpener(IterableWrapper(source())))
        _, held = next(it)
        with pytest.raises(KeyError, match="source broke"):
            next(it)
        assert held.closed and open_fds_under(tree) == []

    def test_a_downstream_error_leaves_no_file_open(self, tree):
        def boom(item):
            if item[0].endswith("b.txt"):
                raise ValueError("bad record")
            return read_item(item)

        with pytest.raises(ValueError, match="bad record"):
            list(FileOpener(three_paths(tree)).map(boom))
        gc.collect()
        assert open_fds_under(tree) == []

    def test_unread_streams_are_closed_without_resource_warnings(self, tree):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert sum(1 for _ in FileOpener(three_paths(tree))) == 3
            gc.collect()
        assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
        assert open_fds_under(tree) == []

    def test_contract(self, tree):
        paths = [str(tree / "a.txt"), str(tree / "b.txt")]
        check_datapipe(FileOpener(IterableWrapper(paths)).map(read_item), expected=[("a.txt", "A"), ("b.txt", "B")])
        check_datapipe(FileOpener(IterableWrapper(paths), mode="b", on_error="skip").map(read_item))
        check_datapipe(
            FileOpener(IterableWrapper(paths)).map(read_item),
            build=lambda src: src.open_files().map(read_item),
            probe_data=paths,
        )


# -- Saver -----------------------------------------------------------------------------------------


class TestSaver:
    def test_writes_text_and_bytes_creating_folders(self, tmp_path):
        out = tmp_path / "out"
        text = list(IterableWrapper([("a.txt", "hello"), ("sub/b.txt", "world")]).save_to_disk(
            filepath_fn=lambda name: str(out / name)
        ))
        assert text == [str(out / "a.txt"), str(out / "sub" / "b.txt")]
        assert (out / "sub" / "b.txt").read_text() == "world"
        raw = list(Saver(IterableWrapper([(str(out / "c.bin"), b"\x00\x01")]), mode="wb"))
        assert raw == [str(out / "c.bin")] and (out / "c.bin").read_bytes() == b"\x00\x01"

    def test_round_trip_through_the_opener(self, tmp_path):
        pairs = [(str(tmp_path / f"{i}.bin"), bytes([i]) * i) for i in range(1, 4)]
        paths = IterableWrapper(pairs).save_to_disk(mode="wb")
        assert [s.read() for _, s in paths.open_files(mode="b")] == [d for _, d in pairs]

    def test_append_mode(self, tmp_path):
        p = str(tmp_path / "log.txt")
        list(Saver(IterableWrapper([(p, "a"), (p, "b")]), mode="a"))
        assert Path(p).read_text() == "ab"

    def test_errors_pass_through_with_the_stage_named(self, tmp_path):
        def bad_path(meta):
            raise KeyError(meta)

        with pytest.raises(KeyError) as info:
            list(IterableWrapper([("x", "data")]).save_to_disk(filepath_fn=bad_path))
        assert "Saver('w')" in notes(info.value) and "at item 0" in notes(info.value)
        with pytest.raises(TypeError, match="bytes-like"):
            list(Saver(IterableWrapper([(str(tmp_path / "t.bin"), "text")]), mode="wb"))
        with pytest.raises(TypeError, match=r"Saver.*\(meta, data\)"):
            list(Saver(IterableWrapper(["just-a-path"])))
        with pytest.raises(IsADirectoryError):
            list(Saver(IterableWrapper([(str(tmp_path), "x")])))

    def test_len_is_the_sources(self):
        assert len(Saver(IterableWrapper([("a", "b")] * 4))) == 4

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"source_datapipe": [("a", "b")]}, TypeError, "source_datapipe"),
            ({"mode": "r"}, ValueError, "mode"),
            ({"filepath_fn": "out"}, TypeError, "filepath_fn"),
        ],
    )
    def test_bad_arguments(self, kwargs, error, match):
        kwargs = {"source_datapipe": IterableWrapper([("a", "b")]), **kwargs}
        with pytest.raises(error, match=f"Saver.*{match}"):
            Saver(**kwargs)

    def test_contract(self, tmp_path):
        pairs = [(f"{i}.txt", str(i)) for i in range(3)]
        check_datapipe(
            IterableWrapper(pairs).save_to_disk(filepath_fn=lambda name: str(tmp_path / name)),
            expected=[str(tmp_path / n) for n, _ in pairs],
        )
        check_datapipe(
            IterableWrapper([0]).map(lambda i: (str(tmp_path / f"{i}.txt"), "x")).save_to_disk(),
            build=lambda src: src.map(lambda i: (str(tmp_path / f"{i}.txt"), "x")).save_to_disk(),
        )


# -- fsspec: a flaky file system to drive the retry logic exactly ----------------------------------


class FlakyFS(AbstractFileSystem):
    """An in-process file system whose opens and reads fail as scripted (a remote one, for retries).

    ``FlakyFS.files`` maps paths to bytes; ``FlakyFS.open_errors`` are raised by the next opens,
    one each; ``FlakyFS.read_errors`` maps a byte offset to errors raised, one per read, by reads
    that cross it. ``FlakyFS.opens`` counts the opens.
    """

    protocol = "flakytest"
    files: dict[str, bytes] = {}
    open_errors: list[BaseException] = []
    read_errors: dict[int, list[BaseException]] = {}
    opens = 0

    @classmethod
    def reset(cls) -> None:
        cls.files, cls.open_errors, cls.read_errors, cls.opens = {}, [], {}, 0

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        FlakyFS.opens += 1
        if FlakyFS.open_errors:
            raise FlakyFS.open_errors.pop(0)
        if path not in FlakyFS.files:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        return _FlakyFile(FlakyFS.files[path])

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        if FlakyFS.open_errors:
            raise FlakyFS.open_errors.pop(0)
        names = sorted(n for n in FlakyFS.files if n.startswith(path.rstrip("/") + "/"))
        return [{"name": n, "type": "file", "size": len(FlakyFS.files[n])} for n in names] if detail else names

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        if path in FlakyFS.files:
            return {"name": path, "type": "file", "size": len(FlakyFS.files[path])}
        if any(n.startswith(path.rstrip("/") + "/") for n in FlakyFS.files):
            return {"name": path, "type": "directory", "size": 0}
        raise FileNotFoundError(path)


class _FlakyFile(io.BytesIO):
    def read(self, size: int | None = -1) -> bytes:
        start = self.tell()
        end = len(self.getbuffer()) if size is None or size < 0 else start + size
        for offset, errors in FlakyFS.read_errors.items():
            if errors and start <= offset < end:
                raise errors.pop(0)
        return super().read(size)


@pytest.fixture
def flaky() -> Any:
    fsspec.register_implementation(FlakyFS.protocol, FlakyFS, clobber=True)
    FlakyFS.reset()
    yield FlakyFS
    FlakyFS.reset()


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The backoff delays the remote module sleeps, recorded instead of slept."""
    delays: list[float] = []
    monkeypatch.setattr(remote, "time", types.SimpleNamespace(sleep=delays.append))
    return delays


# -- FSSpecFileLister ------------------------------------------------------------------------------


class TestFSSpecFileLister:
    def fill(self, memfs: tuple[Any, str]) -> tuple[Any, str]:
        fs, root = memfs
        folder = root[len("memory://") :]
        for name in ("b.txt", "a.txt", "c.csv", "sub/d.txt", "sub/deeper/e.txt"):
            fs.pipe(f"/{folder}/{name}", name.encode())
        return fs, root

    def test_lists_memory_files_sorted_spelled_as_the_root(self, memfs):
        _, root = self.fill(memfs)
        assert list(FSSpecFileLister(root)) == [f"{root}/a.txt", f"{root}/b.txt", f"{root}/c.csv"]
        assert list(FSSpecFileLister(root + "/")) == list(FSSpecFileLister(root))

    def test_masks_and_recursive(self, memfs):
        _, root = self.fill(memfs)
        assert list(IterableWrapper([root]).list_files_by_fsspec(masks="*.txt")) == [f"{root}/a.txt", f"{root}/b.txt"]
        assert list(FSSpecFileLister(root, ["*.txt"], recursive=True)) == [
            f"{root}/a.txt", f"{root}/b.txt", f"{root}/sub/d.txt", f"{root}/sub/deeper/e.txt",
        ]

    def test_a_file_url_is_listed_as_itself(self, memfs):
        _, root = self.fill(memfs)
        assert list(FSSpecFileLister(f"{root}/a.txt")) == [f"{root}/a.txt"]
        assert list(FSSpecFileLister(f"{root}/a.txt", "*.csv")) == []

    def test_local_paths_and_file_urls(self, tree):
        assert list(FSSpecFileLister(str(tree), "*.txt")) == [f"{tree}/a.txt", f"{tree}/b.txt"]
        assert list(FSSpecFileLister(f"file://{tree}", "*.csv")) == [f"file://{tree}/c.csv"]

    def test_missing_root_raises_naming_the_url(self, memfs):
        _, root = memfs
        for recursive in (False, True):
            with pytest.raises(FileNotFoundError) as info:
                list(FSSpecFileLister(f"{root}/nope", recursive=recursive))
            assert f"{root}/nope" in notes(info.value) and "FSSpecFileLister" in notes(info.value)

    def test_lists_an_http_index_page(self, http_server):
        make_tree(http_server.root, {"b.txt": "B", "a.txt": "A", "sub/c.txt": "C"})
        base = http_server.url()
        assert list(FSSpecFileLister(base)) == [base + "a.txt", base + "b.txt"]
        assert list(FSSpecFileLister(base, recursive=True)) == [base + "a.txt", base + "b.txt", base + "sub/c.txt"]

    def test_transient_listing_errors_are_retried(self, http_server, sleeps):
        make_tree(http_server.root, {"a.txt": "A"})
        base = http_server.url()
        http_server.fail(2)
        assert list(FSSpecFileLister(base, backoff=0.25)) == [base + "a.txt"]
        assert sleeps == [0.25, 0.5]
        http_server.fail(10)
        with pytest.raises(Exception) as info:
            list(FSSpecFileLister(base, retries=1, backoff=0.25))
        assert f"{base!r} failed after 2 attempts" in notes(info.value)

    def test_listing_retries_on_a_flaky_remote(self, flaky, sleeps):
        flaky.files = {"/d/a": b"A", "/d/b": b"B"}
        flaky.open_errors = [ConnectionResetError("reset")]
        assert list(FSSpecFileLister("flakytest:///d/", backoff=0.1)) == ["flakytest:///d/a", "flakytest:///d/b"]
        assert sleeps == [0.1]

    def test_len_is_unknown(self, memfs):
        with pytest.raises(TypeError, match="FSSpecFileLister"):
            len(FSSpecFileLister(memfs[1]))

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"root": 3}, TypeError, "root"),
            ({"root": ["memory://a", Path("x")]}, TypeError, "root"),
            ({"root": "memory://a", "masks": 1}, TypeError, "masks"),
            ({"root": "memory://a", "recursive": "no"}, TypeError, "recursive"),
            ({"root": "memory://a", "retries": -1}, ValueError, "retries"),
            ({"root": "memory://a", "backoff": -0.5}, ValueError, "backoff"),
            ({"root": "memory://a", "backoff": "1"}, TypeError, "backoff"),
        ],
    )
    def test_bad_arguments(self, kwargs, error, match):
        with pytest.raises(error, match=f"FSSpecFileLister.*{match}"):
            FSSpecFileLister(**kwargs)

    def test_a_root_that_is_not_a_str_raises_at_iteration(self):
        with pytest.raises(TypeError, match="FSSpecFileLister.*URL.*int"):
            list(IterableWrapper([5]).list_files_by_fsspec())

    def test_contract(self, memfs):
        _, root = self.fill(memfs)
        check_datapipe(FSSpecFileLister(root, "*.txt"), expected=[f"{root}/a.txt", f"{root}/b.txt"])
        check_datapipe(
            FSSpecFileLister(root),
            build=lambda src: src.list_files_by_fsspec(),
            probe_data=[root, f"{root}/sub"],
        )


# -- FSSpecFileOpener ------------------------------------------------------------------------------


class TestFSSpecFileOpener:
    def test_reads_memory_files_in_text_and_binary(self, memfs):
        fs, root = memfs
        fs.pipe(f"{root}/a.txt", "héllo\nworld\n".encode())
        urls = IterableWrapper([f"{root}/a.txt"])
        assert [read_item(x) for x in urls.open_files_by_fsspec()] == [("a.txt", "héllo\nworld\n")]
        assert [read_item(x) for x in FSSpecFileOpener(urls, mode="b")] == [("a.txt", "héllo\nworld\n".encode())]
        with pytest.raises(UnicodeDecodeError):
            [read_item(x) for x in FSSpecFileOpener(urls, encoding="ascii")]

    def test_local_paths_and_file_urls(self, tree):
        urls = [str(tree / "a.txt"), f"file://{tree}/b.txt"]
        assert [read_item(x) for x in FSSpecFileOpener(urls)] == [("a.txt", "A"), ("b.txt", "B")]
        assert open_fds_under(tree) == []

    def test_kwargs_for_open_reach_fs_open(self, memfs):
        fs, root = memfs
        fs.pipe(f"{root}/a.txt.gz", gzip.compress(b"inflated"))
        pipe = FSSpecFileOpener([f"{root}/a.txt.gz"], mode="rb", kwargs_for_open={"compression": "gzip"})
        assert [read_item(x)[1] for x in pipe] == [b"inflated"]

    def test_lister_then_opener(self, memfs):
        fs, root = memfs
        for name in ("a.txt", "b.txt"):
            fs.pipe(f"{root}/{name}", name.encode())
        pipe = FSSpecFileLister(root).open_files_by_fsspec(mode="rb")
        assert [read_item(x) for x in pipe] == [("a.txt", b"a.txt"), ("b.txt", b"b.txt")]

    def test_reads_over_http_binary_and_text(self, http_server):
        make_tree(http_server.root, {"a.txt": "line one\nline two\n", "b.bin": bytes(range(256))})
        urls = [http_server.url("a.txt"), http_server.url("b.bin")]
        out = [read_item(x) for x in FSSpecFileOpener(urls, mode="rb")]
        assert out == [("a.txt", b"line one\nline two\n"), ("b.bin", bytes(range(256)))]
        (url, stream), = list(FSSpecFileOpener(urls[:1], encoding="utf-8"))
        with stream:
            assert list(stream) == ["line one\n", "line two\n"]
            assert stream.name == url

    def test_storage_options_reach_the_file_system(self, http_server):
        make_tree(http_server.root, {"a.txt": "A"})
        pipe = FSSpecFileOpener([http_server.url("a.txt")], headers={"X-Datapipes-Test": "yes"})
        assert [read_item(x)[1] for x in pipe] == ["A"]
        assert http_server.request_headers and all(
            h.get("X-Datapipes-Test") == "yes" for h in http_server.request_headers
        )

    def test_http_503_at_open_is_retried_with_backoff(self, http_server, sleeps):
        make_tree(http_server.root, {"a.txt": "A"})
        http_server.fail(2)  # fsspec stats with HEAD then GET: one failed open
        pipe = FSSpecFileOpener([http_server.url("a.txt")], backoff=0.2)
        assert [read_item(x)[1] for x in pipe] == ["A"]
        assert sleeps == [0.2]
        assert [s for m, p, s in http_server.requests] == [503, 503, 200, 206]

    def test_dropped_connections_are_retried(self, http_server, sleeps):
        make_tree(http_server.root, {"a.txt": "A"})
        # aiohttp itself retries a request once when the connection drops: fail more than that.
        http_server.fail(4, mode="drop", methods=("GET",))
        pipe = FSSpecFileOpener([http_server.url("a.txt")], retries=5, backoff=0.01)
        assert [read_item(x)[1] for x in pipe] == ["A"]
        assert len(sleeps) >= 1 and http_server.count("GET") == 5
        assert [s for m, _, s in http_server.requests if m == "GET"] == [0, 0, 0, 0, 206]

    def test_a_failed_read_mid_file_resumes_at_the_same_byte(self, http_server, sleeps):
        data = bytes(range(256)) * 40
        make_tree(http_server.root, {"big.bin": data})
        pipe = FSSpecFileOpener([http_server.url("big.bin")], mode="rb", kwargs_for_open={"block_size": 1000}, backoff=0.01)
        (_, stream), = list(pipe)
        with stream:
            head = stream.read(1500)
            http_server.fail(2, methods=("GET",))
            rest = stream.read()
        assert head + rest == data
        assert len(sleeps) == 2
        assert http_server.requests[-1][2] == 206  # resumed with a byte range, not from the start

    def test_a_truncated_stream_resumes_by_reading_up_to_the_position(self, http_server, sleeps):
        data = bytes(range(256)) * 40
        make_tree(http_server.root, {"big.bin": data})
        pipe = FSSpecFileOpener([http_server.url("big.bin")], mode="rb", kwargs_for_open={"block_size": 0}, backoff=0.01)
        http_server.fail(1, mode="truncate", methods=("GET",))
        (_, stream), = list(pipe)
        with stream:
            assert stream.read(3000) + stream.read() == data
        assert len(sleeps) == 1

    def test_gives_up_after_retries_naming_the_url_and_attempts(self, http_server, sleeps):
        make_tree(http_server.root, {"a.txt": "A"})
        url = http_server.url("a.txt")
        http_server.fail(100)
        with pytest.raises(FileNotFoundError) as info:
            list(FSSpecFileOpener([url], backoff=0.5))
        assert f"[datapipes] opening {url!r} failed after 4 attempts" in notes(info.value)
        assert "FSSpecFileOpener('r') at item 0" in notes(info.value)
        assert info.value.__cause__.status == 503  # fsspec's FileNotFoundError is raised from the 503
        assert sleeps == [0.5, 1.0, 2.0]
        assert http_server.count() == 8  # 4 attempts of HEAD + GET

    def test_a_read_given_up_on_reaches_the_reader_naming_the_url(self, http_server, sleeps):
        make_tree(http_server.root, {"a.txt": "A"})
        url = http_server.url("a.txt")
        (_, stream), = list(FSSpecFileOpener([url], mode="rb", retries=1, backoff=0.01))
        http_server.fail(100, methods=("GET",))
        with stream, pytest.raises(Exception) as info:
            stream.read()
        assert getattr(info.value, "status", None) == 503
        assert f"[datapipes] reading {url!r} failed after 2 attempts" in notes(info.value)

    def test_missing_and_forbidden_urls_are_not_retried(self, http_server, sleeps):
        make_tree(http_server.root, {"a.txt": "A"})
        with pytest.raises(FileNotFoundError) as info:
            list(FSSpecFileOpener([http_server.url("nope.txt")]))
        assert f"while opening {http_server.url('nope.txt')!r}" in notes(info.value)
        http_server.fail(10, status=403)
        with pytest.raises(FileNotFoundError):
            list(FSSpecFileOpener([http_server.url("a.txt")]))
        assert sleeps == []

    def test_backoff_really_sleeps(self, http_server):
        """One real (unpatched) retry: the delay is slept, not only computed."""
        make_tree(http_server.root, {"a.txt": "A"})
        http_server.fail(2)
        start = time.monotonic()
        assert [read_item(x)[1] for x in FSSpecFileOpener([http_server.url("a.txt")], backoff=0.05)] == ["A"]
        assert time.monotonic() - start >= 0.05

    @pytest.mark.parametrize(
        "error, retried",
        [
            (ConnectionResetError("reset"), True),
            (TimeoutError("slow"), True),
            (OSError(errno.EIO, "I/O error"), True),
            (FileNotFoundError(errno.ENOENT, "gone"), False),
            (PermissionError(errno.EACCES, "denied"), False),
            (IsADirectoryError(errno.EISDIR, "a folder"), False),
            (ValueError("not an I/O error"), False),
        ],
    )
    def test_which_open_errors_are_retried(self, flaky, sleeps, error, retried):
        flaky.files = {"/a": b"A"}
        flaky.open_errors = [error]
        pipe = FSSpecFileOpener(["flakytest:///a"], mode="rb", backoff=0.1)
        if retried:
            assert [read_item(x)[1] for x in pipe] == [b"A"]
            assert sleeps == [0.1] and flaky.opens == 2
        else:
            with pytest.raises(type(error)) as info:
                list(pipe)
            assert info.value is error and sleeps == [] and flaky.opens == 1
            assert "while opening 'flakytest:///a'" in notes(error)

    def test_a_read_error_reopens_and_seeks_back(self, flaky, sleeps):
        data = bytes(range(256)) * 80
        flaky.files = {"/a": data}
        # io.BufferedReader reads 8 KiB at a time: the second read (from byte 8192) fails twice.
        flaky.read_errors = {10_000: [ConnectionResetError("reset"), TimeoutError("slow")]}
        (_, stream), = list(FSSpecFileOpener(["flakytest:///a"], mode="rb", backoff=0.1))
        with stream:
            assert stream.read(50) + stream.read(9000) + stream.read() == data
        assert sleeps == [0.1, 0.2] and flaky.opens == 3

    def test_retries_zero_and_local_file_systems_never_retry(self, flaky, sleeps, memfs):
        flaky.files = {"/a": b"A"}
        flaky.open_errors = [ConnectionResetError("reset")]
        with pytest.raises(ConnectionResetError):
            list(FSSpecFileOpener(["flakytest:///a"], retries=0))
        _, root = memfs
        with pytest.raises(FileNotFoundError):
            list(FSSpecFileOpener([f"{root}/missing"]))
        assert sleeps == []

    def test_skip_unopenable_urls_and_count_them(self, memfs, flaky, sleeps):
        fs, root = memfs
        fs.pipe(f"{root}/a.txt", b"A")
        flaky.open_errors = [PermissionError(errno.EACCES, "denied")]
        pipe = FSSpecFileOpener([f"{root}/a.txt", f"{root}/nope", "flakytest:///x", 3, f"{root}/a.txt"], on_error="skip")
        assert [read_item(x)[1] for x in pipe] == ["A", "A"]
        assert pipe.failures.count == 3

    def test_unknown_protocol_names_the_url(self):
        with pytest.raises(ValueError) as info:
            list(FSSpecFileOpener(["nosuchproto://x"]))
        assert "'nosuchproto://x'" in notes(info.value)

    def test_streams_follow_the_opener_rule(self, memfs):
        fs, root = memfs
        fs.pipe(f"{root}/a", b"A")
        it = iter(FSSpecFileOpener([f"{root}/a", f"{root}/a", f"{root}/nope"], mode="rb"))
        (_, s1), (_, s2) = next(it), next(it)
        with pytest.raises(FileNotFoundError):
            next(it)
        assert s1.closed and s2.closed
        items = list(FSSpecFileOpener([f"{root}/a"], mode="rb"))
        assert not items[0][1].closed and items[0][1].read() == b"A"

    def test_len(self, memfs):
        urls = IterableWrapper(["memory://a", "memory://b"])
        assert len(FSSpecFileOpener(urls)) == 2
        with pytest.raises(TypeError, match="FSSpecFileOpener"):
            len(FSSpecFileOpener(urls, on_error="skip"))

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"source_datapipe": "memory://a"}, TypeError, "source_datapipe"),
            ({"mode": "wb"}, ValueError, "mode"),
            ({"mode": "b", "encoding": "utf-8"}, ValueError, "encoding"),
            ({"kwargs_for_open": [("block_size", 0)]}, TypeError, "kwargs_for_open"),
            ({"retries": 1.5}, TypeError, "retries"),
            ({"backoff": -1}, ValueError, "backoff"),
        ],
    )
    def test_bad_arguments(self, kwargs, error, match):
        kwargs = {"source_datapipe": IterableWrapper(["memory://a"]), **kwargs}
        with pytest.raises(error, match=f"FSSpecFileOpener.*{match}"):
            FSSpecFileOpener(**kwargs)

    def test_contract(self, memfs, http_server):
        fs, root = memfs
        fs.pipe(f"{root}/a.txt", b"A")
        fs.pipe(f"{root}/b.txt", b"B")
        urls = [f"{root}/a.txt", f"{root}/b.txt"]
        check_datapipe(FSSpecFileOpener(urls).map(read_item), expected=[("a.txt", "A"), ("b.txt", "B")])
        check_datapipe(
            FSSpecFileOpener(urls).map(read_item),
            build=lambda src: src.open_files_by_fsspec().map(read_item),
            probe_data=urls,
        )
        make_tree(http_server.root, {"h.txt": "H"})
        check_datapipe(FSSpecFileOpener([http_server.url("h.txt")], mode="rb").map(read_item), expected=[("h.txt", b"H")])


# -- FSSpecSaver -----------------------------------------------------------------------------------


class TestFSSpecSaver:
    def test_writes_to_memory_and_reads_back(self, memfs):
        fs, root = memfs
        pairs = [("a.bin", b"DATA1"), ("b.bin", b"DATA2")]
        urls = list(IterableWrapper(pairs).save_by_fsspec(mode="wb", filepath_fn=lambda n: f"{root}/{n}"))
        assert urls == [f"{root}/a.bin", f"{root}/b.bin"]
        assert [read_item(x) for x in FSSpecFileOpener(urls, mode="rb")] == pairs
        text = list(FSSpecSaver(IterableWrapper([(f"{root}/t.txt", "text")])))
        assert fs.cat(text[0]) == b"text"

    def test_local_folders_are_created(self, tmp_path):
        out = list(FSSpecSaver(IterableWrapper([(str(tmp_path / "x" / "y" / "a.txt"), "A")])))
        assert out == [str(tmp_path / "x" / "y" / "a.txt")] and (tmp_path / "x" / "y" / "a.txt").read_text() == "A"
        list(FSSpecSaver(IterableWrapper([(f"file://{tmp_path}/z/b.txt", "B")])))
        assert (tmp_path / "z" / "b.txt").read_text() == "B"

    def test_kwargs_for_open_reach_fs_open(self, memfs):
        fs, root = memfs
        list(FSSpecSaver(IterableWrapper([(f"{root}/a.gz", b"zipped")]), mode="wb", kwargs_for_open={"compression": "gzip"}))
        assert gzip.decompress(fs.cat(f"{root}/a.gz")) == b"zipped"

    def test_errors_name_the_url_and_stage(self, memfs):
        _, root = memfs
        with pytest.raises(ValueError) as info:
            list(FSSpecSaver(IterableWrapper([("nosuchproto://x", "A")])))
        assert "'nosuchproto://x'" in notes(info.value) and "FSSpecSaver('w') at item 0" in notes(info.value)
        with pytest.raises(TypeError) as info:
            list(FSSpecSaver(IterableWrapper([(f"{root}/a", "text")]), mode="wb"))
        assert f"{root}/a" in notes(info.value)
        with pytest.raises(TypeError, match=r"\(meta, data\)"):
            list(FSSpecSaver(IterableWrapper([(1, 2, 3)])))

    def test_len_is_the_sources(self):
        assert len(FSSpecSaver(IterableWrapper([("a", "b")] * 3))) == 3

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"source_datapipe": None}, TypeError, "source_datapipe"),
            ({"mode": "rb"}, ValueError, "mode"),
            ({"filepath_fn": 1}, TypeError, "filepath_fn"),
            ({"kwargs_for_open": "gzip"}, TypeError, "kwargs_for_open"),
        ],
    )
    def test_bad_arguments(self, kwargs, error, match):
        kwargs = {"source_datapipe": IterableWrapper([("a", "b")]), **kwargs}
        with pytest.raises(error, match=f"FSSpecSaver.*{match}"):
            FSSpecSaver(**kwargs)

    def test_contract(self, memfs):
        _, root = memfs
        pairs = [(f"{root}/{i}.txt", str(i)) for i in range(3)]
        check_datapipe(FSSpecSaver(IterableWrapper(pairs)), expected=[u for u, _ in pairs])
        check_datapipe(
            FSSpecSaver(IterableWrapper(pairs)),
            build=lambda src: src.map(lambda i: (f"{root}/{i}.txt", str(i))).save_by_fsspec(),
        )



# -- passes: built at iter(), upstream released on failure -----------------------------------------


def _fill_memory(memfs: tuple[Any, str]) -> str:
    fs, root = memfs
    folder = root[len("memory://") :]
    for name in ("a.txt", "b.txt", "sub/c.txt"):
        fs.pipe(f"/{folder}/{name}", name.encode())
    return root


#: one small pipe per stage class and variant: (tree, memory root, output folder) -> pipe
BUILT_AT_ITER = {
    "FileLister": lambda t, m, out: FileLister(str(t)),
    "FileLister-roots-recursive-masks": lambda t, m, out: FileLister([str(t), t / "sub"], "*.txt", recursive=True),
    "FileLister-pipe-abspath-unsorted": lambda t, m, out: IterableWrapper([str(t)]).list_files(
        abspath=True, non_deterministic=True),
    "FileOpener": lambda t, m, out: FileLister(str(t)).open_files(),
    "FileOpener-binary-skip": lambda t, m, out: IterableWrapper(three_paths(t)).open_files(
        mode="b", on_error="skip", max_failures=1),
    "FileOpener-list": lambda t, m, out: FileOpener(three_paths(t), encoding="utf-8", length=3),
    "Saver": lambda t, m, out: IterableWrapper([(str(out / "a.txt"), "A")]).save_to_disk(),
    "Saver-binary-filepath_fn": lambda t, m, out: IterableWrapper([("a.bin", b"A")]).save_to_disk(
        mode="wb", filepath_fn=lambda name: str(out / name)),
    "FSSpecFileLister": lambda t, m, out: FSSpecFileLister(m),
    "FSSpecFileLister-pipe-recursive": lambda t, m, out: IterableWrapper([m]).list_files_by_fsspec(
        masks="*.txt", recursive=True),
    "FSSpecFileOpener": lambda t, m, out: FSSpecFileLister(m).open_files_by_fsspec(mode="rb"),
    "FSSpecFileOpener-skip": lambda t, m, out: IterableWrapper([f"{m}/a.txt"]).open_files_by_fsspec(
        on_error="skip", retries=0),
    "FSSpecFileOpener-list": lambda t, m, out: FSSpecFileOpener([f"{m}/a.txt"], kwargs_for_open={}),
    "FSSpecSaver": lambda t, m, out: IterableWrapper([(f"{m}/out/a.bin", b"A")]).save_by_fsspec(mode="wb"),
    "FSSpecSaver-local-filepath_fn": lambda t, m, out: IterableWrapper([("a.txt", "A")]).save_by_fsspec(
        filepath_fn=lambda name: str(out / name)),
    "chain": lambda t, m, out: FileLister(str(t), "*.txt").open_files().map(
        lambda item: (str(out / os.path.basename(item[0])), read_item(item)[1])).save_to_disk(),
}


def _ident(x: Any) -> Any:
    return x


#: (tree, memory root, output folder) -> (source items, the stage over them, the error it raises)
FAILING = {
    "FileLister": lambda t, m, out: ([str(t), str(t / "missing"), str(t)], lambda p: p.list_files(),
                                     FileNotFoundError),
    "FileOpener": lambda t, m, out: ([str(t / "a.txt"), str(t / "nope"), str(t / "b.txt")],
                                     lambda p: p.open_files(), FileNotFoundError),
    "FileOpener-skip-budget": lambda t, m, out: ([str(t / "nope"), str(t / "nope2"), str(t / "a.txt")],
                                                 lambda p: p.open_files(on_error="skip", max_failures=1),
                                                 ExceptionGroup),
    "Saver": lambda t, m, out: ([(str(out / "a.txt"), "A"), (str(t / "a.txt" / "x.txt"), "X"), ("b", "B")],
                                lambda p: p.save_to_disk(), OSError),
    "FSSpecFileLister": lambda t, m, out: ([m, f"{m}/missing", m], lambda p: p.list_files_by_fsspec(),
                                           FileNotFoundError),
    "FSSpecFileOpener": lambda t, m, out: ([f"{m}/a.txt", f"{m}/nope", f"{m}/b.txt"],
                                           lambda p: p.open_files_by_fsspec(), FileNotFoundError),
    "FSSpecSaver": lambda t, m, out: ([(f"{m}/out/a.bin", b"A"), (7, b"X"), (f"{m}/out/b.bin", b"B")],
                                      lambda p: p.save_by_fsspec(mode="wb"), TypeError),
}


class TestPasses:
    """``iter(pipe)`` builds its whole pass at once: every stage creates its upstream's iterator in
    its ``__iter__`` (so two passes of one graph never share an upstream through the fallback), yet
    nothing is listed, opened, read or written before the first ``next()``; a stage that fails
    releases its upstream at once."""

    @pytest.fixture
    def places(self, tree, memfs, tmp_path):
        out = tmp_path / "out"
        return tree, _fill_memory(memfs), out

    @pytest.mark.parametrize("case", sorted(BUILT_AT_ITER))
    def test_pass_is_built_at_iter(self, case, places, memfs):
        tree, mem, out = places
        fs, _ = memfs
        pipe = BUILT_AT_ITER[case](tree, mem, out)
        it = iter(pipe)
        assert _pass.unbuilt(it) == [], _pass.unbuilt(it)
        # nothing started: no file open, nothing written (locally or in memory://)
        assert open_fds_under(tree) == [] and not out.exists() and not fs.exists(f"{mem}/out")
        assert list(it)  # and the pass then runs as usual
        it.close()

    @pytest.mark.parametrize("case", ["FileLister", "FileOpener", "Saver", "FSSpecFileLister", "FSSpecSaver"])
    def test_two_passes_at_once_each_build_their_own_upstream(self, case, places):
        tree, mem, out = places
        pipe = BUILT_AT_ITER[case](tree, mem, out)
        first, second = iter(pipe), iter(pipe)
        assert first.pass_ is not second.pass_
        for it in (first, second):
            assert all(id(stage) in it.pass_.built for stage in stages(pipe)), case
        a, b = list(first), list(second)
        assert len(a) == len(b) > 0
        StreamWrapper.close_streams([a, b])

    @pytest.mark.usefixtures("gc_off")
    @pytest.mark.parametrize("threaded", [False, True], ids=["serial", "threaded"])
    @pytest.mark.parametrize("case", sorted(FAILING))
    def test_a_failing_stage_releases_its_upstream_while_the_error_is_held(self, case, threaded, places):
        tree, mem, out = places
        items, stage, error = FAILING[case](tree, mem, out)
        source = Guarded(items)
        before = set(threading.enumerate())
        upstream = IterableWrapper(source, deepcopy=False)
        if threaded:
            upstream = upstream.map(_ident, concurrency=2)
        held = error_of_pass(stage(upstream), error, each=StreamWrapper.close_streams)  # noqa: F841
        assert source.closed == [True], "the source's pass was not closed while the consumer holds its error"
        assert not threads_started_since(before, timeout=3.0)
        assert open_fds_under(tree) == []
