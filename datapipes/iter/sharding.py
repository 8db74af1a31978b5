"""Sharding: ShardingFilter [sharding_filter], and :func:`apply_sharding` over a whole graph.

A ``sharding_filter()`` marks where a pipe splits into shards: instance ``i`` of ``n`` keeps the
items whose position is ``i`` modulo ``n``, so ``n`` instances together see every item exactly once.

Which shard a pass reads is found at the start of the pass: inside a torch DataLoader worker of a
distributed run, worker ``w`` of ``W`` on rank ``r`` of ``R`` reads shard ``r * W + w`` of ``R * W``
(see :mod:`datapipes._runtime.worker`), so ``torch.utils.data.DataLoader(pipe, num_workers=W)`` on every rank
sees each item exactly once. ``apply_sharding`` (on the stage, or on a whole graph with the module
function) sets the shard explicitly instead, with torch DataPipes' names, sharding groups and
semantics.

>>> from datapipes.iter import IterableWrapper
>>> from datapipes.iter.sharding import apply_sharding
>>> pipe = IterableWrapper(range(10)).sharding_filter().map(lambda x: x * 10)
>>> list(apply_sharding(pipe, 3, 1))
[10, 40, 70]
"""

from __future__ import annotations

import inspect
from enum import IntEnum
import itertools
from itertools import islice
from typing import Any, Iterator, TypeVar, cast

from .._runtime.passes import Pass
from .._runtime.validate import check_dict, check_int, check_list, invalid
from .._engine import close_iterator as _close
from .._engine.lifecycle import STARTED
from .._runtime.worker import capture_rank, is_sharding_stage, placement
from ..datapipe import IterDataPipe, functional_datapipe, require_int, require_pipe, source_len, sources_of, stage_label

__all__ = ["ShardingFilter", "is_sharding_stage"]

T = TypeVar("T")


class SHARDING_PRIORITIES(IntEnum):
    """Sharding groups, as torch's ``SHARDING_PRIORITIES`` (whose members are accepted too).

    When several groups are applied to one ``ShardingFilter`` they combine into one shard id, the
    higher priority varying fastest: with ``DISTRIBUTED`` (rank ``r`` of ``R``) and
    ``MULTIPROCESSING`` (worker ``w`` of ``W``) the shard is ``r * W + w`` of ``R * W``.
    """

    DEFAULT = 1
    DISTRIBUTED = 2
    MULTIPROCESSING = 3


def _group(value: Any, where: str, name: str) -> int:
    """A sharding group: a ``SHARDING_PRIORITIES`` member (torch's members too, given as such or as
    their values), or any other int, a group of the user's own (as torch allows). Groups combine in
    the order of their ints, the highest varying fastest."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{where}: {name} must be a SHARDING_PRIORITIES member or an int (a custom group), "
            f"got {type(value).__name__}: {value!r:.100}"
        )
    try:
        return SHARDING_PRIORITIES(value)
    except ValueError:
        return int(value)  # a custom group


def _group_name(group: int) -> str:
    return group.name if isinstance(group, SHARDING_PRIORITIES) else str(group)


class _DefaultGroupConflict(ValueError, RuntimeError):
    """``apply_sharding`` mixed the ``DEFAULT`` sharding group with other groups on one stage. A
    ``ValueError`` (a bad argument), and a ``RuntimeError`` as torch's."""


def _check_instances(num_of_instances: Any, instance_id: Any, where: str) -> None:
    require_int(num_of_instances, where, "num_of_instances", minimum=1)
    require_int(instance_id, where, "instance_id", minimum=0)
    if instance_id >= num_of_instances:
        raise ValueError(
            f"{where}: instance_id must be < num_of_instances, got instance_id={instance_id} "
            f"with num_of_instances={num_of_instances}"
        )


