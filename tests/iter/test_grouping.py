"""Tests of the grouping family: Batcher, Unbatcher, BucketBatcher, Grouper."""

import pickle
from collections import Counter

import pytest
import torch

from datapipes._runtime import passes as _pass
from datapipes.iter import Batcher, BucketBatcher, Grouper, IterableWrapper, Unbatcher
from datapipes.testing import check_datapipe


class _CountingIterable:
    """A re-iterable source that counts how often it is iterated."""

    def __init__(self, items):
        self.items = list(items)
        self.passes = 0

    def __iter__(self):
        self.passes += 1
        return iter(self.items)


def _flat(batches):
    return [x for b in batches for x in b]


class TestBatcher:
    def test_batches_in_order_with_short_last(self):
        assert list(IterableWrapper(range(7)).batch(3)) == [[0, 1, 2], [3, 4, 5], [6]]

    def test_drop_last(self):
        assert list(IterableWrapper(range(7)).batch(3, drop_last=True)) == [[0, 1, 2], [3, 4, 5]]
        assert list(IterableWrapper(range(6)).batch(3, drop_last=True)) == [[0, 1, 2], [3, 4, 5]]

    def test_exact_multiple_has_no_empty_batch(self):
        assert list(IterableWrapper(range(6)).batch(3)) == [[0, 1, 2], [3, 4, 5]]

    def test_batch_size_one_and_larger_than_source(self):
        assert list(IterableWrapper("ab").batch(1)) == [["a"], ["b"]]
        assert list(IterableWrapper(range(3)).batch(10)) == [[0, 1, 2]]
        assert list(IterableWrapper(range(3)).batch(10, drop_last=True)) == []

    def test_none_items_are_kept(self):
        assert list(IterableWrapper([None, None, None]).batch(2)) == [[None, None], [None]]

    def test_wrapper_class(self):
        assert list(IterableWrapper(range(5)).batch(2, wrapper_class=tuple)) == [(0, 1), (2, 3), (4,)]
        assert list(IterableWrapper(range(5)).batch(2, drop_last=True, wrapper_class=tuple)) == [(0, 1), (2, 3)]

    def test_each_batch_is_a_new_data_chunk_as_in_torch(self):
        from datapipes import DataChunk

        batches = list(IterableWrapper(range(4)).batch(2))
        assert batches[0] is not batches[1]
        assert all(type(b) is DataChunk for b in batches) and batches == [[0, 1], [2, 3]]
        assert all(type(b) is list for b in IterableWrapper(range(4)).batch(2, wrapper_class=list))

    def test_torch_keyword_call(self):
        pipe = Batcher(datapipe=IterableWrapper(range(5)), batch_size=2, drop_last=False)
        assert list(pipe) == [[0, 1], [2, 3], [4]]

    def test_len(self):
        assert len(IterableWrapper(range(7)).batch(3)) == 3
        assert len(IterableWrapper(range(7)).batch(3, drop_last=True)) == 2
        assert len(IterableWrapper(range(6)).batch(3)) == 2
        assert len(IterableWrapper([]).batch(3)) == 0

    def test_len_is_computed_at_call_time(self):
        data = [1, 2, 3]
        pipe = IterableWrapper(data).batch(2)
        assert len(pipe) == 2
        data.extend([4, 5])
        assert len(pipe) == 3
        assert list(pipe) == [[1, 2], [3, 4], [5]]

    def test_len_unknown_upstream_raises_type_error(self):
        pipe = IterableWrapper(range(5)).filter(lambda x: x != 0).batch(2)
        with pytest.raises(TypeError, match="Filter"):
            len(pipe)
        assert list(pipe) == [[1, 2], [3, 4]]

    def test_re_iteration_gives_independent_passes(self):
        pipe = IterableWrapper(range(5)).batch(2)
        a, b = iter(pipe), iter(pipe)
        assert next(a) == [0, 1]
        assert next(b) == [0, 1]
        assert list(a) == [[2, 3], [4]]
        assert list(b) == [[2, 3], [4]]

    def test_construction_is_lazy(self):
        source = _CountingIterable(range(4))
        pipe = IterableWrapper(source).batch(2)
        assert source.passes == 0
        it = iter(pipe)
        assert source.passes == 0
        next(it)
        assert source.passes == 1

    def test_pickle_with_lambdas(self):
        pipe = IterableWrapper(range(5)).map(lambda x: x * 10).batch(2, wrapper_class=lambda b: tuple(b))
        clone = pickle.loads(pickle.dumps(pipe))
        assert list(clone) == [(0, 10), (20, 30), (40,)]

    def test_repr(self):
        assert repr(IterableWrapper([1]).batch(32)) == "IterableWrapper -> Batcher(32)"

    @pytest.mark.parametrize("kwargs", [{}, {"drop_last": True}, {"wrapper_class": tuple}, {"drop_last": True, "wrapper_class": tuple}])
    def test_contract(self, kwargs):
        check_datapipe(IterableWrapper(range(11)).batch(4, **kwargs), build=lambda src: src.batch(3, **kwargs))
        check_datapipe(IterableWrapper(range(11)).batch(4, **kwargs), build=lambda src: src.batch(4, **kwargs))

    def test_contract_expected(self):
        check_datapipe(IterableWrapper(range(5)).map(lambda x: x + 1).batch(2), expected=[[1, 2], [3, 4], [5]])

    def test_empty_source(self):
        for kwargs in ({}, {"drop_last": True}, {"wrapper_class": tuple}):
            pipe = IterableWrapper([]).batch(3, **kwargs)
            assert check_datapipe(pipe, expected=[]) == []

    def test_wrapper_error_is_the_same_object_with_a_note(self):
        error = ValueError("bad batch")

        def wrap(batch):
            if batch[0] == 4:
                raise error
            return batch

        pipe = IterableWrapper(range(7)).batch(2, wrapper_class=wrap)
        with pytest.raises(ValueError) as info:
            list(pipe)
        assert info.value is error
        assert any("Batcher(2)" in n and "batch 2" in n for n in info.value.__notes__)

    def test_source_error_gets_no_batcher_note(self):
        error = KeyError("source")

        def gen():
            yield 1
            raise error

        class Source:
            def __iter__(self):
                return gen()

        with pytest.raises(KeyError) as info:
            list(IterableWrapper(Source()).batch(2, wrapper_class=tuple))
        assert info.value is error
        assert not getattr(info.value, "__notes__", [])

    @pytest.mark.parametrize(
        "kwargs, exc, words",
        [
            ({"batch_size": 0}, ValueError, "batch_size"),
            ({"batch_size": -3}, ValueError, "batch_size"),
            ({"batch_size": "3"}, TypeError, "batch_size"),
            ({"batch_size": 2.0}, TypeError, "batch_size"),
            ({"batch_size": True}, TypeError, "batch_size"),
            ({"batch_size": 2, "drop_last": "yes"}, TypeError, "drop_last"),
            ({"batch_size": 2, "wrapper_class": 3}, TypeError, "wrapper_class"),
        ],
    )
    def test_bad_arguments(self, kwargs, exc, words):
        with pytest.raises(exc, match=f"Batcher.*{words}"):
            Batcher(IterableWrapper(range(3)), **kwargs)

    def test_source_must_be_a_pipe(self):
        with pytest.raises(TypeError, match="Batcher.*datapipe.*list"):
            Batcher([1, 2, 3], 2)


