"""datapipes.iter.remote and datapipes.iter.s3 against a real S3 server: moto's server mode on
127.0.0.1, in a child process (so that a test can kill it mid-pass and start it again on the same
port), read through s3fs. Listing, reading, resuming in a new process, the server dying mid-pass
(the pass fails naming the file after its retries, or skips) and coming back during the retries
(the pass finishes), and which client-library errors ``remote._is_transient`` retries.

The server tests skip when moto or s3fs is not installed (requirements-test.txt pins them). Each
child server holds its objects before it binds its port, so a server that answers holds them all;
it exits by itself when the test process is gone, and every fixture kills the one it started.
botocore's own retries are turned off (``total_max_attempts=1``): the retries tested are ours.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import pytest

from datapipes.iter import FSSpecFileLister, IterableWrapper
from datapipes.iter.remote import _is_transient
from helpers import import_or_skip

BUCKET = "datapipes-test"
# data/: 4 text files of 3 lines, a binary one and a sub-folder; other/: one more file.
OBJECTS: dict[str, bytes] = {
    **{f"data/part-{i}.txt": b"".join(b"part %d line %d\n" % (i, j) for j in range(3)) for i in range(4)},
    "data/blob.bin": bytes(range(256)) * 16,
    "data/sub/deep.txt": b"deep\n",
    "other/x.txt": b"x\n",
}
DATA = f"s3://{BUCKET}/data"
TEXT_URLS = [f"{DATA}/part-{i}.txt" for i in range(4)]

# The child: moto's server application (as ``python -m moto.server`` builds it), filled through its
# own S3 API in-process, then bound to the port and served; it exits when its parent is gone.
_SERVE = r"""
import base64, json, logging, os, sys, threading, time
port, parent = int(sys.argv[1]), int(sys.argv[2])
os.environ["MOTO_PORT"] = str(port)
logging.getLogger("werkzeug").setLevel(logging.WARNING)
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server
from werkzeug.test import Client

app = DomainDispatcherApplication(create_backend_app)
client = Client(app)
for bucket, objects in json.load(sys.stdin).items():
    assert client.put("/" + bucket, headers={"Host": "127.0.0.1"}).status_code == 200, bucket
    for key, data in objects.items():
        reply = client.put(f"/{bucket}/{key}", data=base64.b64decode(data), headers={"Host": "127.0.0.1"})
        assert reply.status_code == 200, key

def watch():
    deadline = time.monotonic() + 600
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.2)
    os._exit(0)

threading.Thread(target=watch, daemon=True).start()
make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """moto's S3 server in a child process on ``127.0.0.1:port``, holding ``objects`` under
    ``bucket`` from the moment it answers. ``kill()`` kills it at once (connections reset);
    ``start()`` starts it again on the same port, with the same objects."""

    def __init__(self, objects: dict[str, bytes], log_path: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._objects = {BUCKET: {key: base64.b64encode(data).decode() for key, data in objects.items()}}
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        with open(self._log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", _SERVE, str(self.port), str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log,
            )
        self._proc = proc
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(self._objects).encode())
        proc.stdin.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                with open(self._log_path, errors="replace") as log:
                    tail = log.read()[-2000:]
                raise RuntimeError(f"moto's server did not start on port {self.port}:\n{tail}")
            time.sleep(0.05)

    def kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def options(self, **more: Any) -> dict[str, Any]:
        """s3fs's storage options for this server: its endpoint, short timeouts, no botocore retries."""
        config = {"retries": {"total_max_attempts": 1}, "connect_timeout": 2, "read_timeout": 5}
        return {"endpoint_url": self.url, "config_kwargs": config, **more}


def _need_server_packages() -> None:
    import_or_skip("moto", reason="moto (requirements-test-gil.txt) runs the local S3 server")
    import_or_skip("flask", reason="moto's server mode needs flask (requirements-test-gil.txt)")
    import_or_skip("flask_cors", reason="moto's server mode needs flask-cors (requirements-test-gil.txt)")
    import_or_skip("s3fs", reason="s3fs (requirements-test.txt) reads s3:// URLs")


