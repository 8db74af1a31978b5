"""Local files: FileLister [list_files], FileOpener [open_files], Saver [save_to_disk], and the
StreamWrapper they hand out. The fsspec counterparts for any URL live in :mod:`datapipes.iter.remote`.

Streams are read lazily: an opener hands out open file objects, never their contents.

**When a stream is closed.** The openers yield ``(path, stream)`` where ``stream`` is a
:class:`StreamWrapper` around the open file. A stream stays valid while something holds it, so
streams pass through ``batch``, ``shuffle``, ``prefetch`` and ``next(iter(pipe))`` intact. It is
closed:

- when you close it (``stream.close()``, ``with stream:``), or the stage that reads it does;
- when it is garbage collected (nothing holds it any more);
- when the pass that opened it is *abandoned*: its iterator is closed (``it.close()``, or a
  downstream stage closing its upstream) before the source ran out, or an exception escapes the
  pass (a missing file, a failing source). Every stream of that pass still open is then closed,
  even one you still hold.

A pass that runs to the end of its source leaves the streams it handed out alone: downstream
buffers (shuffle, batch, prefetch) may still hold them, and they close when dropped. A pass that is
merely dropped (``next(iter(pipe))``) does not close its streams either; they close when they are
dropped. So no file is left open once nothing refers to it, and none outlives a pass that failed or
was closed.

**Checkpoints** (``it.state_dict()``). A lister saves the root it is listing and its index in that
root's sorted listing; a resumed pass lists the root again and starts there (with
``non_deterministic=True`` there is no order to resume in: ``state_dict()`` raises ``TypeError``).
Openers and savers keep no position of their own (one file per item); a stream handed out is its
consumer's, and a reader that was inside one opens it again by its path through the opener.

>>> import os, tempfile
>>> from pathlib import Path
>>> from datapipes.iter import FileLister
>>> with tempfile.TemporaryDirectory() as d:
...     for name in ("b.txt", "a.txt", "notes.md"):
...         _ = Path(d, name).write_text(name.upper())
...     pipe = FileLister(d, masks="*.txt").open_files()
...     [(os.path.basename(path), stream.read()) for path, stream in pipe]
[('a.txt', 'A.TXT'), ('b.txt', 'B.TXT')]
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import threading
import weakref
from operator import length_hint
from typing import Any, Callable, Iterable, Iterator, Sequence, Union

from .._runtime import passes as _pass
from .._runtime.passes import Pass
from .._runtime.validate import check_int, check_str
from .._checks import require_bool
from .._redact import redact
from .._positions import skip as skip_items
from .._engine import abandon
from ..datapipe import IterDataPipe, functional_datapipe, len_unknown, require_callable, require_int, require_pipe, source_len, stage_label
from ..errors import WARN_FAILURES, _OnError, add_stage_note, policy_and_log
from .util import IterableWrapper, _Unresumable
from .._engine.lifecycle import Resumable

__all__ = [
    "FileLister",
    "FileOpener",
    "Saver",
    "StreamWrapper",
]

PathLike = Union[str, "os.PathLike[str]"]

_READ_MODES = {"r": "r", "rt": "r", "t": "r", "rb": "rb", "b": "rb"}
_WRITE_MODES = ("w", "wb", "wt", "a", "ab", "at", "x", "xb", "xt")
_TEXT_KWARGS = ("encoding", "errors", "newline")


# -- StreamWrapper ---------------------------------------------------------------------------------

# Methods cached on the wrapper at their first use, so later calls (read, readline) go straight to
# the file object's C methods: no ``__getattr__`` miss per call.
_CACHED = frozenset(("read", "readline", "readlines", "readinto", "read1", "readinto1", "seek", "tell", "peek"))


class StreamWrapper:
    """An open file handed out by an opener: behaves as the file, and closes it when dropped.

    Reading methods and attributes are the wrapped file's (``read``, ``readline``, iteration,
    ``seek``, ``name``, ...). The file is closed by :meth:`close` (idempotent), on leaving a
    ``with`` block, when the wrapper is garbage collected, or when the opener's pass is abandoned
    (see :mod:`datapipes.iter.fileio` for the rule).

    Args:
        file_obj: the open file object.
        name: what the stream is, for messages (the path or URL it was opened from).

    >>> import io
    >>> from datapipes.iter import StreamWrapper
    >>> s = StreamWrapper(io.BytesIO(b"abc"), name="mem")
    >>> s.read(2), s.closed
    (b'ab', False)
    >>> s.close(); s.closed
    True
    """

    def __init__(self, file_obj: Any, name: Any = None) -> None:
        d = self.__dict__
        d["file_obj"] = file_obj
        d["name"] = name

    #: set by :meth:`close`: some file objects (fsspec's in-memory files) do not mark themselves
    _closed = False

    @property
    def closed(self) -> bool:
        return self._closed or bool(self.file_obj.closed)

    def close(self) -> None:
        """Close the wrapped file; closing again does nothing."""
        self.__dict__["_closed"] = True
        self.file_obj.close()

    @classmethod
    def close_streams(cls, v: Any, depth: int = 0) -> None:
        """Close every :class:`StreamWrapper` found in ``v`` (nested lists, tuples, dicts; depth <= 10)."""
        if depth > 10:
            return
        if isinstance(v, StreamWrapper):
            v.close()
        elif isinstance(v, dict):
            for vv in v.values():
                cls.close_streams(vv, depth + 1)
        elif isinstance(v, (list, tuple)):
            for vv in v:
                cls.close_streams(vv, depth + 1)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        try:
            file_obj = d["file_obj"]
        except KeyError:
            raise AttributeError(name) from None
        value = getattr(file_obj, name)
        if name in _CACHED:
            d[name] = value
        return value

    def __iter__(self) -> Iterator[Any]:
        return iter(self.file_obj)

    def __next__(self) -> Any:
        return next(self.file_obj)

    def __enter__(self) -> StreamWrapper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        d = self.__dict__
        file_obj = d.get("file_obj")
        if file_obj is not None and not d.get("_closed", False):  # closed already: nothing to do
            try:
                file_obj.close()
            except Exception:  # noqa: BLE001 - a finalizer must not raise
                pass

    def __dir__(self) -> list[str]:
        return sorted(set(dir(type(self))) | set(self.__dict__) | set(dir(self.file_obj)))

    def __reduce__(self) -> tuple[Any, ...]:
        # An open OS file cannot travel to another process: pickle raises TypeError naming its type.
        return (StreamWrapper, (self.file_obj, self.name))

    def __repr__(self) -> str:  # torch's form: the name unquoted, no space; a URL's secrets masked
        if self.name is None:
            return redact(f"StreamWrapper<{self.file_obj!r}>")
        return redact(f"StreamWrapper<{self.name},{self.file_obj!r}>")


# -- one pass of an opener -------------------------------------------------------------------------


class _OpenPass:
    """The iterator of one pass of an opener: opens each path, tracks the streams it handed out.

    ``close()`` before the source ran out, or an exception escaping ``__next__``, closes the
    source's iterator and every stream of this pass still open. After the source ran out the
    streams are left alone. The source's iterator is created with the pass (opened in the opener's
    ``_open``, in its pass); nothing is pulled before the first ``next()``.
    """

    __slots__ = ("_pipe", "_source", "_open", "_stage", "_failures", "_streams", "_lock", "_n", "_ended", "__weakref__")

    def __init__(self, pipe: Any, source: Iterator[Any], open_fn: Callable[[Any], Any], stage: str, failures: Any) -> None:
        self._pipe = pipe
        self._open = open_fn
        self._stage = stage
        self._failures = failures  # a PassFailures with on_error="skip", else None
        self._streams: weakref.WeakSet[StreamWrapper] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._n = 0
        self._ended = False  # ran out, failed or closed (with _n: whether the pass has started)
        self._source: Iterator[Any] = source

    def __iter__(self) -> _OpenPass:
        return self

    def __next__(self) -> tuple[Any, StreamWrapper]:
        while True:
            try:
                path = next(self._source)
            except StopIteration:
                # Ran to the end: downstream buffers may still hold the streams; leave them be.
                self._ended = True
                self._source = iter(())
                self._streams = weakref.WeakSet()
                self._end()
                raise
            except BaseException:
                self._abandon()
                raise
            n = self._n
            self._n = n + 1
            try:
                stream = StreamWrapper(self._open(path), path)
                # where it came from: a pass state holding it saves that, not the open file (_readers.set_origin)
                stream.__dict__["_dp_origin"] = (self._pipe, path, n)
            except Exception as e:
                if self._failures is None:
                    add_stage_note(e, self._stage, n)
                    self._abandon()
                    raise
                try:
                    self._failures.skip(e, n)
                except BaseException:
                    self._abandon()
                    raise
                continue
            except BaseException:
                self._abandon()
                raise
            with self._lock:
                self._streams.add(stream)
            return path, stream

    def _abandon(self) -> None:
        self._ended = True
        source = self._source
        self._source = iter(())
        abandon(source)  # a failing pass releases its upstream at once (quietly: an error is leaving)
        with self._lock:
            streams = list(self._streams)
            self._streams = weakref.WeakSet()
        for stream in streams:
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - closing a read stream; the pass is failing already
                pass
        self._end()

    def _end(self) -> None:
        """Under ``on_error="skip"``: the summary of what this pass skipped (see datapipes.errors)."""
        if self._failures is not None:
            self._failures.end(self._n)

    def close(self) -> None:
        """Stop this pass: close the source's iterator and every stream of this pass still open
        (streams are left alone when the source already ran out). Idempotent."""
        source = self._source
        self._source = iter(())
        try:
            close = getattr(source, "close", None)
            if close is not None:
                close()
        finally:
            self._abandon()


class _OpenRun:
    """The position of an opener's pass under a failure budget (``max_failures``): the failures
    counted so far, so that a resumed pass gives up where the uninterrupted one would, and the
    items pulled (the positions its notes name). Two ints, read when the state is taken."""

    __slots__ = ("opened",)

    def __init__(self, opened: _OpenPass) -> None:
        self.opened = opened

    def state(self) -> dict[str, Any]:
        return {"n": self.opened._n, "failures": self.opened._failures.count}

    def restore(self, state: dict[str, Any]) -> None:
        opened = self.opened
        if opened._n or opened._ended:
            raise RuntimeError(_pass.STARTED)
        opened._n = check_int(state, "n")
        opened._failures.count = check_int(state, "failures")


def _open_pass(pipe: Any, ctx: Pass, source: Any, open_fn: Callable[[Any], Any]) -> _OpenPass:
    """One pass ``ctx`` of the opener stage ``pipe`` (its ``_policy`` and ``failures`` set) over
    ``source``, whose iterator is opened now: call it from the stage's ``_open``."""
    stage = stage_label(pipe)
    failures = pipe._policy.new_pass(stage, pipe.failures) if pipe._policy.skips else None
    opened = _OpenPass(pipe, ctx.open(source), open_fn, stage, failures)
    if pipe._policy.max_failures is not None:  # otherwise stateless (see _opener_stateless)
        ctx.track(pipe, _OpenRun(opened))
    return opened


