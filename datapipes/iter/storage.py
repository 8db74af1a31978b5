"""Storing and fetching whole files: OnDiskCacheHolder [on_disk_cache] and EndOnDiskCacheHolder
[end_caching], HashChecker [check_hash], HttpReader [read_from_http], OnlineReader
[read_from_remote], Bz2FileLoader [load_from_bz2], XzFileLoader [load_from_xz], Extractor [extract],
TFRecordLoader [load_from_tfrecord].

**The on-disk cache.** ``on_disk_cache`` and ``end_caching`` bracket the expensive part of a pipe
(a download, a decompression). For each item reaching ``on_disk_cache``, ``filepath_fn(item)``
names its file in the cache. An item whose file is there (and passes the hash and extra checks)
skips the bracketed stages: ``end_caching`` yields its path. Any other item goes through them and
``end_caching`` writes what comes out, ``(path, data)`` pairs, to disk and yields the paths.

- *One file per item*: the path ``end_caching`` writes is the one ``on_disk_cache`` named.
- *Several files per item* (an archive extracted): ``end_caching`` writes each file where its own
  ``filepath_fn`` says and, once the item is done, lists them in ``<path>.torchdata_list`` beside
  the path ``on_disk_cache`` named; later passes read that list (every file listed must still be
  there). The files of an item are those ``end_caching`` receives while that item is the newest
  one to have passed ``on_disk_cache``: the stages between must not read ahead (no ``prefetch``,
  no concurrent ``map``) in this mode.

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
``check_hash``, ``read_from_http``, ``read_from_remote``, ``load_from_bz2``, ``load_from_xz`` keep
none either (one output per item). ``extract`` saves the archive it is reading, as
``load_from_tar`` does; ``load_from_tfrecord`` the file it is reading and the records read.

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

import base64
import hashlib
import inspect
import io
import os
import threading
import time
import uuid
import warnings
import weakref
from collections import deque
from itertools import chain, islice
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

if TYPE_CHECKING:  # the aliases below name torch types; importing torch here at runtime is not needed
    import torch

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no inter-process lock (see the module docstring)
    fcntl = None  # type: ignore[assignment]

from .. import _pass
from .._positions import Enumerated
from .._checks import phrased, require_bool
from .._engine import abandon
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_callable, require_int, require_pipe, source_len, stage_label
from ..errors import add_stage_note, policy_and_log
from ..graph import sources_of
from .archive import _decompressing, _tar, _zip
from .fileio import StreamWrapper, _open_pass, _opened_len, _paths_pipe
from .fileio import _pair as _meta_data
from .parsing import _close, _item, _open_item, _pair, _read_run, _reopener, set_origin
from .remote import _check_retries, _RetryingReader, _url_note

__all__ = [
    "Bz2FileLoader",
    "EndOnDiskCacheHolder",
    "Extractor",
    "HashChecker",
    "HttpReader",
    "OnDiskCacheHolder",
    "OnlineReader",
    "TFRecordExample",
    "TFRecordExampleSpec",
    "TFRecordLoader",
    "XzFileLoader",
]

#: The type of one parsed ``tf.train.Example``, as torchdata's (feature name -> tensor, or a list
#: of tensors, or a list of bytes).
TFRecordExample = dict[str, "torch.Tensor | list[torch.Tensor] | list[bytes] | list[list[bytes]]"]
#: The type of ``load_from_tfrecord``'s ``spec``, as torchdata's (feature name -> (shape, dtype)).
TFRecordExampleSpec = dict[str, tuple[tuple[int, ...], "torch.dtype"]]

_END = object()
_HASH_TYPES = ("sha256", "md5")
_CHUNK = 1 << 20  # bytes read at a time when hashing or copying a stream
_LIST_SUFFIX = ".torchdata_list"  # torchdata's name for the list of an item's files
_PROMISE_SUFFIX = ".promise"



def _check_hash_args(hash_dict: Any, hash_type: Any, stage: str, optional: bool) -> None:
    if hash_dict is None:
        if not optional:
            raise TypeError(f"{stage}: hash_dict must be a dict of file path -> hex digest, got None")
    elif not isinstance(hash_dict, Mapping):
        raise TypeError(f"{stage}: hash_dict must be a dict of file path -> hex digest, got {type(hash_dict).__name__}")
    if hash_type not in _HASH_TYPES:
        # torchdata's words: HashChecker lists the types, OnDiskCacheHolder gives a tuple
        kinds = list(_HASH_TYPES) if stage == "HashChecker" else _HASH_TYPES
        raise ValueError(phrased(stage, f"Invalid hash_type requested, should be one of {kinds}", hash_type=hash_type))


def _hasher(hash_type: str) -> Any:
    return hashlib.sha256() if hash_type == "sha256" else hashlib.md5()


def _file_digest(path: str, hash_type: str) -> str:
    h = _hasher(hash_type)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _mismatch(stage: str, path: Any, digest: str, expected: str) -> RuntimeError:
    # torchdata's phrase last, intact
    return RuntimeError(
        f"{stage}: expected {expected}: The hash {digest} of {path} does not match. Delete the file manually and retry."
    )


def _unspecified(stage: str, path: Any) -> RuntimeError:
    return RuntimeError(f"{stage}: Unspecified hash for file {path}")  # torchdata's words, hash_dict has no entry


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
    _atomic_write(path + _LIST_SUFFIX, "w", "".join(f"{name}\n" for name in files), True)


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


class _CacheSession:
    """One pass of an ``on_disk_cache`` ... ``end_caching`` pair: what the two stages share, and the
    run (``state()``/``restore()``) of the ``end_caching`` stage.

    ``pending``: paths to yield, in order (cached paths pushed by ``on_disk_cache`` as it looks items
    up, written paths pushed by ``end_caching``). ``inflight``: the items sent between the stages and
    not yet done with, oldest first (each holding its promise lock); ``last``: the newest item sent.
    An item is done when a file is attributed to a newer one, or when the source ends: its list of
    files is written then (several-files mode) and its lock released.
    """

    __slots__ = ("holder", "end", "holder_stage", "end_stage", "pending", "inflight", "last", "n", "resume", "started")

    def __init__(self, holder: OnDiskCacheHolder, end: EndOnDiskCacheHolder) -> None:
        self.holder = holder
        self.end = end
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
            with open(path + _LIST_SUFFIX) as f:
                files = [line.rstrip("\n") for line in f if line.strip()]
        except FileNotFoundError:
            pass
        else:
            return files if all(os.path.exists(p) for p in files) else None
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
    def write(self, item: Any, n: int) -> str:
        """Write the data of ``item``, a ``(meta, data)`` pair, and return its path."""
        end = self.end
        meta, data = _meta_data(item, self.end_stage, n)
        fn = end._filepath_fn
        path = _fspath(meta if fn is None else fn(meta), self.end_stage, "the file path of an item")
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
        self.attribute(path)
        return path

    def attribute(self, path: str) -> None:
        """Record that ``path`` was written for an item sent: the one ``on_disk_cache`` named so, else
        the newest item sent; the older items are done."""
        inflight = self.inflight
        for i, entry in enumerate(inflight):
            if entry.path == path and not entry.files:
                entry.single = True
                self.complete(i + 1)
                return
        owner = self.last
        if owner is None or owner.single:
            where = "no item has been sent" if owner is None else f"{owner.path!r} was written as its own file"
            raise RuntimeError(
                f"{self.end_stage}: cannot tell which item {path!r} belongs to ({where}): the stages between "
                f"on_disk_cache and end_caching must turn each item into the one file on_disk_cache named, or into "
                "files of other names, one item at a time"
            )
        owner.files.append(path)
        for i, entry in enumerate(inflight):
            if entry is owner:
                self.complete(i)
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

    def restore(self, state: dict[str, Any]) -> None:
        if self.started:
            raise RuntimeError(_pass.STARTED)
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


def _session_of(holder: OnDiskCacheHolder) -> _CacheSession | None:
    pass_ = _pass.current() or _pass.owner(holder)
    if pass_ is None:
        return None
    with _SESSIONS_LOCK:
        return _SESSIONS.get(pass_, {}).get(id(holder))


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

    def __iter__(self) -> Iterator[Any]:
        session = _session_of(self)
        if session is None:
            why = "it is iterated only by its end_caching stage; " if self._ended else ""
            raise RuntimeError(f"{stage_label(self)}: {why}Please call `end_caching()` before iteration.")
        return _hold(self, iter(self.source_datapipe), session)

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

    Yields:
        File paths: for a cached item the path ``on_disk_cache`` named (or the files listed for it),
        for another each file written, once written. See the module docstring for the order.

    Raises:
        RuntimeError: no ``on_disk_cache`` upstream, or its cache already ended (torchdata's
        phrases); a file whose hash does not match ``hash_dict`` or has no entry in it (the file
        is removed); a file that belongs to no item (see the module docstring). TimeoutError:
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
    ) -> None:
        stage = "EndOnDiskCacheHolder"
        require_pipe(datapipe, stage)
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
        self._holder = holder

    @property
    def _filepath_fn(self) -> Callable[[Any], Any] | None:
        return self._holder.filepath_fn if self.same_filepath_fn else self.filepath_fn

    def _sources(self) -> list[Any]:
        return [self.datapipe]  # the holder is upstream of it, not a source of its own

    def __iter__(self) -> Iterator[str]:
        session = _CacheSession(self._holder, self)
        pass_ = _pass.current() or _pass.owner(self)
        if pass_ is not None:  # always, through IterDataPipe.__iter__
            with _SESSIONS_LOCK:
                _SESSIONS.setdefault(pass_, {})[id(self._holder)] = session
        it = iter(self.datapipe)  # on_disk_cache's __iter__ finds the session of this pass
        _pass.track(self, session)
        return _end_caching(self, it, session)

    def __len__(self) -> int:
        raise len_unknown(self, "an item may give several files, and which are cached is known only when looked up",
                          NO_LEN)


# -- HashChecker -----------------------------------------------------------------------------------


def _seekable(stream: Any) -> bool:
    seekable = getattr(stream, "seekable", None)
    try:
        return bool(seekable()) if seekable is not None else False
    except (OSError, ValueError):
        return False


def _hash_data(data: Any, h: Any, rewind: bool, path: Any, stage: str) -> Any:
    """Feed ``data`` to ``h``; return what to yield in its place (the stream rewound, or its
    contents in memory when it cannot seek)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        h.update(data)
        return data
    if isinstance(data, str):
        h.update(data.encode())
        return data
    read = getattr(data, "read", None)
    if read is None:
        raise TypeError(f"{stage}: expects (path, data) pairs with bytes, str or a stream, got {type(data).__name__}")
    keep: list[Any] | None = [] if rewind and not _seekable(data) else None
    while True:
        chunk = read(_CHUNK)
        if not chunk:
            break
        h.update(chunk.encode() if isinstance(chunk, str) else chunk)
        if keep is not None:
            keep.append(chunk)
    if not rewind:
        return data
    if keep is None:
        data.seek(0)
        return data
    # A stream that cannot seek (HTTP): its contents, read once, are handed on in memory.
    _close(data)
    text = bool(keep) and isinstance(keep[0], str)
    return StreamWrapper(io.StringIO("".join(keep)) if text else io.BytesIO(b"".join(keep)), path)


