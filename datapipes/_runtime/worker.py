"""Where a pass runs, and the seeds that the shards of one pipe must share.

A ``sharding_filter()`` that was not given a shard with ``apply_sharding`` finds it here at the start
of each pass: the torch DataLoader worker (``torch.utils.data.get_worker_info()``) times the
distributed rank (``torch.distributed`` when initialised, else the ``RANK``/``WORLD_SIZE``
environment variables when both are set). Shard ``rank * num_workers + worker_id`` of
``world_size * num_workers``.

The shards partition the data only if every shard reads the source in the same order, so random
stages *upstream* of a ``sharding_filter`` must draw the same numbers in every worker and rank. The
pass (:mod:`datapipes._runtime.passes`) gives each unseeded upstream random stage a seed derived from a root
every shard agrees on:

- a seed agreed by ``datapipes.DataLoader`` (:func:`set_loader_seed`, e.g. broadcast from rank 0);
- else, inside a torch DataLoader worker of a single rank, the loader's base seed
  (``get_worker_info().seed - get_worker_info().id``), which the loader draws per epoch from torch's
  global generator in the main process (``torch.manual_seed`` reproduces it);
- else, across several ranks, nothing, and the pass raises and asks for ``set_seed``.

torch's DataLoader itself lends every unseeded random stage a seed per epoch, drawn from one seed
it broadcasts to every rank and worker (``apply_random_seed``, see ``IterDataPipe._lend_seed``);
the pass takes that seed first, so under torch's DataLoader the roots above are a fallback (for a
pass that was not lent one, e.g. a second pass of a persistent worker within one epoch).

A stage seeded by the user (``pipe.set_seed``) agrees by construction and keeps its seed. Persistent
workers (``persistent_workers=True``) keep their base seed, and ``set_epoch`` in the main process
cannot reach them, so inside a worker the ``k``-th pass of a ``sharding_filter`` counts as ``k``
epochs later: each epoch reshuffles, identically in every worker. Stages *downstream* of the
``sharding_filter`` keep per-worker draws (torch seeds each worker's global generator with
``base_seed + worker_id``). Nothing of this is written onto the pipe's stages: the pass owns it.

A pipe without a sharding stage iterated by several workers of a torch DataLoader warns once per
loader (every worker would yield the whole data), although the workers are separate processes and
plain ``torch.utils.data.DataLoader`` runs none of our code in the main process (with the ``fork``
start method it does not even pickle the pipe there). So the decision is taken in the workers:

- only worker 0 checks, once per process (the pass hook then costs one global test);
- what worker 0 warned is recorded on a page of anonymous shared memory that this module maps when
  it is imported, in the main process, before the loader starts any worker. Workers *forked* from
  the main process (torch's default start method on Linux up to Python 3.13) all share that page,
  so worker 0 of a later epoch (``persistent_workers=False`` forks new workers every epoch) sees the
  warning was given and stays silent: one warning per loader over all epochs. The record is keyed by
  the warning's text (the pipe's chain, the number of workers), so, as Python's default warning
  filter shows a warning once per place, an identical pipe in a new loader does not warn again.
- ``spawn`` and ``forkserver`` workers start a fresh interpreter that cannot see the page: with
  ``persistent_workers=True`` worker 0 still warns once per loader; without, once per epoch.

``datapipes.DataLoader`` needs none of this: it warns once, in the main process, when it is built,
and adds the ``sharding_filter`` itself.
"""

from __future__ import annotations

import hashlib
import inspect
import mmap
import os
import warnings
from typing import Any, Iterable, NamedTuple

import torch.distributed as dist
from torch.utils.data import get_worker_info

from .._checks import require_int
from ..graph import stage_label, traverse
from .traits import Traits

__all__ = [
    "Placement",
    "base_seed",
    "capture_rank",
    "forget_warnings",
    "is_sharding_stage",
    "placement",
    "rank_placement",
    "set_loader_seed",
    "unseeded_across_ranks",
    "worker_pass",
    "worker_placement",
]


