"""Checkpoint and resume of the joining and splitting stages: concat, zip, mux, fork, demux.

The law (docs/howto/checkpoint.rst): a pass stopped after k items and resumed from its state yields exactly
what the uninterrupted pass yields after its first k items.
"""

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datapipes.iter.muxing import Concater, Multiplexer
from datapipes.iter.zipping import Zipper
from datapipes.testing import check_resume

from helpers import StatefulSource


def fork(n, k=2, **kw):
    return StatefulSource(n).fork(k, **kw)


def demux(n, k=2, **kw):
    return StatefulSource(n).demux(k, lambda x: x % k, **kw)


BUILDS = {
    "concat": lambda: StatefulSource(3).concat(StatefulSource(0), StatefulSource(4, 10), StatefulSource(2, 20)),
    "concat one input": lambda: Concater(StatefulSource(5)),
    "concat empty first": lambda: StatefulSource(0).concat(StatefulSource(3)),
    "concat the same pipe twice": lambda: (lambda a: a.concat(StatefulSource(2, 10), a))(StatefulSource(3)),
    "concat a shared stage": lambda: (lambda a, b: a.concat(b, StatefulSource(1, 30), b.map(str)))(
        StatefulSource(3), StatefulSource(2, 10)),
    "concat of concats": lambda: StatefulSource(2).concat(StatefulSource(2, 10)).concat(
        StatefulSource(3, 20).concat(StatefulSource(1, 30))),
    "zip": lambda: StatefulSource(5).zip(StatefulSource(7, 10), StatefulSource(6, 20)),
    "zip one input": lambda: Zipper(StatefulSource(4)),
    "zip shortest first": lambda: StatefulSource(3).zip(StatefulSource(6, 10)),
    "mux": lambda: StatefulSource(5).mux(StatefulSource(7, 10), StatefulSource(6, 20)),
    "mux shortest last": lambda: StatefulSource(7).mux(StatefulSource(4, 10)),
    "mux one input": lambda: Multiplexer(StatefulSource(4)),
    "mux of concat": lambda: StatefulSource(2).concat(StatefulSource(3, 10)).mux(
        StatefulSource(6, 20).map(lambda x: -x)),
    "fork zip": lambda: (lambda a, b: a.zip(b.map(lambda x: -x)))(*fork(7)),
    "fork zip 3": lambda: (lambda a, b, c: c.zip(a, b))(*fork(7, 3)),
    "fork mux": lambda: (lambda a, b: a.mux(b))(*fork(7)),
    "fork concat": lambda: (lambda a, b: a.concat(b))(*fork(6)),
    "fork concat deep copies": lambda: (lambda a, b: a.concat(b.map(str)))(*fork(5, copy="deep")),
    "fork one child read": lambda: fork(5)[0],  # its sibling dropped (fork(1) is the source itself)
    "fork small buffer": lambda: (lambda a, b: a.mux(b))(*fork(9, buffer_size=1)),
    "demux zip": lambda: (lambda a, b: a.zip(b))(*demux(9)),
    "demux mux 3": lambda: (lambda a, b, c: a.mux(b, c))(*demux(13, 3)),
    "demux concat": lambda: (lambda a, b: b.concat(a))(*demux(7)),
    "demux drop none": lambda: (lambda a, b: b.concat(a))(
        *StatefulSource(11).demux(2, lambda x: None if x % 3 == 0 else x % 2, drop_none=True)),
    "demux of a fork": lambda: (lambda a, b: a.concat(*b.demux(2, lambda x: x % 2)))(*fork(6)),
}


