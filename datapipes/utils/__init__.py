"""torch DataPipes' helper modules under the same names: :mod:`datapipes.utils.common`
(``StreamWrapper``, ``validate_input_col``, file listing helpers) and :mod:`datapipes.utils.decoder`
(``Decoder`` and its handlers), so that ``from torch.utils.data.datapipes.utils.decoder import
imagehandler`` becomes ``from datapipes.utils.decoder import imagehandler``.
"""

from . import common, decoder

__all__ = ["common", "decoder"]
