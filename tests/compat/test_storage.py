"""datapipes.iter.cache and datapipes.iter.io: the on-disk cache (on_disk_cache / end_caching), check_hash,
read_from_http / read_from_remote, load_from_bz2 / load_from_xz and extract, against torchdata 0.9's behaviour."""

import bz2
import gzip
import hashlib
import http.server
import io
import json
import lzma
import multiprocessing
import os
import pickle
import struct
import tarfile
import threading
import warnings
from functools import partial
from pathlib import Path

import pytest
import torch

from datapipes._runtime import passes as _pass
from datapipes.iter import (
    Bz2FileLoader,
    EndOnDiskCacheHolder,
    Extractor,
    HashChecker,
    HttpReader,
    IterableWrapper,
    OnDiskCacheHolder,
    OnlineReader,
    TFRecordLoader,
    XzFileLoader,
)
from datapipes.iter.cache import disk
from datapipes.iter.io import tfrecord as tfrecord_io  # helpers' tfrecord() builds a file
from datapipes.testing import check_datapipe, check_resume

from helpers import NonSeekable, crc32c, ld, make_tar, make_zip, tfrecord, varint

fcntl = pytest.importorskip("fcntl") if os.name != "nt" else None


def sha(data):
    return hashlib.sha256(data).hexdigest()


def leftovers(root):
    """Temporary or promise files left anywhere under ``root``."""
    return sorted(p.name for p in Path(root).rglob("*") if p.name.endswith((".tmp", ".promise")))


