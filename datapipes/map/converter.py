"""Converters between the two kinds of pipe: IterToMapConverter [to_map_datapipe on IterDataPipe]
and MapToIterConverter [to_iter_datapipe on MapDataPipe]."""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Hashable, Iterator, Sequence, TypeVar, overload

from .._runtime.passes import Pass
from ..datapipe import IterDataPipe, MapDataPipe, functional_datapipe, lacks_len, require_callable, source_len, stage_label
from ..errors import add_stage_note, call_lines, raised_at
from ..iter.util import _deferred, _SourceRun
from ._index import require_indices

__all__ = ["IterToMapConverter", "MapToIterConverter"]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
V = TypeVar("V")

_NOTHING = object()  # private "no item read yet" marker (None is a valid item)


# -- IterToMapConverter ----------------------------------------------------------------------------


class _LoadLock:
    """A lock that pickles and deep-copies as a new, unlocked lock (a lock is runtime state)."""

    __slots__ = ("lock",)

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (_LoadLock, ())

    def __deepcopy__(self, memo: dict[int, Any]) -> _LoadLock:
        return _LoadLock()


def _duplicate(pipe: IterToMapConverter[Any], key: Any, n: int) -> None:
    warnings.warn(
        f"{stage_label(pipe)}: Found duplicate key {key!s:.80} at item {n}, whose value replaces the earlier one. "
        "Please check your `key_value_fn`",
        UserWarning,
        stacklevel=5,
    )


def _explain(pipe: IterToMapConverter[Any], e: Exception, pair: Any, key: Any, n: int) -> None:
    """Raise a clear error for a failure while loading item ``n``, or return to re-raise ``e``."""
    label = stage_label(pipe)
    if raised_at(e, _FN_LINES):
        add_stage_note(e, label, n)
        return
    what = "key_value_fn's result for item" if pipe.key_value_fn is not None else "item"
    if raised_at(e, _PAIR_LINES) and isinstance(e, (TypeError, ValueError)):
        # torchdata's types and words (those of dict(pairs)), after the stage and the item
        if isinstance(e, TypeError):
            raise TypeError(f"{label}: {what} {n}: Cannot convert dictionary update element {type(pair)} "
                            f"({pair!r:.80}) to a sequence") from e
        try:
            length = f"length {len(pair)}"
        except Exception:  # noqa: BLE001 - no length: Python's unpacking error says how many
            length = f"a length other than 2 ({e})"
        raise ValueError(f"{label}: {what} {n}: dictionary update sequence element has {length}, 2 is "
                         "required") from e
    if raised_at(e, _KEY_LINES) and isinstance(e, TypeError) and key is not _NOTHING and not _hashable(key):
        raise TypeError(f"{label}: the key of {what} {n} is unhashable: {type(key).__name__} {key!r:.80}") from e


def _sized(source: Any) -> bool:
    """Whether ``len(source)`` gives a length (its errors other than a missing length propagate)."""
    try:
        len(source)
    except TypeError as e:
        if lacks_len(source, e):
            return False
        raise
    return True


def _hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def _load(pipe: IterToMapConverter[Any]) -> dict[Any, Any]:
    fn = pipe.key_value_fn
    m: dict[Any, Any] = {}
    n = 0
    pair: Any = _NOTHING
    key: Any = _NOTHING
    if fn is None:
        try:
            for pair in pipe.datapipe:
                key, value = pair
                if key in m:
                    _duplicate(pipe, key, n)
                m[key] = value
                n += 1
        except Exception as e:
            _explain(pipe, e, pair, key, n)
            raise
    else:
        try:
            for item in pipe.datapipe:
                pair = fn(item)
                key, value = pair
                if key in m:
                    _duplicate(pipe, key, n)
                m[key] = value
                n += 1
        except Exception as e:
            _explain(pipe, e, pair, key, n)
            raise
    return m


_FN_LINES = call_lines(_load, "fn")  # ``pair = fn(item)`` (``if fn is None`` is outside the try)
_PAIR_LINES = call_lines(_load, "pair")
_KEY_LINES = call_lines(_load, "key")


