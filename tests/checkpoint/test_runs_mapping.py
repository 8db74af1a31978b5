"""The explicit runs of the serial mapping loops (issue 41): ``map`` under a failure budget or with
``rng=``, ``filter`` under a failure budget, ``map_batches`` and ``flatmap`` (sync and async).

Each stage's run is given its position by its loop (a store per item handed out, per batch, or, for
``flatmap``, a function of the loop's that reads its position) instead of being read from the
suspended generator's frame. The states are the ones the frame-reading runs saved, at every
position: the expected sequences here were taken from them, so a state saved before still loads.
Every state resumes exactly, and a malformed one is refused as it is loaded, with a ``ValueError``
naming the stage and its key. A told ``map`` (over a source that tells its position) hands its
source's reader to its consumer without reading its generator's frame either.
"""

import asyncio
import copy
import gc
import logging
import pickle
import re
from pathlib import Path

import pytest

import datapipes
from datapipes.iter import IterableWrapper as W
from datapipes.iter.mapping import _shared
from datapipes.testing import check_resume


@pytest.fixture(autouse=True)
def quiet_skips():
    """The skipped items' log lines are not what these tests look at."""
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def odd_fails(x):
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


def draw(x, rng):
    return x, rng.randrange(100)


def draw_odd_fails(x, rng):
    return odd_fails(x), rng.randrange(100)


def keep_fours(x):
    return odd_fails(x) % 4 == 0


def sums(batch):
    return [sum(batch), len(batch)]


def pairs(batch):
    for x in batch:
        yield x
        yield -x


def repeated(x):
    return [x] * x


def counted(x):
    yield from range(x)


def late_fail(x):
    yield x
    if x % 3 == 1:
        raise ValueError(f"late {x}")
    yield -x


async def acounted(x):
    for i in range(x):
        await asyncio.sleep(0)
        yield i


#: skipping failures under a budget, without the warning a share of failures this high gives
SKIP = {"on_error": "skip", "warn_failures": None}

#: name -> (build, the key of the stage's state)
BUILDS = {
    "map-budget": (lambda: W(range(6)).map(odd_fails, max_failures=5, **SKIP), "0:Mapper"),
    "map-budget-gives-up": (lambda: W(range(6)).map(odd_fails, max_failures=1, **SKIP), "0:Mapper"),
    "map-rng": (lambda: W(range(3)).map(draw, rng="python").set_seed(0), "0:Mapper"),
    "map-rng-budget": (lambda: W(range(5)).map(draw_odd_fails, rng="python", max_failures=5, **SKIP).set_seed(1),
                       "0:Mapper"),
    "filter-budget": (lambda: W(range(9)).filter(keep_fours, max_failures=5, **SKIP), "0:Filter"),
    "map_batches": (lambda: W(range(5)).map_batches(sums, 2), "0:BatchMapper"),
    "map_batches-generator": (lambda: W(range(3)).map_batches(pairs, 2), "0:BatchMapper"),
    "flatmap": (lambda: W([1, 0, 2]).flatmap(repeated), "0:FlatMapper"),
    "flatmap-generator": (lambda: W([2, 0, 1]).flatmap(counted), "0:FlatMapper"),
    "flatmap-items": (lambda: W([[0, 1], (2,), []]).flatmap(), "0:FlatMapper"),
    "flatmap-budget": (lambda: W(range(5)).flatmap(late_fail, max_failures=5, **SKIP), "0:FlatMapper"),
    "flatmap-async": (lambda: W([2, 0, 1]).flatmap(acounted), "0:FlatMapper"),
}

S = "<seed>"  # a pass seed: an int, the same in every state of a pass (checked apart)
D = "<draw>"  # a number an item's generator drew