def _check_hashes(pipe: HashChecker, it: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
    stage = stage_label(pipe)
    hash_dict, hash_type, rewind = pipe.hash_dict, pipe.hash_type, pipe.rewind
    n = -1
    try:
        for item in it:
            n += 1
            path, data = _pair(item, stage, n)
            try:
                expected = hash_dict.get(path)
                if expected is None:
                    raise _unspecified(stage, path)
                h = _hasher(hash_type)
                data = _hash_data(data, h, rewind, path, stage)
                digest = h.hexdigest()
                if digest != expected:
                    raise _mismatch(stage, path, digest, expected)
            except Exception as e:
                add_stage_note(e, stage, n, f"file {path!r}, item")
                raise
            yield path, data
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


@functional_datapipe("check_hash")
class HashChecker(IterDataPipe[tuple[Any, Any]]):
    """Check the hash of each file of ``(path, data)`` pairs against ``hash_dict``
    (functional name: ``check_hash``).

    Args:
        source_datapipe: a pipe of ``(path, data)`` pairs: ``data`` is ``bytes``, ``str`` (hashed
            as UTF-8) or a stream (read to its end in 1 MiB chunks).
        hash_dict: ``{path: expected hex digest}``.
        hash_type: ``"sha256"`` (default) or ``"md5"``.
        rewind: hand on a stream rewound to its start after hashing it. A stream that cannot seek
            (HTTP) is handed on as an in-memory copy of what was read (torchdata fails on it).
            ``False``: the stream is handed on as it is, read to its end.

    Yields:
        ``(path, data)`` once the hash matched.

    Raises:
        RuntimeError: the path has no entry in ``hash_dict``, or the hash does not match
        (torchdata's phrases: "Unspecified hash for file ...", "The hash ... of ... does not match.
        Delete the file manually and retry."), with a note naming the stage and file.
        TypeError: an item is not a ``(path, data)`` pair.

    ``len()`` is the source's length.

    Example:
        >>> import hashlib, io
        >>> from datapipes.iter import IterableWrapper
        >>> digest = hashlib.sha256(b"abc").hexdigest()
        >>> pipe = IterableWrapper([("a.bin", io.BytesIO(b"abc"))]).check_hash({"a.bin": digest})
        >>> [(path, stream.read()) for path, stream in pipe]
        [('a.bin', b'abc')]

    See also: :class:`OnDiskCacheHolder` (its ``hash_dict``).
    """

    _stateless = True  # one item out per item in: its position is its source's

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[Any, Any]],
        hash_dict: dict[str, str],
        hash_type: str = "sha256",
        rewind: bool = True,
    ) -> None:
        stage = "HashChecker"
        require_pipe(source_datapipe, stage, "source_datapipe")
        _check_hash_args(hash_dict, hash_type, stage, optional=False)
        require_bool(rewind, stage, "rewind")
        self.source_datapipe = source_datapipe
        self.hash_dict = hash_dict
        self.hash_type = hash_type
        self.rewind = rewind

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return _check_hashes(self, iter(self.source_datapipe))

    def _reopener(self) -> Callable[[Any, int], Any] | None:
        """A reader downstream opens a file again through the source's opener (the same file)."""
        return _reopener(self.source_datapipe)

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")


