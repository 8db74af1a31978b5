"""Parquet files, read with pyarrow (``pip install 'datapipes[parquet]'``): ParquetParser
[parse_parquet] yields rows or record batches, ParquetDataFrameLoader [load_parquet_as_df] one
``pyarrow.Table`` per row group (torchdata's pipe, whose torcharrow DataFrames are gone).

Both take paths (a local path, or an fsspec URL such as ``memory://...``, opened here) or
``(path, stream)`` pairs as :class:`~datapipes.iter.FileOpener` and
:class:`~datapipes.iter.FSSpecFileOpener` yield them (binary streams; one that cannot seek is read
into memory first, since a Parquet file's directory is at its end). Each file is read one row group
at a time, and closed when the reader is done with it: at its end, on an error, or when the pass is
closed early.

pyarrow is imported when a pipe is built, not when this module is: without it, building one raises
``ImportError`` naming the ``datapipes[parquet]`` extra.

**Bad input.** An error opening a file (not a Parquet file, truncated, missing, a column asked for
that it does not have) or reading a row group (corrupt pages) reaches the consumer as the very
exception object, with a note naming the stage and the file (and the row group)::

    [datapipes] raised in stage ParquetParser at file 'data.parquet', row group 2

With ``on_error="skip"`` a file that does not open is skipped, and a row group that fails to read
is skipped from where it failed (the row groups after it are still read); each counts one failure
in ``pipe.failures``.

**Checkpoints** (``it.state_dict()``). A reader stopped inside a file saves its path, the row group
it was in and the rows of that row group consumed; the resumed pass opens the file again (by its
path, through the opener upstream, or from a copy of an in-memory stream kept in the state, as the
text readers (``readlines``, ``parse_csv``) do), reads from that row group on and skips those rows.
"""

from __future__ import annotations

import io
import os
from itertools import chain, repeat
from operator import length_hint
from typing import Any, Callable, Iterator, Literal, Sequence, overload

from .._checks import require_bool
from .._runtime.passes import Pass
from .._engine import abandon
from .._engine import close_iterator as _close
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_int, require_pipe, stage_label
from ..errors import WARN_FAILURES, _OnError, call_lines, policy_and_log, raised_at
from ._readers import _FileRun, _file_where, _from_memory, _inner, _memory_copy, _on_fail, _pair, _reopener

__all__ = ["ParquetDataFrameLoader", "ParquetParser"]