class _ShardRun:
    """The position of a ``sharding_filter`` pass beside its source's: how many items it has kept
    (counted in C, by the ``itertools.count`` that ``compress`` advances, read when a state is
    taken), and the shard, which a resumed pass must read too. State: a few ints.

    Two more modes serve a :class:`datapipes.DataLoader` resumed with another number of workers or
    ranks (see :mod:`datapipes.loader.shards`):

    - *closed*: the pass takes nothing more from its source; a resumed pass then only yields what
      the stages below it still held when the state was saved (a map's work in flight, a reader's
      rest of a file);
    - *layered*: the pass reads the items that earlier layouts left untaken. ``layers`` lists them,
      oldest first, as ``(num_shards, kept per shard)``: in the stream a layout split (the source's
      items, or for later layers the items the layer before left untaken), shard ``s`` took the
      items at positions ``s, s + n, ...``, its first ``kept[s]``. This pass reads its shard of what
      remains, counting positions as the last layer left them.
    """

    __slots__ = ("label", "shard", "counter", "base", "closed", "layers", "counters")

    def __init__(self, label: str, shard: tuple[int, int]) -> None:
        self.label = label
        self.shard = shard
        self.counter: Any = None  # the running pass's itertools.count (its next value: kept + 1)
        self.base = 0  # items kept before this pass started (a resumed pass)
        self.closed = False
        self.layers: list[tuple[int, list[int]]] = []
        self.counters: list[int] = []  # layered mode: positions counted so far (see _layered)

    @property
    def kept(self) -> int:
        if self.counter is None:
            return self.base
        return int(repr(self.counter)[6:-1]) - 1  # "count(k + 1)"

    @property
    def started(self) -> bool:
        return self.counter is not None

    def state(self) -> dict[str, Any]:
        if self.closed:
            return {"closed": True}
        state: dict[str, Any] = {"shard": list(self.shard), "kept": self.kept}
        if self.layers:
            state["layers"] = [[num, list(kept)] for num, kept in self.layers]
            state["counters"] = list(self.counters)
        return state

    def restore(self, state: dict[str, Any]) -> None:
        if self.started:
            raise RuntimeError(STARTED)
        check_dict(state)
        if "closed" in state:
            if state["closed"] is not True:
                invalid(f"state['closed'] must be True, got {state['closed']!r:.100}")
            self.closed = True
            return
        shard = check_list(state, "shard")
        if len(shard) != 2 or any(type(x) is not int for x in shard) or not 0 <= shard[1] < shard[0]:
            invalid(f"state['shard'] must be [num_of_instances, instance_id], got {shard!r:.100}")
        check_int(state, "kept")
        layers = check_list(state, "layers", default=[])
        for layer in layers:
            if (type(layer) not in (list, tuple) or len(layer) != 2 or type(layer[0]) is not int or layer[0] < 1
                    or type(layer[1]) not in (list, tuple) or len(layer[1]) != layer[0]
                    or any(type(k) is not int or k < 0 for k in layer[1])):
                invalid(f"state['layers'] must hold [num_shards, [kept per shard]] pairs, got {layer!r:.100}")
        counters = check_list(state, "counters", len(layers) + 1, default=[0] * (len(layers) + 1))
        if len(counters) != len(layers) + 1 or any(type(c) is not int or c < 0 for c in counters):
            invalid(f"state['counters'] must be {len(layers) + 1} ints >= 0, got {counters!r:.100}")
        saved = tuple(state["shard"])
        if saved != self.shard:
            raise ValueError(
                f"load_state_dict: {self.label} was saved reading shard {saved[1]} of {saved[0]}, this pass reads "
                f"shard {self.shard[1]} of {self.shard[0]}: a shard's position does not carry over to another's"
            )
        self.base = int(state["kept"])
        self.layers = [(int(num), [int(k) for k in kept]) for num, kept in state.get("layers", ())]
        self.counters = [int(c) for c in state.get("counters", [0] * (len(self.layers) + 1))]


class _ShardIterator(itertools.chain):  # type: ignore[type-arg]
    """A ``sharding_filter``'s iterator: what :func:`_decide` chooses at the first ``next()`` (after
    a state may have been loaded), forwarded in C; ``close()`` closes the source."""

    __slots__ = ("source",)
    source: Iterator[Any]

    def close(self) -> None:
        _close(self.source)


