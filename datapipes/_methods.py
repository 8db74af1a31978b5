"""Typed declarations of the functional methods, for type checkers and IDEs.

At run time these are empty generic bases of :class:`IterDataPipe` and :class:`MapDataPipe`: the
methods themselves are set by :func:`functional_datapipe` when each pipe module is imported. Type
checkers read ``_methods.pyi`` beside this file instead, which declares every registered method with
its parameters and result type (``pipe.map(f)`` is an ``IterDataPipe[U]`` where ``f`` returns ``U``).
``scripts/gen_stub.py`` writes the stub from the registered classes' constructors (and their
``@typing.overload`` declarations); ``tests/test_stub.py`` checks the committed one is its output.
"""

from typing import Generic, TypeVar

T_co = TypeVar("T_co", covariant=True)


class IterMethods(Generic[T_co]):
    """The functional methods of ``IterDataPipe`` (declared in ``_methods.pyi``)."""


class MapMethods(Generic[T_co]):
    """The functional methods of ``MapDataPipe`` (declared in ``_methods.pyi``)."""
