"""Reading whole files from elsewhere and unpacking them: HTTP (:mod:`.http`), single compressed
files and archives by kind (:mod:`.compression`), TFRecord files (:mod:`.tfrecord`).
"""

from . import compression as _compression, http as _http, tfrecord as _tfrecord
from .compression import *  # noqa: F401,F403
from .http import *  # noqa: F401,F403
from .tfrecord import *  # noqa: F401,F403

__all__ = sorted({*_compression.__all__, *_http.__all__, *_tfrecord.__all__})
