"""The on-disk cache: OnDiskCacheHolder [on_disk_cache] and EndOnDiskCacheHolder [end_caching].

``on_disk_cache`` and ``end_caching`` bracket the expensive part of a pipe (a download, a
decompression). For each item reaching ``on_disk_cache``, ``filepath_fn(item)`` names its file in
the cache. An item whose file is there (and passes the hash and extra checks)
skips the bracketed stages: ``end_caching`` yields its path. Any other item goes through them and
``end_caching`` writes what comes out, ``(path, data)`` pairs, to disk and yields the paths.

- *One file per item*: the path ``end_caching`` writes is the one ``on_disk_cache`` named.
- *Several files per item* (an archive extracted): ``end_caching`` writes each file where its own
  ``filepath_fn`` says and, once the item is done, lists them in ``<path>.torchdata_list`` beside
  the path ``on_disk_cache`` named; later passes read that list (every file listed must still be
  there). The files of an item are those ``end_caching`` receives while that item is the newest
  one to have passed ``on_disk_cache``: the stages between must not read ahead (no ``prefetch``,
  no concurrent ``map``) in this mode.

**Where files go.** Names often come from data (archive members, URLs), so ``end_caching`` writes
only inside a folder: ``root`` where given, else the folder of the path ``on_disk_cache`` named for
the item (an extracted ``cache/x.tar`` may fill ``cache/``, ``cache/out/x.tar/``, ...). A path
outside it (after ``..`` is resolved) is refused before anything is written. The list of an item's
files is JSON, ``{"datapipes_cache_list": 1, "files": [...]}``, so no file name (a newline in a
member's name) can add an entry to it; a later pass trusts a list only where every file it names
is a file inside that folder, and otherwise makes the item again (writing the list anew). A list
of one path a line, as torchdata writes it, is read under the same condition.

Writes are atomic: a file is written under a temporary name in its folder and renamed onto its
path (``os.replace``) once complete, so a reader never sees half a file and a pass that fails or is
closed leaves nothing behind under the cache's names. Several processes (DataLoader workers, ranks
sharing a disk) may work on the same cache: the one that finds an item missing takes an exclusive
lock on ``<path>.promise`` (``fcntl.flock``; released by the OS if the process dies) until its
files are written; another process needing the same item waits for the lock (up to ``timeout``
seconds) and then reads the cache. Passes within one process never wait for each other: one that
meets an item another pass of the process is writing writes it again (the last complete write
wins). Where ``fcntl`` is missing (Windows) there is no lock: processes may write the same file
twice, which the atomic rename keeps safe.

**Order.** ``end_caching`` yields a cached item's paths as soon as ``on_disk_cache`` has looked
it up, and a written file's path once written: with one-to-one stages between, that is the
source's order, cached or not, so every pass yields the same sequence (torchdata yields the newly
written files first and the cached ones after).

**Checkpoints.** ``end_caching`` saves the paths it has yet to yield and the items being written
(their paths, and the files of each so far); ``on_disk_cache`` keeps no position of its own.

>>> import os, tempfile
>>> from datapipes.iter import IterableWrapper
>>> calls = []
>>> def fetch(name):
...     calls.append(name)
...     return name, name.upper().encode()
>>> with tempfile.TemporaryDirectory() as d:
...     path_of = lambda name: os.path.join(d, name)
...     pipe = (IterableWrapper(["a", "b"]).on_disk_cache(filepath_fn=path_of)
...             .map(fetch).end_caching(mode="wb", filepath_fn=path_of))
...     first = [os.path.basename(p) for p in pipe]
...     again = [open(p, "rb").read() for p in pipe]
>>> first, again, calls
(['a', 'b'], [b'A', b'B'], ['a', 'b'])
"""

from __future__ import annotations

import inspect
import json
import os
import threading
import time
import uuid
import weakref
from collections import deque
from typing import Any, Callable, Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no inter-process lock (see the module docstring)
    fcntl = None  # type: ignore[assignment]

from ..._runtime.passes import Pass
from ..._checks import require_bool
from ..._engine import abandon
from ..._engine import close_iterator as _close
from ...datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_callable, require_pipe, stage_label
from ...errors import add_stage_note
from ...graph import sources_of
from ..fileio import _check_root, _inside, _refused
from ..fileio import _pair as _meta_data
from .hash import _CHUNK, _check_hash_args, _file_digest, _mismatch, _unspecified
from ..._engine.lifecycle import Resumable

