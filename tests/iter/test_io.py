"""CSVParser / CSVFilesParser, CSVDictParser, JsonParser, LineReader over (path, stream) pairs."""

import csv
import io
import json
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from datapipes._runtime import passes as _pass
from datapipes.iter import CSVDictParser, CSVFilesParser, CSVParser, IterableWrapper, JsonParser, LineReader
from datapipes.testing import check_datapipe

from helpers import Guarded, error_of_pass, gc_off  # noqa: F401 - gc_off is a fixture


class Tracked(io.BytesIO):
    """A BytesIO that remembers how far it was read (to check laziness)."""

    def __init__(self, data=b""):
        super().__init__(data)
        self.high = 0

    def read(self, size=-1):
        out = super().read(size)
        self.high = max(self.high, self.tell())
        return out

    def read1(self, size=-1):
        out = super().read1(size)
        self.high = max(self.high, self.tell())
        return out

    def readinto(self, b):
        n = super().readinto(b)
        self.high = max(self.high, self.tell())
        return n

    def readline(self, size=-1):
        out = super().readline(size)
        self.high = max(self.high, self.tell())
        return out

    def __next__(self):
        line = self.readline()
        if not line:
            raise StopIteration
        return line


class Failing(io.RawIOBase):
    """A binary stream that serves ``data`` then raises ``OSError`` (a dropped connection)."""

    def __init__(self, data):
        self._buf = io.BytesIO(data)

    def readable(self):
        return True

    def readinto(self, b):
        n = self._buf.readinto(b)
        if n == 0:
            raise ConnectionResetError("connection reset by peer")
        return n


class Raising(io.RawIOBase):
    """A binary stream that serves ``data`` then raises the exception object ``exc``."""

    def __init__(self, data, exc):
        self._buf = io.BytesIO(data)
        self._exc = exc

    def readable(self):
        return True

    def readinto(self, b):
        n = self._buf.readinto(b)
        if n == 0:
            raise self._exc
        return n


def files(contents, text=False):
    """A re-iterable pipe of (name, fresh stream) pairs over ``{name: bytes}``."""
    names = list(contents)
    if text:
        return IterableWrapper(names).map(lambda n: (n, io.StringIO(contents[n].decode())))
    return IterableWrapper(names).map(lambda n: (n, io.BytesIO(contents[n])))


def csv_bytes(rows, **fmt):
    buf = io.StringIO(newline="")
    csv.writer(buf, **fmt).writerows(rows)
    return buf.getvalue().encode()


def notes(e):
    return getattr(e, "__notes__", [])


