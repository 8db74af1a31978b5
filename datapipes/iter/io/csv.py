"""CSV readers of ``(path, stream)`` pairs, as :class:`~datapipes.iter.FileOpener` yields them:
CSVParser [parse_csv], CSVFilesParser [parse_csv_files], CSVDictParser [parse_csv_as_dict].

Rows are read lazily, line by line, on the runtime of :mod:`datapipes.iter._readers` (which says how
bad input and checkpoints are handled): a bad row reaches the consumer with a note naming its file and
lines, or is skipped under ``on_error="skip"``; a checkpoint saves the file and the lines read.

>>> import io
>>> from datapipes.iter import IterableWrapper
>>> files = IterableWrapper([("a.csv", io.BytesIO(b"x,y\\n1,2\\n")), ("b.csv", io.BytesIO(b"x,y\\n3,4\\n"))])
>>> list(files.parse_csv_as_dict())
[{'x': '1', 'y': '2'}, {'x': '3', 'y': '4'}]
"""

from __future__ import annotations

import csv
from itertools import chain, repeat
from typing import Any, Callable, Iterator, Literal, Sequence, overload

from ..._checks import require_bool
from ..._engine import abandon
from ..._engine import close_iterator as _close
from ..._runtime.passes import Pass
from ...datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_pipe, stage_label
from ...errors import WARN_FAILURES, _OnError, call_lines, policy_and_log, raised_at
from .._readers import (
    _END,
    _RECORD_ERRORS,
    _check_text_args,
    _item,
    _line_where,
    _on_fail,
    _open_item,
    _read_run,
    _ReadRun,
)
from .lines import IGNORE_COUNTED, MAX_LINE_LENGTH, _check_max_line_length, _Text

__all__ = ["CSVDictParser", "CSVFilesParser", "CSVParser"]


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
            dropped = text.dropped()  # counts the bytes the default errors drop (None: not counted)
            try:
                try:
                    stream = _open_item(item, stream, run, n)
                    reader = csv.reader(text.open(stream, stage, skip, dropped)[0], **fmt)
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
                if dropped is not None:
                    dropped.done(stage, path, pipe.encoding)
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
        errors: the decoding errors handler: ``"ignore"`` (default, as torchdata's: bad bytes
            dropped; left at the default they are counted, and each file that had some warns
            once, a ``UnicodeWarning`` naming it and the count; ``errors="ignore"`` given by name
            stays silent), ``"strict"`` (a ``UnicodeDecodeError`` naming the file and line; binary
            streams are then decoded line by line, split at ``b"\\n"``), ``"replace"``, ...
        return_path: yield ``(path, row)`` instead of ``row``.
        as_tuple: yield each row as a tuple instead of a list.
        on_error: ``"raise"`` (default) or ``"skip"``: a bad row is skipped and counted (the
            ``recent`` failures of ``pipe.failures`` hold its line number); the rest of the file
            still comes through.
        max_failures: with ``on_error="skip"``, failures tolerated per pass: a number, or a float
            between 0 and 1 for a share of the items (``None``: any).
        warn_failures: with ``on_error="skip"``, past how many failures (a number, or a share:
            10% by default) a pass warns once (``None``: never); see :mod:`datapipes.errors`.
        max_line_length: the longest line read, its line ending included, in characters (in
            bytes with ``errors="strict"``, which splits lines as bytes), by default
            :data:`~datapipes.iter.io.lines.MAX_LINE_LENGTH` (64 Mi), ``None`` for no
            limit. A file you did not write could hold one line of any size (a small gzip of one
            huge line): a reader holds about this much of a line at most before it raises; under
            ``on_error="skip"`` such a line skips the rest of its file. Lines are measured a block
            at a time, so ordinary lines cost nothing more.
        fmtparams: passed to ``csv.reader`` (``delimiter``, ``quotechar``, ``strict``, ...).

    Yields:
        The rows of each file in order, as lists of strings (or tuples, or ``(path, row)``).

    Raises:
        csv.Error: a malformed row (e.g. an unterminated quote with ``strict=True``), with a note
        naming the stage, the file and the row's line(s); ``UnicodeDecodeError`` with
        ``errors="strict"``; the stream's own errors (``OSError``), noted the same way.
        datapipes.errors.SizeLimitError: (a ``ValueError``) a line longer than
            ``max_line_length``, noted the same way.
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

    _saves = "same as readlines"

    _rows: Callable[..., Iterator[Any]] = staticmethod(_list_rows)

    @overload
    def __init__(
        self: IterDataPipe[list[str]],
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: Literal[False] = ...,
        as_tuple: Literal[False] = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        max_line_length: int | None = ...,
        **fmtparams: Any,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[tuple[str, ...]],
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: Literal[False] = ...,
        as_tuple: Literal[True],
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        max_line_length: int | None = ...,
        **fmtparams: Any,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[Any],
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: bool = ...,
        as_tuple: bool = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        max_line_length: int | None = ...,
        **fmtparams: Any,
    ) -> None: ...
    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = 0,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = IGNORE_COUNTED,
        return_path: bool = False,
        as_tuple: bool = False,
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        max_line_length: int | None = MAX_LINE_LENGTH,
        **fmtparams: Any,
    ) -> None:
        stage = type(self).__name__
        require_pipe(source_datapipe, stage, "source_datapipe")
        _check_text_args(stage, skip_lines, decode, encoding, errors)
        require_bool(return_path, stage, "return_path")
        require_bool(as_tuple, stage, "as_tuple")
        _check_max_line_length(stage, max_line_length)
        _check_fmtparams(stage, fmtparams, csv.reader)
        self.source_datapipe = source_datapipe
        self.skip_lines = skip_lines
        self.decode = decode
        self.encoding = encoding
        self.errors = str(errors)
        self.return_path = return_path
        self.as_tuple = as_tuple
        self.max_line_length = max_line_length
        self.fmtparams = fmtparams
        self._text = _Text(skip_lines, decode, encoding, errors, "", max_line_length)
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures)

    def _open(self, ctx: Pass) -> Iterator[Any]:
        # The file being read and the lines of it consumed (see _ReadRun).
        return _csv(self, ctx.open(self.source_datapipe), _read_run(self, ctx, self.source_datapipe))

    def __len__(self) -> int:
        raise len_unknown(self, "the number of rows is known only after reading the files", NO_LEN)