__all__ = ["EndOnDiskCacheHolder", "OnDiskCacheHolder"]

_END = object()
_LIST_SUFFIX = ".torchdata_list"  # torchdata's name for the list of an item's files
_LIST_MARK = "datapipes_cache_list"  # the key of a list's format version, in its JSON
_LIST_VERSION = 1
_PROMISE_SUFFIX = ".promise"


def _fspath(value: Any, stage: str, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        path = os.fspath(value)
        if isinstance(path, str):
            return path
    raise TypeError(f"{stage}: {what} must be a str or os.PathLike path, got {type(value).__name__}: {value!r:.100}")


# -- inter-process locks on the files being written ------------------------------------------------

#: paths this process holds the promise lock of (any pass): another pass of the process meeting one
#: writes it again instead of waiting for a lock it may itself be keeping from being released
_HELD: set[str] = set()
_HELD_LOCK = threading.Lock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_HELD.clear)  # a forked worker holds none of its parent's locks

_BUSY = object()


def _try_lock(path: str) -> Any:
    """The descriptor of ``<path>.promise`` locked exclusively by this process; ``_BUSY`` when another
    process holds it; ``None`` where there are no file locks (no ``fcntl``)."""
    if fcntl is None:
        return None
    promise = path + _PROMISE_SUFFIX
    parent = os.path.dirname(promise)
    if parent:
        os.makedirs(parent, exist_ok=True)
    while True:
        fd = os.open(promise, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return _BUSY
        except BaseException:
            os.close(fd)
            raise
        try:
            st = os.stat(promise)
            mine = os.fstat(fd)
            same = (st.st_ino, st.st_dev) == (mine.st_ino, mine.st_dev)
        except FileNotFoundError:
            same = False
        if same:
            return fd
        # Its holder removed it as we opened it: lock the file now at that name.
        os.close(fd)


def _unlock(path: str, fd: Any) -> None:
    """Release a lock of :func:`_try_lock`: the promise file is removed first, then unlocked."""
    if fd is None:
        return
    try:
        os.unlink(path + _PROMISE_SUFFIX)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def _wait_unlocked(path: str, timeout: float | None, stage: str) -> None:
    """Wait until no process holds ``<path>.promise``: polled (a file lock wakes nobody), from 1 ms
    up to 50 ms apart; ``TimeoutError`` after ``timeout`` seconds."""
    promise = path + _PROMISE_SUFFIX
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            fd = os.open(promise, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # type: ignore[union-attr]
            return  # its writer is done (or died): the lock was free
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(
                f"{stage}: OnDiskCache Exception: {path} expected to be written by different process, "
                f"but file is not ready in {timeout} seconds."
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _atomic_write(path: str, mode: str, data: Any, read: bool, verify: Callable[[str], None] | None = None) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, renamed onto ``path``
    once complete (and once ``verify(temporary path)`` returned). Streams are copied in chunks (and
    closed) unless ``read`` is false."""
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    # os.open honours the umask (mkstemp would make the cached file private to its owner).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with open(fd, mode) as f:
            if isinstance(data, (bytes, bytearray, memoryview, str)):
                f.write(data)
            elif read and hasattr(data, "read"):
                try:
                    for chunk in iter(lambda: data.read(_CHUNK), b"" if "b" in mode else ""):
                        f.write(chunk)
                finally:
                    _close(data)
            elif read and hasattr(data, "__iter__"):
                for chunk in data:
                    f.write(chunk)
            else:
                f.write(data)  # the file's own TypeError says what it takes
        if verify is not None:
            verify(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_list(path: str, files: list[str]) -> None:
    # JSON (ASCII: any name survives any locale's encoding), so no name can forge an entry.
    _atomic_write(path + _LIST_SUFFIX, "w", json.dumps({_LIST_MARK: _LIST_VERSION, "files": files}) + "\n", True)


def _read_list(path: str, folder: str) -> list[str] | None:
    """The files the list of ``path`` names, or ``None`` where the list is not to be trusted: it is
    in no form known, or a file it names is missing or outside ``folder``. ``FileNotFoundError``
    where there is no list."""
    with open(path + _LIST_SUFFIX) as f:
        try:
            text = f.read()
        except UnicodeDecodeError:
            return None
    files: Any
    if text.lstrip().startswith("{"):
        try:
            listed = json.loads(text)
        except ValueError:
            return None
        files = listed.get("files") if isinstance(listed, dict) and listed.get(_LIST_MARK) == _LIST_VERSION else None
        if not isinstance(files, list) or not all(isinstance(name, str) for name in files):
            return None
    else:  # one path a line, as torchdata writes it
        files = [line for line in text.split("\n") if line.strip()]
    return files if all(_inside(name, folder) and os.path.isfile(name) for name in files) else None


# -- OnDiskCacheHolder / EndOnDiskCacheHolder --------------------------------------------------------


class _Entry:
    """An item sent through the stages between the two cache stages, not yet done with."""

    __slots__ = ("path", "lock", "files", "single")

    def __init__(self, path: str, lock: Any, files: list[str] | None = None, single: bool = False) -> None:
        self.path = path  # the path on_disk_cache named for it
        self.lock = lock  # the promise's descriptor, or None
        self.files = [] if files is None else files  # the files written for it (several-files mode)
        self.single = single  # written as the one file at ``path``


#: pass -> {id(holder): its session}: how an on_disk_cache stage finds the end_caching stage of its pass
_SESSIONS: weakref.WeakKeyDictionary[Any, dict[int, _CacheSession]] = weakref.WeakKeyDictionary()
_SESSIONS_LOCK = threading.Lock()


class _CacheSession(Resumable):
    """One pass of an ``on_disk_cache`` ... ``end_caching`` pair: what the two stages share, and the
    run (``state()``/``restore()``) of the ``end_caching`` stage.

    ``pending``: paths to yield, in order (cached paths pushed by ``on_disk_cache`` as it looks items
    up, written paths pushed by ``end_caching``). ``inflight``: the items sent between the stages and
    not yet done with, oldest first (each holding its promise lock); ``last``: the newest item sent.
    An item is done when a file is attributed to a newer one, or when the source ends: its list of
    files is written then (several-files mode) and its lock released.
    """

    __slots__ = ("holder", "end", "holder_stage", "end_stage", "root", "pending", "inflight", "last", "n", "resume")

    def __init__(self, holder: OnDiskCacheHolder, end: EndOnDiskCacheHolder) -> None:
        self.holder = holder
        self.end = end
        # The folder files must be written in (absolute, as the working folder is when the pass
        # starts); None: each item's own folder (see folder_of).
        self.root = None if end.root is None else os.path.abspath(end.root)
        self.holder_stage = stage_label(holder)
        self.end_stage = stage_label(end)
        self.pending: deque[str] = deque()
        self.inflight: list[_Entry] = []
        self.last: _Entry | None = None
        self.n = 0  # items end_caching has written
        self.resume: dict[str, Any] | None = None
        self.started = False

    # -- on_disk_cache's side ---------------------------------------------------------------------
    def cached_files(self, path: str) -> list[str] | None:
        """The files of ``path`` in the cache, or None if it must be made."""
        try:
            return _read_list(path, self.folder_of(path))
        except FileNotFoundError:
            pass
        if not os.path.exists(path):
            return None
        holder = self.holder
        hash_dict = holder.hash_dict
        if hash_dict is not None:
            expected = hash_dict.get(path)
            if expected is None or _file_digest(path, holder.hash_type) != expected:
                return None
        check = holder.extra_check_fn
        if check is not None and not check(path):
            return None
        return [path]

    def look_up(self, item: Any) -> bool:
        """Whether ``item`` is cached (its paths then pushed to ``pending``); if not, it is recorded as
        sent, with the promise lock taken (waiting for another process's to be released first)."""
        fn = self.holder.filepath_fn
        path = _fspath(item if fn is None else fn(item), self.holder_stage, "the cache path of an item")
        while True:
            files = self.cached_files(path)
            if files is not None:
                self.pending.extend(files)
                return True
            with _HELD_LOCK:
                held = path in _HELD
            if held:  # being written by this process (this pass or another): write it again, unlocked
                lock = None
                break
            lock = _try_lock(path)
            if lock is _BUSY:
                _wait_unlocked(path, self.end.timeout, self.holder_stage)
                continue
            files = self.cached_files(path)  # written by another process while we looked
            if files is None:
                break
            _unlock(path, lock)
            self.pending.extend(files)
            return True
        if lock is not None:
            with _HELD_LOCK:
                _HELD.add(path)
        entry = _Entry(path, lock)
        self.inflight.append(entry)
        self.last = entry
        return False

    # -- end_caching's side -------------------------------------------------------------------------
    def folder_of(self, path: str) -> str:
        """The folder the files of the item ``on_disk_cache`` named ``path`` must be in."""
        return self.root or os.path.dirname(os.path.abspath(path))

    def write(self, item: Any, n: int) -> str:
        """Write the data of ``item``, a ``(meta, data)`` pair, and return its path."""
        end = self.end
        meta, data = _meta_data(item, self.end_stage, n)
        fn = end._filepath_fn
        path = _fspath(meta if fn is None else fn(meta), self.end_stage, "the file path of an item")
        try:
            single, owner = self.owner_of(path)
            if self.root is not None or not single:  # a single file is at the path on_disk_cache named
                folder = self.folder_of(owner.path)
                if not _inside(path, folder):
                    why = "" if self.root is not None else (
                        " (the folder of the path on_disk_cache named for its item; pass root=... to name another)")
                    raise _refused(self.end_stage, path, folder, why)
        except BaseException:
            if hasattr(data, "read"):
                _close(data)  # a stream to be written (an archive member, a download): read by nobody now
            raise
        hash_dict = self.holder.hash_dict
        verify = None
        if hash_dict is not None:
            expected = hash_dict.get(path)
            if expected is None:
                raise _unspecified(self.end_stage, path)
            hash_type, stage = self.holder.hash_type, self.end_stage

            def verify(tmp: str) -> None:
                digest = _file_digest(tmp, hash_type)
                if digest != expected:
                    raise _mismatch(stage, path, digest, expected)

        _atomic_write(path, end.mode, data, not end.skip_read, verify)
        self.attribute(path, single, owner)
        return path

    def owner_of(self, path: str) -> tuple[bool, _Entry]:
        """``(single, entry)``: the item sent that ``path`` is written for: the one ``on_disk_cache``
        named so (``single``), else the newest item sent. ``RuntimeError`` where there is none."""
        for entry in self.inflight:
            if entry.path == path and not entry.files:
                return True, entry
        owner = self.last
        if owner is None or owner.single:
            where = "no item has been sent" if owner is None else f"{owner.path!r} was written as its own file"
            raise RuntimeError(
                f"{self.end_stage}: cannot tell which item {path!r} belongs to ({where}): the stages between "
                f"on_disk_cache and end_caching must turn each item into the one file on_disk_cache named, or into "
                "files of other names, one item at a time"
            )
        return False, owner

    def attribute(self, path: str, single: bool, owner: _Entry) -> None:
        """Record that ``path`` was written for ``owner`` (see :meth:`owner_of`); the items sent
        before it are done, and so is ``owner`` where it was its one file."""
        inflight = self.inflight
        if single:
            owner.single = True
        else:
            owner.files.append(path)
        for i, entry in enumerate(inflight):
            if entry is owner:
                self.complete(i + 1 if single else i)
                return

    def complete(self, upto: int) -> None:
        """The first ``upto`` items sent are done: list their files, release their locks."""
        done = self.inflight[:upto]
        del self.inflight[:upto]
        for i, entry in enumerate(done):
            try:
                if entry.files:
                    _write_list(entry.path, entry.files)
            except BaseException:
                self.inflight[:0] = done[i + 1 :]  # released by release()
                self.release_entry(entry)
                raise
            self.release_entry(entry)

    def release_entry(self, entry: _Entry) -> None:
        lock, entry.lock = entry.lock, None
        if lock is not None:
            with _HELD_LOCK:
                _HELD.discard(entry.path)
            _unlock(entry.path, lock)

    def release(self) -> None:
        """Let go of every lock still held (the pass ended, failed or was closed)."""
        for entry in self.inflight:
            self.release_entry(entry)

    # -- the run of end_caching ---------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        if not self.started and self.resume is not None:
            return dict(self.resume)
        last = self.last
        return {
            "pending": list(self.pending),
            "n": self.n,
            "inflight": [[e.path, list(e.files), e.single] for e in self.inflight],
            "last": None if last is None else [last.path, list(last.files), last.single],
            "last_inflight": bool(self.inflight) and self.inflight[-1] is last,
        }

    def load(self, state: dict[str, Any]) -> None:
        self.resume = state

    def begin(self) -> None:
        """Called as the pass starts: take up a restored state (locks taken again where free)."""
        self.started = True
        state, self.resume = self.resume, None
        if state is None:
            return
        self.pending.extend(state["pending"])
        self.n = int(state["n"])
        for path, files, single in state["inflight"]:
            lock = _try_lock(path)
            if lock is _BUSY:
                lock = None  # another process is at it: ours is written again, atomically
            elif lock is not None:
                with _HELD_LOCK:
                    _HELD.add(path)
            self.inflight.append(_Entry(path, lock, list(files), bool(single)))
        last = state["last"]
        if state["last_inflight"] and self.inflight:
            self.last = self.inflight[-1]
        elif last is not None:
            self.last = _Entry(last[0], None, list(last[1]), bool(last[2]))


def _session_of(holder: OnDiskCacheHolder, ctx: Pass) -> _CacheSession | None:
    """The session ``end_caching`` opened for ``holder`` in pass ``ctx`` (None: none did)."""
    with _SESSIONS_LOCK:
        return _SESSIONS.get(ctx, {}).get(id(holder))


def _hold(pipe: OnDiskCacheHolder, it: Iterator[Any], session: _CacheSession) -> Iterator[Any]:
    stage = session.holder_stage
    look_up = session.look_up
    n = -1
    try:
        for item in it:
            n += 1
            try:
                cached = look_up(item)
            except Exception as e:
                add_stage_note(e, stage, n)
                raise
            if not cached:
                yield item
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


@functional_datapipe("on_disk_cache")
class OnDiskCacheHolder(IterDataPipe[Any]):
    """Start an on-disk cache: items whose files are cached skip the stages up to ``end_caching``
    (functional name: ``on_disk_cache``).

    Args:
        source_datapipe: the source pipe (URLs, names, ...).
        filepath_fn: ``filepath_fn(item)`` gives the item's path in the cache (one ``str``; a
            generator function is refused, as in torchdata 0.9); ``None``: the item is the path.
        hash_dict: ``{path: hex digest}``: a cached file counts only if its digest matches, and
            ``end_caching`` checks every file it writes against it (a path missing from it is an
            error there). ``None``: no hash check.
        hash_type: ``"sha256"`` (default) or ``"md5"``.
        extra_check_fn: ``extra_check_fn(path) -> bool``: a cached file counts only if true.

    Yields:
        Only through the ``end_caching`` stage that closes it (see :class:`EndOnDiskCacheHolder` and
        the module docstring): the items not cached, to the stages between.

    Raises:
        RuntimeError: iterated without an ``end_caching`` stage (torchdata's phrase: "Please call
        `end_caching()` before iteration."). ``filepath_fn``'s errors, and ``TypeError`` for a path
        that is not a str, with a note naming the stage and item.

    ``len()`` raises ``TypeError``: which items are cached is known only when they are looked up.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(["a"]).on_disk_cache())
        Traceback (most recent call last):
        ...
        RuntimeError: OnDiskCacheHolder: Please call `end_caching()` before iteration.

    See also: :class:`EndOnDiskCacheHolder`, :class:`~datapipes.iter.InMemoryCacheHolder`.
    """

    _saves = "nothing: at a boundary their position is their source's"

    _stateless = True  # its bookkeeping is end_caching's run; its position is its source's

    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        filepath_fn: Callable[[Any], Any] | None = None,
        hash_dict: dict[str, str] | None = None,
        hash_type: str = "sha256",
        extra_check_fn: Callable[[str], bool] | None = None,
    ) -> None:
        stage = "OnDiskCacheHolder"
        require_pipe(source_datapipe, stage, "source_datapipe")
        require_callable(filepath_fn, stage, "filepath_fn", optional=True)
        if inspect.isgeneratorfunction(filepath_fn):
            raise TypeError(f"{stage}: filepath_fn must return one path, not be a generator function")
        _check_hash_args(hash_dict, hash_type, stage, optional=True)
        require_callable(extra_check_fn, stage, "extra_check_fn", optional=True)
        self.source_datapipe = source_datapipe
        self.filepath_fn = filepath_fn
        self.hash_dict = hash_dict
        self.hash_type = hash_type
        self.extra_check_fn = extra_check_fn
        self._ended = False  # set by the end_caching stage built over it

    def _open(self, ctx: Pass) -> Iterator[Any]:
        session = _session_of(self, ctx)
        if session is None:
            why = "it is iterated only by its end_caching stage; " if self._ended else ""
            raise RuntimeError(f"{stage_label(self)}: {why}Please call `end_caching()` before iteration.")
        return _hold(self, ctx.open(self.source_datapipe), session)

    def __len__(self) -> int:
        raise len_unknown(self, "which items are cached is known only when they are looked up", NO_LEN)

    def __add__(self, other: Any) -> Any:
        raise RuntimeError("`OnDiskCacheHolder` doesn't support add operation")


def _find_holder(datapipe: IterDataPipe[Any]) -> OnDiskCacheHolder | None:
    """The nearest :class:`OnDiskCacheHolder` upstream of ``datapipe`` (itself included), breadth first."""
    seen: set[int] = set()
    level = [datapipe]
    while level:
        nxt = []
        for pipe in level:
            if id(pipe) in seen:
                continue
            seen.add(id(pipe))
            if isinstance(pipe, OnDiskCacheHolder):
                return pipe
            nxt.extend(sources_of(pipe))
        level = nxt
    return None


def _end_caching(pipe: EndOnDiskCacheHolder, it: Iterator[Any], session: _CacheSession) -> Iterator[str]:
    stage = session.end_stage
    session.begin()
    pending = session.pending
    write = session.write
    try:
        while True:
            while pending:
                yield pending.popleft()
            item = next(it, _END)
            if item is _END:
                break
            n = session.n
            try:
                path = write(item, n)
            except Exception as e:
                add_stage_note(e, stage, n)
                raise
            session.n = n + 1
            pending.append(path)  # after the cached paths looked up while this item was made
        session.complete(len(session.inflight))
        while pending:
            yield pending.popleft()
    except BaseException:
        abandon(it)
        raise
    finally:
        session.release()


@functional_datapipe("end_caching")
class EndOnDiskCacheHolder(IterDataPipe[str]):
    """End an on-disk cache: write what the stages since ``on_disk_cache`` made to disk, and yield
    the paths of every item's files, cached or written (functional name: ``end_caching``).

    Args:
        datapipe: a pipe of ``(meta, data)`` pairs with an ``on_disk_cache`` stage upstream (the
            nearest one is closed by this stage). ``data`` is ``bytes``/``str`` or a stream (read in
            chunks and closed) or an iterable of chunks.
        mode: ``"wb"`` (default) or ``"w"``/``"wt"`` (text).
        filepath_fn: ``filepath_fn(meta)`` gives the path to write; ``None``: ``meta`` is the path.
        same_filepath_fn: use ``on_disk_cache``'s ``filepath_fn`` on ``meta`` (exclusive with
            ``filepath_fn``).
        skip_read: write ``data`` as it is (``bytes``/``str``), never reading it as a stream.
        timeout: seconds to wait for another process writing an item this pass needs (its promise
            lock); ``None``: no limit.
        root: the folder every file must be written in. ``None`` (default): the folder of the
            path ``on_disk_cache`` named for the item the file is written for (files extracted
            from ``cache/x.tar`` go anywhere under ``cache/``). A path is made absolute and
            normalised, its ``..`` resolved, before it is compared (symbolic links are not
            resolved); a path outside is refused before anything is written, so a name taken from
            data cannot lead a write elsewhere. Lists of files are read under the same rule.

    Yields:
        File paths: for a cached item the path ``on_disk_cache`` named (or the files listed for it),
        for another each file written, once written. See the module docstring for the order.

    Raises:
        RuntimeError: no ``on_disk_cache`` upstream, or its cache already ended (torchdata's
        phrases); a file whose hash does not match ``hash_dict`` or has no entry in it (the file
        is removed); a file that belongs to no item (see the module docstring). ValueError: a path
        outside the folder files must be written in (see ``root``), naming the stage, the path
        and the folder; nothing is written. TimeoutError:
        another process held an item's lock for more than ``timeout`` seconds. ValueError:
        ``filepath_fn`` with ``same_filepath_fn=True``. Writing errors (``OSError``) and
        ``filepath_fn``'s pass through as the same object, with a note naming the stage and item.

    ``len()`` raises ``TypeError``: an item may give several files.

    Example:
        >>> import os, tempfile
        >>> from datapipes.iter import IterableWrapper
        >>> with tempfile.TemporaryDirectory() as d:
        ...     local = lambda url: os.path.join(d, url.rsplit("/", 1)[-1])
        ...     urls = IterableWrapper(["https://example.com/x.txt"]).on_disk_cache(filepath_fn=local)
        ...     pipe = urls.map(lambda url: (url, b"payload")).end_caching(same_filepath_fn=True)
        ...     [(os.path.basename(p), open(p, "rb").read()) for p in pipe]
        [('x.txt', b'payload')]

    See also: :class:`OnDiskCacheHolder`, :class:`HttpReader`.
    """

    _saves = {
        "``end_caching`` (with ``on_disk_cache``)": (
            "the paths not yet yielded, the items between the two stages (their paths and the files written "
            "for them) and a count"
        ),
    }

    _repr_fields = ("mode",)

    def __init__(
        self,
        datapipe: IterDataPipe[tuple[Any, Any]],
        mode: str = "wb",
        filepath_fn: Callable[[Any], Any] | None = None,
        *,
        same_filepath_fn: bool = False,
        skip_read: bool = False,
        timeout: float | None = 300,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        stage = "EndOnDiskCacheHolder"
        require_pipe(datapipe, stage)
        _check_root(root, stage)
        if mode not in ("wb", "w", "wt"):
            raise ValueError(f"{stage}: mode must be 'wb', 'w' or 'wt', got {mode!r}")
        require_callable(filepath_fn, stage, "filepath_fn", optional=True)
        require_bool(same_filepath_fn, stage, "same_filepath_fn")
        require_bool(skip_read, stage, "skip_read")
        if filepath_fn is not None and same_filepath_fn:
            raise ValueError(f"{stage}: `filepath_fn` is mutually exclusive with `same_filepath_fn`")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError(f"{stage}: timeout must be a number of seconds or None, got {type(timeout).__name__}")
            if not timeout >= 0:
                raise ValueError(f"{stage}: timeout must be >= 0, got {timeout!r}")
        holder = _find_holder(datapipe)
        if holder is None:
            raise RuntimeError(f"{stage}: Expected `OnDiskCacheHolder` existing in pipeline when `end_caching` is invoked")
        if holder._ended:
            raise RuntimeError(f"{stage}: `end_caching` can only be invoked once per `OnDiskCacheHolder`")
        holder._ended = True
        self.datapipe = datapipe
        self.mode = mode
        self.filepath_fn = filepath_fn
        self.same_filepath_fn = same_filepath_fn
        self.skip_read = skip_read
        self.timeout = timeout
        self.root = root
        self._holder = holder

    @property
    def _filepath_fn(self) -> Callable[[Any], Any] | None:
        return self._holder.filepath_fn if self.same_filepath_fn else self.filepath_fn

    def _sources(self) -> list[Any]:
        return [self.datapipe]  # the holder is upstream of it, not a source of its own

    def _open(self, ctx: Pass) -> Iterator[str]:
        session = _CacheSession(self._holder, self)
        with _SESSIONS_LOCK:
            _SESSIONS.setdefault(ctx, {})[id(self._holder)] = session
        it = ctx.open(self.datapipe)  # on_disk_cache's _open finds the session of this pass
        ctx.track(self, session)
        return _end_caching(self, it, session)

    def __len__(self) -> int:
        raise len_unknown(self, "an item may give several files, and which are cached is known only when looked up",
                          NO_LEN)
