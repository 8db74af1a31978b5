"""The runtime shared by the readers of ``(path, stream)`` pairs, as :class:`~datapipes.iter.FileOpener`
yields them: the text formats of :mod:`datapipes.iter.io` (:mod:`~datapipes.iter.io.csv`,
:mod:`~datapipes.iter.io.json`, :mod:`~datapipes.iter.io.lines`) and the archive, decompression,
TFRecord, hash, image, decoding and Parquet stages import its private names: the check of the pairs,
failure handling (``on_error``), the position a checkpoint saves (:class:`_ReadRun`, :class:`_CountRun`),
the reopening or in-memory copy of a stream on resume, the streams a state holds (registered with
:mod:`datapipes._runtime.held`), and the options of text (``skip_lines``, ``decode``, ``encoding``, ``errors``).

In the text readers, streams are read lazily, line by line (JSON reads one whole file, as it must),
and each stream is closed when the reader is done with it: at its end, on an error, or when the
pass is closed early. A stream may be binary (decoded with ``encoding``/``errors``) or text (used
as it is).

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

A state may come from someone else, and the path in it is not trusted: an opener opens again only
a path its source yields (:class:`_CheckedReopen`). Its source is read again from its start, in a
side pass with the pass's seeds and every shard's items (``_pass.replayed``: the paths only, no
file is opened), until every path the state names from that opener has come, at most
``passes.REPLAY_SLACK`` items past the position the state gives; a path that does not come is refused
with ``ValueError`` naming the stage and the path. One reading serves all the streams a state holds
from one opener, once per resume. A source that cannot be read again (a one-shot or async
iterable) cannot check a path: its opener's streams cannot be resumed.
"""

from __future__ import annotations

import codecs
import csv
import io
import os
from itertools import chain, islice, repeat
from typing import Any, Callable, Iterator, Protocol

from .._redact import redact
from .._runtime import held as _held, passes as _pass
from .._runtime.passes import Pass
from .._runtime.validate import check_bool, check_dict, check_int, check_list, check_str, invalid
from .._positions import Enumerated
from .._checks import phrased, require_bool
from ..datapipe import require_int, stage_label
from ..graph import sources_of
from ..errors import add_stage_note
from .fileio import StreamWrapper
from .._engine.lifecycle import Resumable

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


def _reopener(source: Any, ctx: Pass | None = None) -> Callable[[Any, int], Any] | None:
    """How to open again, by its path, the stream of an item of ``source`` (``reopen(path, n)``):
    an opener can (``FileOpener._reopener``, ...), for a path its source yields only; ``None`` for
    any other source. ``ctx``: the pass of the reader asking (the pass whose side pass checks a
    path); ``None`` where none is handed (a stream a state holds, a stage over an opener)."""
    make = getattr(source, "_reopener", None)
    reopen = None if make is None else make()
    if reopen is None or not _opens_paths(source):
        return reopen  # a stage over an opener (decompress, ...) reopens through the opener's
    return _CheckedReopen(source, reopen, ctx)


def _opens_paths(stage: Any) -> bool:
    """Whether ``stage`` (which can open its items again) opens the paths its source yields, rather
    than the streams of an opener below it."""
    return not any(getattr(s, "_reopener", None) is not None for s in sources_of(stage))


def _path_key(path: Any) -> Any:
    """``path`` as its source's items are compared with it (``None``: not a path)."""
    if isinstance(path, (str, bytes, os.PathLike)):
        return os.fspath(path)
    return None


class _CheckedReopen:
    """An opener's ``reopen(path, n)`` that opens only a path its source yields (see the module's
    docstring): a path named by a state is checked first (:func:`_check_paths`), in the pass of the
    reader that made it (``pass_``), or, made where no pass is handed (a stream a state holds, a
    stage over an opener), in the live pass that built the opener."""

    __slots__ = ("opener", "reopen", "pass_")

    def __init__(self, opener: Any, reopen: Callable[[Any, int], Any], pass_: Pass | None = None) -> None:
        self.opener = opener
        self.reopen = reopen
        self.pass_ = pass_

    def __call__(self, path: Any, n: int) -> Any:
        self.check(path, n, stage_label(self.opener))
        return self.reopen(path, n)

    def check(self, path: Any, n: int, where: str) -> None:
        """Raise ``ValueError`` (naming ``where``) unless the opener's source yields ``path``; a
        reader calls it as its state is loaded, so that the error comes from ``load_state_dict``."""
        key = _path_key(path)
        if key is None:
            invalid(f"the state names {path!r:.100} for {stage_label(self.opener)} to open again, which is not a "
                    f"path", where)
        pass_ = self.pass_
        if pass_ is None:  # no pass handed (see the class's docstring)
            pass_ = _pass.current() or _pass.owner(self.opener)
        _check_paths(self.opener, {key: (path, n, where)}, pass_)


