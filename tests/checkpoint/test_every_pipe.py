"""Every IterDataPipe class of ``datapipes.iter`` resumes exactly (the checkpoint law).

One table entry per class exported by ``datapipes.iter.__all__`` (the key is the class name; a
second, concurrent variant of a stage is keyed ``"Class[variant]"``), each a builder of a small pipe
ending in that stage, run through :func:`datapipes.testing.check_resume` at every ``k`` with the
state sent through ``torch.save``. Streams in the items are read as they are taken (``norm``).
Classes that cannot be run here are listed in ``EXCLUDED`` with the reason; the coverage test keeps
the table and that list together equal to the exported classes. A stage that refuses to save its
position (a ``TypeError`` naming it, which the law allows) is checked to refuse (``refuses=``).

The files read live in one module-scoped folder (text, CSV, JSON, compressed files, archives,
images, Parquet, TFRecord), copied to fsspec's ``memory://`` file system, served over HTTP by a
local ``http.server`` thread, and put in an in-memory file system registered as fsspec's ``s3``
protocol (as tests/compat/test_s3.py fakes S3).
"""

from __future__ import annotations

import asyncio
import bz2
import gzip
import hashlib
import http.server
import importlib
import io
import itertools
import lzma
import operator
import os
import pickle
import re
import shutil
import threading
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

import fsspec
import numpy as np
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem
from torch.utils.data import RandomSampler

import datapipes.iter as di
from datapipes import graph_settings
from datapipes.iter import IterableWrapper as W
from datapipes.iter import IterDataPipe
from datapipes.map import SequenceWrapper
from datapipes._engine import close_iterator
from datapipes.testing import check_resume, same_multiset

from helpers import ld, make_tar, make_zip, png, tfrecord, varint
from helpers import plain_process  # noqa: F401 - an autouse fixture: no RANK/WORLD_SIZE from the environment

HAS_CUDA = torch.cuda.is_available()


# -- items as comparable data ----------------------------------------------------------------------


def norm(x: Any) -> Any:
    """An item as comparable data: streams read (before the pass that opened them is closed),
    tensors and arrays as lists, pyarrow tables as dicts of columns."""
    if isinstance(x, (tuple, list)):
        return type(x)(norm(v) for v in x) if type(x) in (tuple, list) else [norm(v) for v in x]
    if isinstance(x, dict):
        return {k: norm(v) for k, v in x.items()}
    if hasattr(x, "read"):
        return ("stream", x.read())
    if hasattr(x, "to_pydict"):
        return ("table", x.to_pydict())
    if hasattr(x, "tolist"):
        return ("array", tuple(x.shape), x.tolist())
    return x


# -- the files -------------------------------------------------------------------------------------


def parquet(table_rows, row_group_size):
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table(table_rows), buf, row_group_size=row_group_size)
    return buf.getvalue()


# TFRecord: records of tf.train.Example, written by hand (protobuf fields: tests/helpers.py).


def _int64_example(name, values):
    feature = ld(3, ld(1, b"".join(varint(v) for v in values)))
    return ld(1, ld(1, ld(1, name.encode()) + ld(2, feature)))