class TestExact:
    @pytest.mark.parametrize("name", sorted(BUILDS))
    def test_resume_equals_the_uninterrupted_pass(self, name):
        full = check_resume(BUILDS[name])
        assert full, name

    @pytest.mark.parametrize("name", ["concat", "mux", "fork concat", "demux mux 3"])
    def test_state_through_torch_save(self, name):
        check_resume(BUILDS[name], through="torch")

    def test_every_k_of_a_nested_graph(self):
        def build():
            a, b = StatefulSource(8).fork(2)
            evens, odds = b.demux(2, lambda x: x % 2)
            return a.mux(evens.concat(odds)).concat(StatefulSource(3, 100).zip(StatefulSource(5, 200)))

        check_resume(build, lambda n: range(n + 1))

    def test_a_sibling_outside_the_pass_still_reads_everything(self):
        a, b = StatefulSource(6).fork(2)
        pipe = a.map(lambda x: x * 10)
        it = iter(pipe)
        head = [next(it) for _ in range(4)]
        state = pickle.loads(pickle.dumps(it.state_dict()))
        it.close()
        again = iter(pipe)
        again.load_state_dict(state)
        assert head + list(again) == [0, 10, 20, 30, 40, 50]
        assert list(b) == list(range(6))  # b never started: the resumed shared pass kept its items

    def test_a_child_that_had_left_ends_at_once(self):
        def build():
            a, b = StatefulSource(4).fork(2)
            return a.concat(b)

        it = iter(build())
        head = [next(it) for _ in range(6)]  # child a exhausted and gone, b in the middle
        state = it.state_dict()
        shared = state["stages"]["1:ForkerChild"]["shared"]
        assert shared["pos"][0] is None and shared["items"] == [2, 3]
        again = iter(build())
        again.load_state_dict(state)
        assert head + list(again) == [0, 1, 2, 3, 0, 1, 2, 3]


class TestWhatIsSaved:
    def test_zip_is_stateless(self):
        it = iter(StatefulSource(5).zip(StatefulSource(5)))
        next(it)
        assert [k for k in it.state_dict()["stages"] if "Zipper" in k] == []

    def test_concat_saves_the_input_index(self):
        it = iter(StatefulSource(2).concat(StatefulSource(3)))
        for _ in range(3):
            next(it)
        assert it.state_dict()["stages"]["0:Concater"] == {"input": 1}

    def test_mux_saves_the_rest_of_the_round(self):
        it = iter(StatefulSource(5).mux(StatefulSource(5, 10), StatefulSource(5, 20)))
        assert [next(it) for _ in range(4)] == [0, 10, 20, 1]
        assert it.state_dict()["stages"]["0:Multiplexer"] == {"round": [11, 21]}
        next(it), next(it)
        assert it.state_dict()["stages"]["0:Multiplexer"] == {"round": []}

    def test_fork_children_share_one_saved_object(self):
        a, b = StatefulSource(50).fork(2)
        it = iter(a.zip(b))
        for _ in range(10):
            next(it)
        stages = it.state_dict()["stages"]
        shared = [v["shared"] for k, v in stages.items() if "ForkerChild" in k]
        assert len(shared) == 2 and shared[0] is shared[1]

    def test_fork_state_holds_only_the_unread_items(self):
        a, b = StatefulSource(100).fork(2, buffer_size=200)
        it = iter(a.concat(b))
        for _ in range(60):
            next(it)
        shared = it.state_dict()["stages"]["1:ForkerChild"]["shared"]
        assert shared["items"] == list(range(60)) and shared["pos"] == [60, 0]

    def test_demux_state_holds_the_queues(self):
        evens, odds = StatefulSource(10).demux(2, lambda x: x % 2)
        it = iter(odds.concat(evens))
        assert [next(it) for _ in range(2)] == [1, 3]
        shared = it.state_dict()["stages"]["1:DemultiplexerChild"]["shared"]
        assert shared == {"queues": [[0, 2], []], "count": 4, "end": False}