class TestCSVParser:
    def test_contract(self):
        data = {"a.csv": b"x,y\n1,2\n", "b.csv": b"3,4\n"}
        check_datapipe(
            files(data).parse_csv(), expected=[["x", "y"], ["1", "2"], ["3", "4"]],
            build=lambda src: src.map(lambda i: (f"{i}.csv", io.StringIO("p,q\n"))).parse_csv(),
        )

    def test_text_and_binary_streams_and_options(self):
        data = {"a.csv": b"h1,h2\n1,\"two, quoted\"\n3,\"multi\nline\"\n"}
        want = [["1", "two, quoted"], ["3", "multi\nline"]]
        assert list(files(data).parse_csv(skip_lines=1)) == want
        assert list(files(data, text=True).parse_csv(skip_lines=1)) == want
        assert list(files(data).parse_csv(skip_lines=1, as_tuple=True)) == [tuple(r) for r in want]
        assert list(files(data).parse_csv(skip_lines=1, return_path=True)) == [("a.csv", r) for r in want]
        tsv = {"t.tsv": b"a\tb\r\nc\td\r\n"}
        assert list(files(tsv).parse_csv(delimiter="\t")) == [["a", "b"], ["c", "d"]]

    def test_torchdata_keyword_call(self):
        pipe = CSVParser(source_datapipe=files({"a.csv": b"h\n1\n"}), skip_lines=1, decode=True,
                         encoding="utf-8", errors="ignore", return_path=False, as_tuple=False, delimiter=",")
        assert list(pipe) == [["1"]]

    def test_encodings(self):
        text = "name,ville\nZoë,Besançon\n"
        utf16 = {"u.csv": text.encode("utf-16")}
        assert list(files(utf16).parse_csv(encoding="utf-16")) == [["name", "ville"], ["Zoë", "Besançon"]]
        assert list(files(utf16).parse_csv(encoding="utf-16", errors="strict"))[1] == ["Zoë", "Besançon"]
        latin = {"l.csv": text.encode("latin-1")}
        with pytest.warns(UnicodeWarning, match=r"dropped 2 bytes of 'l.csv'"):  # the default drops, and counts
            assert list(files(latin).parse_csv())[1] == ["Zo", "Besanon"]
        assert list(files(latin).parse_csv(errors="replace"))[1] == ["Zo\ufffd", "Besan\ufffdon"]
        assert list(files(latin).parse_csv(encoding="latin-1", errors="strict"))[1] == ["Zoë", "Besançon"]

    def test_reads_lazily(self):
        big = b"".join(b"%d,row\n" % i for i in range(100_000))
        for errors in ("ignore", "strict"):
            stream = Tracked(big)
            it = iter(IterableWrapper([("big.csv", stream)], deepcopy=False).parse_csv(errors=errors))
            assert next(it) == ["0", "row"]
            assert stream.high <= 64 * 1024 < len(big)
            it.close()
            assert stream.closed

    def test_closes_streams(self):
        streams = [io.BytesIO(b"1\n2\n"), io.BytesIO(b"3\n")]
        assert list(IterableWrapper([("a", streams[0]), ("b", streams[1])], deepcopy=False).parse_csv()) == [["1"], ["2"], ["3"]]
        assert all(s.closed for s in streams)
        bad = io.BytesIO(b'"open\n')
        with pytest.raises(csv.Error):
            list(IterableWrapper([("bad.csv", bad)], deepcopy=False).parse_csv(strict=True))
        assert bad.closed

    def test_unterminated_quote_names_file_and_lines(self):
        body = b"a,b\n" + b"".join(b"%d,x\n" % i for i in range(15)) + b'16,"open\n17,y\n18,z\n'
        with pytest.raises(csv.Error) as info:
            list(files({"data.csv": body}).parse_csv(strict=True))
        assert "unexpected end of data" in str(info.value)
        assert notes(info.value) == ["[datapipes] raised in stage CSVParser at file 'data.csv', lines 17 to 19"]

    def test_malformed_row_on_one_line(self):
        body = b"a,b\n1,2\n3,\"x\"y\n5,6\n"
        with pytest.raises(csv.Error) as info:
            list(files({"data.csv": body}).parse_csv(strict=True))
        assert notes(info.value) == ["[datapipes] raised in stage CSVParser at file 'data.csv', line 3"]
        with pytest.raises(csv.Error) as info:
            list(files({"data.csv": body}).parse_csv(strict=True, skip_lines=1))
        assert notes(info.value)[0].endswith("at file 'data.csv', line 3")  # lines count from the file's start

    def test_wrong_encoding_names_file_and_line(self):
        body = "a,b\n1,2\n3,é\n".encode("latin-1")
        with pytest.raises(UnicodeDecodeError) as info:
            list(files({"data.csv": body}).parse_csv(errors="strict"))
        assert info.value.object == b"3,\xe9\n"
        assert notes(info.value) == ["[datapipes] raised in stage CSVParser at file 'data.csv', line 3"]
        # a text stream that fails to decode (opened with the wrong encoding) is named as well
        text = IterableWrapper([("t.csv", io.TextIOWrapper(io.BytesIO(body), "utf-8"))])
        with pytest.raises(UnicodeDecodeError) as info:
            list(text.parse_csv())
        assert "file 't.csv'" in notes(info.value)[0]

    def test_bytes_without_decoding_is_a_clear_error(self):
        with pytest.raises(csv.Error, match="strings, not bytes") as info:
            list(files({"a.csv": b"1\n"}).parse_csv(decode=False))
        assert notes(info.value) == ["[datapipes] raised in stage CSVParser at file 'a.csv', line 1"]

    def test_skip_bad_rows_and_count(self):
        body = b'a,b\n1,\xff\n3,4\n5,"x"y\n7,8\n\xfe\n9,"open\n'
        pipe = files({"d.csv": body, "e.csv": b"10,11\n"}).parse_csv(errors="strict", strict=True, on_error="skip")
        assert list(pipe) == [["a", "b"], ["3", "4"], ["7", "8"], ["10", "11"]]
        assert pipe.failures.count == 4
        assert [f.position for f in pipe.failures.recent] == [2, 4, 6, 7]
        kinds = [type(f.exception) for f in pipe.failures.recent]
        assert kinds == [UnicodeDecodeError, csv.Error, UnicodeDecodeError, csv.Error]
        assert notes(pipe.failures.recent[1].exception) == ["[datapipes] raised in stage CSVParser at file 'd.csv', line 4"]
        list(pipe)
        assert pipe.failures.count == 8  # counted across passes

    def test_skip_budget(self):
        body = b'1,\xff\n2,\xfe\n3,\xfd\n'
        pipe = files({"d.csv": body}).parse_csv(errors="strict", on_error="skip", max_failures=2)
        with pytest.raises(ExceptionGroup) as info:
            list(pipe)
        assert len(info.value.exceptions) == 3 and "CSVParser" in str(info.value)

    def test_skip_budget_spans_files_and_restarts_each_pass(self):
        data = {"a.csv": b"1,\xff\n2,2\n", "b.csv": b"3,3\n\xfe\n4,4\n\xfd\n5,5\n"}
        pipe = files(data).parse_csv(errors="strict", on_error="skip", max_failures=2)
        got = []
        with pytest.raises(ExceptionGroup, match="CSVParser: 3 failures, more than max_failures=2") as info:
            for row in pipe:
                got.append(row)
        assert got == [["2", "2"], ["3", "3"], ["4", "4"]]  # the third failure stops the pass
        assert [notes(e) for e in info.value.exceptions] == [
            ["[datapipes] raised in stage CSVParser at file 'a.csv', line 1"],
            ["[datapipes] raised in stage CSVParser at file 'b.csv', line 2"],
            ["[datapipes] raised in stage CSVParser at file 'b.csv', line 4"],
        ]
        with pytest.raises(ExceptionGroup):  # a new pass, a new budget: the same three failures
            list(pipe)
        assert pipe.failures.count == 6

    def test_the_failure_is_the_very_exception_object(self):
        err = ConnectionResetError("reset")
        with pytest.raises(ConnectionResetError) as info:
            list(IterableWrapper([("a.csv", Raising(b"1,2\n", err))], deepcopy=False).parse_csv())
        assert info.value is err
        assert notes(err) == ["[datapipes] raised in stage CSVParser at file 'a.csv', line 2"]
        err = ConnectionResetError("reset")
        pipe = IterableWrapper([("a.csv", Raising(b"1,2\n", err)), ("b.csv", io.BytesIO(b"3\n"))], deepcopy=False).parse_csv(on_error="skip")
        assert list(pipe) == [["1", "2"], ["3"]]
        assert pipe.failures.recent[0].exception is err

    def test_stream_error_skips_rest_of_file(self):
        streams = {"a.csv": lambda: Failing(b"1,2\n3,4\n"), "b.csv": lambda: io.BytesIO(b"5,6\n")}
        src = IterableWrapper(list(streams)).map(lambda n: (n, streams[n]()))
        pipe = src.parse_csv(on_error="skip")
        assert list(pipe) == [["1", "2"], ["3", "4"], ["5", "6"]]
        assert pipe.failures.count == 1 and isinstance(pipe.failures.recent[0].exception, ConnectionResetError)
        with pytest.raises(ConnectionResetError) as info:
            list(src.parse_csv())
        assert "file 'a.csv'" in notes(info.value)[0]

    def test_source_error_passes_through(self):
        def gen():
            yield ("a.csv", io.BytesIO(b"1\n"))
            raise KeyError("source")

        with pytest.raises(KeyError) as info:
            list(IterableWrapper(gen()).parse_csv())
        assert not notes(info.value)

    def test_empty(self):
        check_datapipe(files({}).parse_csv(), expected=[])
        check_datapipe(files({"e.csv": b""}).parse_csv(skip_lines=3), expected=[])

    def test_len_unknown(self):
        with pytest.raises(TypeError, match="CSVParser"):
            len(files({"a.csv": b"1\n"}).parse_csv())

    def test_bad_items(self):
        with pytest.raises(TypeError, match=r"CSVParser: expects \(path, stream\) pairs.*int at item 0"):
            list(IterableWrapper([3]).parse_csv())

    @pytest.mark.parametrize(
        "kwargs, exc, match",
        [
            ({"skip_lines": -1}, ValueError, "skip_lines"),
            ({"skip_lines": 1.5}, TypeError, "skip_lines"),
            ({"encoding": "no-such-codec"}, ValueError, "encoding"),
            ({"errors": "nope"}, ValueError, "errors"),
            ({"return_path": "yes"}, TypeError, "return_path"),
            ({"as_tuple": 1}, TypeError, "as_tuple"),
            ({"delimiter": "ab"}, TypeError, "delimiter"),
            ({"on_eror": "skip"}, TypeError, "on_eror"),
            ({"on_error": "ignore"}, ValueError, "on_error"),
        ],
    )
    def test_bad_arguments(self, kwargs, exc, match):
        with pytest.raises(exc, match=match):
            files({}).parse_csv(**kwargs)

    def test_source_must_be_a_pipe(self):
        with pytest.raises(TypeError, match="CSVParser: source_datapipe"):
            CSVParser([("a", io.BytesIO())])

    @given(st.lists(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                                     max_size=8), max_size=5), max_size=8))
    def test_round_trip(self, rows):
        data = {"r.csv": csv_bytes(rows)}
        assert list(files(data).parse_csv()) == rows
        assert list(files(data).parse_csv(errors="strict")) == rows
        assert list(files(data, text=True).parse_csv()) == rows