def tree_files():
    return {
        "text/a.txt": b"one\ntwo\nthree\n\nfour\nfive\n",
        "text/b.txt": b"",
        "text/c.txt": b"x\ny\n\nz",
        "text/sub/d.txt": b"d1\nd2\n",
        "csv/a.csv": b"key,n\na,1\nb,2\nc,3\nd,4\n",
        "csv/b.csv": b'key,n\n"multi\nline",5\n"q,uoted",6\ne,7\n',
        "json/a.json": b'{"a": [1, 2]}',
        "json/b.json": b"[1, 2, 3]",
        "json/c.json": b'"text"',
        "gz/a.txt.gz": gzip.compress(b"g1\ng2\ng3\n"),
        "gz/b.txt.bz2": bz2.compress(b"b1\nb2\n"),
        "gz/c.txt.xz": lzma.compress(b"x1\n"),
        "bz2/a.txt.bz2": bz2.compress(b"bz a\n"),
        "bz2/b.txt.bz2": bz2.compress(b"bz b\nbz b2\n"),
        "bz2/c.txt.bz2": bz2.compress(b""),
        "xz/a.txt.xz": lzma.compress(b"xz a\n"),
        "xz/b.txt.xz": lzma.compress(b"xz b\nxz b2\n"),
        "tar/a.tar": make_tar([(f"s/{i}.{ext}", f"{i}{ext}".encode()) for i in range(4) for ext in ("jpg", "cls")]),
        "tar/b.tar.gz": make_tar([("t/0.txt", b"l1\nl2\n"), ("t/1.txt", b"m1\n"), ("t/1.cls", b"c")], "w:gz"),
        "zip/a.zip": make_zip([(f"z/{i}.txt", f"zip {i}\nline 2\n".encode()) for i in range(3)]),
        "zip/b.zip": make_zip([("y/0.txt", b"only\n")]),
        "img/a.png": png("red"),
        "img/b.png": png("green", (2, 5)),
        "img/c.png": png("blue"),
        "parquet/a.parquet": parquet({"x": list(range(7)), "s": [f"r{i}" for i in range(7)]}, 3),
        "parquet/b.parquet": parquet({"x": list(range(100, 105)), "s": [f"q{i}" for i in range(5)]}, 2),
        "tfrecord/a.tfrecord": tfrecord(*[_int64_example("i", [j, j * 200]) for j in range(4)]),
        "tfrecord/b.tfrecord": tfrecord(*[_int64_example("i", [10 + j]) for j in range(3)]),
        "www/f0.txt": b"file 0 line 0\nfile 0 line 1\n",
        "www/f1.txt": b"file 1 line 0\n",
        "www/f2.txt": b"file 2 line 0\nfile 2 line 1\nfile 2 line 2\n",
        "s3/data/a.csv": b"a1\na2\na3\n",
        "s3/data/b.txt": b"b1\n",
        "s3/data/sub/c.csv": b"c1\nc2\n",
    }


# -- a local HTTP server (as tests/compat/test_storage.py runs one) --------------------------------


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _serve(root):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    srv.daemon_threads = False  # server_close() joins every request thread
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    return srv, thread, f"http://127.0.0.1:{srv.server_address[1]}/"


# -- S3: an in-memory file system registered as fsspec's ``s3`` protocol (as tests/compat/test_s3.py)


REGISTRY = importlib.import_module("fsspec.registry")._registry


class FakeS3(MemoryFileSystem):
    protocol = ("s3", "s3a")
    store: dict = {}
    pseudo_dirs = [""]

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, str):
            path = path.removeprefix("s3://")
        return super()._strip_protocol(path)


# -- the environment the builders read ---------------------------------------------------------------


@dataclass
class Env:
    root: Path  # the files of tree_files()
    mem: str  # their memory:// copy
    http: str  # the base URL serving root/www
    out: Path  # a folder to write to
    memout: str  # a memory:// folder to write to
    sha: dict = field(default_factory=dict)  # path -> sha256 of the files

    def dir(self, folder):
        return str(self.root / folder)

    def paths(self, folder, pattern="*"):
        return sorted(str(p) for p in (self.root / folder).glob(pattern) if p.is_file())

    def opened(self, folder, pattern="*"):
        """``(path, binary stream)`` pairs of the files of ``folder``, opened by ``open_files``."""
        return W(self.paths(folder, pattern)).open_files(mode="b")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    import fsspec.asyn

    fsspec.asyn.get_loop()  # fsspec's I/O thread, a daemon for the process
    root = tmp_path_factory.mktemp("every")
    mem_base = f"/every-pipe-{os.getpid()}"
    memfs = fsspec.filesystem("memory")
    before = REGISTRY.get("s3")
    fsspec.register_implementation("s3", FakeS3, clobber=True)
    s3 = FakeS3()
    sha = {}
    for name, data in tree_files().items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        sha[str(path)] = hashlib.sha256(data).hexdigest()
        memfs.pipe(f"{mem_base}/{name}", data)
        if name.startswith("s3/"):
            s3.pipe("s3://bucket/" + name.removeprefix("s3/"), data)
    srv, thread, base = _serve(root / "www")
    out = root / "out"
    out.mkdir()
    try:
        yield Env(root, "memory:/" + mem_base, base, out, "memory:/" + mem_base + "-out", sha)
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(10)
        for folder in (mem_base, mem_base + "-out"):
            if memfs.exists(folder):
                memfs.rm(folder, recursive=True)
        FakeS3.store.clear()
        if before is None:
            REGISTRY.pop("s3", None)
        else:
            fsspec.register_implementation("s3", before, clobber=True)


