"""A reader of the lines of ``(path, stream)`` pairs, as :class:`~datapipes.iter.FileOpener` yields
them: LineReader [readlines].

Lines are read lazily on the runtime of :mod:`datapipes.iter._readers`: a line that fails to decode
reaches the consumer with a note naming its file and line, or is skipped under ``on_error="skip"``;
a checkpoint saves the file and the lines read, which a resumed pass skips without decoding them.

This module also holds what the text readers (``readlines`` and the CSV readers of
:mod:`~datapipes.iter.io.csv`) share about data they did not write (docs/howto/security.rst):

- **A line has a bounded length** (``max_line_length``, :data:`MAX_LINE_LENGTH` by default): a
  longer one raises :class:`~datapipes.errors.SizeLimitError` naming the limit, with the note naming
  the stage, the file and the line, having held at most about the limit of it, so a small gzip of
  one huge line cannot take the memory. The lines are measured a block at a time where they are
  split (see "line length" below), so ordinary lines cost nothing more.
- **Bytes dropped by the default ``errors`` are counted**: left at its default (``"ignore"``, as
  torchdata's), the bytes that do not decode are still dropped, but counted, and a file that had
  some warns once (a ``UnicodeWarning`` naming the file and the count) when the reader is done with
  it. ``errors="ignore"`` given by name drops them silently, as asked.
"""

from __future__ import annotations

import codecs
import io
import threading
import warnings
from functools import partial
from itertools import chain, repeat
from typing import Any, Callable, Iterator, Literal, overload

from ..._checks import require_bool
from ..._engine import abandon
from ..._engine import close_iterator as _close
from ..._runtime.passes import Pass
from ..._positions import Counted
from ..._redact import redact
from ...datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_int, require_pipe, stage_label
from ...errors import WARN_FAILURES, SizeLimitError, _OnError, call_lines, policy_and_log, raised_at
from .._readers import (
    _END,
    _RECORD_ERRORS,
    _ascii_compatible,
    _check_text_args,
    _inner,
    _item,
    _line_where,
    _on_fail,
    _open_item,
    _read_run,
    _ReadRun,
    _skip,
    _TextOptions,
)

__all__ = ["LineReader"]

#: The default ``max_line_length`` of the text readers (``readlines``, ``parse_csv``,
#: ``parse_csv_files``, ``parse_csv_as_dict``): 64 Mi characters (bytes where lines are split as
#: bytes), the line ending included. Far above any line of real text data (a JSON-lines record with
#: an embedded image is a few MiB; ``csv`` itself refuses fields over 128 KiB by default), while a
#: hostile line costs a reader at most a few times that (the line's bytes and its decoded text).
MAX_LINE_LENGTH = 64 << 20


class _DefaultErrors(str):
    """The type of the text readers' default ``errors``: the string ``"ignore"`` (torchdata's
    default, which ``help()`` shows), a distinct object so that a reader tells the default (bytes
    dropped are counted, a file with some warns) from ``errors="ignore"`` given by name (silent)."""

    __slots__ = ()


#: The text readers' default ``errors``: ``"ignore"``, with the bytes it drops counted per file.
IGNORE_COUNTED: str = _DefaultErrors("ignore")


# -- line length -----------------------------------------------------------------------------------
#
# Where the lines are split decides where they are measured, so that ordinary lines cost nothing more:
# - bytes lines (decode=False, and errors="strict", which decodes line by line): the stream is read in
#   blocks, each cut after its last line ending and split by io.BytesIO in C (_byte_lines);
# - decoded text: the decoder io.TextIOWrapper calls once per block (8 KiB) is wrapped in one that
#   measures the block's lines (_LineBoundDecoder, reached through a codec name: _bounded_encoding);
#   a text stream a reader is given is switched to it with reconfigure() before its first read;
# - anything else (a text stream already read from, io.StringIO, another file-like object): each line
#   read with readline(limit + 1) and measured in Python (_bounded).
# A line longer than the limit raises when the reader comes to it: the lines before it come through.


def _too_long(limit: int, unit: str) -> SizeLimitError:
    return SizeLimitError(
        f"a line is longer than max_line_length={limit:,} {unit}, its line ending included: pass a larger "
        f"max_line_length (None: no limit) to read such lines"
    )


