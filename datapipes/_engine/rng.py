"""Per-item random generators: the same item gets the same generator whatever thread runs it.

A stage built with ``rng="python"`` (or ``"numpy"``, ``"torch"``) calls ``fn(item, rng=generator)``
where the generator is seeded from the pass seed (the stage's seed and epoch, see
:meth:`~datapipes.IterDataPipe.set_seed`) and the item's position in the stage's input. Concurrency,
ordering and the executor change nothing: item ``k`` of a pass always sees the same random numbers.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from ._procworker import make_rng, seeded_call

__all__ = ["RNG_KINDS", "item_seed", "make_rng", "seeded_call", "with_seeds"]

RNG_KINDS = ("python", "numpy", "torch")
_MASK = (1 << 64) - 1


def item_seed(pass_seed: int, position: int) -> int:
    """A 63-bit seed for the item at ``position`` of a pass seeded with ``pass_seed`` (splitmix64)."""
    z = (pass_seed + 0x9E3779B97F4A7C15 * (position + 1)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) >> 1


def with_seeds(source: Iterable[Any], pass_seed: int, start: Any = None) -> Iterator[tuple[Any, int]]:
    """``(item, item_seed(pass_seed, position))`` for each item of ``source``; positions count from
    ``start()`` (read at the first ``next()``, after a resumed pass restored it), else from 0."""
    for k, x in enumerate(source, 0 if start is None else start()):
        yield x, item_seed(pass_seed, k)


def check_rng(value: Any, stage: str) -> None:
    """Raise ``ValueError`` naming ``stage`` unless ``value`` is None or one of :data:`RNG_KINDS`."""
    if value is not None and value not in RNG_KINDS:
        raise ValueError(f"{stage}: rng must be None, 'python', 'numpy' or 'torch', got {value!r}")