def _opener_stateless(pipe: Any) -> bool:
    """Whether an opener's position is its source's: it opens one file per path, in order, and the
    streams it handed out are their consumers' (a reader downstream that is inside one when the
    state is taken opens it again through :meth:`FileOpener._reopener`). Only a failure budget
    (``max_failures``) is a state of its own (:class:`_OpenRun`)."""
    return pipe._policy.max_failures is None


def _opened_len(pipe: Any, source: Any, name: str = "datapipe") -> int:
    """The length of an opener stage over ``source``: unknown with ``on_error="skip"``."""
    if pipe._policy.skips:
        raise len_unknown(pipe, "with on_error='skip' the number of files that open is known only after iterating")
    return source_len(pipe, source, name)


def _paths_pipe(datapipe: Any, stage: str, name: str) -> IterDataPipe[Any]:
    """The source of an opener: a pipe, or any iterable of paths wrapped as one (torch's openers take
    an ``Iterable[str]``): a list or tuple is copied now, another iterable (a generator: one pass
    only) is wrapped as it is. A single path is refused (iterating it would give characters)."""
    if isinstance(datapipe, IterDataPipe):
        return datapipe
    if isinstance(datapipe, (list, tuple)):
        return IterableWrapper(list(datapipe))
    if isinstance(datapipe, (str, bytes, os.PathLike)):
        raise TypeError(
            f"{stage}: {name} must be an IterDataPipe or an iterable of paths, got the single path {datapipe!r:.100}; "
            f"pass [{datapipe!r:.100}]"
        )
    if not (hasattr(type(datapipe), "__iter__") or hasattr(type(datapipe), "__getitem__")):
        require_pipe(datapipe, stage, name)  # raises, naming the stage and the type
    return IterableWrapper(datapipe, deepcopy=False)


