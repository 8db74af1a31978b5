"""Readers of text formats in ``(path, stream)`` pairs, as :class:`~datapipes.iter.FileOpener` yields
them: CSVParser [parse_csv], CSVFilesParser [parse_csv_files], CSVDictParser [parse_csv_as_dict],
JsonParser [parse_json_files], LineReader [readlines].

Streams are read lazily, line by line (JSON reads one whole file, as it must), and each stream is
closed when the reader is done with it: at its end, on an error, or when the pass is closed early.
A stream may be binary (decoded with ``encoding``/``errors``) or text (used as it is).

**Bad input.** An error while reading a file (a malformed CSV row, a row whose field count differs
from the header, invalid JSON, bytes that do not decode with ``errors="strict"``) reaches the
consumer as the very exception object, with a note naming the stage, the file and the line::

    [datapipes] raised in stage CSVParser at file 'data.csv', line 17

With ``on_error="skip"`` the bad record is skipped and counted in ``pipe.failures`` (whose
``recent`` records hold the line numbers), and the rest of the file still comes through: a bad row
(CSV), a bad line (lines), a bad file (JSON). An error of the stream itself (``OSError``) skips the
rest of that file. Errors of the source pipe pass through untouched.

**Checkpoints** (``it.state_dict()``). A reader stopped inside a file saves its path and the lines
read; the resumed pass opens it again through the opener upstream (``open_files``, ...; a stream in
memory is copied into the state instead), skips those lines without parsing them, and goes on. A
stream that can be neither opened again nor copied (an open file from a source of your own) makes
``state_dict()`` raise ``TypeError`` naming the reader. JSON keeps no position (one file per item).

>>> import io
>>> from datapipes.iter import IterableWrapper
>>> files = IterableWrapper([("a.csv", io.BytesIO(b"x,y\\n1,2\\n")), ("b.csv", io.BytesIO(b"x,y\\n3,4\\n"))])
>>> list(files.parse_csv_as_dict())
[{'x': '1', 'y': '2'}, {'x': '3', 'y': '4'}]
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from itertools import chain, islice, repeat
from typing import Any, Callable, Iterator, Protocol, Sequence

from .. import _held, _pass
from .._positions import Counted, Enumerated
from .._checks import phrased, require_bool
from .._engine import abandon
from .._engine import close_iterator as _close
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_int, require_pipe, source_len, stage_label
from ..errors import WARN_FAILURES, add_stage_note, call_lines, policy_and_log, raised_at
from .fileio import StreamWrapper

__all__ = ["CSVDictParser", "CSVFilesParser", "CSVParser", "JsonParser", "LineReader"]

#: Errors that spoil one record (a row or a line) but leave the stream readable: with
#: ``on_error="skip"`` the record is skipped and reading goes on. Any other error skips the rest of
#: the file (a stream that failed may fail again on every read).
_RECORD_ERRORS = (csv.Error, UnicodeError)

_END = object()


# -- helpers shared by the readers of (path, stream) pairs (archive.py and image.py use them too) -----


def _pair(item: Any, stage: str, n: int) -> tuple[Any, Any]:
    """``item`` as a ``(path, stream)`` pair; ``TypeError`` naming the stage otherwise."""
    if type(item) is tuple and len(item) == 2:
        return item
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    raise TypeError(
        f"{stage}: expects (path, stream) pairs as open_files yields, got {type(item).__name__} "
        f"at item {n}: {item!r:.100}"
    )


def _inner(stream: Any) -> Any:
    """The file object inside a stream wrapper (datapipes' or torch's ``StreamWrapper``), else
    the stream itself."""
    return getattr(stream, "file_obj", stream)


def _on_fail(pipe: Any, stage: str) -> Callable[[Exception, str, int], None]:
    """The failure handler of one pass of ``pipe``, chosen once when the pass starts.

    A reader's loop calls it in its ``except`` block with the exception and the ``(what,
    position)`` its note names. Under ``on_error="raise"`` it adds the note and raises the same
    object again; under ``on_error="skip"`` it counts the failure in ``pipe.failures`` (raising the
    pass's ``ExceptionGroup`` once ``max_failures`` is exceeded) and returns: the loop goes on.
    """
    policy = pipe._policy
    if not policy.skips:

        def fail(exc: Exception, what: str, position: int) -> None:
            add_stage_note(exc, stage, position, what)
            raise exc

        return fail
    failures = policy.new_pass(stage, pipe.failures)

    def skip(exc: Exception, what: str, position: int) -> None:
        failures.what = what
        failures.skip(exc, position)

    skip.failures = failures  # type: ignore[attr-defined]  # the pass's count, which a state saves
    return skip


# -- checkpoint and resume of the readers --------------------------------------------------------------

_STARTED = _pass.STARTED


def _reopener(source: Any) -> Callable[[Any, int], Any] | None:
    """How to open again, by its path, the stream of an item of ``source`` (``reopen(path, n)``):
    an opener can (``FileOpener._reopener``, ...); ``None`` for any other source."""
    make = getattr(source, "_reopener", None)
    return None if make is None else make()


def _copied(stream: Any) -> list[Any] | None:
    """A copy, as plain data, of an in-memory stream (its whole contents, whatever was read), or
    ``None`` for a stream that is not in memory."""
    raw = _inner(stream)
    if isinstance(raw, io.BytesIO):
        return ["bytes", raw.getvalue()]
    if isinstance(raw, io.StringIO):
        state: Any = raw.__getstate__()  # (value, newline, position, dict)
        return ["text", state[0], state[1]]
    source, fmt = getattr(raw, "_dp_source", None), getattr(raw, "_dp_format", None)
    if source is not None and fmt is not None:  # decompressing an in-memory stream (Decompressor)
        inner = _copied(source)
        return None if inner is None else ["decompressed", fmt, inner]
    return None


def _memory_copy(stream: Any, stage: str, path: Any) -> list[Any]:
    """:func:`_copied`, with a ``TypeError`` naming ``stage`` for a stream that is not in memory."""
    copy = _copied(stream)
    if copy is None:
        raise TypeError(
            f"{stage} cannot save its position inside {path!r}: its source cannot open that file again by its "
            f"path (an opener can: open_files, open_files_by_fsspec, decompress after one) and its stream, a "
            f"{type(_inner(stream)).__name__}, is not in memory (io.BytesIO, io.StringIO)"
        )
    return copy


#: how a copied stream that wraps another is made again: ``{"decompressed": fn(fmt, inner stream)}``,
#: filled by archive.py (which imports this module)
_REWRAP: dict[str, Callable[[Any, Any], Any]] = {}


def _from_memory(copy: list[Any]) -> Any:
    """The stream :func:`_memory_copy` copied, at its start."""
    if copy[0] == "bytes":
        return io.BytesIO(copy[1])
    if copy[0] == "text":
        stream = io.StringIO()
        stream.__setstate__((copy[1], copy[2], 0, None))  # type: ignore[attr-defined]  # no newline translated again
        return stream
    return _REWRAP[copy[0]](copy[1], _from_memory(copy[2]))


# -- streams inside the items a state holds (datapipes._held) -------------------------------------


def set_origin(stream: Any, stage: Any, path: Any, n: int) -> Any:
    """Record on ``stream`` that item ``n`` of ``stage`` (an opener, a decompressor) opened it from
    ``path``, so that a pass state holding it saves where it came from; returns ``stream``."""
    try:
        if isinstance(stream, StreamWrapper):
            stream.__dict__["_dp_origin"] = (stage, path, n)
        else:
            stream._dp_origin = (stage, path, n)
    except (AttributeError, TypeError):  # a stream that takes no attribute: copied if in memory
        pass
    return stream


def _origin(stream: Any) -> tuple[Any, Any, int] | None:
    d = getattr(stream, "__dict__", None)
    origin = None if d is None else d.get("_dp_origin")
    if origin is None and isinstance(stream, StreamWrapper):
        d = getattr(stream.file_obj, "__dict__", None)
        origin = None if d is None else d.get("_dp_origin")
    return origin


def _origin_reopener(stage: Any) -> Callable[[Any, int], Any] | None:
    """How to open again a stream ``stage`` recorded as its own (:func:`set_origin`) by the path the
    origin holds: the stage's ``_origin_reopener`` where it has one, else its ``_reopener``."""
    make = getattr(stage, "_origin_reopener", None)
    return _reopener(stage) if make is None else make()


def _is_stream(value: Any) -> bool:
    # torch's StreamWrapper (from a torch-style opener of your own) is recognised by its name
    return isinstance(value, (StreamWrapper, io.IOBase)) or type(value).__name__ == "StreamWrapper"


class _StreamCodec:
    """How a pass state saves the streams inside the items its stages hold (see datapipes._held)."""

    def freeze(self, value: Any, key_of: Callable[[Any], str | None], where: str) -> Any:
        if type(value) in _NOT_STREAMS or not _is_stream(value):
            return value
        wrapped = not isinstance(value, io.IOBase)
        name = getattr(value, "name", None) if wrapped else None
        origin = _origin(value)
        if origin is not None:
            stage, path, n = origin
            key = key_of(stage)
            if key is not None and _origin_reopener(stage) is not None:
                return {"open": key, "path": path, "n": n, "name": name, "wrapped": wrapped}
        copy = _copied(value)
        if copy is not None:
            return {"memory": copy, "name": name, "wrapped": wrapped}
        raise TypeError(
            f"{where} cannot save its position: it holds an item with an open stream "
            f"({type(_inner(value)).__name__}{'' if name is None else f' {name!r}'}) that can be neither opened again "
            f"by this pass (an opener of this pipe can: open_files, open_files_by_fsspec, read_from_http, decompress "
            f"after one) nor copied (in-memory streams are: io.BytesIO, io.StringIO); read the stream in the stage "
            f"that receives it, or keep the path in the item and open it there"
        )

    def thaw(self, saved: Any, stage_at: Callable[[str], Any]) -> Any:
        if "memory" in saved:
            stream = _from_memory(saved["memory"])
        else:
            stage = stage_at(saved["open"])
            reopen = _origin_reopener(stage)
            if reopen is None:  # pragma: no cover - the same graph class at the same place has one
                raise ValueError(f"load_state_dict: {stage_label(stage)} cannot open {saved['path']!r} again")
            stream = set_origin(reopen(saved["path"], saved["n"]), stage, saved["path"], saved["n"])
        if saved["wrapped"]:
            if not isinstance(stream, StreamWrapper):
                stream = StreamWrapper(stream, saved["name"])
                if "open" in saved:
                    set_origin(stream, stage, saved["path"], saved["n"])
        elif isinstance(stream, StreamWrapper):
            stream = stream.file_obj
        return stream


_NOT_STREAMS = frozenset((int, float, str, bytes, bool, type(None), dict, list, tuple))

_held.register(_StreamCodec())


class _FileRunSlots(Protocol):
    """What :class:`_FileRun`'s methods use of ``self``: attributes each subclass keeps in its own
    slots (typed apart, as mypy refuses assignments to attributes outside the base's empty slots)."""

    failures: Any
    resume: dict[str, Any] | None
    started: bool

    def resumed(self, file: dict[str, Any]) -> Any: ...

    def seen(self) -> int | None: ...

    def begun(self, state: dict[str, Any]) -> None: ...


class _FileRun:
    """What the runs of the file readers (:class:`_ReadRun`, and the Parquet reader's) share: a
    loaded state kept for the pass to start from, and starting from it. A subclass has the slots
    ``failures``, ``resume`` and ``started``, and says how to read again the file a saved pass was
    inside (:meth:`resumed`)."""

    __slots__ = ()
    failures: Any
    resume: dict[str, Any] | None
    started: bool

    def resumed(self, file: dict[str, Any]) -> Any:
        raise NotImplementedError  # pragma: no cover - every subclass has its own

    def seen(self) -> int | None:
        """The records this pass has read so far (the items a share of failures is judged
        against), or None where the reader does not count them."""
        return None

    def begun(self, state: dict[str, Any]) -> None:
        """Called as a resumed pass starts, with the state it resumes from."""

    def end(self: _FileRunSlots) -> None:
        """Called as the pass ends (ran out, failed or closed): under ``on_error="skip"``, the
        summary of what it skipped (see datapipes.errors)."""
        if self.failures is not None:
            self.failures.end(self.seen())

    def restore(self: _FileRunSlots, state: dict[str, Any]) -> None:
        if self.started:
            raise RuntimeError(_STARTED)
        self.resume = state

    def begin(self: _FileRunSlots, on_fail: Any) -> tuple[int, list[Any]]:
        """Called as the pass starts: the position before the first item, and the items to read
        before the source's (the file a resumed pass was inside)."""
        self.started = True
        self.failures = getattr(on_fail, "failures", None)
        if self.failures is not None:
            self.failures.items = self.seen
        state, self.resume = self.resume, None
        if state is None:
            return -1, []
        if self.failures is not None:
            self.failures.count = int(state["failures"])
        self.begun(state)
        file = state["file"]
        if file is None:
            return int(state["n"]), []
        return int(state["n"]) - 1, [self.resumed(file)]


class _ReadRun(_FileRun):
    """The position of a reader's pass (CSV, lines, tar, zip): the items (files) it pulled, and its
    position inside the current one.

    Inside a file the position is the records consumed: ``offset`` (lines skipped, or failed to
    decode: written on those rare events) plus a count read when the state is taken from what the
    loop keeps anyway: the ``Counted`` or ``Enumerated`` it iterates (lines yielded, archive
    entries read) or the CSV reader's ``line_num``; nothing is counted per record for it. The state holds the file's path,
    that count and, for CSV read as dicts, its header: a few hundred bytes. A resumed pass
    opens that file again through its source (an opener: :func:`_reopener`), or, for an in-memory
    stream (``io.BytesIO``, ``io.StringIO``: items of an ``IterableWrapper``, archive members),
    from the copy of its contents that the state then holds (the file's size); it skips the
    records consumed (lines are read again and skipped in C, not parsed; tar entries are read past;
    zip entries are jumped to), then goes on with its source, which its own run has restored to the
    item after that file. A stream that can be neither opened again nor copied has no state:
    ``state()`` raises ``TypeError`` naming the stage, rather than save a position that would not
    resume. Under ``on_error="skip"`` the failures counted so far are saved too (the budget), and
    the records of the files done (``seen``, added up once per file: what a share of failures is
    judged against).
    """

    __slots__ = ("stage", "reopen", "failures", "n", "path", "stream", "counted", "reader", "offset", "header",
                 "resume", "started", "done")

    def __init__(self, stage: str, reopen: Callable[[Any, int], Any] | None) -> None:
        self.stage = stage
        self.reopen = reopen
        self.failures: Any = None  # the pass's PassFailures under on_error="skip"
        self.n = -1  # the item (file) being read
        self.path: Any = None
        self.stream: Any = None
        self.counted: Any = None  # the loop's Counted/Enumerated over this file's records, or
        self.reader: Any = None  # the CSV reader: records consumed = offset + its count
        self.offset = 0
        self.header: list[str] | None = None
        self.resume: dict[str, Any] | None = None
        self.started = False
        self.done = 0  # records of the files done

    def _at(self) -> int:
        """The records of the current file consumed (0 between files)."""
        if self.counted is None and self.reader is None:
            return 0
        return self.offset + (self.reader.line_num if self.reader is not None else self.counted.count())

    def seen(self) -> int:
        return self.done + self._at()

    def begun(self, state: dict[str, Any]) -> None:
        self.done = int(state.get("seen", 0))

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"n": self.n, "failures": 0 if self.failures is None else self.failures.count, "file": None,
                                 "seen": self.done}
        if self.counted is None and self.reader is None:
            return state  # not inside a file yet
        at = self._at()
        file: dict[str, Any] = {"path": self.path, "at": at, "header": self.header, "memory": None}
        if self.reopen is None:
            file["memory"] = _memory_copy(self.stream, self.stage, self.path)
        state["file"] = file
        return state

    def resumed(self, file: dict[str, Any]) -> _Resumed:
        return _Resumed(file)

    def enter(self, n: int, path: Any, stream: Any, counted: Any, reader: Any, offset: int) -> None:
        """Record that the loop reads item ``n`` (once per file)."""
        self.n, self.path, self.stream, self.counted, self.reader, self.offset = n, path, stream, counted, reader, offset
        self.header = None

    def leave(self) -> None:
        """Record that the loop is done with the current file (once per file): a state taken before
        the next one (a stage downstream that pulled ahead, the source at its end) is between files."""
        self.done += self._at()
        self.path = self.stream = self.counted = self.reader = self.header = None


