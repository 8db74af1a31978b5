"""datapipes._runtime.held: the walk that finds streams inside a pass state, saves them as plain data and opens
them again, copying a container only where something in it changed."""

import collections
import io

from datapipes import DataChunk
from datapipes._runtime import held as _held
from datapipes._runtime.held import MARK

Pair = collections.namedtuple("Pair", "path stream")


def no_stage(stage):
    return None


def freeze(state):
    return _held.freeze(state, no_stage, "Stage")


def test_a_state_without_streams_is_returned_as_it_is():
    state = {"buffer": [("a", 1), ("b", 2)], "rng": [3, tuple(range(625)), None], "nested": [[{"x": 1.5}]]}
    assert freeze(state) is state
    assert _held.thaw(state, no_stage) is state


def test_streams_deep_in_items_are_found_and_their_containers_kept():
    state = {"items": [Pair("a", io.BytesIO(b"abc")), DataChunk([io.StringIO("s")]), ("plain", 1),
                       {"k": [(0, io.BytesIO(b"deep"))]}]}
    state["items"][0].stream.read()  # read already: saved as it started
    saved = freeze(state)
    assert saved is not state and state["items"][2] is saved["items"][2]  # unchanged parts are shared
    assert saved["items"][0] == Pair("a", {MARK: {"memory": ["bytes", b"abc"], "name": None, "wrapped": False}})
    back = _held.thaw(saved, no_stage)
    assert type(back["items"][0]) is Pair and back["items"][0].stream.read() == b"abc"
    assert type(back["items"][1]) is DataChunk and back["items"][1][0].read() == "s"
    assert back["items"][3]["k"][0][1].read() == b"deep"
    assert isinstance(state["items"][0].stream, io.BytesIO)  # the state given is not changed


def test_a_buffer_of_pairs_holding_one_stream_is_walked():
    buffer = [(f"p{i}", i) for i in range(1000)]
    buffer[617] = ("p617", io.BytesIO(b"x"))
    saved = freeze({"buffer": buffer})
    assert saved["buffer"][617][1] == {MARK: {"memory": ["bytes", b"x"], "name": None, "wrapped": False}}
    assert saved["buffer"][:617] == buffer[:617]