#: name -> (the items, then "!" where the pass raises; the stage's state before the first item and
#: after each item, then once the pass has ended or failed)
EXPECTED = {
    "map-budget": ([0, 2, 4], [
        {"next": 0},
        {"next": 1, "failures": 0},
        {"next": 3, "failures": 1},
        {"next": 5, "failures": 2},
        {"ended": True},
    ]),
    "map-budget-gives-up": ([0, 2, "!"], [
        {"next": 0},
        {"next": 1, "failures": 0},
        {"next": 3, "failures": 1},
        {"ended": True},
    ]),
    "map-rng": ([(0, D), (1, D), (2, D)], [
        {"next": 0},
        {"seed": S, "next": 1},
        {"seed": S, "next": 2},
        {"seed": S, "next": 3},
        {"ended": True},
    ]),
    "map-rng-budget": ([(0, D), (2, D), (4, D)], [
        {"next": 0},
        {"seed": S, "next": 1, "failures": 0},
        {"seed": S, "next": 3, "failures": 1},
        {"seed": S, "next": 5, "failures": 2},
        {"ended": True},
    ]),
    "filter-budget": ([0, 4, 8], [
        {"next": 0},
        {"next": 1, "failures": 0},
        {"next": 5, "failures": 2},
        {"next": 9, "failures": 4},
        {"ended": True},
    ]),
    "map_batches": ([1, 2, 5, 2, 4, 1], [
        {"next": 0},
        {"next": 1, "rest": [2]},
        {"next": 1, "rest": []},
        {"next": 2, "rest": [2]},
        {"next": 2, "rest": []},
        {"next": 3, "rest": [1]},
        {"next": 3, "rest": []},
        {"ended": True},
    ]),
    "map_batches-generator": ([0, 0, 1, -1, 2, -2], [
        {"next": 0},
        {"next": 1, "input": [0, 1], "done": 1},
        {"next": 1, "input": [0, 1], "done": 2},
        {"next": 1, "input": [0, 1], "done": 3},
        {"next": 1, "input": [0, 1], "done": 4},
        {"next": 2, "input": [2], "done": 1},
        {"next": 2, "input": [2], "done": 2},
        {"ended": True},
    ]),
    "flatmap": ([1, 2, 2], [
        {"next": 0},
        {"next": 1, "rest": []},
        {"next": 3, "rest": [2]},
        {"next": 3, "rest": []},
        {"ended": True},
    ]),
    "flatmap-generator": ([0, 1, 0], [
        {"next": 0},
        {"next": 1, "input": 2, "done": 1},
        {"next": 1, "input": 2, "done": 2},
        {"next": 3, "input": 1, "done": 1},
        {"ended": True},
    ]),
    "flatmap-items": ([0, 1, 2], [
        {"next": 0},
        {"next": 1, "rest": [1]},
        {"next": 1, "rest": []},
        {"next": 2, "rest": []},
        {"ended": True},
    ]),
    "flatmap-budget": ([0, 0, 1, 2, -2, 3, -3, 4], [
        {"next": 0},
        {"next": 1, "failures": 0, "input": 0, "done": 1},
        {"next": 1, "failures": 0, "input": 0, "done": 2},
        {"next": 2, "failures": 0, "input": 1, "done": 1},
        {"next": 3, "failures": 1, "input": 2, "done": 1},
        {"next": 3, "failures": 1, "input": 2, "done": 2},
        {"next": 4, "failures": 1, "input": 3, "done": 1},
        {"next": 4, "failures": 1, "input": 3, "done": 2},
        {"next": 5, "failures": 1, "input": 4, "done": 1},
        {"ended": True},
    ]),
    "flatmap-async": ([0, 1, 0], [
        {"next": 0},
        {"next": 1, "input": 2, "done": 1},
        {"next": 1, "input": 2, "done": 2},
        {"next": 3, "input": 1, "done": 1},
        {"ended": True},
    ]),
}


def plain_item(x):
    """An item with the number its generator drew (a ``map(rng=)``'s) replaced by ``D``."""
    if type(x) is tuple and len(x) == 2 and type(x[1]) is int:
        return (x[0], D)
    return x


def plain(states):
    """A pass's stage states with their pass seed replaced by ``S`` (checked to be one int)."""
    seeds = {s["seed"] for s in states if "seed" in s}
    assert len(seeds) <= 1 and all(type(seed) is int for seed in seeds), seeds
    return [{k: S if k == "seed" else v for k, v in s.items()} for s in states]


def states_along(name):
    """The items of a pass of ``BUILDS[name]`` ("!" for an error), and before the first, after each
    and at the end, the whole state, through pickle."""
    build, _ = BUILDS[name]
    it = iter(build())
    items, states = [], [pickle.loads(pickle.dumps(it.state_dict()))]
    while True:
        try:
            items.append(next(it))
        except StopIteration:
            states.append(pickle.loads(pickle.dumps(it.state_dict())))
            break
        except ExceptionGroup:
            items.append("!")
            states.append(pickle.loads(pickle.dumps(it.state_dict())))
            break
        states.append(pickle.loads(pickle.dumps(it.state_dict())))
    return items, states