class TestCSVFilesParser:
    def test_contract(self):
        data = {"a.csv": b"1,2\n", "b.csv": b"3\n"}
        check_datapipe(
            files(data).parse_csv_files(), expected=[("a.csv", ["1", "2"]), ("b.csv", ["3"])],
            build=lambda src: src.map(lambda i: (f"{i}.csv", io.StringIO("p,q\n"))).parse_csv_files(),
        )

    def test_same_reader_as_parse_csv(self):
        data = {"a.csv": b"h\n1,2\n"}
        pipe = CSVFilesParser(files(data), skip_lines=1, as_tuple=True)
        assert list(pipe) == [("a.csv", ("1", "2"))]
        assert list(files(data).parse_csv_files(return_path=False)) == [["h"], ["1", "2"]]
        with pytest.raises(csv.Error) as info:
            list(files({"q.csv": b'"open\n'}).parse_csv_files(strict=True))
        assert notes(info.value) == ["[datapipes] raised in stage CSVFilesParser at file 'q.csv', line 1"]
        with pytest.raises(TypeError, match="CSVFilesParser"):
            len(files(data).parse_csv_files())
        with pytest.raises(ValueError, match="CSVFilesParser\\(skip_lines=-1\\): 'skip_lines' is required"):
            files(data).parse_csv_files(skip_lines=-1)