# -- HttpReader / OnlineReader ---------------------------------------------------------------------


def _check_timeout(timeout: Any, stage: str) -> None:
    if timeout is None:
        return
    values = timeout if isinstance(timeout, tuple) and len(timeout) == 2 else (timeout,)
    for v in values:
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise TypeError(f"{stage}: timeout must be seconds, a (connect, read) pair of them, or None, got {timeout!r}")
        if v is not None and not v > 0:
            raise ValueError(f"{stage}: timeout must be > 0, got {timeout!r}")


def _client_timeout(timeout: Any) -> Any:
    """requests' ``timeout`` (seconds, or ``(connect, read)``; ``None``: none) as aiohttp's: a bound
    on connecting and on each read, never on the whole download."""
    import aiohttp

    connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
    return aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)


def _request_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """requests' keyword arguments as aiohttp takes them (``auth=(user, password)``, ``verify``)."""
    kw = dict(kwargs)
    kw.pop("stream", None)  # always streamed
    auth = kw.get("auth")
    if isinstance(auth, tuple) and len(auth) == 2:  # HTTP basic authentication, as a header
        del kw["auth"]
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode("ascii")
        kw["headers"] = {**(kw.get("headers") or {}), "Authorization": f"Basic {token}"}
    if "verify" in kw:
        verify = kw.pop("verify")
        if verify is False:
            kw["ssl"] = False
    return kw


def _http_opener(pipe: Any) -> Callable[[Any], Any]:
    """``open_url(url)``: a binary stream over the body of a GET of ``url`` (fsspec's HTTP file
    system, streamed: one request), retried as :class:`~datapipes.iter.FSSpecFileOpener` retries."""
    import fsspec

    stage = stage_label(pipe)
    fs = fsspec.filesystem("http", client_kwargs={"timeout": _client_timeout(pipe.timeout)})
    # block_size=0: a streamed GET; a size given: fsspec skips the HEAD it sends to learn the size
    # (a stream has no use for it), so a download is one request, as with requests in torchdata.
    kw = {**_request_kwargs(pipe.query_params), "block_size": 0, "size": -1}
    retries, backoff, skip = pipe.retries, pipe.backoff, pipe.skip_on_error

    def open_url(url: Any) -> Any:
        try:
            if not isinstance(url, str):
                raise TypeError(f"{stage}: each URL must be a str, got {type(url).__name__}: {url!r:.100}")
            if not url.lower().startswith(("http://", "https://")):
                raise ValueError(f"{stage}: not an http(s) URL: {url!r:.200} (open_files_by_fsspec reads other URLs)")
            if retries == 0:
                try:
                    return fs.open(url, "rb", **kw)
                except Exception as e:
                    _url_note(e, "opening", url, 1)
                    raise
            return io.BufferedReader(_RetryingReader(fs, url, url, kw, retries, backoff))
        except Exception as e:
            if skip:
                warnings.warn(f"{e}, skipping...", stacklevel=2)
            raise

    return open_url


