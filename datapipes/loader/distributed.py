"""Agreement across ranks: what every process of a loader must agree on under ``torch.distributed``.

- the seed: one per loader, drawn on rank 0 and broadcast (``_agreed_seed``), then installed on
  the pipe for each pass, the random stages downstream of a sharding stage also from the shard's id
  (``_shard_id``: the shard a pass's seeds derive from);
- the batch count: ``even_batches="drop"`` / ``"pad"`` make every rank yield the same number of
  batches (``_even_pass``).

Without a process group of two or more ranks, each is a no-op (or a local draw).
"""

from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Any, Iterator, Protocol

from .._runtime.seeds import draw_seed
from .._runtime.worker import placement
from ..graph import sources_of, stage_label, traverse
from ..iter.sharding import SHARDING_PRIORITIES, is_sharding_stage

_WHERE = "DataLoader"  # what errors name: the public class (dataloader.py uses it too)

_END = object()  # private end-of-pass marker (None is a valid batch)


class _Loader(Protocol):
    """What the even-batches pass reads of the loader: its ``len()`` and its ``pipe`` (for errors)."""

    pipe: Any

    def __len__(self) -> int: ...


# -- seeds: one per loader, agreed across ranks ----------------------------------------------------


def _distributed() -> Any:
    """``torch.distributed`` when a process group of two or more ranks is initialised, else None."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch built without distributed
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return dist


#: the tensors of the last collectives, kept alive a while after them (see _kept)
_RECENT: deque[Any] = deque(maxlen=8)


def _kept(tensor: Any) -> Any:
    """``tensor``, given to a collective, kept alive for the next few collectives.

    On torch 2.5 a gloo group's worker threads are joined only when the group is freed (its
    ``destroy_process_group`` shuts down NCCL alone), by the Python thread that frees it, holding
    the GIL. A worker that has just finished a collective frees its work and, with it, the tensor;
    when Python has let go of the tensor already, that needs the GIL: a program that destroys its
    process group right after the loader's last collective would wait forever. Kept here, the
    tensor is never freed by a worker."""
    _RECENT.append(tensor)
    return tensor


def _collective_device(dist: Any) -> Any:
    """Where a tensor for a collective of the default group lives: CUDA for NCCL, else the CPU."""
    import torch

    backend = str(dist.get_backend()).lower()
    if "nccl" in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _rank_sharded_random(pipe: Any) -> list[Any]:
    """The random stages upstream of a stage that shards across distributed ranks."""
    found: dict[int, Any] = {}
    for stage in traverse(pipe):
        if not is_sharding_stage(stage):
            continue
        if getattr(stage, "sharding_group_filter", None) == SHARDING_PRIORITIES.MULTIPROCESSING:
            continue  # shards among the workers of one rank only, which share the loader's seed
        for source in sources_of(stage):
            found.update((id(s), s) for s in traverse(source) if s._is_random)
    return list(found.values())


def _agreed_seed(pipe: Any, generator: Any = None) -> int:
    """A fresh seed from ``generator`` (default: torch's global one); under torch.distributed, rank
    0's (broadcast).

    Raises:
        RuntimeError: ``RANK``/``WORLD_SIZE`` name several ranks but no process group is initialised
            to agree on a seed, and ``pipe`` shuffles upstream of a ``sharding_filter``.
    """
    seed = draw_seed(generator)
    dist = _distributed()
    if dist is None:
        world_size = placement().world_size
        if world_size > 1:
            unagreed = _rank_sharded_random(pipe)
            if unagreed:
                names = ", ".join(stage_label(s) for s in unagreed)
                raise RuntimeError(
                    f"{_WHERE}: RANK/WORLD_SIZE name {world_size} ranks but no torch.distributed process group "
                    f"is initialised, so the ranks cannot agree on a seed for {names} upstream of "
                    f"sharding_filter(), and their shards would overlap. Pass seed=... (the same on every rank), "
                    f"or call torch.distributed.init_process_group() before iterating"
                )
        return seed
    import torch

    box = _kept(torch.tensor([seed], dtype=torch.int64, device=_collective_device(dist)))
    dist.broadcast(box, src=0)
    return int(box.item())



def _shard_id(captured: tuple[int, int] | None = None) -> int:
    """This process's shard among all the loader's processes: ``rank * num_workers + worker``."""
    return placement(captured).shard[1]


# -- even batch counts across ranks ----------------------------------------------------------------


def _even_pass(loader: _Loader, it: Iterator[Any], mode: str, resumed: bool = False) -> Iterator[Any]:
    """Yield the batches of ``it`` so that every rank yields the same number (``mode`` "drop": the
    smallest count, "pad": the largest, repeating each short rank's last batch). A pass resumed from
    a state (``resumed``) yields fewer batches than ``len()`` says: the ranks then agree batch by
    batch."""
    dist = _distributed()
    try:
        if dist is None:
            yield from it
            return
        import torch

        device = _collective_device(dist)
        try:
            if resumed:
                raise TypeError("a resumed pass: its count is not len()'s")
            n, known = len(loader), 1
        except TypeError:
            n, known = 0, 0
        counts = _kept(torch.tensor([n, -n, known], dtype=torch.int64, device=device))
        dist.all_reduce(counts, op=dist.ReduceOp.MIN)
        least, most, all_known = counts.tolist()
        most = -most
        if all_known:
            yield from _even_known(loader, it, mode, least, most, n)
        else:
            yield from _even_stepwise(loader, it, mode, dist, device)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def _cannot_pad(loader: _Loader) -> ValueError:
    return ValueError(
        f"{_WHERE}: even_batches='pad' repeats a rank's last batch, but a rank yielded no batch at all (in a pass "
        f"resumed from a state: no batch after the state was saved); use even_batches='drop' or give every rank "
        f"data ({loader.pipe!r})"
    )


def _even_known(loader: _Loader, it: Iterator[Any], mode: str, least: int, most: int, n: int) -> Iterator[Any]:
    """Every rank knows its count: one all_reduce at the start of the pass settled the target."""
    k = 0
    last: Any = _END
    if mode == "drop":
        for last in islice(it, least):
            k += 1
            yield last
        if k < least:
            raise RuntimeError(
                f"{_WHERE}: even_batches='drop' expected {least} batches on this rank (len() said {n}) but the "
                f"pipe ended after {k}; the other ranks will wait for this one. len() must be exact ({loader.pipe!r})"
            )
        return
    if least == 0 and most > 0:
        raise _cannot_pad(loader)  # every rank sees the same counts: they all raise, none waits
    for last in islice(it, most):
        k += 1
        yield last
    if k < most:
        if last is _END:
            raise _cannot_pad(loader)
        for _ in range(most - k):
            yield last


def _even_stepwise(loader: _Loader, it: Iterator[Any], mode: str, dist: Any, device: Any) -> Iterator[Any]:
    """Some rank's count is unknown: the ranks agree on "anyone still has data" before every batch
    (one all_reduce of three integers per batch)."""
    import torch

    last: Any = _END
    done = False
    while True:
        batch = _END if done else next(it, _END)
        done = batch is _END
        has = 0 if done else 1
        flags = _kept(torch.tensor([has, -has, 0 if done and last is _END else 1], dtype=torch.int64,
                                   device=device))
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)
        all_have, minus_any_has, all_can_pad = flags.tolist()
        if mode == "drop":
            if not all_have:
                return
            yield batch
        elif minus_any_has == 0:
            return
        elif not all_can_pad:
            raise _cannot_pad(loader)
        elif done:
            yield last
        else:
            last = batch
            yield batch

