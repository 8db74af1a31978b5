"""Every trait a stage declares to the pass runtime, in one place (:class:`Traits`).

Both pipe base classes derive from :class:`Traits` (through :class:`datapipes.graph.Node`), so each
trait below is a plain attribute of every stage of the package, with its default. A stage
overrides one in its class body (``_is_random = True``) or, where it depends on the stage's
arguments, in ``__init__`` (``self._stateless = limit is None``). The runtime reads them when a
pass is built or a state is taken, never per item, by plain attribute access; an object that may
not be one of ours (a torch DataPipe in ``graph_settings``, a dataset handed to a loader) is read
through :func:`traits_of`.

A stage written outside the package declares one more, public, trait: ``stateless = True`` (or
``@datapipes.stateless``), read by :func:`declares_stateless`; the package's own ``_stateless`` is
honoured only for the package's stages (``_runtime.passes._stateless``).

``tests/test_layers.py`` checks that nothing reads a trait by name (``getattr(stage, "_trait", ...)``)
outside this module, and that no stage class sets a name one slip off a trait's (``_is_randon``).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, cast

__all__ = ["TRAITS", "Traits", "declares_stateless", "mark_pass_hooked", "pass_hooked", "traits_of"]


class Traits:
    """The traits of a stage, with their defaults, and what the runtime does with each."""

    # -- seeds ----------------------------------------------------------------------------------------
    #: draws random numbers: ``set_seed``/``set_epoch`` and torch's ``apply_random_seed`` reach it, and
    #: the pass gives it a seed (``Pass.seed_for``, through ``_pass_seed()``).
    _is_random: bool = False
    #: the seed ``set_seed`` recorded on this random stage; None: the pass derives or draws one.
    _seed: int | None = None
    #: the epoch ``set_epoch`` recorded on this random stage, derived into its seed by each pass.
    _epoch: int = 0

    # -- what a pass saves ----------------------------------------------------------------------------
    #: the package's stage has no position of its own (its position is its sources'): a pass that
    #: built it and holds no run of it saves nothing for it instead of refusing ``state_dict()``.
    _stateless: bool = False
    #: resuming replays its sources from their start (a ``Sampler`` replays its sampler): the stages
    #: upstream of it are neither saved nor restored.
    _replays_sources: bool = False
    #: reads a one-shot iterable (an iterator, a generator): a pass run again gives other items, so
    #: ``loader.shards.redistribute`` refuses a pipe with such a stage above its ``sharding_filter``.
    _one_shot: bool = False
    #: runs on the event loop (an async iterable or an async ``fn``): treated as ``_one_shot`` there.
    _async: bool = False

    # -- how a pass builds its sources ----------------------------------------------------------------
    #: runs its sources in other processes (the loader's worker stage), whose passes are their own:
    #: the pass's graph, its seeds and its state stop at this stage.
    _runs_sources_elsewhere: bool = False
    #: builds its sources' iterators later than its own (a thread, a cycle, a hub), under the pass:
    #: ``passes.unbuilt`` does not take it for a stage that iterates them outside the pass.
    _builds_sources_later: bool = False

    def _sources(self) -> list[Any] | None:
        """This stage's sources where they live elsewhere than its attributes (a fork child's hub);
        None: :func:`datapipes.graph.sources_of` finds them by scanning its attributes."""
        return None

    def _pass_forgotten(self, pass_: Any) -> None:
        """``pass_`` is about to iterate this stage anew (``cycle``'s next round, ``Pass.forget``): a
        stage sharing state across the iterators of a pass (a fork hub) drops what it holds of it."""

    # -- sharding -------------------------------------------------------------------------------------
    def _pass_shard(self, placed: tuple[int, int] | None = None) -> tuple[int, int] | None:
        """``(num_of_instances, instance_id)`` of this sharding stage in a pass starting now
        (``placed``: the shard a loader runs the pass for); None: the pass decides no shard for it
        (not a sharding stage, or one written elsewhere)."""
        return None

    def _pass_ranks(self) -> int:
        """How many distributed ranks a pass of this sharding stage spans (more than one: the random
        stages upstream of it must have a seed the ranks share)."""
        return 1

    #: ``(seed, epoch)`` the loader agreed across ranks for the random stages upstream of this
    #: sharding stage (``_runtime.worker.set_loader_seed``); None: none agreed.
    _loader_seed: tuple[int, int] | None = None

    # -- budgets, hooks, statistics -------------------------------------------------------------------
    def _thread_demand(self) -> int | str | None:
        """What this stage asks of the pass's thread budget: its fixed concurrency, ``"auto"``, or
        None (no worker threads of its own)."""
        return None

    #: ``(max_threads, max_memory, max_processes)`` set by ``set_budget``; a pass takes the tightest
    #: of its graph's.
    _budget: tuple[int | None, ...] = (None, None, None)
    #: ``(hook, stage_only)`` pairs attached by ``add_hook``; a pass with any is observed.
    _hooks: tuple[tuple[Any, bool], ...] = ()
    #: added by a loader to run its pipe, changing no item: left out of the pipe's repr and of the
    #: statistics the hooks and the loader report.
    _unseen: bool = False

    # -- map-style reading ----------------------------------------------------------------------------
    def _index_ordered(self) -> bool:
        """Whether iterating this pipe yields ``self[0], self[1], ...`` in that order (a loader then
        shards its indices). By default: when its class has no ``__iter__`` (Python then reads it by
        index); ``MapDataPipe`` says when its ``__iter__`` keeps that order."""
        return not hasattr(type(self), "__iter__")


#: The names of every trait :class:`Traits` declares.
TRAITS: frozenset[str] = frozenset(
    name for name in Traits.__dict__ if name.startswith("_") and not name.startswith("__"))


class _Foreign:
    """The traits of an object that is not one of the package's stages: those it defines itself,
    else the defaults of :class:`Traits` (methods bound to the object)."""

    __slots__ = ("_of",)

    def __init__(self, of: Any) -> None:
        self._of = of

    def __getattr__(self, name: str) -> Any:
        if name not in TRAITS:
            raise AttributeError(f"{name!r} is not a stage trait (datapipes._runtime.traits.Traits)")
        own = getattr(self._of, name, _MISSING)
        if own is not _MISSING:
            return own
        default = Traits.__dict__[name]
        return default.__get__(self._of) if inspect.isfunction(default) else default


_MISSING = object()


def traits_of(stage: Any) -> Traits:
    """The traits of ``stage``: the stage itself when it is one of ours, else what it declares of
    them, with the defaults for the rest."""
    return stage if isinstance(stage, Traits) else cast(Traits, _Foreign(stage))


def declares_stateless(stage: Any) -> bool:
    """Whether the class of ``stage`` declares it stateless (``stateless = True``, or
    ``@datapipes.stateless``): how a stage written outside the package says so."""
    return getattr(type(stage), "stateless", False) is True


# -- the mark of an ``__iter__`` that starts or joins a pass ------------------------------------------
# On the function itself (not in a registry), so that it travels with a class pickled by value.

def mark_pass_hooked(fn: Callable[..., Any]) -> None:
    """Mark ``fn`` (the wrapper ``datapipe._hook_pass`` makes of a class's ``__iter__``) as one that
    starts or joins a pass."""
    fn._pass_hooked = True  # type: ignore[attr-defined]


def pass_hooked(fn: Any) -> bool:
    """Whether ``fn`` (a class's ``__iter__``, or None) starts or joins a pass: iterable-style
    stages' do; map-style stages are read by index, outside passes."""
    return bool(getattr(fn, "_pass_hooked", False))
