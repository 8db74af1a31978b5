"""A stage written outside datapipes is stateless only when it says so (issue 21).

It used to be taken as stateless whenever its iterator had no state_dict: a stage that reads one
item ahead then resumed with that item lost, and nothing was said.
"""

from __future__ import annotations

import re

import pytest

import datapipes
from datapipes import IterDataPipe
from datapipes.iter import IterableWrapper
from datapipes.testing import check_resume


class Pairwise(IterDataPipe):
    """Yields (previous, current): it holds one item between two yields, so its position is not
    its source's."""

    def __init__(self, datapipe):
        self.datapipe = datapipe

    def __iter__(self):
        previous = None
        for x in self.datapipe:
            if previous is not None:
                yield previous, x
            previous = x


class Doubled(IterDataPipe):
    stateless = True  # yields as it reads: its position is its source's

    def __init__(self, datapipe):
        self.datapipe = datapipe

    def __iter__(self):
        for x in self.datapipe:
            yield 2 * x


@datapipes.stateless
class Negated(IterDataPipe):
    def __init__(self, datapipe):
        self.datapipe = datapipe

    def __iter__(self):
        return (-x for x in self.datapipe)


def test_an_undeclared_stage_refuses_to_save_naming_it_and_the_ways_out():
    it = iter(Pairwise(IterableWrapper(range(6))).map(str))
    assert next(it) == "(0, 1)"
    with pytest.raises(TypeError) as info:
        it.state_dict()
    message = str(info.value)
    assert re.match(r"Pairwise \((\w+\.)*test_user_stages\.Pairwise\) cannot save its position: it is not one of "
                    r"datapipes' stages and says nothing about its state", message)
    assert "stateless = True" in message and "@datapipes.stateless" in message
    assert "state_dict() and load_state_dict(state)" in message
    assert list(it) == ["(1, 2)", "(2, 3)", "(3, 4)", "(4, 5)"]  # the pass itself goes on


def test_a_declared_stage_resumes_exactly():
    check_resume(lambda: Doubled(IterableWrapper(range(7))).batch(2))
    check_resume(lambda: Negated(IterableWrapper(range(7))).map(abs))


def test_the_decorator_sets_the_class_attribute_and_returns_the_class():
    assert Negated.stateless is True and Negated.__name__ == "Negated"
    with pytest.raises(TypeError, match="stateless: decorates a class, got function"):
        datapipes.stateless(lambda: None)


def test_a_declaration_other_than_true_counts_as_none():
    class Maybe(Doubled):
        stateless = "yes"

    it = iter(Maybe(IterableWrapper(range(3))))
    next(it)
    with pytest.raises(TypeError, match="Maybe .* cannot save its position"):
        it.state_dict()


def test_a_stage_whose_iterator_saves_itself_needs_no_declaration():
    from helpers import StatefulSource

    check_resume(lambda: StatefulSource(6).map(str))
