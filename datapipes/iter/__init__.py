"""Iterable-style pipes (``IterDataPipe``), one module (or subpackage) per family of pipes.

Importing this package registers every pipe's functional name on :class:`IterDataPipe`.
"""

from ..datapipe import IterDataPipe
from . import (
    archive as _archive,
    batching as _batching,
    broadcast as _broadcast,
    bucketing as _bucketing,
    cache as _cache,
    combinatorics as _combinatorics,
    decoding as _decoding,
    device as _device,
    distributed as _distributed,
    fileio as _fileio,
    grouping as _grouping,
    image as _image,
    io as _io,
    mapping as _mapping,
    mixing as _mixing,
    muxing as _muxing,
    packing as _packing,
    parquet as _parquet,
    prefetch as _prefetch,
    remote as _remote,
    reshaping as _reshaping,
    s3 as _s3,
    sharding as _sharding,
    shuffling as _shuffling,
    text as _text,
    tokenize as _tokenize,
    util as _util,
    zipping as _zipping,
)
from .archive import *  # noqa: F401,F403
from .batching import *  # noqa: F401,F403
from .broadcast import *  # noqa: F401,F403
from .bucketing import *  # noqa: F401,F403
from .cache import *  # noqa: F401,F403
from .combinatorics import *  # noqa: F401,F403
from .decoding import *  # noqa: F401,F403
from .device import *  # noqa: F401,F403
from .distributed import *  # noqa: F401,F403
from .fileio import *  # noqa: F401,F403
from .grouping import *  # noqa: F401,F403
from .image import *  # noqa: F401,F403
from .io import *  # noqa: F401,F403
from .mapping import *  # noqa: F401,F403
from .mixing import *  # noqa: F401,F403
from .muxing import *  # noqa: F401,F403
from .packing import *  # noqa: F401,F403
from .parquet import *  # noqa: F401,F403
from .prefetch import *  # noqa: F401,F403
from .remote import *  # noqa: F401,F403
from .reshaping import *  # noqa: F401,F403
from .s3 import *  # noqa: F401,F403
from .sharding import *  # noqa: F401,F403
from .shuffling import *  # noqa: F401,F403
from .text import *  # noqa: F401,F403
from .tokenize import *  # noqa: F401,F403
from .util import *  # noqa: F401,F403
from .zipping import *  # noqa: F401,F403

__all__ = sorted(
    {"IterDataPipe"}.union(
        *(
            m.__all__
            for m in (
                _archive, _batching, _broadcast, _bucketing, _cache, _combinatorics, _decoding, _device, _distributed,
                _fileio, _grouping, _image, _io, _mapping, _mixing, _muxing, _packing, _parquet, _prefetch, _remote, _reshaping, _s3,
                _sharding, _shuffling, _text, _tokenize, _util, _zipping,
            )
        )
    )
)