class _HttpBase(IterDataPipe[tuple[str, StreamWrapper]]):
    def _setup(self, stage: str, source_datapipe: Any, timeout: Any, skip_on_error: Any, retries: Any, backoff: Any,
               kwargs: dict[str, Any]) -> None:
        self.source_datapipe = _paths_pipe(source_datapipe, stage, "source_datapipe")
        _check_timeout(timeout, stage)
        require_bool(skip_on_error, stage, "skip_on_error")
        _check_retries(retries, backoff, stage)
        self.timeout = timeout
        self.skip_on_error = skip_on_error
        self.retries = retries
        self.backoff = backoff
        self.query_params = kwargs
        self._policy, self.failures = policy_and_log(self, "skip" if skip_on_error else "raise", None)
        self._stateless = True  # one stream per URL: its position is its source's

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        return _open_pass(self, self.source_datapipe, _http_opener(self))

    def _reopener(self) -> Callable[[Any, int], StreamWrapper]:
        """How a reader of this stage's items opens one again by its URL: a new GET."""
        open_url = _http_opener(self)
        return lambda url, n: StreamWrapper(open_url(url), url)

    def __len__(self) -> int:
        return _opened_len(self, self.source_datapipe, "source_datapipe")


@functional_datapipe("read_from_http")
class HttpReader(_HttpBase):
    """GET each HTTP(S) URL and yield ``(url, stream)`` pairs (functional name: ``read_from_http``).

    Args:
        source_datapipe: a pipe of ``http://`` or ``https://`` URLs (or a list of them).
        timeout: seconds allowed to connect and for each read (not the whole download), or a
            ``(connect, read)`` pair, as in requests; ``None`` (default): no limit.
        skip_on_error: skip a URL that fails (after its retries) with a warning ("..., skipping..."),
            counted in ``pipe.failures``; otherwise the error is raised.
        retries: how many times a transient error (connection reset, timeout, HTTP 5xx/408/429)
            is retried, at the request and at every read; a read retried mid-body requests the URL
            again and skips what was read. HTTP 404 and other 4xx are never retried.
        backoff: the first retry's delay in seconds, doubled at each further retry.
        **kwargs: request options, as requests names them: ``headers``, ``params``, ``cookies``,
            ``auth=(user, password)``, ``allow_redirects``, ``verify=False``.

    Yields:
        ``(url, stream)``: the URL and a :class:`StreamWrapper` over a binary stream of the body,
        read as it is consumed (one request per URL; it cannot seek). Streams are closed by the
        rule of :mod:`datapipes.iter.fileio`.

    Raises:
        FileNotFoundError (HTTP 404), ``aiohttp.ClientResponseError`` (other statuses),
        ``aiohttp.ClientError`` / ``OSError`` / ``TimeoutError`` (connection), as the same object
        with notes naming the URL, the attempts made and the stage. ValueError: a URL that is not
        http(s). TypeError: an item that is not a str.

    Implemented on fsspec's HTTP file system (aiohttp) rather than requests; ``len()`` is the
    source's length (unknown with ``skip_on_error=True``).

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> IterableWrapper(["https://example.com/a.txt"]).read_from_http(timeout=30)
        IterableWrapper -> HttpReader

    See also: :class:`OnlineReader`, :class:`~datapipes.iter.FSSpecFileOpener`.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        timeout: float | None = None,
        skip_on_error: bool = False,
        *,
        retries: int = 3,
        backoff: float = 0.5,
        **kwargs: Any,
    ) -> None:
        self._setup("HttpReader", source_datapipe, timeout, skip_on_error, retries, backoff, kwargs)


@functional_datapipe("read_from_remote")
class OnlineReader(_HttpBase):
    """GET each HTTP(S) URL and yield ``(url, stream)`` pairs (functional name: ``read_from_remote``).

    The same reader as :class:`HttpReader`, with torchdata's keyword-only ``timeout`` and
    ``skip_on_error``. Google Drive links are fetched as any URL: the confirmation page Google
    serves for large files is not followed (torchdata's OnlineReader follows it).

    Args:
        source_datapipe: a pipe of ``http://`` or ``https://`` URLs (or a list of them).
        timeout: as :class:`HttpReader`'s.
        skip_on_error: as :class:`HttpReader`'s.
        retries: as :class:`HttpReader`'s.
        backoff: as :class:`HttpReader`'s.
        **kwargs: request options, as :class:`HttpReader`'s.

    Yields:
        ``(url, stream)`` pairs, as :class:`HttpReader`.

    Raises:
        As :class:`HttpReader`.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> IterableWrapper(["https://example.com/a.txt"]).read_from_remote()
        IterableWrapper -> OnlineReader

    See also: :class:`HttpReader`.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        *,
        timeout: float | None = None,
        skip_on_error: bool = False,
        retries: int = 3,
        backoff: float = 0.5,
        **kwargs: Any,
    ) -> None:
        self._setup("OnlineReader", source_datapipe, timeout, skip_on_error, retries, backoff, kwargs)


# -- Bz2FileLoader / XzFileLoader ------------------------------------------------------------------


def _reader(stage: str, fmt: str, path: Any, stream: Any, n: int) -> Any:
    """A reader decompressing item ``n``'s ``stream`` (closing it closes ``stream``), whose errors get
    a note naming the stage and the file."""
    try:
        reader = _decompressing(fmt, stream)
    except Exception as e:
        add_stage_note(e, stage, n, f"file {path!r}, item")
        raise
    reader._dp_note = (stage, n, f"file {path!r}, item")
    return reader


def _load_compressed(pipe: Any, it: Iterator[Any]) -> Iterator[tuple[Any, StreamWrapper]]:
    stage = stage_label(pipe)
    fmt, suffix = pipe._format, pipe._suffix
    n = -1
    try:
        for item in it:
            n += 1
            path, stream = _pair(item, stage, n)
            name = path[: -len(suffix)] if isinstance(path, str) and path.endswith(suffix) else path
            yield name, set_origin(StreamWrapper(_reader(stage, fmt, path, stream, n), name), pipe, path, n)
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