class TestCSVDictParser:
    def test_contract(self):
        data = {"a.csv": b"k,v\na,1\n\nb,2\n", "b.csv": b"k,v\nc,3\n"}
        check_datapipe(
            files(data).parse_csv_as_dict(),
            expected=[{"k": "a", "v": "1"}, {"k": "b", "v": "2"}, {"k": "c", "v": "3"}],
            build=lambda src: src.map(lambda i: (f"{i}.csv", io.StringIO("p\n1\n"))).parse_csv_as_dict(),
        )

    def test_options(self):
        data = {"a.csv": b"# comment\nk;v\na;1\n"}
        pipe = files(data).parse_csv_as_dict(skip_lines=1, delimiter=";", return_path=True)
        assert list(pipe) == [("a.csv", {"k": "a", "v": "1"})]
        pipe = CSVDictParser(files({"n.csv": b"a,1\nb,2\n"}), fieldnames=["k", "v"])
        assert list(pipe) == [{"k": "a", "v": "1"}, {"k": "b", "v": "2"}]

    def test_field_count_mismatch_names_file_and_line(self):
        body = b"a,b\n1,2\n3\n"
        with pytest.raises(csv.Error, match="row has 1 field but the header has 2") as info:
            list(files({"d.csv": body}).parse_csv_as_dict())
        assert notes(info.value) == ["[datapipes] raised in stage CSVDictParser at file 'd.csv', line 3"]
        with pytest.raises(csv.Error, match="row has 3 fields"):
            list(files({"d.csv": b"a,b\n1,2,3\n"}).parse_csv_as_dict())

    def test_restkey_restval_as_dict_reader(self):
        body = b"a,b\n1,2,3\n4\n"
        pipe = files({"d.csv": body}).parse_csv_as_dict(restkey="rest", restval="-")
        assert list(pipe) == list(csv.DictReader(io.StringIO(body.decode()), restkey="rest", restval="-"))

    def test_skip_bad_rows(self):
        body = b"a,b\n1,2\n3\n4,5\n6,7,8\n"
        pipe = files({"d.csv": body}).parse_csv_as_dict(on_error="skip")
        assert list(pipe) == [{"a": "1", "b": "2"}, {"a": "4", "b": "5"}]
        assert [f.position for f in pipe.failures.recent] == [3, 5]

    def test_skip_bad_header_skips_its_file(self):
        pipe = files({"a.csv": b'"k\n', "b.csv": b"x\n1\n"}).parse_csv_as_dict(strict=True, on_error="skip")
        assert list(pipe) == [{"x": "1"}]
        assert [notes(f.exception) for f in pipe.failures.recent] == [
            ["[datapipes] raised in stage CSVDictParser at file 'a.csv', line 1"]
        ]

    def test_empty_and_header_only(self):
        check_datapipe(files({"e.csv": b"", "h.csv": b"a,b\n"}).parse_csv_as_dict(), expected=[])

    def test_bad_arguments(self):
        with pytest.raises(TypeError, match="fieldnames"):
            files({}).parse_csv_as_dict(fieldnames="ab")
        with pytest.raises(TypeError, match="CSVDictParser: invalid csv format"):
            files({}).parse_csv_as_dict(quotechar="''")
        with pytest.raises(TypeError, match="as_tuple"):
            files({}).parse_csv_as_dict(as_tuple=True)

    @given(st.lists(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                                     min_size=1, max_size=6), min_size=3, max_size=3), min_size=1, max_size=6))
    def test_round_trip(self, rows):
        header = ["c0", "c1", "c2"]
        got = list(files({"r.csv": csv_bytes([header, *rows])}).parse_csv_as_dict())
        assert got == [dict(zip(header, r)) for r in rows]