def _decide(it: Iterator[Any], run: _ShardRun) -> Iterator[Iterator[Any]]:
    num, instance = run.shard
    run.counter = itertools.count(run.base + 1)
    if run.closed:
        return
    if run.layers:
        yield itertools.compress(_layered(it, run), run.counter)
    elif num == 1:
        yield itertools.compress(it, run.counter)
    else:  # after k kept items the source stands just past the k-th: the next is num - 1 items on
        yield itertools.compress(islice(it, instance if run.base == 0 else num - 1, None, num), run.counter)


def _layered(it: Iterator[Any], run: _ShardRun) -> Iterator[Any]:
    """The source's items that the layouts in ``run.layers`` left untaken, this shard's share of them.

    ``run.counters[d]`` counts the positions in the stream layout ``d`` split (``d = 0``: the
    source's items; then what layout ``d - 1`` left untaken); the last one counts the positions in
    what the last layout left, which this pass's shard splits.
    """
    num, instance = run.shard
    layers, counters = run.layers, run.counters
    for x in it:
        for depth, (n, kept) in enumerate(layers):
            pos = counters[depth]
            counters[depth] = pos + 1
            if pos // n < kept[pos % n]:
                break  # taken by shard pos % n of that layout
        else:
            pos = counters[-1]
            counters[-1] = pos + 1
            if pos % num == instance:
                yield x