class _CompressedLoader(IterDataPipe[tuple[str, StreamWrapper]]):
    _format = ""
    _suffix = ""
    _stateless = True  # one lazy reader per item (its consumer keeps its position): the position is its source's

    def __init__(self, datapipe: IterDataPipe[tuple[str, Any]], length: int = -1) -> None:
        stage = type(self).__name__
        require_pipe(datapipe, stage)
        require_int(length, stage, "length", minimum=-1)
        self.datapipe = datapipe
        self.length = length

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        return _load_compressed(self, iter(self.datapipe))

    def _origin_reopener(self) -> Callable[[Any, int], Any] | None:
        """How a pass state holding one of this stage's readers opens it again by the compressed
        file's path (the items carry the path without the suffix, so readers downstream cannot)."""
        reopen = _reopener(self.datapipe)
        if reopen is None:
            return None
        stage, fmt = stage_label(self), self._format
        return lambda path, n: _reader(stage, fmt, path, reopen(path, n), n)

    def __len__(self) -> int:
        if self.length != -1:
            return self.length
        return source_len(self, self.datapipe)


@functional_datapipe("load_from_bz2")
class Bz2FileLoader(_CompressedLoader):
    """Decompress the bzip2 streams of ``(path, stream)`` pairs (functional name: ``load_from_bz2``).

    Args:
        datapipe: a pipe of ``(path, binary stream)`` pairs, e.g. ``open_files(mode="b")``.
        length: the nominal ``len()`` (``-1``: the source's length).

    Yields:
        ``(path without ".bz2", stream)``: a :class:`StreamWrapper` over a reader that decompresses
        as it is read; closing it closes the compressed stream.

    Raises:
        OSError ("Invalid data stream") or EOFError (a truncated file), raised when the stream is
        read, with a note naming the stage and the file. TypeError: an item is not a
        ``(path, stream)`` pair.

    Checkpoint: a reader downstream that stops inside a decompressed stream copies it into the
    state when the compressed stream is in memory; over a file, ``state_dict()`` raises
    ``TypeError`` (the renamed path cannot be opened again): read with ``decompress()``, which
    keeps the path, to resume inside files.

    Example:
        >>> import bz2, io
        >>> from datapipes.iter import IterableWrapper
        >>> files = IterableWrapper([("a.txt.bz2", io.BytesIO(bz2.compress(b"hello")))])
        >>> [(path, stream.read()) for path, stream in files.load_from_bz2()]
        [('a.txt', b'hello')]

    See also: :class:`XzFileLoader`, :class:`~datapipes.iter.Decompressor`.
    """

    _format = "bz2"
    _suffix = ".bz2"


@functional_datapipe("load_from_xz")
class XzFileLoader(_CompressedLoader):
    """Decompress the xz/lzma streams of ``(path, stream)`` pairs (functional name: ``load_from_xz``).

    Args:
        datapipe: a pipe of ``(path, binary stream)`` pairs, e.g. ``open_files(mode="b")``.
        length: the nominal ``len()`` (``-1``: the source's length).

    Yields:
        ``(path without ".xz", stream)``: a :class:`StreamWrapper` over a reader that decompresses
        as it is read; closing it closes the compressed stream.

    Raises:
        lzma.LZMAError (corrupt data) or EOFError (a truncated file), raised when the stream is
        read, with a note naming the stage and the file. TypeError: an item is not a
        ``(path, stream)`` pair.

    Checkpoint: as :class:`Bz2FileLoader`.

    Example:
        >>> import io, lzma
        >>> from datapipes.iter import IterableWrapper
        >>> files = IterableWrapper([("a.txt.xz", io.BytesIO(lzma.compress(b"hello")))])
        >>> [(path, stream.read()) for path, stream in files.load_from_xz()]
        [('a.txt', b'hello')]

    See also: :class:`Bz2FileLoader`, :class:`~datapipes.iter.Decompressor`.
    """

    _format = "xz"
    _suffix = ".xz"


# -- Extractor -------------------------------------------------------------------------------------

_ARCHIVE_SUFFIXES = (
    (".tar", "tar"), (".tar.gz", "tar"), (".tgz", "tar"), (".tar.bz2", "tar"), (".tbz2", "tar"), (".tbz", "tar"),
    (".tar.xz", "tar"), (".txz", "tar"), (".zip", "zip"),
    (".gz", "gzip"), (".bz2", "bz2"), (".xz", "xz"), (".lzma", "xz"), (".zst", "zstd"), (".zstd", "zstd"),
)
_FILE_TYPES = {
    "tar": "tar", "zip": "zip", "gzip": "gzip", "gz": "gzip", "bz2": "bz2", "bzip2": "bz2", "xz": "xz",
    "lzma": "xz", "zstd": "zstd", "zst": "zstd",
}


def _kind_of(path: Any, stage: str) -> str:
    name = str(path).lower()
    for suffix, kind in _ARCHIVE_SUFFIXES:
        if name.endswith(suffix):
            return kind
    ext = os.path.splitext(name)[1]
    raise RuntimeError(
        f"{stage}: File at {path} has file extension {ext}, which does not match what are supported by "
        f"ExtractorIterDataPipe ({', '.join(s for s, _ in _ARCHIVE_SUFFIXES)}); pass file_type=..."
    )


def _extract(pipe: Extractor, it: Iterator[Any], run: Any) -> Iterator[tuple[Any, Any]]:
    stage = stage_label(pipe)
    fixed = pipe._kind
    readers: dict[str, Callable[..., Iterator[Any]]] = {"tar": _tar, "zip": _zip}
    try:
        resumed = run.resume
        if resumed is not None and resumed.get("file") is not None:  # stopped inside an archive: finish it first
            kind = fixed or _kind_of(resumed["file"]["path"], stage)
            yield from readers[kind](pipe, iter(()), run)
        n = -1
        for item in it:
            n += 1
            path, stream = _pair(item, stage, n)
            try:
                kind = fixed or _kind_of(path, stage)
            except Exception as e:
                _close(stream)
                add_stage_note(e, stage, n, f"file {path!r}, item")
                raise
            read = readers.get(kind)
            if read is not None:
                yield from read(pipe, iter((item,)), run)  # the archive's members, its position in ``run``
            else:
                yield path, set_origin(_reader(stage, kind, path, stream, n), pipe, path, n)
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