def _scan(chunk: Any, run: int, limit: int, nl: Any, cr: Any) -> tuple[int, int]:
    """Measure the lines of ``chunk`` (bytes or str), the first of which continues a line of ``run``
    units, against ``limit``; ``nl`` (and ``cr`` unless None) end a line. Returns ``(the length of the
    unterminated line at its end, -1)``, or ``(_, where)``: the first line longer than the limit
    starts at ``where`` (0: the line continued from before).

    A chunk no longer than the limit costs a ``rfind`` (and a bounded ``find`` where a line goes on
    from the last chunk): a line inside it is within the limit."""
    n = len(chunk)
    last = chunk.rfind(nl) if cr is None else max(chunk.rfind(nl), chunk.rfind(cr))
    if last < 0:
        run += n
        return run, -1 if run <= limit else 0
    if n <= limit:
        if run:  # the line going on ends within limit - run units, or it is too long
            k = limit - run
            if chunk.find(nl, 0, k) < 0 and (cr is None or chunk.find(cr, 0, k) < 0):
                return run, 0
        return n - last - 1, -1
    start = 0  # a chunk longer than the limit (a small one): every line measured
    while start <= last:
        end = chunk.find(nl, start)
        if cr is not None:
            c = chunk.find(cr, start)
            if c >= 0 and (end < 0 or c < end):
                end = c
        if run + end - start + 1 > limit:
            return run, start
        run = 0
        start = end + 1
    run = n - start
    return run, -1 if run <= limit else start


_BLOCK = 64 << 10  # bytes read at a time for bytes lines


def _byte_blocks(read: Callable[[int], Any], limit: int) -> Iterator[bytes]:
    """Blocks of whole lines (the last one may lack its ending) of a binary stream, each line
    within ``limit``: at most about ``limit`` bytes of a line are held before it raises."""
    carry: list[bytes] = []  # the line going on from the last blocks, in parts
    run = 0
    while True:
        data = read(_BLOCK)
        if not data:
            if carry:
                yield b"".join(carry)
            return
        n = len(data)
        run, bad = _scan(data, run, limit, b"\n", None)
        if bad == 0:
            raise _too_long(limit, "bytes")
        cut = bad if bad > 0 else (n - run if run < n else 0)  # where the whole lines of this block end
        if cut:
            yield b"".join((*carry, data[:cut])) if carry else data[:cut]
            carry = [data[cut:]] if cut < n else []
        else:
            carry.append(data)
        if bad > 0:  # the lines before it are out: the next request is for the long one
            raise _too_long(limit, "bytes")


def _byte_lines(raw: Any, limit: int | None) -> Iterator[bytes]:
    """The lines of the binary stream ``raw``, as iterating it gives them, each within ``limit``."""
    if limit is None:
        return iter(raw)
    # read1 where there is one: what one read of the layer below gives, so that the lines before a
    # damaged spot (a truncated xz stream, a dropped connection) come through before its error
    return chain.from_iterable(map(io.BytesIO, _byte_blocks(getattr(raw, "read1", raw.read), limit)))


_UNWRAPPED = object()  # what TextIOWrapper.newlines gives when our decoder is not under its newline decoder


class _LineBoundDecoder(codecs.IncrementalDecoder):
    """An incremental decoder (``inner``) whose text has each line measured against ``limit``
    characters; ``"\\n"`` ends a line, and ``"\\r"`` too where ``cr`` (universal newlines).

    ``io.TextIOWrapper`` decodes a block at a time, and asks for the next only while it looks for
    the end of the line being read: a line that goes on past the limit raises then. A longer line
    inside one block (a limit under the block size) is cut off, and the error raised at the next
    call, so that the lines before it come through first."""

    newlines: Any = _UNWRAPPED  # TextIOWrapper.newlines reads this where no newline decoder wraps this one

    def __init__(self, inner: Any, limit: int, cr: bool) -> None:
        super().__init__(getattr(inner, "errors", "strict"))
        self._inner = inner
        self._decode = inner.decode
        self._limit = limit
        self._cr = "\r" if cr else None
        self._run = 0
        self._pending = False

    def decode(self, input: Any, final: bool = False) -> str:
        if self._pending:
            raise _too_long(self._limit, "characters")
        text = self._decode(input, final)
        if not text:
            return text
        self._run, bad = _scan(text, self._run, self._limit, "\n", self._cr)
        if bad < 0:
            return text
        if bad == 0:
            raise _too_long(self._limit, "characters")
        self._pending = True
        return text[:bad]

    def reset(self) -> None:
        self._inner.reset()
        self._run = 0
        self._pending = False

    def getstate(self) -> Any:
        return self._inner.getstate()

    def setstate(self, state: Any) -> None:
        self._inner.setstate(state)


