"""Map-style pipes (``MapDataPipe``): indexable, with a length known at call time.

Importing this package registers every pipe's functional name: ``map``, ``batch``, ``concat``,
``zip``, ``shuffle``, ``in_memory_cache``, ``unzip`` and ``to_iter_datapipe`` on
:class:`MapDataPipe`, and ``to_map_datapipe`` on :class:`~datapipes.IterDataPipe`.

>>> from datapipes.map import SequenceWrapper
>>> pipe = SequenceWrapper(range(10)).map(lambda x: x * x).batch(4)
>>> pipe[1], len(pipe)
([16, 25, 36, 49], 3)
>>> list(pipe.to_iter_datapipe())
[[0, 1, 4, 9], [16, 25, 36, 49], [64, 81]]

Indices. ``pipe[i]`` reads one item on demand; nothing is cached (except by
:class:`InMemoryCacheHolder`, and the loaded dict of :class:`IterToMapConverter`). The positional pipes (:class:`Batcher`, :class:`Concater`,
:class:`Zipper`) take ints (anything with ``__index__``) and count negative indices from the end,
as a list does; an index out of range raises ``IndexError`` whose message names the stage and its
length and ends in torch's words for that stage (``Concater (length 5): Index 7 is out of
range.``), a non-integer index (a slice included) ``TypeError``. :class:`SequenceWrapper` and
:class:`Mapper` hand the index to their source unchanged, so they accept what the source accepts (a
list takes negative indices, a dict its keys), as in torch; what the sequence raises for an index it
lacks (``IndexError: list index out of range``, ``KeyError``) comes through as it was raised, with a
note naming the stage and the index (``[datapipes] raised in stage SequenceWrapper at index 7``).
:class:`IterToMapConverter` is keyed: a missing key raises ``IndexError`` naming the stage.

Iterating a map-style pipe yields ``pipe[0], ..., pipe[len - 1]`` (a keyed pipe: its values in key
order); ``len()`` is computed from the sources at call time. A map-style pipe drops into
``torch.utils.data.DataLoader`` as a ``Dataset``.
"""

from ..datapipe import MapDataPipe
from . import (
    callable as _callable,
    combinatorics as _combinatorics,
    combining as _combining,
    converter as _converter,
    grouping as _grouping,
    util as _util,
)
from .callable import *  # noqa: F401,F403
from .combinatorics import *  # noqa: F401,F403
from .combining import *  # noqa: F401,F403
from .converter import *  # noqa: F401,F403
from .grouping import *  # noqa: F401,F403
from .util import *  # noqa: F401,F403

__all__ = sorted(
    {"MapDataPipe"}.union(
        *(m.__all__ for m in (_callable, _combinatorics, _combining, _converter, _grouping, _util))
    )
)