class TestUnbatcher:
    def test_level_one(self):
        assert list(IterableWrapper([[0, 1], [2], [], [3]]).unbatch()) == [0, 1, 2, 3]

    def test_tuples_are_batches(self):
        assert list(IterableWrapper([(0, 1), [2, (3, 4)]]).unbatch()) == [0, 1, 2, (3, 4)]

    def test_level_two(self):
        source = IterableWrapper([[[0, 1], [2]], [[3, 4], [5]], [[6]]])
        assert list(source.unbatch()) == [[0, 1], [2], [3, 4], [5], [6]]
        assert list(source.unbatch(unbatch_level=2)) == [0, 1, 2, 3, 4, 5, 6]

    def test_level_three(self):
        source = IterableWrapper([[[[0], [1]]], [[[2, 3]]]])
        assert list(source.unbatch(3)) == [0, 1, 2, 3]

    def test_level_zero_passes_items_through(self):
        items = [[1], 2, "ab"]
        assert list(IterableWrapper(items).unbatch(0)) == items

    def test_level_minus_one_flattens_everything(self):
        source = IterableWrapper([[[0, 1], [2, [3, [4]]]], 5, [], ["ab", (6, 7)]])
        assert list(source.unbatch(-1)) == [0, 1, 2, 3, 4, 5, "ab", 6, 7]

    def test_none_elements(self):
        assert list(IterableWrapper([[None], [None, None]]).unbatch()) == [None, None, None]

    def test_batch_then_unbatch_is_identity(self):
        data = list(range(23))
        for n in (1, 2, 5, 23, 30):
            assert list(IterableWrapper(data).batch(n).unbatch()) == data
            assert list(IterableWrapper(data).batch(n).batch(3).unbatch(2)) == data
            assert list(IterableWrapper(data).batch(n).batch(3).unbatch(-1)) == data

    def test_not_a_batch_at_level_one(self):
        with pytest.raises(TypeError, match=r"^Unbatcher\(1\): item 2 is an int, not a list or tuple: "
                                            r"unbatch_level 1 exceeds the depth of the DataPipe$"):
            list(IterableWrapper([[0], [1], 7]).unbatch())

    def test_strings_are_not_batches(self):
        with pytest.raises(TypeError, match="item 0 is a str"):
            list(IterableWrapper(["ab"]).unbatch())

    def test_not_a_batch_deeper_names_the_path(self):
        with pytest.raises(TypeError, match=r"Unbatcher\(2\): item 1\[1\] is an int.*unbatch_level 2 exceeds"):
            list(IterableWrapper([[[0]], [[1], 2]]).unbatch(2))
        with pytest.raises(TypeError, match=r"item 0 is an int"):
            list(IterableWrapper([5]).unbatch(2))

    def test_len(self):
        assert len(IterableWrapper([[1], [2]]).unbatch(0)) == 2
        for level in (-1, 1, 2):
            with pytest.raises(TypeError, match=rf"Unbatcher\({level}\) has no len\(\)"):
                len(IterableWrapper([[1], [2]]).unbatch(level))

    def test_re_iteration_and_pickle_with_lambdas(self):
        pipe = IterableWrapper(range(3)).map(lambda x: [x] * x).unbatch()
        assert list(pipe) == [1, 2, 2]
        assert list(pipe) == [1, 2, 2]
        assert list(pickle.loads(pickle.dumps(pipe))) == [1, 2, 2]

    @pytest.mark.parametrize("level", [-1, 0, 1, 2])
    def test_contract(self, level):
        nested = [[[0, 1], [2]], [[3]], []]
        check_datapipe(IterableWrapper(nested).unbatch(level), build=lambda src: src.batch(2).batch(1).unbatch(level))

    def test_contract_expected(self):
        check_datapipe(IterableWrapper([[1, 2], [3]]).map(lambda b: b[::-1]).unbatch(), expected=[2, 1, 3])

    def test_empty_source(self):
        for level in (-1, 0, 1, 3):
            assert check_datapipe(IterableWrapper([]).unbatch(level), expected=[]) == []

    @pytest.mark.parametrize(
        "level, exc",
        [(-2, ValueError), ("1", TypeError), (1.0, TypeError), (True, TypeError), (None, TypeError)],
    )
    def test_bad_arguments(self, level, exc):
        with pytest.raises(exc, match="Unbatcher.*unbatch_level"):
            Unbatcher(IterableWrapper([[1]]), unbatch_level=level)

    def test_source_must_be_a_pipe(self):
        with pytest.raises(TypeError, match="Unbatcher.*datapipe"):
            Unbatcher([[1]])