class Placement(NamedTuple):
    """Where the calling code runs: distributed ``rank`` of ``world_size``, DataLoader ``worker_id``
    of ``num_workers``. Its shard is ``rank * num_workers + worker_id`` of ``world_size * num_workers``."""

    rank: int
    world_size: int
    worker_id: int
    num_workers: int

    @property
    def shard(self) -> tuple[int, int]:
        """``(num_of_instances, instance_id)``."""
        return self.world_size * self.num_workers, self.rank * self.num_workers + self.worker_id


def worker_placement() -> tuple[int, int]:
    """``(worker_id, num_workers)`` of the torch DataLoader worker running now; ``(0, 1)`` outside one."""
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def _env_rank() -> tuple[int, int] | None:
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None
    try:
        r, w = int(rank), int(world)
    except ValueError:
        r, w = -1, 0
    if not 0 <= r < w:
        raise ValueError(
            f"sharding_filter: the RANK and WORLD_SIZE environment variables must be integers with "
            f"0 <= RANK < WORLD_SIZE, got RANK={rank!r}, WORLD_SIZE={world!r}"
        )
    return r, w


def _initialised_rank() -> tuple[int, int] | None:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def rank_placement(captured: tuple[int, int] | None = None) -> tuple[int, int]:
    """``(rank, world_size)`` of this process: from ``torch.distributed`` when initialised; else,
    inside a DataLoader worker, ``captured`` (what the main process saw, see :func:`capture_rank`);
    else from the ``RANK``/``WORLD_SIZE`` environment variables when both are set; else ``(0, 1)``.

    Raises:
        ValueError: ``RANK``/``WORLD_SIZE`` are set but not integers with ``0 <= RANK < WORLD_SIZE``.
    """
    found = _initialised_rank()
    if found is not None:
        return found
    if captured is not None and get_worker_info() is not None:
        return captured
    found = _env_rank()
    return (0, 1) if found is None else found


def capture_rank() -> tuple[int, int] | None:
    """``(rank, world_size)`` of an initialised process group of several ranks, else None.

    A pipe pickled to a spawned DataLoader worker carries this along: the worker is not part of the
    process group (a forked one still sees it), and may not have ``RANK``/``WORLD_SIZE`` either.
    """
    found = _initialised_rank()
    return found if found is not None and found[1] > 1 else None


def placement(captured: tuple[int, int] | None = None) -> Placement:
    """The :class:`Placement` of the calling code (see :func:`rank_placement`, :func:`worker_placement`)."""
    rank, world = rank_placement(captured)
    worker, workers = worker_placement()
    return Placement(rank, world, worker, workers)


def base_seed() -> int | None:
    """The torch DataLoader's base seed for this epoch (the same in every worker of one loader),
    or None outside a worker."""
    info = get_worker_info()
    return None if info is None else info.seed - info.id


# -- seeds shared by the shards --------------------------------------------------------------------


def set_loader_seed(pipe: Any, seed: int | None, epoch: int = 0) -> Any:
    """Install a seed agreed by every rank (and worker) on each ``sharding_filter`` of ``pipe``'s
    graph; returns ``pipe``. For ``datapipes.DataLoader``, which agrees on ``seed`` across ranks (the
    user's, or one broadcast from rank 0) before the pipe goes to its workers.

    Unseeded random stages upstream of a sharded ``sharding_filter`` then draw from seeds derived from
    ``(seed, epoch)`` (and, inside a torch DataLoader worker, the worker's pass count), the same in
    every shard; stages the user seeded keep their seeds. ``seed=None`` removes it. The seed travels
    with the pipe when it is pickled or forked to workers; call again (new ``epoch``) for each epoch
    whose pipe reaches its workers afresh.

    Raises:
        TypeError / ValueError: ``seed`` is not an int or None, ``epoch`` not an int >= 0.
    """
    require_int(seed, "set_loader_seed", "seed", optional=True)
    require_int(epoch, "set_loader_seed", "epoch", minimum=0)
    for stage in traverse(pipe):
        if is_sharding_stage(stage) and isinstance(stage, Traits):  # torch's declares no _loader_seed
            stage._loader_seed = None if seed is None else (seed, epoch)
    return pipe


