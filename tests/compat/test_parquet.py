"""datapipes.iter.parquet: ParquetParser [parse_parquet] (rows or record batches) and torchdata's
ParquetDataFrameLoader [load_parquet_as_df] (a pyarrow.Table per row group, torcharrow being gone),
on small files with several row groups written here."""

import inspect
import io
import sys
import uuid

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import fsspec  # noqa: E402
import torch  # noqa: E402

from datapipes._runtime import passes as _pass  # noqa: E402
from datapipes.iter import FileLister, IterableWrapper  # noqa: E402
from datapipes.iter.parquet import ParquetDataFrameLoader, ParquetParser  # noqa: E402
from datapipes.testing import check_datapipe, check_resume  # noqa: E402


def table(start, n):
    return pa.table({"id": list(range(start, start + n)), "name": [f"n{i}" for i in range(start, start + n)]})


def parquet_bytes(t, row_group_size, **kwargs):
    buf = io.BytesIO()
    pq.write_table(t, buf, row_group_size=row_group_size, **kwargs)
    return buf.getvalue()


def rows(start, n):
    return [{"id": i, "name": f"n{i}"} for i in range(start, start + n)]


@pytest.fixture
def files(tmp_path):
    """Two files: a.parquet (ids 0-9, row groups of 4, 4, 2) and b.parquet (ids 100-104, row groups
    of 2, 2, 1)."""
    a = tmp_path / "a.parquet"
    b = tmp_path / "b.parquet"
    a.write_bytes(parquet_bytes(table(0, 10), 4))
    b.write_bytes(parquet_bytes(table(100, 5), 2))
    return str(a), str(b)


@pytest.fixture
def memdir():
    fs = fsspec.filesystem("memory")
    root = f"/parquet-{uuid.uuid4().hex}"
    fs.mkdir(root)
    yield fs, f"memory://{root.lstrip('/')}"
    fs.rm(root, recursive=True)


def corrupt_row_group(data, group):
    """``data`` with the pages of row group ``group``'s first column overwritten."""
    meta = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(group).column(0)
    start = meta.dictionary_page_offset or meta.data_page_offset
    out = bytearray(data)
    out[start:start + meta.total_compressed_size] = b"\xff" * meta.total_compressed_size
    return bytes(out)


def file_state(it):
    """The state of the Parquet reader in a pass's ``state_dict()``."""
    states = [s for s in it.state_dict()["stages"].values() if isinstance(s, dict) and "file" in s and "n" in s]
    assert len(states) == 1
    return states[0]