@functional_datapipe("extract")
class Extractor(IterDataPipe[tuple[Any, Any]]):
    """Extract archives and decompress files of ``(path, stream)`` pairs, each by its kind
    (functional name: ``extract``).

    Args:
        source_datapipe: a pipe of ``(path, binary stream)`` pairs.
        file_type: ``"tar"``, ``"zip"``, ``"gzip"``, ``"bz2"``, ``"xz"`` (``"lzma"``) or ``"zstd"``
            for every item; ``None`` (default): each path's suffix says (``.tar``, ``.tar.gz``,
            ``.tgz``, ``.tar.bz2``, ``.tar.xz``, ``.zip``, ``.gz``, ``.bz2``, ``.xz``, ``.zst``).

    Yields:
        For a tar or zip archive, its files as :class:`~datapipes.iter.TarArchiveLoader` and
        :class:`~datapipes.iter.ZipArchiveLoader` yield them: ``(path/member, io.BytesIO)``. For a
        compressed file, ``(path, reader)`` as :class:`~datapipes.iter.Decompressor` yields it.
        (torchdata 0.9's ``extract`` is ``decompress`` under another name and yields an archive as
        an open ``TarFile``/``ZipFile``.)

    Raises:
        RuntimeError: a path whose suffix names no kind (torchdata's phrase). The archive and
        decompression errors of those stages, with notes naming this stage and the file.

    ``len()`` is the source's length when ``file_type`` names a compression (one item each);
    otherwise ``TypeError``.

    Example:
        >>> import gzip, io, tarfile
        >>> from datapipes.iter import IterableWrapper
        >>> buf = io.BytesIO()
        >>> with tarfile.open(fileobj=buf, mode="w") as tar:
        ...     info = tarfile.TarInfo("m.txt"); info.size = 1
        ...     tar.addfile(info, io.BytesIO(b"m"))
        >>> files = IterableWrapper([("a.tar", io.BytesIO(buf.getvalue())), ("b.txt.gz", io.BytesIO(gzip.compress(b"b")))])
        >>> [(path, stream.read()) for path, stream in files.extract()]
        [('a.tar/m.txt', b'm'), ('b.txt.gz', b'b')]

    See also: :class:`~datapipes.iter.Decompressor`, :class:`~datapipes.iter.TarArchiveLoader`.
    """

    _stream_mode = "r|*"  # as TarArchiveLoader reads (compression detected)

    def __init__(self, source_datapipe: IterDataPipe[tuple[str, Any]], file_type: str | None = None) -> None:
        stage = "Extractor"
        require_pipe(source_datapipe, stage, "source_datapipe")
        kind = None
        if file_type is not None:
            name = getattr(file_type, "value", file_type)  # torchdata's CompressionType members too
            if not isinstance(name, str):
                raise TypeError(f"{stage}: file_type must be a str or None, got {type(file_type).__name__}")
            kind = _FILE_TYPES.get(name.lower())
            if kind is None:
                raise ValueError(f"{stage}: file_type must be one of {sorted(_FILE_TYPES)} or None, got {file_type!r}")
        self.source_datapipe = source_datapipe
        self.file_type = file_type
        self._kind = kind
        self._policy, self.failures = policy_and_log(self, "raise", None)
        # A compression for every item: one lazy reader per item, the position is the source's.
        self._stateless = kind not in (None, "tar", "zip")

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        # The archive being read and its entries read (parsing._ReadRun), as the archive loaders keep.
        run = _read_run(self, self.source_datapipe) if not self._stateless else _NoRun()
        return _extract(self, iter(self.source_datapipe), run)

    def _reopener(self) -> Callable[[Any, int], Any] | None:
        """With a compression for every item: the source's opener, decompressed again (readers of
        archive members copy them instead)."""
        if not self._stateless:
            return None
        reopen = _reopener(self.source_datapipe)
        if reopen is None:
            return None
        stage, kind = stage_label(self), self._kind
        return lambda path, n: _reader(stage, kind, path, reopen(path, n), n)  # type: ignore[arg-type]

    def _origin_reopener(self) -> Callable[[Any, int], Any] | None:
        """How a pass state holding one of this stage's decompressed files opens it again: the
        source's opener, decompressed by the kind of the path (archives' members are copied)."""
        reopen = _reopener(self.source_datapipe)
        if reopen is None:
            return None
        stage, fixed = stage_label(self), self._kind
        return lambda path, n: _reader(stage, fixed or _kind_of(path, stage), path, reopen(path, n), n)

    def __len__(self) -> int:
        if self._stateless:
            return source_len(self, self.source_datapipe, "source_datapipe")
        raise len_unknown(self, "an archive holds any number of files", NO_LEN)


class _NoRun:
    resume = None


# -- TFRecordLoader --------------------------------------------------------------------------------


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def _crc32c_python(data: Any) -> int:
    table = _CRC_TABLE
    crc = 0xFFFFFFFF
    for b in bytes(data):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc32c_function() -> Callable[[Any], int]:
    """CRC-32C (Castagnoli): from the ``crc32c`` or ``google_crc32c`` package where installed (C),
    else in Python (about 10 MB/s)."""
    try:
        import crc32c  # type: ignore[import-not-found]

        return lambda data: int(crc32c.crc32c(bytes(data)))
    except ImportError:
        pass
    try:
        import google_crc32c  # type: ignore[import-not-found]

        return lambda data: int(google_crc32c.value(bytes(data)))
    except ImportError:
        return _crc32c_python