def _forget_s3fs_instances() -> None:
    """Drop fsspec's cached S3 file systems (each holds a client of a server now gone)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


def _running_server(log: str) -> Any:
    """A started server for a fixture to yield; killed (and s3fs's clients of it dropped) after."""
    _need_server_packages()
    server = S3Server(OBJECTS, log)
    try:
        server.start()
        yield server
    finally:
        server.kill()
        _forget_s3fs_instances()


@pytest.fixture(scope="module")
def _shared_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    yield from _running_server(str(tmp_path_factory.mktemp("moto") / "server.log"))


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Credentials and a region for botocore from the environment, for this test only; no profile
    or instance metadata is looked up."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


@pytest.fixture
def s3(_shared_server: S3Server, aws_env: None) -> S3Server:
    """The module's server, which no test kills."""
    return _shared_server


@pytest.fixture
def own_s3(aws_env: None, tmp_path: Any) -> Any:
    """A server of this test's own, to kill and start again; killed at teardown."""
    yield from _running_server(str(tmp_path / "server.log"))


def notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


# -- listing ---------------------------------------------------------------------------------------


def test_lists_a_prefix(s3):
    opts = s3.options()
    assert list(FSSpecFileLister(DATA, **opts)) == [f"{DATA}/blob.bin", *TEXT_URLS]
    assert list(FSSpecFileLister(DATA + "/", masks="part-*", **opts)) == TEXT_URLS
    assert list(FSSpecFileLister(DATA, masks="*.txt", recursive=True, **opts)) == [*TEXT_URLS, f"{DATA}/sub/deep.txt"]
    assert list(FSSpecFileLister(f"{DATA}/part-2.txt", **opts)) == [f"{DATA}/part-2.txt"]
    both = IterableWrapper([DATA, f"s3://{BUCKET}/other"]).list_files_by_fsspec(masks="*.txt", **opts)
    assert list(both) == [*TEXT_URLS, f"s3://{BUCKET}/other/x.txt"]


def test_lists_with_the_s3_pipe(s3):
    opts = s3.options()
    config = {"retries": opts.pop("config_kwargs")["retries"]}
    pipe = IterableWrapper([DATA]).list_files_by_s3(request_timeout_ms=5000, masks="*.txt", config_kwargs=config, **opts)
    assert list(pipe) == [*TEXT_URLS, f"{DATA}/sub/deep.txt"]


def test_a_missing_prefix_is_not_retried(s3):
    start = time.monotonic()
    with pytest.raises(FileNotFoundError) as info:
        list(FSSpecFileLister(f"s3://{BUCKET}/nope", retries=3, backoff=5.0, **s3.options()))
    assert time.monotonic() - start < 4.0  # one retry would have slept 5 s
    assert f"while listing 's3://{BUCKET}/nope'" in notes(info.value)


# -- reading ---------------------------------------------------------------------------------------


def test_reads_the_bytes_of_each_object(s3):
    opts = s3.options()
    urls = FSSpecFileLister(DATA, recursive=True, **opts)
    pairs = urls.open_files_by_fsspec(mode="rb", **opts)
    assert {url: stream.read() for url, stream in pairs} == {
        f"s3://{BUCKET}/{key}": data for key, data in OBJECTS.items() if key.startswith("data/")
    }
    # in small ranged requests, seeking back and forth
    (url, stream), = IterableWrapper([f"{DATA}/blob.bin"]).open_files_by_fsspec(
        mode="rb", kwargs_for_open={"block_size": 512}, **opts
    )
    assert stream.read(1000) == OBJECTS["data/blob.bin"][:1000]
    stream.seek(3000)
    assert stream.read() == OBJECTS["data/blob.bin"][3000:]
    stream.seek(10)
    assert stream.read(5) == OBJECTS["data/blob.bin"][10:15]


def test_reads_text_lines_and_with_the_s3_pipe(s3):
    opts = s3.options()
    lines = FSSpecFileLister(DATA, masks="part-*", **opts).open_files_by_fsspec(mode="r", **opts).readlines(return_path=False)
    assert list(lines) == [f"part {i} line {j}" for i in range(4) for j in range(3)]
    loaded = IterableWrapper(TEXT_URLS[:2]).load_files_by_s3(buffer_size=1024, **opts)
    assert [(url, stream.read()) for url, stream in loaded] == [(u, OBJECTS[u.split("/", 3)[3]]) for u in TEXT_URLS[:2]]


def test_a_missing_object_is_not_retried(s3):
    start = time.monotonic()
    pipe = IterableWrapper([f"{DATA}/nope.txt"]).open_files_by_fsspec(mode="rb", retries=3, backoff=5.0, **s3.options())
    with pytest.raises(FileNotFoundError) as info:
        list(pipe)
    assert time.monotonic() - start < 4.0
    assert f"while opening '{DATA}/nope.txt'" in notes(info.value)


# -- resume in a new process -----------------------------------------------------------------------

# The pipe of the resume test, built the same way in this process and in the new one.
_BUILD = r"""
from datapipes.iter import FSSpecFileLister

def build(options):
    urls = FSSpecFileLister(DATA, masks="part-*", **options)
    return urls.open_files_by_fsspec(mode="rb", **options).readlines(decode=True)
"""

_RESUME = r"""
import json, pickle, sys
it = iter(build(json.loads(sys.argv[2])))
with open(sys.argv[1], "rb") as f:
    it.load_state_dict(pickle.load(f))
print(json.dumps([list(item) for item in it]))
"""


def _build(options: dict[str, Any]) -> Any:
    namespace: dict[str, Any] = {"DATA": DATA}
    exec(_BUILD, namespace)
    return namespace["build"](options)


@pytest.mark.parametrize("k", [5, 6])  # inside a file (its second line), and at a file's end
def test_resumes_in_a_new_process_with_exactly_the_rest(s3, tmp_path, k):
    opts = s3.options()
    everything = [[url, line] for url, line in _build(opts)]
    assert len(everything) == 12
    it = iter(_build(opts))
    first = [[url, line] for url, line in (next(it) for _ in range(k))]
    state = tmp_path / "state.pkl"
    state.write_bytes(pickle.dumps(it.state_dict()))
    del it
    code = f"DATA = {DATA!r}\n" + _BUILD + _RESUME
    child = subprocess.run(
        [sys.executable, "-c", code, str(state), json.dumps(opts)],
        capture_output=True, text=True, timeout=60, cwd=os.getcwd(),
    )
    assert child.returncode == 0, child.stderr[-3000:]
    rest = json.loads(child.stdout)
    assert first == everything[:k]
    assert rest == everything[k:]


# -- the server dies mid-pass ----------------------------------------------------------------------


def test_a_dead_server_fails_the_pass_after_its_retries_naming_the_file(own_s3):
    import botocore.exceptions

    opts = own_s3.options()
    pipe = FSSpecFileLister(DATA, masks="part-*", **opts).open_files_by_fsspec(mode="rb", retries=2, backoff=0.05, **opts)
    got = []
    start = time.monotonic()
    with pytest.raises(Exception) as info:
        for url, stream in pipe:
            got.append(stream.read())
            if len(got) == 2:
                own_s3.kill()
    assert time.monotonic() - start < 15.0
    assert got == [OBJECTS["data/part-0.txt"], OBJECTS["data/part-1.txt"]]
    exc = info.value
    assert isinstance(exc, (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError)), repr(exc)
    assert f"opening '{DATA}/part-2.txt' failed after 3 attempts" in notes(exc)
    assert "FSSpecFileOpener('rb')" in notes(exc)


def test_a_dead_server_with_on_error_skip_skips_and_logs(own_s3, caplog):
    opts = own_s3.options()
    pipe = FSSpecFileLister(DATA, masks="part-*", **opts).open_files_by_fsspec(
        mode="rb", retries=1, backoff=0.02, on_error="skip", warn_failures=None, **opts
    )
    got = []
    with caplog.at_level(logging.WARNING, logger="datapipes"):
        for url, stream in pipe:
            got.append(url)
            if len(got) == 1:
                own_s3.kill()
    assert got == TEXT_URLS[:1]
    assert pipe.failures.count == 3
    assert [f.position for f in pipe.failures.recent] == [1, 2, 3]
    assert all(f"'{url}' failed after 2 attempts" in notes(f.exception) for f, url in zip(pipe.failures.recent, TEXT_URLS[1:]))
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "skipped item 1" in logged and "skipped item 3" in logged and "Could not connect" in logged


class _StartLater(threading.Thread):
    """Starts ``server`` again after ``delay`` seconds; ``done()`` waits for it and re-raises what
    starting it raised."""

    def __init__(self, server: S3Server, delay: float) -> None:
        super().__init__(daemon=True)
        self.server, self.delay, self.error = server, delay, None
        self.start()

    def run(self) -> None:
        try:
            time.sleep(self.delay)
            self.server.start()
        except BaseException as e:  # noqa: BLE001 - reported by done()
            self.error = e

    def done(self) -> None:
        self.join(timeout=40)
        assert not self.is_alive(), "the server did not start again in 40 s"
        if self.error is not None:
            raise self.error


@pytest.mark.slow
def test_a_server_back_during_the_retries_lets_the_pass_finish(own_s3):
    opts = own_s3.options()
    # 9 retries wait up to 25 s in all: the server is back well before
    pipe = FSSpecFileLister(DATA, recursive=True, **opts).open_files_by_fsspec(
        mode="rb", retries=9, backoff=0.05, kwargs_for_open={"block_size": 256}, **opts
    )
    got = {}
    restarts = []
    for i, (url, stream) in enumerate(pipe):
        head = stream.read(100)
        if i == 0:  # killed inside a file (data/blob.bin: the rest is further ranged requests)
            own_s3.kill()
            restarts.append(_StartLater(own_s3, 0.3))
        got[url] = head + stream.read()
        if i == 2:  # and between two files
            restarts[-1].done()
            own_s3.kill()
            restarts.append(_StartLater(own_s3, 0.3))
    for restart in restarts:
        restart.done()
    assert len(restarts) == 2 and list(got)[0] == f"{DATA}/blob.bin"
    assert got == {f"s3://{BUCKET}/{key}": data for key, data in OBJECTS.items() if key.startswith("data/")}


# -- which errors are transient --------------------------------------------------------------------


def _client_error(code: str, status: int | None) -> Any:
    from botocore.exceptions import ClientError

    meta = {} if status is None else {"HTTPStatusCode": status}
    return ClientError({"Error": {"Code": code, "Message": "..."}, "ResponseMetadata": meta}, "GetObject")


def _s3fs_error(code: str, status: int) -> Any:
    """The error s3fs raises for a ClientError: an OSError (or a subclass) raised from it."""
    from s3fs.errors import translate_boto_error

    return translate_boto_error(_client_error(code, status))


def _requests_http_error(status: int) -> Any:
    import requests

    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(f"{status}", response=response)


def _aiohttp_response_error(status: int) -> Any:
    import aiohttp

    return aiohttp.ClientResponseError(None, (), status=status)


def _botocore(name: str, **kwargs: Any) -> Callable[[], Any]:
    def make() -> Any:
        import botocore.exceptions

        return getattr(botocore.exceptions, name)(**kwargs)

    return make


def _aiohttp(make: Callable[[Any], Any]) -> Callable[[], Any]:
    def build() -> Any:
        import aiohttp

        return make(aiohttp)

    return build


def _requests(make: Callable[[Any], Any]) -> Callable[[], Any]:
    def build() -> Any:
        import requests

        return make(requests)

    return build


def _from(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


ENDPOINT = {"endpoint_url": "http://127.0.0.1:1/b/k"}
TRANSIENT: dict[str, Callable[[], Any]] = {
    "botocore EndpointConnectionError": _botocore("EndpointConnectionError", **ENDPOINT),
    "botocore ConnectionClosedError": _botocore("ConnectionClosedError", **ENDPOINT),
    "botocore ReadTimeoutError": _botocore("ReadTimeoutError", **ENDPOINT),
    "botocore ConnectTimeoutError": _botocore("ConnectTimeoutError", **ENDPOINT),
    "botocore ProxyConnectionError": _botocore("ProxyConnectionError", proxy_url="http://127.0.0.1:1"),
    "botocore ResponseStreamingError": _botocore("ResponseStreamingError", error="reset"),
    "botocore IncompleteReadError": _botocore("IncompleteReadError", actual_bytes=1, expected_bytes=2),
    "botocore ConnectionError": _botocore("ConnectionError", error="reset"),
    "botocore HTTPClientError": _botocore("HTTPClientError", error="reset"),
    "ClientError SlowDown": lambda: _client_error("SlowDown", 503),
    "ClientError ServiceUnavailable": lambda: _client_error("ServiceUnavailable", 503),
    "ClientError InternalError": lambda: _client_error("InternalError", 500),
    "ClientError RequestTimeout": lambda: _client_error("RequestTimeout", 400),
    "ClientError Throttling": lambda: _client_error("Throttling", 400),
    "ClientError 502": lambda: _client_error("BadGateway", 502),
    "ClientError 504": lambda: _client_error("GatewayTimeout", 504),
    "ClientError 503 of a HEAD (no body)": lambda: _client_error("503", None),
    "s3fs SlowDown (OSError from ClientError)": lambda: _s3fs_error("SlowDown", 503),
    "s3fs InternalError": lambda: _s3fs_error("InternalError", 500),
    "s3fs RequestTimeout (TimeoutError)": lambda: _s3fs_error("RequestTimeout", 400),
    "aiohttp ClientConnectionError": _aiohttp(lambda a: a.ClientConnectionError("reset")),
    "aiohttp ServerDisconnectedError": _aiohttp(lambda a: a.ServerDisconnectedError()),
    "aiohttp ClientPayloadError": _aiohttp(lambda a: a.ClientPayloadError("cut short")),
    "aiohttp ServerTimeoutError": _aiohttp(lambda a: a.ServerTimeoutError("slow")),
    "aiohttp ClientResponseError 503": lambda: _aiohttp_response_error(503),
    "aiohttp ClientResponseError 429": lambda: _aiohttp_response_error(429),
    "asyncio.TimeoutError": lambda: asyncio.TimeoutError(),
    "requests ConnectionError": _requests(lambda r: r.ConnectionError("reset")),
    "requests Timeout": _requests(lambda r: r.Timeout("slow")),
    "requests ReadTimeout": _requests(lambda r: r.exceptions.ReadTimeout("slow")),
    "requests ChunkedEncodingError": _requests(lambda r: r.exceptions.ChunkedEncodingError("cut short")),
    "requests HTTPError 500": lambda: _requests_http_error(500),
    "ConnectionResetError": lambda: ConnectionResetError(errno.ECONNRESET, "reset"),
    "FileNotFoundError from a 503 (fsspec's HTTP stat)": lambda: _from(FileNotFoundError("u"), _aiohttp_response_error(503)),
}
PERMANENT: dict[str, Callable[[], Any]] = {
    "ClientError NoSuchKey": lambda: _client_error("NoSuchKey", 404),
    "ClientError AccessDenied": lambda: _client_error("AccessDenied", 403),
    "ClientError 404 of a HEAD (no body)": lambda: _client_error("404", None),
    "ClientError 403 of a HEAD (no body)": lambda: _client_error("403", None),
    "ClientError InvalidArgument": lambda: _client_error("InvalidArgument", 400),
    "s3fs NoSuchKey (FileNotFoundError)": lambda: _s3fs_error("NoSuchKey", 404),
    "s3fs AccessDenied (PermissionError)": lambda: _s3fs_error("AccessDenied", 403),
    "s3fs InvalidArgument (OSError EINVAL)": lambda: _s3fs_error("InvalidArgument", 400),
    "botocore NoCredentialsError": _botocore("NoCredentialsError"),
    "botocore ParamValidationError": _botocore("ParamValidationError", report="bad"),
    "aiohttp ClientResponseError 404": lambda: _aiohttp_response_error(404),
    "aiohttp ClientResponseError 403": lambda: _aiohttp_response_error(403),
    "aiohttp InvalidURL": _aiohttp(lambda a: a.InvalidURL("nope")),
    "requests HTTPError 404": lambda: _requests_http_error(404),
    "requests HTTPError 403": lambda: _requests_http_error(403),
    "requests InvalidURL (an OSError)": _requests(lambda r: r.exceptions.InvalidURL("nope")),
    "requests MissingSchema": _requests(lambda r: r.exceptions.MissingSchema("nope")),
    "FileNotFoundError": lambda: FileNotFoundError(errno.ENOENT, "missing", "k"),
    "PermissionError": lambda: PermissionError(errno.EACCES, "denied", "k"),
    "FileNotFoundError from NoSuchKey": lambda: _from(FileNotFoundError("k"), _client_error("NoSuchKey", 404)),
    "ValueError": lambda: ValueError("bad"),
}


def _make(make: Callable[[], Any]) -> Any:
    try:
        return make()
    except ImportError as e:  # the library is optional: skip its cases without it
        pytest.skip(f"{e.name} is not installed")


@pytest.mark.parametrize("make", TRANSIENT.values(), ids=TRANSIENT.keys())
def test_transient_errors(make):
    assert _is_transient(_make(make))


@pytest.mark.parametrize("make", PERMANENT.values(), ids=PERMANENT.keys())
def test_permanent_errors(make):
    assert not _is_transient(_make(make))


def test_judging_an_error_imports_no_client_library():
    code = (
        "import sys\n"
        "from datapipes.iter.remote import _is_transient\n"
        "before = set(sys.modules)\n"
        "assert _is_transient(ConnectionResetError()) and not _is_transient(FileNotFoundError())\n"
        "assert not _is_transient(ValueError()) and _is_transient(TimeoutError())\n"
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('botocore', 'aiohttp', 'requests', 's3fs')))\n"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.strip() == "[]"
