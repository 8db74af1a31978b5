"""Decoders and the text and record readers against crafted input (issue 37): pickles that run
code, lines and JSON files and TFRecord records bigger than their limit, invalid UTF-8 dropped
without a word; and what already held (truncated TFRecord and Parquet files, deep JSON: errors
that name the file).

Every file is made here, in memory or under ``tmp_path``, and stays small: a long line is a few
MiB of one byte gzip'd (a few KiB) read against a small explicit limit; the default limits are
checked with a bomb whose reading stops at the limit (measured with ``tracemalloc``), and the
16 GiB TFRecord claim runs in a subprocess under ``RLIMIT_AS``, where an allocation of the claimed
size fails at once instead of taking the machine's memory.
"""

import gzip
import io
import json
import os
import pickle
import random
import struct
import subprocess
import sys
import textwrap
import tracemalloc
import warnings

import pytest
import torch

from datapipes.errors import SizeLimitError
from datapipes.iter import IterableWrapper, RoutedDecoder
from datapipes.iter.io.json import MAX_JSON_SIZE
from datapipes.iter.io.lines import MAX_LINE_LENGTH
from datapipes.iter.io.tfrecord import MAX_RECORD_SIZE
from datapipes.utils.decoder import Decoder, basichandlers, imagehandler

from helpers import NonSeekable, ld, masked, tfrecord, varint

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def notes(e):
    return getattr(e, "__notes__", [])


def shown(e):
    """What a traceback shows of ``e``: its message and its notes."""
    return "\n".join([str(e), *notes(e)])


def pairs(contents, text=False):
    """``(name, stream)`` pairs of in-memory files (text streams with ``text=True``)."""
    wrap = (lambda b: io.StringIO(b.decode("utf-8"), newline="")) if text else io.BytesIO
    return IterableWrapper(list(contents)).map(lambda n: (n, wrap(contents[n])))


def on_disk(tmp_path, contents):
    for name, data in contents.items():
        (tmp_path / name).write_bytes(data)
    return IterableWrapper([str(tmp_path / name) for name in contents])


def peak_of(fn):
    """``(what fn returned or raised, the peak of Python's allocations while it ran)``."""
    tracemalloc.start()
    try:
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - the caller looks at it
            out = e
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# -- 2. pickles are opt-in -------------------------------------------------------------------------


