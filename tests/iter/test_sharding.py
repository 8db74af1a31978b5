"""ShardingFilter [sharding_filter] and apply_sharding over a graph."""

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES as TORCH_PRIORITIES

from datapipes import IterDataPipe
from datapipes.iter import IterableWrapper, ShardingFilter
from datapipes.iter.sharding import SHARDING_PRIORITIES, apply_sharding
from datapipes.testing import check_datapipe


class Pair(IterDataPipe):
    """A two-source test pipe: all of ``a``, then all of ``b``."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __iter__(self):
        yield from self.a
        yield from self.b


class OwnSharding(IterDataPipe):
    """A stage with its own two-argument apply_sharding (torch's older signature)."""

    def __init__(self, data):
        self.data = data
        self.calls = []

    def apply_sharding(self, num_of_instances, instance_id):
        self.calls.append((num_of_instances, instance_id))

    def __iter__(self):
        return iter(self.data)


def shard(pipe, n, i, **kwargs):
    pipe.apply_sharding(n, i, **kwargs)
    return pipe


class TestShardingFilter:
    def test_one_shard_until_applied(self):
        pipe = IterableWrapper(range(7)).sharding_filter()
        assert (pipe.num_of_instances, pipe.instance_id) == (1, 0)
        assert check_datapipe(pipe, expected=range(7)) == list(range(7))

    def test_contract_per_shard(self):
        for i in range(3):
            pipe = shard(IterableWrapper(range(10)).map(lambda x: x * 2).sharding_filter(), 3, i)
            check_datapipe(pipe, expected=[x * 2 for x in range(i, 10, 3)],
                           build=lambda src, i=i: shard(src.sharding_filter(), 3, i))

    @given(st.integers(0, 40), st.integers(1, 7))
    def test_shards_partition_the_source_and_len_matches(self, n, k):
        shards = [shard(IterableWrapper(range(n)).sharding_filter(), k, i) for i in range(k)]
        parts = [list(s) for s in shards]
        assert sorted(x for p in parts for x in p) == list(range(n))
        assert [len(s) for s in shards] == [len(p) for p in parts]

    def test_len_is_computed_at_call_time(self):
        data = list(range(10))
        pipe = IterableWrapper(data).sharding_filter()
        assert len(pipe) == 10
        pipe.apply_sharding(4, 3)
        assert len(pipe) == 2
        data.extend([10, 11])
        assert len(pipe) == 3 and list(pipe) == [3, 7, 11]
        with pytest.raises(TypeError, match="Filter"):
            len(IterableWrapper(data).filter(bool).sharding_filter())

    def test_shard_is_decided_at_the_start_of_each_pass(self):
        pipe = shard(IterableWrapper(range(8)).sharding_filter(), 2, 0)
        it = iter(pipe)
        pipe.apply_sharding(2, 1)
        assert list(it) == [0, 2, 4, 6]  # a pass keeps the shard it started with
        assert list(pipe) == [1, 3, 5, 7]

    def test_groups_combine_as_torch(self):
        # 2 ranks x 3 workers: rank r, worker w reads shard r * 3 + w of 6.
        seen = []
        for r in range(2):
            for w in range(3):
                pipe = IterableWrapper(range(30)).sharding_filter()
                pipe.apply_sharding(2, r, sharding_group=SHARDING_PRIORITIES.DISTRIBUTED)
                pipe.apply_sharding(3, w, sharding_group=SHARDING_PRIORITIES.MULTIPROCESSING)
                assert (pipe.num_of_instances, pipe.instance_id) == (6, r * 3 + w)
                seen.append(list(pipe))
        assert sorted(x for s in seen for x in s) == list(range(30))

    def test_sharding_group_filter(self):
        pipe = IterableWrapper(range(12)).sharding_filter(SHARDING_PRIORITIES.MULTIPROCESSING)
        pipe.apply_sharding(2, 1, sharding_group=SHARDING_PRIORITIES.DISTRIBUTED)
        assert list(pipe) == list(range(12))  # the DISTRIBUTED group is filtered out
        pipe.apply_sharding(3, 2, sharding_group=SHARDING_PRIORITIES.MULTIPROCESSING)
        assert list(pipe) == [2, 5, 8, 11] and len(pipe) == 4

    def test_torch_priorities_are_accepted(self):
        pipe = IterableWrapper(range(6)).sharding_filter(sharding_group_filter=TORCH_PRIORITIES.DISTRIBUTED)
        pipe.apply_sharding(3, 1, sharding_group=TORCH_PRIORITIES.DISTRIBUTED)
        assert list(pipe) == [1, 4]
        assert pipe.sharding_group_filter is SHARDING_PRIORITIES.DISTRIBUTED

    def test_reapplying_a_group_replaces_it(self):
        pipe = shard(IterableWrapper(range(6)).sharding_filter(), 2, 1)
        pipe.apply_sharding(3, 0)
        assert list(pipe) == [0, 3]

    def test_cannot_mix_default_with_other_groups(self):
        pipe = shard(IterableWrapper(range(6)).sharding_filter(), 2, 0)
        with pytest.raises(ValueError, match="cannot mix the DEFAULT sharding group with other groups"):
            pipe.apply_sharding(2, 0, sharding_group=SHARDING_PRIORITIES.DISTRIBUTED)
        other = IterableWrapper(range(6)).sharding_filter()
        other.apply_sharding(2, 0, sharding_group=SHARDING_PRIORITIES.MULTIPROCESSING)
        with pytest.raises(ValueError, match="cannot mix"):
            other.apply_sharding(2, 0)

    def test_pickle_keeps_the_shard(self):
        pipe = shard(IterableWrapper(range(20)).map(lambda x: x + 1).sharding_filter(), 4, 2)
        clone = pickle.loads(pickle.dumps(pipe))
        assert list(clone) == [3, 7, 11, 15, 19] and clone.groups == pipe.groups

    def test_empty_and_more_shards_than_items(self):
        check_datapipe(shard(IterableWrapper([]).sharding_filter(), 3, 1), expected=[])
        check_datapipe(shard(IterableWrapper([1, 2]).sharding_filter(), 5, 4), expected=[])

    def test_close_reaches_the_source(self):
        closed = []

        class Source:
            def __iter__(self):
                try:
                    yield from range(100)
                finally:
                    closed.append(True)

        it = iter(shard(IterableWrapper(Source()).sharding_filter(), 2, 1))
        assert next(it) == 1
        it.close()
        assert closed == [True]

    def test_repr(self):
        assert repr(IterableWrapper([1]).sharding_filter()) == "IterableWrapper -> ShardingFilter"

    def test_bad_arguments(self):
        pipe = IterableWrapper(range(4)).sharding_filter()
        with pytest.raises(ValueError, match="instance_id must be < num_of_instances, got instance_id=2 with num_of_instances=2"):
            pipe.apply_sharding(2, 2)
        with pytest.raises(ValueError, match="ShardingFilter.apply_sharding: instance_id must be >= 0, got -1"):
            pipe.apply_sharding(2, -1)
        with pytest.raises(ValueError, match="num_of_instances must be >= 1, got 0"):
            pipe.apply_sharding(0, 0)
        with pytest.raises(TypeError, match="num_of_instances must be an int, got float"):
            pipe.apply_sharding(2.0, 0)
        with pytest.raises(TypeError, match="instance_id must be an int, got bool"):
            pipe.apply_sharding(2, False)
        with pytest.raises(TypeError, match=r"sharding_group must be a SHARDING_PRIORITIES member or an int \(a custom group\), got bool"):
            pipe.apply_sharding(2, 0, sharding_group=True)
        with pytest.raises(TypeError, match="sharding_group must be a SHARDING_PRIORITIES member or an int .*, got str"):
            pipe.apply_sharding(2, 0, sharding_group="DEFAULT")
        with pytest.raises(TypeError, match="ShardingFilter: source_datapipe must be an IterDataPipe, got list"):
            ShardingFilter([1, 2])
        with pytest.raises(TypeError, match="ShardingFilter: sharding_group_filter must be a SHARDING_PRIORITIES member or an int"):
            IterableWrapper([1]).sharding_filter(sharding_group_filter=1.0)
        assert pipe.groups == {}  # nothing was applied by the failed calls


class TestApplySharding:
    def test_applies_to_every_sharding_filter_of_the_graph(self):
        a = IterableWrapper(range(6)).sharding_filter()
        b = IterableWrapper(range(10, 16)).sharding_filter()
        pipe = Pair(a, b).map(lambda x: x)
        assert apply_sharding(pipe, 3, 2) is pipe
        assert list(pipe) == [2, 5, 12, 15]
        assert a.groups == b.groups == {SHARDING_PRIORITIES.DEFAULT: (3, 2)}

    def test_sharding_group_is_passed_on(self):
        pipe = IterableWrapper(range(8)).sharding_filter()
        apply_sharding(pipe, 2, 1, sharding_group=SHARDING_PRIORITIES.MULTIPROCESSING)
        assert pipe.groups == {SHARDING_PRIORITIES.MULTIPROCESSING: (2, 1)}

    def test_shared_upstream_is_sharded_once(self):
        sf = IterableWrapper(range(8)).sharding_filter()
        pipe = Pair(sf.map(lambda x: -x), sf)
        apply_sharding(pipe, 2, 0)
        assert list(pipe) == [0, -2, -4, -6, 0, 2, 4, 6]

    def test_sharding_twice_on_one_path_raises_and_applies_nothing(self):
        inner = IterableWrapper(range(8)).sharding_filter()
        outer = inner.map(lambda x: x).sharding_filter()
        with pytest.raises(RuntimeError, match="Sharding twice on a single pipeline is likely unintended"):
            apply_sharding(outer, 2, 0)
        assert inner.groups == outer.groups == {}

    def test_any_stage_with_apply_sharding_is_sharded(self):
        own = OwnSharding([1, 2, 3])
        apply_sharding(own.map(lambda x: x), 4, 1)
        assert own.calls == [(4, 1)]  # called with two arguments, as its signature takes

    def test_graph_without_sharding_is_unchanged(self):
        pipe = IterableWrapper(range(3)).map(str)
        assert apply_sharding(pipe, 2, 1) is pipe and list(pipe) == ["0", "1", "2"]

    def test_bad_arguments(self):
        pipe = IterableWrapper(range(3)).sharding_filter()
        with pytest.raises(ValueError, match="apply_sharding: instance_id must be < num_of_instances"):
            apply_sharding(pipe, 2, 5)
        with pytest.raises(TypeError, match="apply_sharding: num_of_instances must be an int, got str"):
            apply_sharding(pipe, "2", 0)
        with pytest.raises(TypeError, match="apply_sharding: sharding_group must be a SHARDING_PRIORITIES member or an int"):
            apply_sharding(pipe, 2, 0, sharding_group=None)
