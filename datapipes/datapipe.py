"""The two base classes, :class:`IterDataPipe` and :class:`MapDataPipe`, and the functional registry.

A pipe is a cheap, picklable *description* of a step. ``iter(pipe)`` returns a new iterator that owns
all the runtime state of one pass, so iterating a pipe twice gives two independent passes.

``@functional_datapipe("name")`` registers a pipe class as a real method of its base class, so
``IterableWrapper(xs).map(f).batch(8)`` builds ``Batcher(Mapper(IterableWrapper(xs), f), 8)``:

>>> from datapipes.iter import IterableWrapper
>>> pipe = IterableWrapper(range(5)).map(lambda x: x * 10).batch(2)
>>> list(pipe)
[[0, 10], [20, 30], [40]]
>>> len(pipe)
3
"""

from __future__ import annotations

import copy
import functools
import inspect
import pickle
import re
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeAlias, TypeVar

import cloudpickle
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info
from torch.utils.data import graph_settings as _torch_graph_settings
from torch.utils.data.datapipes import datapipe as _torch_datapipe

from ._runtime import passes as _pass, worker as _worker
from .hooks import Hook
from ._checks import require_callable, require_int
from ._methods import IterMethods, MapMethods
from ._runtime.seeds import derive_seed, draw_seed
from ._runtime.traits import mark_pass_hooked, pass_hooked, traits_of
from .graph import Node, chain_repr, sources_of, stage_label, traverse

__all__ = [
    "DataPipe",
    "IterDataPipe",
    "MapDataPipe",
    "functional_datapipe",
    "len_unknown",
    "require_callable",
    "require_int",
    "require_pipe",
    "sources_of",
    "stage_label",
    "stateless",
]

T_co = TypeVar("T_co", covariant=True)


class _ByValue:
    """A callable or class that plain pickle cannot reach by reference (a lambda, a local function or
    class), carried as cloudpickle bytes and restored as the object itself."""

    __slots__ = ("payload",)

    def __init__(self, obj: Any) -> None:
        self.payload = cloudpickle.dumps(obj)

    def __reduce__(self) -> tuple[Callable[[bytes], Any], tuple[bytes]]:
        return cloudpickle.loads, (self.payload,)


def _new_instance(cls: Any) -> Any:  # a class; Any, as mypy reads ``type.__new__`` for cls.__new__
    return cls.__new__(cls)


#: the types of the items a large container may hold and still be plain data (no callable inside)
_PLAIN = frozenset({str, bytes, int, float, bool, complex, type(None)})
#: a container with more entries than this is checked as data before the probe descends into it
_PROBE_SCAN = 64
_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter


class _Discard:
    """A file that forgets what it is given: where :func:`_by_reference` pickles."""

    __slots__ = ()

    def write(self, data: bytes) -> int:
        return len(data)


