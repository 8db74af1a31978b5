"""Network reads against a server that does not play fair (docs/howto/remote.rst, "HTTP"): bodies
over the limit, a Content-Length that lies, a server that stalls, MemoryError, redirects to
``file://``, and secrets in URLs kept out of everything the library prints (``datapipes._redact``).

Every server here is a local ``http.server`` on 127.0.0.1 started by the test (the ``hostile``
fixture), whose routes misbehave on purpose.
"""

from __future__ import annotations

import base64
import http.server
import io
import json
import logging
import threading
import time
import traceback
import warnings
from typing import Any, Iterator

import pytest

from datapipes.iter import FSSpecFileLister, FSSpecFileOpener, HttpReader, IterableWrapper, OnlineReader
from datapipes.iter import remote

aiohttp = pytest.importorskip("aiohttp")

PASSWORD = "hunter2pw"
SIGNATURE = "SIGabc123secret"
CREDENTIAL = "AKIAEXAMPLECRED"
SECRETS = (PASSWORD, SIGNATURE, CREDENTIAL, base64.b64encode(f"user:{PASSWORD}".encode()).decode())


class _Routes(http.server.BaseHTTPRequestHandler):
    """``/ok`` (a small body), ``/declared?n=N`` (Content-Length N, N bytes), ``/chunked?n=N`` (N
    bytes, chunked, no length), ``/short`` (claims 5000 bytes, sends 100, closes), ``/long`` (claims
    10 bytes, sends 5000), ``/stall`` (headers, then nothing), ``/silent`` (nothing, not even
    headers), ``/redirect-file`` (302 to a
    ``file://`` URL), ``/status/N`` (that status, no body)."""

    protocol_version = "HTTP/1.1"
    stall: threading.Event
    target: str
    gets: list[str]
    timeout = 10

    def _head(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path, _, query = self.path.partition("?")
        self.gets.append(path)
        n = int(query.split("n=", 1)[1].split("&", 1)[0]) if "n=" in query else 0
        if path == "/ok":
            self._head(200, {"Content-Length": "5"})
            self.wfile.write(b"hello")
        elif path == "/declared":
            self._head(200, {"Content-Length": str(n)})
            try:
                self.wfile.write(b"x" * n)
            except OSError:
                pass  # the client hung up, as it should
        elif path == "/chunked":
            self._head(200, {"Transfer-Encoding": "chunked"})
            try:
                for start in range(0, n, 1000):
                    part = b"y" * min(1000, n - start)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass
        elif path == "/short":
            self._head(200, {"Content-Length": "5000"})
            self.wfile.write(b"s" * 100)
        elif path == "/long":
            self._head(200, {"Content-Length": "10"})
            self.wfile.write(b"L" * 5000)
        elif path == "/stall":
            self._head(200, {"Content-Length": "100"})
            self.wfile.flush()
            self.stall.wait(20)
        elif path == "/silent":
            self.stall.wait(20)
            self.close_connection = True
        elif path == "/redirect-file":
            self._head(302, {"Location": self.target, "Content-Length": "0"})
        elif path.startswith("/status/"):
            self._head(int(path.rsplit("/", 1)[1]), {"Content-Length": "0"})
        else:
            self._head(404, {"Content-Length": "0"})

    def log_message(self, *args: Any) -> None:
        pass


class _Hostile:
    def __init__(self, target: str) -> None:
        self.stall = threading.Event()
        self.gets: list[str] = []
        handler = type("Routes", (_Routes,), {"stall": self.stall, "target": target, "gets": self.gets})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = False
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def secret_url(self, path: str) -> str:
        """``path`` on this server, with credentials and a signed URL's parameters."""
        return (f"http://user:{PASSWORD}@127.0.0.1:{self.port}{path}?X-Amz-Signature={SIGNATURE}"
                f"&X-Amz-Credential={CREDENTIAL}&part=3")

    def close(self) -> None:
        self.stall.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def hostile(tmp_path) -> Iterator[_Hostile]:
    import fsspec.asyn

    fsspec.asyn.get_loop()  # fsspec's I/O thread lives as long as the process
    local = tmp_path / "local-secret.txt"
    local.write_bytes(b"a local file")
    server = _Hostile(f"file://{local}")
    try:
        yield server
    finally:
        server.close()


def _read_all(pipe: Any) -> list[bytes]:
    return [stream.read() for _, stream in pipe]


# -- 8. a body limit; MemoryError is never retried; a short body is never silent ---------------------


class TestBodyLimit:
    def test_the_default_limit_is_finite_and_documented(self):
        from datapipes.iter.io.http import MAX_SIZE

        pipe = HttpReader(IterableWrapper([]))
        assert pipe.max_size == MAX_SIZE and 2**30 <= MAX_SIZE < 2**40
        assert "max_size" in HttpReader.__doc__ and OnlineReader(IterableWrapper([])).max_size == MAX_SIZE
        with pytest.raises(TypeError, match="max_size"):
            HttpReader(IterableWrapper([]), max_size="1")
        with pytest.raises(ValueError, match="max_size"):
            HttpReader(IterableWrapper([]), max_size=0)

    def test_a_declared_length_over_the_limit_fails_at_open(self, hostile):
        from datapipes.errors import SizeLimitError

        url = hostile.url("/declared?n=50000")
        with pytest.raises(SizeLimitError) as info:
            list(IterableWrapper([url]).read_from_http(max_size=1000, retries=0))
        message = str(info.value)
        assert "max_size=1000" in message and "50000" in message and url in message
        assert "HttpReader" in message
        assert isinstance(info.value, ValueError)

    def test_over_the_limit_is_skipped_under_skip_on_error(self, hostile):
        from datapipes.errors import SizeLimitError

        pipe = IterableWrapper([hostile.url("/declared?n=50000"), hostile.url("/ok")]).read_from_http(
            max_size=1000, skip_on_error=True)
        with pytest.warns(UserWarning, match="max_size=1000.*skipping"):
            assert _read_all(pipe) == [b"hello"]
        assert isinstance(pipe.failures.recent[0].exception, SizeLimitError)

    def test_a_body_without_length_is_checked_as_it_is_read(self, hostile):
        from datapipes.errors import SizeLimitError

        url = hostile.url("/chunked?n=50000")
        (_, stream), = list(IterableWrapper([url]).read_from_http(max_size=1000, retries=0))
        with pytest.raises(SizeLimitError) as info:
            stream.read()
        assert "max_size=1000" in str(info.value) and url in str(info.value)
        stream.close()
        # read in pieces: the same
        (_, stream), = list(IterableWrapper([url]).read_from_http(max_size=1000, retries=0))
        with pytest.raises(SizeLimitError):
            while stream.read(300):
                pass
        stream.close()

    def test_within_the_limit_reads_whole(self, hostile):
        assert _read_all(IterableWrapper([hostile.url("/chunked?n=5000")]).read_from_http(max_size=5000)) == [b"y" * 5000]
        assert _read_all(IterableWrapper([hostile.url("/declared?n=5000")]).read_from_http(max_size=5000)) == [b"x" * 5000]
        assert _read_all(IterableWrapper([hostile.url("/ok")]).read_from_http(max_size=None)) == [b"hello"]

    def test_a_body_longer_than_its_length_gives_only_its_length(self, hostile):
        # HTTP frames the body by Content-Length: the bytes after it are not the body. aiohttp
        # refuses them where they arrive with the body ("Data after Connection: close")
        url = hostile.url("/long")
        try:
            out = _read_all(IterableWrapper([url]).read_from_http(retries=0))
        except Exception as e:  # noqa: BLE001 - either outcome is right; a longer body is not
            assert url in "\n".join(getattr(e, "__notes__", [])), type(e)
        else:
            assert out == [b"L" * 10]

    def test_a_body_shorter_than_its_length_raises(self, hostile):
        with pytest.raises(Exception) as info:
            _read_all(IterableWrapper([hostile.url("/short")]).read_from_http(retries=1, backoff=0))
        assert hostile.url("/short") in "\n".join(info.value.__notes__)

    def test_a_silent_short_read_is_an_error(self):
        # a stream that ends early without an error from the client library (seen under memory
        # pressure): the Content-Length check catches it
        from datapipes.iter.io.http import _HttpBody

        fs = _FakeFs(b"0123456789", content_length=100)
        body = _HttpBody(fs, "http://h/x", {}, 0, 0.0, None, "HttpReader")
        with pytest.raises(EOFError, match="ended after 10 bytes.*Content-Length of 100"):
            io.BufferedReader(body).read()

    def test_memory_error_is_never_transient(self):
        assert not remote._is_transient(MemoryError())
        payload = aiohttp.ClientPayloadError("Response payload is not completed")
        assert remote._is_transient(payload)  # a body cut short: retried
        payload.__cause__ = MemoryError()
        assert not remote._is_transient(payload)
        wrapped = OSError("read failed")
        wrapped.__context__ = MemoryError()
        assert not remote._is_transient(wrapped)

    def test_memory_error_is_not_retried_mid_body(self):
        fs = _FakeFs(b"x" * 1000, fail=_memory_payload_error)
        reader = remote._RetryingReader(fs, "mem://x", "mem://x", {}, 3, 0.0)
        with pytest.raises(aiohttp.ClientPayloadError):
            reader.read(10)
        assert fs.opens == 1


def _memory_payload_error() -> BaseException:
    e = aiohttp.ClientPayloadError("Response payload is not completed")
    e.__cause__ = MemoryError()
    return e


class _FakeResponse:
    def __init__(self, content_length: int | None) -> None:
        self.headers = {} if content_length is None else {"Content-Length": str(content_length)}


class _FakeFile:
    def __init__(self, data: bytes, content_length: int | None, fail: Any) -> None:
        self._data = io.BytesIO(data)
        self.r = _FakeResponse(content_length)
        self._fail = fail

    def read(self, n: int = -1) -> bytes:
        if self._fail is not None:
            raise self._fail()
        return self._data.read(n)

    def seek(self, *args: Any) -> None:
        raise ValueError("cannot seek")

    def close(self) -> None:
        pass


class _FakeFs:
    def __init__(self, data: bytes, content_length: int | None = None, fail: Any = None) -> None:
        self.data, self.content_length, self.fail, self.opens = data, content_length, fail, 0

    def open(self, path: str, mode: str, **kw: Any) -> _FakeFile:
        self.opens += 1
        return _FakeFile(self.data, self.content_length, self.fail)


# -- 13. finite default timeouts ---------------------------------------------------------------------


class TestTimeouts:
    @pytest.mark.parametrize("cls", [HttpReader, OnlineReader])
    def test_the_default_timeout_is_finite(self, cls):
        from datapipes.iter.io.http import _client_timeout

        t = _client_timeout(cls(IterableWrapper([])).timeout)
        assert t.sock_connect is not None and 0 < t.sock_connect <= 120
        assert t.sock_read is not None and 0 < t.sock_read <= 300
        assert t.total is None  # a large download may take as long as it takes

    def test_none_still_means_no_limit(self):
        from datapipes.iter.io.http import _client_timeout

        t = _client_timeout(HttpReader(IterableWrapper([]), timeout=None).timeout)
        assert (t.total, t.sock_connect, t.sock_read) == (None, None, None)

    @pytest.mark.parametrize("path", ["/stall", "/silent"])
    def test_a_stalled_server_times_out_naming_the_url(self, hostile, path):
        url = hostile.url(path)
        start = time.monotonic()
        with pytest.raises(Exception) as info:
            _read_all(IterableWrapper([url]).read_from_http(timeout=(2, 0.5), retries=0))
        assert time.monotonic() - start < 8
        assert isinstance(info.value, (TimeoutError, aiohttp.ServerTimeoutError))
        assert url in "\n".join(info.value.__notes__)


# -- what holds already: redirects to file:// are refused --------------------------------------------


def test_a_redirect_to_a_local_file_is_refused(hostile):
    with pytest.raises(aiohttp.ClientError) as info:
        _read_all(IterableWrapper([hostile.url("/redirect-file")]).read_from_http(retries=0))
    assert "a local file" not in str(info.value)
    # fsspec's HTTP file system says FileNotFoundError, raised from aiohttp's refusal
    with pytest.raises((aiohttp.ClientError, FileNotFoundError)) as info:
        _read_all(IterableWrapper([hostile.url("/redirect-file")]).open_files_by_fsspec(mode="rb", retries=0))
    assert isinstance(info.value, aiohttp.ClientError) or isinstance(info.value.__cause__, aiohttp.ClientError)


# -- 12. secrets in URLs -----------------------------------------------------------------------------


def _chain_text(exc: BaseException) -> str:
    """Everything an exception shows: its traceback as printed (message, notes, causes and
    contexts), and the repr and notes of each exception in its chain."""
    parts = ["".join(traceback.format_exception(exc))]
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        parts += [str(e), repr(e), repr(e.args), *getattr(e, "__notes__", [])]
        parts += [repr(v) for v in vars(e).values()] if hasattr(e, "__dict__") else []
        todo += [e.__cause__, e.__context__]
    return "\n".join(parts)


def _assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} shown in:\n{text}"