def _require_path(path: Any, stage: str, what: str = "path") -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{stage}: each {what} must be a str or os.PathLike, got {type(path).__name__}: {path!r:.100}")


# -- FileLister ------------------------------------------------------------------------------------


def _mask_matcher(masks: str | Sequence[str]) -> Callable[[str], Any] | None:
    """A function telling whether a file name matches one of the glob ``masks``; None matches all."""
    if isinstance(masks, str):
        masks = [masks] if masks else []
    if not masks:
        return None
    pattern = "|".join(fnmatch.translate(os.path.normcase(m)) for m in masks)
    match = re.compile(pattern).match
    if os.path.normcase("A") == "A":
        return match
    return lambda name: match(os.path.normcase(name))


def _raise(err: OSError) -> None:
    raise err


class _ListRun(Resumable):
    """The position of a lister's pass: the root being listed and how many of its files were
    yielded (the pass's own, besides the position of its source of roots).

    The files of a root come in lists (one per directory) and are yielded from a list iterator,
    whose index the state reads: nothing is counted per file. State: the root (a str) and an int.
    A resumed pass lists that root again (the listing only: no file is opened or read) and starts
    its iterator at the count, then goes on with the source of roots. A loaded root must be one the
    source of roots yields (read again to check it: ``_pass.check_yields``), never a folder the
    state alone names.
    """

    __slots__ = ("root", "done", "it", "size", "resume", "stage", "pass_")

    def __init__(self, stage: Any = None, pass_: Pass | None = None) -> None:
        self.stage = stage  # the lister: a loaded root must be one its source yields
        self.pass_ = pass_  # the lister's pass: the one whose side pass reads its source again
        self.root: str | None = None  # the root being listed, as the listing joins onto it
        self.done = 0  # files of this root in the lists before ``it``'s
        self.it: Iterator[str] = iter(())  # the list iterator being yielded from
        self.size = 0  # the length of its list (0 once it ran out)
        self.resume: tuple[str, int] | None = None
        self.started = False

    def state(self) -> dict[str, Any]:
        if self.root is None:
            return {"root": None, "index": 0}
        # the list's length less what its iterator has left (exact for a list iterator)
        return {"root": self.root, "index": self.done + self.size - length_hint(self.it)}

    def load(self, state: dict[str, Any]) -> None:
        root = check_str(state, "root", optional=True)
        index = check_int(state, "index")
        stage = self.stage
        if root is not None and stage is not None:  # a root its source yields, never one the state names
            def key(r: Any) -> Any:
                if not isinstance(r, (str, os.PathLike)):
                    return None
                return os.path.abspath(r) if getattr(stage, "abspath", False) else os.fspath(r)

            _pass.check_yields(stage, stage.datapipe, {key(root): (root, -1, "")}, self.pass_, key, "list")
        self.resume = None if root is None else (root, index)


