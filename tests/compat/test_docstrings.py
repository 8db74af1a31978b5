"""Every registered pipe's docstring follows torch's template, so users coming from torch DataPipes
(and tools that read docstrings) find what they expect there:

- a summary (the first paragraph) holding exactly ``(functional name: ``x``)`` on one line, ``x``
  being the name the class is registered under (torch's tests look for that exact phrase; extra
  words go outside the parentheses: ``(functional name: ``x``), on ...``);
- an ``Args:`` section;
- an ``Example:`` section (Google style, as Sphinx napoleon reads it): the heading on a line of its
  own, after a blank line, followed by an indented block holding at least one ``>>>`` doctest.

The examples themselves run as doctests (``--doctest-modules`` in setup.cfg). The check walks the
registries, so pipes added later are held to the same template."""

import doctest
import importlib
import inspect
import pkgutil

import pytest

import datapipes.iter  # noqa: F401 - registers the iterable-style pipes
import datapipes.map  # noqa: F401 - registers the map-style pipes
from datapipes import IterDataPipe, MapDataPipe


def template_problems(doc, name):
    """What the docstring ``doc`` of a pipe registered as ``name`` lacks of the template ([] if none)."""
    if not doc:
        return ["no docstring"]
    lines = inspect.cleandoc(doc).splitlines()
    problems = []
    blank = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
    phrase = f"(functional name: ``{name}``)"
    if not any(phrase in line for line in lines[:blank]):
        problems.append(f"summary lacks '(functional name: ``{name}``)' on one line")
    if not any(line.strip() == "Args:" for line in lines):
        problems.append("no 'Args:' section")
    headings = [i for i, line in enumerate(lines) if line.strip() == "Example:"]
    if not headings:
        problems.append("no 'Example:' section")
    for i in headings:
        indent = len(lines[i]) - len(lines[i].lstrip())
        if i == 0 or lines[i - 1].strip():
            problems.append("no blank line before 'Example:'")
        block = []
        for line in lines[i + 1:]:
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            block.append(line)
        text = "\n".join(block)
        if not any(line.lstrip().startswith(">>> ") for line in block):
            problems.append("'Example:' is not followed by an indented block with a '>>>' line")
        elif not doctest.DocTestParser().get_examples(text):
            problems.append("the 'Example:' block holds no doctest example")
    return problems


def registered():
    """``(registry, functional name, class)`` for every pipe of the package in both registries, every
    module of ``datapipes.iter`` and ``datapipes.map`` imported first (so a module not yet exported
    by its package's ``__init__`` is checked too; one whose optional dependency is missing is not)."""
    for package in (datapipes.iter, datapipes.map):
        for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            try:
                importlib.import_module(module.name)
            except ModuleNotFoundError as e:
                if (e.name or "").split(".")[0] == "datapipes":  # a broken module, not a missing dependency
                    raise
    return [
        (base.__name__, name, cls)
        for base in (IterDataPipe, MapDataPipe)
        for name, cls in sorted(base._functions.items())
        if cls.__module__.startswith("datapipes.")
    ]


def test_every_registered_pipe_follows_the_docstring_template():
    pipes = registered()
    assert len(pipes) > 50, "the registries look empty: were datapipes.iter and datapipes.map imported?"
    offenders = []
    for base, name, cls in pipes:
        problems = template_problems(cls.__doc__, name)
        if problems:
            offenders.append(f"{cls.__module__}.{cls.__qualname__} ({base}.{name}): " + "; ".join(problems))
    if offenders:
        listing = "\n".join(offenders)
        pytest.fail(f"{len(offenders)} docstring(s) do not follow the template:\n{listing}", pytrace=False)


GOOD = '''Add one to every item (functional name: ``inc``).

    Args:
        datapipe: the source pipe.

    Example:
        >>> 1 + 1
        2

    See also: :class:`Mapper`.
    '''


@pytest.mark.parametrize(
    "doc, expected",
    [
        (GOOD, []),
        (GOOD.replace("``inc``", "``dec``"), ["summary lacks"]),
        (GOOD.replace("(functional name: ``inc``)", "(functional name:\n    ``inc``)"), ["summary lacks"]),
        (GOOD.replace("``inc``)", "``inc``, on :class:`X`)"), ["summary lacks"]),
        (GOOD.replace("``inc``)", "``inc``), on :class:`X`"), []),
        (GOOD.replace("Args:", "Arguments"), ["no 'Args:'"]),
        (GOOD.replace("Example:", "For example"), ["no 'Example:'"]),
        (GOOD.replace("\n    Example:", "    Example:"), ["no blank line"]),
        (GOOD.replace("        >>> 1 + 1\n        2", "    >>> 1 + 1\n    2"), ["not followed"]),
        (GOOD.replace(">>> 1 + 1", "1 + 1"), ["not followed"]),
        (None, ["no docstring"]),
    ],
    ids=["good", "other name", "phrase split over lines", "extra words inside the parentheses",
         "extra words after the parentheses", "no args", "no example", "no blank line",
         "doctest not indented", "no doctest", "no docstring"],
)
def test_the_check_finds_each_missing_part(doc, expected):
    problems = template_problems(doc, "inc")
    assert len(problems) == len(expected)
    for problem, start in zip(problems, expected):
        assert start in problem, problems