def _pyarrow(stage: str) -> Any:
    """``pyarrow.parquet``, or ``ImportError`` naming the extra that installs it."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError(
            f"{stage} needs pyarrow, which is not installed: pip install 'datapipes[parquet]' (or pip install pyarrow)"
        ) from e
    return pq


def _check_columns(columns: Any, stage: str) -> list[str] | None:
    if columns is None:
        return None
    if isinstance(columns, (str, bytes)) or not isinstance(columns, Sequence) or not all(isinstance(c, str) for c in columns):
        raise TypeError(f"{stage}: columns must be a list of column names or None, got {columns!r:.100}")
    return list(columns)


# -- the position of a pass --------------------------------------------------------------------------


class _ParquetRun(_FileRun):
    """The position of a Parquet reader's pass: the item (file) it is reading, the row group, and
    the rows of that row group consumed.

    The rows consumed are ``base`` (rows of the row group before the current batch, counted once
    per batch) plus, for rows read one by one, the index of the list iterator the loop yields from,
    read when a state is taken; nothing is counted per row. The state holds the file's path, two
    ints and, for an in-memory stream that the source cannot open again, a copy of its bytes.
    """

    __slots__ = ("stage", "reopen", "failures", "n", "inside", "path", "opened", "stream", "group", "base", "rows",
                 "size", "resume")

    def __init__(self, stage: str, reopen: Callable[[Any, int], Any] | None) -> None:
        self.stage = stage
        self.reopen = reopen
        self.failures: Any = None  # the pass's PassFailures under on_error="skip"
        self.n = -1  # the item (file) being read
        self.inside = False  # whether the loop is inside a file
        self.path: Any = None
        self.opened = False  # the item was a path, opened here (else a stream of the source)
        self.stream: Any = None
        self.group = 0  # the row group being read
        self.base = 0  # its rows consumed before ``rows``
        self.rows: Iterator[Any] | None = None  # the list iterator of the batch's rows being yielded
        self.size = 0  # that list's length
        self.resume: dict[str, Any] | None = None
        self.started = False

    def row(self) -> int:
        rows = self.rows
        if rows is None:
            return self.base
        return self.base + self.size - length_hint(rows)  # the list's length less what its iterator has left

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"n": self.n, "failures": 0 if self.failures is None else self.failures.count, "file": None}
        if not self.inside:
            return state
        file: dict[str, Any] = {"path": self.path, "opened": self.opened, "row_group": self.group, "row": self.row(),
                                "memory": None}
        if not self.opened and self.reopen is None:
            file["memory"] = _memory_copy(self.stream, self.stage, self.path)
        state["file"] = file
        return state

    def resumed(self, file: dict[str, Any]) -> _Resumed:
        return _Resumed(file)

    def enter(self, n: int, path: Any, opened: bool, stream: Any) -> None:
        self.n, self.path, self.opened, self.stream, self.inside = n, path, opened, stream, True

    def at_group(self, group: int, base: int) -> None:
        self.group, self.base, self.rows = group, base, None

    def leave(self) -> None:
        self.inside = False
        self.path = self.stream = self.rows = None


class _Resumed:
    """The file a resumed pass reads first: the one the saved pass was inside."""

    __slots__ = ("path", "opened", "group", "row", "memory")

    def __init__(self, file: dict[str, Any]) -> None:
        self.path = file["path"]
        self.opened = bool(file["opened"])
        self.group = int(file["row_group"])
        self.row = int(file["row"])
        self.memory = file["memory"]

    def open(self, run: _ParquetRun, n: int) -> Any:
        """The stream to read the file from again (``None``: open it by its path)."""
        if self.memory is not None:
            return _from_memory(self.memory)
        if self.opened:
            return None
        if run.reopen is None:
            raise TypeError(f"{run.stage}: the state names no way to open {self.path!r} again")
        return run.reopen(self.path, n)


# -- reading -----------------------------------------------------------------------------------------


def _item(item: Any, stage: str, n: int) -> tuple[Any, Any, bool, int, int]:
    """``(path, stream, opened here, row group, rows to skip)`` of the item ``n``: a path, a
    ``(path, stream)`` pair, or the :class:`_Resumed` file (its stream opened inside the loop's
    ``try``, so that a failure is the file's)."""
    if type(item) is _Resumed:
        return item.path, None, item.opened, item.group, item.row
    if isinstance(item, (str, os.PathLike)):
        return item, None, True, 0, 0
    if isinstance(item, (tuple, list)):
        path, stream = _pair(item, stage, n)
        return path, stream, False, 0, 0
    raise TypeError(
        f"{stage}: expects paths or (path, stream) pairs as open_files yields, got {type(item).__name__} "
        f"at item {n}: {item!r:.100}"
    )


def _source_of(stream: Any, stage: str, path: Any) -> Any:
    """The file object pyarrow reads: the stream's own, or its contents in memory when it cannot
    seek."""
    raw = _inner(stream)
    if not callable(getattr(raw, "read", None)):
        raise TypeError(f"{stage}: the stream of {path!r} is a {type(raw).__name__}, not a binary file object")
    if isinstance(raw, io.TextIOBase):
        raise TypeError(f"{stage}: {path!r} is a text stream; Parquet needs binary ones (open_files(mode='b'))")
    seekable = getattr(raw, "seekable", None)
    if seekable is None or not seekable():
        return io.BytesIO(raw.read())
    return raw


def _leaf_paths(pf: Any) -> list[str]:
    schema = pf.schema  # the Parquet schema: one column per leaf, named by its dotted path
    return [schema.column(i).path for i in range(len(schema))]


def _check_file_columns(pf: Any, columns: list[str] | None, stage: str, path: Any) -> None:
    # pyarrow reads a column that is not there as no column at all: say so instead.
    if not columns:
        return
    leaves = _leaf_paths(pf)
    missing = [c for c in columns if not any(p == c or p.startswith(c + ".") for p in leaves)]
    if missing:
        raise KeyError(f"{stage}: {path!r} has no column {', '.join(map(repr, missing))} (its columns: {pf.schema_arrow.names})")


class _Open:
    """A Parquet file open for one item: the ``ParquetFile`` and what to close after it."""

    __slots__ = ("pf", "stream", "own")

    def __init__(self) -> None:
        self.pf: Any = None
        self.stream: Any = None  # the item's stream, or one opened again for a resumed file
        self.own: Any = None  # a file opened here through fsspec

    def close(self) -> None:
        pf, self.pf = self.pf, None
        try:
            if pf is not None:
                pf.close()
        finally:
            for f in (self.own, self.stream):
                if f is not None:
                    _close(f)
            self.own = self.stream = None


def _open(pipe: Any, pq: Any, opened: _Open, item: Any, path: Any, stream: Any, run: _ParquetRun, n: int,
         stage: str) -> Any:
    """Open the file of item ``n`` into ``opened``; the stream the run may copy for a state."""
    if type(item) is _Resumed:
        stream = item.open(run, n)
    opened.stream = stream
    if stream is None:  # a path: a local one pyarrow opens, a URL fsspec does
        location = os.fspath(path)
        if isinstance(location, str) and "://" in location:
            import fsspec.core

            fs, inner = fsspec.core.url_to_fs(location)
            opened.own = fs.open(inner, "rb")
            source = _source_of(opened.own, stage, path)
        else:
            source = location
    else:
        source = _source_of(stream, stage, path)
    opened.pf = pf = pq.ParquetFile(source)
    _check_file_columns(pf, pipe.columns, stage, path)
    return source


def _batches(pipe: Any, pf: Any, group: int, skip: int, run: _ParquetRun) -> Iterator[Any]:
    """The record batches of row group ``group`` after its first ``skip`` rows (counted in ``run``)."""
    batches = pf.iter_batches(batch_size=pipe.batch_size, row_groups=[group], columns=pipe.columns,
                              use_threads=pipe.use_threads)
    for batch in batches:
        if skip:
            n = batch.num_rows
            if skip >= n:
                skip -= n
                run.base += n
                continue
            batch = batch.slice(skip)
            run.base += skip
            skip = 0
        yield batch


def _emit_rows(pipe: Any, pf: Any, group: int, skip: int, run: _ParquetRun) -> Iterator[Any]:
    for batch in _batches(pipe, pf, group, skip, run):
        rows = batch.to_pylist()
        run.size = len(rows)
        run.rows = it = iter(rows)
        yield from it
        run.base += len(rows)
        run.rows = None


def _emit_batches(pipe: Any, pf: Any, group: int, skip: int, run: _ParquetRun) -> Iterator[Any]:
    for batch in _batches(pipe, pf, group, skip, run):
        run.base += batch.num_rows
        yield batch


def _emit_table(pipe: Any, pf: Any, group: int, skip: int, run: _ParquetRun) -> Iterator[Any]:
    table = pf.read_row_group(group, columns=pipe.columns, use_threads=pipe.use_threads)
    if skip:
        table = table.slice(skip)
    if pipe.dtype is not None:
        table = table.cast(pipe.dtype)
    run.base = skip + table.num_rows
    yield table


def _parquet(pipe: Any, it: Iterator[Any], run: _ParquetRun) -> Iterator[Any]:
    stage = stage_label(pipe)
    pq = _pyarrow(stage)
    on_fail = _on_fail(pipe, stage)
    emit = pipe._emit
    return_path = pipe.return_path
    n, first = run.begin(on_fail)  # n: the item (file) being read; first: the file a resumed pass was in
    try:
        for item in chain(first, it) if first else it:
            n += 1
            path, stream, is_path, group, skip = _item(item, stage, n)
            opened = _Open()
            opened.stream = stream
            try:
                try:
                    source = _open(pipe, pq, opened, item, path, stream, run, n, stage)
                    pf = opened.pf
                    sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
                    run.enter(n, path, is_path, source)
                except Exception as e:
                    on_fail(e, *_file_where(path, n))
                    continue
                for g in range(group, len(sizes)):
                    run.at_group(g, 0)
                    if skip and skip >= sizes[g]:  # resumed after the last row of this row group
                        skip = 0
                        continue
                    chunks = emit(pipe, pf, g, skip, run)
                    if return_path:
                        chunks = zip(repeat(path), chunks)
                    skip = 0
                    try:
                        for out in chunks:
                            yield out
                    except Exception as e:
                        if not raised_at(e, _READ):
                            raise  # thrown in at the yield by the consumer: not a failure of the file
                        on_fail(e, f"file {path!r}, row group", g)  # skipped: on with the next row group
            finally:
                try:
                    opened.close()
                finally:
                    run.leave()  # done with this file: a state taken now is between files
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise
    finally:
        run.end()


_READ = call_lines(_parquet, "chunks")


class _ParquetBase(IterDataPipe[Any]):
    """What the two readers share: the pass over their source and its position."""

    _emit: Callable[..., Iterator[Any]]
    _counted = "rows"  # what len() would count
    return_path = False

    def _source(self) -> IterDataPipe[Any]:
        raise NotImplementedError  # pragma: no cover - both readers define it (a pipe of files)

    def _open(self, ctx: Pass) -> Iterator[Any]:
        # The file being read, its row group and the rows of it consumed (see _ParquetRun).
        source = self._source()
        run = _ParquetRun(stage_label(self), _reopener(source, ctx))
        ctx.track(self, run)
        return _parquet(self, ctx.open(source), run)

    def __len__(self) -> int:
        raise len_unknown(self, f"the number of {self._counted} is known only after reading the files", NO_LEN)


# -- ParquetParser -----------------------------------------------------------------------------------


@functional_datapipe("parse_parquet")
class ParquetParser(_ParquetBase):
    """Read the Parquet files of paths or ``(path, stream)`` pairs and yield their rows as dicts
    or record batches (functional name: ``parse_parquet``).

    Args:
        source_datapipe: a pipe of paths (local, or fsspec URLs) or of ``(path, binary stream)``
            pairs, e.g. ``open_files(mode="b")``.
        columns: the columns to read (a name may be the prefix of nested ones: ``"a"`` reads
            ``"a.b"`` and ``"a.c"``); ``None``: all. A file lacking one raises ``KeyError``.
        batch_size: the rows read at a time (the rows of a record batch); a batch never spans two
            row groups, so the last one of each row group may be shorter.
        as_batches: yield ``pyarrow.RecordBatch`` objects instead of one dict per row.
        return_path: yield ``(path, row)`` (or ``(path, batch)``) instead of the row.
        use_threads: let pyarrow decode the columns on its thread pool.
        on_error: ``"raise"`` (default) or ``"skip"``: a file that does not open is skipped, and a
            row group that fails to read is skipped from where it failed; each counts one failure
            in ``pipe.failures``.
        max_failures: with ``on_error="skip"``, failures tolerated per pass (``None``: any). A
            failure here is a file or a row group, not a row: a share (a float) is refused.
        warn_failures: with ``on_error="skip"``, past how many failures a pass warns once (a
            number; ``None``: never); a share, the default included, is not judged here, since
            the reader does not count the rows its failures are part of.

    Yields:
        ``{column: value}`` for each row of each file in order, values as ``pyarrow``'s
        ``to_pylist`` gives them (``int``, ``str``, ``datetime``, lists, dicts for structs); or
        ``pyarrow.RecordBatch`` objects of up to ``batch_size`` rows with ``as_batches=True``.

    Raises:
        ImportError: at construction, when pyarrow is not installed (``datapipes[parquet]``).
        pyarrow's errors (``pyarrow.ArrowInvalid``, a ``ValueError``, for a file that is not
        Parquet; ``OSError`` for corrupt data), ``FileNotFoundError`` and ``KeyError`` (a missing
        column), each with a note naming the stage and the file (and the row group). TypeError:
        an item is neither a path nor a ``(path, stream)`` pair, or its stream is text.

    Each file is closed when it is done (or on an error, or when the pass is closed). ``len()``
    raises ``TypeError``: the number of rows is known only after reading.

    Example:
        >>> import io
        >>> import pyarrow as pa, pyarrow.parquet as pq  # pip install 'datapipes[parquet]'
        >>> from datapipes.iter import IterableWrapper
        >>> buf = io.BytesIO()
        >>> pq.write_table(pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]}), buf, row_group_size=2)
        >>> list(IterableWrapper([("t.parquet", io.BytesIO(buf.getvalue()))]).parse_parquet(columns=["id"]))
        [{'id': 1}, {'id': 2}, {'id': 3}]

    See also: :class:`ParquetDataFrameLoader` (a ``pyarrow.Table`` per row group),
    :class:`~datapipes.iter.CSVDictParser`.
    """

    _saves = (
        "the current file's path, its row group and the rows of it read (an in-memory stream is saved "
        "instead)"
    )

    @overload
    def __init__(
        self: IterDataPipe[dict[str, Any]],
        source_datapipe: IterDataPipe[Any],
        *,
        columns: Sequence[str] | None = ...,
        batch_size: int = ...,
        as_batches: Literal[False] = ...,
        return_path: Literal[False] = ...,
        use_threads: bool = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[tuple[str, dict[str, Any]]],
        source_datapipe: IterDataPipe[Any],
        *,
        columns: Sequence[str] | None = ...,
        batch_size: int = ...,
        as_batches: Literal[False] = ...,
        return_path: Literal[True],
        use_threads: bool = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[Any],
        source_datapipe: IterDataPipe[Any],
        *,
        columns: Sequence[str] | None = ...,
        batch_size: int = ...,
        as_batches: bool = ...,
        return_path: bool = ...,
        use_threads: bool = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> None: ...
    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        *,
        columns: Sequence[str] | None = None,
        batch_size: int = 1024,
        as_batches: bool = False,
        return_path: bool = False,
        use_threads: bool = True,
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
    ) -> None:
        stage = "ParquetParser"
        require_pipe(source_datapipe, stage, "source_datapipe")
        self.columns = _check_columns(columns, stage)
        require_int(batch_size, stage, "batch_size", minimum=1)
        require_bool(as_batches, stage, "as_batches")
        require_bool(return_path, stage, "return_path")
        require_bool(use_threads, stage, "use_threads")
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures, counts=False)
        _pyarrow(stage)
        self.source_datapipe = source_datapipe
        self.batch_size = batch_size
        self.as_batches = as_batches
        self.return_path = return_path
        self.use_threads = use_threads
        self._emit = _emit_batches if as_batches else _emit_rows

    def _source(self) -> IterDataPipe[Any]:
        return self.source_datapipe