def _check_paths(opener: Any, wanted: dict[Any, tuple[Any, int, str]], pass_: Any) -> None:
    """Raise ``ValueError`` unless ``opener``'s source yields every path in ``wanted`` (path key ->
    ``(path, its position n, where)``: ``where`` names the stage whose state gave it): see
    :func:`datapipes._runtime.passes.check_yields`."""
    sources = sources_of(opener)
    if len(sources) != 1:
        path, _, where = next(iter(wanted.values()))
        invalid(f"the state names {path!r:.100} for {stage_label(opener)} to open again, and it has no single "
                f"source to check it against", where)
    _pass.check_yields(opener, sources[0], wanted, pass_, _path_key, "open")


def _check_memory(copy: Any, what: str = "a saved stream's 'memory'", depth: int = 0) -> None:
    """Check the copy of an in-memory stream (:func:`_copied`'s form) before it is made again."""
    if type(copy) is not list or not copy or type(copy[0]) is not str:
        invalid(f"{what} must be a list [kind, ...], got {copy!r:.100}")
    kind = copy[0]
    if kind == "bytes" and len(copy) == 2 and type(copy[1]) in (bytes, bytearray):
        return
    if kind == "text" and len(copy) == 3 and type(copy[1]) is str and copy[2] in (None, "", "\n", "\r", "\r\n"):
        return
    if kind in _REWRAP and len(copy) == 3 and type(copy[1]) is str and depth < 8:
        _check_memory(copy[2], what, depth + 1)
        return
    invalid(f"{what} is not the copy of an in-memory stream: {copy!r:.100}")


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
            f"{stage} cannot save its position inside {redact(repr(path))}: its source cannot open that file again by its "
            f"path (an opener can: open_files, open_files_by_fsspec, decompress after one) and its stream, a "
            f"{type(_inner(stream)).__name__}, is not in memory (io.BytesIO, io.StringIO)"
        )
    return copy


#: how a copied stream that wraps another is made again: ``{"decompressed": fn(fmt, inner stream)}``,
#: filled by archive.py (which imports this module)
_REWRAP: dict[str, Callable[[Any, Any], Any]] = {}


def _from_memory(copy: list[Any]) -> Any:
    """The stream :func:`_memory_copy` copied, at its start (``ValueError`` for a copy of another
    form: it may come from a state someone else saved)."""
    _check_memory(copy)
    if copy[0] == "bytes":
        return io.BytesIO(copy[1])
    if copy[0] == "text":
        stream = io.StringIO()
        stream.__setstate__((copy[1], copy[2], 0, None))  # type: ignore[attr-defined]  # no newline translated again
        return stream
    return _REWRAP[copy[0]](copy[1], _from_memory(copy[2]))


# -- streams inside the items a state holds (datapipes._runtime.held) -------------------------------------


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
    """How a pass state saves the streams inside the items its stages hold (see datapipes._runtime.held)."""

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

    def prepare(self, saved: list[tuple[str, Any]], stage_at: Callable[[str], Any], pass_: Any) -> None:
        wanted: dict[int, tuple[Any, dict[Any, tuple[Any, int, str]]]] = {}  # id(opener) -> (opener, paths)
        for where, one in saved:
            stage = _saved_stage(one, stage_at, where)
            if stage is None:
                continue
            opener = _opener_below(stage)
            if opener is None:
                invalid(f"a saved stream names {stage_label(stage)}, which has no opener below it to open "
                        f"{one['path']!r:.100} again", where)
            paths = wanted.setdefault(id(opener), (opener, {}))[1]
            paths.setdefault(_path_key(one["path"]), (one["path"], one["n"], where))
        for opener, paths in wanted.values():
            _check_paths(opener, paths, pass_)

    def thaw(self, saved: Any, stage_at: Callable[[str], Any]) -> Any:
        stage = _saved_stage(saved, stage_at, "")
        if stage is None:
            stream = _from_memory(saved["memory"])
        else:
            reopen = _origin_reopener(stage)  # an opener's checks the path (_CheckedReopen)
            if reopen is None:  # pragma: no cover - _saved_stage checked that it has one
                invalid(f"{stage_label(stage)} cannot open {saved['path']!r:.100} again")
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