class Trap:
    """Unpickling this creates the folder ``path``: code from the data ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


class TestPickleIsOptIn:
    @pytest.mark.parametrize("name", ["sample.pyd", "sample.pickle"])
    def test_routed_decode_refuses_a_pickle_by_default(self, tmp_path, name):
        trap = tmp_path / "ran"
        pipe = IterableWrapper([(name, io.BytesIO(pickle.dumps(Trap(trap))))]).routed_decode()
        with pytest.raises(ValueError, match="allow_pickle=True") as info:
            list(pipe)
        assert not trap.exists()
        text = shown(info.value)
        assert name in text and "runs whatever code" in text
        assert "[datapipes] raised in stage RoutedDecoder at file 'sample." in text

    def test_routed_decode_opt_in(self, tmp_path):
        files = [("a.pyd", pickle.dumps({"k": (1, 2)})), ("b.cls", b"3"), ("c.pickle", pickle.dumps([1]))]
        pipe = IterableWrapper(files).routed_decode(allow_pickle=True)
        assert list(pipe) == [("a.pyd", {"k": (1, 2)}), ("b.cls", 3), ("c.pickle", [1])]
        assert RoutedDecoder(IterableWrapper([]), allow_pickle=True).decoder.allow_pickle
        # handlers of your own: basichandlers among them unpickles only when allowed
        mine = IterableWrapper(files[:1]).routed_decode(basichandlers, allow_pickle=True)
        assert list(mine) == [("a.pyd", {"k": (1, 2)})]
        with pytest.raises(ValueError, match="allow_pickle"):
            list(IterableWrapper(files[:1]).routed_decode(basichandlers, imagehandler("pil")))

    def test_allow_pickle_must_be_a_bool(self):
        with pytest.raises(TypeError, match="allow_pickle must be a bool"):
            IterableWrapper([]).routed_decode(allow_pickle="yes")
        with pytest.raises(TypeError, match="allow_pickle must be a bool"):
            Decoder(basichandlers, allow_pickle=1)

    def test_decoder_names_the_key(self, tmp_path):
        trap = tmp_path / "ran"
        with pytest.raises(ValueError, match="allow_pickle=True") as info:
            Decoder(basichandlers)({"000001.pyd": pickle.dumps(Trap(trap)), "000001.cls": b"1"})
        assert not trap.exists()
        assert "'000001.pyd'" in shown(info.value)
        assert Decoder(basichandlers, allow_pickle=True)({"x.pyd": pickle.dumps(7)}) == {"x.pyd": 7}

    def test_basichandlers(self, tmp_path):
        trap = tmp_path / "ran"
        with pytest.raises(ValueError, match=r"\.pyd.*allow_pickle=True"):
            basichandlers("pyd", pickle.dumps(Trap(trap)))
        assert not trap.exists()
        assert basichandlers("pickle", pickle.dumps("ok"), allow_pickle=True) == "ok"

    def test_pt_is_read_weights_only(self, tmp_path):
        trap = tmp_path / "ran"
        buf = io.BytesIO()
        torch.save({"t": torch.arange(3), "x": Trap(trap)}, buf)
        with pytest.raises(Exception, match="(?i)weights"):
            list(IterableWrapper([("m.pt", buf.getvalue())]).routed_decode())
        assert not trap.exists()
        buf = io.BytesIO()
        torch.save({"t": torch.arange(3)}, buf)
        [(_, got)] = list(IterableWrapper([("m.pt", buf.getvalue())]).routed_decode())
        assert torch.equal(got["t"], torch.arange(3))

    def test_webdataset_members(self, tmp_path):
        import tarfile

        trap = tmp_path / "ran"
        shard = tmp_path / "shard.tar"
        with tarfile.open(shard, "w") as tar:
            for name, data in (("0001.cls", b"1"), ("0001.pyd", pickle.dumps(Trap(trap)))):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        pipe = IterableWrapper([str(shard)]).open_files(mode="b").load_from_tar().routed_decode()
        with pytest.raises(ValueError, match="allow_pickle=True") as info:
            list(pipe)
        assert not trap.exists() and "0001.pyd" in shown(info.value)


# -- 6. line length and JSON size ------------------------------------------------------------------


def long_line_gz(n, head=b"short\n", tail=b"\nafter\n"):
    """A gzip of ``head``, one line of ``n`` bytes ``x``, then ``tail``: a few KiB for MiBs of line."""
    return gzip.compress(head + b"x" * n + tail, compresslevel=9)


class TestLineLength:
    LIMIT = 64 * KiB

    def gz_pipe(self, tmp_path, **contents):
        return on_disk(tmp_path, contents).open_files(mode="b").decompress()

    @pytest.mark.parametrize("kind", ["bytes", "decoded", "strict", "csv", "csv-strict"])
    def test_a_long_line_is_refused(self, tmp_path, kind):
        files = self.gz_pipe(tmp_path, **{"big.txt.gz": long_line_gz(4 * MiB)})
        pipe = {
            "bytes": lambda: files.readlines(max_line_length=self.LIMIT),
            "decoded": lambda: files.readlines(decode=True, max_line_length=self.LIMIT),
            "strict": lambda: files.readlines(decode=True, errors="strict", max_line_length=self.LIMIT),
            "csv": lambda: files.parse_csv(max_line_length=self.LIMIT),
            "csv-strict": lambda: files.parse_csv(errors="strict", max_line_length=self.LIMIT),
        }[kind]()
        it = iter(pipe)
        first = next(it)
        with pytest.raises(SizeLimitError) as info:
            next(it)
        text = shown(info.value)
        assert "big.txt.gz" in text and "max_line_length=65,536" in text, text
        assert "line 2" in text, text  # the note names the line
        assert first[-1] in (b"short", "short") or first == ["short"]

    def test_memory_stays_near_the_limit(self, tmp_path):
        files = self.gz_pipe(tmp_path, **{"big.txt.gz": long_line_gz(8 * MiB)})
        for make in (lambda: files.readlines(decode=True, max_line_length=self.LIMIT),
                     lambda: files.parse_csv(max_line_length=self.LIMIT)):
            err, peak = peak_of(lambda: list(make()))
            assert isinstance(err, SizeLimitError), err
            assert peak < 2 * MiB, peak

    def test_the_default_limit(self, tmp_path):
        assert MAX_LINE_LENGTH == 64 * MiB
        # 100 MiB of one line, gzip'd to ~100 KiB: read up to the default limit, not to its end
        files = self.gz_pipe(tmp_path, **{"bomb.gz": gzip.compress(b"\0" * (100 * MiB), compresslevel=9)})
        err, peak = peak_of(lambda: list(files.readlines()))
        assert isinstance(err, SizeLimitError) and "max_line_length=67,108,864" in str(err), err
        assert peak < 100 * MiB, peak

    def test_text_streams(self, tmp_path):
        data = b"a\n" + b"y" * (256 * KiB) + b"\nb\n"
        files = on_disk(tmp_path, {"t.txt": data}).open_files(mode="r", encoding="utf-8")
        for pipe in (files.readlines(max_line_length=self.LIMIT), files.parse_csv(max_line_length=self.LIMIT)):
            with pytest.raises(SizeLimitError) as info:
                list(pipe)
            assert "t.txt" in shown(info.value) and "max_line_length=65,536" in str(info.value)
            assert "line 2" in shown(info.value)
        with pytest.raises(SizeLimitError, match="max_line_length=65,536"):
            list(pairs({"s.txt": data}, text=True).readlines(max_line_length=self.LIMIT))

    def test_utf16(self):
        data = ("a\n" + "z" * 40_000 + "\n").encode("utf-16")
        with pytest.raises(SizeLimitError, match="max_line_length=1,000"):
            list(pairs({"u.txt": data}).readlines(decode=True, encoding="utf-16", max_line_length=1000))
        assert len(list(pairs({"u.txt": data}).readlines(decode=True, encoding="utf-16"))) == 2

    @pytest.mark.parametrize("decode, errors", [(False, "ignore"), (True, "ignore"), (True, "strict")])
    def test_the_limit_counts_the_line_ending(self, decode, errors):
        limit = 10
        ok = b"123456789\n" * 3 + b"1234567890"  # 10 bytes with "\n"; the last one ends the file
        got = list(pairs({"a": ok}).readlines(decode=decode, errors=errors, max_line_length=limit, return_path=False))
        assert len(got) == 4
        for bad in (b"1234567890\n", b"ok\n12345678901"):
            with pytest.raises(SizeLimitError):
                list(pairs({"a": bad}).readlines(decode=decode, errors=errors, max_line_length=limit))

    def test_many_short_lines_pass(self):
        data = b"".join(b"%d,x\r\n" % i for i in range(20_000))
        assert len(list(pairs({"a.csv": data}).parse_csv(max_line_length=16))) == 20_000
        assert len(list(pairs({"a.txt": data}).readlines(max_line_length=16))) == 20_000
        # classic Mac line endings: CSV (newline="") ends its lines at "\r" too
        mac = b"".join(b"%d,x\r" % i for i in range(20_000))
        assert len(list(pairs({"m.csv": mac}).parse_csv(max_line_length=16))) == 20_000

    def test_skip_drops_the_rest_of_the_file(self):
        data = {"a.txt": b"one\n" + b"x" * 5000 + b"\nnever\n", "b.txt": b"two\n"}
        pipe = pairs(data).readlines(max_line_length=1000, on_error="skip", return_path=False)
        assert list(pipe) == [b"one", b"two"]
        assert pipe.failures.count == 1
        assert isinstance(pipe.failures.recent[0].exception, SizeLimitError)
        pipe = pairs({"a.csv": data["a.txt"], "b.csv": b"2\n"}).parse_csv(max_line_length=1000, on_error="skip")
        assert list(pipe) == [["one"], ["2"]] and pipe.failures.count == 1

    def test_same_lines_as_without_a_limit(self, tmp_path):
        # the measured splitting gives exactly the lines of the unmeasured one, across block edges
        rng = random.Random(0)
        endings = ["\n", "\r\n", "\r", ""]
        text = "".join("".join(rng.choice("ab,é\"") for _ in range(rng.choice([0, 1, 5, 80, 3000])))
                       + rng.choice(endings) for _ in range(2000))
        data = text.encode("utf-8")
        longest = max(len(line) for line in data.splitlines(keepends=True))
        files = on_disk(tmp_path, {"r.txt": data})
        makers = {
            "bytes": lambda p, **kw: p.open_files(mode="b").readlines(strip_newline=False, **kw),
            "decoded": lambda p, **kw: p.open_files(mode="b").readlines(decode=True, strip_newline=False, **kw),
            "strict": lambda p, **kw: p.open_files(mode="b").readlines(decode=True, errors="strict", **kw),
            "text": lambda p, **kw: p.open_files(mode="r", encoding="utf-8").readlines(strip_newline=False, **kw),
            "csv": lambda p, **kw: p.open_files(mode="b").parse_csv(**kw),
            "csv-text": lambda p, **kw: p.open_files(mode="r", encoding="utf-8").parse_csv(**kw),
        }
        for name, make in makers.items():
            expected = list(make(files, max_line_length=None))
            assert len(expected) > 500, name
            for limit in (MAX_LINE_LENGTH, 2 * longest):
                assert list(make(files, max_line_length=limit)) == expected, (name, limit)

    def test_text_stream_with_other_newlines(self, tmp_path):
        # newline="\n" splits at "\n" only: measured line by line ("\r" is not a line ending there)
        data = b"a\rb\n" + b"c\r" * 1000 + b"\n"
        (tmp_path / "n.txt").write_bytes(data)
        def opened():
            return IterableWrapper([str(tmp_path / "n.txt")]).map(lambda p: (p, open(p, newline="\n")))  # noqa: SIM115
        got = [x for _, x in opened().readlines(strip_newline=False, max_line_length=3000)]
        assert got == ["a\rb\n", "c\r" * 1000 + "\n"]
        with pytest.raises(SizeLimitError, match="max_line_length=1,000 characters"):
            list(opened().readlines(max_line_length=1000))

    def test_no_limit(self):
        data = {"a.txt": b"x" * 100_000 + b"\n"}
        assert len(list(pairs(data).readlines(max_line_length=None))[0][1]) == 100_000
        assert len(list(pairs(data).readlines())[0][1]) == 100_000  # under the default

    @pytest.mark.parametrize("bad", [0, -1, 1.5, "1"])
    def test_bad_limits(self, bad):
        for make in (lambda: IterableWrapper([]).readlines(max_line_length=bad),
                     lambda: IterableWrapper([]).parse_csv(max_line_length=bad),
                     lambda: IterableWrapper([]).parse_csv_as_dict(max_line_length=bad)):
            with pytest.raises((TypeError, ValueError), match="max_line_length must be"):
                make()

    def test_resume_inside_a_file(self):
        data = {"a.txt": b"".join(b"line %d\n" % i for i in range(50))}
        pipe = pairs(data).readlines(max_line_length=100, return_path=False)
        it = iter(pipe)
        head = [next(it) for _ in range(20)]
        state = it.state_dict()
        it.close()
        it = iter(pipe)
        it.load_state_dict(state)
        assert head + list(it) == list(pipe)


class TestJsonSize:
    def test_a_big_file_is_refused(self, tmp_path):
        body = b"[" + b"0," * (2 * MiB) + b"0]"
        files = on_disk(tmp_path, {"big.json.gz": gzip.compress(body, compresslevel=9),
                                   "ok.json.gz": gzip.compress(b"[1]")})
        pipe = files.open_files(mode="b").decompress().parse_json_files(max_size=64 * KiB)
        err, peak = peak_of(lambda: list(pipe))
        assert isinstance(err, SizeLimitError), err
        text = shown(err)
        assert "big.json.gz" in text and "max_size=65,536" in text, text
        assert peak < 2 * MiB, peak
        skipping = files.open_files(mode="b").decompress().parse_json_files(max_size=64 * KiB, on_error="skip")
        assert [os.path.basename(p) for p, _ in skipping] == ["ok.json.gz"] and skipping.failures.count == 1

    def test_text_streams_and_the_boundary(self):
        doc = json.dumps({"k": "v" * 100}).encode()
        assert list(pairs({"a.json": doc}).parse_json_files(max_size=len(doc))) == [("a.json", json.loads(doc))]
        with pytest.raises(SizeLimitError, match=f"max_size={len(doc) - 1}"):
            list(pairs({"a.json": doc}).parse_json_files(max_size=len(doc) - 1))
        with pytest.raises(SizeLimitError, match="max_size=10"):
            list(pairs({"t.json": doc}, text=True).parse_json_files(max_size=10))

    def test_default_and_arguments(self):
        assert MAX_JSON_SIZE == GiB
        assert list(pairs({"a.json": b"[1]"}).parse_json_files(max_size=None)) == [("a.json", [1])]
        for bad in (0, -5, 2.5, "big"):
            with pytest.raises((TypeError, ValueError), match="max_size must be"):
                IterableWrapper([]).parse_json_files(max_size=bad)

    def test_deep_json_names_the_file(self):
        # what held already: a RecursionError (or the decoder's own error), named
        with pytest.raises((RecursionError, ValueError)) as info:
            list(pairs({"ok.json": b"1", "deep.json": b"[" * 200_000}).parse_json_files())
        assert any("deep.json" in n for n in notes(info.value)), notes(info.value)


# -- 7. TFRecord record sizes ----------------------------------------------------------------------


def header(length):
    """A TFRecord record header claiming ``length`` bytes, its CRC valid."""
    size = struct.pack("<Q", length)
    return size + struct.pack("<I", masked(size))


def example(value):
    feature = ld(3, ld(1, varint(value)))
    return ld(1, ld(1, ld(1, b"v") + ld(2, feature)))


HUGE_CLAIM = textwrap.dedent("""
    import io, resource, struct, sys
    sys.path.insert(0, sys.argv[1])
    from helpers import masked
    from datapipes.iter import IterableWrapper
    # what this process has mapped, plus 2 GiB: a 16 GiB allocation fails at once
    vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) << 10
    resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), vm + (2 << 30)))
    size = struct.pack("<Q", 16 << 30)
    data = size + struct.pack("<I", masked(size)) + b"abcd"  # 16 bytes claiming 16 GiB
    try:
        list(IterableWrapper([("claims.tfrecord", io.BytesIO(data))]).load_from_tfrecord())
    except BaseException as e:
        print(type(e).__name__)
        print(str(e))
        print("\\n".join(getattr(e, "__notes__", [])))