def _listed(run: _ListRun, root: str, chunks: Iterable[list[str]], skip: int) -> Iterator[str]:
    """The paths of ``root``'s ``chunks`` (lists of paths) after the first ``skip``, ``run`` kept
    at their position."""
    run.root, run.done, run.it, run.size = root, 0, iter(()), 0
    for paths in chunks:
        n = len(paths)
        if skip >= n:
            skip -= n
            run.done += n
            continue
        run.it = it = iter(paths)
        run.size = n
        if skip:
            skip_items(it, skip)
            skip = 0
        yield from it
        run.done += n
        run.size = 0
    run.root = None  # done with this root: a state taken before the next one is between roots


def _local_chunks(pipe: FileLister, root: str, match: Callable[[str], Any] | None) -> Iterator[list[str]]:
    """The files under ``root``, a list per directory, in the listing's order."""
    if not os.path.isdir(root):
        if not os.path.exists(root):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), root)
        # A root that is a file (or a FIFO, a device) is listed as itself.
        yield [root] if match is None or match(os.path.basename(root)) else []
        return
    join = os.path.join
    if not pipe.recursive:
        with os.scandir(root) as entries:
            names = [e.name for e in entries if not e.is_dir()]
        if not pipe.non_deterministic:
            names.sort()
        yield [join(root, name) for name in names if match is None or match(name)]
        return
    for dirpath, dirs, files in os.walk(root, onerror=_raise):
        if not pipe.non_deterministic:
            files.sort()
            dirs.sort()  # in place: os.walk descends in this order
        yield [join(dirpath, name) for name in files if match is None or match(name)]


