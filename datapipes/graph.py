"""Walking a pipe's graph: its stages, a one-line chain, a text description and a Mermaid diagram.

>>> from datapipes.iter import IterableWrapper
>>> a = IterableWrapper([1, 2]).map(str)
>>> b = IterableWrapper([3])
>>> pipe = a.concat(b).batch(2)
>>> pipe
Concater[IterableWrapper -> Mapper(str) | IterableWrapper] -> Batcher(2)
>>> [type(s).__name__ for s in traverse(pipe)]
['Batcher', 'Concater', 'Mapper', 'IterableWrapper', 'IterableWrapper']
>>> print(to_mermaid(pipe))
flowchart LR
    s0["IterableWrapper"] --> s1["Mapper(str)"]
    s1 --> s3["Concater"]
    s2["IterableWrapper"] --> s3
    s3 --> s4["Batcher(2)"]
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterator

from ._redact import redact
from ._runtime.traits import Traits, traits_of

__all__ = ["Node", "walk", "traverse", "traverse_dps", "get_all_graph_pipes", "stages", "chain_repr", "describe",
           "to_mermaid", "sources_of", "stage_label"]


class Node(Traits):
    """What makes an object a stage of a pipe graph: the base of both pipe base classes, with the
    traits every stage declares to the pass runtime (:class:`~datapipes._runtime.traits.Traits`).

    This module sits below the base classes (it imports none of them), so it recognises stages by
    this marker alone.
    """

    __slots__ = ()

    #: Attributes shown in a stage's label, e.g. ``("batch_size",)`` gives ``Batcher(32)``.
    _repr_fields: tuple[str, ...] = ()


def stage_label(pipe: Any) -> str:
    """A stage's short label: its class name and its main arguments, e.g. ``Batcher(32)``."""
    args = []
    for field in pipe._repr_fields:
        value = getattr(pipe, field, None)
        if callable(value):
            name = getattr(value, "__qualname__", None) or ""
            if not name or "<locals>" in name:
                name = getattr(value, "__name__", None) or type(value).__name__
            args.append(name)
        else:
            args.append(repr(value))
    if not args:
        return type(pipe).__name__
    # an argument may be a URL with its credentials or signature: labels reach reprs, errors and profiles
    return redact(f"{type(pipe).__name__}({', '.join(args)})")


def sources_of(pipe: Any) -> list[Any]:
    """The pipes ``pipe`` reads from, in the order of its constructor's parameters.

    Found by scanning the pipe's attributes (pipes, or lists/tuples of pipes); a class whose sources
    live elsewhere says so (``_sources()``, a stage trait). The order is the constructor's, not the
    order in which ``__init__`` happens to assign the attributes: it fixes each stage's place in the
    graph, hence its state key and its seed (docs/architecture.rst, "The stage protocol"), which
    must not move when two assignments are swapped.
    """
    custom = traits_of(pipe)._sources()
    if custom is not None:
        return list(custom)
    found: list[tuple[tuple[int, str], list[Any]]] = []
    rank = _parameter_ranks(type(pipe))
    for name, value in vars(pipe).items():
        if isinstance(value, Node):
            found.append(((rank.get(name, len(rank)), name), [value]))
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], Node):
            # a list of pipes (concat, zip, mux inputs); a list of data (a source's items, however
            # long) is not scanned: its first element tells
            found.append(((rank.get(name, len(rank)), name), [v for v in value if isinstance(v, Node)]))
    found.sort(key=lambda entry: entry[0])
    return [source for _, sources in found for source in sources]


_RANKS: dict[type, dict[str, int]] = {}


def _parameter_ranks(cls: type) -> dict[str, int]:
    """Attribute name -> its rank among ``cls``'s constructor parameters (the names a source is
    stored under: ``datapipe``, ``source_datapipe`` and ``datapipes`` read as the first parameter,
    which is where every stage takes its source). Attributes that are no parameter sort after, by
    name. Computed once per class."""
    ranks = _RANKS.get(cls)
    if ranks is None:
        try:
            init = cls.__init__  # type: ignore[misc]  # the class's own constructor, read once
            names = [n for n in inspect.signature(init).parameters if n != "self"]
        except (TypeError, ValueError):  # a constructor without a readable signature
            names = []
        ranks = {name: i for i, name in enumerate(names)}
        if names:
            for alias in ("datapipe", "source_datapipe", "datapipes", "source_datapipes"):
                ranks.setdefault(alias, -1)
        _RANKS[cls] = ranks
    return ranks


def walk(pipe: Any, stop: Callable[[Any], bool] | None = None,
         sources: Callable[[Any], list[Any]] | None = None) -> Iterator[Any]:
    """Every stage of ``pipe``'s graph once, the pipe first, then depth-first through its sources;
    the sources of a stage for which ``stop(stage)`` is true are not visited (unless another path
    reaches them). ``sources``: how a stage's sources are found (default :func:`sources_of`; a
    pass's plan reads the ones it found once)."""
    found = sources_of if sources is None else sources
    seen: set[int] = set()
    stack = [pipe]
    while stack:
        stage = stack.pop()
        if id(stage) in seen:
            continue
        seen.add(id(stage))
        yield stage
        if stop is None or not stop(stage):
            stack.extend(reversed(found(stage)))


def traverse(pipe: Any) -> Iterator[Any]:
    """Every stage of ``pipe``'s graph once, the pipe first, then depth-first through its sources."""
    return walk(pipe)