class TestParquetParser:
    def test_rows_of_paths_in_order(self, files):
        assert list(ParquetParser(IterableWrapper(list(files)))) == rows(0, 10) + rows(100, 5)

    def test_pairs_from_open_files_and_the_functional_form(self, files, tmp_path):
        pipe = FileLister(str(tmp_path), "*.parquet").open_files(mode="b").parse_parquet(columns=["id"])
        assert [r["id"] for r in pipe] == list(range(10)) + list(range(100, 105))
        assert all(list(r) == ["id"] for r in pipe)

    def test_batches_stay_inside_row_groups(self, files):
        pipe = ParquetParser(IterableWrapper([files[0]]), batch_size=3, as_batches=True)
        batches = list(pipe)
        assert all(isinstance(b, pa.RecordBatch) for b in batches)
        assert [b.num_rows for b in batches] == [3, 1, 3, 1, 2]
        assert pa.Table.from_batches(batches).to_pylist() == rows(0, 10)

    def test_return_path(self, files):
        got = list(ParquetParser(IterableWrapper(list(files)), return_path=True))
        assert got[0] == (files[0], {"id": 0, "name": "n0"}) and got[-1] == (files[1], {"id": 104, "name": "n104"})
        batches = list(ParquetParser(IterableWrapper([files[1]]), as_batches=True, return_path=True))
        assert [(p, b.num_rows) for p, b in batches] == [(files[1], 2), (files[1], 2), (files[1], 1)]

    def test_nested_columns_by_prefix(self):
        t = pa.table({"a": [{"b": 1, "c": "x"}, {"b": 2, "c": "y"}], "d": [1.5, 2.5]})
        pipe = IterableWrapper([("n.parquet", io.BytesIO(parquet_bytes(t, 1)))]).parse_parquet(columns=["a"])
        assert list(pipe) == [{"a": {"b": 1, "c": "x"}}, {"a": {"b": 2, "c": "y"}}]

    def test_fsspec_urls_and_fsspec_streams(self, memdir):
        fs, root = memdir
        fs.pipe(f"{root}/a.parquet", parquet_bytes(table(0, 10), 4))
        assert list(IterableWrapper([f"{root}/a.parquet"]).parse_parquet()) == rows(0, 10)
        pipe = IterableWrapper([f"{root}/a.parquet"]).open_files_by_fsspec(mode="rb").parse_parquet(batch_size=3)
        assert list(pipe) == rows(0, 10)

    def test_a_stream_that_cannot_seek_is_read_into_memory(self):
        class Unseekable(io.RawIOBase):
            def __init__(self, data):
                self.inner = io.BytesIO(data)

            def readable(self):
                return True

            def readinto(self, b):
                return self.inner.readinto(b)

        data = parquet_bytes(table(0, 5), 2)
        assert list(IterableWrapper([("u.parquet", Unseekable(data))]).parse_parquet()) == rows(0, 5)

    def test_a_file_that_is_not_parquet_names_the_file(self, files, tmp_path):
        bad = tmp_path / "notes.txt"
        bad.write_text("not a parquet file at all")
        with pytest.raises(pa.ArrowInvalid) as info:
            list(ParquetParser(IterableWrapper([files[0], str(bad)])))
        assert f"[datapipes] raised in stage ParquetParser at file {str(bad)!r}, item 1" in info.value.__notes__
        with pytest.raises(ValueError) as info:  # ArrowInvalid is a ValueError
            list(IterableWrapper([("mem.txt", io.BytesIO(b"hello"))]).parse_parquet())
        assert any("'mem.txt'" in note for note in info.value.__notes__)

    def test_a_missing_file_and_a_missing_column(self, files, tmp_path):
        with pytest.raises(FileNotFoundError) as info:
            list(ParquetParser(IterableWrapper([str(tmp_path / "nope.parquet")])))
        assert any("nope.parquet" in note for note in info.value.__notes__)
        with pytest.raises(KeyError, match=r"ParquetParser: .*a\.parquet' has no column 'idd'"):
            list(ParquetParser(IterableWrapper([files[0]]), columns=["id", "idd"]))

    def test_a_corrupt_row_group_names_it_and_skip_goes_on_with_the_next(self):
        data = corrupt_row_group(parquet_bytes(table(0, 12), 4, compression="snappy"), 1)
        with pytest.raises(OSError) as info:
            list(IterableWrapper([("c.parquet", io.BytesIO(data))]).parse_parquet())
        assert "[datapipes] raised in stage ParquetParser at file 'c.parquet', row group 1" in info.value.__notes__
        pipe = IterableWrapper([("c.parquet", io.BytesIO(data)), ("t.txt", io.BytesIO(b"x" * 20))]).parse_parquet(
            on_error="skip"
        )
        assert [r["id"] for r in pipe] == [0, 1, 2, 3, 8, 9, 10, 11]
        assert pipe.failures.count == 2
        budget = IterableWrapper([("c.parquet", io.BytesIO(data)), ("d.parquet", io.BytesIO(data))]).parse_parquet(
            on_error="skip", max_failures=1
        )
        with pytest.raises(ExceptionGroup, match="more than max_failures=1"):
            list(budget)

    def test_bad_items_and_text_streams(self):
        with pytest.raises(TypeError, match="ParquetParser: expects paths or \\(path, stream\\) pairs"):
            list(IterableWrapper([3]).parse_parquet())
        with pytest.raises(TypeError, match="ParquetParser: 't.parquet' is a text stream"):
            list(IterableWrapper([("t.parquet", io.StringIO("x"))]).parse_parquet())
        with pytest.raises(TypeError, match="ParquetParser: the stream of 'a.parquet' is a str, not a binary file"):
            list(IterableWrapper([["a.parquet", "b.parquet"]]).parse_parquet())

    def test_argument_checks(self):
        src = IterableWrapper([])
        with pytest.raises(ValueError, match="ParquetParser: batch_size must be >= 1"):
            ParquetParser(src, batch_size=0)
        with pytest.raises(TypeError, match="ParquetParser: columns must be a list"):
            ParquetParser(src, columns="id")
        with pytest.raises(TypeError, match="ParquetParser: as_batches must be a bool"):
            ParquetParser(src, as_batches=1)
        with pytest.raises(TypeError, match="ParquetParser: source_datapipe must be an IterDataPipe"):
            ParquetParser(["a.parquet"])
        with pytest.raises(ValueError, match="on_error"):
            ParquetParser(src, on_error="ignore")
        with pytest.raises(TypeError, match=r"ParquetParser.* has no len\(\): the number of rows"):
            len(ParquetParser(src))

    def test_contract(self, files):
        assert check_datapipe(ParquetParser(IterableWrapper(list(files)), batch_size=3)) == rows(0, 10) + rows(100, 5)
        check_datapipe(FileLister(files[0]).open_files(mode="b").parse_parquet(as_batches=True).map(lambda b: b.num_rows))

    @pytest.mark.parametrize("as_batches", [False, True])
    def test_resume_from_paths_and_opened_streams(self, files, tmp_path, as_batches):
        convert = (lambda b: b.to_pylist()) if as_batches else None
        full = check_resume(lambda: IterableWrapper(list(files)).parse_parquet(batch_size=3, as_batches=as_batches),
                            ks=lambda n: range(n + 1), convert=convert)
        assert len(full) == (8 if as_batches else 15)
        check_resume(lambda: FileLister(str(tmp_path), "*.parquet").open_files(mode="b").parse_parquet(
            batch_size=3, as_batches=as_batches, return_path=True), ks=lambda n: range(n + 1))

    def test_resume_from_in_memory_streams_and_urls(self, memdir):
        data = parquet_bytes(table(0, 10), 4)
        full = check_resume(
            lambda: IterableWrapper([("m.parquet", io.BytesIO(data)), ("n.parquet", io.BytesIO(data))]).parse_parquet(
                batch_size=3
            ),
            ks=range(21), through="torch",
        )
        assert full == rows(0, 10) * 2
        fs, root = memdir
        fs.pipe(f"{root}/a.parquet", data)
        check_resume(lambda: IterableWrapper([f"{root}/a.parquet"]).parse_parquet(batch_size=3), ks=range(11))
        check_resume(lambda: IterableWrapper([f"{root}/a.parquet"]).open_files_by_fsspec(mode="rb").parse_parquet(),
                     ks=range(11))

    def test_the_state_is_the_row_group_and_the_row(self, files):
        it = iter(ParquetParser(IterableWrapper(list(files)), batch_size=3))
        for _ in range(6):  # row group 1 of a.parquet, after its first 2 rows
            next(it)
        state = file_state(it)
        assert state["n"] == 0
        assert state["file"] == {"path": files[0], "opened": True, "row_group": 1, "row": 2, "memory": None}
        for _ in range(4):  # the last row of a.parquet: the file is done
            next(it)
        assert file_state(it)["file"]["row_group"] == 2 and file_state(it)["file"]["row"] == 2
        next(it)
        assert file_state(it)["n"] == 1 and file_state(it)["file"]["row"] == 1

    def test_a_stream_that_cannot_be_reopened_or_copied_has_no_state(self, files):
        with open(files[0], "rb") as f:
            it = iter(IterableWrapper([("a.parquet", f)], deepcopy=False).parse_parquet())
            next(it)
            with pytest.raises(TypeError, match="ParquetParser cannot save its position inside 'a.parquet'"):
                it.state_dict()

    def test_closing_the_pass_closes_the_stream(self, files):
        pipe = IterableWrapper([files[0]]).open_files(mode="b")
        streams = []
        it = iter(pipe.map(lambda p: streams.append(p[1]) or p).parse_parquet())
        next(it)
        assert not streams[0].closed
        it.close()
        assert streams[0].closed

    def test_without_pyarrow_building_names_the_extra(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "pyarrow", None)
        monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
        with pytest.raises(ImportError, match=r"ParquetParser needs pyarrow.*pip install 'datapipes\[parquet\]'"):
            ParquetParser(IterableWrapper([]))
        with pytest.raises(ImportError, match=r"ParquetDataFrameLoader needs pyarrow.*datapipes\[parquet\]"):
            ParquetDataFrameLoader(IterableWrapper([]))


