"""datapipes.iter.s3: torchdata 0.9's S3FileLister [list_files_by_s3] and S3FileLoader
[load_files_by_s3] on fsspec, checked against an in-memory file system registered under the ``s3``
protocol (no network, no s3fs needed): listing, loading, the storage options s3fs would receive,
error messages, checkpoints."""

import importlib
import inspect
import sys

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from datapipes.iter import IterableWrapper
from datapipes.iter.s3 import S3FileLister, S3FileLoader
from datapipes.testing import check_datapipe, check_resume

# fsspec's protocol -> class table (``fsspec.registry`` the attribute is a read-only view of it)
REGISTRY = importlib.import_module("fsspec.registry")._registry

OBJECTS = {
    "bucket/data/a.csv": b"a1\na2\na3\n",
    "bucket/data/b.txt": b"b1\n",
    "bucket/data/sub/c.csv": b"c1\nc2\n",
    "bucket/other/d.csv": b"d1\n",
    "bucket/top.csv": b"t1\n",
}


@pytest.fixture
def fake_s3():
    """An in-memory file system registered as fsspec's ``s3`` protocol for the test (the one
    registered before is put back after). ``fake_s3.inits`` holds the storage options of every
    instance made, ``fake_s3.opens`` the keyword arguments of every file opened."""

    class FakeS3(MemoryFileSystem):
        protocol = ("s3", "s3a")
        store: dict = {}
        pseudo_dirs = [""]
        cachable = False  # a new instance per URL: every one's options are recorded
        inits: list = []
        opens: list = []

        def __init__(self, *args, **storage_options):
            type(self).inits.append(storage_options)
            super().__init__(*args, **storage_options)

        @classmethod
        def _strip_protocol(cls, path):
            if isinstance(path, str):
                path = path.removeprefix("s3://")
            return super()._strip_protocol(path)

        def _open(self, path, mode="rb", block_size=None, **kwargs):
            type(self).opens.append({"path": path, "block_size": block_size, **kwargs})
            return super()._open(path, mode, block_size=block_size, **kwargs)

    before = REGISTRY.get("s3")
    fsspec.register_implementation("s3", FakeS3, clobber=True)
    try:
        fs = FakeS3()
        for key, data in OBJECTS.items():
            fs.pipe("s3://" + key, data)
        FakeS3.inits.clear()
        yield FakeS3
    finally:
        if before is None:
            REGISTRY.pop("s3", None)
        else:
            fsspec.register_implementation("s3", before, clobber=True)


@pytest.fixture
def no_s3fs(monkeypatch):
    """No ``s3`` protocol: nothing registered under it and s3fs not importable."""
    monkeypatch.delitem(REGISTRY, "s3", raising=False)
    monkeypatch.setitem(sys.modules, "s3fs", None)


def read_all(pairs):
    return [(url, stream.read()) for url, stream in pairs]


