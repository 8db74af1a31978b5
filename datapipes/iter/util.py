"""Sources and small utilities: IterableWrapper, Header [header], Cycler [cycle],
Enumerator [enumerate]; the position of a pass over a source (:class:`_SourceRun`), which the
sources of other modules share. The in-memory cache is :mod:`datapipes.iter.cache.memory`'s.

Every ``_open(ctx)`` opens its source's iterator at once, in the pass it is handed
(:mod:`datapipes._runtime.passes`), and hands it to the generator that does the work; ``Cycler`` opens
the iterators of its later rounds in the same pass, which it takes along.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import warnings
from collections import deque
from collections.abc import AsyncIterator as _AsyncIteratorABC
from collections.abc import Iterator as _IteratorABC
from operator import length_hint
from typing import Any, AsyncIterable, Callable, Generator, Iterable, Iterator, TypeVar, cast

import numpy

from .._runtime import passes as _pass
from .._runtime.passes import Pass
from .._runtime.validate import check_dict, check_int, invalid
from .._positions import INDEXED as _INDEXED, Counted, Enumerated, seek
from .._engine import abandon, close_iterator, iterate_async
from ..datapipe import IterDataPipe, functional_datapipe, lacks_len, len_root, len_unknown, require_int, require_pipe, source_len, stage_label
from .._engine.lifecycle import Resumable

__all__ = ["IterableWrapper", "Header", "Cycler", "Enumerator"]

T = TypeVar("T")


class _Deferred(itertools.chain):  # type: ignore[type-arg]
    """An iterator over what ``open_()`` returns, called at the first ``next()`` instead of at
    ``iter()``: a user's ``__iter__`` that does work when called (opens a file, counts passes) and a
    deep copy wait for the pass to start. ``next`` is forwarded in C (``itertools.chain``: about
    2 ns per item); :meth:`close` closes the opened iterator, as closing a generator does."""

    __slots__ = ("_opener", "_opened")
    _opener: Generator[Iterator[Any], None, None]
    _opened: list[Iterator[Any]]

    def close(self) -> None:
        self._opener.close()  # closed before opening: nothing is opened any more
        if self._opened:
            close_iterator(self._opened[0])


def _opening(open_: Callable[[], Iterator[Any]], opened: list[Iterator[Any]], run: _SourceRun | None) -> Generator[Iterator[Any], None, None]:
    it = open_()
    opened.append(it)
    if run is None:
        yield it
        return
    try:
        yield run.open(it)
    finally:  # the source ended, or the pass was closed or dropped: the run lets go of the iterator
        run.release()


def _deferred(open_: Callable[[], Iterator[Any]], run: _SourceRun | None = None) -> _Deferred:
    """``open_()`` at the first ``next()``; with a ``run``, the pass reads ``run.open(it)`` (the
    iterator positioned and counted) while :meth:`_Deferred.close` closes what ``open_`` opened."""
    opened: list[Iterator[Any]] = []
    opener = _opening(open_, opened, run)
    it = cast(_Deferred, _Deferred.from_iterable(opener))  # from_iterable makes a _Deferred
    it._opener, it._opened = opener, opened
    return it


def _runs_code_when_iterated(iterable: Any) -> bool:
    """Whether ``iter(iterable)`` may run the user's code before the first item is asked for: a
    ``__iter__`` written in Python that is not a generator function. Builtins, generator functions
    and pipes (whose ``__iter__`` joins the pass, lazily by contract) create their iterator only."""
    if isinstance(iterable, IterDataPipe):
        return False
    method = getattr(type(iterable), "__iter__", None)
    return inspect.isfunction(method) and not inspect.isgeneratorfunction(method)


# -- IterableWrapper(deepcopy=True): a pass cannot change the source ------------------------------

#: Types whose objects cannot change in place: an item of one of these is yielded without a copy.
_IMMUTABLE = frozenset(
    {int, float, complex, bool, str, bytes, type(None), type(Ellipsis), range}
    | {type(t(0)) for t in (numpy.int8, numpy.int16, numpy.int32, numpy.int64, numpy.uint8, numpy.uint16,
                            numpy.uint32, numpy.uint64, numpy.float16, numpy.float32, numpy.float64, numpy.bool_)}
)


def _may_change(iterable: Any) -> bool:
    """Whether a pass over ``iterable`` may yield an item it could change in place. A ``range``,
    ``str`` or ``bytes`` cannot; a list or tuple cannot when every item is of an :data:`_IMMUTABLE`
    type (checked in C, about 20 ns per item); anything else is assumed to."""
    kind = type(iterable)
    if kind is range or kind is str or kind is bytes:
        return False
    if kind is list or kind is tuple:
        return not set(map(type, iterable)) <= _IMMUTABLE
    return True


def _copies(it: Iterator[T], stage: Any) -> Iterator[T]:
    """The items of ``it``, each mutable one deep-copied as it is read; an item that cannot be
    copied passes as it is, with torch's warning (once per pass). Closing closes ``it``."""
    deep = copy.deepcopy
    immutable = _IMMUTABLE
    warned = False
    try:
        for item in it:
            if type(item) in immutable:
                yield item
                continue
            try:
                copied = deep(item)
            except Exception as e:  # noqa: BLE001 - any failure of __deepcopy__/__reduce__: pass it as it is
                if not warned:
                    warned = True
                    warnings.warn(
                        f"{stage_label(stage)}: an item of type {type(item).__name__} cannot be deep-copied "
                        f"({type(e).__name__}: {e}), so it is yielded as it is (and others like it, without "
                        f"another warning in this pass). The input iterable can not be deepcopied, please be "
                        f"aware of in-place modification would affect source data.",
                        UserWarning,
                        stacklevel=2,
                    )
                copied = item
            yield copied
    finally:
        close_iterator(it)


