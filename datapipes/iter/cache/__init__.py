"""Caches of whole files: the on-disk cache (:mod:`.disk`) and hash checks (:mod:`.hash`).

The in-memory cache, ``in_memory_cache``, is :mod:`datapipes.iter.util`'s.
"""

from . import disk as _disk, hash as _hash
from .disk import *  # noqa: F401,F403
from .hash import *  # noqa: F401,F403

__all__ = sorted({*_disk.__all__, *_hash.__all__})