class _Resumed:
    """The file a resumed pass reads first: the one the saved pass was inside, from its record ``at``."""

    __slots__ = ("path", "at", "header", "memory")

    def __init__(self, file: dict[str, Any]) -> None:
        self.path = file["path"]
        self.at = int(file["at"])
        self.header = file["header"]
        self.memory = file["memory"]

    def open(self, run: _ReadRun, n: int) -> Any:
        if self.memory is not None:
            return _from_memory(self.memory)
        if run.reopen is None:
            raise TypeError(f"{run.stage}: the state names no way to open {self.path!r} again")
        return run.reopen(self.path, n)


def _item(item: Any, stage: str, n: int, skip: int) -> tuple[Any, Any, int, Any]:
    """``(path, stream, records to skip, header)`` of the item ``n`` a reader's loop takes: a
    ``(path, stream)`` pair of its source, or the :class:`_Resumed` file (its stream ``None``:
    opened by :func:`_open_item` inside the loop's ``try``, so that a failure is the file's)."""
    if type(item) is _Resumed:
        return item.path, None, item.at, item.header
    path, stream = _pair(item, stage, n)
    return path, stream, skip, None


def _open_item(item: Any, stream: Any, run: _ReadRun, n: int) -> Any:
    return item.open(run, n) if stream is None else stream