class TestBucketBatcher:
    def test_sorted_by_key_within_buckets(self):
        words = ["bbb", "a", "cccc", "dd", "eeeee", "f"]
        pipe = IterableWrapper(words).bucketbatch(batch_size=2, key=len).set_seed(0)
        assert sorted(pipe) == [["a", "f"], ["cccc", "eeeee"], ["dd", "bbb"]]

    def test_torch_style_sort_key_on_the_bucket(self):
        pipe = IterableWrapper([5, 3, 1, 4, 0, 2]).bucketbatch(3, sort_key=lambda bucket: sorted(bucket)).set_seed(1)
        assert sorted(pipe) == [[0, 1, 2], [3, 4, 5]]

    def test_buckets_are_sorted_separately_and_pools_stay_in_order(self):
        # bucket_num=1 with a sort: no item shuffle; buckets of 10 items; batches shuffled per pool.
        pipe = IterableWrapper(range(20)).bucketbatch(2, batch_num=5, key=lambda x: -x).set_seed(3)
        batches = list(pipe)
        assert len(batches) == 10
        assert all(b[0] > b[1] for b in batches)
        assert set(_flat(batches[:5])) == set(range(10))
        assert set(_flat(batches[5:])) == set(range(10, 20))
        assert sorted(batches) == sorted([[x + 1, x] for x in range(0, 20, 2)])

    def test_batches_are_shuffled_in_groups_of_bucket_num(self):
        # torchdata's order: with a sort, each run of bucket_num consecutive batches is shuffled
        pipe = IterableWrapper(range(30)).bucketbatch(1, batch_num=1, bucket_num=3, key=lambda x: x)
        orders = {tuple(x for [x] in pipe.set_seed(s)) for s in range(5)}
        assert len(orders) > 1
        for order in orders:
            assert all(sorted(order[i:i + 3]) == [i, i + 1, i + 2] for i in range(0, 30, 3)), order

    def test_one_bucket_keeps_its_sorted_order(self):
        pipe = IterableWrapper(range(40)).bucketbatch(2, batch_num=20, key=lambda x: -x)
        assert list(pipe.set_seed(0)) == [[x + 1, x] for x in range(38, -1, -2)]

    def test_without_sort_items_are_shuffled_within_pools(self):
        pipe = IterableWrapper(range(30)).bucketbatch(3, batch_num=2).set_seed(5)
        batches = list(pipe)
        assert [len(b) for b in batches] == [3] * 10
        for pool in range(5):
            assert sorted(_flat(batches[2 * pool : 2 * pool + 2])) == list(range(6 * pool, 6 * pool + 6))
        assert _flat(batches) != list(range(30))

    def test_several_buckets_per_pool(self):
        pipe = IterableWrapper(range(24)).bucketbatch(2, batch_num=2, bucket_num=3, key=lambda x: x).set_seed(2)
        batches = list(pipe)
        assert len(batches) == 12
        assert all(b[0] < b[1] for b in batches)
        assert sorted(_flat(batches[:6])) == list(range(12))
        assert sorted(_flat(batches)) == list(range(24))

    @pytest.mark.parametrize("in_batch", [True, False])
    @pytest.mark.parametrize("sort", [None, "key", "sort_key"])
    def test_conserves_items(self, in_batch, sort):
        kwargs = {"key": lambda x: x % 7} if sort == "key" else {"sort_key": sorted} if sort == "sort_key" else {}
        pipe = IterableWrapper(range(53)).bucketbatch(4, batch_num=3, bucket_num=2, use_in_batch_shuffle=in_batch, **kwargs)
        batches = list(pipe.set_seed(11))
        assert sorted(_flat(batches)) == list(range(53))
        assert sorted(len(b) for b in batches) == [1] + [4] * 13
        if sort == "sort_key":  # it may return buckets of another size: unknown, as in torchdata
            with pytest.raises(TypeError, match=r"BucketBatcher\(4\) has no len\(\): sort_key"):
                len(pipe)
        else:
            assert len(pipe) == len(batches)

    def test_streaming_shuffle_is_seeded(self):
        pipe = IterableWrapper(range(50)).bucketbatch(2, batch_num=2, use_in_batch_shuffle=False)
        assert list(pipe.set_seed(4)) == list(pipe.set_seed(4))

    def test_drop_last(self):
        pipe = IterableWrapper(range(11)).bucketbatch(4, drop_last=True, key=lambda x: x).set_seed(0)
        batches = list(pipe)
        assert sorted(batches) == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert len(pipe) == 2

    def test_seeds_and_epochs(self):
        pipe = IterableWrapper(range(64)).bucketbatch(4, batch_num=16)
        first = list(pipe.set_seed(7))
        assert list(pipe) == first
        assert list(pipe.set_seed(8)) != first
        pipe.set_seed(7).set_epoch(1)
        assert list(pipe) != first
        assert sorted(_flat(pipe)) == list(range(64))

    def test_unseeded_follows_torch_manual_seed(self):
        pipe = IterableWrapper(range(64)).bucketbatch(4, batch_num=16)
        torch.manual_seed(123)
        a = list(pipe)
        torch.manual_seed(123)
        assert list(pipe) == a

    def test_torch_keyword_call(self):
        pipe = BucketBatcher(
            datapipe=IterableWrapper(range(10)), batch_size=3, drop_last=True, batch_num=100, bucket_num=1,
            sort_key=sorted, use_in_batch_shuffle=False,
        ).set_seed(0)
        assert sorted(pipe) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]

    def test_len(self):
        assert len(IterableWrapper(range(10)).bucketbatch(3)) == 4
        assert len(IterableWrapper(range(10)).bucketbatch(3, drop_last=True)) == 3
        with pytest.raises(TypeError, match="Filter"):
            len(IterableWrapper(range(10)).filter(bool).bucketbatch(3))

    def test_pickle_with_lambdas(self):
        pipe = IterableWrapper(range(20)).map(lambda x: x * 2).bucketbatch(3, key=lambda x: -x).set_seed(9)
        clone = pickle.loads(pickle.dumps(pipe))
        assert list(clone) == list(pipe)

    def test_repr(self):
        assert repr(IterableWrapper([1]).bucketbatch(8)) == "IterableWrapper -> BucketBatcher(8)"

    @pytest.mark.parametrize(
        "kwargs",
        [{}, {"key": lambda x: -x}, {"sort_key": sorted, "bucket_num": 2}, {"drop_last": True, "use_in_batch_shuffle": False}],
    )
    def test_contract(self, kwargs):
        pipe = IterableWrapper(range(23)).bucketbatch(3, batch_num=2, **kwargs).set_seed(1)
        check_datapipe(pipe, build=lambda src: src.bucketbatch(2, **kwargs).set_seed(1))

    def test_contract_unseeded_is_checked_as_a_multiset(self):
        # Unseeded, each pass reorders the batches but (with a sort and bucket_num=1) not their content.
        check_datapipe(IterableWrapper(range(12)).bucketbatch(2, key=lambda x: x))

    def test_empty_source(self):
        for kwargs in ({}, {"key": len}, {"use_in_batch_shuffle": False, "sort_key": sorted}):
            pipe = IterableWrapper([]).bucketbatch(3, **kwargs).set_seed(0)
            assert check_datapipe(pipe, expected=[]) == []

    def test_sort_error_is_the_same_object_with_a_note(self):
        error = ZeroDivisionError("bad key")

        def key(x):
            if x == 25:
                raise error
            return x

        pipe = IterableWrapper(range(30)).bucketbatch(2, batch_num=5, key=key).set_seed(0)
        with pytest.raises(ZeroDivisionError) as info:
            list(pipe)
        assert info.value is error
        assert any("BucketBatcher(2)" in n and "bucket 2" in n for n in info.value.__notes__)

    def test_sort_key_returning_none(self):
        pipe = IterableWrapper(range(4)).bucketbatch(2, sort_key=lambda bucket: bucket.sort()).set_seed(0)
        with pytest.raises(TypeError, match=r"BucketBatcher\(2\): sort_key returned None"):
            list(pipe)

    @pytest.mark.parametrize(
        "kwargs, exc, words",
        [
            ({"batch_size": 0}, ValueError, "batch_size"),
            ({"batch_size": "2"}, TypeError, "batch_size"),
            ({"batch_size": 2, "batch_num": 0}, ValueError, "batch_num"),
            ({"batch_size": 2, "bucket_num": 0}, ValueError, "bucket_num"),
            ({"batch_size": 2, "bucket_num": 1.5}, TypeError, "bucket_num"),
            ({"batch_size": 2, "sort_key": "len"}, TypeError, "sort_key"),
            ({"batch_size": 2, "key": 1}, TypeError, "key"),
            ({"batch_size": 2, "key": len, "sort_key": sorted}, ValueError, "sort_key.*key"),
            ({"batch_size": 2, "drop_last": None}, TypeError, "drop_last"),
            ({"batch_size": 2, "use_in_batch_shuffle": "no"}, TypeError, "use_in_batch_shuffle"),
        ],
    )
    def test_bad_arguments(self, kwargs, exc, words):
        with pytest.raises(exc, match=f"BucketBatcher.*{words}"):
            BucketBatcher(IterableWrapper(range(3)), **kwargs)

    def test_source_must_be_a_pipe(self):
        with pytest.raises(TypeError, match="BucketBatcher.*datapipe"):
            BucketBatcher(range(3), 2)