@functional_datapipe("parse_csv_files")
class CSVFilesParser(CSVParser):
    """Parse the CSV files of ``(path, stream)`` pairs and yield ``(path, row)`` pairs
    (functional name: ``parse_csv_files``), as in the torch DataPipes guide.

    The same reader as :class:`CSVParser` (same arguments), with ``return_path=True`` by default.

    Args:
        source_datapipe: a pipe of ``(path, stream)`` pairs (binary or text streams).
        skip_lines, decode, encoding, errors, as_tuple, on_error, max_failures, warn_failures, max_line_length: as
            in :class:`CSVParser`.
        return_path: yield ``(path, row)`` (the default); ``False``: ``row`` alone.
        fmtparams: passed to ``csv.reader``, as :class:`CSVParser`.

    Example:
        >>> import io
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([("a.csv", io.StringIO("1,2\\n3,4\\n"))]).parse_csv_files())
        [('a.csv', ['1', '2']), ('a.csv', ['3', '4'])]

    See also: :class:`CSVParser` (``parse_csv``, yields rows), :class:`CSVDictParser`.
    """

    _saves = "same as readlines"

    @overload
    def __init__(
        self: IterDataPipe[tuple[str, list[str]]],
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: Literal[True] = ...,
        as_tuple: Literal[False] = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        max_line_length: int | None = ...,
        **fmtparams: Any,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[Any],
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: bool = ...,
        as_tuple: bool = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        max_line_length: int | None = ...,
        **fmtparams: Any,
    ) -> None: ...
    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = 0,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = IGNORE_COUNTED,
        return_path: bool = True,
        as_tuple: bool = False,
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        max_line_length: int | None = MAX_LINE_LENGTH,
        **fmtparams: Any,
    ) -> None:
        super().__init__(
            source_datapipe, skip_lines=skip_lines, decode=decode, encoding=encoding, errors=errors,
            return_path=return_path, as_tuple=as_tuple, on_error=on_error, max_failures=max_failures,
            warn_failures=warn_failures, max_line_length=max_line_length, **fmtparams,
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
        skip_lines, decode, encoding, errors, return_path, on_error, max_failures, warn_failures, max_line_length:
            as in :class:`CSVParser`; with ``on_error="skip"`` a bad row is skipped and counted.
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

    _saves = "same as readlines"

    _rows = staticmethod(_dict_rows)

    @overload
    def __init__(
        self: IterDataPipe[dict[str, str]],
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: Literal[False] = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        max_line_length: int | None = ...,
        **fmtparams: Any,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[tuple[str, dict[str, str]]],
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: Literal[True],
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        max_line_length: int | None = ...,
        **fmtparams: Any,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[Any],
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: bool = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        max_line_length: int | None = ...,
        **fmtparams: Any,
    ) -> None: ...
    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        *,
        skip_lines: int = 0,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = IGNORE_COUNTED,
        return_path: bool = False,
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
        max_line_length: int | None = MAX_LINE_LENGTH,
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
            max_line_length=max_line_length, **fmtparams,
        )
