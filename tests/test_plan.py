"""The plan of a pass (datapipes._runtime.plan): one walk of the graph, and the same decisions as the
walks it replaced (graph order, shared seeds' order, the stages downstream of sharding, replayed
stages)."""

import pytest

from datapipes._runtime import plan as plan_module
from datapipes._runtime.plan import Plan, stage_key
from datapipes._runtime.worker import is_sharding_stage
from datapipes.graph import sources_of, stages, walk
from datapipes.iter import IterableWrapper, SampleMultiplexer
from datapipes.map import SequenceWrapper


def _pipes():
    a = IterableWrapper(range(10)).shuffle()
    b, c = a.fork(2)
    diamond = b.zip(c.shuffle().sharding_filter()).shuffle().batch(2)
    x, y = IterableWrapper(range(5)).shuffle(), IterableWrapper(range(5, 9)).shuffle()
    muxed = x.mux(y).sharding_filter().shuffle().map(abs)
    sampled = SampleMultiplexer({x.shuffle(): 1.0, y: 2.0}).sharding_filter()
    nested = IterableWrapper(range(4)).sharding_filter().shuffle().sharding_filter().shuffle()
    sampler = SequenceWrapper(list(range(6))).map(abs).shuffle().shuffle()
    return [IterableWrapper([1]), diamond, muxed, sampled, nested, sampler]


def _stop(stage):
    return stage._runs_sources_elsewhere


@pytest.mark.parametrize("pipe", _pipes(), ids=lambda p: type(p).__name__)
def test_the_plan_decides_as_the_separate_walks_did(pipe):
    plan = Plan(pipe)
    graph = list(walk(pipe, stop=_stop))
    assert plan.graph == graph
    assert plan.keys == {id(s): stage_key(i, s) for i, s in enumerate(graph)}
    assert plan.random == [s for s in graph if s._is_random]
    assert plan.sharding == [s for s in graph if is_sharding_stage(s)]
    below = set()
    for stage in stages(pipe):
        if is_sharding_stage(stage) or any(id(s) in below for s in sources_of(stage)):
            below.add(id(stage))
    assert plan.below_sharding == below
    for stage in plan.sharding:
        upstream = [s for src in sources_of(stage) for s in walk(src, stop=_stop) if s._is_random]
        assert plan.upstream_random(stage) == list(dict.fromkeys(upstream))
    for stage in graph:
        assert list(plan.walk(stage)) == list(walk(stage, stop=_stop))
        assert plan.key_of(stage) == plan.keys[id(stage)]
    assert plan.key_of(object()) == "-1:object"


def test_the_plan_asks_each_stage_for_its_sources_once(monkeypatch):
    calls = []

    def counted(stage):
        calls.append(id(stage))
        return sources_of(stage)

    monkeypatch.setattr(plan_module, "sources_of", counted)
    for pipe in _pipes():
        calls.clear()
        plan = Plan(pipe)
        for stage in plan.sharding:
            plan.upstream_random(stage)
        list(plan.walk(pipe))
        assert sorted(calls) == sorted({id(s) for s in stages(pipe)}), type(pipe).__name__


def test_stages_upstream_of_a_replaying_stage_are_replayed():
    pipe = SequenceWrapper(list(range(6))).map(abs).shuffle().shuffle()
    plan = Plan(pipe)
    replaying = [s for s in plan.graph if s._replays_sources]
    upstream = {id(s) for r in replaying for s in walk(r) if s is not r}
    assert replaying and plan.replayed == upstream
    assert not Plan(IterableWrapper(range(3)).shuffle()).replayed