def _stem(name):
    return name.split(".")[0]


FILES = ["a.png", "b.png", "a.json", "b.json", "a.jpg", "c.json"]


class TestGrouper:
    def test_groups_at_the_end(self):
        pipe = IterableWrapper(FILES).groupby(group_key_fn=_stem)
        assert list(pipe) == [["a.png", "a.json", "a.jpg"], ["b.png", "b.json"], ["c.json"]]

    def test_group_size_yields_as_soon_as_full(self):
        pipe = IterableWrapper(FILES).groupby(_stem, group_size=2)
        assert list(pipe) == [["a.png", "a.json"], ["b.png", "b.json"], ["a.jpg"], ["c.json"]]

    def test_full_buffer_yields_largest_group_if_guaranteed(self):
        pipe = IterableWrapper(FILES).groupby(_stem, buffer_size=3, group_size=3, guaranteed_group_size=2)
        assert list(pipe) == [["a.png", "a.json"], ["b.png", "b.json"], ["a.jpg"], ["c.json"]]

    def test_full_buffer_without_group_size_yields_largest_group(self):
        pipe = IterableWrapper([1, 2, 1, 3, 1, 2]).groupby(lambda x: x, buffer_size=3)
        # 1,2,1 fills the buffer: [1, 1] goes. 2,3,1 fill it: the first largest, [2], goes.
        # 3,1,2 fill it: [3] goes. [1] and [2] are left at the end.
        assert list(pipe) == [[1, 1], [2], [3], [1], [2]]

    def test_full_buffer_with_small_groups_raises(self):
        pipe = IterableWrapper(FILES).groupby(_stem, buffer_size=3, group_size=3)
        with pytest.raises(RuntimeError, match=r"Grouper\(_stem\): the buffer is full \(3 items\) at item 2.*'a', 2 items.*guaranteed_group_size=3"):
            list(pipe)

    def test_drop_remaining_drops_small_groups(self):
        pipe = IterableWrapper(FILES).groupby(_stem, buffer_size=3, group_size=3, drop_remaining=True)
        assert list(pipe) == [["a.jpg"], ["c.json"]]

    def test_keep_key(self):
        pipe = IterableWrapper(FILES).groupby(_stem, keep_key=True, group_size=2)
        assert list(pipe) == [("a", ["a.png", "a.json"]), ("b", ["b.png", "b.json"]), ("a", ["a.jpg"]), ("c", ["c.json"])]

    def test_keep_key_pairs_an_evicted_group_with_its_own_key(self):
        pipe = IterableWrapper([1, 1, 2]).groupby(lambda x: x, keep_key=True, buffer_size=3)
        assert list(pipe) == [(1, [1, 1]), (2, [2])]

    def test_unbounded_buffer(self):
        pipe = IterableWrapper(range(100)).groupby(lambda x: x % 3, buffer_size=None)
        assert [len(g) for g in pipe] == [34, 33, 33]

    def test_none_key_and_none_items(self):
        pipe = IterableWrapper([None, 1, None]).groupby(lambda x: x, keep_key=True)
        assert list(pipe) == [(None, [None, None]), (1, [1])]

    def test_conserves_items(self):
        data = [(i * 7) % 11 for i in range(200)]
        pipe = IterableWrapper(data).groupby(lambda x: x % 5, buffer_size=9, group_size=4, guaranteed_group_size=1)
        groups = list(pipe)
        assert Counter(_flat(groups)) == Counter(data)
        assert all(len({x % 5 for x in g}) == 1 and 1 <= len(g) <= 4 for g in groups)

    def test_unhashable_key(self):
        pipe = IterableWrapper([(1, 2), (3, 4)]).groupby(lambda x: [x[0]] if x[0] == 3 else x[0])
        with pytest.raises(TypeError, match="unhashable type: 'list'") as info:
            list(pipe)
        notes = info.value.__notes__
        assert any("Grouper(<lambda>)" in n and "item 1" in n for n in notes)
        assert any("key of type list" in n and "unhashable" in n for n in notes)

    def test_key_fn_error_is_the_same_object_with_a_note(self):
        error = KeyError("missing")

        def key(x):
            if x == 2:
                raise error
            return x

        with pytest.raises(KeyError) as info:
            list(IterableWrapper(range(5)).groupby(key))
        assert info.value is error
        assert info.value.__notes__ == ["[datapipes] raised in stage Grouper(key) at item 2"]

    def test_len_is_unknown(self):
        with pytest.raises(TypeError, match=r"Grouper\(_stem\) has no len\(\)"):
            len(IterableWrapper(FILES).groupby(_stem))

    def test_re_iteration_and_pickle_with_lambdas(self):
        pipe = IterableWrapper(range(10)).map(lambda x: x + 1).groupby(lambda x: x % 2, group_size=2)
        first = list(pipe)
        assert first == [[1, 3], [2, 4], [5, 7], [6, 8], [9], [10]]
        assert list(pipe) == first
        assert list(pickle.loads(pickle.dumps(pipe))) == first

    def test_torch_keyword_call(self):
        pipe = Grouper(
            datapipe=IterableWrapper(FILES), group_key_fn=_stem, keep_key=False, buffer_size=3, group_size=3,
            guaranteed_group_size=2, drop_remaining=False,
        )
        assert len(list(pipe)) == 4

    @pytest.mark.parametrize(
        "kwargs",
        [{}, {"group_size": 2}, {"keep_key": True, "buffer_size": 3}, {"buffer_size": 2, "group_size": 2, "drop_remaining": True}],
    )
    def test_contract(self, kwargs):
        check_datapipe(IterableWrapper(range(13)).groupby(lambda x: x % 3, **kwargs), build=lambda src: src.groupby(lambda x: x % 2, **kwargs))

    def test_empty_source(self):
        assert check_datapipe(IterableWrapper([]).groupby(_stem), expected=[]) == []

    @pytest.mark.parametrize(
        "kwargs, exc, words",
        [
            ({"buffer_size": 0}, ValueError, "buffer_size"),
            ({"buffer_size": "10"}, TypeError, "buffer_size"),
            ({"group_size": 0}, ValueError, "group_size"),
            ({"group_size": 2.5}, TypeError, "group_size"),
            ({"buffer_size": 3, "group_size": 4}, ValueError,
             r"\(group_size=4, buffer_size=3\): group_size must be > 0 and <= buffer_size"),
            ({"guaranteed_group_size": 2}, ValueError, r"\(guaranteed_group_size=2, group_size=None\): guaranteed"),
            ({"group_size": 2, "guaranteed_group_size": 3}, ValueError, r"\(guaranteed_group_size=3, group_size=2\)"),
            ({"group_size": 2, "guaranteed_group_size": 0}, ValueError, "guaranteed_group_size"),
            ({"keep_key": "yes"}, TypeError, "keep_key"),
            ({"drop_remaining": []}, TypeError, "drop_remaining"),
        ],
    )
    def test_bad_arguments(self, kwargs, exc, words):
        with pytest.raises(exc, match=f"Grouper.*{words}"):
            Grouper(IterableWrapper(FILES), _stem, **kwargs)

    def test_key_fn_must_be_callable(self):
        with pytest.raises(TypeError, match="Grouper.*group_key_fn"):
            Grouper(IterableWrapper(FILES), "stem")

    def test_source_must_be_a_pipe(self):
        with pytest.raises(TypeError, match="Grouper.*datapipe"):
            Grouper(FILES, _stem)


