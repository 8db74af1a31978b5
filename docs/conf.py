"""Sphinx configuration for the datapipes documentation.

Build (the ``docs`` extra installs Sphinx; nothing here needs the network):

    pip install -e ".[docs]"
    sphinx-build -b html docs docs/_build/html
    sphinx-build -b doctest docs docs/_build/doctest     # runs every >>> example of the pages
"""

from __future__ import annotations

import doctest
import importlib.util
import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # the package of this checkout

project = "datapipes"
author = "the datapipes authors"
copyright = "the datapipes authors"  # noqa: A001 - Sphinx's name
try:
    from datapipes import __version__ as release
except ImportError:  # documentation sources read without the package importable
    release = "0.1.0"
version = ".".join(release.split(".")[:2])

# Ray has no build for every interpreter CI runs the docs on (free-threaded CPython): there the API
# reference documents datapipes.ray from its source with Ray mocked, rather than failing the build.
if importlib.util.find_spec("ray") is None:
    autodoc_mock_imports = ["ray"]

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # Google-style docstrings (Args:, Yields:, Raises:)
    "sphinx.ext.doctest",  # `sphinx-build -b doctest` runs the >>> examples
    "sphinx.ext.viewcode",
]

# No intersphinx: building must not need the network.
autodoc_default_options = {
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# Doctests: the same option flags as the package's own (setup.cfg), and the >>> blocks of the
# pages are tested as they stand.
doctest_default_flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
doctest_test_doctest_blocks = "default"
# Docstrings pulled in by autodoc are tested too. As under pytest's --doctest-modules, each
# docstring's examples run on their own, in a copy of their module's namespace (so they may use the
# module's own names): see _docstring_groups below.
doctest_global_setup = """
import datapipes
from datapipes.graph import chain_repr, describe, stages, to_mermaid, traverse
from datapipes.iter import IterableWrapper
"""

templates_path: list[str] = []
exclude_patterns = ["_build"]
html_theme = "furo"
html_static_path: list[str] = []
nitpicky = False


# -- a table of the functional methods, generated from the registry at build time ------------------
# ``.. functional-table:: IterDataPipe`` (or MapDataPipe) lists every registered method name with its
# class, so the reference never drifts from the code.


def _functional_table_directive():
    from docutils import nodes
    from docutils.parsers.rst import Directive
    from docutils.statemachine import StringList

    class FunctionalTable(Directive):
        required_arguments = 1

        def run(self):
            import datapipes.iter  # noqa: F401 - registers the iterable-style pipes
            import datapipes.map  # noqa: F401 - registers the map-style pipes

            base = getattr(datapipes, self.arguments[0])
            rows = [
                (name, f"{cls.__module__.rsplit('.', 1)[0]}.{cls.__name__}")
                for name, cls in sorted(base._functions.items())
                if cls.__module__.startswith("datapipes.")
            ]
            lines = [".. list-table::", "   :header-rows: 1", "", "   * - method", "     - class"]
            for name, path in rows:
                lines += [f"   * - ``{name}``", f"     - :class:`{path}`"]
            node = nodes.container()
            self.state.nested_parse(StringList(lines, source="functional-table"), self.content_offset, node)
            return node.children

    return FunctionalTable


# -- docstring examples run in their module's namespace ---------------------------------------------
# The doctest builder puts every ``>>>`` block of a page in one group ("default"), sharing one
# namespace: the examples of one docstring would see the variables of the previous one, and miss the
# names of their own module that pytest's --doctest-modules gives them. Each docstring's blocks get a
# group of their own here, set up with a copy of the namespace of the module whose file holds them.

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module_of(path: str) -> str | None:
    """The dotted name of the module in file ``path`` of this checkout, or None (another file)."""
    path = os.path.abspath(path)
    if not path.endswith(".py") or not path.startswith(_REPO + os.sep):
        return None
    parts = os.path.relpath(path, _REPO)[: -len(".py")].split(os.sep)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _docstring_groups(app, doctree):
    from docutils import nodes

    set_up: set[str] = set()
    for block in doctree.findall(nodes.doctest_block):
        path, sep, obj = (block.source or "").partition(":docstring of ")
        module = _module_of(path) if sep else None
        if module is None:
            continue
        group = f"docstring of {obj}"
        block["groups"] = [group]
        if group not in set_up:  # the first block of the docstring starts with the module's names
            set_up.add(group)
            block["test"] = (
                f">>> import importlib; globals().update(vars(importlib.import_module({module!r})))\n"
                + block.astext()
            )


def setup(app):
    app.add_directive("functional-table", _functional_table_directive())
    app.connect("doctree-read", _docstring_groups)
    return {"parallel_read_safe": True}