def _list_root(pipe: FileLister, root: Any, match: Callable[[str], Any] | None, run: _ListRun, skip: int) -> Iterator[str]:
    stage = stage_label(pipe)
    try:
        _require_path(root, stage, "root")
        root = os.fspath(root)
        if pipe.abspath:
            root = os.path.abspath(root)
        yield from _listed(run, root, _local_chunks(pipe, root, match), skip)
    except Exception as e:
        add_stage_note(e, stage)
        raise


def _list_files(pipe: FileLister, roots: Iterator[Any], run: _ListRun) -> Iterator[str]:
    match = _mask_matcher(pipe.masks)
    run.started = True
    try:
        if run.resume is not None:  # the root the saved pass was listing, from where it stood
            root, skip = run.resume
            run.resume = None
            yield from _list_root(pipe, root, match, run, skip)
        for root in roots:
            yield from _list_root(pipe, root, match, run, 0)
    except BaseException:
        abandon(roots)  # this frame names the upstream: release it now, not at collection
        raise


def _check_masks(masks: Any, stage: str) -> None:
    if isinstance(masks, str):
        return
    if isinstance(masks, (list, tuple)) and all(isinstance(m, str) for m in masks):
        return
    raise TypeError(f"{stage}: masks must be a str or a list of str, got {masks!r:.100}")



def _roots_pipe(root: Any, stage: str, kinds: tuple[type, ...]) -> IterDataPipe[Any]:
    """``root`` as a pipe of roots: a single root, a list of roots, or a pipe yielding roots."""
    if isinstance(root, IterDataPipe):
        return root
    if isinstance(root, kinds):
        return IterableWrapper([root])
    if isinstance(root, (list, tuple)):
        for r in root:
            if not isinstance(r, kinds):
                want = " or ".join(k.__name__ for k in kinds)
                raise TypeError(f"{stage}: each root must be a {want}, got {type(r).__name__}: {r!r:.100}")
        return IterableWrapper(list(root))
    raise TypeError(
        f"{stage}: root must be a path, a list of paths or an IterDataPipe of paths, got {type(root).__name__}"
    )