def _saved_stage(saved: Any, stage_at: Callable[[str], Any], where: str) -> Any:
    """The stage a saved stream names to open it again (``None``: a copy in memory), once the saved
    form is checked: ``ValueError`` (naming ``where``) for one that does not fit this pass."""
    check_dict(saved, "a saved stream", where)
    check_bool(saved, "wrapped", where=where)
    name = saved.get("name")
    if name is not None and (type(name) is bool or not isinstance(name, (str, bytes, int, os.PathLike))):
        invalid(f"a saved stream's 'name' must be a str or None, got {name!r:.100}", where)
    if ("memory" in saved) == ("open" in saved):
        invalid(f"a saved stream holds either 'memory' (a copy) or 'open' (the stage to open it again): "
                f"{saved!r:.200}", where)
    if "memory" in saved:
        _check_memory(saved["memory"])
        return None
    key = check_str(saved, "open", where=where)
    check_int(saved, "n", where=where)
    if _path_key(saved.get("path")) is None:
        invalid(f"a saved stream's 'path' must be a path, got {saved.get('path')!r:.100}", where)
    try:
        stage = stage_at(key)
    except KeyError:
        invalid(f"a saved stream names the stage {key!r}, and this pipe has none by that key", where)
    if _origin_reopener(stage) is None:
        invalid(f"a saved stream names {stage_label(stage)} ({key!r}) to open it again, which opens no files (an "
                f"opener of the pipe does: open_files, open_files_by_fsspec, read_from_http, decompress after one)",
                where)
    return stage


def _opener_below(stage: Any) -> Any:
    """The opener whose source's paths ``stage`` (an opener, or a decompressor over one) opens."""
    while not _opens_paths(stage):
        below = [s for s in sources_of(stage) if getattr(s, "_reopener", None) is not None]
        if len(below) != 1:
            return None
        stage = below[0]
    return stage

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


class _FileRun(Resumable):
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

    def load(self: _FileRunSlots, state: dict[str, Any]) -> None:
        _check_file_run(state)
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


def _check_file_run(state: Any) -> None:
    """The checks of a file reader's state (:class:`_FileRun`): the item read (-1: none yet), the
    failures counted, the file it is inside (a dict, or None) and the records of the files done."""
    check_dict(state, keys=("n", "failures", "file"))
    check_int(state, "n", -1)
    check_int(state, "failures")
    check_int(state, "seen", default=0)
    if state["file"] is not None:
        check_dict(state["file"], "state['file']")
        if state["n"] < 0:
            invalid(f"state['n'] must be >= 0 inside a file, got {state['n']}")


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
                 "resume", "done")

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

    def load(self, state: dict[str, Any]) -> None:
        _check_file_run(state)
        file = state["file"]
        if file is not None:
            check_dict(file, "state['file']", keys=("path", "at", "header", "memory"))
            check_int(file, "at")
            header = check_list(file, "header", optional=True)
            if header is not None and any(type(h) is not str for h in header):
                invalid(f"state['file']['header'] must be a list of str, got {header!r:.100}")
            if file["memory"] is not None:
                _check_memory(file["memory"], "state['file']['memory']")
            elif isinstance(self.reopen, _CheckedReopen):  # opened again through an opener: a path it yields
                self.reopen.check(file["path"], state["n"], "")
        self.resume = state

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


def _read_run(pipe: Any, ctx: Pass, source: Any) -> _ReadRun:
    """The run of a reader's pass ``ctx`` over ``source``, recorded in that pass."""
    run = _ReadRun(stage_label(pipe), _reopener(source, ctx))
    ctx.track(pipe, run)
    return run


class _CountRun(Resumable):
    """The position of a one-to-one reader's pass under a failure budget (``max_failures``): the
    failures counted (a resumed pass gives up where the uninterrupted one would) and the items
    pulled (the positions the notes name), read from the loop's ``Enumerated``: two ints. Without a
    budget the stage is stateless and this run is not recorded."""

    __slots__ = ("failures", "counted", "resume")

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

    def load(self, state: dict[str, Any]) -> None:
        check_int(state, "n")
        check_int(state, "failures")
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


def _count_run(pipe: Any, ctx: Pass) -> _CountRun:
    """The run of a one-to-one reader's pass ``ctx``, recorded in that pass under a failure
    budget (the stage's ``_stateless`` is then False)."""
    run = _CountRun()
    if not pipe._stateless:
        ctx.track(pipe, run)
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
