"""Fixtures for the source tests: a real HTTP server on 127.0.0.1 and a scratch ``memory://`` folder.

``http_server`` serves a fresh directory (``http_server.root``, a ``pathlib.Path``) with Python's
``http.server`` in a thread on 127.0.0.1, on a free port; it is shut down, its request threads
joined, at teardown. Write files under ``root``, then read them at ``http_server.url(name)``::

    def test_reads_over_http(http_server):
        (http_server.root / "a.txt").write_bytes(b"hello")
        pipe = IterableWrapper([http_server.url("a.txt")]).open_files_by_fsspec(mode="rb")
        assert [s.read() for _, s in pipe] == [b"hello"]

A directory URL (``http_server.url("sub/")``) serves the HTML index page that fsspec's HTTP file
system lists. Unlike plain ``http.server``, byte ranges (``Range: bytes=a-b``) are served (206), so
fsspec reads a file in blocks (``kwargs_for_open={"block_size": n}``) and can resume mid-file. To test retries, make the next requests fail::

    http_server.fail(2)                      # the next 2 requests get "503 Service Unavailable"
    http_server.fail(1, mode="drop")         # the next one: the connection is closed, no reply
    http_server.fail(1, mode="truncate")     # a GET of a file: half the body, then closed
    http_server.fail(3, methods=("GET",))    # only GET requests count (HEAD goes through)
    http_server.fail(1, status=404)          # any status

``http_server.requests`` lists every request as ``(method, path, status)``, status ``0`` for a
dropped connection; ``http_server.count("GET", "/a.txt")`` counts them;
``http_server.request_headers`` holds each GET/HEAD request's headers.

The fixture starts fsspec's I/O event-loop thread (a daemon that lives as long as the process)
before the test runs, so thread-leak checks in the test do not count it.

``memfs`` gives a unique folder in fsspec's process-wide ``memory://`` file system, as
``(fs, "memory://<folder>")``, and removes it at teardown.
"""

from __future__ import annotations

import http.server
import os
import re
import threading
import uuid
from functools import partial
from pathlib import Path
from typing import Iterator

import pytest


class _FailurePlan:
    """How many of the next requests fail, and how; shared by the handler threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.left = 0
        self.mode = "status"
        self.status = 503
        self.methods: tuple[str, ...] = ("GET", "HEAD")
        self.requests: list[tuple[str, str, int]] = []
        self.headers: list[dict[str, str]] = []

    def take(self, method: str) -> str | None:
        """The failure this request gets ("status", "drop", "truncate"), or None to serve it normally."""
        with self.lock:
            if self.left > 0 and method in self.methods:
                self.left -= 1
                return self.mode
            return None

    def log(self, method: str, path: str, status: int) -> None:
        with self.lock:
            self.requests.append((method, path, status))


class _Handler(http.server.SimpleHTTPRequestHandler):
    plan: _FailurePlan
    timeout = 10  # seconds a connection may sit idle: no request thread outlives a stuck client

    def _maybe_fail(self) -> bool:
        with self.plan.lock:
            self.plan.headers.append(dict(self.headers))
        failure = self.plan.take(self.command)
        if failure is None:
            return False
        if failure == "status":
            self.send_error(self.plan.status)
            return True
        self.close_connection = True
        body = self._file_bytes() if self.command == "GET" else None
        if failure == "drop" or body is None:
            self.plan.log(self.command, self.path, 0)  # no reply: the client sees the connection closed
            return True
        # "truncate": announce the whole body, send half of it, close the connection.
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        return True

    def _file_bytes(self) -> bytes | None:
        path = self.translate_path(self.path)
        return Path(path).read_bytes() if os.path.isfile(path) else None

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self._maybe_fail():
            return
        ranged = self.headers.get("Range")
        body = self._file_bytes() if ranged else None
        if ranged is None or body is None:
            super().do_GET()
            return
        # Byte ranges (http.server has none), so fsspec reads a file in blocks and can resume.
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", ranged.strip())
        if m is None:
            self.send_error(400, "bad Range header")
            return
        start, size = int(m[1]), len(body)
        end = min(int(m[2]) if m[2] else size - 1, size - 1)
        if start >= size:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        part = body[start : end + 1]
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        self.wfile.write(part)

    def do_HEAD(self) -> None:  # noqa: N802
        if not self._maybe_fail():
            super().do_HEAD()

    def send_response(self, code: int, message: str | None = None) -> None:
        self.plan.log(self.command, self.path, int(code))  # every reply, send_error's included
        super().send_response(code, message)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - keep test output quiet
        pass


class HttpServer:
    """A running test HTTP server: ``root``, ``base_url``, ``url(name)``, ``fail(...)``, ``requests``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._plan = _FailurePlan()
        handler = type("Handler", (_Handler,), {"plan": self._plan})
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(root)))
        self._server.daemon_threads = False  # server_close() joins every request thread
        port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{port}/"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="test-http-server", daemon=True
        )
        self._thread.start()

    def url(self, name: str = "") -> str:
        """The URL of ``name`` (a path relative to ``root``, with "/" separators)."""
        return self.base_url + name.lstrip("/")

    def fail(self, n: int, *, mode: str = "status", status: int = 503, methods: tuple[str, ...] = ("GET", "HEAD")) -> None:
        """Make the next ``n`` requests (of ``methods``) fail: with ``status`` (``mode="status"``),
        closing the connection unanswered (``"drop"``), or, for a GET of a file, sending half the
        announced body then closing (``"truncate"``)."""
        if mode not in ("status", "drop", "truncate"):
            raise ValueError(f"mode must be 'status', 'drop' or 'truncate', got {mode!r}")
        with self._plan.lock:
            self._plan.left = n
            self._plan.mode = mode
            self._plan.status = status
            self._plan.methods = tuple(methods)

    @property
    def requests(self) -> list[tuple[str, str, int]]:
        with self._plan.lock:
            return list(self._plan.requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """The headers of every GET and HEAD request received, in order."""
        with self._plan.lock:
            return list(self._plan.headers)

    def count(self, method: str | None = None, path: str | None = None) -> int:
        """How many requests were made (of ``method``, for ``path`` such as ``"/a.txt"``)."""
        return sum(
            1 for m, p, _ in self.requests if (method is None or m == method) and (path is None or p == path)
        )

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpServer]:
    """A real HTTP server on 127.0.0.1 serving ``tmp_path / "www"`` (see the module docstring)."""
    import fsspec.asyn

    fsspec.asyn.get_loop()  # start fsspec's long-lived I/O thread before the test's leak checks
    root = tmp_path / "www"
    root.mkdir()
    server = HttpServer(root)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def memfs() -> Iterator[tuple[object, str]]:
    """A unique folder in fsspec's ``memory://`` file system: ``(fs, "memory://<folder>")``."""
    import fsspec

    fs = fsspec.filesystem("memory")
    folder = f"test-{uuid.uuid4().hex}"
    try:
        yield fs, f"memory://{folder}"
    finally:
        if fs.exists(f"/{folder}"):
            fs.rm(f"/{folder}", recursive=True)