class _Probe(pickle.Pickler):
    """Pickles into nothing, skipping data in which no callable can hide: strings and bytes, tensors
    (the exact types) and NumPy arrays of numbers, and containers of more than
    :data:`_PROBE_SCAN` entries that hold nothing but such scalars. So deciding a callable that holds
    a dataset (a map-style dataset's ``Fetch``, a bound ``dataset.__getitem__``) costs a look at its
    structure, not a pickle of its data, which ``spawn`` and ``forkserver`` workers would otherwise
    have pickled twice each, once here and once for real (docs/performance.rst, "Worker start
    time")."""

    def persistent_id(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is str or kind is bytes or kind is bytearray or kind is _Tensor or kind is _Parameter:
            return 0
        if kind is list or kind is tuple or kind is set or kind is frozenset:
            if len(obj) > _PROBE_SCAN and set(map(type, obj)) <= _PLAIN:
                return 0
        elif kind is dict:
            if len(obj) > _PROBE_SCAN and set(map(type, obj)) <= _PLAIN and set(map(type, obj.values())) <= _PLAIN:
                return 0
        else:
            np = sys.modules.get("numpy")
            if np is not None and kind is np.ndarray and not obj.dtype.hasobject:
                return 0
        return None


def _by_reference(obj: Any) -> bool:
    """Whether plain pickle takes ``obj`` (a callable: by name, or an instance of an importable
    class holding only what pickle takes), tried without pickling the data it holds (:class:`_Probe`)."""
    try:
        _Probe(_Discard(), pickle.HIGHEST_PROTOCOL).dump(obj)
    except Exception:  # PicklingError, AttributeError, TypeError: not importable by name
        return False
    return True


#: ids of the callables whose way of pickling this thread is deciding (see :func:`_portable`)
_deciding = threading.local()


def _portable(value: Any) -> Any:
    """``value`` ready for plain pickle: callables that need it go by value (one level into lists,
    tuples and dicts, where transforms usually live); everything else is left to the pickler.

    Deciding pickles the callable once on its own (by name, else through cloudpickle). A callable
    that leads back to itself (a pipe's own bound method as the ``fn`` of a stage inside it, a lambda
    closing over its pipe) is met again while it is being decided: it is then left to the pickler
    at work, whose memo closes the cycle, instead of deciding it again and again without end."""
    if isinstance(value, (IterDataPipe, MapDataPipe)):
        return value
    if callable(value):
        ids = _deciding.__dict__.setdefault("ids", set())
        key = id(value)
        if key in ids:
            return value
        ids.add(key)
        try:
            return value if _by_reference(value) else _ByValue(value)
        finally:
            ids.discard(key)
    kind = type(value)
    if len(value) > 64 if kind in (list, tuple, dict) else False:
        return value  # data, not a list of transforms: leave it to the pickler unscanned
    if kind is list or kind is tuple:
        if any(callable(v) and not isinstance(v, (IterDataPipe, MapDataPipe)) for v in value):
            return kind(_portable(v) for v in value)
    elif kind is dict:
        if any(callable(v) and not isinstance(v, (IterDataPipe, MapDataPipe)) for v in value.values()):
            return {k: _portable(v) for k, v in value.items()}
    return value


class _DataPipeMixin(Node):
    """What both bases share: repr, truthiness, pickling, seeds. Nothing here runs per item. The
    traits a stage declares to the pass (``_is_random``, ``_seed``, ...) are declared on
    :class:`~datapipes._runtime.traits.Traits`, a base of :class:`~datapipes.graph.Node`."""

    #: What a pass's state holds for the stage, declared by each class of datapipes.iter and
    #: datapipes.map (never inherited): scripts/gen_docs_tables.py writes the table of
    #: docs/howto/checkpoint.rst from it (docs/howto/custom_pipe.rst says how to write it).
    _saves: str | dict[str, str]

    def __bool__(self) -> bool:
        # Always true, so ``if pipe:`` never calls ``__len__`` (which may raise).
        return True

    def __repr__(self) -> str:
        return chain_repr(self)

    @property
    def stats(self) -> Any:
        """The statistics of this stage's most recent pass (:class:`~datapipes._engine.StageStats`),
        for the stages that keep them (concurrent ``map``, ``prefetch``, ...); ``None`` before
        any. Each pass has its own: ``it.stats()`` on a pass's iterator reads that pass's."""
        return _pass.latest_stats(self)

    #: torch's base class whose pickling hooks this pipe honours (see :meth:`__reduce_ex__`)
    _torch_base: Any = None

    # -- pickling: lambdas and local functions travel through cloudpickle --------------------------
    def __reduce_ex__(self, protocol: Any) -> Any:
        # The standard protocol (create, then set state) lets the outer pickler's memo keep pipes
        # shared between branches (fork children, a reused source) shared, and cycles intact. Only
        # the values plain pickle cannot reach by name go by value through cloudpickle.
        # torch's graph walk (torch.utils.data.graph.traverse_dps, which torch's DataLoader runs to
        # seed, shuffle and shard a pipe) pickles the graph with hooks set on torch's base classes:
        # honour them, so torch finds our stages as it finds its own.
        reduced = self._torch_reduced()
        if reduced is not None:
            return reduced
        cls = type(self)
        state = self.__getstate__()
        getstate_hook = self._torch_base.getstate_hook
        if getstate_hook is not None:
            state = getstate_hook(state)
        if isinstance(state, dict):
            state = {k: _portable(v) for k, v in state.items()}
        return _new_instance, (cls if _by_reference(cls) else _ByValue(cls),), state

    def _torch_reduced(self) -> Any:
        """What torch's ``reduce_ex_hook`` makes of this pipe while torch walks a graph (a stub
        that records the pipe as a node), or None: no walk under way, or the hook declines (it
        raises ``NotImplementedError`` for the pipe the walk starts from, by torch's protocol)."""
        hook = self._torch_base.reduce_ex_hook
        if hook is None:
            return None
        try:
            return hook(self)
        except NotImplementedError:  # torch's "not this one": pickle it as usual
            return None

    def __copy__(self) -> Any:
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    # -- seeds -------------------------------------------------------------------------------------
    def set_seed(self, seed: int | None) -> Any:
        """Seed every random stage of this pipe's graph; returns the pipe.

        Each random stage gets its own seed derived from ``seed`` and its place in the graph, so the
        same seed and the same graph give the same output order. ``None`` goes back to drawing a
        fresh seed from torch's global generator at every pass.
        """
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        if sys._getframe(1).f_code is _TORCH_APPLY_RANDOM_SEED:
            return self._lend_seed(seed)
        for index, stage in enumerate(s for s in traverse(self) if s._is_random):
            stage._seed = None if seed is None else derive_seed(seed, "stage", index)
        return self

    def set_epoch(self, epoch: int) -> Any:
        """Set the epoch of every random stage: seeded stages reshuffle per epoch; returns the pipe."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        for stage in traverse(self):
            if stage._is_random:
                stage._epoch = epoch
        return self

    def _lend_seed(self, seed: int | None) -> Any:
        """torch's ``apply_random_seed`` (run by ``torch.utils.data.DataLoader`` before each epoch, in
        the main process and in every worker, from a seed shared by all of them) seeds one random stage
        at a time, for its next pass only, as torch's own ``Shuffler.set_seed`` does. Here that seed is
        *lent*: the next pass of an unseeded random stage uses it (so every worker and rank shuffles
        alike, and each epoch anew); a stage seeded with :meth:`set_seed` keeps its seed, and
        a stage that draws no random numbers ignores it."""
        if self._is_random and self._seed is None:
            self._lent_seed = seed
        return self

    def _pass_seed(self) -> int:
        """The seed of this random stage in the pass being built (see :mod:`datapipes._runtime.passes`);
        outside any pass (a map-style pipe read by index), derived from (seed, epoch) or drawn."""
        pass_ = _pass.current() or _pass.owner(self)
        if pass_ is not None:
            return pass_.seed_for(self)
        if self._seed is None:
            return draw_seed()
        return derive_seed(self._seed, "epoch", self._epoch)


def _hook_pass(iter_fn: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
    """``iter_fn`` (a class's ``__iter__``) as part of a pass (:mod:`datapipes._runtime.passes`): a new pass
    when the pipe is iterated from outside any pass, else this stage's iterator in the pass being
    built. Runs once per ``iter()``, never per item; inside a torch DataLoader worker it also checks
    the pipe (``_worker.worker_pass``)."""

    def by_iter(pipe: Any, pass_: Any) -> Iterator[Any]:
        return iter_fn(pipe)  # a stage written torch-style: it finds its pass itself (passes.adapted)

    @functools.wraps(iter_fn)
    def __iter__(self: Any) -> Iterator[Any]:
        if get_worker_info() is not None:
            _worker.worker_pass(self)
        return _pass.start(self, by_iter)

    mark_pass_hooked(__iter__)
    return __iter__


class IterDataPipe(IterableDataset[T_co], IterMethods[T_co], _DataPipeMixin):
    """Base of iterable-style pipes: a lazy, re-iterable stream of items.

    Subclasses implement ``__iter__`` (a new, independent pass each call) and, where the length can
    be known from the sources at call time, ``__len__``; where it cannot, ``__len__`` raises
    ``TypeError`` naming the stage (:func:`len_unknown`).

    Every pipe is also a (virtual) ``torch.utils.data.IterDataPipe``, so torch's DataLoader treats it
    as one of its own DataPipes: ``shuffle=`` turns its shuffles on and off, and workers and ranks
    shard it through its ``sharding_filter``.
    """

    _torch_base = _torch_datapipe.IterDataPipe

    #: functional name -> class, for the methods registered on IterDataPipe
    _functions: dict[str, type] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__iter__")
        if own is not None and not pass_hooked(own):
            cls.__iter__ = _hook_pass(own)  # type: ignore[method-assign]
        elif own is None and "_open" in cls.__dict__:
            # a stage of the protocol: opened with the pass handed to it (docs/architecture.rst)
            cls.__iter__ = _pass.OPEN_ITER  # type: ignore[method-assign]

    def __iter__(self) -> Iterator[T_co]:
        raise TypeError(f"{type(self).__name__} is an IterDataPipe but defines no __iter__")

    # -- watching and budgets: recorded on the pipe (the traits _hooks, _budget), read when a pass starts

    def add_hook(self, hook: Any, *, stage_only: bool = False) -> Any:
        """Attach ``hook`` (a :class:`datapipes.hooks.Hook`) to this stage and every stage upstream
        of it (``stage_only=True``: this stage alone); every later pass of a graph holding this pipe
        calls it. Returns the pipe. Attaching the same hook twice is a no-op.

        >>> from datapipes.iter import IterableWrapper
        >>> from datapipes.hooks import StatsReporter
        >>> pipe = IterableWrapper(range(3)).add_hook(StatsReporter(interval=30))
        >>> list(pipe)
        [0, 1, 2]
        """
        if not isinstance(hook, Hook):
            raise TypeError(f"add_hook: hook must be a datapipes.hooks.Hook, got {type(hook).__name__}")
        if not isinstance(stage_only, bool):
            raise TypeError(f"add_hook: stage_only must be a bool, got {type(stage_only).__name__}")
        if not any(h is hook for h, _ in self._hooks):
            self._hooks = (*self._hooks, (hook, stage_only))
        return self

    def remove_hook(self, hook: Any) -> Any:
        """Detach ``hook`` from this pipe (passes already running keep it); returns the pipe.

        Raises:
            ValueError: ``hook`` is not attached to this pipe.
        """
        kept = tuple((h, only) for h, only in self._hooks if h is not hook)
        if len(kept) == len(self._hooks):
            raise ValueError(f"remove_hook: {hook!r} is not attached to {type(self).__name__}")
        self._hooks = kept
        return self

    def set_budget(self, max_threads: int | None = None, max_memory: int | None = None,
                   max_processes: int | None = None) -> Any:
        """Bound what a pass of this pipe's graph may use; returns the pipe.

        Args:
            max_threads: the most worker threads all thread stages of the graph run together (the
                stages with ``concurrency="auto"`` included). Stages with a fixed ``concurrency``
                whose sum exceeds it are scaled down in proportion when the pass starts; a stage
                left no thread runs ``fn`` on the consumer's thread. Prefetch producer threads and
                the event-loop thread of async stages are not counted. ``None``: no bound (auto
                stages then stay within ``min(128, max(32, 4 x CPUs))`` threads each).
            max_memory: bytes of resident memory the autotuner keeps below: it takes workers away
                from auto stages when memory comes near it. It counts this process's RSS and the
                proportional share (PSS) of each worker process of its process stages. ``None``: no
                bound.
            max_processes: the most worker processes all process stages of the graph
                (``executor="process"``) run together. An auto process stage starts that many at
                most (one per CPU, at most 32, without a budget) and is tuned within them; a fixed
                one gets what is left, at most its ``concurrency``; each gets one at least.
                ``None``: no bound.

        The tightest budget set on any stage of a graph applies to its passes;
        ``datapipes.DataLoader(max_threads=..., max_memory=...)`` sets one for the loader's passes.

        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper(range(6)).map(abs, concurrency=8).set_budget(max_threads=2)
        >>> it = iter(pipe); list(it), it.stats()[0][1].workers
        ([0, 1, 2, 3, 4, 5], 2)
        """
        for name, value in (("max_threads", max_threads), ("max_memory", max_memory),
                            ("max_processes", max_processes)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"set_budget: {name} must be an int >= 1 or None, got {value!r}")
        self._budget = (max_threads, max_memory, max_processes)
        return self


def index_ordered(pipe: Any) -> bool:
    """Whether iterating the map-style ``pipe`` yields ``pipe[0], pipe[1], ...`` in that order: a
    pipe of this package says (``_index_ordered``); another object does when it has no ``__iter__``
    (Python then reads it by index)."""
    return bool(traits_of(pipe)._index_ordered())


class MapDataPipe(Dataset[T_co], MapMethods[T_co], _DataPipeMixin):
    """Base of map-style pipes: ``pipe[index]`` and ``len(pipe)``.

    Iterating a map-style pipe yields ``pipe[0], pipe[1], ...`` up to ``len(pipe)``.
    """

    #: functional name -> class, for the methods registered on MapDataPipe
    _functions: dict[str, type] = {}

    _torch_base = _torch_datapipe.MapDataPipe

    def __getitem__(self, index: Any) -> T_co:
        raise TypeError(f"{type(self).__name__} is a MapDataPipe but defines no __getitem__")

    def __len__(self) -> int:
        raise TypeError(f"{type(self).__name__} is a MapDataPipe but defines no __len__")

    def __iter__(self) -> Iterator[T_co]:
        for i in range(len(self)):
            yield self[i]

    def _index_ordered(self) -> bool:
        """Whether iterating this pipe yields ``self[0], self[1], ...`` in that order (what a loader
        that shards the indices needs); a class whose ``__iter__`` keeps that order says so."""
        return type(self).__iter__ is MapDataPipe.__iter__


if TYPE_CHECKING:
    DataPipe: TypeAlias = IterDataPipe[Any] | MapDataPipe[Any]
else:  # a plain union at run time, so isinstance(x, DataPipe) works
    DataPipe = IterDataPipe | MapDataPipe

# Our pipes are torch's DataPipes as far as isinstance (and so torch's DataLoader) can tell.
_torch_datapipe.IterDataPipe.register(IterDataPipe)
_torch_datapipe.MapDataPipe.register(MapDataPipe)

#: The code of torch's ``apply_random_seed``: a ``set_seed`` call from it lends a seed (``_lend_seed``).
_TORCH_APPLY_RANDOM_SEED = _torch_graph_settings.apply_random_seed.__code__


#: ``len_unknown(..., phrase=NO_LEN)``: the stage's torch or torchdata counterpart defines no
#: ``__len__``, so Python's "has no len()" is what code ported from it matches.
NO_LEN = "has no len()"


def len_unknown(pipe: Any, why: str, phrase: str | None = None) -> TypeError:
    """The ``TypeError`` a stage's ``__len__`` raises when its length cannot be known, in one
    sentence: the stage, why, and the phrase code ported from torch DataPipes or torchdata matches.

    ``phrase``: ``None`` (default) ends the message with torch's "<Class> instance doesn't have
    valid length" (the stages whose torch counterpart raises it); :data:`NO_LEN` says
    "<label> has no len(): why" (those whose counterpart defines no ``__len__``, where Python's
    words are what ported code matches); any other string is the counterpart's own phrase, which
    ``why`` then ends with (``phrase`` itself is not repeated).
    """
    label = stage_label(pipe)
    if phrase is None:
        message = f"{label}: {why}, so {type(pipe).__name__}{_TORCH_LEN_TAIL}"
    elif phrase == NO_LEN:
        message = f"{label} {NO_LEN}: {why}"
    else:
        message = f"{label}: {why}"
    err = TypeError(message)
    err._len_root = f"{label}: {why}"  # type: ignore[attr-defined]
    return err


#: What a ``TypeError`` from ``len()`` says when the object has no length: Python's own words, torch
#: DataPipes' and ours (:func:`len_unknown`), the map-style base's, torchdata's ("length relies on
#: ...", "cannot be known in advance", "cannot be determined").
_NO_LEN_PHRASES = ("has no len()", "doesn't have valid length", "defines no __len__", "length relies on",
                   "cannot be known in advance", "cannot be determined")
_TORCH_LEN_TAIL = " instance doesn't have valid length"
_PYTHON_NO_LEN = re.compile(r"object of type '([^']*)' has no len\(\)")


def lacks_len(source: Any, error: TypeError) -> bool:
    """True when ``error``, raised by ``len(source)``, says that ``source`` has no length (its type
    defines no ``__len__``, or its ``__len__`` says so), rather than coming from a bug inside it."""
    if not hasattr(type(source), "__len__"):
        return True
    text = str(error)
    return any(phrase in text for phrase in _NO_LEN_PHRASES)


def len_root(error: TypeError) -> str:
    """Why a source has no length, once: the deepest reason down the chain (``"Filter(bool): how
    many items pass ..."``), without the phrase its message ends with; Python's "object of type 'X'
    has no len()" becomes "X defines no __len__"."""
    root = getattr(error, "_len_root", None)
    if root is not None:
        return str(root)
    text = str(error)
    head, sep, tail = text.rpartition(", so ")
    if sep and tail.endswith(_TORCH_LEN_TAIL):
        return head  # ours, pickled (the attribute does not travel): the reason alone
    m = _PYTHON_NO_LEN.fullmatch(text)
    if m is not None:
        return f"{m.group(1)} defines no __len__"
    return text


def source_len(stage: Any, source: Any, name: str = "datapipe", phrase: str | None = None) -> int:
    """``len(source)``, for a ``stage.__len__`` that delegates to its source ``name``.

    When ``source`` has no length, raises a ``TypeError`` for ``stage`` in one sentence: ``name``,
    the first reason down the chain (the stages between that only delegate are not repeated), and
    torch's phrase "<Class> instance doesn't have valid length" (or ``phrase``, torchdata's words for
    the stage) at the end. Any other error of ``len(source)`` (a ``ValueError``, or a ``TypeError``
    that is not about a missing length) propagates as the same object. With a length, the cost is one call and a ``try`` (free).

    >>> from datapipes.iter import IterableWrapper
    >>> len(IterableWrapper(iter([1])).map(abs))
    Traceback (most recent call last):
    ...
    TypeError: Mapper(abs): datapipe has no len() (IterableWrapper: its source, a list_iterator, has no length), so Mapper instance doesn't have valid length
    """
    try:
        return len(source)
    except TypeError as e:
        if not lacks_len(source, e):
            raise
        root = len_root(e)
        if phrase is None:
            phrase = f"{type(stage).__name__}{_TORCH_LEN_TAIL}"
        err = TypeError(f"{stage_label(stage)}: {name} has no len() ({root}), so {phrase}")
        err._len_root = root  # type: ignore[attr-defined]
        raise err from None


def require_pipe(value: Any, stage: str, name: str = "datapipe", kind: type | tuple[type, ...] | None = None) -> None:
    """Raise ``TypeError`` naming ``stage`` and ``name`` unless ``value`` is a pipe of ``kind``
    (default: :class:`IterDataPipe`)."""
    kind = IterDataPipe if kind is None else kind
    if not isinstance(value, kind):
        want = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
        article = "an" if want[0] in "AEIOU" else "a"
        raise TypeError(f"{stage}: {name} must be {article} {want}, got {type(value).__name__}")


# -- the functional registry -----------------------------------------------------------------------


def _same_class(a: type, b: type) -> bool:
    # A module reloaded (importlib.reload, notebooks) defines an equal class anew: not a conflict.
    return a is b or (a.__module__ == b.__module__ and a.__qualname__ == b.__qualname__)


def _make_method(name: str, cls: type, base: type) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return cls(self, *args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"{base.__name__}.{name}"
    method.__module__ = cls.__module__
    method.__doc__ = cls.__doc__
    try:
        params = list(inspect.signature(cls).parameters.values())
        # The source is the first parameter; a ``*datapipes`` constructor (concat, zip) keeps it,
        # since the method's own pipe is only the first of them.
        rest = params if params and params[0].kind is inspect.Parameter.VAR_POSITIONAL else params[1:]
        method.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *rest]
        )
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        pass
    method._datapipe_class = cls  # type: ignore[attr-defined]
    return method


C = TypeVar("C", bound=type)


def stateless(cls: C) -> C:
    """Declare a pipe class written outside datapipes stateless: its position in a pass is its
    sources' (it yields as it reads, keeping no item, count or buffer between two ``next()``), so a
    pass through it saves and resumes (``it.state_dict()``). The same as ``stateless = True`` in the
    class body; subclasses inherit it.

    A stage of your own that says nothing, and whose iterator has no
    ``state_dict``/``load_state_dict``, makes ``state_dict()`` raise ``TypeError`` naming it: one
    that reads an item ahead would otherwise resume with that item lost (``docs/howto/checkpoint.rst``,
    "Your own stages").

    Raises:
        TypeError: ``cls`` is not a class.

    >>> import datapipes
    >>> from datapipes.iter import IterableWrapper
    >>> @datapipes.stateless
    ... class Doubled(datapipes.IterDataPipe):
    ...     def __init__(self, datapipe):
    ...         self.datapipe = datapipe
    ...     def __iter__(self):
    ...         return (2 * x for x in self.datapipe)
    >>> from datapipes.testing import check_resume
    >>> check_resume(lambda: Doubled(IterableWrapper(range(5))))  # stopped, saved and resumed: exact
    [0, 2, 4, 6, 8]
    """
    if not isinstance(cls, type):
        raise TypeError(f"stateless: decorates a class, got {type(cls).__name__}")
    cls.stateless = True  # type: ignore[attr-defined]  # read by datapipes._runtime.passes
    return cls


def functional_datapipe(name: str, *, source: type | None = None) -> Callable[[type], type]:
    """Register a pipe class as the method ``name`` of its base class.

    Args:
        name: the functional name, a Python identifier (``"map"``, ``"batch"``).
        source: the base the method is added to: by default :class:`IterDataPipe` for an
            iterable-style class and :class:`MapDataPipe` for a map-style one. A class that turns one
            kind into the other names its source (the map-style ``shuffle`` returns an
            ``IterDataPipe`` but is called on a ``MapDataPipe``).

    Raises:
        ValueError: ``name`` is not an identifier, or is taken by another class or attribute.
        TypeError: the class is not a pipe class.

    The method takes the source pipe as its first argument, exactly as the constructor does:
    ``pipe.map(f)`` is ``Mapper(pipe, f)``. Registering the same class again is a no-op.
    """
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise ValueError(f"functional name must be a public Python identifier, got {name!r}")

    def register(cls: type) -> type:
        if not isinstance(cls, type) or not issubclass(cls, (IterDataPipe, MapDataPipe)):
            raise TypeError(f"functional_datapipe({name!r}) decorates an IterDataPipe or MapDataPipe class, got {cls!r}")
        base = source
        if base is None:
            base = IterDataPipe if issubclass(cls, IterDataPipe) else MapDataPipe
        if base not in (IterDataPipe, MapDataPipe):
            raise ValueError(f"source must be IterDataPipe or MapDataPipe, got {base!r}")
        registry: dict[str, type] = base._functions
        taken = registry.get(name)
        if taken is not None and not _same_class(taken, cls):
            raise ValueError(
                f"functional name {name!r} on {base.__name__} is already registered by "
                f"{taken.__module__}.{taken.__qualname__}; cannot register {cls.__module__}.{cls.__qualname__}"
            )
        if taken is None and hasattr(base, name):
            raise ValueError(f"functional name {name!r} clashes with the attribute {base.__name__}.{name}")
        registry[name] = cls
        setattr(base, name, _make_method(name, cls, base))
        cls._functional_name = name  # type: ignore[union-attr]  # set on registered classes only (read with getattr)
        return cls

    return register
