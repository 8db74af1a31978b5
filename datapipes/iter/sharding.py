"""Sharding: ShardingFilter [sharding_filter], and :func:`apply_sharding` over a whole graph.

A ``sharding_filter()`` marks where a pipe splits into shards: instance ``i`` of ``n`` keeps the
items whose position is ``i`` modulo ``n``, so ``n`` instances together see every item exactly once.
Which shard a pass reads is set explicitly with ``apply_sharding`` (on the stage, or on a whole graph
with the module function), with torch DataPipes' names, sharding groups and semantics.

>>> from datapipes.iter import IterableWrapper
>>> from datapipes.iter.sharding import apply_sharding
>>> pipe = IterableWrapper(range(10)).sharding_filter().map(lambda x: x * 10)
>>> list(apply_sharding(pipe, 3, 1))
[10, 40, 70]
"""

from __future__ import annotations

import inspect
from enum import IntEnum
from itertools import islice
from typing import Any, Iterator, TypeVar

from ..datapipe import IterDataPipe, functional_datapipe, require_int, require_pipe, sources_of

__all__ = ["ShardingFilter"]

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


def _group(value: Any, where: str, name: str) -> SHARDING_PRIORITIES:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where}: {name} must be a SHARDING_PRIORITIES member, got {type(value).__name__}")
    try:
        return SHARDING_PRIORITIES(value)
    except ValueError:
        known = ", ".join(f"{m.name}={m.value}" for m in SHARDING_PRIORITIES)
        raise ValueError(f"{where}: {name} must be one of {known}, got {value!r}") from None


def _check_instances(num_of_instances: Any, instance_id: Any, where: str) -> None:
    require_int(num_of_instances, where, "num_of_instances", minimum=1)
    require_int(instance_id, where, "instance_id", minimum=0)
    if instance_id >= num_of_instances:
        raise ValueError(
            f"{where}: instance_id must be < num_of_instances, got instance_id={instance_id} "
            f"with num_of_instances={num_of_instances}"
        )