class TestJsonParser:
    def test_contract(self):
        data = {"a.json": b'{"x": [1, 2.5, null]}', "b.json": b"[true]"}
        check_datapipe(
            files(data).parse_json_files(), expected=[("a.json", {"x": [1, 2.5, None]}), ("b.json", [True])],
            build=lambda src: src.map(lambda i: (f"{i}.json", io.StringIO("1"))).parse_json_files(),
        )

    def test_text_streams_kwargs_and_len(self):
        pipe = files({"a.json": b'{"p": 1.5}'}, text=True).parse_json_files(parse_float=Decimal)
        assert list(pipe) == [("a.json", {"p": Decimal("1.5")})]
        assert len(pipe) == 1
        utf16 = {"u.json": '["é"]'.encode("utf-16")}
        assert list(files(utf16).parse_json_files()) == [("u.json", ["é"])]

    def test_closes_streams(self):
        s = io.BytesIO(b"{}")
        list(IterableWrapper([("a.json", s)], deepcopy=False).parse_json_files())
        assert s.closed

    def test_invalid_json_names_file_and_line(self):
        text = '{\n  "a": 1,\n}'
        with pytest.raises(json.JSONDecodeError) as info:
            list(files({"ok.json": b"1", "bad.json": text.encode()}).parse_json_files())
        # The line is the one json reports on this interpreter: 3.11 and 3.12 point at the "}" that
        # follows the trailing comma (line 3), 3.13 at the comma itself (line 2).
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            line = e.lineno
        assert info.value.lineno == line
        assert notes(info.value) == [f"[datapipes] raised in stage JsonParser at file 'bad.json', line {line}"]

    def test_invalid_json_on_the_first_line(self):
        with pytest.raises(json.JSONDecodeError) as info:
            list(files({"bad.json": b'[1, 2'}).parse_json_files())
        assert notes(info.value) == ["[datapipes] raised in stage JsonParser at file 'bad.json', line 1"]

    def test_wrong_encoding_names_file_and_line(self):
        with pytest.raises(UnicodeDecodeError) as info:
            list(files({"bad.json": b'[\n"\xff"]'}).parse_json_files())
        assert notes(info.value) == ["[datapipes] raised in stage JsonParser at file 'bad.json', line 2"]

    def test_skip_bad_files(self):
        pipe = files({"a.json": b"[", "b.json": b"2", "c.json": b"\xff"}).parse_json_files(on_error="skip")
        assert list(pipe) == [("b.json", 2)]
        assert pipe.failures.count == 2

    def test_skip_budget(self):
        data = {"a.json": b"[", "b.json": b"2", "c.json": b"\xff", "d.json": b"3"}
        got = []
        with pytest.raises(ExceptionGroup, match="JsonParser") as info:
            for obj in files(data).parse_json_files(on_error="skip", max_failures=1):
                got.append(obj)
        assert got == [("b.json", 2)]
        assert [notes(e) for e in info.value.exceptions] == [
            ["[datapipes] raised in stage JsonParser at file 'a.json', line 1"],
            ["[datapipes] raised in stage JsonParser at file 'c.json', line 1"],
        ]

    def test_stream_error_is_named(self):
        with pytest.raises(ConnectionResetError) as info:
            list(IterableWrapper([("r.json", Failing(b"[1"))]).parse_json_files())
        assert notes(info.value) == ["[datapipes] raised in stage JsonParser at file 'r.json', item 0"]

    def test_bad_arguments(self):
        with pytest.raises(TypeError, match="JsonParser: invalid json.loads arguments"):
            files({}).parse_json_files(no_such_option=1)
        with pytest.raises(TypeError, match="JsonParser: source_datapipe"):
            JsonParser([("a", io.BytesIO())])
        with pytest.raises(TypeError, match="pairs"):
            list(IterableWrapper([b"{}"]).parse_json_files())

    def test_empty(self):
        check_datapipe(files({}).parse_json_files(), expected=[])