class Fetcher:
    """A picklable stand-in for a download: ``name -> (name, bytes)``, counting its calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, name):
        self.calls.append(name)
        return name, f"data of {name}".encode()


def cache_pipe(root, names, fetch, **end_kwargs):
    path_of = partial(os.path.join, str(root))
    return (
        IterableWrapper(names).on_disk_cache(filepath_fn=path_of)
        .map(fetch)
        .end_caching(mode="wb", filepath_fn=path_of, **end_kwargs)
    )


# -- on_disk_cache / end_caching -------------------------------------------------------------------


class TestOnDiskCache:
    def test_first_pass_writes_later_passes_read_the_cache(self, tmp_path):
        fetch = Fetcher()
        pipe = cache_pipe(tmp_path, ["a", "b", "c"], fetch)
        first = list(pipe)
        assert first == [str(tmp_path / n) for n in "abc"]
        assert fetch.calls == ["a", "b", "c"]
        assert (tmp_path / "b").read_bytes() == b"data of b"
        assert list(pipe) == first
        assert fetch.calls == ["a", "b", "c"]  # nothing fetched again
        assert leftovers(tmp_path) == []

    def test_partial_cache_keeps_the_source_order(self, tmp_path):
        (tmp_path / "b").write_bytes(b"cached b")
        (tmp_path / "d").write_bytes(b"cached d")
        fetch = Fetcher()
        out = list(cache_pipe(tmp_path, ["a", "b", "c", "d", "e"], fetch))
        assert [os.path.basename(p) for p in out] == ["a", "b", "c", "d", "e"]
        assert fetch.calls == ["a", "c", "e"]
        assert (tmp_path / "b").read_bytes() == b"cached b"

    def test_contract(self, tmp_path):
        fetch = Fetcher()
        pipe = cache_pipe(tmp_path, ["a", "b", "c"], fetch)
        check_datapipe(pipe, expected=[str(tmp_path / n) for n in "abc"])
        probe_root = tmp_path / "probe"
        check_datapipe(
            cache_pipe(tmp_path / "c2", ["x"], fetch),
            build=lambda src: src.on_disk_cache(filepath_fn=lambda i: str(probe_root / str(i)))
            .map(lambda i: (i, b"x")).end_caching(same_filepath_fn=True),
        )

    def test_data_kinds_streams_are_read_and_closed(self, tmp_path):
        stream = io.BytesIO(b"from a stream")
        items = {"s": stream, "b": b"bytes", "i": [b"chunk1-", b"chunk2"]}
        pipe = (IterableWrapper(list(items)).on_disk_cache(filepath_fn=lambda n: str(tmp_path / n))
                .map(lambda n: (n, items[n])).end_caching(same_filepath_fn=True))
        assert [Path(p).read_bytes() for p in pipe] == [b"from a stream", b"bytes", b"chunk1-chunk2"]
        assert stream.closed

    def test_text_mode_and_skip_read(self, tmp_path):
        pipe = (IterableWrapper(["t"]).on_disk_cache(filepath_fn=lambda n: str(tmp_path / n))
                .map(lambda n: (n, io.StringIO("héllo"))).end_caching(mode="w", same_filepath_fn=True))
        assert [Path(p).read_text() for p in pipe] == ["héllo"]
        pipe = (IterableWrapper(["u"]).on_disk_cache(filepath_fn=lambda n: str(tmp_path / n))
                .map(lambda n: (n, io.BytesIO(b"x"))).end_caching(same_filepath_fn=True, skip_read=True))
        with pytest.raises(TypeError):  # skip_read: the data is written as it is, and a stream is not bytes
            list(pipe)
        assert not (tmp_path / "u").exists() and leftovers(tmp_path) == []

    def test_creates_folders(self, tmp_path):
        fetch = Fetcher()
        pipe = (IterableWrapper(["a"]).on_disk_cache(filepath_fn=lambda n: str(tmp_path / "x" / "y" / n))
                .map(fetch).end_caching(same_filepath_fn=True))
        assert list(pipe) == [str(tmp_path / "x" / "y" / "a")]

    def test_hash_dict(self, tmp_path):
        good = {str(tmp_path / n): sha(f"data of {n}".encode()) for n in "ab"}
        (tmp_path / "a").write_bytes(b"stale content")  # wrong hash: fetched again
        (tmp_path / "b").write_bytes(b"data of b")  # right hash: cached
        fetch = Fetcher()
        path_of = partial(os.path.join, str(tmp_path))
        pipe = (IterableWrapper(["a", "b"]).on_disk_cache(filepath_fn=path_of, hash_dict=good)
                .map(fetch).end_caching(same_filepath_fn=True))
        assert [Path(p).read_bytes() for p in pipe] == [b"data of a", b"data of b"]
        assert fetch.calls == ["a"]

    def test_hash_mismatch_of_written_data_raises_and_removes_the_file(self, tmp_path):
        path_of = partial(os.path.join, str(tmp_path))
        bad = {path_of("a"): sha(b"something else")}
        pipe = (IterableWrapper(["a"]).on_disk_cache(filepath_fn=path_of, hash_dict=bad, hash_type="sha256")
                .map(Fetcher()).end_caching(same_filepath_fn=True))
        with pytest.raises(RuntimeError, match="does not match. Delete the file manually and retry.") as info:
            list(pipe)
        assert any("EndOnDiskCacheHolder" in note for note in info.value.__notes__)
        assert not (tmp_path / "a").exists() and leftovers(tmp_path) == []
        md5 = {path_of("b"): hashlib.md5(b"data of b").hexdigest()}
        pipe = (IterableWrapper(["b", "c"]).on_disk_cache(filepath_fn=path_of, hash_dict=md5, hash_type="md5")
                .map(Fetcher()).end_caching(same_filepath_fn=True))
        with pytest.raises(RuntimeError, match="Unspecified hash for file .*c"):
            list(pipe)
        assert (tmp_path / "b").read_bytes() == b"data of b"

    def test_extra_check_fn(self, tmp_path):
        (tmp_path / "a").write_bytes(b"")
        fetch = Fetcher()
        pipe = (IterableWrapper(["a"]).on_disk_cache(filepath_fn=lambda n: str(tmp_path / n),
                                                     extra_check_fn=lambda p: os.path.getsize(p) > 0)
                .map(fetch).end_caching(same_filepath_fn=True))
        assert [Path(p).read_bytes() for p in pipe] == [b"data of a"]
        list(pipe)
        assert fetch.calls == ["a"]

    def test_failure_mid_write_leaves_nothing(self, tmp_path):
        class Broken(io.RawIOBase):
            def readable(self):
                return True

            def readinto(self, b):
                raise OSError("connection reset")

        pipe = (IterableWrapper(["a"]).on_disk_cache(filepath_fn=lambda n: str(tmp_path / n))
                .map(lambda n: (n, Broken())).end_caching(same_filepath_fn=True))
        with pytest.raises(OSError, match="connection reset"):
            list(pipe)
        assert list(tmp_path.iterdir()) == []

    def test_one_to_many(self, tmp_path):
        archives = {
            "x.tar": make_tar([("1.txt", b"one"), ("2.txt", b"two")]),
            "y.tar": make_tar([("3.txt", b"three")]),
        }
        fetched = []

        def download(name):
            fetched.append(name)
            return name, io.BytesIO(archives[name])

        def build():
            return (IterableWrapper(["x.tar", "y.tar"])
                    .on_disk_cache(filepath_fn=lambda n: str(tmp_path / n))
                    .map(download).load_from_tar()
                    .end_caching(filepath_fn=lambda member: str(tmp_path / "out" / member)))

        first = list(build())
        names = [os.path.relpath(p, tmp_path) for p in first]
        assert names == ["out/x.tar/1.txt", "out/x.tar/2.txt", "out/y.tar/3.txt"]
        assert json.loads((tmp_path / "x.tar.torchdata_list").read_text())["files"] == first[:2]  # a list no name can forge
        assert not (tmp_path / "x.tar").exists()  # the archive itself is not kept
        assert list(build()) == first and fetched == ["x.tar", "y.tar"]
        os.unlink(first[2])  # a listed file gone: that item is made again
        assert list(build()) == first and fetched == ["x.tar", "y.tar", "y.tar"]
        assert leftovers(tmp_path) == []

    def test_one_to_many_closed_early_lists_nothing(self, tmp_path):
        tar = make_tar([("1.txt", b"one"), ("2.txt", b"two")])
        pipe = (IterableWrapper(["x.tar"]).on_disk_cache(filepath_fn=lambda n: str(tmp_path / n))
                .map(lambda n: (n, io.BytesIO(tar))).load_from_tar()
                .end_caching(filepath_fn=lambda m: str(tmp_path / "out" / m)))
        it = iter(pipe)
        next(it)
        it.close()
        assert not (tmp_path / "x.tar.torchdata_list").exists() and leftovers(tmp_path) == []
        assert len(list(pipe)) == 2 and (tmp_path / "x.tar.torchdata_list").exists()

    def test_mixing_one_file_and_several_raises(self, tmp_path):
        pipe = (IterableWrapper(["a"]).on_disk_cache(filepath_fn=lambda n: str(tmp_path / n))
                .flatmap(lambda n: [(n, b"1"), (n + ".extra", b"2")])
                .end_caching(filepath_fn=lambda n: str(tmp_path / n)))
        with pytest.raises(RuntimeError, match="cannot tell which item"):
            list(pipe)

    def test_resume_while_writing(self, tmp_path):
        root = tmp_path / "cache"

        def build():
            for p in root.glob("*") if root.exists() else ():
                p.unlink()  # every pass starts with an empty cache: the stopped one wrote its files
            return cache_pipe(root, list("abcde"), Fetcher())

        out = check_resume(build, ks=range(6), convert=lambda p: (os.path.basename(p), Path(p).read_bytes()))
        assert out[0] == ("a", b"data of a")

    def test_resume_cached_and_partially_cached(self, tmp_path):
        names = list("abcdef")
        (tmp_path / "b").write_bytes(b"data of b")
        (tmp_path / "e").write_bytes(b"data of e")
        check_resume(lambda: cache_pipe(tmp_path, names, Fetcher()), ks=range(7), through="torch")

    def test_resume_inside_an_archive(self, tmp_path):
        tars = {"x.tar": make_tar([(f"{i}.txt", b"%d" % i) for i in range(3)]), "y.tar": make_tar([("9.txt", b"9")])}
        root = tmp_path / "c"

        def build():
            if root.exists():
                for p in sorted(root.rglob("*"), reverse=True):
                    p.rmdir() if p.is_dir() else p.unlink()
            return (IterableWrapper(list(tars)).on_disk_cache(filepath_fn=lambda n: str(root / n))
                    .map(lambda n: (n, io.BytesIO(tars[n]))).load_from_tar()
                    .end_caching(filepath_fn=lambda m: str(root / "out" / m)))

        check_resume(build, ks=range(5), convert=lambda p: (os.path.relpath(p, root), Path(p).read_bytes()))
        # Stopped inside x.tar and resumed (the cache as the stopped pass left it): the list of x.tar
        # still names all of its files, those written before the stop included.
        it = iter(build())
        next(it)
        state = it.state_dict()
        it.close()
        again = iter(_same_graph(tars, root))
        again.load_state_dict(state)
        rest = list(again)
        assert [os.path.relpath(p, root) for p in rest] == ["out/x.tar/1.txt", "out/x.tar/2.txt", "out/y.tar/9.txt"]
        listed = json.loads((root / "x.tar.torchdata_list").read_text())["files"]
        assert [os.path.basename(p) for p in listed] == ["0.txt", "1.txt", "2.txt"]
        assert leftovers(root) == []

    def test_pickle_with_lambdas(self, tmp_path):
        pipe = (IterableWrapper(["a"]).on_disk_cache(filepath_fn=lambda n: str(tmp_path / n))
                .map(lambda n: (n, b"z")).end_caching(same_filepath_fn=True))
        clone = pickle.loads(pickle.dumps(pipe))
        assert list(clone) == [str(tmp_path / "a")] and (tmp_path / "a").read_bytes() == b"z"
        assert list(pipe) == [str(tmp_path / "a")]

    def test_len(self, tmp_path):
        pipe = cache_pipe(tmp_path, ["a"], Fetcher())
        with pytest.raises(TypeError, match=r"EndOnDiskCacheHolder.* has no len\(\): an item may give several files"):
            len(pipe)
        with pytest.raises(TypeError, match="OnDiskCacheHolder"):
            len(IterableWrapper([1]).on_disk_cache())

    def test_argument_errors(self, tmp_path):
        src = IterableWrapper(["a"])
        with pytest.raises(TypeError, match="OnDiskCacheHolder: source_datapipe"):
            OnDiskCacheHolder([1])
        with pytest.raises(TypeError, match="filepath_fn must be callable"):
            src.on_disk_cache(filepath_fn="x")

        def gen(x):
            yield x

        with pytest.raises(TypeError, match="generator"):
            src.on_disk_cache(filepath_fn=gen)
        with pytest.raises(ValueError, match="Invalid hash_type requested"):
            src.on_disk_cache(hash_dict={}, hash_type="sha1")
        with pytest.raises(TypeError, match="hash_dict"):
            src.on_disk_cache(hash_dict=[("a", "b")])
        with pytest.raises(TypeError, match="extra_check_fn"):
            src.on_disk_cache(extra_check_fn=1)
        with pytest.raises(RuntimeError, match="Expected `OnDiskCacheHolder` existing in pipeline"):
            src.map(lambda x: (x, b"")).end_caching()
        holder = src.on_disk_cache()
        with pytest.raises(ValueError, match="mutually exclusive"):
            holder.end_caching(filepath_fn=str, same_filepath_fn=True)
        with pytest.raises(ValueError, match="mode"):
            holder.end_caching(mode="ab")
        with pytest.raises(TypeError, match="timeout"):
            holder.end_caching(timeout="1")
        with pytest.raises(ValueError, match="timeout"):
            holder.end_caching(timeout=-1)
        with pytest.raises(TypeError, match="skip_read"):
            holder.end_caching(skip_read=1)
        holder.end_caching()
        with pytest.raises(RuntimeError, match="can only be invoked once per `OnDiskCacheHolder`"):
            holder.end_caching()
        with pytest.raises(RuntimeError, match="Please call `end_caching\\(\\)` before iteration"):
            list(src.on_disk_cache())
        with pytest.raises(RuntimeError, match="`OnDiskCacheHolder` doesn't support add operation"):
            src.on_disk_cache() + src

    def test_bad_paths_are_named(self, tmp_path):
        pipe = IterableWrapper([1]).on_disk_cache().map(lambda x: (str(tmp_path / "f"), b"")).end_caching()
        with pytest.raises(TypeError, match="OnDiskCacheHolder: the cache path of an item must be a str") as info:
            list(pipe)
        assert "[datapipes] raised in stage OnDiskCacheHolder at item 0" in info.value.__notes__
        pipe = IterableWrapper([str(tmp_path / "g")]).on_disk_cache().map(lambda x: (x, b"", 3)).end_caching()
        with pytest.raises(TypeError, match="EndOnDiskCacheHolder.*expects \\(meta, data\\) pairs"):
            list(pipe)

    def test_nested_caches(self, tmp_path):
        gz = gzip.compress(b"inner")

        def build():
            down = (IterableWrapper(["f.gz"]).on_disk_cache(filepath_fn=lambda n: str(tmp_path / n))
                    .map(lambda n: (n, gz)).end_caching(same_filepath_fn=True))
            return (down.on_disk_cache(filepath_fn=lambda p: p[:-3])
                    .open_files(mode="b").decompress().end_caching(filepath_fn=lambda p: p[:-3]))

        assert [Path(p).read_bytes() for p in build()] == [b"inner"]
        assert [Path(p).read_bytes() for p in build()] == [b"inner"]


def _same_graph(tars, root):
    return (IterableWrapper(list(tars)).on_disk_cache(filepath_fn=lambda n: str(root / n))
            .map(lambda n: (n, io.BytesIO(tars[n]))).load_from_tar()
            .end_caching(filepath_fn=lambda m: str(root / "out" / m)))


@pytest.mark.skipif(fcntl is None, reason="no fcntl: no inter-process locks")
class TestCacheLocks:
    def _hold_lock(self, path):
        fd = os.open(path + ".promise", os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd

    def test_waits_for_another_writer_then_reads_the_cache(self, tmp_path, monkeypatch):
        target = str(tmp_path / "a")
        fd = self._hold_lock(target)
        real_sleep = disk.time.sleep
        waited = []

        def other_writer_finishes(delay):  # the other process completes while we wait
            waited.append(delay)
            if len(waited) == 1:
                Path(target).write_bytes(b"written by the other process")
                os.unlink(target + ".promise")
                os.close(fd)
            real_sleep(0)

        monkeypatch.setattr(disk.time, "sleep", other_writer_finishes)
        fetch = Fetcher()
        assert list(cache_pipe(tmp_path, ["a"], fetch)) == [target]
        assert waited and fetch.calls == []
        assert Path(target).read_bytes() == b"written by the other process"

    def test_writer_gone_without_writing(self, tmp_path, monkeypatch):
        target = str(tmp_path / "a")
        fd = self._hold_lock(target)

        def dies(delay):
            os.close(fd)  # released by the OS; the promise file stays

        monkeypatch.setattr(disk.time, "sleep", dies)
        fetch = Fetcher()
        assert list(cache_pipe(tmp_path, ["a"], fetch)) == [target]
        assert fetch.calls == ["a"] and leftovers(tmp_path) == []

    def test_timeout(self, tmp_path):
        fd = self._hold_lock(str(tmp_path / "a"))
        try:
            with pytest.raises(TimeoutError, match="expected to be written by different process, but file is not ready in 0.005 seconds"):
                list(cache_pipe(tmp_path, ["a"], Fetcher(), timeout=0.005))
        finally:
            os.close(fd)

    def test_same_path_twice_in_a_pass_does_not_wait(self, tmp_path):
        fetch = Fetcher()
        out = list(cache_pipe(tmp_path, ["a", "a", "b"], fetch, timeout=0.001))
        assert [os.path.basename(p) for p in out] == ["a", "a", "b"]
        assert leftovers(tmp_path) == []

    def test_lock_held_while_writing_and_released_after(self, tmp_path):
        seen = []

        def fetch(name):
            promise = tmp_path / (name + ".promise")
            fd = os.open(promise, os.O_RDWR)
            try:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
            seen.append(name)
            return name, b"x"

        list(cache_pipe(tmp_path, ["a", "b"], fetch))
        assert seen == ["a", "b"] and leftovers(tmp_path) == []

    def test_processes_share_the_work(self, tmp_path):
        ctx = multiprocessing.get_context("fork")
        log = tmp_path / "fetch.log"
        names = [f"n{i}" for i in range(12)]
        procs = [ctx.Process(target=_worker_run, args=(str(tmp_path / "cache"), names, str(log))) for _ in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        assert [p.exitcode for p in procs] == [0, 0, 0]
        fetched = log.read_text().split()
        assert sorted(fetched) == sorted(names)  # every item fetched exactly once, by one of them
        for n in names:
            assert (tmp_path / "cache" / n).read_bytes() == f"data of {n}".encode()
        assert leftovers(tmp_path) == []


def _log_fetch(log, name):
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{name}\n".encode())
    os.close(fd)
    return name, f"data of {name}".encode()


def _worker_run(root, names, log):
    out = list(cache_pipe(root, names, partial(_log_fetch, log)))
    assert out == [os.path.join(root, n) for n in names]


# -- check_hash ------------------------------------------------------------------------------------


class TestHashChecker:
    def test_matching_hashes_pass_rewound(self):
        data = {"a": b"alpha", "b": b"beta"}
        hashes = {k: sha(v) for k, v in data.items()}
        pipe = IterableWrapper([(k, io.BytesIO(v)) for k, v in data.items()]).check_hash(hashes)
        assert [(p, s.read()) for p, s in pipe] == [("a", b"alpha"), ("b", b"beta")]

    def test_bytes_str_and_md5(self):
        pipe = IterableWrapper([("a", b"x"), ("b", "y")]).check_hash(
            {"a": hashlib.md5(b"x").hexdigest(), "b": hashlib.md5(b"y").hexdigest()}, "md5")
        assert list(pipe) == [("a", b"x"), ("b", "y")]

    def test_non_seekable_stream_is_handed_on_in_memory(self):
        pipe = HashChecker(IterableWrapper([("a", NonSeekable(b"abc"))]), {"a": sha(b"abc")})
        [(path, stream)] = list(pipe)
        assert stream.read() == b"abc"

    def test_rewind_false(self):
        pipe = IterableWrapper([("a", io.BytesIO(b"abc"))]).check_hash({"a": sha(b"abc")}, rewind=False)
        assert [s.read() for _, s in pipe] == [b""]

    def test_text_stream(self):
        pipe = IterableWrapper([("a", io.StringIO("héllo"))]).check_hash({"a": sha("héllo".encode())})
        assert [s.read() for _, s in pipe] == ["héllo"]

    def test_mismatch_and_unspecified(self):
        pipe = IterableWrapper([("a", b"abc")]).check_hash({"a": sha(b"abd")})
        with pytest.raises(RuntimeError, match=r"The hash [0-9a-f]{64} of a does not match\. Delete the file manually and retry\.") as info:
            list(pipe)
        assert "[datapipes] raised in stage HashChecker at file 'a', item 0" in info.value.__notes__
        with pytest.raises(RuntimeError, match="Unspecified hash for file b"):
            list(IterableWrapper([("b", b"")]).check_hash({}))

    def test_over_files_and_resume_inside_one(self, tmp_path):
        lines = {f"f{i}.txt": b"".join(b"line %d\n" % j for j in range(4)) for i in range(3)}
        for name, data in lines.items():
            (tmp_path / name).write_bytes(data)
        hashes = {str(tmp_path / k): sha(v) for k, v in lines.items()}

        def build():
            return (IterableWrapper(sorted(hashes)).open_files(mode="b").check_hash(hashes)
                    .readlines(return_path=False))

        assert len(check_resume(build, ks=range(13))) == 12
        check_datapipe(IterableWrapper(sorted(hashes)).open_files(mode="b").check_hash(hashes)
                       .map(lambda p: p[1].read()), expected=[lines[k] for k in sorted(lines)])

    def test_len_contract_and_errors(self):
        pipe = IterableWrapper([("a", b"1")]).check_hash({"a": sha(b"1")})
        assert len(pipe) == 1
        check_datapipe(pipe, expected=[("a", b"1")], build=lambda src: src.map(lambda i: (str(i), b"")).check_hash(
            {str(i): sha(b"") for i in range(4)}))
        with pytest.raises(TypeError, match="HashChecker: hash_dict must be a dict"):
            IterableWrapper([]).check_hash(None)
        with pytest.raises(ValueError, match="Invalid hash_type requested"):
            IterableWrapper([]).check_hash({}, "crc")
        with pytest.raises(TypeError, match="rewind"):
            IterableWrapper([]).check_hash({}, rewind=None)
        with pytest.raises(TypeError, match="HashChecker: expects \\(path, stream\\) pairs"):
            list(IterableWrapper([1]).check_hash({}))

    def test_pickle(self):
        pipe = IterableWrapper([("a", b"1")]).map(lambda p: p).check_hash({"a": sha(b"1")})
        assert list(pickle.loads(pickle.dumps(pipe))) == [("a", b"1")]


# -- read_from_http / read_from_remote -------------------------------------------------------------


class _Handler(http.server.SimpleHTTPRequestHandler):
    state = None  # set per server

    def do_GET(self):  # noqa: N802 - http.server's naming
        st = self.state
        with st["lock"]:
            st["requests"].append(self.path)
            st["headers"].append(dict(self.headers))
            fail = st["fail"] > 0
            st["fail"] -= fail
        if fail:
            self.send_error(503)
            return
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import fsspec.asyn

    fsspec.asyn.get_loop()  # fsspec's I/O thread, a daemon for the process, started before thread checks
    root = tmp_path_factory.mktemp("www")
    state = {"lock": threading.Lock(), "requests": [], "headers": [], "fail": 0}
    handler = type("H", (_Handler,), {"state": state})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(root)))
    srv.daemon_threads = False
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{srv.server_address[1]}/"
    for i in range(3):
        (root / f"f{i}.txt").write_bytes(b"".join(b"file %d line %d\n" % (i, j) for j in range(3)))
    yield {"root": root, "url": base.__add__, "state": state}
    srv.shutdown()
    srv.server_close()
    thread.join(10)


class TestHttpReader:
    def test_reads_bodies(self, server):
        urls = [server["url"](f"f{i}.txt") for i in range(3)]
        pipe = IterableWrapper(urls).read_from_http(timeout=10)
        out = [(u, s.read()) for u, s in pipe]
        assert out == [(u, (server["root"] / f"f{i}.txt").read_bytes()) for i, u in enumerate(urls)]
        assert len(pipe) == 3
        check_datapipe(pipe.map(lambda p: p[1].read()), expected=[b for _, b in out])

    def test_online_reader_and_request_options(self, server):
        url = server["url"]("f0.txt")
        pipe = OnlineReader(IterableWrapper([url]), timeout=(5, 5), headers={"X-Test": "yes"}, auth=("u", "p"))
        assert [s.read()[:12] for _, s in pipe] == [b"file 0 line "]
        headers = server["state"]["headers"][-1]
        assert headers["X-Test"] == "yes" and headers["Authorization"].startswith("Basic ")

    def test_missing_url(self, server):
        url = server["url"]("missing.txt")
        with pytest.raises(FileNotFoundError) as info:
            list(IterableWrapper([url]).read_from_http(retries=0))
        assert any(url in note for note in info.value.__notes__)
        assert any("HttpReader" in note for note in info.value.__notes__)

    def test_skip_on_error_warns_and_counts(self, server):
        pipe = IterableWrapper([server["url"]("missing.txt"), server["url"]("f1.txt")]).read_from_http(skip_on_error=True)
        with pytest.warns(UserWarning, match="skipping"):
            out = [u for u, _ in pipe]
        assert out == [server["url"]("f1.txt")] and pipe.failures.count == 1
        with pytest.raises(TypeError, match="HttpReader.*: with on_error='skip' the number of files that open"):
            len(pipe)

    def test_transient_errors_are_retried(self, server):
        state = server["state"]
        with state["lock"]:
            state["fail"] = 2
        pipe = IterableWrapper([server["url"]("f2.txt")]).read_from_http(retries=2, backoff=0.001)
        assert [s.read() for _, s in pipe] == [(server["root"] / "f2.txt").read_bytes()]
        with state["lock"]:
            state["fail"] = 2
        pipe = IterableWrapper([server["url"]("f2.txt")]).read_from_http(retries=1, backoff=0.001)
        with pytest.raises(Exception) as info:
            list(pipe)
        assert any("failed after 2 attempts" in note for note in info.value.__notes__)
        with state["lock"]:
            state["fail"] = 0

    def test_resume_inside_a_body(self, server):
        urls = [server["url"](f"f{i}.txt") for i in range(3)]
        out = check_resume(lambda: IterableWrapper(urls).read_from_http().readlines(return_path=False), ks=range(10))
        assert out[0] == b"file 0 line 0"

    def test_cached_download(self, server, tmp_path):
        urls = [server["url"](f"f{i}.txt") for i in range(3)]

        def build():
            return (IterableWrapper(urls).on_disk_cache(filepath_fn=lambda u: str(tmp_path / os.path.basename(u)))
                    .read_from_http().end_caching(same_filepath_fn=True))

        before = len(server["state"]["requests"])
        assert [Path(p).read_bytes() for p in build()] == [(server["root"] / f"f{i}.txt").read_bytes() for i in range(3)]
        list(build())
        assert len(server["state"]["requests"]) == before + 3

    def test_argument_errors(self, server):
        with pytest.raises(ValueError, match="not an http\\(s\\) URL"):
            list(IterableWrapper(["ftp://x/y"]).read_from_http())
        with pytest.raises(TypeError, match="HttpReader: each URL must be a str"):
            list(IterableWrapper([3]).read_from_http())
        with pytest.raises(TypeError, match="timeout"):
            HttpReader(IterableWrapper([]), timeout="1")
        with pytest.raises(ValueError, match="timeout"):
            HttpReader(IterableWrapper([]), timeout=0)
        with pytest.raises(TypeError, match="skip_on_error"):
            OnlineReader(IterableWrapper([]), skip_on_error=1)
        with pytest.raises(ValueError, match="retries"):
            HttpReader(IterableWrapper([]), retries=-1)
        with pytest.raises(TypeError, match="OnlineReader"):
            OnlineReader(IterableWrapper([]), 5)  # timeout is keyword-only, as in torchdata

    def test_pickle(self, server):
        pipe = IterableWrapper([server["url"]("f0.txt")]).read_from_http(headers={"A": "b"}).map(lambda p: p[1].read())
        assert list(pickle.loads(pickle.dumps(pipe))) == [(server["root"] / "f0.txt").read_bytes()]


# -- load_from_bz2 / load_from_xz ------------------------------------------------------------------


@pytest.mark.parametrize("cls, name, compress", [(Bz2FileLoader, "load_from_bz2", bz2.compress),
                                                  (XzFileLoader, "load_from_xz", lzma.compress)])
class TestCompressedLoaders:
    def test_yields_decompressed_streams_with_the_suffix_dropped(self, cls, name, compress):
        ext = ".bz2" if cls is Bz2FileLoader else ".xz"
        src = IterableWrapper([("a.txt" + ext, io.BytesIO(compress(b"A"))), ("plain", io.BytesIO(compress(b"B")))])
        pipe = getattr(src, name)()
        assert [(p, s.read()) for p, s in pipe] == [("a.txt", b"A"), ("plain", b"B")]
        assert len(pipe) == 2 and len(cls(src, length=7)) == 7
        fresh = IterableWrapper([("a.txt" + ext, io.BytesIO(compress(b"A")))], deepcopy=True)
        check_datapipe(getattr(fresh, name)().map(lambda p: (p[0], p[1].read())), expected=[("a.txt", b"A")])

    def test_closing_closes_the_compressed_stream(self, cls, name, compress):
        raw = io.BytesIO(compress(b"A"))
        [(_, stream)] = list(getattr(IterableWrapper([("a", raw)], deepcopy=False), name)())
        stream.close()
        assert raw.closed

    def test_corrupt_data_names_the_file(self, cls, name, compress):
        pipe = getattr(IterableWrapper([("bad.z", io.BytesIO(b"not compressed at all"))]), name)()
        [(_, stream)] = list(pipe)
        with pytest.raises(Exception) as info:
            stream.read()
        assert f"[datapipes] raised in stage {cls.__name__} at file 'bad.z', item 0" in info.value.__notes__

    def test_resume_inside_in_memory_files(self, cls, name, compress):
        def build():
            files = [(f"f{i}", io.BytesIO(compress(b"x\ny\nz\n"))) for i in range(2)]
            return getattr(IterableWrapper(files), name)().readlines(return_path=False)

        assert check_resume(build, ks=range(7)) == [b"x", b"y", b"z"] * 2

    def test_argument_errors(self, cls, name, compress):
        with pytest.raises(TypeError, match=f"{cls.__name__}: datapipe must be an IterDataPipe"):
            cls([1])
        with pytest.raises(ValueError, match="length must be >= -1"):
            cls(IterableWrapper([]), length=-2)
        with pytest.raises(TypeError, match="expects \\(path, stream\\) pairs"):
            list(getattr(IterableWrapper([1]), name)())


# -- extract ---------------------------------------------------------------------------------------


def mixed_files():
    return [
        ("a.tar", io.BytesIO(make_tar([("1.txt", b"one"), ("2.txt", b"two")]))),
        ("b.txt.gz", io.BytesIO(gzip.compress(b"bee"))),
        ("c.zip", io.BytesIO(make_zip([("3.txt", b"three")]))),
        ("d.tar.gz", io.BytesIO(gzip.compress(make_tar([("4.txt", b"four")])))),
        ("e.bz2", io.BytesIO(bz2.compress(b"eee"))),
        ("f.xz", io.BytesIO(lzma.compress(b"eff"))),
    ]


class TestExtractor:
    EXPECTED = [("a.tar/1.txt", b"one"), ("a.tar/2.txt", b"two"), ("b.txt.gz", b"bee"), ("c.zip/3.txt", b"three"),
                ("d.tar.gz/4.txt", b"four"), ("e.bz2", b"eee"), ("f.xz", b"eff")]

    def test_each_kind_by_suffix(self):
        pipe = IterableWrapper(mixed_files()).extract()
        assert [(p, s.read()) for p, s in pipe] == self.EXPECTED
        with pytest.raises(TypeError, match="Extractor.*has no len"):
            len(pipe)

    def test_contract_and_resume(self):
        check_datapipe(IterableWrapper(mixed_files(), deepcopy=True).extract().map(lambda p: (p[0], p[1].read())),
                       expected=self.EXPECTED)
        out = check_resume(lambda: IterableWrapper(mixed_files()).extract(), ks=range(8),
                           convert=lambda p: (p[0], p[1].read()))
        assert out == self.EXPECTED

    def test_file_type(self):
        pipe = IterableWrapper([("noext", io.BytesIO(make_tar([("m", b"M")])))]).extract(file_type="tar")
        assert [(p, s.read()) for p, s in pipe] == [("noext/m", b"M")]
        pipe = Extractor(IterableWrapper([("x", io.BytesIO(gzip.compress(b"g")))]), "GZIP")
        assert [(p, s.read()) for p, s in pipe] == [("x", b"g")] and len(pipe) == 1

    def test_unknown_suffix(self):
        with pytest.raises(RuntimeError, match="has file extension .rar, which does not match what are supported by") as info:
            list(IterableWrapper([("x.rar", io.BytesIO(b""))]).extract())
        assert "[datapipes] raised in stage Extractor at file 'x.rar', item 0" in info.value.__notes__

    def test_corrupt_archive_names_it(self):
        with pytest.raises(tarfile.ReadError) as info:
            list(IterableWrapper([("x.tar", io.BytesIO(b"\x01" * 1024))]).extract())
        assert any("Extractor" in note and "x.tar" in note for note in info.value.__notes__)

    def test_resume_inside_a_decompressed_file(self, tmp_path):
        for i in range(2):
            (tmp_path / f"f{i}.gz").write_bytes(gzip.compress(b"a\nb\nc\n"))
        paths = [str(tmp_path / f"f{i}.gz") for i in range(2)]
        assert check_resume(lambda: IterableWrapper(paths).open_files(mode="b").extract(file_type="gzip")
                            .readlines(return_path=False), ks=range(7)) == [b"a", b"b", b"c"] * 2

    def test_argument_errors(self):
        with pytest.raises(ValueError, match="Extractor: file_type must be one of"):
            IterableWrapper([]).extract(file_type="rar")
        with pytest.raises(TypeError, match="Extractor: file_type must be a str"):
            IterableWrapper([]).extract(file_type=3)
        with pytest.raises(TypeError, match="Extractor: source_datapipe"):
            Extractor(None)


# -- load_from_tfrecord ----------------------------------------------------------------------------


def int64_feature(values, packed=True):
    if packed:
        body = ld(1, b"".join(varint(v) for v in values))
    else:
        body = b"".join(varint(1 << 3 | 0) + varint(v) for v in values)
    return ld(3, body)


def float_feature(values, packed=True):
    if packed:
        body = ld(1, struct.pack(f"<{len(values)}f", *values))
    else:
        body = b"".join(varint(1 << 3 | 5) + struct.pack("<f", v) for v in values)
    return ld(2, body)


def bytes_feature(values):
    return ld(1, b"".join(ld(1, v) for v in values))


def features(mapping):
    return b"".join(ld(1, ld(1, k.encode()) + ld(2, v)) for k, v in mapping.items())


def example(mapping):
    return ld(1, features(mapping))


def sequence_example(context, lists):
    body = b"".join(ld(1, ld(1, k.encode()) + ld(2, b"".join(ld(1, f) for f in fs))) for k, fs in lists.items())
    return ld(1, features(context)) + ld(2, body)


def same(a, b):
    from datapipes.testing import items_equal

    return items_equal(a, b)


class TestTFRecordLoader:
    RECORDS = [
        example({"id": int64_feature([1, -2]), "x": float_feature([0.5, 1.5]), "name": bytes_feature([b"a", b"b"])}),
        example({"id": int64_feature([3, 4], packed=False), "x": float_feature([2.0, 3.0], packed=False),
                 "name": bytes_feature([b"c", b"d"])}),
    ]

    def test_crc32c(self):
        assert tfrecord_io._crc32c_python(b"123456789") == 0xE3069283 == crc32c(b"123456789")

    def test_examples(self):
        pipe = IterableWrapper([("a.tfrecord", io.BytesIO(tfrecord(*self.RECORDS)))]).load_from_tfrecord()
        out = list(pipe)
        assert same(out, [
            {"id": torch.tensor([1, -2]), "x": torch.tensor([0.5, 1.5]), "name": [b"a", b"b"]},
            {"id": torch.tensor([3, 4]), "x": torch.tensor([2.0, 3.0]), "name": [b"c", b"d"]},
        ])
        assert out[0]["id"].dtype == torch.int64 and out[0]["x"].dtype == torch.float32

    def test_spec(self):
        spec = {"id": ((2, 1), torch.float64), "name": ((1, -1), None)}
        data = tfrecord(self.RECORDS[0])
        [ex] = list(IterableWrapper([("a", io.BytesIO(data))]).load_from_tfrecord(spec))
        assert set(ex) == {"id", "name"}
        assert ex["id"].dtype == torch.float64 and ex["id"].shape == (2, 1)
        assert ex["name"] == [[b"a", b"b"]]
        with pytest.raises(RuntimeError, match="Example is missing some required keys") as info:
            list(IterableWrapper([("a", io.BytesIO(data))]).load_from_tfrecord({"nope": (None, None)}))
        assert "[datapipes] raised in stage TFRecordLoader at file 'a', record 0" in info.value.__notes__
        with pytest.raises(RuntimeError, match="Cannot reshape 2 values into shape"):
            list(IterableWrapper([("a", io.BytesIO(data))]).load_from_tfrecord({"name": ((3,), None)}))

    def test_sequence_example(self):
        record = sequence_example({"len": int64_feature([2])},
                                  {"frames": [float_feature([1.0, 2.0]), float_feature([3.0, 4.0])],
                                   "words": [bytes_feature([b"hi"]), bytes_feature([b"yo"])]})
        [ex] = list(IterableWrapper([("s", io.BytesIO(tfrecord(record)))]).load_from_tfrecord())
        assert same(ex["len"], torch.tensor([2]))
        assert same(ex["frames"], [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])])
        assert ex["words"] == [[b"hi"], [b"yo"]]
        spec = {"len": (None, torch.int64), "frames": ((2, 2), torch.float32), "words": ((-1,), None)}
        [ex] = list(IterableWrapper([("s", io.BytesIO(tfrecord(record)))]).load_from_tfrecord(spec))
        assert same(ex["frames"], torch.tensor([[1.0, 2.0], [3.0, 4.0]])) and ex["words"] == [b"hi", b"yo"]

    def test_crc_check(self):
        data = bytearray(tfrecord(*self.RECORDS))
        data[20] ^= 0xFF  # a byte of the first record's data
        pipe = IterableWrapper([("bad.tfrecord", io.BytesIO(bytes(data)))])
        with pytest.raises(RuntimeError, match="CRC of the record data does not match") as info:
            list(pipe.load_from_tfrecord())
        assert "[datapipes] raised in stage TFRecordLoader at file 'bad.tfrecord', record 0" in info.value.__notes__
        data = bytearray(tfrecord(*self.RECORDS))
        data[8] ^= 0xFF  # the length's CRC
        with pytest.raises(RuntimeError, match="CRC of the record size"):
            list(IterableWrapper([("f", io.BytesIO(bytes(data)))]).load_from_tfrecord())
        assert len(list(IterableWrapper([("f", io.BytesIO(bytes(data)))]).load_from_tfrecord(length_check=False))) == 2

    def test_truncated(self):
        data = tfrecord(*self.RECORDS)
        for cut, phrase in ((5, "failed to read the record size"), (20, "failed to read the record"),
                            (len(data) - 2, "failed to read the end token")):
            with pytest.raises(RuntimeError, match=phrase):
                list(IterableWrapper([("t", io.BytesIO(data[:cut]))]).load_from_tfrecord())

    def test_len_contract_resume(self, tmp_path):
        files = {f"f{i}.tfrecord": tfrecord(*[example({"i": int64_feature([i * 10 + j])}) for j in range(3)])
                 for i in range(2)}
        for name, data in files.items():
            (tmp_path / name).write_bytes(data)
        paths = [str(tmp_path / n) for n in files]
        pipe = IterableWrapper(paths).open_files(mode="b").load_from_tfrecord()
        with pytest.raises(TypeError, match=r"TFRecordLoader: the number of records is known only after reading \(pass "):
            len(pipe)
        assert len(pipe.datapipe.load_from_tfrecord(length=6)) == 6
        expected = [{"i": torch.tensor([v])} for v in (0, 1, 2, 10, 11, 12)]
        check_datapipe(pipe, expected=expected)
        check_resume(lambda: IterableWrapper(paths).open_files(mode="b").load_from_tfrecord(), ks=range(7))
        check_resume(lambda: IterableWrapper([(n, io.BytesIO(d)) for n, d in files.items()]).load_from_tfrecord(),
                     ks=range(7), through="torch")

    def test_argument_errors(self):
        with pytest.raises(TypeError, match="TFRecordLoader: datapipe"):
            TFRecordLoader([])
        with pytest.raises(TypeError, match="spec must be a dict"):
            IterableWrapper([]).load_from_tfrecord([("a", None)])
        with pytest.raises(TypeError, match="spec must map names"):
            IterableWrapper([]).load_from_tfrecord({"a": torch.int64})
        with pytest.raises(TypeError, match="length_check"):
            IterableWrapper([]).load_from_tfrecord(length_check="yes")
        with pytest.raises(TypeError, match="expects \\(path, stream\\) pairs"):
            list(IterableWrapper([b"x"]).load_from_tfrecord())

    def test_pickle(self):
        data = tfrecord(self.RECORDS[0])
        pipe = IterableWrapper([("a", data)]).map(lambda p: (p[0], io.BytesIO(p[1]))).load_from_tfrecord(
            {"id": (None, torch.int64)})
        assert same(list(pickle.loads(pickle.dumps(pipe))), [{"id": torch.tensor([1, -2])}])
