"""What one pass of a pipe graph owns: its seeds, its shards, its statistics.

A pipe is a description; a *pass* is one iteration of it. A pass starts when a pipe is iterated from
outside any other pass (``iter(pipe)`` in user code, in a DataLoader worker, ...): the *root*. At
that moment :class:`Pass` decides, in one place and without writing anything onto the pipe objects:

- the placement of the pass (distributed rank x DataLoader worker, :mod:`datapipes._runtime.worker`);
- the shard of every sharding stage (the one set with ``apply_sharding``, else the placement's);
- the seed of every random stage, a pure function of the root seed, the epoch, the stage's place in
  the graph and the placement (:meth:`Pass.seed_for`);
- the statistics sink of every stage that keeps statistics (:meth:`Pass.stats_for`).

The iterators of the stages are created while the pass is being *built*: ``iter(pipe)`` on the root
calls its ``_open(ctx)`` with the pass (``ctx``), which opens its sources with ``ctx.open(source)``,
and so on down to the sources, every one of them reading what it needs from the pass it is handed
(its seed, shard, statistics sink, threads and hooks). A stage that opens a source later (a new
cycle, a thread that starts at the first ``next()``) keeps ``ctx`` and calls ``ctx.open`` then.

A stage written elsewhere (a torch-style ``__iter__`` generator that iterates its source in its
body) is opened by :func:`adapted`: its ``__iter__`` runs while the pass is the one being built on
that thread (:func:`current`), and a stage of ours it iterates later, after the building has ended,
joins the live pass that contains it, found through :func:`owner` (the pass that built it most
recently). These two lookups serve such stages only (and ``_pass_seed()``, their way to ask for a
seed); the stages of the package are handed their pass.

Seeds, for random stage ``i`` (in graph order, as :func:`datapipes.graph.traverse` walks it):

- a loader pass (``PassConfig``): ``derive(derive(seed, "stage", i) [, "shard", shard], "epoch",
  epoch)``, the shard part only for stages downstream of a sharding stage;
- a stage seeded by the user (``set_seed``, recorded on the pipe with its ``set_epoch``):
  ``derive(stage seed, "epoch", epoch)``; upstream of a sharding stage inside a DataLoader worker,
  the epoch moves on with each pass of the worker (persistent workers reshuffle);
- an unseeded stage given a seed by torch DataLoader's ``apply_random_seed`` (which it runs before
  each epoch from a seed every worker and rank shares): that seed, for its next pass only;
- an unseeded stage upstream of a sharded sharding stage: ``derive(agreed root, "shared pass",
  passes, "stage", j)`` (``j`` its place in the sharding stage's upstream), where the root is the
  seed agreed by ``datapipes.DataLoader`` or the torch DataLoader's base seed; over several ranks
  with neither, the pass raises (the shards would overlap);
- any other unseeded stage: a fresh draw from torch's global generator, when the stage asks.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from typing import Any, Callable, Iterator, NamedTuple

from torch.utils.data import get_worker_info

from .._engine.lifecycle import STARTED
from . import held as _held
from .validate import check_dict, invalid, reason
from .._engine.stats import StageStats
from .._positions import remaining
from .observe import Observer, observing, pending_observation
from .tuning import Budget, Tuner
from .seeds import derive_seed, draw_seed
from .traits import declares_stateless, mark_pass_hooked, pass_hooked, traits_of
from .plan import Plan
from . import worker as _worker
from .worker import base_seed, unseeded_across_ranks
from ..graph import sources_of, stage_label, walk

__all__ = ["OPEN_ITER", "observing", "adapted", "budgeted", "opener_of", "Pass", "PassConfig", "PassIterator", "STARTED", "check_state",
           "check_yields", "configured", "current", "remaining", "replayed", "stage_keys", "state_of",
           "latest_stats", "owner", "start"]

_local = threading.local()

#: stage -> the pass that most recently built it (weak on both sides)
_owners: weakref.WeakKeyDictionary[Any, weakref.ReferenceType[Pass]] = weakref.WeakKeyDictionary()
_owners_lock = threading.Lock()
#: stage -> the statistics of the stage's most recent pass (``pipe.stats``)
_latest: weakref.WeakKeyDictionary[Any, StageStats] = weakref.WeakKeyDictionary()
#: sharding stage -> passes started in this DataLoader worker process (a plain torch DataLoader's
#: persistent workers: pass k is k epochs on). Process state, not pass state.
_worker_passes: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


class PassConfig(NamedTuple):
    """Seeds a loader hands to a pass instead of those recorded on the pipe.

    ``seed`` replaces every stage's seed (stage ``i`` gets one derived from ``(seed, i)``),
    ``epoch`` every stage's epoch; random stages downstream of a sharding stage also derive from
    ``shard`` (this process's shard id), so that shuffles upstream of ``sharding_filter`` agree
    across shards while augmentations downstream differ. ``placed``: ``(num_of_instances,
    instance_id)`` for the sharding stages that find their shard from where they run, instead of
    finding it: a pass run on behalf of the shard it names.
    """

    seed: int
    epoch: int = 0
    shard: int = 0
    placed: tuple[int, int] | None = None


class configured:  # noqa: N801 - used as a context manager, like contextlib's
    """``with configured(config): it = iter(pipe)``: the next pass started on this thread inside the
    block (the first ``iter()`` of a pipe from outside any pass) takes ``config``'s seeds."""

    __slots__ = ("config", "saved")

    def __init__(self, config: PassConfig) -> None:
        self.config = config

    def __enter__(self) -> PassConfig:
        self.saved = getattr(_local, "config", None)
        _local.config = self.config
        return self.config

    def __exit__(self, *exc: Any) -> None:
        _local.config = self.saved


def current() -> Pass | None:
    """The pass being built on this thread, if any."""
    return getattr(_local, "building", None)


def owner(stage: Any) -> Pass | None:
    """The live pass that most recently built ``stage``, if any."""
    ref = _owners.get(stage)
    found = None if ref is None else ref()
    return found if found is not None and not found.ended else None




class _NoPosition:
    """The run of a pass that keeps no position of its own: its position is its source's."""

    __slots__ = ()

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        pass


_NO_POSITION = _NoPosition()


def latest_stats(stage: Any) -> StageStats | None:
    """The statistics of ``stage``'s most recently started pass (``None`` before any)."""
    return _latest.get(stage)


class Pass:
    """The runtime of one pass of ``root``'s graph (see the module's docstring)."""

    def __init__(self, root: Any, config: PassConfig | None = None, observe: tuple[Any, ...] | None = None,
                 budget: tuple[int | None, ...] | None = None, *, replay: bool = False,
                 like: Pass | None = None) -> None:
        self.root = root
        self.budget_limits = budget
        self.config = config
        self.ended = False
        self.built: set[int] = set()  # ids of the stages whose iterators this pass created
        self.runs: dict[int, tuple[Any, Any]] = {}  # id(stage) -> (stage, its run: state()/restore())
        self.pending_states: dict[int, Any] = {}  # loaded states of stages not built yet
        #: building phases (each outermost ``building()``) and the phase each run was tracked in: a
        #: stage tracked twice in one phase is read by two iterators at once (``zip(p, p)``)
        self.phase = 0
        self._tracked_in: dict[int, tuple[int, object]] = {}  # (phase, the iter() call that built it)
        self.twice: set[int] = set()  # ids of the stages read by two iterators at once

        self.stats: dict[int, StageStats] = {}
        self._stats_owner: dict[int, Any] = {}
        self._lock = threading.RLock()
        self.in_worker = get_worker_info() is not None
        self._seeds: dict[int, int] = {}
        self._first_seeds: dict[int, int] = {}  # a reseeded stage's seed before its first reseed
        self._shards: dict[int, tuple[int, int]] = {}
        if replay:
            self._decide_replay(like)
        else:
            self._decide()
        self._budget: Budget | None = None
        self._tuner: Tuner | None = None
        self.observer: Observer | None = None
        if not replay and (observe is not None or any(s._hooks for s in self.graph)):
            self.observer = Observer(self, self.graph, observe or ())
            weakref.finalize(self, self.observer.end)

    # -- what the pass decides when it starts --------------------------------------------------------
    def _decide(self) -> None:
        plan = self.plan = Plan(self.root)
        graph = self.graph = plan.graph
        ref = weakref.ref(self)
        with _owners_lock:  # a stage iterating its source lazily finds the pass through its source
            for stage in graph:
                _owners[stage] = ref
        placed = None if self.config is None else self.config.placed
        for stage in plan.sharding:
            shard = stage._pass_shard(placed)
            if shard is not None:  # a sharding stage written elsewhere: the pass decides no shard
                self._shards[id(stage)] = shard
        config = self.config
        if config is not None:
            below = plan.below_sharding
            for index, stage in enumerate(plan.random):
                seed = derive_seed(config.seed, "stage", index)
                if config.shard and id(stage) in below:
                    seed = derive_seed(seed, "shard", config.shard)
                self._seeds[id(stage)] = derive_seed(seed, "epoch", config.epoch)
            return
        for stage in plan.random:
            if stage._seed is not None:
                self._seeds[id(stage)] = derive_seed(stage._seed, "epoch", stage._epoch)
            elif "_lent_seed" in stage.__dict__:  # torch's DataLoader lent it, for this pass only
                self._seeds[id(stage)] = stage.__dict__.pop("_lent_seed")
        for stage in plan.sharding:
            self._share_upstream_seeds(stage)

    def _decide_replay(self, like: Pass | None) -> None:
        """A side pass (:func:`replayed`): the seeds ``like`` gave its stages, every sharding stage
        reading all its items, nothing written onto the stages (their owners are :func:`replayed`'s
        business)."""
        plan = self.plan = Plan(self.root)
        self.graph = plan.graph
        if like is not None:
            self.config = like.config
            # the seeds at ``like``'s start: a replay reads from the start, its restarts reseed again
            self._seeds = {**like._seeds, **like._first_seeds}
        for stage in plan.sharding:
            self._shards[id(stage)] = (1, 0)

    def shard_count(self) -> int:
        """The most shards any sharding stage of this pass splits its items into (1: none)."""
        return max((num for num, _ in self._shards.values()), default=1)

    def _share_upstream_seeds(self, stage: Any) -> None:
        """Seeds agreed by every shard for the random stages upstream of sharding ``stage``."""
        num = self._shards.get(id(stage), (1, 0))[0]
        if num == 1 and not self.in_worker:
            return  # one shard in the main process: nothing to agree on
        passes = 0
        if self.in_worker:
            passes = _worker_passes.get(stage, 0)
            _worker_passes[stage] = passes + 1
        ranks = stage._pass_ranks()
        root: int | None = None
        agreed = stage._loader_seed
        if agreed is not None:
            root = derive_seed(agreed[0], "loader epoch", agreed[1])
        elif self.in_worker and ranks == 1:
            root = base_seed()
        unseeded = []
        for index, s in enumerate(self.plan.upstream_random(stage)):
            if s._seed is None and id(s) in self._seeds:
                continue  # lent by torch's DataLoader, from a seed every worker and rank shares
            if s._seed is not None:
                self._seeds[id(s)] = derive_seed(s._seed, "epoch", s._epoch + passes)
            elif root is None:
                unseeded.append(s)
            else:
                self._seeds[id(s)] = derive_seed(derive_seed(root, "shared pass", passes, "stage", index), "epoch",
                                                 s._epoch)
        if unseeded and ranks > 1:
            raise unseeded_across_ranks(unseeded, ranks, stage_label(stage))

    # -- what stages ask while the pass is built -----------------------------------------------------
    def seed_for(self, stage: Any) -> int:
        """The seed of random ``stage`` in this pass (drawn from torch's generator if unseeded)."""
        with self._lock:
            seed = self._seeds.get(id(stage))
            if seed is None:
                seed = self._seeds[id(stage)] = draw_seed()
            return seed

    def reseed(self, root: Any, round_: int) -> None:
        """Seed the random stages of ``root``'s graph for its ``round_``-th new pass inside this one (a
        ``Mixer`` restarting a source that ended): each seed is derived from the one the stage had
        at this pass's start and ``round_``, so a shuffle draws a new order every round, a resumed
        pass draws the same ones, and stages whose seeds every shard shares still share them."""
        with self._lock:
            for stage in self.plan.walk(root):
                key = id(stage)
                if key not in self._first_seeds:
                    if key not in self._seeds:
                        continue  # not random, or not seeded in this pass yet: seed_for draws it
                    self._first_seeds[key] = self._seeds[key]
                self._seeds[key] = derive_seed(self._first_seeds[key], "restart", round_)

    def shard_for(self, stage: Any) -> tuple[int, int]:
        """``(num_of_instances, instance_id)`` of sharding ``stage`` in this pass."""
        shard = self._shards.get(id(stage))
        if shard is None:  # a stage this pass did not see when it started (built lazily elsewhere)
            placed = None if self.config is None else self.config.placed
            shard = self._shards[id(stage)] = stage._pass_shard(placed)
        return shard

    def budget(self) -> Budget:
        """The thread budget of this pass (decided at the first request; see :mod:`datapipes._runtime.tuning`):
        the tightest ``set_budget`` of its graph's stages and of the loader that runs it."""
        with self._lock:
            if self._budget is None:
                # (max_threads, max_memory, max_processes); a pipe pickled before max_processes has two
                limits = [(*s._budget, None, None)[:3] for s in self.graph if any(s._budget)]
                if self.budget_limits is not None:
                    limits.append((*self.budget_limits, None, None)[:3])
                tightest = [min((v for v in column if v is not None), default=None) for column in zip(*limits)]
                threads, memory, processes = tightest if limits else (None, None, None)
                self._budget = Budget(self.graph, threads, memory, max_processes=processes)
            return self._budget

    def tuner(self) -> Tuner:
        with self._lock:
            if self._tuner is None:
                self._tuner = Tuner(self, self.budget())
            return self._tuner

    def stats_for(self, stage: Any, make: Callable[[], StageStats]) -> StageStats:
        """The statistics sink of ``stage`` for this pass (made by ``make`` on first request); it is
        also what ``stage.stats`` shows until another pass of the stage starts."""
        stats = make()
        with self._lock:
            self.stats[id(stage)] = stats
            self._stats_owner[id(stage)] = stage
        _latest[stage] = stats
        return stats

    def stage_stats(self) -> list[tuple[Any, StageStats]]:
        """``(stage, statistics)`` for every stage of this pass that keeps statistics, in graph order
        (the root first); a serial stage's ``items_in`` is what its sources handed it."""
        with self._lock:
            found = [(self._stats_owner[k], v) for k, v in self.stats.items()]
        order = {id(s): i for i, s in enumerate(self.graph)}
        found.sort(key=lambda pair: order.get(id(pair[0]), len(order)))
        by_id = {id(stage): stats for stage, stats in found}
        for stage, stats in found:
            if stats.kind == "serial":
                upstream = [by_id[id(s)] for s in self.plan.sources(stage) if id(s) in by_id]
                if upstream:
                    stats._in = sum(u.items_out for u in upstream)
                else:
                    stats._in = stats._out + stats._fail
        return found

    def track(self, stage: Any, run: Any) -> None:
        """Record the *run* of ``stage`` in this pass: an object with ``state()`` (plain data, read
        between two items of the pass) and ``restore(state)`` (before the first ``next()``). The
        latest run of a stage is the one saved (a stage iterated again within the pass, as a
        cycled source is, replaces its run)."""
        with self._lock:
            token = _starting().get(id(stage))
            if token is not None and getattr(_local, "building", None) is self:
                seen = self._tracked_in.get(id(stage))
                if id(stage) in self.runs and seen is not None and seen[0] == self.phase and seen[1] is not token:
                    self.twice.add(id(stage))
                self._tracked_in[id(stage)] = (self.phase, token)
            self.runs[id(stage)] = (stage, run)
            pending = self.pending_states.pop(id(stage), None)
        if pending is not None:  # loaded before this stage was built (its consumer iterates lazily)
            _load_into(stage, run, pending, lambda: self.key_of(stage))

    def no_position(self, stage: Any) -> None:
        """Record that this pass of ``stage`` keeps no position of its own (a stage that only sometimes
        does, such as a mover on the CPU, where it would on a GPU): its state is its sources'."""
        self.track(stage, _NO_POSITION)

    def key_of(self, stage: Any) -> str:
        """The key of ``stage``'s state in this pass's states (see :func:`stage_keys`)."""
        return self.plan.key_of(stage)

    # -- building ------------------------------------------------------------------------------------
    def building(self) -> _Building:
        """A context in which ``iter(stage)`` creates ``stage``'s iterator as part of this pass."""
        return _Building(self)

    def forget(self, root: Any) -> None:
        """Drop what this pass holds of the stages of ``root``'s graph (their runs, loaded states not
        applied yet, that it built them): a stage about to iterate ``root`` anew (``cycle``'s next
        round) must not save, or be resumed into, the previous round's positions."""
        graph = list(self.plan.walk(root))
        for stage in graph:
            stage._pass_forgotten(self)  # stages sharing state across passes (fork)
        ids = {id(stage) for stage in graph}
        with self._lock:
            for key in ids:
                self.runs.pop(key, None)
                self.pending_states.pop(key, None)
                self._tracked_in.pop(key, None)
            self.twice -= ids
            self.built -= ids

    def open(self, source: Any) -> Iterator[Any]:
        """The iterator of ``source`` in this pass: how a stage opens its sources (``ctx.open(source)``
        in its ``_open(ctx)``, docs/architecture.rst, "The stage protocol"). A stage of the protocol
        (``_open``) is handed this pass; any other iterable is opened by :func:`adapted`."""
        opener = opener_of(source)
        if opener is None:
            return adapted(self, source)
        if self.in_worker:  # as iter(source) would in a DataLoader worker (the base class's __iter__)
            _worker.worker_pass(source)
        with self.building():  # what the stage opens lazily from its own __iter__ still finds the pass
            return _enter(self, source, opener)

    def claim(self, stage: Any) -> None:
        """Record that this pass built ``stage`` (see :func:`owner`)."""
        ref = weakref.ref(self)
        self.built.add(id(stage))
        with _owners_lock:
            _owners[stage] = ref


class _Building:
    __slots__ = ("pass_", "saved")

    def __init__(self, pass_: Pass) -> None:
        self.pass_ = pass_

    def __enter__(self) -> Pass:
        self.saved = getattr(_local, "building", None)
        if self.saved is not self.pass_:
            self.pass_.phase += 1
        _local.building = self.pass_
        return self.pass_

    def __exit__(self, *exc: Any) -> None:
        _local.building = self.saved


def unbuilt(it: Any) -> list[Any]:
    """The stages of the package, in the pass of ``it`` (what ``iter(pipe)`` returned), that did not
    create the iterators of their sources when the pass started, although they and every stage
    between them and the root are the package's: such a stage iterates its sources lazily, outside
    the pass (their seeds and shards then come from :func:`owner`, not from the pass itself).
    Empty for a well-built pass."""
    pass_ = it.pass_
    lazy = []
    seen: set[int] = set()
    stack = [pass_.root]
    while stack:
        stage = stack.pop()
        if id(stage) in seen or not type(stage).__module__.startswith("datapipes."):
            continue
        seen.add(id(stage))
        if stage._runs_sources_elsewhere or stage._builds_sources_later:
            continue  # the workers' own passes; or a stage that builds its sources under this pass later
        sources = [s for s in sources_of(stage)
                   if type(s).__module__.startswith("datapipes.") and _iterated_in_passes(s)]
        if any(id(s) not in pass_.built for s in sources):
            lazy.append(stage)
        else:
            stack.extend(sources)
    return lazy


def _iterated_in_passes(stage: Any) -> bool:
    """True for iterable-style stages (their ``__iter__`` joins passes); map-style ones are read by
    index, outside passes."""
    return pass_hooked(type(stage).__iter__)


class PassIterator(itertools.chain):  # type: ignore[type-arg]
    """What ``iter(pipe)`` returns: the iterator of one pass, with the pass it owns.

    Iterating costs what the root stage's iterator costs (``itertools.chain`` forwards ``next`` in
    C). :meth:`close` closes the pass (its threads, processes and files), as closing a generator
    does; dropping the iterator does the same.
    """

    __slots__ = ("pass_", "_it")
    pass_: Pass
    _it: Iterator[Any]

    def __new__(cls, it: Iterator[Any], pass_: Pass) -> PassIterator:
        self = super().__new__(cls, it)
        self._it = it
        self.pass_ = pass_
        return self

    def close(self) -> None:
        """End the pass: close the root stage's iterator (idempotent)."""
        self.pass_.ended = True
        close = getattr(self._it, "close", None)
        try:
            if close is not None:
                close()
        finally:
            if self.pass_.observer is not None:
                self.pass_.observer.end()
            if self.pass_._tuner is not None:
                self.pass_._tuner.close()

    def stats(self) -> list[tuple[Any, StageStats]]:
        """``(stage, statistics)`` of every stage of this pass that keeps statistics, readable at
        any moment of the pass."""
        return self.pass_.stage_stats()

    def state_dict(self) -> dict[str, Any]:
        """The position of this pass, as plain data (``torch.save`` and ``pickle`` write it): a new
        ``iter(pipe)`` given it by :meth:`load_state_dict` goes on exactly where this one stands.

        Call it between two items. Raises ``TypeError`` naming the stage when a stage of the graph
        cannot save its position.
        """
        return _snapshot(self.pass_)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` (what :meth:`state_dict` returned, for a pipe of the same shape),
        before the first ``next()``.

        Raises:
            ValueError: the state is not a pass state, or was saved from a graph of another shape
                (the message names the first stage where the graphs disagree).
            RuntimeError: this pass has already yielded an item.
        """
        _restore(self.pass_, state)


_FORMAT = "datapipes.pass/1"


def stage_keys(root: Any) -> list[tuple[str, Any]]:
    """``(key, stage)`` for every stage a pass of ``root`` runs, in graph order: the keys under which
    a pass state (``state["stages"]``) holds each stage's state."""
    return [(key, stage) for stage, key in zip(*_keyed(Plan(root)))]


def state_of(graph: list[str], stages: dict[str, Any]) -> dict[str, Any]:
    """A pass state (what :meth:`PassIterator.state_dict` returns) for a pipe whose graph has the
    stage classes ``graph`` (graph order), holding ``stages`` (key -> the stage's state)."""
    return {"format": _FORMAT, "graph": list(graph), "stages": stages}


def _stateless(stage: Any) -> bool:
    """A stage with nothing of its own to save: its position is its sources' (map, filter, batch at
    a batch boundary, ...). A stage written elsewhere (whose iterator has no
    ``state_dict``/``load_state_dict``, the protocol for your own stateful stages) is stateless only
    when its class says so (``stateless = True``, or ``@datapipes.stateless``): one that reads an
    item ahead or keeps a buffer would otherwise resume with those items lost, and say nothing."""
    if declares_stateless(stage):
        return True
    return type(stage).__module__.startswith("datapipes.") and bool(stage._stateless)


def _undeclared(stage: Any) -> str:
    """Why ``stage`` (built in a pass, with no position of its own to read) stops ``state_dict()``."""
    if type(stage).__module__.startswith("datapipes."):
        return (f"{stage_label(stage)} cannot save its position yet, so this pass has no state_dict(); the stages "
                f"that can are listed in docs/howto/checkpoint.rst")
    return (f"{stage_label(stage)} ({type(stage).__module__}.{type(stage).__qualname__}) cannot save its position: "
            f"it is not one of datapipes' stages and says nothing about its state. If its position is its "
            f"source's (it yields as it reads, keeping no item and no count), declare it: stateless = True on "
            f"the class, or @datapipes.stateless; otherwise give its iterator state_dict() and "
            f"load_state_dict(state) (docs/howto/checkpoint.rst, 'Your own stages')")


def _keyed(plan: Plan) -> tuple[list[Any], list[str]]:
    return plan.graph, [plan.keys[id(stage)] for stage in plan.graph]


def _snapshot(pass_: Pass) -> dict[str, Any]:
    # Stages that pull their upstream on a thread of their own hold their lock while they do: take
    # them all, downstream first (graph order), so every stage is between two items.
    locks = [lock for stage in pass_.graph
             if (lock := getattr(pass_.runs.get(id(stage), (None, None))[1], "lock", None)) is not None]
    with contextlib.ExitStack() as held:
        for lock in locks:
            held.enter_context(lock)
        stages: dict[str, Any] = {}
        keys = pass_.plan.keys
        replayed = pass_.plan.replayed
        for stage in pass_.graph:
            key = keys[id(stage)]
            if id(stage) in replayed:
                continue
            if id(stage) in pass_.twice:
                raise TypeError(
                    f"{stage_label(stage)} cannot save its position: this pass reads it through two iterators at once "
                    f"(the same pipe given twice to zip or mux, random_split's children read together, ...), and "
                    f"one position cannot stand for both; read it twice through fork() (a, b = pipe.fork(2)), whose "
                    f"children each keep their place"
                )
            entry = pass_.runs.get(id(stage))
            if entry is not None:
                # Streams in the items a stage holds are saved by where they came from (_held).
                stages[key] = _held.freeze(entry[1].state(), lambda s: keys.get(id(s)), stage_label(stage))
            elif id(stage) in pass_.pending_states:  # loaded, not built yet (a stage built lazily): as loaded
                stages[key] = _held.freeze(pass_.pending_states[id(stage)], lambda s: keys.get(id(s)),
                                           stage_label(stage))
            elif id(stage) in pass_.built and not _stateless(stage):
                raise TypeError(_undeclared(stage))
    return state_of([type(s).__qualname__ for s in pass_.graph], stages)


def check_state(state: Any, what: str = "the state") -> dict[str, Any]:
    """The stages' states of ``state`` if it has the shape of a pass state (``format``, ``graph``: a
    list of str, ``stages``: a dict of str -> a stage's state); ``ValueError`` saying what differs
    otherwise (``what`` names ``state`` where it sits inside another state)."""
    inside = "" if what == "the state" else f"{what}: "
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise ValueError(f"load_state_dict: {inside}not a state saved by a pass's state_dict(): {str(state)[:200]}")
    try:
        for key in ("graph", "stages"):
            if key not in state:
                invalid(f"the state has no {key!r}")
        graph = state["graph"]
        if type(graph) is not list or any(type(name) is not str for name in graph):
            invalid(f"state['graph'] must be a list of str (the stage classes in graph order), got {graph!r:.100}")
        return check_dict(state["stages"], "state['stages']")
    except ValueError as e:
        raise ValueError(f"load_state_dict: {inside}{e}") from None


def _where(stage: Any, key: str) -> str:
    return f"{stage_label(stage)} (state['stages'][{key!r}])"


#: what a run's ``restore`` raises for a state that does not fit it (its ``RuntimeError`` says the
#: pass has started: that passes unchanged)
_STATE_ERRORS = (KeyError, TypeError, AttributeError, IndexError, ValueError)


def _load_into(stage: Any, run: Any, saved: Any, key: Callable[[], str]) -> None:
    """``run.restore(saved)``, where an error of a state that does not fit becomes a ``ValueError``
    naming ``stage`` and its key in the state (chained from the run's own); the iterator of a stage
    written elsewhere raises as it does, with a note naming the stage."""
    try:
        run.restore(saved)
    except _STATE_ERRORS as e:
        if isinstance(run, _StatefulIterator):
            e.add_note(f"[datapipes] raised by the load_state_dict() of {stage_label(stage)}'s iterator, loading "
                       f"state['stages'][{key()!r}]")
            raise
        raise ValueError(f"load_state_dict: {_where(stage, key())}: {reason(e)}") from e


def _restore(pass_: Pass, state: dict[str, Any]) -> None:
    stages = check_state(state)
    saved = state["graph"]
    mine = [type(s).__qualname__ for s in pass_.graph]
    if saved != mine:
        for index, (a, b) in enumerate(itertools.zip_longest(saved, mine)):
            if a != b:
                break
        where = stage_label(pass_.graph[index]) if index < len(pass_.graph) else "(none: the pipe ends here)"
        raise ValueError(
            f"load_state_dict: the state was saved from a pipe of another shape: at stage {index} (graph order, "
            f"the pipe itself first) it has {a or '(none: the saved pipe ends here)'}, this pipe has {where}"
        )
    by_key = {pass_.plan.keys[id(stage)]: stage for stage in pass_.graph}
    unknown = [key for key in stages if key not in by_key]
    if unknown:
        raise ValueError(f"load_state_dict: state['stages'] holds {unknown[0]!r}, and this pipe has no stage by that "
                         f"key (its stages: {', '.join(map(repr, by_key))})")
    replayed = pass_.plan.replayed
    loaded = [(key, stage) for key, stage in by_key.items() if key in stages and id(stage) not in replayed]
    # The streams the states hold, checked together before any is opened again (one reading of an
    # opener's source for all the paths the states name from it: datapipes.iter._readers).
    _held.prepare([(_where(stage, key), stages[key]) for key, stage in loaded], by_key.__getitem__, pass_)
    for key, stage in loaded:
        try:
            saved = _held.thaw(stages[key], by_key.__getitem__)  # streams it holds, opened again
        except _STATE_ERRORS as e:
            raise ValueError(f"load_state_dict: {_where(stage, key)}: {reason(e)}") from e
        with pass_._lock:
            entry = pass_.runs.get(id(stage))
            if entry is None:
                pass_.pending_states[id(stage)] = saved
        if entry is not None:
            _load_into(stage, entry[1], saved, lambda: key)  # noqa: B023 - called at once


#: how many items past the position a state gives are read of a source, looking for an item it names
REPLAY_SLACK = 1 << 20

#: pass -> {id(stage): the keys of the items its source was read to yield}: one reading per resume
_YIELDED: weakref.WeakKeyDictionary[Pass, dict[int, set[Any]]] = weakref.WeakKeyDictionary()


def check_yields(stage: Any, source: Any, wanted: dict[Any, tuple[Any, int, str]], pass_: Pass | None,
                 key: Callable[[Any], Any], doing: str) -> None:
    """Raise ``ValueError`` unless ``source`` yields every item of ``wanted`` (the item's ``key`` ->
    ``(item, its position or -1, where)``: ``where`` names the stage whose state gave it): a resumed
    ``stage`` (an opener, a lister) takes from a state only what its source yields, never a path
    the state alone names (docs/architecture.rst, "The stage protocol").

    ``source`` is read again from its start in a side pass of ``pass_`` (:func:`replayed`), until
    every item has come, or it ends, or :data:`REPLAY_SLACK` items past the furthest position
    times the shards of the pass; what it yielded is kept for the rest of ``pass_`` (one reading
    per resume). ``doing`` says what ``stage`` does with the items (``"open"``, ``"list"``). A
    source that cannot be read again (a one-shot or async iterable) cannot check: ``ValueError``.
    """
    cache: dict[int, set[Any]] = {} if pass_ is None else _YIELDED.setdefault(pass_, {})
    seen = cache.setdefault(id(stage), set())
    missing = {k for k in wanted if k not in seen}
    if not missing:
        return
    label = stage_label(stage)
    item, _, where = wanted[next(iter(missing))]
    for upstream in walk(source):
        traits = traits_of(upstream)
        if traits._one_shot or traits._async:
            invalid(f"the state names {item!r:.100} for {label} to {doing} again, and its source cannot be read "
                    f"again to check that it yields it ({stage_label(upstream)} reads a one-shot or async iterable); "
                    f"give {label} a source that can be iterated again (a list, a file lister)", where)
    furthest = max(n for _, n, _ in wanted.values())
    limit = (max(furthest, 0) + 1) * (1 if pass_ is None else pass_.shard_count()) + REPLAY_SLACK
    count = 0
    try:
        with replayed(source, pass_) as items:
            for x in items:
                count += 1
                k = key(x)
                if k is not None:
                    seen.add(k)
                    missing.discard(k)
                if not missing or count >= limit:
                    break
    except Exception as e:
        e.add_note(f"[datapipes] raised while reading the source of {label} again, to check what a loaded state "
                   f"names for it to {doing}")
        raise
    if missing:
        item, n, where = wanted[next(iter(missing))]
        read = "all its items" if count < limit else f"its first {count} items"
        at = f" (item {n})" if n >= 0 else ""
        invalid(f"the state names {item!r:.200} for {label} to {doing} again{at}, and {label}'s source does not "
                f"yield it (read again from its start: {read}); a resumed {label} takes only what its source "
                f"yields", where)


@contextlib.contextmanager
def replayed(root: Any, like: Pass | None) -> Iterator[Iterator[Any]]:
    """``with replayed(root, like) as items:`` the items of a side pass of ``root`` read from its
    start, for a stage that must know what its source yields (a resumed opener checking the paths
    a state names, datapipes.iter._readers). The side pass takes the seeds ``like`` gave the same
    stages (a pass of the same pipe), every sharding stage in it reads all its items (those of
    every shard), nothing is restored into it and no hook watches it; it is closed when the block
    ends, and the stages' owners and latest statistics are then those before it."""
    side = Pass(root, replay=True, like=like)
    stages = list(side.graph)
    ref = weakref.ref(side)
    with _owners_lock:
        owners = [(stage, _owners.get(stage)) for stage in stages]
        for stage in stages:
            _owners[stage] = ref
    latest = [(stage, _latest.get(stage)) for stage in stages]
    config, _local.config = getattr(_local, "config", None), None  # not the next pass's to take
    it: PassIterator | None = None
    try:
        with side.building():
            side.claim(root)
            it = PassIterator(iter(root), side)
        yield it
    finally:
        _local.config = config
        try:
            if it is not None:
                it.close()
        finally:
            side.ended = True
            with _owners_lock:
                for stage, previous in owners:
                    if previous is None:
                        _owners.pop(stage, None)
                    else:
                        _owners[stage] = previous
            for stage, stats in latest:
                if stats is None:
                    _latest.pop(stage, None)
                else:
                    _latest[stage] = stats


def _starting() -> dict[int, object]:
    """id(stage) -> a token of the outermost ``iter(stage)`` in progress on this thread: a stage's
    ``__iter__`` calling its base class's (``super().__iter__()``) builds one iterator, not two."""
    found: dict[int, object] | None = getattr(_local, "starting", None)
    if found is None:
        found = _local.starting = {}
    return found


#: how a stage's iterator is made in a pass: ``opener(stage, pass_)``
Opener = Callable[[Any, "Pass"], Iterator[Any]]


def _by_open(stage: Any, pass_: Pass) -> Iterator[Any]:
    return stage._open(pass_)  # type: ignore[no-any-return]


def _open_iter(self: Any) -> Iterator[Any]:
    """The ``__iter__`` of every stage of the protocol (a class with ``_open``): a new pass when the
    stage is iterated from outside any pass, else its iterator in the pass being built. Inside a
    torch DataLoader worker it also checks the pipe (:func:`datapipes._runtime.worker.worker_pass`)."""
    if get_worker_info() is not None:
        _worker.worker_pass(self)
    return start(self, _by_open)


#: the ``__iter__`` the base class gives a stage that defines ``_open`` (see :func:`opener_of`)
OPEN_ITER = _open_iter
mark_pass_hooked(OPEN_ITER)


def opener_of(source: Any) -> Opener | None:
    """How ``source``'s iterator is opened with the pass handed to it: for a stage of the protocol
    (its class has ``_open`` and the base class's ``__iter__``, which calls it), ``_open(pass_)``;
    None for anything else (a stage written torch-style, with its own ``__iter__``)."""
    return _by_open if getattr(type(source), "__iter__", None) is OPEN_ITER else None


def adapted(pass_: Pass, source: Any) -> Iterator[Any]:
    """The iterator of ``source``, which is not a stage of the protocol (a stage written torch-style,
    a torch DataPipe, any iterable), in ``pass_``: its ``__iter__`` runs while ``pass_`` is the one
    being built on this thread, so a stage of ours that it iterates in its body joins ``pass_``. The
    one place where a pass is found without being handed (:func:`current`, :func:`owner`)."""
    with pass_.building():
        return iter(source)


def _enter(pass_: Pass, pipe: Any, opener: Opener, watched: bool = True) -> Iterator[Any]:
    """``pipe``'s iterator in ``pass_``, opened by ``opener``: recorded as built by the pass, its
    run saved with the pass if its iterator keeps a state of its own, and (``watched``) wrapped by
    the pass's observer if it has one (the root is wrapped by :func:`start`).

    The outermost opening of ``pipe`` in progress on this thread marks the iterators it builds as
    one (a token in :func:`_starting`): a stage's ``__iter__`` calling its base class's builds one
    iterator, not two, while ``zip(p, p)`` builds two (:meth:`Pass.track`)."""
    starting = _starting()
    key = id(pipe)
    outer = key not in starting
    if outer:
        starting[key] = object()
    try:
        pass_.claim(pipe)
        it = _tracked(pass_, pipe, opener(pipe, pass_))
    finally:
        if outer:
            del starting[key]
    return it if pass_.observer is None or not watched else pass_.observer.wrap(pipe, it)


def start(pipe: Any, opener: Opener, config: PassConfig | None = None) -> Iterator[Any]:
    """``iter(pipe)`` through ``opener`` (the class's ``_open``, or its own ``__iter__``): ``pipe``'s
    iterator in the pass being built on this thread, or in the live pass that contains ``pipe`` (a
    stage written elsewhere iterating its source lazily); otherwise a new pass with ``pipe`` as its
    root, or with ``config``, always a new pass."""
    if config is None:
        config = getattr(_local, "config", None)
        if config is not None:
            _local.config = None  # taken by this pass alone
    within = None
    if config is None:
        within = current()
        if within is None:
            within = owner(pipe)
            if within is not None and within.root is pipe:
                within = None  # the root of a pass iterated again: a new pass
    if within is not None:
        with within.building():
            return _enter(within, pipe, opener)
    pass_ = Pass(pipe, config, pending_observation(), _pending_budget())
    with pass_.building():
        it = _enter(pass_, pipe, opener, watched=False)
    if pass_hooked(getattr(type(it), "__iter__", None)):
        # A pipe that is its own iterator (``__iter__`` returns ``self``, items from ``__next__``, as
        # torch DataPipes allow): read it through ``__next__``; iter() of it would start a new pass.
        it = iter(it.__next__, _NEVER)
    if pass_.observer is not None:
        it = pass_.observer.wrap(pipe, it, root=True)
    return PassIterator(it, pass_)


class budgeted:  # noqa: N801 - used as a context manager, like contextlib's
    """``with budgeted(max_threads, max_memory, max_processes): it = iter(pipe)``: the next pass
    started on this thread inside the block takes this budget too (the loaders' ``max_threads``/
    ``max_memory``, and what a loader's pass hands the passes it runs)."""

    __slots__ = ("limits", "saved")

    def __init__(self, max_threads: int | None = None, max_memory: int | None = None,
                 max_processes: int | None = None) -> None:
        self.limits = (max_threads, max_memory, max_processes)

    def __enter__(self) -> budgeted:
        self.saved = getattr(_local, "budget", None)
        _local.budget = self.limits
        return self

    def __exit__(self, *exc: Any) -> None:
        _local.budget = self.saved


def _pending_budget() -> tuple[int | None, ...] | None:
    limits = getattr(_local, "budget", None)
    if limits is not None:
        _local.budget = None
    return limits  # type: ignore[no-any-return]


_NEVER = object()  # a sentinel no ``__next__`` returns: the pass ends at StopIteration


class _StatefulIterator:
    """The run of a stage written elsewhere whose iterator has ``state_dict``/``load_state_dict``."""

    __slots__ = ("it",)

    def __init__(self, it: Any) -> None:
        self.it = it

    def state(self) -> Any:
        return self.it.state_dict()

    def restore(self, state: Any) -> None:
        self.it.load_state_dict(state)


def _tracked(pass_: Pass, stage: Any, it: Iterator[Any]) -> Iterator[Any]:
    """``it``, the iterator of ``stage`` in ``pass_``; one that keeps a state of its own (the two
    methods ``state_dict()`` and ``load_state_dict(state)``) is saved and restored with the pass."""
    if hasattr(it, "state_dict") and hasattr(it, "load_state_dict") and not isinstance(it, PassIterator):
        pass_.track(stage, _StatefulIterator(it))
    return it
