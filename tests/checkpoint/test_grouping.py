"""Checkpoint and resume of the grouping stages (batch, unbatch, bucketbatch, groupby) and of flatmap.

The law (docs/howto/checkpoint.rst): a pass stopped after k items and resumed from its state yields exactly
what the uninterrupted pass yields after its first k items.
"""

import asyncio
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data.datapipes.datapipe import DataChunk

from datapipes.iter import IterableWrapper
from datapipes.testing import check_resume

from helpers import PlusOne, StatefulSource


def stopped(build, k):
    """The first k items of a pass and its state after them, through pickle."""
    it = iter(build())
    head = [next(it) for _ in range(k)]
    state = pickle.loads(pickle.dumps(it.state_dict()))
    it.close()
    return head, state


def ks(n):
    return sorted({0, min(1, n), n // 2, max(n - 1, 0), n})


def stage_state(it, name):
    """The state ``it`` saves for its stage of class ``name`` (the only one of that class)."""
    [state] = [v for k, v in it.state_dict()["stages"].items() if k.endswith(":" + name)]
    return state


def nested(x):
    return x if x % 3 == 0 else [x, [x + 100, (x + 200,)], []]


def repeat_gen(x):
    for i in range(x % 4):
        yield x * 10 + i


async def arepeat(x):
    for i in range(x % 3):
        await asyncio.sleep(0)
        yield x * 10 + i


def fails_on_5(x):
    if x == 5:
        raise ValueError("no 5")
    return [x, -x]


def gen_fails_after_one(x):
    yield x
    if x % 4 == 1:
        raise ValueError(f"late {x}")
    yield -x


BUILDS = {
    # Batcher: stateless
    "batch": lambda: StatefulSource(23).batch(4),
    "batch-drop_last": lambda: StatefulSource(23).batch(4, drop_last=True),
    "batch-wrapper_class": lambda: StatefulSource(23).batch(4, wrapper_class=tuple),
    # Unbatcher
    "unbatch": lambda: StatefulSource(23).batch(4).unbatch(),
    "unbatch-tuples": lambda: StatefulSource(23).batch(3, wrapper_class=tuple).unbatch(),
    "unbatch-uneven": lambda: StatefulSource(20).flatmap(lambda x: [list(range(x % 4))]).unbatch(),
    "unbatch-datachunk": lambda: StatefulSource(20).batch(3, wrapper_class=DataChunk).unbatch(),
    "unbatch-level0": lambda: StatefulSource(12).batch(3).unbatch(unbatch_level=0),
    "unbatch-level2": lambda: StatefulSource(40).batch(3).batch(2).unbatch(unbatch_level=2),
    "unbatch-level3": lambda: StatefulSource(40).batch(2).batch(2).batch(3).unbatch(unbatch_level=3),
    "unbatch-all": lambda: StatefulSource(20).map(nested).unbatch(unbatch_level=-1),
    # BucketBatcher: seeded (unseeded below)
    "bucketbatch-key": lambda: StatefulSource(50).bucketbatch(3, batch_num=2, key=lambda x: -x).set_seed(1),
    "bucketbatch-sort_key-drop_last": lambda: StatefulSource(50).bucketbatch(
        3, drop_last=True, batch_num=2, sort_key=sorted).set_seed(2),
    "bucketbatch-buckets": lambda: StatefulSource(50).bucketbatch(
        3, batch_num=2, bucket_num=3, key=lambda x: x % 7).set_seed(3),
    "bucketbatch-unsorted": lambda: StatefulSource(50).bucketbatch(4, batch_num=3).set_seed(4),
    "bucketbatch-stream": lambda: StatefulSource(50).bucketbatch(
        3, batch_num=2, key=lambda x: x % 5, use_in_batch_shuffle=False).set_seed(5),
    "bucketbatch-stream-buckets": lambda: StatefulSource(50).bucketbatch(
        3, batch_num=2, bucket_num=2, key=lambda x: x % 5, use_in_batch_shuffle=False).set_seed(6),
    "bucketbatch-stream-unsorted-drop_last": lambda: StatefulSource(50).bucketbatch(
        4, drop_last=True, batch_num=2, use_in_batch_shuffle=False).set_seed(7),
    # Grouper
    "groupby": lambda: StatefulSource(40).groupby(lambda x: x % 3),
    "groupby-group_size": lambda: StatefulSource(40).groupby(lambda x: x % 3, group_size=4, keep_key=True),
    "groupby-buffer": lambda: StatefulSource(40).groupby(lambda x: x % 5, buffer_size=7),
    "groupby-drop_remaining": lambda: StatefulSource(40).groupby(
        lambda x: x % 6, buffer_size=6, group_size=3, guaranteed_group_size=2, drop_remaining=True),
    "groupby-tuple_keys": lambda: StatefulSource(40).groupby(
        lambda x: (x % 2, str(x % 3)), keep_key=True, buffer_size=9),
    # FlatMapper
    "flatmap-list": lambda: StatefulSource(20).flatmap(lambda x: [x] * (x % 4)),
    "flatmap-tuple": lambda: StatefulSource(20).flatmap(lambda x: tuple(range(x, x + x % 3))),
    "flatmap-generator": lambda: StatefulSource(20).flatmap(repeat_gen),
    "flatmap-range": lambda: StatefulSource(20).flatmap(lambda x: range(x % 5)),
    "flatmap-none": lambda: StatefulSource(20).map(lambda x: list(range(x % 4))).flatmap(),
    "flatmap-none-str": lambda: StatefulSource(20).map(lambda x: "abcd"[: x % 5]).flatmap(),
    "flatmap-input_col": lambda: StatefulSource(20).map(lambda x: (x, x % 4)).flatmap(lambda c: [c] * c, input_col=1),
    "flatmap-skip": lambda: StatefulSource(20).flatmap(fails_on_5, on_error="skip"),
    "flatmap-skip-generator": lambda: StatefulSource(20).flatmap(gen_fails_after_one, on_error="skip"),
    "flatmap-async": lambda: StatefulSource(12).flatmap(arepeat),
    "flatmap-async-skip": lambda: StatefulSource(12).flatmap(arepeat, on_error="skip"),
    # compositions, and a stage written elsewhere that builds ours at its first next()
    "flatmap-batch-unbatch": lambda: StatefulSource(20).flatmap(repeat_gen).batch(3).unbatch(),
    "written-elsewhere": lambda: PlusOne(StatefulSource(30).batch(4).unbatch().flatmap(lambda x: [x, x])),
}


class TestExact:
    @pytest.mark.parametrize("name", sorted(BUILDS))
    def test_resume_equals_the_uninterrupted_pass(self, name):
        full = check_resume(BUILDS[name], lambda n: range(n + 1) if n <= 40 and "async" not in name else ks(n))
        assert full

    @pytest.mark.parametrize("name", ["unbatch-level2", "bucketbatch-stream-buckets", "groupby-buffer",
                                      "flatmap-generator", "flatmap-list"])
    def test_state_through_torch_save(self, name):
        check_resume(BUILDS[name], through="torch")

    @pytest.mark.parametrize("name", ["unbatch-all", "bucketbatch-stream", "bucketbatch-buckets", "groupby-group_size",
                                      "flatmap-generator", "flatmap-skip-generator", "flatmap-tuple"])
    def test_a_resumed_pass_resumes_again(self, name):
        build = BUILDS[name]
        full = list(build())
        for k1 in ks(len(full)):
            for k2 in ks(len(full) - k1):
                head, state = stopped(build, k1)
                it = iter(build())
                it.load_state_dict(state)
                assert it.state_dict() == stopped(build, k1)[1]  # loaded, not started: the same state
                middle = [next(it) for _ in range(k2)]
                state = pickle.loads(pickle.dumps(it.state_dict()))
                again = iter(build())
                again.load_state_dict(state)
                assert head + middle + list(again) == full, (k1, k2)

    def test_an_ended_pass_resumes_to_nothing(self):
        for name in ("unbatch", "groupby", "flatmap-generator", "bucketbatch-stream"):
            it = iter(BUILDS[name]())
            list(it)
            state = it.state_dict()
            again = iter(BUILDS[name]())
            again.load_state_dict(state)
            assert list(again) == [], name


class TestRandom:
    @pytest.mark.parametrize("kwargs", [
        {"key": lambda x: x % 7, "bucket_num": 2},
        {"use_in_batch_shuffle": False, "key": lambda x: x % 7, "bucket_num": 2},
        {},
        {"use_in_batch_shuffle": False},
    ], ids=["pooled", "stream", "pooled-unsorted", "stream-unsorted"])
    def test_unseeded_pass_continues_its_own_order(self, kwargs):
        pipe = StatefulSource(60).bucketbatch(3, batch_num=2, **kwargs)
        for k in (0, 1, 7, 19, 20):
            it = iter(pipe)
            head = [next(it) for _ in range(k)]
            state = pickle.loads(pickle.dumps(it.state_dict()))
            tail = list(it)
            again = iter(pipe)  # another seed is drawn: the saved RNG state replaces it
            again.load_state_dict(state)
            assert list(again) == tail, k
            assert sorted(x for b in head + tail for x in b) == list(range(60))

    def test_seeded_epochs_resume_their_own_epoch(self):
        pipe = StatefulSource(60).bucketbatch(3, batch_num=2, bucket_num=2, key=lambda x: x % 7).set_seed(5)
        orders = []
        for epoch in (0, 1):
            pipe.set_epoch(epoch)
            orders.append(check_resume(lambda: pipe, [9]))
        assert orders[0] != orders[1]

    def test_the_rng_state_is_plain_data(self):
        it = iter(BUILDS["bucketbatch-stream"]())
        next(it)
        state = stage_state(it, "BucketBatcher")
        version, internal, gauss = state["rng"]
        assert type(internal) is list and len(internal) == 625 and all(type(v) is int for v in internal)


class TestState:
    def test_batcher_and_level_0_unbatcher_keep_nothing(self):
        for name in ("batch", "batch-wrapper_class", "unbatch-level0"):
            it = iter(BUILDS[name]())
            next(it)
            stages = it.state_dict()["stages"]
            assert list(stages) == [k for k in stages if k.endswith(":StatefulSource")], (name, stages)

    def test_unbatcher_keeps_the_rest_of_the_current_batch(self):
        it = iter(StatefulSource(20).batch(5).unbatch())
        for _ in range(7):
            next(it)
        assert stage_state(it, "Unbatcher") == {"next": 2, "rest": [7, 8, 9]}

    def test_unbatcher_level_2_keeps_an_error_to_raise(self):
        build = lambda: StatefulSource(6).map(  # noqa: E731
            lambda x: [[x], [x + 10]] if x != 3 else [[3, 4], 5]).unbatch(2)
        it = iter(build())
        with pytest.raises(TypeError, match=r"item 3\[1\] is an int") as want:
            while True:
                next(it)
        for k in (7, 8):  # inside item 3: before its second element, and after it
            it = iter(build())
            head = [next(it) for _ in range(k)]
            again = iter(build())
            again.load_state_dict(pickle.loads(pickle.dumps(it.state_dict())))
            got = head[:]
            with pytest.raises(TypeError) as raised:
                for x in again:
                    got.append(x)
            assert got == [0, 10, 1, 11, 2, 12, 3, 4] and str(raised.value) == str(want.value)

    def test_bucketbatch_pooled_keeps_the_pool_left(self):
        it = iter(StatefulSource(50).bucketbatch(3, batch_num=2, bucket_num=2, key=lambda x: x).set_seed(0))
        first = next(it)
        state = stage_state(it, "BucketBatcher")
        assert len(state["rest"]) == 3 and state["buckets"] == 2  # a pool: 2 buckets of 2 batches of 3
        pool = first + [x for b in state["rest"] for x in b]
        assert len(set(pool)) == 12

    def test_bucketbatch_stream_keeps_its_buffers(self):
        it = iter(StatefulSource(50).bucketbatch(3, batch_num=2, bucket_num=2, key=lambda x: x,
                                         use_in_batch_shuffle=False).set_seed(0))
        next(it)
        state = stage_state(it, "BucketBatcher")
        assert len(state["items"]["buffer"]) == 12  # pool_size items
        assert len(state["batches"]["buffer"]) == 6  # batch_size * batch_num batches, torchdata's buffer
        assert len(state["rest"]) <= 6

    def test_grouper_keeps_its_groups(self):
        it = iter(StatefulSource(10).groupby(lambda x: x % 3, group_size=3, keep_key=True))
        assert next(it) == (0, [0, 3, 6])
        assert stage_state(it, "Grouper") == {"next": 7, "groups": [[1, [1, 4]], [2, [2, 5]]]}
        assert next(it) == (1, [1, 4, 7])
        assert next(it) == (2, [2, 5, 8])
        assert next(it) == (0, [9])
        assert stage_state(it, "Grouper") == {"next": 10, "groups": [], "draining": True}

    def test_grouper_state_is_a_copy(self):
        it = iter(StatefulSource(10).groupby(lambda x: x % 2, group_size=4))
        next(it)
        state = stage_state(it, "Grouper")
        next(it)
        assert state == {"next": 7, "groups": [[1, [1, 3, 5]]]}

    def test_flatmap_keeps_the_rest_of_a_list(self):
        it = iter(StatefulSource(10).flatmap(lambda x: [x] * 4))
        for _ in range(6):
            next(it)
        assert stage_state(it, "FlatMapper") == {"next": 2, "rest": [1, 1]}

    def test_flatmap_keeps_a_generators_input_and_count_and_calls_fn_once_again(self):
        calls = []

        def fn(x):
            calls.append(x)
            yield from range(x, x + 5)

        build = lambda: StatefulSource(4).flatmap(fn)  # noqa: E731
        it = iter(build())
        for _ in range(8):
            next(it)
        state = pickle.loads(pickle.dumps(it.state_dict()))
        assert stage_state(it, "FlatMapper") == {"next": 2, "input": 1, "done": 3}
        calls.clear()
        again = iter(build())
        again.load_state_dict(state)
        assert list(again) == [4, 5] + list(range(2, 7)) + list(range(3, 8))
        assert calls == [1, 2, 3]

    def test_flatmap_error_notes_count_from_the_saved_position(self):
        def fn(x):
            if x == 7:
                raise KeyError(x)
            return [x, x]

        it = iter(StatefulSource(10).flatmap(fn))
        for _ in range(5):
            next(it)
        again = iter(StatefulSource(10).flatmap(fn))
        again.load_state_dict(it.state_dict())
        with pytest.raises(KeyError) as raised:
            list(again)
        assert any("item 7" in note for note in raised.value.__notes__)

    def test_grouper_error_counts_from_the_saved_position(self):
        build = lambda: StatefulSource(10).groupby(  # noqa: E731
            lambda x: x if x >= 4 else x // 2, buffer_size=3, group_size=2)
        it = iter(build())
        assert next(it) == [0, 1]
        again = iter(build())
        again.load_state_dict(pickle.loads(pickle.dumps(it.state_dict())))
        assert next(again) == [2, 3]
        with pytest.raises(RuntimeError, match=r"is full \(3 items\) at item 6 and"):
            next(again)


class TestProtocol:
    @pytest.mark.parametrize("name", ["unbatch", "unbatch-level2", "unbatch-all", "bucketbatch-key",
                                      "bucketbatch-stream", "groupby", "flatmap-list", "flatmap-skip",
                                      "flatmap-async"])
    def test_load_after_the_first_item_is_refused(self, name):
        it = iter(BUILDS[name]())
        state = it.state_dict()
        next(it)
        with pytest.raises(RuntimeError, match="before the first next"):
            it.load_state_dict(state)
        it.close()

    def test_states_are_plain_data(self):
        for name, build in BUILDS.items():
            if "async" in name:
                continue
            it = iter(build())
            next(it)
            state = it.state_dict()
            assert pickle.loads(pickle.dumps(state)) == state, name


# -- random compositions -----------------------------------------------------------------------------


def _count(x):
    return len(repr(x)) % 3


def _gen(x):
    for _ in range(_count(x)):
        yield x


STAGES = {
    "batch": lambda p: p.batch(3),
    "batch-unbatch": lambda p: p.batch(2, drop_last=True).unbatch(),
    "unbatch-all": lambda p: p.unbatch(unbatch_level=-1),
    "flatmap-list": lambda p: p.flatmap(lambda x: [x] * _count(x)),
    "flatmap-gen": lambda p: p.flatmap(_gen),
    "groupby": lambda p: p.groupby(_count, group_size=3, buffer_size=5, guaranteed_group_size=2,
                                   drop_remaining=True),
    "bucketbatch": lambda p: p.bucketbatch(2, batch_num=2, bucket_num=2, key=_count).set_seed(9),
    "bucketbatch-stream": lambda p: p.bucketbatch(2, batch_num=2, key=_count, use_in_batch_shuffle=False).set_seed(8),
}


@given(
    n=st.integers(0, 40),
    source=st.sampled_from(["user protocol", "IterableWrapper"]),
    stages=st.lists(st.sampled_from(sorted(STAGES)), max_size=4),
    k=st.integers(0, 80),
)
def test_law_resume_equals_the_uninterrupted_run(n, source, stages, k):
    def build():
        pipe = StatefulSource(n) if source == "user protocol" else IterableWrapper(list(range(n)))
        for s in stages:
            pipe = STAGES[s](pipe)
        return pipe

    check_resume(build, lambda n: [min(k, n)])