def _masked_crc(crc32c: Callable[[Any], int], data: Any) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _records(stream: Any, check: Callable[[Any], int] | None) -> Iterator[memoryview]:
    """The records of a TFRecord stream: ``uint64 length, uint32 masked crc32c(length), data,
    uint32 masked crc32c(data)``, little-endian; the CRCs checked with ``check`` (a crc32c function)."""
    head = bytearray(12)
    tail = bytearray(4)
    while True:
        got = stream.readinto(head)
        if got == 0:
            return
        if got != 12:
            got += _fill(stream, memoryview(head)[got:])
            if got != 12:
                raise RuntimeError("Invalid tfrecord file: failed to read the record size.")
        length = int.from_bytes(head[:8], "little")
        if check is not None and _masked_crc(check, head[:8]) != int.from_bytes(head[8:], "little"):
            raise RuntimeError("Invalid tfrecord file: the CRC of the record size does not match.")
        data = bytearray(length)
        if _fill(stream, memoryview(data)) != length:
            raise RuntimeError("Invalid tfrecord file: failed to read the record.")
        if _fill(stream, memoryview(tail)) != 4:
            raise RuntimeError("Invalid tfrecord file: failed to read the end token.")
        if check is not None and _masked_crc(check, data) != int.from_bytes(tail, "little"):
            raise RuntimeError("Invalid tfrecord file: the CRC of the record data does not match.")
        yield memoryview(data)


def _fill(stream: Any, view: memoryview) -> int:
    """Read into ``view`` until it is full or the stream ends; the bytes read."""
    done = 0
    while done < len(view):
        got = stream.readinto(view[done:])
        if not got:
            break
        done += got
    return done