@functional_datapipe("list_files")
class FileLister(IterDataPipe[str]):
    """List the files under local root directories (functional name: ``list_files``).

    Args:
        root: a directory or file path (str or ``os.PathLike``), a list of them, or an
            ``IterDataPipe`` yielding them (``IterableWrapper(dirs).list_files()``). A root that is
            a file is listed as itself.
        masks: glob pattern(s) the file *name* must match (``"*.csv"`` or ``["*.jpg", "*.png"]``);
            ``""`` matches every file.
        recursive: also list the files of subdirectories (symlinked directories are not entered).
        abspath: yield absolute paths; otherwise paths are joined onto the root as given.
        non_deterministic: skip sorting (the order is then the file system's).
        length: the nominal ``len()`` of the listing (``-1``: unknown).

    Yields:
        File paths, root by root; within a directory sorted by name, each directory's files before
        those of its subdirectories (also sorted).

    Raises:
        FileNotFoundError: a root does not exist (the message names it).
        PermissionError / OSError: a directory cannot be read (the message names it).
        TypeError: a root is not a path.
        Each with a note naming the stage.

    ``len()`` is ``length`` when given; otherwise ``TypeError`` (listing is lazy, as in torch).

    Example:
        >>> import os, tempfile
        >>> from pathlib import Path
        >>> from datapipes.iter import FileLister
        >>> with tempfile.TemporaryDirectory() as d:
        ...     for name in ("b.csv", "a.csv", "sub/c.csv", "sub/d.txt"):
        ...         Path(d, name).parent.mkdir(exist_ok=True)
        ...         _ = Path(d, name).write_text("x")
        ...     [os.path.relpath(p, d) for p in FileLister(d, "*.csv", recursive=True)]
        ['a.csv', 'b.csv', 'sub/c.csv']

    See also: :class:`FileOpener`, :class:`FSSpecFileLister` for URLs.
    """

    _saves = "the root and an index in its sorted listing"

    def __init__(
        self,
        root: PathLike | Sequence[PathLike] | IterDataPipe[PathLike] = ".",
        masks: str | list[str] = "",
        *,
        recursive: bool = False,
        abspath: bool = False,
        non_deterministic: bool = False,
        length: int = -1,
    ) -> None:
        stage = "FileLister"
        self.datapipe = _roots_pipe(root, stage, (str, os.PathLike))
        _check_masks(masks, stage)
        require_bool(recursive, stage, "recursive")
        require_bool(abspath, stage, "abspath")
        require_bool(non_deterministic, stage, "non_deterministic")
        require_int(length, stage, "length", minimum=-1)
        self.masks = masks
        self.recursive = recursive
        self.abspath = abspath
        self.non_deterministic = non_deterministic
        self.length = length
        self._run = _list_files

    def _open(self, ctx: Pass) -> Iterator[str]:
        run = _ListRun(self, ctx)
        if not self.non_deterministic:
            # The root being listed and the files of it yielded (see _ListRun).
            ctx.track(self, run)
        else:  # a new listing need not repeat the file system's order: no position to save
            ctx.track(self, _Unresumable(
                f"{stage_label(self)} cannot save its position: it lists files in the file system's order "
                f"(non_deterministic=True), which a new listing need not repeat; list them sorted "
                f"(non_deterministic=False, the default) to save and resume"
            ))
        return self._run(self, ctx.open(self.datapipe), run)

    def __len__(self) -> int:
        if self.length == -1:
            raise len_unknown(self, "the number of files is known only after listing (pass length= to set it)")
        return self.length


# -- FileOpener ------------------------------------------------------------------------------------


def _check_read_mode(mode: Any, encoding: Any, stage: str) -> str:
    if mode not in _READ_MODES:
        raise ValueError(f"{stage}: mode must be one of 'r', 'rt', 't', 'rb', 'b', got {mode!r}")
    if encoding is not None and not isinstance(encoding, str):
        raise TypeError(f"{stage}: encoding must be a str or None, got {type(encoding).__name__}")
    normal = _READ_MODES[mode]
    if normal == "rb" and encoding is not None:
        raise ValueError(f"{stage}: binary mode {mode!r} takes no encoding, got encoding={encoding!r}")
    return normal


def _local_opener(pipe: FileOpener) -> Callable[[Any], Any]:
    mode = pipe._mode
    encoding = pipe.encoding
    stage = stage_label(pipe)

    def open_path(path: Any) -> Any:
        if not isinstance(path, (str, os.PathLike)):
            _require_path(path, stage)
        return open(path, mode, encoding=encoding)  # noqa: SIM115 - the stream's owner closes it

    return open_path