def _read_run(pipe: Any, source: Any) -> _ReadRun:
    """The run of a reader's pass over ``source``, recorded in the pass being built."""
    run = _ReadRun(stage_label(pipe), _reopener(source))
    _pass.track(pipe, run)
    return run


class _CountRun:
    """The position of a one-to-one reader's pass under a failure budget (``max_failures``): the
    failures counted (a resumed pass gives up where the uninterrupted one would) and the items
    pulled (the positions the notes name), read from the loop's ``Enumerated``: two ints. Without a
    budget the stage is stateless and this run is not recorded."""

    __slots__ = ("failures", "counted", "resume", "started")

    def __init__(self) -> None:
        self.failures: Any = None
        self.counted: Any = None
        self.resume: dict[str, Any] | None = None
        self.started = False

    def state(self) -> dict[str, Any]:
        return {
            "n": 0 if self.counted is None else self.counted.count(),
            "failures": 0 if self.failures is None else self.failures.count,
        }

    def restore(self, state: dict[str, Any]) -> None:
        if self.started:
            raise RuntimeError(_STARTED)
        self.resume = state

    def begin(self, it: Iterator[Any], on_fail: Any) -> Any:
        """Called as the pass starts: ``Enumerated(it)`` from the saved count."""
        self.started = True
        self.failures = getattr(on_fail, "failures", None)
        state, self.resume = self.resume, None
        start = 0
        if state is not None:
            start = int(state["n"])
            if self.failures is not None:
                self.failures.count = int(state["failures"])
        self.counted = counted = Enumerated(it, start)
        if self.failures is not None:
            self.failures.items = counted.count  # the items pulled: a share's denominator
        return counted

    def end(self) -> None:
        """Called as the pass ends (ran out, failed or closed): under ``on_error="skip"``, the
        summary of what it skipped (see datapipes.errors)."""
        if self.failures is not None:
            self.failures.end(None if self.counted is None else self.counted.count())