# -- ParquetDataFrameLoader --------------------------------------------------------------------------


def _check_device(device: Any, stage: str) -> None:
    kind = getattr(device, "type", device)  # a torch.device
    if kind not in ("", "cpu"):
        raise ValueError(
            f"{stage}: device must be '' or 'cpu': pyarrow tables live in host memory (move tensors made "
            f"from them with to_device / to_cuda), got {device!r}"
        )


@functional_datapipe("load_parquet_as_df")
class ParquetDataFrameLoader(_ParquetBase):
    """Read Parquet files and yield one ``pyarrow.Table`` per row group
    (functional name: ``load_parquet_as_df``).

    torchdata's pipe, whose torcharrow DataFrames are gone: a ``pyarrow.Table`` is the closest
    (``table.to_pandas()``, ``table.to_pydict()``, ``torch.from_numpy(table["x"].to_numpy())``).

    Args:
        source_dp: a pipe of paths (local, or fsspec URLs) or of ``(path, binary stream)`` pairs.
        dtype: a ``pyarrow.Schema`` each table is cast to (its field names and order must be the
            table's); ``None``: the file's types.
        columns: the columns to read; ``None``: all. A file lacking one raises ``KeyError``.
        device: ``""`` or ``"cpu"``, accepted for torchdata's signature: tables live in host
            memory; any other device raises ``ValueError``.
        use_threads: let pyarrow read the columns on its thread pool.
        on_error, max_failures, warn_failures: as :class:`ParquetParser`.

    Yields:
        One ``pyarrow.Table`` per row group of each file, in order.

    Raises:
        ImportError: at construction, when pyarrow is not installed (``datapipes[parquet]``).
        TypeError: ``dtype`` is not a ``pyarrow.Schema`` (torcharrow's dtypes are gone).

    Otherwise errors are as :class:`ParquetParser`'s; a table that does not cast to ``dtype`` raises
    pyarrow's error with a note naming the file and the row group.

    ``len()`` raises ``TypeError``: the number of row groups is known only after reading.

    Example:
        >>> import io
        >>> import pyarrow as pa, pyarrow.parquet as pq  # pip install 'datapipes[parquet]'
        >>> from datapipes.iter import IterableWrapper
        >>> buf = io.BytesIO()
        >>> pq.write_table(pa.table({"x": [1, 2, 3]}), buf, row_group_size=2)
        >>> tables = IterableWrapper([("t.parquet", io.BytesIO(buf.getvalue()))]).load_parquet_as_df()
        >>> [t.to_pydict() for t in tables]
        [{'x': [1, 2]}, {'x': [3]}]

    See also: :class:`ParquetParser` (rows or record batches of a chosen size).
    """

    _saves = "same as parse_parquet"

    _emit = staticmethod(_emit_table)
    _counted = "row groups"

    def __init__(
        self,
        source_dp: IterDataPipe[Any],
        dtype: Any = None,
        columns: Sequence[str] | None = None,
        device: Any = "",
        use_threads: bool = False,
        *,
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
    ) -> None:
        stage = "ParquetDataFrameLoader"
        require_pipe(source_dp, stage, "source_dp")
        self.columns = _check_columns(columns, stage)
        _check_device(device, stage)
        require_bool(use_threads, stage, "use_threads")
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures, counts=False)
        _pyarrow(stage)
        import pyarrow

        if dtype is not None and not isinstance(dtype, pyarrow.Schema):
            raise TypeError(
                f"{stage}: dtype must be a pyarrow.Schema to cast each table to, or None (torcharrow's dtypes "
                f"are gone), got {type(dtype).__name__}"
            )
        self.source_dp = source_dp
        self.dtype = dtype
        self.device = device
        self.use_threads = use_threads

    def _source(self) -> IterDataPipe[Any]:
        return self.source_dp