# -- the position of a pass over a source (checkpoint and resume) -----------------------------------

_STARTED = _pass.STARTED



class _Probe:
    def __getitem__(self, i: int) -> Any:
        raise IndexError(i)


#: iterators read by how many items they have left as the sequences' (``_positions.INDEXED``) are:
#: dict, set, deque
_COLLECTIONS: tuple[Any, ...] = ({}, {}.values(), {}.items(), set(), deque())
_HINTED = frozenset(type(iter(x)) for x in _COLLECTIONS)
#: the iterator of an object with ``__getitem__`` only (a NumPy array's): read by index where the
#: object has a ``len()`` too
_SEQUENCE = type(iter(_Probe()))


def _indexed(it: Iterator[Any], sized: bool) -> bool:
    """Whether :class:`_SourceRun` reads ``it``'s position from what it has left."""
    kind = type(it)
    return kind in _INDEXED or kind in _HINTED or (kind is _SEQUENCE and sized)


def _protocol(it: Any) -> bool:
    """Whether ``it`` keeps a state of its own (the two methods of docs/howto/checkpoint.rst)."""
    return hasattr(it, "state_dict") and hasattr(it, "load_state_dict")


class _SourceRun:
    """The position of one pass over a re-iterable source: how many items it has yielded.

    Read when the state is taken, at no per-item cost, from the iterator itself where it can tell
    (the sequences of :data:`_INDEXED`, :data:`_HINTED` and :data:`_SEQUENCE`: from how many items
    it has left; an iterator with ``state_dict``/``load_state_dict``: its own state); any other
    iterator is read through a counting iterator (:class:`datapipes._positions.Counted`: C calls
    per item, beside the Python code such an iterator runs). A resumed pass moves a sequence's
    iterator to the index (:func:`datapipes._positions.seek`: nothing is read again), and replays
    any other source: a new iteration skips, in C, the items already yielded, which is exact for a
    source that yields the same items at every pass (what a re-iterable is). State: one int, or the protocol iterator's own state.

    A loaded index is checked: an int from 0 to the source's length (read from a sequence's
    iterator, or found while the items before it are skipped), never one that would yield items
    again or silently skip the rest.
    """

    __slots__ = ("it", "mode", "total", "at", "counter", "saved", "sized", "eager", "final", "stage")

    def __init__(self, sized: bool, stage: Any = None) -> None:
        self.stage = stage  # the stage whose pass this is (its label names it in errors)
        self.it: Any = None  # the iterator opened (None: not yet)
        self.mode = ""  # "index", "count", "protocol" once opened
        self.total = 0  # "index": the items the iterator had when opened
        self.at = 0  # "index": where restore() moved it
        self.counter: Any = None  # "count": the Counted iterator counting the items read
        self.saved: dict[str, Any] | None = None  # what restore() got, applied when the source opens
        self.sized = sized  # whether the source has a len() (for _SEQUENCE)
        self.eager = False  # opened at iter() (a sequence's iterator), not at the first next()
        self.final: dict[str, Any] | None = None  # the state once the pass let go of the source

    def position(self) -> int:
        mode = self.mode
        if mode == "index":
            return self.total - length_hint(self.it)
        if mode == "count":
            return self.counter.count()  # type: ignore[no-any-return]
        saved = self.saved
        return 0 if saved is None else int(saved.get("index", 0))

    def state(self) -> dict[str, Any]:
        if self.final is not None:
            return dict(self.final)
        if self.mode == "protocol":
            return {"iterator": self.it.state_dict()}
        if not self.mode and self.saved is not None:
            return dict(self.saved)
        return {"index": self.position()}

    def restore(self, state: dict[str, Any]) -> None:
        if self.mode and not (self.eager and self.position() == self.at):
            raise RuntimeError(_STARTED)
        if not isinstance(state, dict) or not ("index" in state or "iterator" in state):
            raise ValueError(f"load_state_dict: not the state of a source: {str(state)[:200]}")
        check_dict(state)
        if self.eager and "index" not in state:
            raise ValueError(f"load_state_dict: the state holds an iterator's own state, but this source is a "
                             f"sequence, read by index: {str(state)[:200]}")
        if "index" in state:  # a sequence's bound is known now, any other's as its items are skipped
            check_int(state, "index", 0, self.total if self.eager else None)
        self.saved = state
        if self.eager:  # the iterator was opened at iter(): move it now
            index = int(state.get("index", 0))
            seek(self.it, self.at, index)
            self.at = index

    def _skipped(self, it: Iterator[Any], index: int) -> None:
        """Skip the first ``index`` items of ``it`` (in C); ``ValueError`` naming the stage when it
        has fewer: the state names a position past the source's end."""
        if index and next(itertools.islice(it, index - 1, index), _END) is _END:
            self._past_end(index, None)

    def _past_end(self, index: int, total: int | None) -> None:
        where = "a source" if self.stage is None else stage_label(self.stage)
        length = "it has fewer items" if total is None else f"it has {total} items"
        invalid(f"state['index'] is {index}, past the end of the source ({length}): a state saved from this "
                f"source stands at most at its end", where)

    def open(self, it: Iterator[Any]) -> Iterator[Any]:
        """The iterator a pass reads, positioned where a restored state says, from ``it``, the
        source's own iterator, just opened."""
        self.it = it
        saved = self.saved or {}
        kind = type(it)
        if _indexed(it, self.sized):
            self.total = length_hint(it)
            self.mode = "index"
            index = int(saved.get("index", 0))
            if index > self.total:
                self._past_end(index, self.total)
            if index:
                seek(it, 0, index)
            self.at = index
            return it
        if _protocol(it):
            self.mode = "protocol"
            if "iterator" in saved:
                it.load_state_dict(saved["iterator"])  # type: ignore[attr-defined]
            else:
                self._skipped(it, int(saved.get("index", 0)))
            return it
        if "iterator" in saved:
            raise ValueError(f"load_state_dict: the state holds an iterator's own state, but this source's "
                             f"iterator, a {kind.__name__}, has no load_state_dict()")
        index = int(saved.get("index", 0))
        self._skipped(it, index)  # replayed: the items yielded before the state was saved
        self.mode = "count"
        self.counter = Counted(it, index)
        return self.counter

    def release(self) -> None:
        """Keep the state and let go of the source's iterator (the pass's own finaliser closes it)."""
        if self.mode:
            self.final = self.state()
            self.it = self.counter = None

    def open_now(self, it: Iterator[Any]) -> Iterator[Any]:
        """:meth:`open` at ``iter()``, for an iterator of a sequence: the pass reads it as it is."""
        self.eager = True
        return self.open(it)


