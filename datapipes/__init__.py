"""datapipes: composable, lazy, typed pipes that feed ML training.

>>> import datapipes
>>> from datapipes.iter import IterableWrapper
>>> pipe = IterableWrapper(range(10)).map(lambda x: x * x).filter(lambda x: x % 2 == 0).batch(3)
>>> list(pipe)
[[0, 4, 16], [36, 64]]

``datapipes.iter`` and ``datapipes.map`` hold the pipe classes; they are reached as attributes and are
not exported by ``from datapipes import *`` (they would shadow the builtins).
"""

from ._chunk import DataChunk
from ._collate import collate
from .datapipe import IterDataPipe, MapDataPipe, functional_datapipe, stateless
from .errors import ErrorPolicy, FailureLog
from . import graph
from . import hooks
from .hooks import Hook
from .loader import DataLoader
from .profiling import profile
from . import iter  # noqa: A004 - a submodule, deliberately not in __all__
from . import map  # noqa: A004 - a submodule, deliberately not in __all__
from . import spdl  # SPDL's spelling, reached as datapipes.spdl (not in __all__)

# torchdata exports MapToIterConverter from its iter package too. It lives with the map-style pipes
# (which import the iterable-style ones, not the other way round), so it joins datapipes.iter here,
# where both are imported: ``from datapipes.iter import MapToIterConverter`` works as in torchdata.
iter.MapToIterConverter = map.MapToIterConverter  # type: ignore[attr-defined]
iter.__all__ = sorted({*iter.__all__, "MapToIterConverter"})

__version__ = "0.1.0"

__all__ = [
    "DataChunk",
    "DataLoader",
    "ErrorPolicy",
    "FailureLog",
    "Hook",
    "IterDataPipe",
    "MapDataPipe",
    "collate",
    "functional_datapipe",
    "graph",
    "hooks",
    "profile",
    "stateless",
]