class TestLineReader:
    def test_contract(self):
        data = {"a.txt": b"one\ntwo\r\n", "b.txt": b"three"}
        check_datapipe(
            files(data).readlines(), expected=[("a.txt", b"one"), ("a.txt", b"two"), ("b.txt", b"three")],
            build=lambda src: src.map(lambda i: (f"{i}.txt", io.StringIO("x\n"))).readlines(),
        )

    def test_options(self):
        data = {"a.txt": b"head\none\r\ntwo\n"}
        assert list(files(data).readlines(skip_lines=1, return_path=False)) == [b"one", b"two"]
        assert list(files(data).readlines(decode=True, return_path=False)) == ["head", "one", "two"]
        assert list(files(data).readlines(strip_newline=False, return_path=False)) == [b"head\n", b"one\r\n", b"two\n"]
        assert list(files(data, text=True).readlines())[1] == ("a.txt", "one")
        assert list(files({"e.txt": b"\n\nx"}).readlines(decode=True, return_path=False)) == ["", "", "x"]

    def test_torchdata_keyword_call(self):
        pipe = LineReader(source_datapipe=files({"a.txt": b"1\n2\n"}), skip_lines=0, strip_newline=True,
                          decode=True, encoding="utf-8", errors="ignore", return_path=True)
        assert list(pipe) == [("a.txt", "1"), ("a.txt", "2")]

    def test_reads_lazily(self):
        stream = Tracked(b"line\n" * 100_000)
        it = iter(IterableWrapper([("big.txt", stream)], deepcopy=False).readlines(decode=True))
        assert next(it) == ("big.txt", "line")
        assert stream.high <= 64 * 1024
        it.close()
        assert stream.closed

    def test_wrong_encoding_names_file_and_line(self):
        data = {"a.txt": b"ok\nfine\nbad \xff\n"}
        with pytest.raises(UnicodeDecodeError) as info:
            list(files(data).readlines(decode=True, errors="strict"))
        assert notes(info.value) == ["[datapipes] raised in stage LineReader at file 'a.txt', line 3"]

    def test_skip_bad_lines(self):
        data = {"a.txt": b"\xff\nok\nbad \xfe\nlast\n", "b.txt": b"b\n"}
        pipe = files(data).readlines(decode=True, errors="strict", on_error="skip")
        assert list(pipe) == [("a.txt", "ok"), ("a.txt", "last"), ("b.txt", "b")]
        assert [f.position for f in pipe.failures.recent] == [1, 3]

    def test_stream_error_skips_rest_of_file(self):
        src = IterableWrapper(["a", "b"]).map(lambda n: (n, Failing(b"x\ny\n") if n == "a" else io.BytesIO(b"z\n")))
        pipe = src.readlines(on_error="skip", return_path=False)
        assert list(pipe) == [b"x", b"y", b"z"]
        assert pipe.failures.count == 1

    def test_skip_budget_spans_files(self):
        data = {"a.txt": b"\xff\nok\n", "b.txt": b"b\n\xfe\nc\n\xfd\nd\n"}
        got = []
        with pytest.raises(ExceptionGroup, match="LineReader: 3 failures, more than max_failures=2") as info:
            for line in files(data).readlines(decode=True, errors="strict", on_error="skip", max_failures=2):
                got.append(line)
        assert got == [("a.txt", "ok"), ("b.txt", "b"), ("b.txt", "c")]
        assert [notes(e)[0].rsplit(" at ", 1)[1] for e in info.value.exceptions] == [
            "file 'a.txt', line 1", "file 'b.txt', line 2", "file 'b.txt', line 4",
        ]

    def test_skip_counts_lines_after_skip_lines(self):
        data = {"a.txt": b"head\n\xff\nok\n\xfe\nlast\n"}
        pipe = files(data).readlines(decode=True, errors="strict", skip_lines=1, on_error="skip", return_path=False)
        assert list(pipe) == ["ok", "last"]
        assert [f.position for f in pipe.failures.recent] == [2, 4]

    def test_len_unknown_and_empty(self):
        with pytest.raises(TypeError, match="LineReader"):
            len(files({}).readlines())
        check_datapipe(files({"e.txt": b""}).readlines(), expected=[])

    def test_bad_arguments(self):
        with pytest.raises(TypeError, match="strip_newline"):
            files({}).readlines(strip_newline=None)
        with pytest.raises(ValueError, match="skip_lines"):
            files({}).readlines(skip_lines=-2)
        with pytest.raises(TypeError, match="LineReader: source_datapipe"):
            LineReader("a.txt")


