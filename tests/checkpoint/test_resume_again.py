"""A resumed concurrent pass saves and resumes again exactly, whenever its state is taken.

A resumed concurrent ``map`` or ``flatmap`` first recomputes the inputs its state held (and a
flatmap first yields the outputs left of the item it stopped inside). A state taken while it is
still doing so must hold what it has not done yet, in order, or a second resume loses items. These
tests reach that moment by construction, not by timing: a flatmap stopped inside an item resumes by
yielding that item's outputs before its engine starts; a state taken right after loading one comes
before the engine starts; a pass resumed with a smaller window keeps restored inputs waiting while
it yields. Each stopped pass is closed, its state goes through ``pickle``, and the parts of the
stopped passes together must equal the uninterrupted pass (ordered: the same sequence; completion
order: the same multiset, nothing lost or repeated).
"""

from __future__ import annotations

import asyncio
import itertools
import operator
import pickle
import threading
from typing import Any, Callable

import pytest

from datapipes.iter import IterableWrapper as W
from datapipes._engine import close_iterator
from datapipes.testing import same_multiset

from helpers import plain_process  # noqa: F401 - an autouse fixture: no RANK/WORLD_SIZE from the environment

pytestmark = pytest.mark.timeout(60)

N = 12

# each item's outputs are the item itself (a tuple): a builtin ``fn`` (``list``) travels to worker
# processes by reference, and every output is distinct
TRIPLES = [(x, -x - 1, 1000 + x) for x in range(N)]


async def alist(x: Any) -> list[Any]:
    await asyncio.sleep(0)
    return list(x)


async def aneg(x: int) -> int:
    await asyncio.sleep(0)
    return -x


def flatmap(fn: Callable[[Any], Any], **kw: Any) -> Callable[[int], Any]:
    return lambda c: W(TRIPLES).flatmap(fn, concurrency=c, **kw)


def mapped(fn: Callable[[Any], Any], **kw: Any) -> Callable[[int], Any]:
    return lambda c: W(range(N)).map(fn, concurrency=c, **kw)


def run_in_parts(build: Callable[[int], Any], ks: list[int], first: int = 2,
                 then: int = 2) -> tuple[list[Any], list[Any]]:
    """(the uninterrupted pass, the parts of passes stopped after each ``k`` of ``ks`` and resumed,
    then run to the end); the first pass is built with concurrency ``first``, the others with ``then``.
    Passes of one concurrency iterate one pipe (a process stage keeps its workers warm across them)."""
    pipes = {c: build(c) for c in {first, then}}
    full = list(pipes[then])
    got: list[Any] = []
    state = None
    for i, k in enumerate([*ks, None]):
        it = iter(pipes[first if i == 0 else then])
        try:
            if state is not None:
                it.load_state_dict(pickle.loads(pickle.dumps(state)))
            got += it if k is None else itertools.islice(it, k)
            state = it.state_dict() if k is not None else None
        finally:
            close_iterator(it)
    return full, got


def check(full: list[Any], got: list[Any], ordered: bool) -> None:
    if ordered:
        assert got == full
    else:
        assert len(got) == len(full) and same_multiset(got, full), (sorted(got), sorted(full))


ORDERS = [pytest.param(True, id="ordered"), pytest.param(False, id="unordered")]

# A process flatmap runs the engine's process loop as a process map does (MAPS), with a fn that
# makes each item's outputs a list; its workers import datapipes for that wrapper (seconds per pool
# here), so it is not repeated in this file.
FLATMAPS = {
    "thread": lambda ordered: flatmap(list, ordered=ordered),
    "async": lambda ordered: flatmap(alist, ordered=ordered),
}

MAPS = {
    "thread": lambda ordered: mapped(operator.neg, ordered=ordered),
    "async": lambda ordered: mapped(aneg, ordered=ordered),
    "process": lambda ordered: mapped(operator.neg, ordered=ordered, executor="process", chunksize=1),
}


@pytest.mark.parametrize("ordered", ORDERS)
@pytest.mark.parametrize("kind", list(FLATMAPS))
def test_a_flatmap_resumed_inside_an_item_saves_and_resumes_again(kind, ordered):
    """Stopped after 2 outputs (inside an item of 3), resumed, stopped after 1 more (the last output
    of that item, yielded before the engine starts), resumed: the inputs in flight are kept."""
    full, got = run_in_parts(FLATMAPS[kind](ordered), [2, 1])
    check(full, got, ordered)