def _close(it: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


def _every_nth(source: IterDataPipe[Any], start: int, step: int) -> Iterator[Any]:
    it = iter(source)
    try:
        yield from islice(it, start, None, step)
    finally:
        _close(it)


@functional_datapipe("sharding_filter")
class ShardingFilter(IterDataPipe[T]):
    """Keep one shard of the items: those whose position is ``instance_id`` modulo
    ``num_of_instances`` (functional name: ``sharding_filter``).

    Until ``apply_sharding`` is called there is one shard and every item passes.

    Args:
        source_datapipe: the source pipe.
        sharding_group_filter: count only this sharding group (a ``SHARDING_PRIORITIES`` member);
            ``None`` (default): combine every group applied.

    Yields:
        The items of this instance's shard, in source order. The ``num_of_instances`` shards
        partition the source: every item is in exactly one, provided every instance reads the
        source in the same order (a shuffle upstream needs the same seed in every instance).

    ``len()`` is the shard's length, from the source's length and the shard at call time:
    ``n // num_of_instances`` plus one for the first ``n % num_of_instances`` instances.

    >>> from datapipes.iter import IterableWrapper
    >>> pipe = IterableWrapper(range(10)).sharding_filter()
    >>> pipe.apply_sharding(4, 1)
    >>> list(pipe), len(pipe)
    ([1, 5, 9], 3)

    See also: :func:`apply_sharding` to shard every ``sharding_filter`` of a graph.
    """

    def __init__(self, source_datapipe: IterDataPipe[T], sharding_group_filter: Any = None) -> None:
        require_pipe(source_datapipe, "ShardingFilter", "source_datapipe")
        if sharding_group_filter is not None:
            sharding_group_filter = _group(sharding_group_filter, "ShardingFilter", "sharding_group_filter")
        self.source_datapipe = source_datapipe
        self.sharding_group_filter = sharding_group_filter
        #: sharding group -> (num_of_instances, instance_id), as set by apply_sharding
        self.groups: dict[SHARDING_PRIORITIES, tuple[int, int]] = {}

    def apply_sharding(
        self,
        num_of_instances: int,
        instance_id: int,
        sharding_group: SHARDING_PRIORITIES = SHARDING_PRIORITIES.DEFAULT,
    ) -> None:
        """Read shard ``instance_id`` of ``num_of_instances`` in ``sharding_group`` from the next pass.

        Raises:
            TypeError / ValueError: ``num_of_instances`` is not an int >= 1, ``instance_id`` not an
                int in ``[0, num_of_instances)``, ``sharding_group`` not a sharding group, or
                ``DEFAULT`` mixed with the other groups (as torch forbids).
        """
        where = f"{type(self).__name__}.apply_sharding"
        _check_instances(num_of_instances, instance_id, where)
        group = _group(sharding_group, where, "sharding_group")
        others = set(self.groups) - {group}
        if others and (group == SHARDING_PRIORITIES.DEFAULT or SHARDING_PRIORITIES.DEFAULT in others):
            raise ValueError(
                f"{where}: cannot mix the DEFAULT sharding group with other groups "
                f"(applied: {sorted(g.name for g in self.groups)}, now {group.name})"
            )
        self.groups[group] = (num_of_instances, instance_id)

    def _shard(self) -> tuple[int, int]:
        """``(num_of_instances, instance_id)`` for a pass starting now.

        The one place that decides which shard this instance reads; every pass and ``len()`` ask
        it. Today it combines the groups set by ``apply_sharding`` (higher priority varying
        fastest, as torch does).
        """
        num, instance = 1, 0
        wanted = self.sharding_group_filter
        for group in sorted(self.groups, reverse=True):
            if wanted is None or group == wanted:
                group_num, group_id = self.groups[group]
                instance += num * group_id
                num *= group_num
        return num, instance

    @property
    def num_of_instances(self) -> int:
        """The number of shards a pass starting now splits the source into."""
        return self._shard()[0]

    @property
    def instance_id(self) -> int:
        """The shard a pass starting now reads."""
        return self._shard()[1]

    def __iter__(self) -> Iterator[T]:
        num, instance = self._shard()
        if num == 1:
            return iter(self.source_datapipe)
        return _every_nth(self.source_datapipe, instance, num)

    def __len__(self) -> int:
        n = len(self.source_datapipe)  # type: ignore[arg-type]
        num, instance = self._shard()
        return n // num + (1 if instance < n % num else 0)


def _is_sharding_stage(stage: Any) -> bool:
    return isinstance(stage, ShardingFilter) or inspect.ismethod(getattr(stage, "apply_sharding", None))


def apply_sharding(
    datapipe: Any,
    num_of_instances: int,
    instance_id: int,
    sharding_group: SHARDING_PRIORITIES = SHARDING_PRIORITIES.DEFAULT,
) -> Any:
    """Call ``apply_sharding(num_of_instances, instance_id, sharding_group)`` on every sharding
    stage of ``datapipe``'s graph (every stage with an ``apply_sharding`` method, such as
    :class:`ShardingFilter`); returns ``datapipe``. As ``torch.utils.data.graph_settings.apply_sharding``.

    Args:
        datapipe: the pipe whose graph is walked (the pipe and everything upstream of it).
        num_of_instances: the number of shards, an int >= 1.
        instance_id: the shard to read, an int in ``[0, num_of_instances)``.
        sharding_group: the sharding group (``SHARDING_PRIORITIES``), default ``DEFAULT``.

    Raises:
        TypeError / ValueError: bad arguments; or two sharding stages on one path of the graph
            (one upstream of the other), which would shard twice and lose data. Nothing is
            applied then.

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
        if _is_sharding_stage(stage):
            if above is not None:
                raise ValueError(
                    f"{where}: the graph shards twice on one path, which would lose data: "
                    f"{above!r} is downstream of another sharding stage, {stage!r}"
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
