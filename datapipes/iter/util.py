"""Sources and small utilities: IterableWrapper, Header [header], Cycler [cycle],
Enumerator [enumerate], InMemoryCacheHolder [in_memory_cache].

Every ``__iter__`` creates its source's iterator at once, as part of the pass being built
(:mod:`datapipes._pass`), and hands it to the generator that does the work; ``Cycler`` creates
the iterators of its later rounds in the same pass, which it takes along.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import sys
from collections.abc import AsyncIterator as _AsyncIteratorABC
from collections.abc import Iterator as _IteratorABC
from typing import Any, AsyncIterable, Callable, Generator, Iterable, Iterator, TypeVar, cast

from .. import _pass
from .._engine import abandon, close_iterator, iterate_async
from ..datapipe import IterDataPipe, functional_datapipe, len_unknown, require_int, require_pipe

__all__ = ["IterableWrapper", "Header", "Cycler", "Enumerator", "InMemoryCacheHolder"]

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


def _opening(open_: Callable[[], Iterator[Any]], opened: list[Iterator[Any]]) -> Generator[Iterator[Any], None, None]:
    it = open_()
    opened.append(it)
    yield it


def _deferred(open_: Callable[[], Iterator[Any]]) -> _Deferred:
    opened: list[Iterator[Any]] = []
    opener = _opening(open_, opened)
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


class IterableWrapper(IterDataPipe[T]):
    """Wrap an iterable (a list, a range, a dataset, a generator) as the source of a pipe.

    Args:
        iterable: the items. A re-iterable (list, range, tuple, any object whose ``__iter__``
            returns a fresh iterator) gives a new pass at every ``iter()``. A one-shot iterator
            (a generator) can be iterated once: a second pass raises ``RuntimeError`` saying so;
            wrap a list, or a class whose ``__iter__`` builds the generator, to iterate again.
            An async iterable (an async generator listing a bucket, say) is driven on the engine's
            event-loop thread with a small bounded read-ahead, and closed when the pass is.
        deepcopy: copy the iterable at the start of each pass (its first ``next()``), so a pass
            that mutates items does not change the next one. Off by default (copying is slow and
            rarely needed).

    Yields:
        The items of ``iterable``, in order. Nothing is read before the first ``next()``: an
        ``__iter__`` written as a plain function (one that opens a file, say) is called then, not at
        ``iter()``.

    Raises:
        TypeError: ``iterable`` is not iterable.

    ``len()`` is ``len(iterable)`` at call time; ``TypeError`` where the iterable has no length.

    >>> from datapipes.iter import IterableWrapper
    >>> list(IterableWrapper(range(3)))
    [0, 1, 2]
    >>> len(IterableWrapper([7, 8]))
    2
    """

    _defer = False  # iter() of the iterable waits for the first next() (set by __init__)

    def __init__(self, iterable: Iterable[T] | AsyncIterable[T], deepcopy: bool = False) -> None:
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

    def __iter__(self) -> Iterator[T]:
        if self._one_shot:
            if self._started:
                raise RuntimeError(
                    f"IterableWrapper over a one-shot {type(self.iterable).__name__} was already iterated; "
                    "wrap a list or a re-iterable object to iterate again"
                )
            self._started = True
            if self._async:
                return iterate_async(self.iterable)  # type: ignore[arg-type]
            return iter(self.iterable)
        if self._async:
            return iterate_async(self.iterable)  # type: ignore[arg-type]
        # Nothing is copied, read or opened before the first next().
        iterable = self.iterable
        if self.deepcopy:
            return _deferred(lambda: iter(copy.deepcopy(iterable)))
        if self._defer:
            return _deferred(lambda: iter(iterable))
        return iter(iterable)

    def __len__(self) -> int:
        try:
            return len(self.iterable)  # type: ignore[arg-type]
        except TypeError:
            raise len_unknown(self, f"its source, a {type(self.iterable).__name__}, has no len()") from None

    def __getstate__(self) -> dict[str, Any]:
        if self._one_shot:
            raise TypeError(
                f"IterableWrapper over a one-shot {type(self.iterable).__name__} cannot be pickled; "
                "wrap a list or a re-iterable object"
            )
        return self.__dict__



_END = object()  # private end-of-pass marker (None is a valid item)


# -- Header ----------------------------------------------------------------------------------------


def _header_run(it: Iterator[Any], limit: int | None) -> Iterator[Any]:
    try:
        # islice pulls exactly `limit` items: the source is not read past the limit.
        yield from itertools.islice(it, limit)
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
    torchdata, which guesses ``limit`` with a warning: the source may be shorter).

    >>> from datapipes.iter import IterableWrapper
    >>> list(IterableWrapper(range(100)).header(3))
    [0, 1, 2]
    >>> len(IterableWrapper(range(2)).header(3))
    2

    See also: :class:`Cycler`.
    """

    _repr_fields = ("limit",)

    def __init__(self, source_datapipe: IterDataPipe[T], limit: int | None = 10) -> None:
        require_pipe(source_datapipe, "Header", "source_datapipe")
        require_int(limit, "Header", "limit", minimum=0, optional=True)
        self.source_datapipe = source_datapipe
        self.limit = limit

    def __iter__(self) -> Iterator[T]:
        return _header_run(iter(self.source_datapipe), self.limit)

    def __len__(self) -> int:
        if self.limit == 0:
            return 0
        try:
            n = len(self.source_datapipe)  # type: ignore[arg-type]
        except TypeError as e:
            if self.limit is None:
                raise
            raise len_unknown(self, f"its source may yield fewer than limit={self.limit} items ({e})") from None
        return n if self.limit is None else min(n, self.limit)