@functional_datapipe("open_files")
class FileOpener(IterDataPipe[tuple[str, StreamWrapper]]):
    """Open local files and yield ``(path, stream)`` pairs (functional name: ``open_files``).

    Args:
        datapipe: a pipe of paths (str or ``os.PathLike``), e.g. a :class:`FileLister`, or any
            iterable of paths as torch's (a list is copied here; a generator gives one pass).
        mode: ``"r"``/``"rt"``/``"t"`` for text (``str`` streams) or ``"rb"``/``"b"`` for binary.
        encoding: the text encoding (``None``: the locale's, as ``open``); binary mode takes none.
        length: the nominal ``len()`` (``-1``: the source's length, when known).
        on_error: ``"raise"`` (default) or ``"skip"``: a path that cannot be opened (missing,
            permission denied, a directory) is skipped and counted in ``pipe.failures``.
        max_failures: with ``on_error="skip"``, failures tolerated per pass: a number, or a float
            between 0 and 1 for a share of the items (``None``: any).
        warn_failures: with ``on_error="skip"``, past how many failures (a number, or a share:
            10% by default) a pass warns once (``None``: never); see :mod:`datapipes.errors`.

    Yields:
        ``(path, stream)``: the path as given and a :class:`StreamWrapper` over the open file.
        Files are opened lazily, one per item. The module docstring says when a stream is closed:
        when closed by its reader, when dropped, or when the pass is closed or fails.

    Raises:
        FileNotFoundError, PermissionError, IsADirectoryError, ... (``OSError``): the very error
        ``open`` raised (its message names the path), with a note naming the stage and position.
        TypeError: an item is not a path.

    ``len()`` is ``length`` when given, else the source's length (unknown with ``on_error="skip"``).

    Example:
        >>> import os, tempfile
        >>> from pathlib import Path
        >>> from datapipes.iter import IterableWrapper
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = Path(d, "a.bin").write_bytes(b"\\x00\\x01")
        ...     pipe = IterableWrapper([os.path.join(d, "a.bin")]).open_files(mode="b")
        ...     [stream.read() for _, stream in pipe]
        [b'\\x00\\x01']

    See also: :class:`FileLister`, :class:`FSSpecFileOpener` for URLs and remote files,
    :class:`StreamWrapper`.
    """

    _saves = (
        "nothing; under a failure budget (``on_error=\"skip\"`` with ``max_failures``): the items pulled and "
        "the failures counted (two ints)"
    )

    _repr_fields = ("mode",)

    def __init__(
        self,
        datapipe: Iterable[PathLike],
        mode: str = "r",
        encoding: str | None = None,
        length: int = -1,
        *,
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
    ) -> None:
        stage = "FileOpener"
        datapipe = _paths_pipe(datapipe, stage, "datapipe")
        self._mode = _check_read_mode(mode, encoding, stage)
        require_int(length, stage, "length", minimum=-1)
        self.datapipe = datapipe
        self.mode = mode
        self.encoding = encoding
        self.length = length
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures)
        self._stateless = _opener_stateless(self)  # one file per path: its position is its source's

    def _open(self, ctx: Pass) -> Iterator[tuple[str, StreamWrapper]]:
        return _open_pass(self, ctx, self.datapipe, _local_opener(self))

    def _reopener(self) -> Callable[[Any, int], StreamWrapper]:
        """How a reader of this stage's items opens one again by its path (``reopen(path, n)``, ``n``
        the item's position): a pass resumed inside a file reads it from its start again."""
        open_path = _local_opener(self)
        return lambda path, n: StreamWrapper(open_path(path), path)

    def __len__(self) -> int:
        if self.length != -1:
            return self.length
        return _opened_len(self, self.datapipe)


# -- Saver -----------------------------------------------------------------------------------------


def _check_write_mode(mode: Any, stage: str) -> None:
    if mode not in _WRITE_MODES:
        raise ValueError(f"{stage}: mode must be one of {', '.join(map(repr, _WRITE_MODES))}, got {mode!r}")


def _pair(item: Any, stage: str, n: int) -> tuple[Any, Any]:
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    raise TypeError(f"{stage}: expects (meta, data) pairs, got {type(item).__name__}: {item!r:.100}")