class TestProtocol:
    @pytest.mark.parametrize("build", [
        lambda: StatefulSource(5).concat(StatefulSource(3)),
        lambda: StatefulSource(5).mux(StatefulSource(5)),
        lambda: (lambda a, b: a.zip(b))(*StatefulSource(5).fork(2)),
        lambda: (lambda a, b: a.zip(b))(*StatefulSource(6).demux(2, lambda x: x % 2)),
    ], ids=["concat", "mux", "fork", "demux"])
    def test_load_after_the_first_item_is_refused(self, build):
        it = iter(build())
        next(it)
        state = it.state_dict()
        next(it)
        with pytest.raises(RuntimeError, match="before the first next"):
            it.load_state_dict(state)

    def test_a_bad_concat_index_is_named(self):
        it = iter(StatefulSource(2).concat(StatefulSource(3)))
        state = it.state_dict()
        state["stages"]["0:Concater"] = {"input": 5}
        with pytest.raises(ValueError, match="Concater has 2 inputs"):
            iter(StatefulSource(2).concat(StatefulSource(3))).load_state_dict(state)

    def test_a_shared_pass_read_by_two_passes_cannot_be_saved(self):
        a, b = StatefulSource(10).fork(2)
        ia, ib = iter(a), iter(b)
        next(ia), next(ib)
        with pytest.raises(TypeError, match=r"Forker\(num_instances=2, buffer_size=1000\) cannot save its position"):
            ia.state_dict()
        with pytest.raises(TypeError, match="another pass started"):
            ib.state_dict()
        ia.close(), ib.close()

    def test_an_invalidated_shared_pass_cannot_be_saved(self):
        a, b = StatefulSource(10).fork(2)
        it = iter(a.zip(b))
        next(it)
        with pytest.warns(UserWarning, match="started a new pass"):
            next(iter(a.map(str)))  # another pass reads child a again: the shared pass restarts
        with pytest.raises(TypeError, match="invalidated"):
            it.state_dict()
        it.close()

    def test_resume_invalidates_an_unclosed_old_pass(self):
        build = BUILDS["fork zip"]
        pipe = build()
        it = iter(pipe)
        next(it)
        state = it.state_dict()
        again = iter(pipe)
        again.load_state_dict(state)
        with pytest.warns(UserWarning, match="started a new pass"):
            rest = list(again)
        assert rest == list(build())[1:]
        with pytest.raises(RuntimeError, match="invalidated"):
            next(it)


# -- random compositions ---------------------------------------------------------------------------

leaves = st.builds(lambda n, start: ("src", n, start), st.integers(0, 12), st.integers(0, 3).map(lambda s: s * 100))


def _nodes(children):
    joins = st.tuples(st.sampled_from(["concat", "zip", "mux"]), st.lists(children, min_size=1, max_size=3))
    splits = st.tuples(
        st.sampled_from(["fork", "demux"]), children, st.integers(1, 3), st.sampled_from(["concat", "zip", "mux"]),
    )
    maps = st.tuples(st.just("map"), children)
    return st.one_of(joins, splits, maps)


specs = st.recursive(leaves, _nodes, max_leaves=6)


def build_spec(spec):
    kind = spec[0]
    if kind == "src":
        return StatefulSource(spec[1], spec[2])
    if kind == "map":
        return build_spec(spec[1]).map(repr)
    if kind in ("fork", "demux"):
        _, inner, n, how = spec
        source = build_spec(inner)
        if kind == "fork":  # one child: fork(1) is the source itself, so a child of fork(2) read alone
            children = source.fork(n) if n > 1 else source.fork(2)[:1]
        else:
            children = source.demux(n, lambda x: hash(repr(x)) % n)
        return getattr(children[0], how)(*children[1:]) if n > 1 else children[0]
    pipes = [build_spec(s) for s in spec[1]]
    return getattr(pipes[0], kind)(*pipes[1:]) if len(pipes) > 1 else {"concat": Concater, "zip": Zipper,
                                                                       "mux": Multiplexer}[kind](pipes[0])


@settings(deadline=None)
@given(spec=specs, k=st.integers(0, 60))
def test_law_resume_equals_the_uninterrupted_run(spec, k):
    check_resume(lambda: build_spec(spec), lambda n: [min(k, n)])