def _mod3(x):
    return x % 3


def _neg(x):
    return -x


#: one small pipe per stage class and variant of this family, built over a source
STAGES = {
    "batch": lambda src: src.batch(3),
    "batch-drop_last": lambda src: src.batch(3, drop_last=True),
    "batch-wrapper_class": lambda src: src.batch(3, wrapper_class=tuple),
    "batch-wrapper_class-drop_last": lambda src: src.batch(3, drop_last=True, wrapper_class=tuple),
    "unbatch-0": lambda src: src.batch(2).unbatch(unbatch_level=0),
    "unbatch-1": lambda src: src.batch(2).unbatch(),
    "unbatch-2": lambda src: src.batch(2).batch(2).unbatch(unbatch_level=2),
    "unbatch-all": lambda src: src.batch(2).batch(2).unbatch(unbatch_level=-1),
    "bucketbatch": lambda src: src.bucketbatch(2, batch_num=2),
    "bucketbatch-key": lambda src: src.bucketbatch(2, batch_num=2, key=_neg),
    "bucketbatch-sort_key-buckets": lambda src: src.bucketbatch(2, batch_num=2, bucket_num=2, sort_key=sorted),
    "bucketbatch-stream-drop_last": lambda src: src.bucketbatch(3, drop_last=True, use_in_batch_shuffle=False),
    "groupby": lambda src: src.groupby(_mod3),
    "groupby-group_size-keep_key": lambda src: src.groupby(_mod3, group_size=2, keep_key=True),
    "groupby-buffer-drop_remaining": lambda src: src.groupby(
        _mod3, buffer_size=4, group_size=3, guaranteed_group_size=2, drop_remaining=True
    ),
}


class TestPassBuilding:
    """Every stage creates its source's iterator (and reads its seed) in ``iter()``, as part of the
    pass being built, while nothing is read before the first ``next()``."""

    @pytest.mark.parametrize("name", sorted(STAGES))
    def test_pass_is_built_at_iter(self, name):
        source = _CountingIterable(range(10))
        pipe = STAGES[name](IterableWrapper(source)).set_seed(0)
        it = iter(pipe)
        assert _pass.unbuilt(it) == [], _pass.unbuilt(it)
        assert source.passes == 0  # built, not started
        assert list(it) == list(pipe)

    def test_interleaved_passes_keep_their_own_seeds(self):
        pipe = IterableWrapper(range(40)).bucketbatch(2, batch_num=4).set_seed(0)
        epoch0, epoch1 = list(pipe.set_epoch(0)), list(pipe.set_epoch(1))
        assert epoch0 != epoch1
        a = iter(pipe.set_epoch(0))
        b = iter(pipe.set_epoch(1))  # a second pass starts before the first one is read
        assert list(a) == epoch0 and list(b) == epoch1