class TestParquetDataFrameLoader:
    def test_one_table_per_row_group(self, files):
        tables = list(ParquetDataFrameLoader(IterableWrapper(list(files))))
        assert all(isinstance(t, pa.Table) for t in tables)
        assert [t.num_rows for t in tables] == [4, 4, 2, 2, 2, 1]
        assert pa.concat_tables(tables).to_pylist() == rows(0, 10) + rows(100, 5)

    def test_columns_dtype_and_use_threads(self, files):
        schema = pa.schema([("id", pa.int16())])
        pipe = IterableWrapper([files[1]]).load_parquet_as_df(dtype=schema, columns=["id"], use_threads=True)
        tables = list(pipe)
        assert [t.schema for t in tables] == [schema] * 3
        assert [t.to_pydict() for t in tables] == [{"id": [100, 101]}, {"id": [102, 103]}, {"id": [104]}]

    def test_a_dtype_that_does_not_fit_names_the_file_and_row_group(self, files):
        pipe = ParquetDataFrameLoader(IterableWrapper([files[0]]), dtype=pa.schema([("other", pa.int64())]))
        with pytest.raises(ValueError) as info:
            list(pipe)
        assert f"[datapipes] raised in stage ParquetDataFrameLoader at file {files[0]!r}, row group 0" in info.value.__notes__

    def test_pairs_and_urls(self, files, memdir):
        tables = list(FileLister(files[1]).open_files(mode="b").load_parquet_as_df())
        assert [t.num_rows for t in tables] == [2, 2, 1]
        fs, root = memdir
        fs.pipe(f"{root}/b.parquet", open(files[1], "rb").read())
        assert [t.num_rows for t in IterableWrapper([f"{root}/b.parquet"]).load_parquet_as_df()] == [2, 2, 1]

    def test_device_and_dtype_checks(self):
        src = IterableWrapper([])
        for device in ("", "cpu", torch.device("cpu")):
            ParquetDataFrameLoader(src, device=device)
        with pytest.raises(ValueError, match="ParquetDataFrameLoader: device must be '' or 'cpu'.*'cuda'"):
            ParquetDataFrameLoader(src, device="cuda")
        with pytest.raises(TypeError, match="ParquetDataFrameLoader: dtype must be a pyarrow.Schema"):
            ParquetDataFrameLoader(src, dtype=pa.int32())
        with pytest.raises(TypeError, match="ParquetDataFrameLoader: use_threads must be a bool"):
            ParquetDataFrameLoader(src, use_threads="yes")
        with pytest.raises(TypeError, match="the number of row groups is known only after reading"):
            len(ParquetDataFrameLoader(src))

    def test_torchdata_signature(self):
        params = inspect.signature(ParquetDataFrameLoader).parameters
        assert list(params)[:5] == ["source_dp", "dtype", "columns", "device", "use_threads"]
        assert [params[p].default for p in list(params)[1:5]] == [None, None, "", False]

    def test_contract_and_resume(self, files):
        schema = pa.schema([("id", pa.int32()), ("name", pa.string())])
        got = check_datapipe(ParquetDataFrameLoader(IterableWrapper(list(files)), dtype=schema).map(lambda t: t.to_pydict()))
        assert len(got) == 6 and got[0] == {"id": [0, 1, 2, 3], "name": ["n0", "n1", "n2", "n3"]}
        full = check_resume(lambda: IterableWrapper(list(files)).load_parquet_as_df(), ks=range(7),
                            convert=lambda t: t.to_pydict())
        assert full == got