def traverse_dps(datapipe: Any) -> dict[int, tuple[Any, Any]]:
    """The graph of ``datapipe`` as torch's ``torch.utils.data.graph.traverse_dps`` gives it: a nested
    dict ``{id(pipe): (pipe, {id(source): (source, {...}), ...})}``, the pipe at the top. A stage
    reached twice on one path (a cycle) appears once, with no sources below it; one shared by
    several paths appears under each.

    Raises:
        RuntimeError: ``datapipe`` is not a pipe (torch's type and phrase: "Expected `IterDataPipe`
            or `MapDataPipe`").

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper(range(3)).map(abs)
        >>> [(type(p).__name__, len(sub)) for p, sub in traverse_dps(pipe).values()]
        [('Mapper', 1)]
    """
    return _traverse_dps(datapipe, set())


def _traverse_dps(pipe: Any, path: set[int]) -> dict[int, tuple[Any, Any]]:
    if not _is_pipe(pipe):
        raise RuntimeError(f"Expected `IterDataPipe` or `MapDataPipe`, but {type(pipe)} is found")
    if id(pipe) in path:
        return {}
    below: dict[int, tuple[Any, Any]] = {}
    for source in sources_of(pipe):
        below.update(_traverse_dps(source, path | {id(pipe)}))
    return {id(pipe): (pipe, below)}


def _is_pipe(pipe: Any) -> bool:
    return any(k.__name__ in ("IterDataPipe", "MapDataPipe") for k in type(pipe).__mro__)


def get_all_graph_pipes(graph: dict[int, tuple[Any, Any]]) -> list[Any]:
    """Every pipe of a graph from :func:`traverse_dps`, each once, the top first (as torch's
    ``torch.utils.data.graph_settings.get_all_graph_pipes``)."""
    found: dict[int, Any] = {}

    def visit(node: dict[int, tuple[Any, Any]]) -> None:
        for key, (pipe, below) in node.items():
            found.setdefault(key, pipe)
            visit(below)

    visit(graph)
    return list(found.values())


def stages(pipe: Any) -> list[Any]:
    """The stages of ``pipe``'s graph in data-flow order (sources first, ``pipe`` last)."""
    order: list[Any] = []
    seen: set[int] = set()

    def visit(stage: Any) -> None:
        if id(stage) in seen:
            return
        seen.add(id(stage))
        for src in sources_of(stage):
            visit(src)
        order.append(stage)

    # Iterative deepening would avoid recursion limits, but graphs are tens of stages deep at most.
    visit(pipe)
    return order


def chain_repr(pipe: Any) -> str:
    """``IterableWrapper -> Mapper(f) -> Batcher(32)``; stages with several sources show them in
    brackets separated by ``|``. A stage marked ``_unseen`` (one the DataLoader adds to run its pipe,
    which changes no item) is left out."""
    srcs = sources_of(pipe)
    label = stage_label(pipe)
    if not srcs:
        return label
    if len(srcs) == 1 and traits_of(pipe)._unseen:
        return chain_repr(srcs[0])
    if len(srcs) == 1:
        return f"{chain_repr(srcs[0])} -> {label}"
    name = type(pipe).__name__
    inner = " | ".join(chain_repr(s) for s in srcs)
    rest = label[len(name):]
    return f"{name}{rest}[{inner}]"


def describe(pipe: Any) -> str:
    """A multi-line text view of the graph, one stage a line, sources indented under their consumer.

    >>> from datapipes.iter import IterableWrapper
    >>> print(describe(IterableWrapper(range(4)).map(abs).batch(2)))
    Batcher(2)
    └── Mapper(abs)
        └── IterableWrapper
    """
    lines: list[str] = []

    def walk(stage: Any, prefix: str, last: bool, root: bool, seen: frozenset[int]) -> None:
        branch = "" if root else ("└── " if last else "├── ")
        again = " (shared, shown above)" if id(stage) in seen else ""
        lines.append(f"{prefix}{branch}{stage_label(stage)}{again}")
        if again:
            return
        srcs = sources_of(stage)
        child_prefix = prefix if root else prefix + ("    " if last else "│   ")
        for i, src in enumerate(srcs):
            walk(src, child_prefix, i == len(srcs) - 1, False, seen | {id(stage)})

    walk(pipe, "", True, True, frozenset())
    return "\n".join(lines)


def to_mermaid(pipe: Any, annotate: Callable[[Any], str | None] | None = None) -> str:
    """A Mermaid ``flowchart LR`` of the graph: one node per stage, an edge per source.

    Args:
        pipe: the pipe whose graph is drawn.
        annotate: called with each stage; a string it returns is shown under the stage's label
            (a second line of the node), None leaves the node as it is.

    The nodes are named ``s0``, ``s1``, ... in the order of :func:`stages` (sources first), so lines
    added after the chart can refer to them (``class s1 slow``).

    >>> from datapipes.iter import IterableWrapper
    >>> print(to_mermaid(IterableWrapper([1]).map(abs), annotate=lambda s: type(s).__name__.lower()))
    flowchart LR
        s0["IterableWrapper<br/>iterablewrapper"] --> s1["Mapper(abs)<br/>mapper"]
    """
    order = stages(pipe)
    ids = {id(s): f"s{i}" for i, s in enumerate(order)}
    lines = ["flowchart LR"]
    declared: set[int] = set()

    def node(stage: Any) -> str:
        sid = ids[id(stage)]
        if id(stage) in declared:
            return sid
        declared.add(id(stage))
        label = stage_label(stage)
        note = annotate(stage) if annotate is not None else None
        if note is not None:
            label = f"{label}<br/>{note}"
        label = label.replace('"', "'")
        return f'{sid}["{label}"]'

    for stage in order:
        for src in sources_of(stage):
            lines.append(f"    {node(src)} --> {node(stage)}")
    if len(lines) == 1:
        lines.append(f"    {node(pipe)}")
    return "\n".join(lines)