@functional_datapipe("sharding_filter")
class ShardingFilter(IterDataPipe[T]):
    """Keep one shard of the items: those whose position is ``instance_id`` modulo
    ``num_of_instances`` (functional name: ``sharding_filter``).

    The shard is decided at the start of each pass. Unless ``apply_sharding`` was called, it is
    found from where the pass runs: DataLoader worker ``w`` of ``W``
    (``torch.utils.data.get_worker_info()``) on distributed rank ``r`` of ``R`` (``torch.distributed``
    when initialised, else the ``RANK``/``WORLD_SIZE`` environment variables when both are set) reads
    shard ``r * W + w`` of ``R * W``; in a plain process there is one shard and every item passes.
    Groups set with ``apply_sharding`` replace the discovered ones.

    Args:
        source_datapipe: the source pipe.
        sharding_group_filter: count only this sharding group (a ``SHARDING_PRIORITIES`` member;
            found by itself, ``DISTRIBUTED`` is the rank and ``MULTIPROCESSING`` the worker; or any
            other int, a custom group that only ``apply_sharding`` sets); ``None`` (default):
            combine every group.

    Yields:
        The items of this instance's shard, in source order. The ``num_of_instances`` shards
        partition the source: every item is in exactly one, provided every instance reads the
        source in the same order.

    Raises:
        RuntimeError: at the start of a pass over several distributed ranks found by itself, when a
            random stage upstream (a shuffle) has no seed the ranks share: call ``set_seed`` with the
            same seed on every rank, or iterate with ``datapipes.DataLoader``.
        ValueError: ``RANK``/``WORLD_SIZE`` are set but not valid.

    Seeds: random stages upstream of a sharded pass draw the same order in every shard. Unseeded
    ones get a seed shared by the workers of a DataLoader (derived from its base seed, new each
    epoch) or agreed by ``datapipes.DataLoader``; seeded ones keep their seed. Inside a DataLoader
    worker each new pass counts as the next epoch, so persistent workers reshuffle too. Stages
    downstream keep per-worker draws. See :mod:`datapipes._runtime.worker`.

    ``len()`` is the shard's length, from the source's length and the shard at call time:
    ``n // num_of_instances`` plus one for the first ``n % num_of_instances`` instances.

    Checkpoint: a state records the shard and how many items the pass kept (a few ints); loading it
    into a pass that reads another shard raises ``ValueError``. :class:`datapipes.DataLoader` also
    uses it to split what is left of a pass among another number of workers or ranks (see
    :mod:`datapipes.loader.shards`).

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> pipe = IterableWrapper(range(10)).sharding_filter()
        >>> pipe.apply_sharding(4, 1)
        >>> list(pipe), len(pipe)
        ([1, 5, 9], 3)

    See also: :func:`apply_sharding` to shard every ``sharding_filter`` of a graph.
    """

    _saves = (
        "the shard and how many items it kept (three ints; after a resume with another number of workers or "
        "ranks, a few ints per earlier layout)"
    )

    #: (seed, epoch) agreed across ranks by datapipes.DataLoader (see _worker.set_loader_seed)
    _loader_seed: tuple[int, int] | None = None
    #: (rank, world_size) of the process group seen where the pipe was pickled (for spawned workers)
    _captured_rank: tuple[int, int] | None = None

    def __init__(self, source_datapipe: IterDataPipe[T], sharding_group_filter: Any = None) -> None:
        require_pipe(source_datapipe, "ShardingFilter", "source_datapipe")
        if sharding_group_filter is not None:
            sharding_group_filter = _group(sharding_group_filter, "ShardingFilter", "sharding_group_filter")
        self.source_datapipe = source_datapipe
        self.sharding_group_filter = sharding_group_filter
        #: sharding group (a SHARDING_PRIORITIES member or a custom int) -> (num_of_instances,
        #: instance_id), as set by apply_sharding
        self.groups: dict[int, tuple[int, int]] = {}

    def apply_sharding(
        self,
        num_of_instances: int,
        instance_id: int,
        sharding_group: int = SHARDING_PRIORITIES.DEFAULT,
    ) -> None:
        """Read shard ``instance_id`` of ``num_of_instances`` in ``sharding_group`` from the next pass,
        instead of the shard found from the DataLoader worker and distributed rank.

        ``sharding_group`` is a ``SHARDING_PRIORITIES`` member or any other int (a custom group, as
        torch allows); the groups applied combine into one shard, the highest int varying fastest,
        and a ``sharding_group_filter`` counts only its own group.

        Raises:
            TypeError / ValueError: ``num_of_instances`` is not an int >= 1, ``instance_id`` not an
                int in ``[0, num_of_instances)``, or ``sharding_group`` not an int.
            ValueError: ``DEFAULT`` mixed with other groups on this stage, as torch forbids (the
                error is also a ``RuntimeError``, torch's type).
        """
        where = f"{type(self).__name__}.apply_sharding"
        _check_instances(num_of_instances, instance_id, where)
        group = _group(sharding_group, where, "sharding_group")
        others = set(self.groups) - {group}
        if others and (group == SHARDING_PRIORITIES.DEFAULT or SHARDING_PRIORITIES.DEFAULT in others):
            raise _DefaultGroupConflict(
                f"{where}: cannot mix the DEFAULT sharding group with other groups "
                f"(applied: {', '.join(_group_name(g) for g in sorted(self.groups))}; now {_group_name(group)})"
            )
        self.groups[group] = (num_of_instances, instance_id)

    def _found_groups(self) -> dict[int, tuple[int, int]]:
        """The groups of the place the code runs: the distributed rank and the DataLoader worker."""
        where = placement(self._captured_rank)
        return {
            SHARDING_PRIORITIES.DISTRIBUTED: (where.world_size, where.rank),
            SHARDING_PRIORITIES.MULTIPROCESSING: (where.num_workers, where.worker_id),
        }

    def _combine(self, groups: dict[int, tuple[int, int]]) -> tuple[int, int]:
        # Higher priority varies fastest, as torch does: rank r of R, worker w of W -> r * W + w.
        num, instance = 1, 0
        wanted = self.sharding_group_filter
        for group in sorted(groups, reverse=True):
            if wanted is None or group == wanted:
                group_num, group_id = groups[group]
                instance += num * group_id
                num *= group_num
        return num, instance

    def _shard(self) -> tuple[int, int]:
        """``(num_of_instances, instance_id)`` for a pass starting now: the groups set by
        ``apply_sharding``, or else those found from the DataLoader worker and the distributed rank.
        ``len()`` and the properties ask it; a pass asks its :class:`~datapipes._runtime.passes.Pass`, which
        decided the same way when it started (and also shared the upstream seeds)."""
        return self._combine(self.groups or self._found_groups())

    def _pass_shard(self, placed: tuple[int, int] | None = None) -> tuple[int, int]:
        """What a pass asks when it starts: :meth:`_shard`, or ``placed`` (a loader running a pass on
        behalf of the shard it names) unless the shard is set (``apply_sharding``) or filtered."""
        if placed is None or self.groups or self.sharding_group_filter is not None:
            return self._shard()
        return placed

    def _pass_ranks(self) -> int:
        """How many distributed ranks a pass starting now spans, as this stage counts them: those
        found by itself (not set by ``apply_sharding``) and counted by its group filter."""
        if self.groups or self.sharding_group_filter not in (None, SHARDING_PRIORITIES.DISTRIBUTED):
            return 1
        return placement(self._captured_rank).world_size

    @property
    def num_of_instances(self) -> int:
        """The number of shards a pass starting now splits the source into."""
        return self._shard()[0]

    @property
    def instance_id(self) -> int:
        """The shard a pass starting now reads."""
        return self._shard()[1]

    def _open(self, ctx: Pass) -> Iterator[T]:
        shard = ctx.shard_for(self)
        it = ctx.open(self.source_datapipe)
        run = _ShardRun(stage_label(self), shard)
        ctx.track(self, run)
        # from_iterable builds the subclass it is called on (typeshed types it as a plain chain)
        chosen = cast(_ShardIterator, _ShardIterator.from_iterable(_decide(it, run)))
        chosen.source = it
        return chosen

    def __len__(self) -> int:
        n = source_len(self, self.source_datapipe, "source_datapipe")
        num, instance = self._shard()
        return n // num + (1 if instance < n % num else 0)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        captured = capture_rank()
        if captured is not None:
            state["_captured_rank"] = captured  # a spawned DataLoader worker is not in the group
        return state


