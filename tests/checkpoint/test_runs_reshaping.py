"""The explicit runs of unbatch, repeat, shuffled_flatmap and SPDL's aggregate (issue 41).

Each stage's run is written by its loop (once per item read, or once per output for the index
``shuffled_flatmap`` draws) instead of being read from the suspended generator's frame. The states
are the ones the frame-reading runs saved, at every position: the expected sequences here were
taken from them, so a state saved before still loads. Every state resumes exactly, and a malformed
one is refused as it is loaded, with a ``ValueError`` naming the stage and its key.
"""

import copy
import pickle
import re
from pathlib import Path

import pytest

import datapipes
from datapipes.iter import IterableWrapper as W
from datapipes.spdl._builder import Aggregated
from datapipes.testing import check_resume


class Window:
    """An aggregator that keeps the last item after each aggregate: its state is never empty."""

    def __init__(self):
        self.items = []

    def accumulate(self, x):
        self.items.append(x)
        if len(self.items) == 2:
            out, self.items = list(self.items), self.items[1:]
            return out
        return None

    def flush(self):
        return ["end", *self.items]


def twice_mod_3(x):
    yield from range(x % 3)


#: name -> (build, the key of the stage's state)
BUILDS = {
    "unbatch": (lambda: W([[0, 1], [], (2,), [3, 4, 5]]).unbatch(), "0:Unbatcher"),
    "unbatch-level2": (lambda: W([[[0], [1, 2]], [[], [3]], [[4], [5]]]).unbatch(unbatch_level=2), "0:Unbatcher"),
    "unbatch-level2-bad": (lambda: W([[[0], [1, 2]], [[], [3]], [[4], 5]]).unbatch(unbatch_level=2), "0:Unbatcher"),
    "unbatch-all": (lambda: W([0, [1, [2, []]], [], 3]).unbatch(unbatch_level=-1), "0:Unbatcher"),
    "repeat": (lambda: W(["a", None]).repeat(2), "0:Repeater"),
    "shuffled_flatmap": (lambda: W([[0, 1], "ab", [], (2,)]).shuffled_flatmap(buffer_size=2).set_seed(0),
                         "0:ShuffledFlatMapper"),
    "shuffled_flatmap-generators": (lambda: W([1, 2, 4]).shuffled_flatmap(twice_mod_3, buffer_size=2).set_seed(1),
                                    "0:ShuffledFlatMapper"),
    "aggregate": (lambda: Aggregated(W([1, 2, 3]), Window()), "0:Aggregated"),
}

R = "<rng>"  # a generator's state (625 ints): checked apart