# -- functions the builders use (module level: they pickle, for the process executor too) ---------


def double(x):
    return 2 * x


async def adouble(x):
    await asyncio.sleep(0.001 * (x % 3))
    return 2 * x


def slow_double(x):
    import time

    time.sleep(0.002 * (x % 3))
    return 2 * x


def augment(x, rng):
    return x, rng.random()


def char_codes(texts):
    """A pure-Python tokenizer for ``tokenize``: each character's code point."""
    return [[ord(c) for c in t] for t in texts]


def docs_of(n):
    """``n`` int32 token documents of 0 to 9 tokens, for ``pack_tokens``."""
    return [np.arange(100 * i, 100 * i + (i * 7) % 10, dtype=np.int32) for i in range(n)]


def repeat_x(x):
    return [x] * (x % 3)


def fetch(name):
    return name, f"data of {os.path.basename(name)}".encode()


def cache_pipe(folder: Path, names, *, precached=(), **end_kwargs):
    """An on-disk cache in ``folder``, emptied when the pipe is built; ``precached`` names are put
    there first (so the pass takes both ways: cached and fetched)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name in precached:
        (folder / name).write_bytes(b"cached " + name.encode())
    path_of = partial(os.path.join, str(folder))
    return W(names).on_disk_cache(filepath_fn=path_of).map(fetch).end_caching(mode="wb", filepath_fn=path_of, **end_kwargs)


def sharded(pipe, n, i):
    return graph_settings.apply_sharding(pipe, n, i)


# -- the table -------------------------------------------------------------------------------------


@dataclass
class Case:
    build: Callable[[Env], IterDataPipe]
    ordered: bool = True  # False: a stage yielding in completion order (same multiset, nothing repeated)
    marks: tuple = ()
    # the stage (as its repr names it) whose state_dict() raises TypeError "<stage> cannot save its position":
    # allowed by the law, and checked as such, so that a stage that learns to resume is moved to the table proper
    refuses: str | None = None


def needs_cuda():
    return (pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA"))


TABLE: dict[str, Case] = {
    # sources, listers, openers
    "IterableWrapper": Case(lambda e: W(list(range(12)))),
    "MapToIterConverter": Case(lambda e: SequenceWrapper([f"v{i}" for i in range(10)]).to_iter_datapipe()),
    "MapToIterConverter[indices]": Case(
        lambda e: SequenceWrapper([f"v{i}" for i in range(10)]).to_iter_datapipe(indices=[3, 1, 4, 1, 5, 9, 2, 6])),
    "MapToIterConverter[own order]": Case(
        lambda e: W([(k, f"v{k}") for k in (5, 2, 8, 1, 9, 0, 7)]).to_map_datapipe().to_iter_datapipe()),
    "FileLister": Case(lambda e: W([e.dir("text"), e.dir("csv")]).list_files(recursive=True)),
    "FileOpener": Case(lambda e: W(e.paths("text", "*.txt")).open_files(mode="b")),
    "FSSpecFileLister": Case(lambda e: W([f"{e.mem}/text", f"{e.mem}/json"]).list_files_by_fsspec(recursive=True)),
    "FSSpecFileOpener": Case(lambda e: W([f"{e.mem}/text/a.txt", f"{e.mem}/csv/a.csv", f"{e.mem}/text/c.txt"])
                             .open_files_by_fsspec(mode="rb")),
    "HttpReader": Case(lambda e: W([e.http + f"f{i}.txt" for i in range(3)]).read_from_http(timeout=10)),
    "OnlineReader": Case(lambda e: W([e.http + f"f{i}.txt" for i in (2, 0, 1)]).read_from_remote(timeout=10)),
    "S3FileLister": Case(lambda e: W(["s3://bucket/data"]).list_files_by_s3()),
    "S3FileLoader": Case(lambda e: W(["s3://bucket/data/a.csv", "s3://bucket/data/sub/c.csv", "s3://bucket/data/b.txt"])
                         .load_files_by_s3()),
    "ShardExpander": Case(lambda e: W(["d-{0..3}.tar", "plain", "x{00..02}-{1..2}"]).shard_expand()),
    # savers and caches
    "Saver": Case(lambda e: W([(f"f{i}.txt", f"data {i}") for i in range(8)])
                  .save_to_disk(filepath_fn=lambda n: str(e.out / "saver" / n))),
    "FSSpecSaver": Case(lambda e: W([(f"f{i}.txt", f"data {i}") for i in range(8)])
                        .save_by_fsspec(filepath_fn=lambda n: f"{e.memout}/{n}")),
    "OnDiskCacheHolder": Case(lambda e: cache_pipe(e.out / "cache1", [f"n{i}" for i in range(8)], precached=("n2", "n5"))),
    "EndOnDiskCacheHolder": Case(lambda e: cache_pipe(e.out / "cache2", [f"n{i}" for i in range(8)], skip_read=True)),
    "HashChecker": Case(lambda e: e.opened("json").check_hash(e.sha)),
    # readers of files
    "CSVParser": Case(lambda e: e.opened("csv").parse_csv()),
    "CSVDictParser": Case(lambda e: e.opened("csv").parse_csv_as_dict()),
    "CSVFilesParser": Case(lambda e: e.opened("csv").parse_csv_files()),
    "JsonParser": Case(lambda e: e.opened("json").parse_json_files()),
    "LineReader": Case(lambda e: e.opened("text", "**/*.txt").readlines()),
    "ParagraphAggregator": Case(lambda e: e.opened("text").readlines(decode=True).lines_to_paragraphs()),
    "StreamReader": Case(lambda e: e.opened("text").read_from_stream(chunk=4)),
    "RoutedDecoder": Case(lambda e: e.opened("json").routed_decode()),
    "ImageDecoder": Case(lambda e: e.opened("img").decode_image(size=(2, 2))),
    "ParquetParser": Case(lambda e: W(e.paths("parquet")).parse_parquet(batch_size=2)),
    "ParquetDataFrameLoader": Case(lambda e: e.opened("parquet").load_parquet_as_df()),
    "TFRecordLoader": Case(lambda e: e.opened("tfrecord").load_from_tfrecord()),
    # archives and compressed files
    "Decompressor": Case(lambda e: e.opened("gz").decompress()),
    "Bz2FileLoader": Case(lambda e: e.opened("bz2").load_from_bz2()),
    "XzFileLoader": Case(lambda e: e.opened("xz").load_from_xz()),
    "Extractor": Case(lambda e: W(e.paths("gz") + e.paths("tar") + e.paths("zip")).open_files(mode="b").extract()),
    "TarArchiveLoader": Case(lambda e: e.opened("tar").load_from_tar()),
    "ZipArchiveLoader": Case(lambda e: e.opened("zip").load_from_zip()),
    "WebDatasetGrouper": Case(lambda e: e.opened("tar").load_from_tar().webdataset()),
    "WebDataset": Case(lambda e: di.WebDataset(e.opened("tar", "a.tar").load_from_tar())),
    # one item in, one item out
    "Mapper": Case(lambda e: W(range(15)).map(double)),
    "Mapper[threads]": Case(lambda e: W(range(20)).map(slow_double, concurrency=3)),
    "Mapper[async]": Case(lambda e: W(range(20)).map(adouble, concurrency=4)),
    "Mapper[unordered]": Case(lambda e: W(range(20)).map(slow_double, concurrency=3, ordered=False), ordered=False),
    # operator.neg: a worker process unpickles it without importing this module (and torch with it)
    "Mapper[process]": Case(lambda e: W(range(10)).map(operator.neg, concurrency=2, executor="process")),
    "Mapper[rng]": Case(lambda e: W(range(15)).map(augment, concurrency=3, rng="python").set_seed(3)),
    "ThreadPoolMapper": Case(lambda e: W(range(20)).threadpool_map(slow_double, max_workers=3)),
    "BatchAsyncMapper": Case(lambda e: W(range(20)).async_map_batches(adouble, batch_size=4, max_concurrency=3)),
    "Filter": Case(lambda e: W(range(20)).filter(lambda x: x % 3 != 1)),
    "Collator": Case(lambda e: W([{"a": i, "b": float(i)} for i in range(10)]).batch(3).collate()),
    "Enumerator": Case(lambda e: W("abcdefghij").enumerate(starting_index=3)),
    "IndexAdder": Case(lambda e: W([{"v": i} for i in range(8)]).add_index("i")),
    "Slicer": Case(lambda e: W([(i, i + 1, i + 2, i + 3) for i in range(8)]).slice(1, 3)),
    "Dropper": Case(lambda e: W([(i, -i, str(i)) for i in range(8)]).drop([0, 2])),
    "Flattener": Case(lambda e: W([(i, (i, i + 1), [i + 2]) for i in range(8)]).flatten()),
    "Rows2Columnar": Case(lambda e: W([{"a": i, "b": -i} for i in range(11)]).batch(3).rows2columnar()),
    "LengthSetter": Case(lambda e: W(range(10)).filter(lambda x: x % 2 == 0).set_length(5)),
    "MapKeyZipper": Case(lambda e: W(range(12)).zip_with_map(SequenceWrapper([f"m{i}" for i in range(5)]),
                                                              key_fn=lambda x: x % 5)),
    # on the CPU one item out per item in: nothing to save
    "DeviceMover": Case(lambda e: W([{"x": [i, i + 1]} for i in range(9)]).batch(2).collate().to_device("cpu")),
    # copies one item ahead on a stream of its own, which a state does not save: refuses, saying why
    "CudaMover": Case(lambda e: W([[i, i + 1] for i in range(9)]).batch(2).to_cuda(), marks=needs_cuda(),
                      refuses="CudaMover(None)"),
    # saves its pinned items not yet taken, as prefetch does; without CUDA the items pass through
    # unpinned (a RuntimeWarning says so) and it saves nothing
    "PinMemory": Case(lambda e: W([torch.tensor([i, i + 1]) for i in range(9)]).pin_memory(buffer_size=2),
                      marks=(pytest.mark.filterwarnings("ignore:PinMemory.*pinning is skipped"),)),
    "Prefetcher": Case(lambda e: W(range(20)).map(slow_double).prefetch(3)),
    # in one process (no process group); two gloo ranks resuming: tests/compat/test_distributed_pipes.py
    # (TestFullSyncTwoGlooRanks)
    "FullSync": Case(lambda e: W(range(12)).map(double).fullsync(timeout=10, buffer_size=3)),
    "ShardingFilter": Case(lambda e: sharded(W(range(20)).sharding_filter().map(double), 3, 1)),
    "ShardingRoundRobinDispatcher": Case(lambda e: sharded(W(range(20)).sharding_round_robin_dispatch().map(double), 3, 2)),
    "Header": Case(lambda e: W(range(30)).header(9)),
    "Header[concurrent map]": Case(lambda e: W(range(30)).map(slow_double, concurrency=3).header(9)),
    # one to many, many to one
    "FlatMapper": Case(lambda e: W(range(15)).flatmap(repeat_x)),
    "FlatMapper[concurrency]": Case(lambda e: W(range(15)).flatmap(repeat_x, concurrency=2)),
    "FlatMapper[unordered]": Case(lambda e: W(range(15)).flatmap(repeat_x, concurrency=2, ordered=False), ordered=False),
    "ShuffledFlatMapper": Case(lambda e: W(range(12)).shuffled_flatmap(repeat_x, buffer_size=3).set_seed(2)),
    "Batcher": Case(lambda e: W(range(23)).batch(4)),
    "BatchMapper": Case(lambda e: W(range(13)).map_batches(lambda b: [sum(b), len(b)], batch_size=4)),
    "MapBatches": Case(lambda e: di.MapBatches(W(range(13)), lambda b: [b[-1]] * len(b), 3)),
    "Unbatcher": Case(lambda e: W(range(17)).batch(4).unbatch()),
    "TokenizerStage": Case(lambda e: W([str(i) * (i % 4) for i in range(15)]).tokenize(char_codes, batch_size=4)),
    "TokenizerStage[concurrency]": Case(
        lambda e: W([{"text": str(i) * (i % 4), "i": i} for i in range(15)]).tokenize(
            char_codes, field="text", eos_id=0, batch_size=4, concurrency=2)),
    "TokenPacker": Case(lambda e: W(docs_of(20)).pack_tokens(8)),
    "TokenPacker[first_fit]": Case(lambda e: W(docs_of(20)).pack_tokens(8, strategy="first_fit", num_bins=3)),
    "TokenPacker[best_fit]": Case(lambda e: W([{"tokens": d, "loss_mask": d % 2} for d in docs_of(20)])
                                  .pack_tokens(8, strategy="best_fit", num_bins=3)),
    "UnBatcher": Case(lambda e: di.UnBatcher(W(range(16)).batch(3).batch(2), unbatch_level=2)),
    "BucketBatcher": Case(lambda e: W(range(30)).bucketbatch(3, batch_num=2, bucket_num=2, key=lambda x: -x).set_seed(1)),
    "MaxTokenBucketizer": Case(lambda e: W(["a" * (i % 5 + 1) for i in range(20)]).max_token_bucketize(8, buffer_size=4)),
    "Grouper": Case(lambda e: W(range(25)).groupby(lambda x: x % 3, group_size=3, buffer_size=7)),
    "InBatchShuffler": Case(lambda e: W(range(20)).batch(4).in_batch_shuffle().set_seed(3)),
    "Shuffler": Case(lambda e: W(range(25)).shuffle(buffer_size=6).set_seed(4)),
    "Shuffler[buffered]": Case(lambda e: W(range(25)).map(double).shuffle(buffer_size=6).set_seed(4)),
    "Shuffler[map]": Case(lambda e: SequenceWrapper(range(25)).shuffle().set_seed(4)),
    "Sampler": Case(lambda e: di.Sampler(W(range(12)), RandomSampler).set_seed(5)),
    "InMemoryCacheHolder": Case(lambda e: W(range(12)).map(double).in_memory_cache()),
    "Cycler": Case(lambda e: W(range(5)).cycle(3)),
    "Cycler[endless]": Case(lambda e: W(range(4)).cycle().header(14)),
    "Repeater": Case(lambda e: W(range(6)).repeat(3)),
    # joining and splitting
    "Concater": Case(lambda e: W(range(4)).concat(W([]), W(range(10, 15)))),
    "Zipper": Case(lambda e: W(range(8)).zip(W("abcdefghij"))),
    "Zipper[one input twice]": Case(
        # one pipe read by two iterators at once: one position cannot stand for both, so the pass refuses
        # (reading a pipe twice goes through fork(), whose children each keep their place: "Forker" below)
        lambda e: (lambda a: a.zip(a.map(double)))(W(range(10))), refuses="IterableWrapper"),
    "ZipperLongest": Case(lambda e: W(range(5)).zip_longest(W("abcdefgh"), fill_value=-1)),
    "Multiplexer": Case(lambda e: W(range(5)).mux(W(range(10, 17)), W(range(20, 26)))),
    "MultiplexerLongest": Case(lambda e: W(range(5)).mux_longest(W("ab"), W(range(10, 17)))),
    "Mixer": Case(lambda e: di.Mixer({"a": W(range(7)), "b": W(range(10, 15)), "c": W(range(20, 30))},
                                     {"a": 1, "b": 2, "c": 0.5})),
    "Mixer[random]": Case(lambda e: di.Mixer({"a": W(range(7)), "b": W(range(10, 15))}, {"a": 1, "b": 2},
                                             exact=False, seed=7, stop="first_exhausted")),
    "Mixer[tokens]": Case(lambda e: di.Mixer({"a": W([[0] * (i % 5) for i in range(9)]), "b": W([[1] * 3] * 6)},
                                             {"a": 1, "b": 1}, by="tokens", with_source=True)),
    "SampleMultiplexer": Case(lambda e: di.SampleMultiplexer({W(range(6)): 1.0, W(range(10, 20)): 2.0}, seed=7)),
    "IterKeyZipper": Case(lambda e: W(range(10)).zip_with_iter(W([(k, f"r{k}") for k in (3, 1, 0, 2, 5, 4, 7, 6, 9, 8)]),
                                                               key_fn=lambda x: x, ref_key_fn=lambda r: r[0])),
    "Forker": Case(lambda e: (lambda a, b: a.zip(b.map(double)))(*W(range(10)).fork(2))),
    "Demultiplexer": Case(lambda e: (lambda a, b, c: a.mux(b, c))(*W(range(17)).demux(3, lambda x: x % 3))),
    "RoundRobinDemultiplexer": Case(lambda e: (lambda a, b: b.concat(a))(*W(range(11)).round_robin_demux(2))),
    "UnZipper": Case(lambda e: (lambda a, b: a.zip(b))(*W([(i, -i) for i in range(9)]).unzip(2))),
    "RandomSplitter": Case(lambda e: (lambda a, b: a.mux(b))(
        # children read together each read the shared source through an iterator of their own: refused as above
        *W(range(20)).random_split({"train": 0.5, "valid": 0.5}, seed=11)), refuses="IterableWrapper"),
    "RandomSplitter[concat]": Case(lambda e: (lambda a, b: a.concat(b))(
        *W(range(20)).random_split({"train": 0.5, "valid": 0.5}, seed=11))),
}

EXCLUDED: dict[str, str] = {}


def _exported_pipe_classes():
    return {
        name for name in di.__all__
        if isinstance(getattr(di, name), type) and issubclass(getattr(di, name), IterDataPipe) and name != "IterDataPipe"
    }


def test_every_exported_pipe_class_is_in_the_table_or_excluded():
    covered = {key.split("[")[0] for key in TABLE}
    assert not covered & set(EXCLUDED)
    assert covered | set(EXCLUDED) == _exported_pipe_classes()


# the class of the children a split returns, where its name does not start with the split's
CHILDREN = {"RandomSplitter": "SplitterIterator"}


def test_each_entry_holds_its_class(env):
    """Each builder's pipe holds the stage its key names (a split: its children)."""
    from datapipes.graph import traverse

    for key, case in TABLE.items():
        name = key.split("[")[0]
        if name == "CudaMover" and not HAS_CUDA:
            continue
        stages = list(traverse(case.build(env)))
        assert any(
            isinstance(s, getattr(di, name)) or type(s).__name__.startswith(CHILDREN.get(name, name)) for s in stages
        ), (key, [type(s).__name__ for s in stages])