def apply_sharding(
    datapipe: Any,
    num_of_instances: int,
    instance_id: int,
    sharding_group: int = SHARDING_PRIORITIES.DEFAULT,
) -> Any:
    """Call ``apply_sharding(num_of_instances, instance_id, sharding_group)`` on every sharding
    stage of ``datapipe``'s graph (every stage with an ``apply_sharding`` method, such as
    :class:`ShardingFilter`); returns ``datapipe``. As ``torch.utils.data.graph_settings.apply_sharding``.

    Args:
        datapipe: the pipe whose graph is walked (the pipe and everything upstream of it).
        num_of_instances: the number of shards, an int >= 1.
        instance_id: the shard to read, an int in ``[0, num_of_instances)``.
        sharding_group: the sharding group: a ``SHARDING_PRIORITIES`` member (default
            ``DEFAULT``) or any other int, a custom group (as torch allows).

    Raises:
        TypeError / ValueError: bad arguments.
        RuntimeError: two sharding stages on one path of the graph (one upstream of the other),
            which would shard twice and lose data (torch's type and phrase). Nothing is applied
            then.

    A graph without a sharding stage is returned unchanged.

    >>> from datapipes.iter import IterableWrapper
    >>> pipe = IterableWrapper(range(6)).sharding_filter()
    >>> list(apply_sharding(pipe, 2, 0))
    [0, 2, 4]
    """
    where = "apply_sharding"
    _check_instances(num_of_instances, instance_id, where)
    group = _group(sharding_group, where, "sharding_group")
    # Walk every path from the pipe to its sources, remembering the sharding stage above.
    found: dict[int, Any] = {}
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[Any, Any]] = [(datapipe, None)]
    while stack:
        stage, above = stack.pop()
        key = (id(stage), id(above))
        if key in seen:
            continue
        seen.add(key)
        if is_sharding_stage(stage):
            if above is not None:  # torch's type and phrase
                raise RuntimeError(
                    f"{where}: Sharding twice on a single pipeline is likely unintended and will cause data loss. "
                    f"Sharding already applied to {stage!r} while trying to apply to {above!r}"
                )
            found[id(stage)] = stage
            above = stage
        stack.extend((src, above) for src in sources_of(stage))
    for stage in found.values():
        if len(inspect.signature(stage.apply_sharding).parameters) < 3:
            stage.apply_sharding(num_of_instances, instance_id)
        else:
            stage.apply_sharding(num_of_instances, instance_id, sharding_group=group)
    return datapipe