_CODEC = "datapipes_lines."  # the codec names _search answers: datapipes_lines.<limit>.<cr|lf>.<encoding>
_REGISTERED = threading.Lock()
_SEARCH_ON: list[bool] = []


def _search(name: str) -> codecs.CodecInfo | None:
    """The codec search function for the names :func:`_bounded_encoding` makes (``codecs.lookup``
    hands it the name lower-cased, ``-`` and spaces as ``_``)."""
    if not name.startswith(_CODEC):
        return None
    _, limit, cr, encoding = name.split(".", 3)
    inner = codecs.lookup(encoding)
    bound, universal = int(limit), cr == "cr"

    def decoder(errors: str = "strict") -> _LineBoundDecoder:
        return _LineBoundDecoder(inner.incrementaldecoder(errors), bound, universal)

    return codecs.CodecInfo(
        inner.encode, inner.decode, streamreader=inner.streamreader, streamwriter=inner.streamwriter,
        incrementalencoder=inner.incrementalencoder, incrementaldecoder=decoder, name=name,
        _is_text_encoding=getattr(inner, "_is_text_encoding", True),
    )


def _bounded_encoding(encoding: str, limit: int, cr: bool) -> str:
    """A codec name that decodes as ``encoding`` with each line measured against ``limit``
    (:class:`_LineBoundDecoder`). The search function is registered once, at the first use; the
    codec registry keeps one entry per (limit, cr, encoding) used."""
    if not _SEARCH_ON:
        with _REGISTERED:
            if not _SEARCH_ON:
                codecs.register(_search)
                _SEARCH_ON.append(True)
    return f"{_CODEC}{limit}.{'cr' if cr else 'lf'}.{encoding}"


def _bounded(readline: Callable[[int], Any], limit: int) -> Iterator[Any]:
    """The lines ``readline(limit + 1)`` returns (``str`` or ``bytes``), each measured: the
    fallback, one line at a time in Python."""
    cap = limit + 1
    while True:
        line = readline(cap)
        if not line:
            return
        if len(line) > limit:
            raise _too_long(limit, "characters" if isinstance(line, str) else "bytes")
        yield line


def _text_lines(raw: Any, limit: int | None) -> Iterator[str]:
    """The lines of the text stream ``raw``, each within ``limit``: an ``io.TextIOWrapper`` at the
    start of its file with universal newlines (``newline=None``, ``open``'s default, or ``""``) is
    switched to the measuring decoder (no cost per line); any other is measured line by line."""
    if limit is None:
        return iter(raw)
    if isinstance(raw, io.TextIOWrapper) and _at_start(raw):
        encoding = raw.encoding
        try:
            raw.reconfigure(encoding=_bounded_encoding(encoding, limit, True), errors=raw.errors)
        except (io.UnsupportedOperation, ValueError, LookupError, AttributeError):
            pass  # its decoder is kept
        else:
            if raw.newlines is not _UNWRAPPED:  # universal newlines: lines end at "\\r" too, as measured
                return iter(raw)
            raw.reconfigure(encoding=encoding, errors=raw.errors)  # newline="\\n", "\\r" or "\\r\\n"
    return _bounded(raw.readline, limit)


def _at_start(text: Any) -> bool:
    """Whether nothing was read from ``text`` (its buffer at 0): its decoder may then be switched
    without losing bytes it holds."""
    try:
        return text.buffer.tell() == 0
    except (OSError, ValueError, AttributeError):  # not seekable, closed, detached
        return False


# -- bytes dropped under the default errors --------------------------------------------------------


def _where(path: Any) -> str:
    return redact(repr(path))


