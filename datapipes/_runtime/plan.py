"""The plan of one pass: one walk of the pipe graph, read by everything a pass decides.

:class:`Plan` walks ``root``'s graph once (each stage's sources asked once, through
:func:`datapipes.graph.sources_of`) and keeps what seeds, sharding, save and restore read:

- ``graph``: the stages a pass runs, in graph order (the root first, then depth-first through the
  sources), less what lies upstream of a stage that runs its sources in other processes
  (``_runs_sources_elsewhere``: the DataLoader's worker stage, whose workers start passes of their
  own);
- ``keys``: each stage's key in a pass state (``"<index>:<class>"``, :func:`stage_key`);
- ``random`` and ``sharding``: the random and the sharding stages, in graph order;
- ``below_sharding``: the stages at or downstream of a sharding stage (their seeds derive from the
  shard in a loader's pass);
- ``replayed``: the stages upstream of one that replays its sources from their start when it
  resumes (``_replays_sources``): their positions are neither saved nor restored;
- :meth:`upstream_random`: the random stages upstream of a sharding stage, in the order their
  shared seeds are numbered.

Nothing here writes onto a stage; the pass (:mod:`datapipes._runtime.passes`) decides from the plan.
"""

from __future__ import annotations

from typing import Any, Iterator

from ..graph import sources_of, walk
from .worker import is_sharding_stage

__all__ = ["Plan", "stage_key"]


def stage_key(index: int, stage: Any) -> str:
    """The key of the stage at ``index`` (graph order) in a pass state's ``stages``."""
    return f"{index}:{type(stage).__qualname__}"


def _elsewhere(stage: Any) -> bool:
    return bool(stage._runs_sources_elsewhere)


class Plan:
    """One walk of ``root``'s graph (see the module's docstring)."""

    __slots__ = ("root", "graph", "random", "sharding", "_sources", "_keys", "_below", "_replayed")

    def __init__(self, root: Any) -> None:
        self.root = root
        # The one walk: every stage reachable from the root (also behind a stage that runs its
        # sources elsewhere: what lies there decides which stages are downstream of sharding), each
        # with its sources.
        self._sources: dict[int, list[Any]] = {}
        stack = [root]
        while stack:
            stage = stack.pop()
            if id(stage) in self._sources:
                continue
            found = self._sources[id(stage)] = list(sources_of(stage))
            stack.extend(found)
        self.graph: list[Any] = list(self.walk(root))
        self.random: list[Any] = [s for s in self.graph if s._is_random]
        self.sharding: list[Any] = [s for s in self.graph if is_sharding_stage(s)]
        # read by some passes only (a loader's, a saved or restored one): made at the first reading
        self._keys: dict[int, str] | None = None
        self._below: frozenset[int] | None = None
        self._replayed: frozenset[int] | None = None

    @property
    def keys(self) -> dict[int, str]:
        """``id(stage) -> its key`` in a pass state, for every stage of the graph."""
        if self._keys is None:
            self._keys = {id(stage): stage_key(i, stage) for i, stage in enumerate(self.graph)}
        return self._keys

    @property
    def below_sharding(self) -> frozenset[int]:
        """The ids of the stages at or downstream of a sharding stage."""
        if self._below is None:
            self._below = self._find_below_sharding() if self.sharding or self._elsewhere_below() else frozenset()
        return self._below

    @property
    def replayed(self) -> frozenset[int]:
        """The ids of the stages upstream of one that replays its sources when it resumes."""
        if self._replayed is None:
            self._replayed = self._find_replayed()
        return self._replayed

    def sources(self, stage: Any) -> list[Any]:
        """The sources of ``stage`` (a stage of the plan), as the walk found them."""
        found = self._sources.get(id(stage))
        return list(sources_of(stage)) if found is None else found

    def walk(self, start: Any) -> Iterator[Any]:
        """The stages a pass of ``start`` runs, in graph order: ``start`` first, then depth-first
        through the sources, not past a stage that runs its sources elsewhere (what
        :func:`datapipes.graph.walk` with that stop gives, read from the plan)."""
        return walk(start, stop=_elsewhere, sources=self.sources)

    def _elsewhere_below(self) -> bool:
        """Whether the walk saw stages the pass does not run (behind a stage that runs its sources
        elsewhere): a sharding stage there makes the stages downstream of it count too."""
        return len(self._sources) > len(self.graph)

    def _find_below_sharding(self) -> frozenset[int]:
        root = self.root
        below: set[int] = set()
        done: set[int] = set()
        # data-flow order (sources first), as datapipes.graph.stages gives it, without recursion
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            stage, expanded = stack.pop()
            if expanded:
                if is_sharding_stage(stage) or any(id(s) in below for s in self.sources(stage)):
                    below.add(id(stage))
                continue
            if id(stage) in done:
                continue
            done.add(id(stage))
            stack.append((stage, True))
            stack.extend((s, False) for s in reversed(self.sources(stage)))
        return frozenset(below)

    def _find_replayed(self) -> frozenset[int]:
        out: set[int] = set()
        for stage in self.graph:
            if stage._replays_sources:
                stack = list(self.sources(stage))
                while stack:
                    upstream = stack.pop()
                    if id(upstream) not in out:
                        out.add(id(upstream))
                        stack.extend(self.sources(upstream))
        return frozenset(out)

    def upstream_random(self, stage: Any) -> list[Any]:
        """The random stages upstream of ``stage`` (a sharding stage), each once, in the order of its
        sources and, within each, graph order: stage ``j`` of this list gets the ``j``-th shared seed."""
        found = [s for src in self.sources(stage) for s in self.walk(src) if s._is_random]
        return list(dict.fromkeys(found))

    def key_of(self, stage: Any) -> str:
        """The key of ``stage``'s state in a pass state (``"-1:<class>"`` for one not in the plan)."""
        key = self.keys.get(id(stage))
        return stage_key(-1, stage) if key is None else key
