"""Stages that apply a user function. Per item: Mapper [map] (:mod:`.map`, with torchdata's
concurrent spellings ThreadPoolMapper [threadpool_map] and BatchAsyncMapper [async_map_batches]),
Filter [filter] (:mod:`.filter`), FlatMapper [flatmap] (:mod:`.flatmap`); per batch: BatchMapper
[map_batches] and Collator [collate] (:mod:`.batches`). The helpers they share (columns, argument
checks, a pass's failure handling) are :mod:`._shared`'s.

``map``, ``filter`` and ``flatmap`` follow the shared error policy (:mod:`datapipes.errors`): by
default the first failure reaches the consumer as the user's own exception object with a note naming
the stage and the item's position; ``on_error="skip"`` drops failing items and counts them in
``pipe.failures``.
"""

from .batches import *  # noqa: F401,F403
from .filter import *  # noqa: F401,F403
from .flatmap import *  # noqa: F401,F403
from .map import *  # noqa: F401,F403

# Written out, not computed from the modules' lists: mypy reads only a literal ``__all__`` here to
# see the names that ``from datapipes.iter import Mapper`` re-exports (tests/test_typing.py checks
# that it is their union).
__all__ = ["BatchAsyncMapper", "BatchMapper", "Collator", "Filter", "FlatMapper", "MapBatches", "Mapper", "ThreadPoolMapper"]
