"""Reading files: from elsewhere over HTTP (:mod:`.http`), unpacking single compressed files and
archives by kind, and decompressing streams (:mod:`.compression`), and reading formats out of ``(path, stream)`` pairs: TFRecord
(:mod:`.tfrecord`), CSV (:mod:`.csv`), JSON (:mod:`.json`) and lines of text (:mod:`.lines`). The
readers share the runtime of :mod:`datapipes.iter._readers` (failures, checkpoints, reopening).
"""

from .compression import *  # noqa: F401,F403
from .csv import *  # noqa: F401,F403
from .http import *  # noqa: F401,F403
from .json import *  # noqa: F401,F403
from .lines import *  # noqa: F401,F403
from .tfrecord import *  # noqa: F401,F403

# Written out, not computed from the modules' lists: mypy reads only a literal ``__all__`` to see
# the names ``from datapipes.iter import ...`` re-exports (tests/test_typing.py checks the union).
__all__ = [
    "Bz2FileLoader", "CSVDictParser", "CSVFilesParser", "CSVParser", "Decompressor", "Extractor", "HttpReader", "JsonParser",
    "LineReader", "OnlineReader", "TFRecordExample", "TFRecordExampleSpec", "TFRecordLoader", "XzFileLoader",
]