@pytest.mark.parametrize("ordered", ORDERS)
def test_a_flatmap_resumed_after_every_output(ordered):
    """Every pass stops after one output: each state is taken by a pass that resumed from the last."""
    full, got = run_in_parts(FLATMAPS["thread"](ordered), [1] * (3 * N - 1))
    check(full, got, ordered)


@pytest.mark.parametrize("ordered", ORDERS)
@pytest.mark.parametrize("kind", list(FLATMAPS))
def test_a_flatmap_saved_right_after_loading_keeps_the_state(kind, ordered):
    """A state taken after ``load_state_dict`` and before the first ``next()`` is the state loaded."""
    full, got = run_in_parts(FLATMAPS[kind](ordered), [2, 0, 3, 0])
    check(full, got, ordered)


@pytest.mark.parametrize("ordered", ORDERS)
@pytest.mark.parametrize("kind", list(MAPS))
def test_a_map_saved_right_after_loading_keeps_the_state(kind, ordered):
    full, got = run_in_parts(MAPS[kind](ordered), [2, 0, 1, 0])
    check(full, got, ordered)


@pytest.mark.parametrize("ordered", ORDERS)
@pytest.mark.parametrize("kind", list(MAPS))
def test_a_map_saved_while_it_still_recomputes_restored_inputs(kind, ordered):
    """Saved with concurrency 4 (8 inputs in flight), resumed with concurrency 2 (a window of 4):
    the resumed pass yields while restored inputs still wait to be pulled, and saves then."""
    full, got = run_in_parts(MAPS[kind](ordered), [2, 1, 1], first=4, then=2)
    check(full, got, ordered)


@pytest.mark.parametrize("ordered", ORDERS)
def test_a_flatmap_saved_while_it_still_recomputes_restored_inputs(ordered):
    full, got = run_in_parts(FLATMAPS["thread"](ordered), [2, 1, 2, 1], first=4, then=2)
    check(full, got, ordered)


@pytest.mark.parametrize("ordered", ORDERS)
def test_the_state_of_a_pass_still_recomputing_holds_the_waiting_inputs_in_order(ordered):
    """The saved inputs are those in flight, then the restored ones not pulled yet, in their order."""
    it = iter(MAPS["thread"](ordered)(4))
    try:
        first = list(itertools.islice(it, 2))
        assert first == [0, -1] or not ordered
        state = it.state_dict()
    finally:
        close_iterator(it)
    saved = state["stages"]["0:Mapper"]
    it = iter(MAPS["thread"](ordered)(2))
    try:
        it.load_state_dict(state)
        assert it.state_dict()["stages"]["0:Mapper"] == saved  # loaded, not started: the state given
        next(it)
        again = it.state_dict()["stages"]["0:Mapper"]
    finally:
        close_iterator(it)
    restored = [x for _, x in saved["inputs"]]
    left = [x for _, x in again["inputs"]]
    assert len(left) == len(restored) - 1
    if ordered:
        assert left == restored[1:]
    else:
        assert set(left) < set(restored)
    positions = [k for k, _ in again["inputs"]]
    assert positions == sorted(positions) and positions[-1] < again["pulled"]
    assert again["pulled"] == saved["pulled"]


RELEASE = threading.Event()


def held_first(x: int, rng: Any) -> tuple[int, float]:
    """``(x, a draw of its generator)``; item 0 waits for ``RELEASE``."""
    if x == 0:
        RELEASE.wait(10)
    return x, rng.random()


def test_a_completion_order_map_with_a_gap_keeps_the_item_seeds_of_the_source():
    """Saved with item 0 still running and later items taken (positions in flight with a gap), then
    resumed: the source's next items get the seeds (positions) they had in the uninterrupted pass."""

    def build(c: int) -> Any:
        return W(range(N)).map(held_first, concurrency=c, ordered=False, rng="python").set_seed(7)

    RELEASE.set()
    full = list(build(2))
    RELEASE.clear()
    it = iter(build(2))
    try:
        got = list(itertools.islice(it, 2))  # not item 0: it waits
        state = it.state_dict()
    finally:
        RELEASE.set()
        close_iterator(it)
    positions = [k for k, _ in state["stages"]["0:Mapper"]["inputs"]]
    assert positions[0] == 0 and positions[-1] - positions[0] >= len(positions)  # a gap after item 0
    for k in (1, None):
        it = iter(build(2))
        try:
            it.load_state_dict(pickle.loads(pickle.dumps(state)))
            got += it if k is None else itertools.islice(it, k)
            state = it.state_dict() if k is not None else None
        finally:
            close_iterator(it)
    check(full, got, ordered=False)