class _Dropped:
    """A codec error handler, registered under its own ``name``, that drops what does not decode
    (as ``"ignore"``) and counts the bytes dropped: one file's at a time.

    The codec registry is process-wide and keeps a handler for good, so the handlers are pooled
    (:func:`_take`, :meth:`done`): there are as many as files decoded at once, whatever the number
    of files. A handler runs only on bytes that do not decode: clean data costs nothing."""

    __slots__ = ("name", "count")

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0

    def __call__(self, exc: UnicodeError) -> tuple[str, int]:
        if not isinstance(exc, UnicodeDecodeError):
            raise exc
        self.count += exc.end - exc.start
        return "", exc.end

    def done(self, stage: str, path: Any, encoding: str) -> None:
        """The reader is done with its file: warn if bytes were dropped, and free the handler."""
        count, self.count = self.count, 0
        with _POOL_LOCK:
            _POOL.append(self)
        if count:
            s = "" if count == 1 else "s"
            warnings.warn(
                f"{stage}: dropped {count:,} byte{s} of {_where(path)} that {'is' if count == 1 else 'are'} not valid "
                f"{encoding} (errors='ignore', the default, as in torchdata): pass errors='strict' to raise naming "
                f"the line, 'replace' to keep a U+FFFD in their place, or errors='ignore' to drop them without "
                f"this warning",
                UnicodeWarning,
                stacklevel=2,
            )


_POOL: list[_Dropped] = []
_POOL_LOCK = threading.Lock()
_MADE = [0]  # handlers registered so far (their names are numbered)


def _take() -> _Dropped:
    """A free counting handler (one is registered when none is free)."""
    with _POOL_LOCK:
        if _POOL:
            return _POOL.pop()
        handler = _Dropped(f"datapipes.dropped.{_MADE[0]}")
        _MADE[0] += 1
        codecs.register_error(handler.name, handler)
        return handler


# -- a reader's text options -----------------------------------------------------------------------


def _check_max_line_length(stage: str, max_line_length: Any) -> None:
    require_int(max_line_length, stage, "max_line_length", minimum=1, optional=True)


class _Text(_TextOptions):
    """How a text reader turns a stream into lines (:class:`_TextOptions`), each line bounded to
    ``limit`` (``max_line_length``; None: unbounded) and, where ``counted`` (``errors`` left at its
    default), the bytes that do not decode counted by a :class:`_Dropped` handler the reader takes
    per file (:meth:`dropped`) and gives back when done with it."""

    __slots__ = ("limit", "counted")

    def __init__(
        self, skip_lines: int, decode: bool, encoding: str, errors: str, newline: str, limit: int | None
    ) -> None:
        super().__init__(skip_lines, decode, encoding, str(errors), newline)
        self.limit = limit
        self.counted = decode and errors is IGNORE_COUNTED

    def dropped(self) -> _Dropped | None:
        """The handler counting the bytes dropped in the next file (None where nothing is counted)."""
        return _take() if self.counted else None

    def open(self, stream: Any, stage: str, skip: int, dropped: _Dropped | None) -> tuple[Iterator[Any], Any]:
        """The lines of ``stream`` after the first ``skip`` (``skip_lines``, or the lines a resumed
        pass had read: skipped before decoding), decoded where asked, each within ``limit``, and
        their type (``str`` or ``bytes``); bytes that do not decode counted by ``dropped``."""
        limit = self.limit
        raw = _inner(stream)
        if isinstance(raw, io.TextIOBase):
            return _skip(iter(stream) if limit is None else _text_lines(raw, limit), skip), str
        if isinstance(raw, (io.BufferedIOBase, io.RawIOBase)):
            if not self.decode or self.per_line:  # per_line (errors="strict"): lines split at b"\n", each decoded
                lines = _skip(iter(stream) if limit is None else _byte_lines(raw, limit), skip)
                return (lines, bytes) if not self.decode else (self._decoded(lines), str)
            errors = self.errors if dropped is None else dropped.name
            encoding = self.encoding if limit is None else _bounded_encoding(self.encoding, limit, self.newline == "")
            text = io.TextIOWrapper(_inner(stream), encoding, errors, newline=self.newline)
            return _skip(iter(text), skip), str
        # Some other file-like object: its first line tells whether it is text or binary.
        lines = _skip(iter(stream) if limit is None else _bounded(stream.readline, limit), skip)
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
        errors = self.errors if dropped is None else dropped.name
        return map(bytes.decode, lines, repeat(self.encoding), repeat(errors)), str


def _open_lines(
    pipe: LineReader, stream: Any, path: Any, stage: str, skip: int, dropped: _Dropped | None
) -> Iterator[Any]:
    lines, kind = pipe._text.open(stream, stage, skip, dropped)
    if pipe.strip_newline:
        lines = map(kind.rstrip, lines, repeat("\r\n" if kind is str else b"\r\n"))
    return zip(repeat(path), lines) if pipe.return_path else lines