class _Unresumable:
    """The run of a pass whose position cannot be saved: ``state()`` says why, naming the stage."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why

    def state(self) -> Any:
        raise TypeError(self.why)

    def restore(self, state: Any) -> None:
        raise TypeError(self.why)


class IterableWrapper(IterDataPipe[T]):
    """Wrap an iterable (a list, a range, a dataset, a generator) as the source of a pipe.

    Args:
        iterable: the items. A re-iterable (list, range, tuple, any object whose ``__iter__``
            returns a fresh iterator) gives a new pass at every ``iter()``. A one-shot iterator
            (a generator) can be iterated once: a second pass raises ``RuntimeError`` saying so;
            wrap a list, or a class whose ``__iter__`` builds the generator, to iterate again.
            An async iterable (an async generator listing a bucket, say) is driven on the engine's
            event-loop thread with a small bounded read-ahead, and closed when the pass is.
        deepcopy: yield deep copies of the items (``True``, the default, as torch's), so a pass
            that mutates its items in place does not change the source, and the next pass sees the
            items as they were. Items that cannot change (numbers, strings, bytes, ``None``) are not
            copied: a ``range``, ``str`` or ``bytes`` source, or a list or tuple holding only such
            items, costs nothing (the list's items are checked at each ``iter()``, about 20 ns
            each); any other item costs one ``copy.deepcopy`` when it is read. An item that cannot
            be deep-copied (an open file, a lock) is yielded as it is, with one warning per pass.
            ``False`` yields the source's own objects.

    Yields:
        The items of ``iterable``, in order. Nothing is read before the first ``next()``: an
        ``__iter__`` written as a plain function (one that opens a file, say) is called then, not at
        ``iter()``.

    Raises:
        TypeError: ``iterable`` is not iterable.

    ``len()`` is ``len(iterable)`` at call time; ``TypeError`` where the iterable has no length.

    Checkpoint (``it.state_dict()``): the position is the number of items yielded. A list, tuple,
    range, str, bytes, dict, set, deque or sized ``__getitem__`` object is read and resumed by index
    (nothing is read again); an iterator with ``state_dict``/``load_state_dict`` saves its own
    state; any other re-iterable is replayed (the resumed pass skips the items already yielded).
    A one-shot iterator or an async iterable cannot be resumed: ``state_dict()`` raises
    ``TypeError`` saying so.

    >>> from datapipes.iter import IterableWrapper
    >>> list(IterableWrapper(range(3)))
    [0, 1, 2]
    >>> len(IterableWrapper([7, 8]))
    2
    """

    _saves = (
        "the index (list, tuple, range, str, bytes, dict, set, deque, anything indexable with a ``len``; "
        "nothing per item); an iterator with ``state_dict()``/``load_state_dict()``: its own state; another "
        "re-iterable: a count, and the resumed pass re-reads and skips (exact if it repeats its items); "
        "one-shot iterators and async iterables cannot resume (``TypeError``)"
    )

    _defer = False  # iter() of the iterable waits for the first next() (set by __init__)

    def __init__(self, iterable: Iterable[T] | AsyncIterable[T], deepcopy: bool = True) -> None:
        kind = type(iterable)
        self._async = hasattr(kind, "__aiter__") and not hasattr(kind, "__iter__")
        if not (self._async or hasattr(kind, "__iter__") or hasattr(kind, "__getitem__")):
            raise TypeError(f"IterableWrapper: iterable must be iterable, got {kind.__name__}")
        self.iterable = iterable
        self.deepcopy = bool(deepcopy)
        self._one_shot = isinstance(iterable, (_IteratorABC, _AsyncIteratorABC))
        self._started = False
        # iter() of the iterable waits for the first next() where it may do work (decided once)
        self._defer = not (self._async or self._one_shot) and _runs_code_when_iterated(iterable)

    def _open(self, ctx: Pass) -> Iterator[T]:
        if self._one_shot:
            if self._started:
                raise RuntimeError(
                    f"IterableWrapper over a one-shot {type(self.iterable).__name__} was already iterated; "
                    "wrap a list or a re-iterable object to iterate again"
                )
            self._started = True
            if not _protocol(self.iterable):  # one with state_dict()/load_state_dict() is its own run (_pass._tracked)
                ctx.track(self, _Unresumable(
                    f"{stage_label(self)} cannot save its position: it wraps a one-shot {type(self.iterable).__name__}, "
                    "which a new pass cannot read again; wrap a list, or an object whose __iter__ builds the iterator, "
                    "to resume"))
            if self._async:
                return iterate_async(self.iterable)  # type: ignore[arg-type]
            return ctx.open(cast("Iterable[T]", self.iterable))  # not async: a synchronous iterable
        if self._async:
            ctx.track(self, _Unresumable(
                f"{stage_label(self)} cannot save its position: it wraps an async iterable "
                f"({type(self.iterable).__name__}), read ahead on the event-loop thread, whose passes keep no "
                "position; wrap a synchronous re-iterable to resume"))
            return iterate_async(self.iterable)  # type: ignore[arg-type]
        # Nothing is copied, read or opened before the first next().
        iterable = cast("Iterable[T]", self.iterable)  # not async: a synchronous iterable
        run = _SourceRun(hasattr(type(iterable), "__len__"), self)
        if self._defer:
            it: Iterator[T] = _deferred(lambda: iter(iterable), run)
        else:
            own = ctx.open(iterable)
            # A sequence's own iterator is the pass, at no cost per item; any other is counted.
            it = run.open_now(own) if _indexed(own, run.sized) else _deferred(lambda: own, run)
        if self.deepcopy and _may_change(iterable):
            it = _copies(it, self)
        ctx.track(self, run)
        return it

    def __len__(self) -> int:
        try:
            return len(self.iterable)  # type: ignore[arg-type]
        except TypeError as e:
            if not lacks_len(self.iterable, e):
                raise
            raise len_unknown(self, f"its source, a {type(self.iterable).__name__}, has no length") from None

    def __getstate__(self) -> dict[str, Any]:
        if self._one_shot:
            raise TypeError(
                f"IterableWrapper over a one-shot {type(self.iterable).__name__} cannot be pickled; "
                "wrap a list or a re-iterable object"
            )
        return self.__dict__



_END = object()  # private end-of-pass marker (None is a valid item)


# -- Header ----------------------------------------------------------------------------------------


class _HeaderRun(Resumable):
    """The position of a ``header`` pass: how many items it has taken, read from the range iterator
    that counts them. The ``zip`` costs ~10 ns per item over the ``islice`` it replaces, which
    hides its count (its ``__reduce__`` is deprecated since Python 3.12). State: one int."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int) -> None:
        self.left = iter(range(limit))  # one number per item still to take
        self.limit = limit
        self.started = False

    def state(self) -> dict[str, Any]:
        # One over once the source has ended (zip drew a number first): harmless, the source is at its end.
        return {"taken": self.limit - length_hint(self.left)}

    def load(self, state: dict[str, Any]) -> None:
        taken = check_int(state, "taken", 0, self.limit + 1)  # one over: see state()
        self.left = iter(range(min(taken, self.limit), self.limit))


def _header_run(it: Iterator[Any], run: _HeaderRun) -> Iterator[Any]:
    run.started = True
    try:
        # zip draws from the range first: the source is not read past the limit.
        for _, x in zip(run.left, it):
            yield x
    except BaseException:
        abandon(it)
        raise


def _header_all(it: Iterator[Any]) -> Iterator[Any]:
    try:
        yield from it
    except BaseException:
        abandon(it)
        raise


@functional_datapipe("header")
class Header(IterDataPipe[T]):
    """Yield the first ``limit`` items of the source (functional name: ``header``).

    Args:
        source_datapipe: the source pipe.
        limit: how many items to yield at most, an int >= 0 (default 10); ``None``: all of them.

    Yields:
        The source's first ``limit`` items. The source is read no further than that; its
        iterator is then dropped (not closed), so items already yielded, such as open streams,
        stay valid while upstream threads stop through their finalisers.

    ``len()`` is ``min(limit, len(source))``; ``TypeError`` where the source has no length (unlike
    torchdata, which guesses ``limit`` with a warning: the source may be shorter; with
    ``limit=None``, torchdata's words).

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(100)).header(3))
        [0, 1, 2]
        >>> len(IterableWrapper(range(2)).header(3))
        2

    See also: :class:`Cycler`.
    """

    _saves = {
        "``header``": "same as enumerate",
        "``header(None)``": "nothing: at a boundary their position is their source's",
    }

    _repr_fields = ("limit",)

    def __init__(self, source_datapipe: IterDataPipe[T], limit: int | None = 10) -> None:
        require_pipe(source_datapipe, "Header", "source_datapipe")
        require_int(limit, "Header", "limit", minimum=0, optional=True)
        self.source_datapipe = source_datapipe
        self.limit = limit
        self._stateless = limit is None  # no limit: the items pass through, its position is its source's

    def _open(self, ctx: Pass) -> Iterator[T]:
        it = ctx.open(self.source_datapipe)
        if self.limit is None:
            return _header_all(it)
        run = _HeaderRun(self.limit)
        ctx.track(self, run)
        return _header_run(it, run)

    def __len__(self) -> int:
        if self.limit == 0:
            return 0
        try:
            n = len(self.source_datapipe)  # type: ignore[arg-type]
        except TypeError as e:
            if not lacks_len(self.source_datapipe, e):
                raise
            if self.limit is None:  # torchdata's words
                root = len_root(e)
                err = len_unknown(self, "The length of this HeaderIterDataPipe cannot be determined, since "
                                        f"source_datapipe has no len() ({root})", "cannot be determined")
                err._len_root = root  # type: ignore[attr-defined]
                raise err from None
            # torchdata guesses ``limit`` here, with a warning; a len() is exact or unknown
            raise len_unknown(self, f"its source may yield fewer than limit={self.limit} items ({len_root(e)})") from None
        return n if self.limit is None else min(n, self.limit)


# -- Cycler ----------------------------------------------------------------------------------------


class _CycleRun(Resumable):
    """The position of a ``cycle`` pass: the round it reads, 1 for the first; where it stands in that
    round is its source's state (the source's run of the latest round, see :meth:`Pass.track`).
    Updated once per round. State: one int."""

    __slots__ = ("round", "resumed")

    def __init__(self) -> None:
        self.round = 1
        self.started = False
        self.resumed = False

    def state(self) -> dict[str, Any]:
        return {"round": self.round}

    def load(self, state: dict[str, Any]) -> None:
        self.round = check_int(state, "round", 1)
        self.resumed = True


def _cycle_run(source: IterDataPipe[Any], it: Iterator[Any], count: int | None, ctx: Pass,
               run: _CycleRun) -> Iterator[Any]:
    """Round 1 reads ``it`` (opened by ``_open``); each later round a new pass of ``source``,
    opened in ``ctx``, the pass this stage belongs to. A resumed pass reads the saved round from
    ``it``, its source restored to where that round stood."""
    run.started = True
    rounds = itertools.repeat(None) if count is None else itertools.repeat(None, count - run.round)
    resumed = run.resumed  # its first round may stand at its end: that is not an empty source
    while True:
        try:
            first = next(it, _END)
            if first is _END:
                if count is None and not resumed:
                    return  # an empty source cycled forever is empty, not a busy loop
            else:
                yield first
                yield from it
        except BaseException:
            abandon(it)
            raise
        resumed = False
        if next(rounds, _END) is _END:
            return
        run.round += 1  # before the new round's iterator replaces the source's run
        ctx.forget(source)
        it = ctx.open(source)


@functional_datapipe("cycle")
class Cycler(IterDataPipe[T]):
    """Yield the source's items ``count`` times over, or forever (functional name: ``cycle``).

    Args:
        source_datapipe: the source pipe; each round is a new pass over it.
        count: how many rounds, an int >= 0; ``None`` (default): forever.

    Yields:
        The items of pass 1 of the source, then of pass 2, and so on. Cycling forever over a
        source whose pass yields nothing ends, instead of looping without yielding.

    ``len()`` is ``count * len(source)``; ``TypeError`` when cycling forever.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(3)).cycle(2))
        [0, 1, 2, 0, 1, 2]
        >>> list(IterableWrapper("ab").cycle().header(5))
        ['a', 'b', 'a', 'b', 'a']

    See also: :class:`Header` to take a finite prefix of an endless cycle.
    """

    _saves = "same as enumerate"

    _repr_fields = ("count",)

    def __init__(self, source_datapipe: IterDataPipe[T], count: int | None = None) -> None:
        require_pipe(source_datapipe, "Cycler", "source_datapipe")
        require_int(count, "Cycler", "count", optional=True)
        if count is not None and count < 0:
            raise ValueError(f"Cycler: Expected non-negative count, got {count}")  # torchdata's words
        self.source_datapipe = source_datapipe
        self.count = count
        if count == 0:  # no round: the source is never built, nothing is yielded, there is no position
            self._builds_sources_later = self._stateless = True

    def _open(self, ctx: Pass) -> Iterator[T]:
        if self.count == 0:
            return iter(())  # no round: the source is not iterated at all
        # The first round's iterator now, as part of the pass; later rounds' in the same pass.
        run = _CycleRun()
        it = _cycle_run(self.source_datapipe, ctx.open(self.source_datapipe), self.count, ctx, run)
        ctx.track(self, run)
        return it

    def __len__(self) -> int:
        if self.count is None:
            raise len_unknown(self, "This Cycler instance cycles forever, and therefore doesn't have valid length",
                              "doesn't have valid length")
        if self.count == 0:
            return 0
        return self.count * source_len(self, self.source_datapipe, "source_datapipe")


# -- Enumerator ------------------------------------------------------------------------------------


class _EnumerateRun(Resumable):
    """The position of an ``enumerate`` pass: the next index, read from the counting iterator that
    numbers the items (:class:`datapipes._positions.Enumerated`, no per-item cost). State: one int."""

    __slots__ = ("counter", "start")

    def __init__(self, start: int) -> None:
        self.counter: Any = None
        self.start = start
        self.started = False

    def state(self) -> dict[str, Any]:
        counter = self.counter
        return {"index": self.start if counter is None else counter.count()}

    def load(self, state: dict[str, Any]) -> None:
        self.start = check_int(state, "index", None)  # from starting_index, which may be below 0


def _enumerate_run(it: Iterator[Any], run: _EnumerateRun) -> Iterator[tuple[int, Any]]:
    run.started = True
    run.counter = counter = Enumerated(it, run.start)
    try:
        yield from counter
    except BaseException:
        abandon(it)
        raise
    finally:  # ended, closed or dropped: the run keeps the count and lets go of the source
        run.start = counter.count()
        run.counter = None


@functional_datapipe("enumerate")
class Enumerator(IterDataPipe[tuple[int, T]]):
    """Pair every item with its index (functional name: ``enumerate``).

    Args:
        source_datapipe: the source pipe.
        starting_index: the index of the first item (default 0).

    Yields:
        ``(index, item)`` tuples, as the builtin ``enumerate`` does.

    ``len()`` is the source's length.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper("abc").enumerate(starting_index=1))
        [(1, 'a'), (2, 'b'), (3, 'c')]
    """

    _saves = "one int each"

    def __init__(self, source_datapipe: IterDataPipe[T], starting_index: int = 0) -> None:
        require_pipe(source_datapipe, "Enumerator", "source_datapipe")
        require_int(starting_index, "Enumerator", "starting_index")
        self.source_datapipe = source_datapipe
        self.starting_index = starting_index

    def _open(self, ctx: Pass) -> Iterator[tuple[int, T]]:
        run = _EnumerateRun(self.starting_index)
        it = _enumerate_run(ctx.open(self.source_datapipe), run)
        ctx.track(self, run)
        return it

    def __len__(self) -> int:
        return source_len(self, self.source_datapipe, "source_datapipe")