@functional_datapipe("to_map_datapipe", source=IterDataPipe)
class IterToMapConverter(MapDataPipe[V]):
    """Read an iterable-style pipe of ``(key, value)`` pairs into a dict, on first access, and serve
    it as a map-style pipe (functional name: ``to_map_datapipe``), on
    :class:`~datapipes.IterDataPipe`.

    Args:
        datapipe: the source iterable-style pipe, read once, entirely, at the first
            ``pipe[key]``, ``len(pipe)``, ``iter(pipe)`` or pickling.
        key_value_fn: turns each item into a ``(key, value)`` pair. ``None``: each item must itself
            be a pair (any iterable of exactly two elements).

    Yields:
        The values, in the order their keys were first read. ``pipe[key]`` is the value of
        ``key``; when a key repeats, the later value replaces the earlier one, with a warning
        (as in torchdata).

    Raises:
        IndexError: ``pipe[key]`` for a key that is not in the map (as torchdata).
        TypeError / ValueError: while loading, an item (or ``key_value_fn``'s result) that is not a
        pair, or an unhashable key; the message names the stage and the item's position.
        Whatever ``key_value_fn`` raises, as the same object, with a note naming the stage and the
        item's position; the source's errors unchanged. After a failed load the next access tries
        again.

    ``len()`` is the number of distinct keys (it loads the map, with torchdata's warning where the
    source has no length). The map is loaded once per pipe
    object, under a lock, so threads reading it concurrently load it once; a pickled pipe carries
    its loaded map (it is loaded before pickling, as in torchdata), so DataLoader workers do not
    read the source again.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper([("a", 1), ("b", 2)]).to_map_datapipe()
        >>> pipe["b"], len(pipe), list(pipe)
        (2, 2, [1, 2])
        >>> IterableWrapper(["x", "yy"]).to_map_datapipe(lambda s: (len(s), s))[2]
        'yy'

    See also: :class:`MapToIterConverter` (``to_iter_datapipe``), the other way round.
    """

    _saves = "same as SequenceWrapper"

    @overload
    def __init__(self: MapDataPipe[V], datapipe: IterDataPipe[tuple[Any, V]], key_value_fn: None = ...) -> None: ...
    @overload
    def __init__(
        self: MapDataPipe[V],
        datapipe: IterDataPipe[T],
        key_value_fn: Callable[[T], tuple[Any, V]],
    ) -> None: ...
    def __init__(self, datapipe: IterDataPipe[T], key_value_fn: Callable[[T], tuple[Any, V]] | None = None) -> None:
        if not isinstance(datapipe, IterDataPipe):  # torchdata's words
            raise TypeError(f"IterToMapConverter can only apply on IterDataPipe, but found {type(datapipe)}")
        require_callable(key_value_fn, "IterToMapConverter", "key_value_fn", optional=True)
        self.datapipe = datapipe
        self.key_value_fn = key_value_fn
        self._map: dict[Any, V] | None = None
        self._lock = _LoadLock()

    def _loaded(self) -> dict[Any, V]:
        m = self._map
        if m is None:
            with self._lock.lock:
                m = self._map
                if m is None:
                    m = self._map = _load(self)
        return m

    def __getitem__(self, key: Any) -> V:
        m = self._map
        if m is None:
            m = self._loaded()
        try:
            return m[key]
        except KeyError:
            raise IndexError(f"{stage_label(self)} ({len(m)} keys): Index {key!s:.80} is invalid for "
                             "IterToMapConverter.") from None

    def __iter__(self) -> Iterator[V]:
        return iter(self._loaded().values())

    def __len__(self) -> int:
        if self._map is None and not _sized(self.datapipe):
            # torchdata's warning where it loads the map for len() (its phrase kept)
            warnings.warn(
                f"{stage_label(self)}: Data from prior DataPipe are loaded to get length of IterToMapConverter "
                "before execution of the pipeline. Please consider removing len().",
                UserWarning,
                stacklevel=2,
            )
        return len(self._loaded())

    def __getstate__(self) -> dict[str, Any]:
        self._loaded()
        return self.__dict__


