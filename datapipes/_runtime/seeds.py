"""Seeds: derived ones, the same in every process and run, and fresh draws from torch's generator."""

from __future__ import annotations

import hashlib

import torch

__all__ = ["derive_seed", "draw_seed"]


def derive_seed(seed: int, *salt: object) -> int:
    """A 64-bit seed derived from ``seed`` and ``salt``, the same in every process and run.

    >>> derive_seed(0, "stage", 1) == derive_seed(0, "stage", 1) != derive_seed(0, "stage", 2)
    True
    """
    text = "/".join(str(s) for s in (seed, *salt)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def draw_seed(generator: torch.Generator | None = None) -> int:
    """A fresh seed from ``generator``, by default torch's global one (so ``torch.manual_seed``
    reproduces a run)."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