# -- Cycler ----------------------------------------------------------------------------------------


def _cycle_run(source: IterDataPipe[Any], it: Iterator[Any], count: int | None, pass_: _pass.Pass | None) -> Iterator[Any]:
    """Round 1 reads ``it`` (created by ``__iter__``); each later round a new pass of ``source``,
    created in ``pass_``, the pass this stage belongs to."""
    rounds = itertools.repeat(None) if count is None else itertools.repeat(None, count - 1)
    while True:
        try:
            first = next(it, _END)
            if first is _END:
                if count is None:
                    return  # an empty source cycled forever is empty, not a busy loop
            else:
                yield first
                yield from it
        except BaseException:
            abandon(it)
            raise
        if next(rounds, _END) is _END:
            return
        if pass_ is None:  # iterated outside any pass machinery
            it = iter(source)
        else:
            with pass_.building():
                it = iter(source)


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

    >>> from datapipes.iter import IterableWrapper
    >>> list(IterableWrapper(range(3)).cycle(2))
    [0, 1, 2, 0, 1, 2]
    >>> list(IterableWrapper("ab").cycle().header(5))
    ['a', 'b', 'a', 'b', 'a']

    See also: :class:`Header` to take a finite prefix of an endless cycle.
    """

    _repr_fields = ("count",)

    def __init__(self, source_datapipe: IterDataPipe[T], count: int | None = None) -> None:
        require_pipe(source_datapipe, "Cycler", "source_datapipe")
        require_int(count, "Cycler", "count", minimum=0, optional=True)
        self.source_datapipe = source_datapipe
        self.count = count

    def __iter__(self) -> Iterator[T]:
        if self.count == 0:
            return iter(())  # no round: the source is not iterated at all
        # The first round's iterator now, as part of the pass; later rounds' in the same pass.
        return _cycle_run(self.source_datapipe, iter(self.source_datapipe), self.count, _pass.current())

    def __len__(self) -> int:
        if self.count is None:
            raise len_unknown(self, "it cycles forever")
        if self.count == 0:
            return 0
        return self.count * len(self.source_datapipe)  # type: ignore[arg-type]


# -- Enumerator ------------------------------------------------------------------------------------


def _enumerate_run(it: Iterator[Any], starting_index: int) -> Iterator[tuple[int, Any]]:
    try:
        yield from enumerate(it, starting_index)
    except BaseException:
        abandon(it)
        raise


@functional_datapipe("enumerate")
class Enumerator(IterDataPipe[tuple[int, T]]):
    """Pair every item with its index (functional name: ``enumerate``).

    Args:
        source_datapipe: the source pipe.
        starting_index: the index of the first item (default 0).

    Yields:
        ``(index, item)`` tuples, as the builtin ``enumerate`` does.

    ``len()`` is the source's length.

    >>> from datapipes.iter import IterableWrapper
    >>> list(IterableWrapper("abc").enumerate(starting_index=1))
    [(1, 'a'), (2, 'b'), (3, 'c')]
    """

    def __init__(self, source_datapipe: IterDataPipe[T], starting_index: int = 0) -> None:
        require_pipe(source_datapipe, "Enumerator", "source_datapipe")
        require_int(starting_index, "Enumerator", "starting_index")
        self.source_datapipe = source_datapipe
        self.starting_index = starting_index

    def __iter__(self) -> Iterator[tuple[int, T]]:
        return _enumerate_run(iter(self.source_datapipe), self.starting_index)

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]


# -- InMemoryCacheHolder ---------------------------------------------------------------------------


def _nbytes(x: Any) -> int:
    """An estimate of the memory ``x`` holds: arrays and tensors by their data size, containers
    recursively, PIL images by their pixels, anything else by ``sys.getsizeof``."""
    if isinstance(x, (list, tuple)):
        return sys.getsizeof(x) + sum(map(_nbytes, x))
    if isinstance(x, dict):
        return sys.getsizeof(x) + sum(_nbytes(k) + _nbytes(v) for k, v in x.items())
    nbytes = getattr(x, "nbytes", None)  # numpy arrays, torch tensors
    if isinstance(nbytes, int):
        return nbytes + sys.getsizeof(x)
    getbands = getattr(x, "getbands", None)  # PIL images
    if getbands is not None and callable(getbands):
        width, height = x.size
        return width * height * len(getbands()) + sys.getsizeof(x)
    return sys.getsizeof(x)


def _cache_fill(pipe: InMemoryCacheHolder, it: Iterator[Any]) -> Iterator[Any]:
    items: list[Any] = []
    append = items.append
    try:
        for x in it:
            append(x)
            yield x
    except BaseException:
        abandon(it)
        raise
    # Reached only when the source ended: a pass that was closed early or failed caches nothing.
    pipe._cache = items


def _cache_fill_bounded(pipe: InMemoryCacheHolder, it: Iterator[Any]) -> Iterator[Any]:
    budget = pipe.size * 1024 * 1024  # type: ignore[operator]
    items: list[Any] = []
    used = 0
    try:
        for x in it:
            used += _nbytes(x)
            if used > budget:
                # Too big to cache: free what was kept and stream the rest of this pass.
                items.clear()
                yield x
                yield from it
                return
            items.append(x)
            yield x
    except BaseException:
        abandon(it)
        raise
    pipe._cache = items


@functional_datapipe("in_memory_cache")
class InMemoryCacheHolder(IterDataPipe[T]):
    """Keep the items of the first complete pass in memory; later passes read them from there
    (functional name: ``in_memory_cache``).

    Args:
        source_dp: the source pipe (torchdata's parameter name).
        size: the most memory the cache may hold, in megabytes (an int or float > 0); ``None``
            (default): no limit. Sizes are estimates: arrays and tensors count their data,
            containers their contents, other objects ``sys.getsizeof``. A pass whose items exceed
            ``size`` caches nothing (it frees what it kept and streams on), so later passes read
            the source again; unlike torchdata, a partial cache never mixes a new pass of the
            source with a cached one.

    Yields:
        The source's items. A pass that ends early (closed, or the source raised) caches nothing;
        only a pass that reaches the source's end fills the cache. Later passes yield the cached
        items (the very objects, not copies) without reading the source, so what a random stage
        upstream drew in the cached pass is repeated.

    The cache is runtime state: it is not pickled (an unpickled copy fills its own) and it is
    kept per pipe object.

    ``len()`` is the number of cached items once cached, the source's length before.

    >>> from datapipes.iter import IterableWrapper
    >>> pipe = IterableWrapper(range(4)).map(lambda x: x * x).in_memory_cache()
    >>> list(pipe), list(pipe)
    ([0, 1, 4, 9], [0, 1, 4, 9])
    """

    #: once filled, later passes read the cache and never build the source (see datapipes._pass.unbuilt)
    _builds_sources_later = True

    _cache: list[Any] | None = None

    def __init__(self, source_dp: IterDataPipe[T], size: int | float | None = None) -> None:
        require_pipe(source_dp, "InMemoryCacheHolder", "source_dp")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, (int, float)):
                raise TypeError(f"InMemoryCacheHolder: size must be a number of megabytes or None, got {type(size).__name__}")
            if not size > 0 or size == float("inf"):
                raise ValueError(f"InMemoryCacheHolder: size must be a finite number of megabytes > 0, got {size!r}")
        self.source_dp = source_dp
        self.size = size
        self._fill: Callable[[InMemoryCacheHolder[T], Iterator[T]], Iterator[T]] = (
            _cache_fill if size is None else _cache_fill_bounded
        )
        self._cache = None

    def __iter__(self) -> Iterator[T]:
        cache = self._cache
        if cache is not None:
            return iter(cache)  # the source is not read again
        return self._fill(self, iter(self.source_dp))

    def __len__(self) -> int:
        cache = self._cache
        if cache is not None:
            return len(cache)
        return len(self.source_dp)  # type: ignore[arg-type]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = None
        return state