class TestS3FileLister:
    def test_lists_every_object_under_a_prefix_recursively_as_torchdata(self, fake_s3):
        assert list(S3FileLister(IterableWrapper(["s3://bucket/data"]))) == [
            "s3://bucket/data/a.csv", "s3://bucket/data/b.txt", "s3://bucket/data/sub/c.csv",
        ]
        assert list(S3FileLister("s3://bucket/data/")) == [
            "s3://bucket/data/a.csv", "s3://bucket/data/b.txt", "s3://bucket/data/sub/c.csv",
        ]

    def test_a_bucket_and_several_prefixes(self, fake_s3):
        assert list(S3FileLister("s3://bucket")) == ["s3://" + key for key in sorted(OBJECTS)]
        pipe = IterableWrapper(["s3://bucket/other", "s3://bucket/data/sub"]).list_files_by_s3()
        assert list(pipe) == ["s3://bucket/other/d.csv", "s3://bucket/data/sub/c.csv"]

    def test_recursive_false_lists_one_level(self, fake_s3):
        assert list(S3FileLister("s3://bucket/data", recursive=False)) == ["s3://bucket/data/a.csv", "s3://bucket/data/b.txt"]

    def test_masks_match_object_names(self, fake_s3):
        assert list(S3FileLister("s3://bucket/data", masks="*.csv")) == ["s3://bucket/data/a.csv", "s3://bucket/data/sub/c.csv"]
        assert list(S3FileLister("s3://bucket/data", masks=["b.*", "c.*"])) == [
            "s3://bucket/data/b.txt", "s3://bucket/data/sub/c.csv",
        ]
        # masks is torchdata's fifth positional parameter
        assert list(S3FileLister(["s3://bucket/data"], -1, -1, "", "a*")) == ["s3://bucket/data/a.csv"]

    def test_a_url_naming_an_object_lists_itself(self, fake_s3):
        assert list(S3FileLister("s3://bucket/top.csv")) == ["s3://bucket/top.csv"]

    def test_region_and_timeout_become_s3fs_options(self, fake_s3):
        pipe = S3FileLister("s3://bucket/other", region="eu-west-3", request_timeout_ms=2500, anon=True)
        assert list(pipe) == ["s3://bucket/other/d.csv"]
        assert fake_s3.inits and all(
            options == {
                "anon": True,
                "client_kwargs": {"region_name": "eu-west-3"},
                "config_kwargs": {"connect_timeout": 2.5, "read_timeout": 2.5},
            }
            for options in fake_s3.inits
        )

    def test_defaults_pass_no_options(self, fake_s3):
        list(S3FileLister("s3://bucket/other"))
        assert fake_s3.inits and all(options == {} for options in fake_s3.inits)

    def test_region_merges_into_the_callers_client_kwargs(self, fake_s3):
        given = {"endpoint_url": "http://127.0.0.1:9"}
        pipe = S3FileLister("s3://bucket/other", region="us-east-2", client_kwargs=given)
        list(pipe)
        assert fake_s3.inits[-1]["client_kwargs"] == {"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-2"}
        assert given == {"endpoint_url": "http://127.0.0.1:9"}  # the caller's dict is left alone

    def test_a_region_given_twice_differently_is_refused(self):
        with pytest.raises(ValueError, match=r"S3FileLister: region sets client_kwargs\['region_name'\]"):
            S3FileLister("s3://bucket", region="a", client_kwargs={"region_name": "b"})
        with pytest.raises(ValueError, match=r"request_timeout_ms sets config_kwargs\['read_timeout'\]"):
            S3FileLister("s3://bucket", request_timeout_ms=1000, config_kwargs={"read_timeout": 3})

    def test_non_s3_urls_are_refused_naming_the_stage_and_url(self, fake_s3):
        with pytest.raises(ValueError, match=r"S3FileLister: expects s3:// URLs .*'memory://bucket/data'"):
            S3FileLister(["s3://bucket/data", "memory://bucket/data"])
        with pytest.raises(ValueError, match=r"S3FileLister: the URL 's3:///data' names no bucket"):
            S3FileLister("s3:///data")
        with pytest.raises(TypeError, match=r"S3FileLister: each root must be a str"):
            S3FileLister([3])
        # from a pipe: checked as each URL is pulled
        pipe = IterableWrapper(["s3://bucket/other", "gs://bucket/data"]).list_files_by_s3()
        it = iter(pipe)
        assert next(it) == "s3://bucket/other/d.csv"
        with pytest.raises(ValueError, match=r"S3FileLister: expects s3:// URLs .*'gs://bucket/data'"):
            next(it)

    def test_a_missing_prefix_raises_naming_the_url(self, fake_s3):
        with pytest.raises(FileNotFoundError) as info:
            list(S3FileLister("s3://bucket/nothing"))
        assert any("'s3://bucket/nothing'" in note for note in info.value.__notes__)
        assert any("S3FileLister" in note for note in info.value.__notes__)

    def test_len_is_length_or_unknown(self, fake_s3):
        assert len(S3FileLister("s3://bucket", length=5)) == 5
        with pytest.raises(TypeError, match="S3FileLister instance doesn't have valid length"):
            len(S3FileLister("s3://bucket"))

    def test_argument_checks(self):
        with pytest.raises(ValueError, match="S3FileLister: request_timeout_ms must be -1 .* got 0"):
            S3FileLister("s3://bucket", request_timeout_ms=0)
        with pytest.raises(ValueError, match="S3FileLister: request_timeout_ms must be >= -1"):
            S3FileLister("s3://bucket", request_timeout_ms=-5)
        with pytest.raises(TypeError, match="S3FileLister: request_timeout_ms must be an int"):
            S3FileLister("s3://bucket", request_timeout_ms=1.5)
        with pytest.raises(TypeError, match="S3FileLister: region must be a str"):
            S3FileLister("s3://bucket", region=None)
        with pytest.raises(ValueError, match="S3FileLister: length must be >= -1"):
            S3FileLister("s3://bucket", length=-2)
        with pytest.raises(TypeError, match="S3FileLister: masks must be"):
            S3FileLister("s3://bucket", masks=3)
        with pytest.raises(TypeError, match="S3FileLister: recursive must be a bool"):
            S3FileLister("s3://bucket", recursive=1)

    def test_torchdata_signature(self):
        params = inspect.signature(S3FileLister).parameters
        assert list(params)[:5] == ["source_datapipe", "length", "request_timeout_ms", "region", "masks"]
        assert [params[p].default for p in list(params)[1:5]] == [-1, -1, "", ""]

    def test_contract_and_resume(self, fake_s3):
        pipe = IterableWrapper(["s3://bucket/data", "s3://bucket/other"]).list_files_by_s3(region="r")
        got = check_datapipe(pipe)
        assert len(got) == 4
        full = check_resume(lambda: IterableWrapper(["s3://bucket/data", "s3://bucket/other"]).list_files_by_s3(),
                            ks=range(5))
        assert full == got

    def test_without_s3fs_iterating_names_the_extra(self, no_s3fs):
        pipe = S3FileLister("s3://bucket")  # a description: built without s3fs
        with pytest.raises(ImportError, match=r"S3FileLister: s3:// URLs need s3fs.*datapipes\[remote\]"):
            iter(pipe)


