"""Reading whole files from elsewhere and unpacking them: HTTP (:mod:`.http`), single compressed
files and archives by kind (:mod:`.compression`), TFRecord files (:mod:`.tfrecord`).
"""

from .compression import *  # noqa: F401,F403
from .http import *  # noqa: F401,F403
from .tfrecord import *  # noqa: F401,F403

# Written out, not computed from the modules' lists: mypy reads only a literal ``__all__`` to see
# the names ``from datapipes.iter import ...`` re-exports (tests/test_typing.py checks the union).
__all__ = ["Bz2FileLoader", "Extractor", "HttpReader", "OnlineReader", "TFRecordExample", "TFRecordExampleSpec", "TFRecordLoader", "XzFileLoader"]
