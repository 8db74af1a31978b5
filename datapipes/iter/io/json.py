"""A JSON reader of ``(path, stream)`` pairs, as :class:`~datapipes.iter.FileOpener` yields them:
JsonParser [parse_json_files].

Each stream is read whole, as JSON must be, on the runtime of :mod:`datapipes.iter._readers`: a file
that is not valid JSON reaches the consumer with a note naming its file and line, or is skipped under
``on_error="skip"``. A checkpoint keeps no position in a file (one file per item).

A file is read in blocks up to ``max_size`` (:data:`MAX_JSON_SIZE` by default) and no further: a
small gzip of a huge document raises :class:`~datapipes.errors.SizeLimitError` naming the file and
the limit, having held at most the limit (docs/howto/security.rst).
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from ..._engine import abandon
from ..._engine import close_iterator as _close
from ..._runtime.passes import Pass
from ..._redact import redact
from ...datapipe import IterDataPipe, functional_datapipe, require_int, require_pipe, source_len, stage_label
from ...errors import WARN_FAILURES, SizeLimitError, _OnError, policy_and_log
from .._readers import _budget_stateless, _count_run, _CountRun, _file_where, _line_where, _on_fail, _pair

__all__ = ["JsonParser"]

#: The default ``max_size`` of ``parse_json_files``: 1 GiB, bytes (characters for a text stream).
#: Generous: the largest JSON files of common datasets (COCO's annotations) are under half of it,
#: and parsing a document takes several times its size in Python objects anyway.
MAX_JSON_SIZE = 1 << 30

_FIRST_READ = 64 << 10  # the first block read; each next one doubles, up to _MAX_READ
_MAX_READ = 16 << 20


def _json_where(path: Any, n: int, data: Any, exc: BaseException) -> tuple[str, int]:
    if isinstance(exc, json.JSONDecodeError):
        return _line_where(path, exc.lineno, exc.lineno)
    if isinstance(exc, UnicodeDecodeError) and isinstance(data, (bytes, bytearray)):
        line = data.count(b"\n", 0, exc.start) + 1
        return _line_where(path, line, line)
    return _file_where(path, n)


def _read_all(stream: Any, limit: int | None, stage: str, path: Any) -> Any:
    """All of ``stream`` (bytes or text), or :class:`SizeLimitError` past ``limit``; closes it.

    Read in blocks (64 KiB, then doubling) asking for at most ``limit + 1`` in all: a stream that
    holds more is refused having given ``limit + 1``, and a small file costs one block."""
    try:
        if limit is None:
            return stream.read()
        read = stream.read
        parts = []
        total = 0
        size = _FIRST_READ
        while True:
            piece = read(min(size, limit + 1 - total))
            if not piece:
                break
            parts.append(piece)
            total += len(piece)
            if total > limit:
                raise SizeLimitError(
                    f"{stage}: {redact(repr(path))} is larger than max_size={limit:,} bytes (characters for a text "
                    f"stream): pass a larger max_size (None: no limit) to read it"
                )
            size = min(size * 2, _MAX_READ)
        if len(parts) == 1:
            return parts[0]
        return parts[0][:0].join(parts) if parts else piece  # no parts: b"" or "", the stream's end
    finally:
        _close(stream)


def _json(pipe: JsonParser, it: Iterator[Any], run: _CountRun) -> Iterator[tuple[Any, Any]]:
    stage = stage_label(pipe)
    on_fail = _on_fail(pipe, stage)
    kwargs = pipe.kwargs
    limit = pipe.max_size
    loads = json.loads
    try:
        for n, item in run.begin(it, on_fail):  # n: the item (file) being read
            path, stream = _pair(item, stage, n)
            data = None
            try:
                data = _read_all(stream, limit, stage, path)
                obj = loads(data, **kwargs)
            except Exception as e:
                on_fail(e, *_json_where(path, n, data, e))
                continue
            yield path, obj
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise
    finally:
        run.end()


@functional_datapipe("parse_json_files")
class JsonParser(IterDataPipe[tuple[str, Any]]):
    """Parse one JSON document per ``(path, stream)`` pair and yield ``(path, object)``
    (functional name: ``parse_json_files``).

    Args:
        source_datapipe: a pipe of ``(path, stream)`` pairs (binary streams in UTF-8/16/32, or text).
        on_error: ``"raise"`` (default) or ``"skip"``: a file that is not valid JSON is skipped and
            counted in ``pipe.failures``.
        max_failures: with ``on_error="skip"``, failures tolerated per pass: a number, or a float
            between 0 and 1 for a share of the items (``None``: any).
        warn_failures: with ``on_error="skip"``, past how many failures (a number, or a share:
            10% by default) a pass warns once (``None``: never); see :mod:`datapipes.errors`.
        max_size: the largest file read, in bytes (characters for a text stream), by default
            :data:`MAX_JSON_SIZE` (1 GiB), ``None`` for no limit. A file you did not
            write could be of any size (a small gzip of a huge document): the reader holds at most
            this much of it before it raises.
        kwargs: passed to ``json.loads`` (``object_hook``, ``parse_float``, ``cls``, ...).

    Yields:
        ``(path, json.loads(stream.read()))`` for each pair, in order. Each stream is read whole
        (a JSON document cannot be parsed line by line) and closed.

    Raises:
        json.JSONDecodeError (a ``ValueError``): invalid JSON, with a note naming the stage, the
        file and the line; ``UnicodeDecodeError`` for bytes that are not UTF-8/16/32.
        datapipes.errors.SizeLimitError: (a ``ValueError``) a file larger than ``max_size``,
            named the same way.
        TypeError: an item is not a ``(path, stream)`` pair.

    ``len()`` is the source's length.

    Example:
        >>> import io
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([("a.json", io.BytesIO(b'{"x": [1, 2]}'))]).parse_json_files())
        [('a.json', {'x': [1, 2]})]

    See also: :class:`LineReader` (``readlines``) then ``map(json.loads)`` for JSON lines files.
    """

    _saves = "same as open_files"

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        max_size: int | None = MAX_JSON_SIZE,
        **kwargs: Any,
    ) -> None:
        require_pipe(source_datapipe, "JsonParser", "source_datapipe")
        require_int(max_size, "JsonParser", "max_size", minimum=1, optional=True)
        decoder = kwargs.get("cls") or json.JSONDecoder
        try:
            decoder(**{k: v for k, v in kwargs.items() if k != "cls"})
        except TypeError as e:
            raise TypeError(f"JsonParser: invalid json.loads arguments {sorted(kwargs)}: {e}") from None
        self.source_datapipe = source_datapipe
        self.max_size = max_size
        self.kwargs = kwargs
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures)
        # one object per file, each read whole: its position is its source's (but a failure budget's count)
        self._stateless = _budget_stateless(self)

    def _open(self, ctx: Pass) -> Iterator[tuple[str, Any]]:
        return _json(self, ctx.open(self.source_datapipe), _count_run(self, ctx))

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")