""")


class TestTFRecordSizes:
    def test_16_gib_claim_in_16_bytes(self):
        tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        out = subprocess.run([sys.executable, "-c", HUGE_CLAIM, tests], capture_output=True, text=True, timeout=120,
                             cwd=os.path.dirname(tests))
        lines = out.stdout.splitlines()
        assert lines and lines[0] == "RuntimeError", out.stdout + out.stderr
        text = "\n".join(lines[1:])
        assert "claims.tfrecord" in text and "17,179,869,184" in text and "byte 0" in text and "4 bytes" in text, text

    def test_claim_past_the_end_of_a_file(self, tmp_path):
        good = tfrecord(example(1), example(2))
        (tmp_path / "a.tfrecord").write_bytes(good + header(1 << 40) + b"tail")
        pipe = IterableWrapper([str(tmp_path / "a.tfrecord")]).open_files(mode="b").load_from_tfrecord()
        it = iter(pipe)
        assert [int(next(it)["v"]) for _ in range(2)] == [1, 2]
        with pytest.raises(RuntimeError, match="Invalid tfrecord file") as info:
            next(it)
        text = shown(info.value)
        assert "a.tfrecord" in text and f"byte {len(good):,}" in text and "1,099,511,627,776" in text
        assert "record 2" in text and "4 bytes" in text

    def test_unseekable_stream_reads_in_chunks(self):
        # a claim under the limit on a stream of unknown size: only what arrives is held
        data = header(512 * MiB) + b"x" * 1000
        err, peak = peak_of(lambda: list(IterableWrapper([("p", NonSeekable(data))]).load_from_tfrecord()))
        assert isinstance(err, RuntimeError) and "failed to read the record" in str(err), err
        assert peak < 32 * MiB, peak

    def test_max_record_size(self):
        assert MAX_RECORD_SIZE == GiB
        data = header(16 << 30) + b"x" * 100
        with pytest.raises(SizeLimitError) as info:
            list(IterableWrapper([("p.tfrecord", NonSeekable(data))]).load_from_tfrecord())
        text = shown(info.value)
        assert "p.tfrecord" in text and "max_record_size=1,073,741,824" in text and "17,179,869,184" in text
        record = example(3) + b"\0" * 5000
        data = gzip.compress(tfrecord(example(1), record))
        pipe = IterableWrapper([("r.tfrecord.gz", io.BytesIO(data))]).decompress()
        with pytest.raises(SizeLimitError, match="max_record_size=1,000") as info:
            list(pipe.load_from_tfrecord(max_record_size=1000))
        assert "record 1" in shown(info.value)
        assert len(list(pipe.load_from_tfrecord(max_record_size=len(record)))) == 2
        assert len(list(pipe.load_from_tfrecord(max_record_size=None))) == 2
        for bad in (0, -1, 1.5):
            with pytest.raises((TypeError, ValueError), match="max_record_size must be"):
                IterableWrapper([]).load_from_tfrecord(max_record_size=bad)

    @pytest.mark.slow
    def test_big_records_still_read(self, tmp_path):
        records = [example(1) + b"\0" * (3 * MiB), example(2)]
        (tmp_path / "b.tfrecord").write_bytes(tfrecord(*records))
        for pipe in (IterableWrapper([str(tmp_path / "b.tfrecord")]).open_files(mode="b"),
                     IterableWrapper([("u", NonSeekable(tfrecord(*records)))])):
            assert [int(x["v"]) for x in pipe.load_from_tfrecord(length_check=False)] == [1, 2]

    def test_truncated_file_names_file_and_record(self):
        # what held already
        data = tfrecord(example(1), example(2))
        with pytest.raises(RuntimeError, match="failed to read the record") as info:
            list(IterableWrapper([("cut.tfrecord", io.BytesIO(data[:-10]))]).load_from_tfrecord())
        assert "[datapipes] raised in stage TFRecordLoader at file 'cut.tfrecord', record 1" in notes(info.value)


# -- 11. invalid UTF-8 under the default errors ----------------------------------------------------


class TestDroppedBytes:
    DATA = {"latin.csv": "name,ville\nZoë,Besançon\n".encode("latin-1"), "clean.csv": b"a,b\n",
            "bad.csv": b"\xff\xfe,x\n"}

    def caught(self, make):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = list(make())
        return out, [str(w.message) for w in caught if issubclass(w.category, UnicodeWarning)]

    @pytest.mark.parametrize("reader", ["parse_csv", "readlines"])
    def test_counted_and_warned_once_per_file(self, reader):
        kwargs = {"decode": True} if reader == "readlines" else {}
        out, messages = self.caught(lambda: getattr(pairs(self.DATA), reader)(**kwargs))
        assert len(messages) == 2, messages
        assert "'latin.csv'" in messages[0] and "2 bytes" in messages[0] and "utf-8" in messages[0]
        assert "'bad.csv'" in messages[1] and "2 bytes" in messages[1]
        assert "errors=" in messages[0]
        # the rows are torchdata's: the bad bytes dropped
        if reader == "parse_csv":
            assert out[1] == ["Zo", "Besanon"] and out[-1] == ["", "x"]

    def test_explicit_errors_stay_silent(self):
        for errors in ("ignore", "replace"):
            _, messages = self.caught(lambda: pairs(self.DATA).parse_csv(errors=errors))
            assert messages == []
        _, messages = self.caught(lambda: pairs({"c.csv": b"a,b\n"}).parse_csv())
        assert messages == []

    def test_strict_names_file_and_line(self):
        with pytest.raises(UnicodeDecodeError) as info:
            list(pairs(self.DATA).parse_csv(errors="strict"))
        assert "[datapipes] raised in stage CSVParser at file 'latin.csv', line 2" in notes(info.value)

    def test_dict_and_files_parsers(self):
        _, messages = self.caught(lambda: pairs(self.DATA).parse_csv_as_dict())
        assert len(messages) == 2
        _, messages = self.caught(lambda: pairs(self.DATA).parse_csv_files())
        assert len(messages) == 2

    def test_counting_handlers_are_reused(self):
        from datapipes.iter.io import lines

        data = {f"f{i}.txt": b"ok\n\xff\n" for i in range(50)}
        before = lines._MADE[0]
        _, messages = self.caught(lambda: pairs(data).readlines(decode=True))
        assert len(messages) == 50 and lines._MADE[0] - before <= 1

    def test_a_pass_closed_early_warns_what_it_counted(self):
        data = {"a.txt": b"\xff\n" + b"ok\n" * 10}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            it = iter(pairs(data).readlines(decode=True))
            next(it)
            it.close()
        assert [str(w.message) for w in caught if issubclass(w.category, UnicodeWarning)][0].count("1 byte") == 1


# -- what held already: Parquet ---------------------------------------------------------------------


class TestParquet:
    def test_truncated_parquet_names_the_file(self, tmp_path):
        pa = pytest.importorskip("pyarrow")
        pq = pytest.importorskip("pyarrow.parquet")
        path = tmp_path / "t.parquet"
        pq.write_table(pa.table({"x": list(range(1000))}), path)
        data = path.read_bytes()
        (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
        pipe = IterableWrapper([str(tmp_path / "cut.parquet")]).load_parquet_as_df()
        with pytest.raises(Exception) as info:  # noqa: B017 - pyarrow's own error type
            list(pipe)
        assert any("cut.parquet" in n for n in notes(info.value)), shown(info.value)