def _lines(pipe: LineReader, it: Iterator[Any], run: _ReadRun) -> Iterator[Any]:
    stage = stage_label(pipe)
    on_fail = _on_fail(pipe, stage)
    text = pipe._text
    n, first = run.begin(on_fail)  # n: the item (file) being read; first: the file a resumed pass was in
    try:
        for item in chain(first, it) if first else it:
            n += 1
            path, stream, skip, _ = _item(item, stage, n, pipe.skip_lines)
            # The lines of this file read so far: ``offset`` (skipped, or failed to decode) plus those
            # yielded, which the Counted iterator counts (read by the run when a state is taken).
            offset = skip
            dropped = text.dropped()  # counts the bytes the default errors drop (None: not counted)
            try:
                try:
                    stream = _open_item(item, stream, run, n)
                    lines = Counted(_open_lines(pipe, stream, path, stage, skip, dropped))
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
                if dropped is not None:
                    dropped.done(stage, path, pipe.encoding)
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
        encoding, errors: how to decode, as :class:`CSVParser` (by default, bytes that do not
            decode are dropped, counted, and a warning names each file that had some).
        return_path: yield ``(path, line)`` (the default) instead of ``line``.
        on_error: ``"raise"`` (default) or ``"skip"``: a line that fails to decode is skipped and
            counted; an error of the stream (or a line over ``max_line_length``) skips the rest of
            that file.
        max_failures: with ``on_error="skip"``, failures tolerated per pass: a number, or a float
            between 0 and 1 for a share of the items (``None``: any).
        warn_failures: with ``on_error="skip"``, past how many failures (a number, or a share:
            10% by default) a pass warns once (``None``: never); see :mod:`datapipes.errors`.
        max_line_length: the longest line read, its line ending included, in characters (in
            bytes where lines are split as bytes: ``decode=False`` or ``errors="strict"``), by
            default :data:`MAX_LINE_LENGTH` (64 Mi), ``None`` for no limit. A file you did not
            write could hold one line of any size (a small gzip of one huge line): a reader holds
            about this much of a line at most before it raises. Lines are measured a block at a
            time, so ordinary lines cost nothing more.

    Yields:
        ``(path, line)`` or ``line`` for each line of each file, in order, read lazily.

    Raises:
        UnicodeDecodeError with ``errors="strict"``, or the stream's own errors, with a note naming
        the stage, the file and the line.
        datapipes.errors.SizeLimitError: (a ``ValueError``) a line longer than
            ``max_line_length``, named the same way.
        TypeError: an item is not a ``(path, stream)`` pair.

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

    _saves = (
        "the current file's path and the lines, entries or records read (and a CSV header): the file is "
        "opened again through the opener above and the read lines skipped without parsing (an in-memory "
        "stream is saved instead); the failures counted under ``on_error=\"skip\"``"
    )

    @overload
    def __init__(
        self: IterDataPipe[tuple[str, Any]],
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = ...,
        strip_newline: bool = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: Literal[True] = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        max_line_length: int | None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[Any],
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = ...,
        strip_newline: bool = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: bool = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        max_line_length: int | None = ...,
    ) -> None: ...
    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = 0,
        strip_newline: bool = True,
        decode: bool = False,
        encoding: str = "utf-8",
        errors: str = IGNORE_COUNTED,
        return_path: bool = True,
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        max_line_length: int | None = MAX_LINE_LENGTH,
    ) -> None:
        stage = "LineReader"
        require_pipe(source_datapipe, stage, "source_datapipe")
        _check_text_args(stage, skip_lines, decode, encoding, errors)
        require_bool(strip_newline, stage, "strip_newline")
        require_bool(return_path, stage, "return_path")
        _check_max_line_length(stage, max_line_length)
        self.source_datapipe = source_datapipe
        self.skip_lines = skip_lines
        self.strip_newline = strip_newline
        self.decode = decode
        self.encoding = encoding
        self.errors = str(errors)
        self.return_path = return_path
        self.max_line_length = max_line_length
        self._text = _Text(skip_lines, decode, encoding, errors, "\n", max_line_length)
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures)

    def _open(self, ctx: Pass) -> Iterator[Any]:
        # The file being read and the lines of it consumed (see _ReadRun).
        return _lines(self, ctx.open(self.source_datapipe), _read_run(self, ctx, self.source_datapipe))

    def __len__(self) -> int:
        raise len_unknown(self, "the number of lines is known only after reading the files", NO_LEN)