class TestWithFileOpener:
    """The readers over real files opened by FileLister / FileOpener (StreamWrapper streams)."""

    def test_csv_json_lines_from_disk(self, tmp_path):
        (tmp_path / "a.csv").write_bytes(b"k,v\na,1\n")
        (tmp_path / "b.json").write_text('{"n": 2}')
        (tmp_path / "c.txt").write_bytes(b"x\ny\n")
        from datapipes.iter import FileLister

        root = str(tmp_path)
        assert [r for _, r in FileLister(root, "*.csv").open_files(mode="b").parse_csv_files()] == [["k", "v"], ["a", "1"]]
        assert list(FileLister(root, "*.csv").open_files().parse_csv_as_dict()) == [{"k": "a", "v": "1"}]
        assert [o for _, o in FileLister(root, "*.json").open_files(mode="b").parse_json_files()] == [{"n": 2}]
        assert list(FileLister(root, "*.txt").open_files(mode="b").readlines(decode=True, return_path=False)) == ["x", "y"]
        pipe = FileLister(root, "*.csv").open_files(mode="b")
        streams = [s for _, s in pipe]
        list(IterableWrapper([(str(i), s) for i, s in enumerate(streams)]).parse_csv())
        assert all(s.closed for s in streams)


READERS = {
    "csv": lambda src: src.parse_csv(),
    "csv-skip": lambda src: src.parse_csv(on_error="skip", max_failures=3),
    "csv-strict-tuple-path": lambda src: src.parse_csv(errors="strict", as_tuple=True, return_path=True, skip_lines=1),
    "csv-files": lambda src: src.parse_csv_files(),
    "csv-files-skip": lambda src: src.parse_csv_files(on_error="skip", delimiter=";"),
    "csv-dict": lambda src: src.parse_csv_as_dict(),
    "csv-dict-fieldnames-skip": lambda src: src.parse_csv_as_dict(fieldnames=["a", "b"], restval="-", on_error="skip"),
    "json": lambda src: src.parse_json_files(),
    "json-skip": lambda src: src.parse_json_files(on_error="skip", max_failures=1),
    "lines": lambda src: src.readlines(),
    "lines-decode-strict-skip": lambda src: src.readlines(decode=True, errors="strict", on_error="skip", return_path=False),
}


