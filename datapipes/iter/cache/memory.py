"""The in-memory cache: InMemoryCacheHolder [in_memory_cache], which keeps the items of the first
complete pass over its source (within a memory budget) and yields them again on later passes.

Every ``_open`` creates its source's iterator at once, in the pass it is handed
(:mod:`datapipes._runtime.passes`), and hands it to the generator that does the work.
"""

from __future__ import annotations

import itertools
import sys
from operator import length_hint
from typing import Any, Callable, Iterator, TypeVar

from ..._runtime.passes import Pass
from ..._runtime.validate import check_bool, check_int
from ..._positions import Counted, seek
from ..._engine import abandon, close_iterator
from ...datapipe import IterDataPipe, functional_datapipe, require_pipe, source_len
from ..util import _END, _STARTED

__all__ = ["InMemoryCacheHolder"]

T = TypeVar("T")


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


class _CacheRun:
    """The position of an ``in_memory_cache`` pass: how many items it has yielded, read at no
    per-item cost from the cache's list iterator (a cached pass) or from the items a filling pass
    keeps; a pass streaming without filling counts them (``Counted``). State: an int and two
    flags (whether the pass read the cache; whether its source's saved states are stale, those of an
    earlier round of the same pass, as in a ``cycle``).

    A resumed pass reads the cache where this process has it (moved to the index), else the source:
    a pass saved while filling goes on streaming from its restored source without filling (its
    first items were yielded before: the next complete pass fills the cache); a pass saved while
    reading the cache replays the source from its start, keeping the items already yielded in the
    cache without yielding them again, and fills it. Reading the cache is exact; replaying the
    source is exact for a source that yields the same items at every pass (seeded, or not random).
    """

    __slots__ = ("it", "total", "at", "items", "counter", "stale", "started", "resume", "final")

    def __init__(self) -> None:
        self.it: Iterator[Any] | None = None  # a cached pass: the cache's iterator
        self.total = 0  # ... the cache's length
        self.at = 0  # ... where restore() moved it
        self.items: list[Any] | None = None  # a filling pass: the items kept so far
        self.counter: Any = None  # a pass streaming without filling: the Counted iterator counting its items
        self.stale = False
        self.started = False
        self.resume: dict[str, Any] | None = None
        self.final: dict[str, Any] | None = None  # the state once the filling pass ended, or was closed

    def position(self) -> int:
        if self.it is not None:
            return self.total - length_hint(self.it)
        if self.counter is not None:
            return self.counter.count()  # type: ignore[no-any-return]
        if self.items is not None:
            return len(self.items)
        return 0

    def state(self) -> dict[str, Any]:
        if self.final is not None:
            return dict(self.final)
        if not self.started and self.it is None and self.resume is not None:
            return dict(self.resume)
        return {"cached": self.it is not None, "index": self.position(), "stale": self.stale}

    def restore(self, state: dict[str, Any]) -> None:
        if self.started or (self.it is not None and self.position() != self.at):
            raise RuntimeError(_STARTED)
        index = check_int(state, "index", 0, self.total if self.it is not None else None)
        cached, stale = check_bool(state, "cached"), check_bool(state, "stale")
        if self.it is not None:  # this process has the cache: read it from the index
            seek(self.it, self.at, index)
            self.at = index
        else:
            self.resume = {"cached": cached, "index": index, "stale": stale}

    def release(self) -> None:
        """Keep the state and let go of the items and the source (the filling pass ended or was closed)."""
        self.final = self.state()
        self.items = self.counter = None


def _fill_start(pipe: InMemoryCacheHolder, it: Iterator[Any], run: _CacheRun,
                ctx: Pass) -> tuple[Iterator[Any], list[Any] | None]:
    """The source a filling pass reads and the items it has kept (``None``: it streams, counted)."""
    resume = run.resume
    if resume is None:
        run.items = []
        return it, run.items
    index = resume["index"]
    if not resume["cached"]:
        # Saved while filling: the source was restored; the first items, yielded before, are gone.
        run.counter = Counted(it, index)
        return it, None
    if resume["stale"]:  # the source's restored states are of an earlier round: read it afresh
        close_iterator(it)
        it = ctx.open(pipe.source_dp)
    run.items = list(itertools.islice(it, index))  # replayed into the cache, not yielded again
    return it, run.items


def _cache_fill(pipe: InMemoryCacheHolder, it: Iterator[Any], run: _CacheRun, ctx: Pass) -> Iterator[Any]:
    run.started = True
    try:
        it, items = _fill_start(pipe, it, run, ctx)
        if items is None:
            yield from run.counter
            return
        append = items.append
        for x in it:
            append(x)
            yield x
    except BaseException:
        abandon(it)
        raise
    finally:
        run.release()
    # Reached only when the source ended: a pass that was closed early or failed caches nothing.
    pipe._cache = items


def _cache_fill_bounded(pipe: InMemoryCacheHolder, it: Iterator[Any], run: _CacheRun,
                        ctx: Pass) -> Iterator[Any]:
    budget = pipe.size * 1024 * 1024  # type: ignore[operator]
    run.started = True
    try:
        it, items = _fill_start(pipe, it, run, ctx)
        if items is not None:
            used = sum(map(_nbytes, items))  # the items a resumed pass replayed
            if used <= budget:
                for x in it:
                    used += _nbytes(x)
                    if used > budget:
                        break
                    items.append(x)
                    yield x
                else:
                    pipe._cache = items
                    return
            else:
                x = _END
            # Too big to cache: free what was kept and stream the rest of this pass, counted.
            run.counter = Counted(it, len(items) + (x is not _END))
            run.items = None
            items.clear()
            if x is not _END:
                yield x
        yield from run.counter
    except BaseException:
        abandon(it)
        raise
    finally:
        run.release()


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

    Checkpoint: a pass resumed where the cache is filled reads it from the saved index; else it
    reads the source: a pass saved while filling streams the rest without filling the cache, one
    saved while reading the cache replays the source (exact where the source repeats its items)
    and fills it.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper(range(4)).map(lambda x: x * x).in_memory_cache()
        >>> list(pipe), list(pipe)
        ([0, 1, 4, 9], [0, 1, 4, 9])
    """

    _saves = (
        "an index and two flags; the cache itself is not saved (a process without it reads the source again)"
    )

    #: once filled, later passes read the cache and never build the source (see datapipes._runtime.passes.unbuilt)
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
        self._fill: Callable[[InMemoryCacheHolder[T], Iterator[T], _CacheRun, Pass], Iterator[T]] = (
            _cache_fill if size is None else _cache_fill_bounded
        )
        self._cache = None

    def _open(self, ctx: Pass) -> Iterator[T]:
        cache = self._cache
        run = _CacheRun()
        if cache is not None:
            it = run.it = iter(cache)  # the source is not read again
            run.total = len(cache)
            # A source built earlier in this pass (an earlier round of a cycle) left stale states.
            run.stale = id(self.source_dp) in ctx.built
        else:
            it = self._fill(self, ctx.open(self.source_dp), run, ctx)
        ctx.track(self, run)
        return it

    def __len__(self) -> int:
        cache = self._cache
        if cache is not None:
            return len(cache)
        return source_len(self, self.source_dp, "source_dp",
                          "InMemoryCacheHolder instance doesn't have valid length until the cache is loaded")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = None
        return state