def rest_of(it):
    out = []
    try:
        out.extend(it)
    except ExceptionGroup:
        out.append("!")
    return out


@pytest.mark.parametrize("name", BUILDS)
def test_the_states_at_every_position_are_the_frame_runs(name):
    _, key = BUILDS[name]
    items, states = states_along(name)
    want_items, want_states = EXPECTED[name]
    assert [plain_item(x) for x in items] == want_items
    assert plain([s["stages"][key] for s in states]) == want_states


@pytest.mark.parametrize("name", BUILDS)
def test_every_state_resumes_exactly(name):
    build, key = BUILDS[name]
    items, states = states_along(name)
    for k, state in enumerate(states[:-1]):  # the last: the pass had ended (or failed)
        it = iter(build())
        it.load_state_dict(copy.deepcopy(state))
        assert it.state_dict()["stages"][key] == state["stages"][key]  # loaded, not started: as it is
        rest = rest_of(it)
        assert items[:k] + rest == items, k
        assert it.state_dict()["stages"][key] == {"ended": True}


@pytest.mark.parametrize("name", [n for n in BUILDS if n != "map-budget-gives-up"])
def test_resume_law(name):
    check_resume(BUILDS[name][0], lambda n: range(n + 1), through="torch")


def test_a_resumed_pass_saves_the_states_of_the_uninterrupted_one():
    for name, (build, key) in BUILDS.items():
        _, states = states_along(name)
        for k in range(1, len(states) - 1):
            it = iter(build())
            it.load_state_dict(copy.deepcopy(states[k]))
            for j in range(k + 1, len(states)):
                try:
                    next(it)
                except (StopIteration, ExceptionGroup):
                    pass
                assert it.state_dict()["stages"][key] == states[j]["stages"][key], (name, k, j)


def test_a_resumed_budget_gives_up_where_the_uninterrupted_pass_does():
    _, states = states_along("map-budget-gives-up")
    it = iter(BUILDS["map-budget-gives-up"][0]())
    it.load_state_dict(states[2])  # after 2, one failure counted: the next one is past the budget
    with pytest.raises(ExceptionGroup):
        next(it)


def test_an_unseeded_rng_map_resumes_with_the_saved_seed():
    def build():
        return W(range(6)).map(draw, rng="python")  # not seeded: a new pass seed every pass

    it = iter(build())
    next(it), next(it)
    state = it.state_dict()
    rest = list(it)
    again = iter(build())
    again.load_state_dict(state)
    assert list(again) == rest


def test_a_state_saved_after_the_pass_ended_resumes_as_before():
    # The frame-reading runs' behaviour, kept: a map or filter under a budget (or with rng=) resumed
    # from its ended state goes on with what its source has left, counting from 0 again (a pass that
    # gave up left 4 and 5: 4 comes out, 5 is skipped); a map_batches or a flatmap yields nothing.
    for name, (build, key) in BUILDS.items():
        _, states = states_along(name)
        it = iter(build())
        it.load_state_dict(copy.deepcopy(states[-1]))
        assert rest_of(it) == ([4] if name == "map-budget-gives-up" else []), name
        assert it.state_dict()["stages"][key] == {"ended": True}, name


