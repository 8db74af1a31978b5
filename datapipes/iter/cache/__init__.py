"""Caches of whole files: the on-disk cache (:mod:`.disk`) and hash checks (:mod:`.hash`).

The in-memory cache, ``in_memory_cache``, is :mod:`datapipes.iter.util`'s.
"""

from .disk import *  # noqa: F401,F403
from .hash import *  # noqa: F401,F403

# Written out, not computed from the modules' lists: mypy reads only a literal ``__all__`` to see
# the names ``from datapipes.iter import ...`` re-exports (tests/test_typing.py checks the union).
__all__ = ["EndOnDiskCacheHolder", "HashChecker", "OnDiskCacheHolder"]