class TestS3FileLoader:
    def test_yields_url_and_binary_stream(self, fake_s3):
        pipe = S3FileLoader(IterableWrapper(["s3://bucket/data/a.csv", "s3://bucket/top.csv"]))
        assert read_all(pipe) == [("s3://bucket/data/a.csv", b"a1\na2\na3\n"), ("s3://bucket/top.csv", b"t1\n")]
        assert len(pipe) == 2

    def test_after_the_lister(self, fake_s3):
        pipe = IterableWrapper(["s3://bucket/data"]).list_files_by_s3(masks="*.csv").load_files_by_s3()
        assert read_all(pipe) == [("s3://bucket/data/a.csv", b"a1\na2\na3\n"), ("s3://bucket/data/sub/c.csv", b"c1\nc2\n")]

    def test_options_reach_s3fs_and_open(self, fake_s3):
        pipe = S3FileLoader(["s3://bucket/top.csv"], 1500, "ap-south-1", 4096, True, anon=True)
        assert read_all(pipe) == [("s3://bucket/top.csv", b"t1\n")]
        assert fake_s3.inits[-1] == {
            "anon": True,
            "client_kwargs": {"region_name": "ap-south-1"},
            "config_kwargs": {"connect_timeout": 1.5, "read_timeout": 1.5},
        }
        assert fake_s3.opens[-1]["block_size"] == 4096

    def test_kwargs_for_open_pass_through(self, fake_s3):
        read_all(S3FileLoader(["s3://bucket/top.csv"], kwargs_for_open={"cache_options": {"x": 1}}))
        assert fake_s3.opens[-1]["cache_options"] == {"x": 1}
        assert fake_s3.opens[-1]["block_size"] is None

    def test_non_s3_urls_are_refused_naming_the_stage_and_url(self, fake_s3):
        with pytest.raises(ValueError, match=r"S3FileLoader: expects s3:// URLs .*'/tmp/a.csv'"):
            S3FileLoader(["/tmp/a.csv"])
        with pytest.raises(ValueError, match=r"S3FileLoader: expects s3:// URLs .*'memory://x'") as info:
            read_all(IterableWrapper(["s3://bucket/top.csv", "memory://x"]).load_files_by_s3())
        assert "[datapipes] raised in stage S3FileLoader at item 1" in info.value.__notes__

    def test_on_error_skip_counts_what_does_not_open(self, fake_s3):
        pipe = IterableWrapper(["s3://bucket/top.csv", "s3://bucket/missing", "file:///x"]).load_files_by_s3(on_error="skip")
        assert read_all(pipe) == [("s3://bucket/top.csv", b"t1\n")]
        assert pipe.failures.count == 2

    def test_a_missing_object_raises_naming_the_url(self, fake_s3):
        with pytest.raises(FileNotFoundError) as info:
            read_all(S3FileLoader(["s3://bucket/missing.csv"]))
        assert any("'s3://bucket/missing.csv'" in note for note in info.value.__notes__)

    def test_argument_checks(self):
        with pytest.raises(ValueError, match="S3FileLoader: buffer_size must be >= 1"):
            S3FileLoader(["s3://b/k"], buffer_size=0)
        with pytest.raises(TypeError, match="S3FileLoader: multi_part_download must be a bool"):
            S3FileLoader(["s3://b/k"], multi_part_download="yes")
        with pytest.raises(ValueError, match="S3FileLoader: buffer_size=10 and kwargs_for_open"):
            S3FileLoader(["s3://b/k"], buffer_size=10, kwargs_for_open={"block_size": 20})
        with pytest.raises(TypeError, match="S3FileLoader: source_datapipe must be an IterDataPipe"):
            S3FileLoader("s3://b/k")
        with pytest.raises(ValueError, match="S3FileLoader: retries must be >= 0"):
            S3FileLoader(["s3://b/k"], retries=-1)
        for flag in (None, True, False):
            assert S3FileLoader(["s3://b/k"], multi_part_download=flag).multi_part_download is flag

    def test_torchdata_signature(self):
        params = inspect.signature(S3FileLoader).parameters
        assert list(params)[:5] == ["source_datapipe", "request_timeout_ms", "region", "buffer_size", "multi_part_download"]
        assert [params[p].default for p in list(params)[1:5]] == [-1, "", None, None]

    def test_contract(self, fake_s3):
        pipe = IterableWrapper(["s3://bucket/data"]).list_files_by_s3().load_files_by_s3().map(lambda p: (p[0], p[1].read()))
        assert check_datapipe(pipe) == [
            ("s3://bucket/data/a.csv", b"a1\na2\na3\n"), ("s3://bucket/data/b.txt", b"b1\n"),
            ("s3://bucket/data/sub/c.csv", b"c1\nc2\n"),
        ]

    def test_a_reader_resumes_inside_an_object_by_opening_it_again(self, fake_s3):
        def build():
            return IterableWrapper(["s3://bucket/data"]).list_files_by_s3(masks="*.csv").load_files_by_s3().readlines()

        full = check_resume(build, ks=range(6))
        assert full == [
            ("s3://bucket/data/a.csv", b"a1"), ("s3://bucket/data/a.csv", b"a2"), ("s3://bucket/data/a.csv", b"a3"),
            ("s3://bucket/data/sub/c.csv", b"c1"), ("s3://bucket/data/sub/c.csv", b"c2"),
        ]

    def test_without_s3fs_iterating_names_the_extra(self, no_s3fs):
        pipe = S3FileLoader(["s3://bucket/top.csv"])
        with pytest.raises(ImportError, match=r"S3FileLoader: s3:// URLs need s3fs.*pip install 'datapipes\[remote\]'"):
            iter(pipe)
