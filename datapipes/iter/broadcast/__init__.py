"""Stages that split one pipe into several children sharing one pass over it: Forker [fork]
(:mod:`.fork`), Demultiplexer [demux] and RoundRobinDemultiplexer [round_robin_demux]
(:mod:`.demux`). The shared pass itself (how it lives, ends, restarts, is bounded, pickles and
resumes) is :mod:`.hub`'s; UnZipper [unzip] (:mod:`datapipes.iter.zipping`) runs on it too.
"""

from . import demux as _demux, fork as _fork
from .demux import *  # noqa: F401,F403
from .fork import *  # noqa: F401,F403

__all__ = sorted({*_demux.__all__, *_fork.__all__})