# The protobuf wire format, as far as tf.train.Example / SequenceExample need it.


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise RuntimeError("Invalid tf.train.Example: a varint runs past the end of its message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise RuntimeError("Invalid tf.train.Example: a varint is longer than 10 bytes")


def _fields(buf: memoryview) -> Iterator[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of a message: an int (varint, fixed32/64 as raw bytes) or
    a memoryview (length-delimited)."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > end:
                raise RuntimeError("Invalid tf.train.Example: a field runs past the end of its message")
            value = buf[pos : pos + size]
            pos += size
        elif wire == 5:
            value = buf[pos : pos + 4]
            pos += 4
        elif wire == 1:
            value = buf[pos : pos + 8]
            pos += 8
        else:
            raise RuntimeError(f"Invalid tf.train.Example: wire type {wire} of field {number} is not supported")
        yield number, wire, value


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _feature(buf: memoryview) -> Any:
    """A ``tf.train.Feature``: a list of bytes, a float32 tensor or an int64 tensor."""
    import numpy as np
    import torch

    kind: int | None = None
    values: Any = None
    for number, _, inner in _fields(buf):
        if number in (1, 2, 3):  # bytes_list, float_list, int64_list (a oneof: the last one wins)
            kind, values = number, inner
    if kind is None:
        return []
    if kind == 1:
        return [bytes(v) for n, w, v in _fields(values) if n == 1 and w == 2]
    if kind == 2:
        parts = []
        for n, w, v in _fields(values):
            if n == 1:
                parts.append(bytes(v))  # packed (wire 2) or one fixed32 (wire 5): little-endian floats
        return torch.from_numpy(np.frombuffer(b"".join(parts), dtype="<f4").astype(np.float32))
    ints: list[int] = []
    for n, w, v in _fields(values):
        if n != 1:
            continue
        if w == 0:
            ints.append(_int64(v))
        elif w == 2:  # packed varints
            pos = 0
            while pos < len(v):
                x, pos = _varint(v, pos)
                ints.append(_int64(x))
    return torch.tensor(ints, dtype=torch.int64)


def _map_entries(buf: memoryview) -> Iterator[tuple[str, memoryview]]:
    """The ``(key, value message)`` entries of a ``map<string, message>`` field 1 of ``buf``."""
    for number, wire, entry in _fields(buf):
        if number != 1 or wire != 2:
            continue
        key, value = "", memoryview(b"")
        for n, _, v in _fields(entry):
            if n == 1:
                key = bytes(v).decode("utf-8")
            elif n == 2:
                value = v
        yield key, value


def _reshape_list(value: Any, shape: Any) -> Any:
    """``value`` (nested lists of bytes) flattened and nested again to ``shape`` (one ``-1`` allowed)."""
    flat: list[Any] = []

    def flatten(v: Any) -> None:
        if isinstance(v, (str, bytes)):
            flat.append(v)
        else:
            for x in v:
                flatten(x)

    flatten(value)
    if sum(1 for x in shape if x == -1) > 1:
        raise RuntimeError("Shape can contain at most one dynamic dimension (-1).")
    known = 1
    for x in shape:
        if x != -1:
            known *= x
    dims = [x if x != -1 else len(flat) // max(known, 1) for x in shape]
    total = 1
    for x in dims:
        total *= x
    if total != len(flat):
        raise RuntimeError(f"Cannot reshape {len(flat)} values into shape {shape}")

    def nest(values: list[Any], dims: list[int]) -> Any:
        if not dims:
            return values[0]
        if len(dims) == 1:
            return values
        step = len(values) // dims[0]
        return [nest(values[i * step : (i + 1) * step], dims[1:]) for i in range(dims[0])]

    return nest(flat, dims)


def _apply_spec(value: Any, feature_spec: Any) -> Any:
    import torch

    if feature_spec is None:
        return value
    shape, dtype = feature_spec
    if isinstance(dtype, torch.dtype):
        if not isinstance(value, torch.Tensor):
            value = torch.tensor(value, dtype=dtype)  # an empty feature; bytes cannot be converted
        if shape is not None:
            value = value.reshape(shape)
        return value.to(dtype)
    if shape is not None:
        return _reshape_list(value, shape)
    return value


def _example(record: memoryview, spec: dict[str, Any] | None) -> dict[str, Any]:
    """A ``tf.train.Example`` (or ``SequenceExample``) record as ``{name: value}``."""
    import torch

    context = lists = None
    for number, wire, value in _fields(record):
        if wire != 2:
            continue
        if number == 1:
            context = value  # Example.features / SequenceExample.context
        elif number == 2:
            lists = value  # SequenceExample.feature_lists
    result: dict[str, Any] = {}
    if context is not None:
        for key, feature in _map_entries(context):
            if spec is None or key in spec:
                result[key] = _apply_spec(_feature(feature), None if spec is None else spec[key])
    if lists is not None:
        for key, feature_list in _map_entries(lists):
            if spec is not None and key not in spec:
                continue
            if key in result:
                raise RuntimeError(
                    f"TFRecord example's key {key} is contained in both the context and feature lists. This is not supported."
                )
            values: Any = [_feature(f) for n, w, f in _fields(feature_list) if n == 1 and w == 2]
            feature_spec = None if spec is None else spec[key]
            if feature_spec is not None and isinstance(feature_spec[1], torch.dtype):
                values = torch.stack(values, 0)
            result[key] = _apply_spec(values, feature_spec)
    if spec is not None and len(result) != len(spec):
        raise RuntimeError(f"Example is missing some required keys: {sorted(result)} != {sorted(spec)}")
    return result


def _tfrecords(pipe: TFRecordLoader, it: Iterator[Any], run: Any) -> Iterator[dict[str, Any]]:
    stage = stage_label(pipe)
    spec = pipe.spec
    check = _crc32c_function() if pipe.length_check else None
    n, first = run.begin(_raise_with_note(stage))
    try:
        for item in chain(first, it) if first else it:
            n += 1
            path, stream, skip, _ = _item(item, stage, n, 0)
            record = skip - 1  # the last record read
            reading = True  # reading the next record's frame (else parsing ``record``)
            try:
                stream = _open_item(item, stream, run, n)
                records = _records(stream, check)
                if skip:  # resumed: read past the records the saved pass had read
                    next(islice(records, skip - 1, None), None)
                counted = Enumerated(records, skip)
                run.enter(n, path, stream, counted, None, 0)
                for record, data in counted:
                    reading = False
                    example = _example(data, spec)
                    reading = True
                    yield example
            except Exception as e:
                add_stage_note(e, stage, record + 1 if reading else record, f"file {path!r}, record")
                raise
            finally:
                _close(stream)
                run.leave()
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


def _raise_with_note(stage: str) -> Any:
    def fail(exc: Exception, what: str, position: int) -> None:
        add_stage_note(exc, stage, position, what)
        raise exc

    return fail


@functional_datapipe("load_from_tfrecord")
class TFRecordLoader(IterDataPipe[dict[str, Any]]):
    """Read the ``tf.train.Example`` records of TFRecord files in ``(path, stream)`` pairs
    (functional name: ``load_from_tfrecord``), without TensorFlow or protobuf.

    Args:
        datapipe: a pipe of ``(path, binary stream)`` pairs, e.g. ``open_files(mode="b")``.
        spec: ``{name: (shape, dtype)}``: only these features are kept, each reshaped (``shape``
            may hold one ``-1``; ``None`` keeps it) and, for a ``torch.dtype``, converted; a
            record lacking one of them raises. ``None`` (default): every feature, as it is.
        length: the nominal ``len()`` (``-1``: unknown).
        length_check: check the CRC-32C of every record's length and data (torchdata checks
            none). In pure Python this runs at about 10 MB/s of records; the ``crc32c`` or
            ``google_crc32c`` package, where installed, does it in C. ``False`` skips the check.

    Yields:
        One dict per record, ``{name: value}``: an ``int64_list`` as an ``int64`` tensor, a
        ``float_list`` as a ``float32`` tensor, a ``bytes_list`` as a list of ``bytes``. A
        ``SequenceExample``'s feature lists give lists of those (stacked into one tensor when
        ``spec`` gives a ``torch.dtype``).

    Raises:
        RuntimeError: a truncated file, a CRC that does not match, a malformed record or a record
        missing a feature of ``spec`` (torchdata's phrases), with a note naming the stage, the
        file and the record. TypeError: an item is not a ``(path, stream)`` pair.

    Checkpoint: a pass stopped inside a file saves its path and the records read; the resumed
    pass opens it again through the opener upstream (or copies an in-memory stream into the
    state, as the readers of :mod:`datapipes.iter.parsing` do) and reads past them.

    Example:
        >>> import io, struct
        >>> from datapipes.iter import IterableWrapper
        >>> def varint(n):
        ...     out = b""
        ...     while n > 0x7F:
        ...         out += bytes([n & 0x7F | 0x80]); n >>= 7
        ...     return out + bytes([n])
        >>> def field(number, payload):
        ...     return varint(number << 3 | 2) + varint(len(payload)) + payload
        >>> feature = field(3, field(1, varint(7)))  # Feature{int64_list: Int64List{value: [7]}} (packed)
        >>> example = field(1, field(1, field(1, b"label") + field(2, feature)))
        >>> record = struct.pack("<Q", len(example)) + b"\\0" * 4 + example + b"\\0" * 4
        >>> list(IterableWrapper([("a.tfrecord", io.BytesIO(record))]).load_from_tfrecord(length_check=False))
        [{'label': tensor([7])}]

    See also: :class:`~datapipes.iter.FileOpener`.
    """

    def __init__(
        self,
        datapipe: IterDataPipe[tuple[str, Any]],
        spec: dict[str, tuple[Any, Any]] | None = None,
        length: int = -1,
        *,
        length_check: bool = True,
    ) -> None:
        stage = "TFRecordLoader"
        require_pipe(datapipe, stage)
        if spec is not None:
            if not isinstance(spec, Mapping):
                raise TypeError(f"{stage}: spec must be a dict of name -> (shape, dtype), got {type(spec).__name__}")
            for key, value in spec.items():
                if not isinstance(key, str) or not (isinstance(value, (tuple, list)) and len(value) == 2):
                    raise TypeError(f"{stage}: spec must map names to (shape, dtype) pairs, got {key!r}: {value!r:.100}")
        require_int(length, stage, "length", minimum=-1)
        require_bool(length_check, stage, "length_check")
        self.datapipe = datapipe
        self.spec = spec
        self.length = length
        self.length_check = length_check

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # The file being read and the records of it read (see parsing._ReadRun).
        return _tfrecords(self, iter(self.datapipe), _read_run(self, self.datapipe))

    def __len__(self) -> int:
        if self.length == -1:
            raise len_unknown(self, "the number of records is known only after reading (pass length=... to set it)")
        return self.length