def _count_run(pipe: Any) -> _CountRun:
    """The run of a one-to-one reader's pass, recorded in the pass being built under a failure
    budget (the stage's ``_stateless`` is then False)."""
    run = _CountRun()
    if not pipe._stateless:
        _pass.track(pipe, run)
    return run


def _budget_stateless(pipe: Any) -> bool:
    """Whether a one-to-one reader (one item out per item in, or none when skipped) is stateless:
    its position is its source's, unless a failure budget counts its failures (:class:`_CountRun`)."""
    return pipe._policy.max_failures is None



def _check_text_args(stage: str, skip_lines: Any, decode: Any, encoding: Any, errors: Any) -> None:
    require_int(skip_lines, stage, "skip_lines")
    if skip_lines < 0:  # torchdata's words (it means >= 0)
        raise ValueError(phrased(stage, "'skip_lines' is required to be a positive integer.", skip_lines=skip_lines))
    require_bool(decode, stage, "decode")
    if not isinstance(encoding, str):
        raise TypeError(f"{stage}: encoding must be a str, got {type(encoding).__name__}")
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise ValueError(f"{stage}: unknown encoding {encoding!r}") from None
    if not isinstance(errors, str):
        raise TypeError(f"{stage}: errors must be a str, got {type(errors).__name__}")
    try:
        codecs.lookup_error(errors)
    except LookupError:
        raise ValueError(f"{stage}: unknown errors handler {errors!r} (e.g. 'strict', 'ignore', 'replace')") from None


def _ascii_compatible(encoding: str) -> bool:
    """True when lines of ``encoding`` end in the byte ``b"\\n"`` (utf-8, latin-1, ...; not utf-16)."""
    try:
        return "a\n".encode(encoding) == b"a\n"
    except UnicodeError:
        return False


class _TextOptions:
    """How a reader turns a stream into text lines: decided once at construction.

    Binary streams are decoded with ``encoding`` and ``errors``. With an ``errors`` handler that
    cannot fail (``"ignore"``, ``"replace"``, ...) they are decoded in blocks by
    ``io.TextIOWrapper`` (fast). With ``errors="strict"`` each line is decoded on its own, so a
    decoding error names its line and skipping it loses that line only; lines are then split at
    ``b"\\n"``.
    """

    __slots__ = ("skip_lines", "decode", "encoding", "errors", "newline", "per_line")

    def __init__(self, skip_lines: int, decode: bool, encoding: str, errors: str, newline: str) -> None:
        self.skip_lines = skip_lines
        self.decode = decode
        self.encoding = encoding
        self.errors = errors
        self.newline = newline
        self.per_line = errors == "strict" and _ascii_compatible(encoding)

    def lines(self, stream: Any, stage: str, skip: int) -> tuple[Iterator[Any], Any]:
        """The lines of ``stream`` after the first ``skip`` (``skip_lines``, or the lines a resumed
        pass had read: skipped before decoding), decoded where asked, and their type (``str`` or
        ``bytes``)."""
        raw = _inner(stream)
        if isinstance(raw, io.TextIOBase):
            return _skip(iter(stream), skip), str
        if isinstance(raw, (io.BufferedIOBase, io.RawIOBase)):
            if not self.decode:
                return _skip(iter(stream), skip), bytes
            if self.per_line:
                return self._decoded(_skip(iter(stream), skip)), str
            text = io.TextIOWrapper(_inner(stream), self.encoding, self.errors, newline=self.newline)
            return _skip(iter(text), skip), str
        # Some other file-like object: its first line tells whether it is text or binary.
        lines = _skip(iter(stream), skip)
        first = next(lines, _END)
        if first is _END:
            return iter(()), str
        lines = chain((first,), lines)
        if isinstance(first, str) or not self.decode:
            return lines, type(first)
        if not _ascii_compatible(self.encoding):
            raise ValueError(
                f"{stage}: cannot split the lines of a {type(raw).__name__} in {self.encoding!r}, "
                "which is not ASCII-compatible; give an io binary stream (e.g. open(path, 'rb'))"
            )
        return self._decoded(lines), str

    def _decoded(self, lines: Iterator[bytes]) -> Iterator[str]:
        # map() goes on after a line that fails to decode, so a skipped line loses only itself.
        return map(bytes.decode, lines, repeat(self.encoding), repeat(self.errors))