#: name -> (the stage's state, the message; stage and key are named too)
MALFORMED = {
    "map-budget": [
        ("garbage", r"the state must be a dict, got str: 'garbage'"),
        ({}, r"the state has no 'next'"),
        ({"ended": False}, r"state\['ended'\] must be True, got False"),
        ({"next": -1}, r"state\['next'\] must be an int >= 0, got -1"),
        ({"next": True}, r"state\['next'\] must be an int >= 0, got True"),
        ({"next": 1, "failures": "2"}, r"state\['failures'\] must be an int >= 0, got '2'"),
        ({"next": 1, "rest": 5}, r"state\['rest'\] must be a list, got 5"),
        ({"next": 1, "left": -1}, r"state\['left'\] must be an int >= 0, got -1"),
        ({"next": 1, "seed": "x"}, r"state\['seed'\] must be an int or None, got 'x'"),
        ({"failures": -1}, r"state\['failures'\] must be an int >= 0, got -1"),
    ],
    "map-rng": [
        ({"seed": 3}, r"the state has no 'next'"),
        ({"next": 1, "seed": None}, r"state\['seed'\] must be an int, got None"),
        ({"next": "1", "seed": 3}, r"state\['next'\] must be an int >= 0, got '1'"),
    ],
    "filter-budget": [
        ({"next": "0"}, r"state\['next'\] must be an int >= 0, got '0'"),
        ({"failures": -1}, r"state\['failures'\] must be an int >= 0, got -1"),
        ({"ended": "yes"}, r"state\['ended'\] must be True, got 'yes'"),
    ],
    "map_batches": [
        ({}, r"the state has no 'next'"),
        ({"next": 1, "input": [0]}, r"the state has no 'done'"),
        ({"next": 1, "input": 5, "done": 0}, r"state\['input'\] must be a list, got 5"),
        ({"next": 1, "input": [0], "done": -1}, r"state\['done'\] must be an int >= 0, got -1"),
        ({"next": 1, "rest": "ab"}, r"state\['rest'\] must be a list, got 'ab'"),
    ],
    "flatmap": [
        ({}, r"the state has no 'next'"),
        ({"ended": 1}, r"state\['ended'\] must be True, got 1"),
        ({"next": 1, "input": 3}, r"the state has no 'done'"),
        ({"next": 1, "input": 3, "done": "1"}, r"state\['done'\] must be an int >= 0, got '1'"),
        ({"next": 1, "rest": {}}, r"state\['rest'\] must be a list, got \{\}"),
    ],
    "flatmap-async": [
        ({"next": 1, "input": 3}, r"the state has no 'done'"),
        ({"next": -3}, r"state\['next'\] must be an int >= 0, got -3"),
    ],
}


def _refused(name, stage_state, message):
    build, key = BUILDS[name]
    state = pickle.loads(pickle.dumps(iter(build()).state_dict()))
    state["stages"][key] = stage_state
    it = iter(build())
    label = re.escape(datapipes.graph.stage_label(build()))
    with pytest.raises(ValueError, match=rf"{label} \(state\['stages'\]\['{key}'\]\): {message}"):
        it.load_state_dict(state)


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_state_is_refused_naming_the_stage(name):
    for stage_state, message in MALFORMED[name]:
        _refused(name, stage_state, message)


def test_a_filter_state_may_leave_out_the_position():
    # as before: a filter's state without "next" starts from the first item (a map's is refused)
    build, key = BUILDS["filter-budget"]
    state = iter(build()).state_dict()
    state["stages"][key] = {"failures": 1}
    it = iter(build())
    it.load_state_dict(state)
    assert rest_of(it) == [0, 4, 8]


@pytest.mark.parametrize("name", ["map-budget", "map-rng", "map_batches", "flatmap", "flatmap-async"])
def test_a_started_pass_refuses_a_state(name):
    build, _ = BUILDS[name]
    it = iter(build())
    state = it.state_dict()
    next(it)
    with pytest.raises(RuntimeError):
        it.load_state_dict(state)


# -- a told map's reader ---------------------------------------------------------------------------


def test_a_told_map_hands_its_source_reader_to_its_consumer():
    gen = iter(W([1, 2, 3], deepcopy=False).map(lambda x: x))._it
    taken = _shared.taken_reader(gen)
    assert taken is not None
    assert taken() == 0
    next(gen)
    next(gen)
    assert taken() == 2


def test_the_record_of_a_told_map_goes_with_its_generator():
    gc.collect()
    before = len(_shared._TOLD)
    gens = [iter(W([1, 2], deepcopy=False).map(lambda x: x))._it for _ in range(5)]
    assert len(_shared._TOLD) == before + 5
    del gens
    gc.collect()
    assert len(_shared._TOLD) == before


def test_only_a_generator_can_be_told():
    assert _shared.taken_reader(iter({1: 2})) is None  # an iterator that takes no weak reference
    assert _shared.taken_reader(x for x in [1]) is None


# -- no frames -------------------------------------------------------------------------------------


def test_these_stages_read_no_generator_frame():
    root = Path(datapipes.__file__).parent / "iter" / "mapping"
    paths = sorted(root.glob("*.py"))
    assert {p.name for p in paths} >= {"map.py", "filter.py", "batches.py", "flatmap.py", "_shared.py"}
    for path in paths:
        text = path.read_text()
        for word in ("gi_frame", "getgeneratorlocals", "gi_yieldfrom", "gi_code", "f_locals", "FrameRun",
                     "track_generator"):
            assert word not in text, (path.name, word)
