"""Caches: the on-disk cache of whole files (:mod:`.disk`), hash checks (:mod:`.hash`) and the
in-memory cache of a pipe's items (:mod:`.memory`).
"""

from .disk import *  # noqa: F401,F403
from .hash import *  # noqa: F401,F403
from .memory import *  # noqa: F401,F403

# Written out, not computed from the modules' lists: mypy reads only a literal ``__all__`` to see
# the names ``from datapipes.iter import ...`` re-exports (tests/test_typing.py checks the union).
__all__ = ["EndOnDiskCacheHolder", "HashChecker", "InMemoryCacheHolder", "OnDiskCacheHolder"]