def _opener(kind: str, url: str, **kw: Any) -> Any:
    if kind == "http":
        return IterableWrapper([url]).read_from_http(**kw)
    on_error = {"on_error": "skip"} if kw.pop("skip_on_error", False) else {}
    return IterableWrapper([url]).open_files_by_fsspec(mode="rb", **kw, **on_error)


class TestSecretsInUrls:
    @pytest.mark.parametrize("kind", ["http", "fsspec"])
    @pytest.mark.parametrize("status, retries", [(404, 0), (503, 0), (503, 1), (403, 2)])
    def test_not_in_the_exception(self, hostile, kind, status, retries):
        url = hostile.secret_url(f"/status/{status}")
        pipe = _opener(kind, url, retries=retries, backoff=0)
        with pytest.raises(Exception) as info:
            _read_all(pipe)
        text = _chain_text(info.value)
        _assert_no_secret(text)
        assert "***" in text  # the URL is named, redacted
        if status == 404:
            assert isinstance(info.value, FileNotFoundError)
        elif kind == "http":
            assert isinstance(info.value, aiohttp.ClientResponseError) and info.value.status == status
        _assert_no_secret(repr(pipe))

    def test_the_exception_keeps_its_type_and_status(self, hostile):
        url = hostile.secret_url("/status/503")
        with pytest.raises(aiohttp.ClientResponseError) as info:
            _read_all(IterableWrapper([url]).read_from_http(retries=0))
        e = info.value
        assert e.status == 503 and e.request_info.method == "GET"
        assert e.request_info.url.path == "/status/503" and e.request_info.url.query["part"] == "3"
        assert e.request_info.headers["Authorization"] == "***" and "Host" in e.request_info.headers

    @pytest.mark.parametrize("kind", ["http", "fsspec"])
    def test_not_in_warnings_logs_or_failures_when_skipped(self, hostile, kind, caplog):
        url = hostile.secret_url("/status/503")
        pipe = _opener(kind, url, retries=0, skip_on_error=True)
        with caplog.at_level(logging.WARNING, logger="datapipes"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert _read_all(pipe) == []
        texts = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
        assert texts and any("***" in t for t in texts)
        _assert_no_secret("\n".join(texts))
        _assert_no_secret(_chain_text(pipe.failures.recent[0].exception))

    def test_not_in_a_reader_note_naming_the_file(self, hostile, caplog):
        pipe = IterableWrapper([hostile.secret_url("/ok")]).read_from_http().parse_json_files()
        with pytest.raises(ValueError) as info:
            list(pipe)
        assert any("***" in note for note in info.value.__notes__)
        _assert_no_secret(_chain_text(info.value))
        skipping = IterableWrapper([hostile.secret_url("/ok")]).read_from_http().parse_json_files(on_error="skip")
        with caplog.at_level(logging.WARNING, logger="datapipes"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert list(skipping) == []
        assert caplog.records
        _assert_no_secret("\n".join(r.getMessage() for r in caplog.records))

    def test_a_users_own_exception_is_left_as_raised(self, caplog):
        # the library masks what it writes (notes, log lines), never the user's exception object
        message = f"cannot fetch https://user:{PASSWORD}@h/x"

        def fetch(x):
            raise ValueError(message)

        with pytest.raises(ValueError) as info:
            list(IterableWrapper([1]).map(fetch))
        assert str(info.value) == message
        _assert_no_secret("\n".join(info.value.__notes__))
        with caplog.at_level(logging.WARNING, logger="datapipes"):
            assert list(IterableWrapper([1]).map(fetch, on_error="skip")) == []
        assert any("https://***@h/x" in r.getMessage() for r in caplog.records)
        _assert_no_secret("\n".join(r.getMessage() for r in caplog.records))

    def test_not_in_a_lister_error(self, hostile):
        with pytest.raises(Exception) as info:
            list(FSSpecFileLister(hostile.secret_url("/status/403"), retries=0))
        _assert_no_secret(_chain_text(info.value))

    def test_not_in_a_too_large_body_error(self, hostile):
        from datapipes.errors import SizeLimitError

        with pytest.raises(SizeLimitError) as info:
            _read_all(IterableWrapper([hostile.secret_url("/declared")[:-len("&part=3")] + "&n=5000"])
                      .read_from_http(max_size=1000, retries=0))
        _assert_no_secret(_chain_text(info.value))

    def test_not_in_an_argument_error(self):
        url = f"ftp://user:{PASSWORD}@host/x?sig={SIGNATURE}"
        with pytest.raises(ValueError) as info:
            list(IterableWrapper([url]).read_from_http())
        _assert_no_secret(_chain_text(info.value))
        from datapipes.iter import S3FileLister

        with pytest.raises(ValueError, match="expects s3:// URLs") as info:
            S3FileLister(url)
        _assert_no_secret(_chain_text(info.value))

    def test_not_in_stream_reprs(self, hostile):
        url = hostile.secret_url("/ok")
        for pipe in (IterableWrapper([url]).read_from_http(), FSSpecFileOpener(IterableWrapper([url]), mode="rb")):
            for _, stream in pipe:
                _assert_no_secret(repr(stream.file_obj))
                stream.close()

    def test_not_in_a_profile(self, hostile):
        from datapipes.profiling import profile

        pipe = IterableWrapper([hostile.secret_url("/status/503")]).read_from_http(retries=0, skip_on_error=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = profile(pipe, num_items=None, show=False, trace=True)
        _assert_no_secret(report.table() + report.to_mermaid() + json.dumps(report.trace))

    def test_not_in_a_profile_of_a_stage_labelled_with_a_url(self):
        from datapipes.profiling import profile

        report = profile(_Labelled(IterableWrapper(range(3))), num_items=None, show=False, trace=True)
        text = report.table() + json.dumps(report.trace) + str(report.stages)
        _assert_no_secret(text)
        assert "***" in text


class _Labelled(IterableWrapper):
    """A user's stage that shows a signed URL in its label."""

    _repr_fields = ("url",)

    def __init__(self, source: Any) -> None:
        self.source = source
        self.url = f"https://bucket.example/k?X-Amz-Signature={SIGNATURE}"

    def __iter__(self) -> Iterator[Any]:
        return iter(self.source)

    def __len__(self) -> int:
        return len(self.source)


# -- datapipes._redact.redact ------------------------------------------------------------------------


class TestRedact:
    @pytest.fixture(autouse=True)
    def _redact(self):
        from datapipes._redact import redact

        self.redact = redact

    def test_userinfo(self):
        r = self.redact
        assert r("http://user:pw@host/x") == "http://***@host/x"
        assert r("https://TOKEN@github.com/o/r.git") == "https://***@github.com/o/r.git"
        assert r("s3://key:secret@bucket") == "s3://***@bucket"
        assert r("http://u:p@ss@host:8080") == "http://***@host:8080"
        assert r("http://host/path/@user") == "http://host/path/@user"  # an @ in the path is no userinfo

    @pytest.mark.parametrize("key", [
        "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "x-amz-signature", "sig", "signature",
        "Signature", "token", "access_token", "refresh_token", "Key-Pair-Id", "Policy", "X-Goog-Signature",
        "X-Goog-Credential", "GoogleAccessId", "AWSAccessKeyId", "api_key", "apikey", "key", "password", "secret",
        "client_secret", "SessionToken",
    ])
    def test_each_secret_query_parameter(self, key):
        r = self.redact
        assert r(f"https://h/p?a=1&{key}=S3CR3T&b=2") == f"https://h/p?a=1&{key}=***&b=2"
        assert r(f"https://h/p?{key}=S3CR3T") == f"https://h/p?{key}=***"
        assert r(f"https://h/p#{key}=S3CR3T") == f"https://h/p#{key}=***"

    def test_other_parameters_are_kept(self):
        url = "https://h/p?part=3&X-Amz-Date=20240101T000000Z&X-Amz-Expires=3600&se=2024&sp=r"
        assert self.redact(url) == url

    def test_urls_inside_text(self):
        r = self.redact
        text = ("503, message='Service Unavailable', url='https://u:p@h/a?sig=abc&x=1' "
                "after \"http://h2/b?token=t#frag\" and <ftp://me:pw@h3/c>")
        assert r(text) == ("503, message='Service Unavailable', url='https://***@h/a?sig=***&x=1' "
                           "after \"http://h2/b?token=***#frag\" and <ftp://***@h3/c>")
        assert r("URL('http://a:b@h/x?Signature=q')") == "URL('http://***@h/x?Signature=***')"
        assert r("[datapipes] while opening 'https://h/x?sig=a%2Bb%3D'") == "[datapipes] while opening 'https://h/x?sig=***'"

    def test_several_urls_and_nested_ones(self):
        r = self.redact
        assert r("http://a:1@x http://b:2@y") == "http://***@x http://***@y"
        assert r("simplecache::https://u:p@h/x") == "simplecache::https://***@h/x"
        assert r("https://proxy/?url=https://u:p@h/x?sig=1") == "https://proxy/?url=https://***@h/x?sig=***"

    @pytest.mark.parametrize("text", [
        "", "plain text", "/home/user@host/data?token=x", "a=b&token=c", "user@example.com",
        "see https://example.com/docs.", "file:///tmp/x@y/z", "ratio 3:4 @ 5", "mailto:me@h?token=1",
        "http://", "HttpReader(timeout=30)", "[datapipes] raised in stage Mapper(f) at item 3",
    ])
    def test_no_false_positives(self, text):
        assert self.redact(text) == text

    def test_redact_exception_in_place(self):
        from datapipes._redact import redact_exception

        inner = OSError(2, "No such file", f"https://h/x?sig={SIGNATURE}")
        outer = ValueError(f"cannot read https://user:{PASSWORD}@h/x")
        outer.add_note(f"while reading https://h/x?token={SIGNATURE}")
        outer.held = inner
        outer.__cause__ = KeyError(f"s3://k:{PASSWORD}@b/o")
        group = ExceptionGroup("two", [outer, RuntimeError(f"https://h/y?X-Goog-Signature={SIGNATURE}")])
        assert redact_exception(group) is group
        _assert_no_secret(_chain_text(group) + repr(inner) + str(inner) + "".join(map(_chain_text, group.exceptions)))
        assert inner.errno == 2 and inner.filename == "https://h/x?sig=***" and outer.held is inner
        assert str(outer) == "cannot read https://***@h/x"

    def test_any_object(self):
        assert self.redact(3) == "3"
        assert self.redact(None) == "None"