def _skip(lines: Iterator[Any], skip: int) -> Iterator[Any]:
    if skip:
        next(islice(lines, skip - 1, None), None)  # in C: the lines are read, not decoded or parsed
    return lines


def _line_where(path: Any, first: int, last: int) -> tuple[str, int]:
    """The ``(what, position)`` of a note naming a line (``first == last``) or a range of lines."""
    if last <= first:
        return f"file {path!r}, line", first
    return f"file {path!r}, lines {first} to", last


def _file_where(path: Any, n: int) -> tuple[str, int]:
    return f"file {path!r}, item", n


# -- CSV -------------------------------------------------------------------------------------------


def _csv_where(path: Any, offset: int, reader: Any, last: int, exc: BaseException) -> tuple[str, int]:
    """Where a CSV error happened: the lines of the row being read.

    ``last`` is the reader's line count after the last good row; a ``csv.Error`` is raised after the
    reader consumed the bad line, any other error while fetching the next line.
    """
    if reader is None:  # before the first row: the header or the skipped lines
        return _line_where(path, offset + 1, offset + 1)
    at = offset + reader.line_num + (0 if isinstance(exc, csv.Error) else 1)
    first = offset + last + 1
    return _line_where(path, first, max(at, first))


def _shape(rows: Iterator[Any], path: Any, as_tuple: bool, return_path: bool) -> Iterator[Any]:
    if as_tuple:
        rows = map(tuple, rows)
    if return_path:
        rows = zip(repeat(path), rows)
    return rows


def _csv(pipe: CSVParser, it: Iterator[Any], run: _ReadRun) -> Iterator[Any]:
    stage = stage_label(pipe)
    on_fail = _on_fail(pipe, stage)
    text = pipe._text
    fmt = pipe.fmtparams
    rows_of = pipe._rows
    n, first = run.begin(on_fail)  # n: the item (file) being read; first: the file a resumed pass was in
    try:
        for item in chain(first, it) if first else it:
            n += 1
            path, stream, skip, header = _item(item, stage, n, text.skip_lines)
            # The position in this file: ``offset`` lines the reader does not count (the skipped ones,
            # and lines that failed to decode) plus ``reader.line_num``; ``last`` is the reader's count
            # after the last good row. The run reads the same two when a state is taken.
            offset = skip
            reader = None
            last = 0
            try:
                try:
                    stream = _open_item(item, stream, run, n)
                    reader = csv.reader(text.lines(stream, stage, skip)[0], **fmt)
                    run.enter(n, path, stream, None, reader, offset)
                    rows = rows_of(pipe, reader, path, run, header)
                except Exception as e:
                    on_fail(e, *_csv_where(path, offset, reader, last, e))
                    continue
                while True:  # the rows loop is bare; after a skipped failure it resumes here
                    try:
                        for row in rows:
                            last = reader.line_num
                            yield row
                        break
                    except Exception as e:
                        if not raised_at(e, _CSV_READ):
                            raise  # thrown in at the yield by the consumer: not a failure of the file
                        on_fail(e, *_csv_where(path, offset, reader, last, e))
                        if not isinstance(e, _RECORD_ERRORS):
                            break  # the stream itself failed: skip the rest of the file
                        if not isinstance(e, csv.Error):
                            offset += 1  # a line that failed to decode: the reader did not count it
                            run.offset = offset
                        last = reader.line_num
            finally:
                _close(stream)
                run.leave()  # done with this file: a state taken now is between files
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise
    finally:
        run.end()


_CSV_READ = call_lines(_csv, "rows")


def _list_rows(pipe: CSVParser, reader: Any, path: Any, run: _ReadRun, header: Any) -> Iterator[Any]:
    return _shape(reader, path, pipe.as_tuple, pipe.return_path)


def _check_fmtparams(stage: str, fmtparams: dict[str, Any], reader: Callable[..., Any]) -> None:
    try:
        reader([], **fmtparams)
    except (TypeError, ValueError, csv.Error) as e:
        raise TypeError(f"{stage}: invalid csv format parameters {fmtparams!r}: {e}") from None