@pytest.mark.parametrize(
    "key", [pytest.param(key, marks=list(case.marks)) for key, case in TABLE.items()]
)
def test_resumes_exactly(env, key):
    case = TABLE[key]

    def run():
        return check_resume(
            lambda: case.build(env), ks=lambda n: range(n + 1), ordered=case.ordered, through="torch", convert=norm
        )

    if case.refuses is not None:
        # A stage that cannot save its position must say so, naming itself, rather than save a wrong one.
        with pytest.raises(TypeError, match=re.escape(case.refuses) + " cannot save its position"):
            run()
        return
    full = run()
    assert full, f"{key}: the uninterrupted pass is empty"


def _resumed(build, state):
    it = iter(build())
    if state is not None:
        it.load_state_dict(pickle.loads(pickle.dumps(state)))
    return it


@pytest.mark.parametrize(
    "key", [pytest.param(key, marks=list(case.marks)) for key, case in TABLE.items() if case.refuses is None]
)
def test_a_resumed_pass_saves_and_resumes_again(env, key):
    """Stopped after k1 items, resumed, stopped after k2 more, resumed again: the three parts make up
    the uninterrupted pass (a resumed pass's own state holds what it was given and what it did)."""
    case = TABLE[key]

    def build():
        return case.build(env)

    full = [norm(x) for x in build()]
    n = len(full)
    for k1, k2 in sorted({(0, n // 2), (1, 1), (n // 3, n // 3), (n // 2, n - n // 2)}):
        if k1 + k2 > n:
            continue
        parts, state = [], None
        for k in (k1, k2, None):
            it = _resumed(build, state)
            try:
                parts.append([norm(x) for x in (it if k is None else itertools.islice(it, k))])
                state = it.state_dict() if k is not None else None
            finally:
                close_iterator(it)
        got = parts[0] + parts[1] + parts[2]
        if case.ordered:
            assert got == full, (k1, k2)
        else:
            assert same_multiset(got, full), (k1, k2)