class TestPass:
    """Each reader creates its source's iterator when its pass is built (``iter(pipe)``), reads
    nothing before the first ``next()``, and releases its source when it fails."""

    @pytest.mark.parametrize("reader", sorted(READERS))
    def test_pass_is_built_at_iter(self, reader):
        opened = []

        def open_(name):
            opened.append(name)
            return name, io.BytesIO(b'{"x": 1}\n' if reader.startswith("json") else b"x,y\n1,2\n")

        pipe = READERS[reader](IterableWrapper(["a.txt", "b.txt"]).map(open_))
        it = iter(pipe)
        assert _pass.unbuilt(it) == [], _pass.unbuilt(it)
        assert opened == []  # built, not started
        assert len(list(it)) >= 2 and opened == ["a.txt", "b.txt"]
        it1, it2 = iter(pipe), iter(pipe)  # two passes of one graph at once stay apart
        assert _pass.unbuilt(it1) == _pass.unbuilt(it2) == []
        assert list(zip(it1, it2)) == [(x, x) for x in pipe]

    @pytest.mark.usefixtures("gc_off")
    @pytest.mark.parametrize("reader", sorted(r for r in READERS if "skip" not in r))
    def test_failing_pass_releases_its_source(self, reader):
        def pair(name):
            return name, io.BytesIO(b'{"x": 1}\n' if reader.startswith("json") else b"x,y\n")

        # 42, no (path, stream) pair: every reader raises TypeError there
        source = Guarded([pair("a"), 42] + [pair(str(i)) for i in range(100)])
        pipe = READERS[reader](IterableWrapper(source, deepcopy=False))
        held = error_of_pass(pipe, TypeError, "expects \\(path, stream\\) pairs")  # noqa: F841
        assert source.closed == [True]  # while the consumer holds the error, and so the reader's frame