@functional_datapipe("parse_csv")
class CSVParser(IterDataPipe[Any]):
    """Parse the CSV files of ``(path, stream)`` pairs and yield their rows
    (functional name: ``parse_csv``).

    Args:
        source_datapipe: a pipe of ``(path, stream)`` pairs (binary or text streams).
        skip_lines: lines to skip at the start of each file.
        decode: decode binary streams with ``encoding``; text streams are read as they are.
        encoding: the files' encoding.
        errors: the decoding errors handler: ``"ignore"`` (default, bad bytes dropped), ``"strict"``
            (a ``UnicodeDecodeError`` naming the file and line; binary streams are then decoded
            line by line, split at ``b"\\n"``), ``"replace"``, ...
        return_path: yield ``(path, row)`` instead of ``row``.
        as_tuple: yield each row as a tuple instead of a list.
        on_error: ``"raise"`` (default) or ``"skip"``: a bad row is skipped and counted (the
            ``recent`` failures of ``pipe.failures`` hold its line number); the rest of the file
            still comes through.
        max_failures: with ``on_error="skip"``, failures tolerated per pass: a number, or a float
            between 0 and 1 for a share of the items (``None``: any).
        warn_failures: with ``on_error="skip"``, past how many failures (a number, or a share:
            10% by default) a pass warns once (``None``: never); see :mod:`datapipes.errors`.
        fmtparams: passed to ``csv.reader`` (``delimiter``, ``quotechar``, ``strict``, ...).

    Yields:
        The rows of each file in order, as lists of strings (or tuples, or ``(path, row)``).

    Raises:
        csv.Error: a malformed row (e.g. an unterminated quote with ``strict=True``), with a note
        naming the stage, the file and the row's line(s); ``UnicodeDecodeError`` with
        ``errors="strict"``; the stream's own errors (``OSError``), noted the same way.
        TypeError: an item is not a ``(path, stream)`` pair.

    Each stream is closed when its file is done (or on an error, or when the pass is closed).
    ``len()`` raises ``TypeError``: the number of rows is known only after reading.

    Example:
        >>> import io
        >>> from datapipes.iter import IterableWrapper
        >>> files = IterableWrapper([("a.csv", io.BytesIO(b"key,n\\na,1\\n"))])
        >>> list(files.parse_csv(skip_lines=1))
        [['a', '1']]
        >>> list(IterableWrapper([("b.tsv", io.StringIO("x\\ty\\n"))]).parse_csv(delimiter="\\t", return_path=True))
        [('b.tsv', ['x', 'y'])]

    See also: :class:`CSVFilesParser` (``parse_csv_files``, yields ``(path, row)``),
    :class:`CSVDictParser`, :class:`LineReader`.
    """

    _rows: Callable[..., Iterator[Any]] = staticmethod(_list_rows)

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = 0,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = False,
        as_tuple: bool = False,
        on_error: str = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        **fmtparams: Any,
    ) -> None:
        stage = type(self).__name__
        require_pipe(source_datapipe, stage, "source_datapipe")
        _check_text_args(stage, skip_lines, decode, encoding, errors)
        require_bool(return_path, stage, "return_path")
        require_bool(as_tuple, stage, "as_tuple")
        _check_fmtparams(stage, fmtparams, csv.reader)
        self.source_datapipe = source_datapipe
        self.skip_lines = skip_lines
        self.decode = decode
        self.encoding = encoding
        self.errors = errors
        self.return_path = return_path
        self.as_tuple = as_tuple
        self.fmtparams = fmtparams
        self._text = _TextOptions(skip_lines, decode, encoding, errors, newline="")
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures)

    def __iter__(self) -> Iterator[Any]:
        # The file being read and the lines of it consumed (see _ReadRun).
        return _csv(self, iter(self.source_datapipe), _read_run(self, self.source_datapipe))

    def __len__(self) -> int:
        raise len_unknown(self, "the number of rows is known only after reading the files", NO_LEN)