# -- MapToIterConverter ----------------------------------------------------------------------------


def _iter_all(pipe: MapToIterConverter[Any], ctx: Pass) -> Iterator[Any]:
    source = pipe.datapipe
    if type(source).__iter__ is MapDataPipe.__iter__:  # reads source[0 .. len - 1]: resumes by index
        return _positioned(pipe, ctx, lambda: iter(range(len(source))), source.__getitem__)
    return _positioned(pipe, ctx, lambda: iter(source), None)  # its own order: a resumed pass replays it


def _iter_indices(pipe: MapToIterConverter[Any], ctx: Pass) -> Iterator[Any]:
    return _positioned(pipe, ctx, lambda: iter(pipe.indices), pipe.datapipe.__getitem__)  # type: ignore[arg-type]


def _positioned(pipe: MapToIterConverter[Any], ctx: Pass, open_: Callable[[], Iterator[Any]],
                get: Callable[[Any], Any] | None) -> Iterator[Any]:
    """A pass yielding ``get(i)`` for the ``i`` of ``open_()`` (``get`` None: its items), opened at
    the first ``next()``; its position is how far ``open_()`` was read (an index into a list or a
    range: a resumed pass starts there, nothing read again; another iterable is read again and the
    items already yielded skipped), saved as :class:`~datapipes.iter.IterableWrapper` saves its own."""
    run = _SourceRun(True)
    ctx.track(pipe, run)
    it = _deferred(open_, run)
    return it if get is None else map(get, it)


@functional_datapipe("to_iter_datapipe", source=MapDataPipe)
class MapToIterConverter(IterDataPipe[T]):
    """Read a map-style pipe in order, as an iterable-style pipe
    (functional name: ``to_iter_datapipe``), on :class:`~datapipes.MapDataPipe`.

    Args:
        datapipe: the source map-style pipe.
        indices: the indices to read, in this order (a list, a range: a sized iterable, so the
            pipe pickles and has a length). ``None``: every item, as iterating ``datapipe`` gives
            them: ``datapipe[0], ..., datapipe[len - 1]`` (for a keyed pipe such as
            :class:`IterToMapConverter`, its values in key order).

    Yields:
        ``datapipe[i]`` for each index ``i``.

    Raises:
        TypeError: ``datapipe`` is not a ``MapDataPipe``, or ``indices`` is not a sized iterable.
        The source's errors pass through unchanged.

    ``len()`` is ``len(datapipe)`` at call time, or ``len(indices)``.

    Example:
        >>> from datapipes.map import SequenceWrapper
        >>> list(SequenceWrapper("abc").to_iter_datapipe())
        ['a', 'b', 'c']
        >>> list(SequenceWrapper("abc").to_iter_datapipe(indices=[2, 0]).map(str.upper))
        ['C', 'A']

    See also: :class:`IterToMapConverter` (``to_map_datapipe``), the other way round.
    """

    _saves = (
        "an index into the map-style pipe (or its ``indices``); the stages above it keep nothing (the "
        "map-style pipe is read from its start again)"
    )

    #: its position is an index into the map-style pipe, which a resumed pass reads from its start
    #: (a keyed pipe loads its source again): the stages above save no position (_runtime.plan.Plan.replayed)
    _replays_sources = True

    def __init__(self, datapipe: MapDataPipe[T], indices: Sequence[Any] | None = None) -> None:
        if not isinstance(datapipe, MapDataPipe):  # torchdata's words
            raise TypeError(f"MapToIterConverter can only apply on MapDataPipe, but found {type(datapipe)}")
        require_indices(indices, "MapToIterConverter")
        self.datapipe = datapipe
        self.indices = indices
        self._run = _iter_all if indices is None else _iter_indices

    def _open(self, ctx: Pass) -> Iterator[T]:
        return self._run(self, ctx)

    def __len__(self) -> int:
        return source_len(self, self.datapipe) if self.indices is None else len(self.indices)
