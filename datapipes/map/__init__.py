"""Map-style pipes (``MapDataPipe``): indexable, with a known length.

Importing this package registers every pipe's functional name on :class:`MapDataPipe`.
"""

from ..datapipe import MapDataPipe
from .core import *  # noqa: F401,F403
from . import core as _core

__all__ = sorted({"MapDataPipe"} | set(_core.__all__))