@functional_datapipe("parse_csv_files")
class CSVFilesParser(CSVParser):
    """Parse the CSV files of ``(path, stream)`` pairs and yield ``(path, row)`` pairs
    (functional name: ``parse_csv_files``), as in the torch DataPipes guide.

    The same reader as :class:`CSVParser` (same arguments), with ``return_path=True`` by default.

    Args:
        source_datapipe: a pipe of ``(path, stream)`` pairs (binary or text streams).
        skip_lines, decode, encoding, errors, as_tuple, on_error, max_failures, warn_failures: as
            :class:`CSVParser`.
        return_path: yield ``(path, row)`` (the default); ``False``: ``row`` alone.
        fmtparams: passed to ``csv.reader``, as :class:`CSVParser`.

    Example:
        >>> import io
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([("a.csv", io.StringIO("1,2\\n3,4\\n"))]).parse_csv_files())
        [('a.csv', ['1', '2']), ('a.csv', ['3', '4'])]

    See also: :class:`CSVParser` (``parse_csv``, yields rows), :class:`CSVDictParser`.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = 0,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = True,
        as_tuple: bool = False,
        on_error: str = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        **fmtparams: Any,
    ) -> None:
        super().__init__(
            source_datapipe, skip_lines=skip_lines, decode=decode, encoding=encoding, errors=errors,
            return_path=return_path, as_tuple=as_tuple, on_error=on_error, max_failures=max_failures,
            warn_failures=warn_failures, **fmtparams,
        )


# -- CSV as dicts ----------------------------------------------------------------------------------

_DICT_READER_ARGS = ("fieldnames", "restkey", "restval")


def _strict_dict(header: list[str]) -> Callable[[list[str]], dict[str, str]]:
    n = len(header)

    def make(row: list[str]) -> dict[str, str]:
        if len(row) != n:
            raise csv.Error(
                f"row has {len(row)} field{'' if len(row) == 1 else 's'} but the header has {n} "
                f"({header!r:.200}): {row!r:.200}"
            )
        return dict(zip(header, row))

    return make


def _lenient_dict(header: list[str], restkey: Any, restval: Any) -> Callable[[list[str]], dict[Any, Any]]:
    # csv.DictReader's rule: extra fields go to a list under restkey, missing ones get restval.
    n = len(header)

    def make(row: list[str]) -> dict[Any, Any]:
        d: dict[Any, Any] = dict(zip(header, row))
        if len(row) > n:
            d[restkey] = row[n:]
        elif len(row) < n:
            for key in header[len(row):]:
                d[key] = restval
        return d

    return make


def _dict_rows(pipe: CSVDictParser, reader: Any, path: Any, run: _ReadRun, header: Any) -> Iterator[Any]:
    # ``header``: the one a resumed pass saved (the reader starts after it); else read it here
    if header is None:
        header = pipe.fieldnames
        if header is None:
            first = next(reader, _END)
            if first is _END:
                return iter(())
            header = first
    if header is not pipe.fieldnames:
        run.header = header  # the state saves it: a resumed pass starts after the header
    make = _lenient_dict(header, pipe.restkey, pipe.restval) if pipe._lenient else _strict_dict(header)
    # filter(None, ...) drops blank rows, as csv.DictReader does.
    return _shape(map(make, filter(None, reader)), path, False, pipe.return_path)


@functional_datapipe("parse_csv_as_dict")
class CSVDictParser(CSVParser):
    """Parse the CSV files of ``(path, stream)`` pairs and yield each row as a dict keyed by the
    header (functional name: ``parse_csv_as_dict``).

    The first row of each file (after ``skip_lines``) is its header, unless ``fieldnames`` is given.
    Blank rows are skipped, as ``csv.DictReader`` does.

    Args:
        source_datapipe: a pipe of ``(path, stream)`` pairs.
        skip_lines, decode, encoding, errors, return_path, on_error, max_failures, warn_failures: as
            :class:`CSVParser`; with ``on_error="skip"`` a bad row is skipped and counted.
        fmtparams: ``csv.reader`` parameters, and ``fieldnames`` (the keys, for files without a
            header), ``restkey`` and ``restval``. A row whose field count differs from the header
            raises ``csv.Error``, unless ``restkey`` or ``restval`` is given: then, as
            ``csv.DictReader``, extra fields go to a list under ``restkey`` and missing ones get
            ``restval``.

    Yields:
        ``{column: value}`` for each row (or ``(path, dict)`` with ``return_path=True``).

    Raises:
        csv.Error: a malformed row, or a row with more or fewer fields than the header, with a note
            naming the stage, the file and the line. Otherwise as :class:`CSVParser`.

    Example:
        >>> import io
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([("a.csv", io.BytesIO(b"key,n\\na,1\\n\\nb,2\\n"))]).parse_csv_as_dict())
        [{'key': 'a', 'n': '1'}, {'key': 'b', 'n': '2'}]

    See also: :class:`CSVParser`.
    """

    _rows = staticmethod(_dict_rows)

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = 0,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = False,
        on_error: str = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        **fmtparams: Any,
    ) -> None:
        stage = "CSVDictParser"
        if "as_tuple" in fmtparams:
            raise TypeError(f"{stage}: as_tuple does not apply: rows are dicts")
        fieldnames = fmtparams.pop("fieldnames", None)
        self._lenient = "restkey" in fmtparams or "restval" in fmtparams
        self.restkey = fmtparams.pop("restkey", None)
        self.restval = fmtparams.pop("restval", None)
        if fieldnames is not None:
            if isinstance(fieldnames, (str, bytes)) or not isinstance(fieldnames, Sequence):
                raise TypeError(
                    f"{stage}: fieldnames must be a sequence of column names, got {type(fieldnames).__name__}"
                )
            fieldnames = list(fieldnames)
        self.fieldnames = fieldnames
        super().__init__(
            source_datapipe, skip_lines=skip_lines, decode=decode, encoding=encoding, errors=errors,
            return_path=return_path, on_error=on_error, max_failures=max_failures, warn_failures=warn_failures,
            **fmtparams,
        )


# -- JSON ------------------------------------------------------------------------------------------


def _json_where(path: Any, n: int, data: Any, exc: BaseException) -> tuple[str, int]:
    if isinstance(exc, json.JSONDecodeError):
        return _line_where(path, exc.lineno, exc.lineno)
    if isinstance(exc, UnicodeDecodeError) and isinstance(data, (bytes, bytearray)):
        line = data.count(b"\n", 0, exc.start) + 1
        return _line_where(path, line, line)
    return _file_where(path, n)


def _read_all(stream: Any) -> Any:
    try:
        return stream.read()
    finally:
        _close(stream)


def _json(pipe: JsonParser, it: Iterator[Any], run: _CountRun) -> Iterator[tuple[Any, Any]]:
    stage = stage_label(pipe)
    on_fail = _on_fail(pipe, stage)
    kwargs = pipe.kwargs
    loads = json.loads
    try:
        for n, item in run.begin(it, on_fail):  # n: the item (file) being read
            path, stream = _pair(item, stage, n)
            data = None
            try:
                data = _read_all(stream)
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
        kwargs: passed to ``json.loads`` (``object_hook``, ``parse_float``, ``cls``, ...).

    Yields:
        ``(path, json.loads(stream.read()))`` for each pair, in order. Each stream is read whole
        (a JSON document cannot be parsed line by line) and closed.

    Raises:
        json.JSONDecodeError (a ``ValueError``): invalid JSON, with a note naming the stage, the
        file and the line; ``UnicodeDecodeError`` for bytes that are not UTF-8/16/32.
        TypeError: an item is not a ``(path, stream)`` pair.

    ``len()`` is the source's length.

    Example:
        >>> import io
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([("a.json", io.BytesIO(b'{"x": [1, 2]}'))]).parse_json_files())
        [('a.json', {'x': [1, 2]})]

    See also: :class:`LineReader` (``readlines``) then ``map(json.loads)`` for JSON lines files.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        on_error: str = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        **kwargs: Any,
    ) -> None:
        require_pipe(source_datapipe, "JsonParser", "source_datapipe")
        decoder = kwargs.get("cls") or json.JSONDecoder
        try:
            decoder(**{k: v for k, v in kwargs.items() if k != "cls"})
        except TypeError as e:
            raise TypeError(f"JsonParser: invalid json.loads arguments {sorted(kwargs)}: {e}") from None
        self.source_datapipe = source_datapipe
        self.kwargs = kwargs
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures)
        # one object per file, each read whole: its position is its source's (but a failure budget's count)
        self._stateless = _budget_stateless(self)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return _json(self, iter(self.source_datapipe), _count_run(self))

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")


# -- lines -----------------------------------------------------------------------------------------


def _open_lines(pipe: LineReader, stream: Any, path: Any, stage: str, skip: int) -> Iterator[Any]:
    lines, kind = pipe._text.lines(stream, stage, skip)
    if pipe.strip_newline:
        lines = map(kind.rstrip, lines, repeat("\r\n" if kind is str else b"\r\n"))
    return zip(repeat(path), lines) if pipe.return_path else lines


def _lines(pipe: LineReader, it: Iterator[Any], run: _ReadRun) -> Iterator[Any]:
    stage = stage_label(pipe)
    on_fail = _on_fail(pipe, stage)
    n, first = run.begin(on_fail)  # n: the item (file) being read; first: the file a resumed pass was in
    try:
        for item in chain(first, it) if first else it:
            n += 1
            path, stream, skip, _ = _item(item, stage, n, pipe.skip_lines)
            # The lines of this file read so far: ``offset`` (skipped, or failed to decode) plus those
            # yielded, which the Counted iterator counts (read by the run when a state is taken).
            offset = skip
            try:
                try:
                    stream = _open_item(item, stream, run, n)
                    lines = Counted(_open_lines(pipe, stream, path, stage, skip))
                    run.enter(n, path, stream, lines, None, offset)
                except Exception as e:
                    on_fail(e, *_line_where(path, offset + 1, offset + 1))
                    continue
                while True:  # the lines loop is bare; after a skipped failure it resumes here
                    try:
                        for line in lines:
                            yield line
                        break
                    except Exception as e:
                        if not raised_at(e, _LINES_READ):
                            raise  # thrown in at the yield by the consumer: not a failure of the file
                        k = offset + lines.count() + 1  # the line being read
                        on_fail(e, *_line_where(path, k, k))
                        if not isinstance(e, _RECORD_ERRORS):
                            break  # the stream itself failed: skip the rest of the file
                        offset += 1  # a line that failed to decode: read, not yielded
                        run.offset = offset
            finally:
                _close(stream)
                run.leave()  # done with this file: a state taken now is between files
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise
    finally:
        run.end()


_LINES_READ = call_lines(_lines, "lines")


@functional_datapipe("readlines")
class LineReader(IterDataPipe[Any]):
    """Yield the lines of the streams of ``(path, stream)`` pairs (functional name: ``readlines``).

    Args:
        source_datapipe: a pipe of ``(path, stream)`` pairs.
        skip_lines: lines to skip at the start of each file.
        strip_newline: remove the line ending (``"\\n"``, ``"\\r\\n"``).
        decode: decode the lines of binary streams to ``str`` (off by default, as in torchdata:
            binary streams give ``bytes`` lines).
        encoding, errors: how to decode, as :class:`CSVParser`.
        return_path: yield ``(path, line)`` (the default) instead of ``line``.
        on_error: ``"raise"`` (default) or ``"skip"``: a line that fails to decode is skipped and
            counted; an error of the stream skips the rest of that file.
        max_failures: with ``on_error="skip"``, failures tolerated per pass: a number, or a float
            between 0 and 1 for a share of the items (``None``: any).
        warn_failures: with ``on_error="skip"``, past how many failures (a number, or a share:
            10% by default) a pass warns once (``None``: never); see :mod:`datapipes.errors`.

    Yields:
        ``(path, line)`` or ``line`` for each line of each file, in order, read lazily.

    Raises:
        UnicodeDecodeError with ``errors="strict"``, or the stream's own errors, with a note naming
        the stage, the file and the line. TypeError: an item is not a ``(path, stream)`` pair.

    ``len()`` raises ``TypeError``: the number of lines is known only after reading.

    Example:
        >>> import io
        >>> from datapipes.iter import IterableWrapper
        >>> files = IterableWrapper([("a.txt", io.StringIO("one\\ntwo\\n")), ("b.txt", io.BytesIO(b"3\\r\\n"))])
        >>> list(files.readlines())
        [('a.txt', 'one'), ('a.txt', 'two'), ('b.txt', b'3')]
        >>> list(IterableWrapper([("b.txt", io.BytesIO(b"x\\ny\\n"))]).readlines(decode=True, return_path=False))
        ['x', 'y']

    See also: :class:`CSVParser`, :class:`JsonParser`.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = 0,
        strip_newline: bool = True,
        decode: bool = False,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = True,
        on_error: str = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
    ) -> None:
        stage = "LineReader"
        require_pipe(source_datapipe, stage, "source_datapipe")
        _check_text_args(stage, skip_lines, decode, encoding, errors)
        require_bool(strip_newline, stage, "strip_newline")
        require_bool(return_path, stage, "return_path")
        self.source_datapipe = source_datapipe
        self.skip_lines = skip_lines
        self.strip_newline = strip_newline
        self.decode = decode
        self.encoding = encoding
        self.errors = errors
        self.return_path = return_path
        self._text = _TextOptions(skip_lines, decode, encoding, errors, newline="\n")
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures)

    def __iter__(self) -> Iterator[Any]:
        # The file being read and the lines of it consumed (see _ReadRun).
        return _lines(self, iter(self.source_datapipe), _read_run(self, self.source_datapipe))

    def __len__(self) -> int:
        raise len_unknown(self, "the number of lines is known only after reading the files", NO_LEN)