#: name -> (the items, then "!" where the pass raises; the stage's state before the first item and
#: after each item, or after the error)
EXPECTED = {
    "unbatch": ([0, 1, 2, 3, 4, 5], [
        {"next": 0},
        {"next": 1, "rest": [1]},
        {"next": 1, "rest": []},
        {"next": 3, "rest": []},
        {"next": 4, "rest": [4, 5]},
        {"next": 4, "rest": [5]},
        {"next": 4, "rest": []},
    ]),
    "unbatch-level2": ([0, 1, 2, 3, 4, 5], [
        {"next": 0},
        {"next": 1, "rest": [1, 2]},
        {"next": 1, "rest": [2]},
        {"next": 1, "rest": []},
        {"next": 2, "rest": []},
        {"next": 3, "rest": [5]},
        {"next": 3, "rest": []},
    ]),
    "unbatch-level2-bad": ([0, 1, 2, 3, 4, "!"], [
        {"next": 0},
        {"next": 1, "rest": [1, 2]},
        {"next": 1, "rest": [2]},
        {"next": 1, "rest": []},
        {"next": 2, "rest": []},
        {"next": 3, "rest": [], "bad": [[2, 1], 5]},
        {"ended": True},
    ]),
    "unbatch-all": ([0, 1, 2, 3], [
        {"next": 0},
        {"next": 1, "rest": []},
        {"next": 2, "rest": [2]},
        {"next": 2, "rest": []},
        {"next": 4, "rest": []},
    ]),
    "repeat": (["a", "a", None, None], [
        {"next": 0},
        {"item": "a", "left": 1},
        {"left": 0},
        {"item": None, "left": 1},
        {"left": 0},
    ]),
    "shuffled_flatmap": ([0, 1, "a", "b", 2], [
        {"rng": R, "idx": None, "next": 0, "draining": False, "slots": []},
        {"rng": R, "idx": 0, "next": 2, "draining": False,
         "slots": [{"item": 0, "rest": [1]}, {"item": 1, "rest": ["a", "b"]}], "held": []},
        {"rng": R, "idx": 0, "next": 2, "draining": False,
         "slots": [{"item": 0, "rest": []}, {"item": 1, "rest": ["a", "b"]}], "held": []},
        {"rng": R, "idx": 0, "next": 3, "draining": False,
         "slots": [{"item": 1, "rest": ["b"]}, {"item": 2, "rest": []}], "held": (2,)},
        {"rng": R, "idx": 0, "next": 3, "draining": False,
         "slots": [{"item": 1, "rest": []}, {"item": 2, "rest": []}], "held": (2,)},
        {"rng": R, "idx": 0, "next": 4, "draining": True, "slots": [{"item": 3, "rest": []}]},
    ]),
    "shuffled_flatmap-generators": ([0, 1, 0, 0], [
        {"rng": R, "idx": None, "next": 0, "draining": False, "slots": []},
        {"rng": R, "idx": 1, "next": 2, "draining": False,
         "slots": [{"item": 0, "input": 1, "done": 0}, {"item": 1, "input": 2, "done": 1}], "held": 4},
        {"rng": R, "idx": 1, "next": 2, "draining": False,
         "slots": [{"item": 0, "input": 1, "done": 0}, {"item": 1, "input": 2, "done": 2}], "held": 4},
        {"rng": R, "idx": 1, "next": 3, "draining": True,
         "slots": [{"item": 0, "input": 1, "done": 0}, {"item": 2, "input": 4, "done": 1}]},
        {"rng": R, "idx": 0, "next": 3, "draining": True, "slots": [{"item": 0, "input": 1, "done": 1}]},
    ]),
    "aggregate": ([[1, 2], [2, 3], ["end", 3]], [
        {"next": 0},
        {"aggregator": {"items": [2]}},
        {"aggregator": {"items": [3]}},
        {"ended": True},
    ]),
}


def plain(state):
    """A stage's state with its generator's state replaced by ``R`` (checked to be one) and an
    aggregator by its attributes."""
    state = dict(state)
    if "rng" in state:
        version, internal, _ = state["rng"]
        assert version == 3 and len(internal) == 625 and all(type(v) is int for v in internal)
        state["rng"] = R
    if "aggregator" in state:
        state["aggregator"] = vars(state["aggregator"])
    return state


def states_along(name):
    """The items of a pass of ``BUILDS[name]`` ("!" for an error), and after each (and before the
    first) the whole state, through pickle."""
    build, _ = BUILDS[name]
    it = iter(build())
    items, states = [], [pickle.loads(pickle.dumps(it.state_dict()))]
    while True:
        try:
            items.append(next(it))
        except StopIteration:
            break
        except TypeError:
            items.append("!")
            states.append(pickle.loads(pickle.dumps(it.state_dict())))
            break
        states.append(pickle.loads(pickle.dumps(it.state_dict())))
    return items, states


@pytest.mark.parametrize("name", BUILDS)
def test_the_states_at_every_position_are_the_frame_runs(name):
    _, key = BUILDS[name]
    items, states = states_along(name)
    want_items, want_states = EXPECTED[name]
    assert items == want_items
    assert [plain(s["stages"][key]) for s in states] == want_states


@pytest.mark.parametrize("name", BUILDS)
def test_every_state_resumes_exactly(name):
    build, key = BUILDS[name]
    items, states = states_along(name)
    for k, state in enumerate(states):
        it = iter(build())
        it.load_state_dict(copy.deepcopy(state))
        assert plain(it.state_dict()["stages"][key]) == plain(state["stages"][key])  # loaded, not started: as it is
        rest = []
        try:
            rest.extend(it)
        except TypeError:
            rest.append("!")
        assert items[:k] + rest == items, k
        if not name.endswith("-bad"):
            assert it.state_dict()["stages"][key] == {"ended": True}


@pytest.mark.parametrize("name", [n for n in BUILDS if not n.endswith("-bad")])
def test_resume_law(name):
    check_resume(BUILDS[name][0], lambda n: range(n + 1), through="torch")


def test_a_resumed_pass_saves_the_states_of_the_uninterrupted_one():
    for name in BUILDS:
        build, key = BUILDS[name]
        items, states = states_along(name)
        for k in range(1, len(states)):
            it = iter(build())
            it.load_state_dict(copy.deepcopy(states[k]))
            for j in range(k + 1, len(states)):
                try:
                    next(it)
                except TypeError:
                    pass
                got, want = it.state_dict()["stages"][key], states[j]["stages"][key]
                assert plain(got) == plain(want), (name, k, j)


