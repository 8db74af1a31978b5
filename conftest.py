"""Collection rules for the whole checkout (``testpaths = tests datapipes``: the package's doctests
run too). ``datapipes/ray.py`` needs the ``[ray]`` extra; without Ray its doctests are not collected
(and tests/cluster skips), rather than failing the collection."""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("ray") else ["datapipes/ray.py"]
