"""Stages that split one pipe into several children sharing one pass over it: Forker [fork]
(:mod:`.fork`), Demultiplexer [demux] and RoundRobinDemultiplexer [round_robin_demux]
(:mod:`.demux`). The shared pass itself (how it lives, ends, restarts, is bounded, pickles and
resumes) is :mod:`.hub`'s; UnZipper [unzip] (:mod:`datapipes.iter.zipping`) runs on it too.
"""

from .demux import *  # noqa: F401,F403
from .fork import *  # noqa: F401,F403

# Written out, not computed from the modules' lists: mypy reads only a literal ``__all__`` to see
# the names ``from datapipes.iter import ...`` re-exports (tests/test_typing.py checks the union).
__all__ = ["Demultiplexer", "Forker", "RoundRobinDemultiplexer"]