def test_the_unbatch_level2_error_is_raised_after_a_resume():
    build, _ = BUILDS["unbatch-level2-bad"]
    _, states = states_along("unbatch-level2-bad")
    with pytest.raises(TypeError, match=r"item 2\[1\] is an int") as want:
        list(build())
    it = iter(build())
    it.load_state_dict(states[5])  # after 4, the error still to raise
    with pytest.raises(TypeError) as raised:
        next(it)
    assert str(raised.value) == str(want.value)


def test_the_aggregator_state_is_a_copy():
    build, key = BUILDS["aggregate"]
    it = iter(build())
    next(it)
    saved = it.state_dict()["stages"][key]["aggregator"]
    next(it)
    assert saved.items == [2]  # the pass's own aggregator went on


#: name -> (the stage's state, the message; stage and key are named too)
MALFORMED = {
    "unbatch": [
        ({}, r"the state has no 'next'"),
        ({"ended": False}, r"state\['ended'\] must be True, got False"),
        ({"next": -1}, r"state\['next'\] must be an int >= 0, got -1"),
        ({"next": "1"}, r"state\['next'\] must be an int >= 0, got '1'"),
        ({"next": 1, "rest": 5}, r"state\['rest'\] must be a list, got 5"),
        ({"next": 1, "rest": [], "left": -1}, r"state\['left'\] must be an int >= 0, got -1"),
        ({"next": 1, "seed": "x"}, r"state\['seed'\] must be an int or None, got 'x'"),
    ],
    "unbatch-level2": [
        ({"next": 1, "bad": [[0, 1], 5]}, r"the state has no 'rest'"),
        ({"next": 1, "rest": [], "bad": 5}, r"state\['bad'\] must be a \[path, item\] pair, got 5"),
    ],
    "repeat": [
        ({"left": 2}, r"the state has no 'item'"),
        ({"left": -1, "item": 0}, r"state\['left'\] must be an int >= 0, got -1"),
        ({"ended": True, "left": "2"}, r"state\['left'\] must be an int >= 0, got '2'"),
    ],
    "shuffled_flatmap": [
        ("garbage", r"not the state of a shuffled_flatmap"),
        ({"next": 0}, r"not the state of a shuffled_flatmap"),
        ({"ended": True, "next": -2}, r"state\['next'\] must be an int >= 0, got -2"),
        ({"ended": 1}, r"state\['ended'\] must be True, got 1"),
    ],
    "aggregate": [
        ({"ended": "yes"}, r"state\['ended'\] must be True, got 'yes'"),
        ({"next": "0"}, r"state\['next'\] must be an int >= 0, got '0'"),
        ({"failures": -1}, r"state\['failures'\] must be an int >= 0, got -1"),
    ],
}

_SFM_EDITS = [
    ("idx", 2, r"state\['idx'\] must be an int from 0 to 1 or None, got 2"),
    ("draining", 1, r"state\['draining'\] must be a bool, got 1"),
    ("slots", [{"item": 0, "rest": []}] * 3, r"state\['slots'\] holds 3 items, more than buffer_size=2 allows"),
    ("slots", [{"item": 0}], r"a slot of state\['slots'\] holds neither 'rest' nor 'input'"),
    ("rng", [1, 2], r"state\['rng'\] is not the state of a random generator"),
]


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


def test_a_malformed_shuffled_flatmap_state_is_refused_naming_the_stage():
    _, states = states_along("shuffled_flatmap")
    good = states[1]["stages"]["0:ShuffledFlatMapper"]
    for field, value, message in _SFM_EDITS:
        _refused("shuffled_flatmap", {**copy.deepcopy(good), field: value}, message)


def test_a_started_pass_refuses_a_state():
    build, _ = BUILDS["repeat"]
    it = iter(build())
    state = it.state_dict()
    next(it)
    with pytest.raises(RuntimeError):
        it.load_state_dict(state)


def test_these_stages_read_no_generator_frame():
    root = Path(datapipes.__file__).parent
    for path in ("iter/batching.py", "iter/reshaping.py", "iter/shuffling.py", "spdl/_builder.py"):
        text = (root / path).read_text()
        for word in ("gi_frame", "getgeneratorlocals", "gi_yieldfrom", "gi_code", "FrameRun", "track_generator"):
            assert word not in text, (path, word)