def is_sharding_stage(stage: Any) -> bool:
    """True for a stage that shards: one with an ``apply_sharding`` method (``sharding_filter``,
    and torch-style sharding stages written elsewhere)."""
    return inspect.ismethod(getattr(stage, "apply_sharding", None))



def unseeded_across_ranks(stages: Iterable[Any], world_size: int, where: str) -> RuntimeError:
    """The error for random stages upstream of a ``sharding_filter`` with no seed the ranks share."""
    names = ", ".join(stage_label(s) for s in stages)
    return RuntimeError(
        f"{where}: {names} upstream of sharding_filter() has no seed, so each of the {world_size} "
        f"distributed ranks would draw its own order and their shards would overlap. Call "
        f"pipe.set_seed(seed) with the same seed on every rank (and pipe.set_epoch(epoch) to reshuffle "
        f"each epoch), or iterate with datapipes.DataLoader, which agrees on a seed across ranks"
    )


# -- the per-pass check inside a DataLoader worker -------------------------------------------------


class _WarnedRecord:
    """Which warnings were given, shared with every process forked from the one that built it.

    A page of anonymous shared memory (``mmap(-1)``: ``MAP_SHARED``, so a forked child writes what
    its parent and siblings read) holding 8-byte digests of the warnings' texts in a direct-mapped
    table. Two warnings landing on one slot, or two processes writing one slot at once, lose a
    digest: the worst that happens is a warning given twice, never one left out. Where the page
    cannot be mapped, a set in this process keeps the record.
    """

    _SLOTS = 512

    def __init__(self) -> None:
        self._local: set[int] = set()
        try:
            self._page: mmap.mmap | None = mmap.mmap(-1, 8 * self._SLOTS)
        except (OSError, ValueError):  # pragma: no cover - no anonymous shared memory here
            self._page = None

    def first(self, text: str) -> bool:
        """Record ``text``; True unless it was recorded before (by this process or a relative)."""
        key = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") or 1
        page = self._page
        if page is None:
            if key in self._local:
                return False
            self._local.add(key)
            return True
        at = 8 * (key % self._SLOTS)
        if int.from_bytes(page[at:at + 8], "little") == key:
            return False
        page[at:at + 8] = key.to_bytes(8, "little")
        return True

    def clear(self) -> None:
        self._local.clear()
        if self._page is not None:
            self._page[:] = bytes(len(self._page))


#: Mapped here, at import, in the main process: the DataLoader's forked workers all share it.
_warned = _WarnedRecord()

#: Whether this process has made its check (workers make it at their first pass of the dataset).
_checked = False


def forget_warnings() -> None:
    """Forget the warnings :func:`worker_pass` gave, in this process and the processes it forked
    (e.g. to see them again in a test)."""
    _warned.clear()


def _unwrapped(dataset: Any) -> Any:
    """The pipe inside torch DataLoader's serialization wrapper (which it puts around every
    DataPipe, ours included); ``dataset`` itself when it is not wrapped."""
    return getattr(dataset, "_datapipe", dataset) if type(dataset).__module__ == _TORCH_DATAPIPE_MODULE else dataset


_TORCH_DATAPIPE_MODULE = "torch.utils.data.datapipes.datapipe"


def worker_pass(pipe: Any) -> None:
    """Called when a pass of ``pipe`` starts inside a torch DataLoader worker (by the base class).

    Worker 0, at its first pass of the loader's dataset: warn, unless that warning was given already
    (see the module's docstring), if several workers iterate a graph without a sharding stage
    (every worker would yield the whole data).
    """
    global _checked
    info = get_worker_info()
    if _checked or info is None or pipe is not _unwrapped(info.dataset):
        return
    _checked = True
    if info.num_workers < 2 or info.id != 0:
        return
    if any(is_sharding_stage(s) for s in traverse(pipe)):
        return
    message = (
        f"datapipes: the pipe {pipe!r} is iterated by {info.num_workers} DataLoader workers but has no "
        f"sharding_filter(): every worker yields the whole data, so each item comes "
        f"{info.num_workers} times. Add .sharding_filter() after the source (and after any shuffle) "
        f"to split the items among the workers"
    )
    if _warned.first(message):
        warnings.warn(message, UserWarning, stacklevel=3)