def _check_root(root: Any, stage: str) -> None:
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"{stage}: root must be a str or os.PathLike path or None, got {type(root).__name__}")


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` lies strictly inside ``folder`` (absolute and normalised): ``path`` is made
    absolute and normalised, its ``..`` resolved by name. Symbolic links are not resolved: only the
    user makes them (no writer or archive loader here does), and the file system follows them."""
    target = os.path.normcase(os.path.abspath(path))
    prefix = os.path.normcase(folder)
    if not prefix.endswith(os.sep):
        prefix += os.sep
    return target.startswith(prefix) and len(target) > len(prefix)


def _refused(stage: str, path: str, folder: str, why: str = "") -> ValueError:
    return ValueError(f"{stage}: refusing to write {path!r}: it is outside the folder {folder!r}{why}")


_SEPARATORS = re.compile("[" + re.escape(os.sep + (os.altsep or "")) + "]")


def _named_folder(path: str) -> str | None:
    """The folder ``path`` names before a ``..`` that follows a name in it (``d/x.tar/../../y``:
    ``d/x.tar``), or ``None`` where it has none (a leading ``../`` is where the path starts)."""
    drive, rest = os.path.splitdrive(path)
    parts = _SEPARATORS.split(rest)
    named = False
    for i, part in enumerate(parts):
        if part == "..":
            if named:
                return drive + os.sep.join(parts[:i])
        elif part and part != ".":
            named = True
    return None


def _check_target(stage: str, path: Any, root: str | None) -> None:
    """Refuse a target path outside ``root`` (absolute and normalised); without one, a path that
    climbs with ``..`` out of the folder it names first (see :class:`Saver`)."""
    name = os.fsdecode(path)
    if root is not None:
        if not _inside(name, root):
            raise _refused(stage, name, root)
    elif ".." in name:
        folder = _named_folder(name)
        if folder is not None and not _inside(name, os.path.abspath(folder)):
            raise _refused(stage, name, folder, " (which the path names before its '..'; normalise the path, or pass "
                                                "root=... to name the folder)")


def _save(pipe: Saver, it: Iterator[Any]) -> Iterator[Any]:
    stage = stage_label(pipe)
    fn = pipe.filepath_fn
    mode = pipe.mode
    root = None if pipe.root is None else os.path.abspath(pipe.root)  # once per pass: the working folder then
    n = 0
    try:
        for item in it:
            try:
                meta, data = _pair(item, stage, n)
                path = meta if fn is None else fn(meta)
                _check_target(stage, path, root)
                parent = os.path.dirname(path)
                if parent:
                    os.makedirs(parent, exist_ok=True)
                with open(path, mode) as f:
                    f.write(data)
            except Exception as e:
                add_stage_note(e, stage, n)
                raise
            yield path
            n += 1
    except BaseException:
        abandon(it)
        raise


@functional_datapipe("save_to_disk")
class Saver(IterDataPipe[str]):
    """Write each ``(meta, data)`` pair's data to a local file (functional name: ``save_to_disk``).

    Args:
        source_datapipe: a pipe of ``(meta, data)`` pairs.
        mode: the ``open`` mode: ``"w"`` (text, default), ``"wb"`` (bytes), ``"a"``/``"ab"``
            (append), ``"x"``/``"xb"`` (fail if the file exists).
        filepath_fn: ``filepath_fn(meta)`` gives the file's path; ``None``: ``meta`` is the path.
            Missing parent directories are created.
        root: the folder every file must be written in (a path is made absolute and normalised,
            its ``..`` resolved, before it is compared; symbolic links are not resolved).
            ``None`` (default): a path may not climb with ``..`` out of the folder it names
            before it (``out/x.tar/../../y`` is refused; ``../y`` and ``out/d/../d/y`` are not),
            so a name taken from data cannot lead a write elsewhere; pass ``root`` to hold
            absolute names to a folder too.

    Yields:
        The path of each file written, once it is written and closed.

    Raises:
        ValueError: a path outside ``root``, or one climbing out of its folder, naming the stage,
        the path and the folder (nothing is written). Whatever ``filepath_fn`` or writing raises
        (``OSError`` naming the path, ``TypeError`` for ``str`` data in a binary mode), as the
        same object with a note naming the stage and item. TypeError: an item is not a
        ``(meta, data)`` pair.

    ``len()`` is the source's length.

    Example:
        >>> import os, tempfile
        >>> from pathlib import Path
        >>> from datapipes.iter import IterableWrapper
        >>> with tempfile.TemporaryDirectory() as d:
        ...     pipe = IterableWrapper([("a.txt", "hello"), ("sub/b.txt", "world")])
        ...     paths = list(pipe.save_to_disk(filepath_fn=lambda name: os.path.join(d, name)))
        ...     [Path(p).read_text() for p in paths]
        ['hello', 'world']

    See also: :class:`FSSpecSaver` for URLs.
    """

    _saves = "nothing: at a boundary their position is their source's"

    _repr_fields = ("mode",)
    _stateless = True  # one file written per item, before the item is yielded: its position is its source's

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[Any, Any]],
        mode: str = "w",
        filepath_fn: Callable[[Any], Any] | None = None,
        *,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        stage = "Saver"
        require_pipe(source_datapipe, stage, "source_datapipe")
        _check_write_mode(mode, stage)
        require_callable(filepath_fn, stage, "filepath_fn", optional=True)
        _check_root(root, stage)
        self.source_datapipe = source_datapipe
        self.mode = mode
        self.filepath_fn = filepath_fn
        self.root = root
        self._run = _save

    def _open(self, ctx: Pass) -> Iterator[Any]:
        return self._run(self, ctx.open(self.source_datapipe))

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")
