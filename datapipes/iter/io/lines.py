"""A reader of the lines of ``(path, stream)`` pairs, as :class:`~datapipes.iter.FileOpener` yields
them: LineReader [readlines].

Lines are read lazily on the runtime of :mod:`datapipes.iter._readers`: a line that fails to decode
reaches the consumer with a note naming its file and line, or is skipped under ``on_error="skip"``;
a checkpoint saves the file and the lines read, which a resumed pass skips without decoding them.
"""

from __future__ import annotations

from itertools import chain, repeat
from typing import Any, Iterator, Literal, overload

from ..._checks import require_bool
from ..._engine import abandon
from ..._engine import close_iterator as _close
from ..._positions import Counted
from ...datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_pipe, stage_label
from ...errors import WARN_FAILURES, _OnError, call_lines, policy_and_log, raised_at
from .._readers import (
    _RECORD_ERRORS,
    _check_text_args,
    _item,
    _line_where,
    _on_fail,
    _open_item,
    _read_run,
    _ReadRun,
    _TextOptions,
)

__all__ = ["LineReader"]


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
    ) -> None: ...
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
        on_error: _OnError = "raise",
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
