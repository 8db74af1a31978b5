"""torchdata's reshaping stages (datapipes/iter/shuffling.py, bucketing.py, text.py, reshaping.py and
mapping/): InBatchShuffler [in_batch_shuffle], ShuffledFlatMapper [shuffled_flatmap],
MaxTokenBucketizer [max_token_bucketize], ParagraphAggregator [lines_to_paragraphs], Rows2Columnar
[rows2columnar], ShardExpander [shard_expand], BatchMapper [map_batches] and ThreadPoolMapper
[threadpool_map].

Where torchdata's output depends on its algorithm (the draws of ``shuffled_flatmap``, the heap order
of ``max_token_bucketize``), a small reference written from torchdata's documented behaviour runs
beside ours with the same generator."""

import asyncio
import dataclasses
import heapq
import pickle
import random
import threading
import time
from collections import defaultdict

import pytest

from datapipes import DataChunk, IterDataPipe, graph_settings
from datapipes.iter import (
    BatchAsyncMapper,
    BatchMapper,
    InBatchShuffler,
    IterableWrapper,
    MapBatches,
    Mapper,
    MaxTokenBucketizer,
    ParagraphAggregator,
    Rows2Columnar,
    ShardExpander,
    ShuffledFlatMapper,
    ThreadPoolMapper,
)
from datapipes.testing import check_datapipe, check_resume

EVERY_K = lambda n: range(n + 1)  # noqa: E731 - check_resume's ks: stop after every number of items


class Boom(Exception):
    pass


def notes(e):
    return "\n".join(getattr(e, "__notes__", []))


def test_functional_names_register_the_classes():
    names = {
        "in_batch_shuffle": InBatchShuffler, "shuffled_flatmap": ShuffledFlatMapper,
        "max_token_bucketize": MaxTokenBucketizer, "lines_to_paragraphs": ParagraphAggregator,
        "rows2columnar": Rows2Columnar, "shard_expand": ShardExpander, "map_batches": BatchMapper,
        "threadpool_map": ThreadPoolMapper,
    }
    for name, cls in names.items():
        assert IterDataPipe._functions[name] is cls
    assert type(IterableWrapper([]).map_batches(sum, 2)) is MapBatches is BatchMapper


def test_no_stage_reads_before_iteration():
    pulled = []

    class Source:
        def __iter__(self):
            for x in [[1, 2], [3]]:
                pulled.append(x)
                yield x

    src = IterableWrapper(Source())
    pipes = [src.in_batch_shuffle(), src.shuffled_flatmap(), src.max_token_bucketize(5), src.map_batches(list, 1),
             src.rows2columnar(["a", "b"]), src.threadpool_map(len, max_workers=2)]
    for pipe in pipes:
        iter(pipe)
    assert pulled == []


# -- InBatchShuffler -------------------------------------------------------------------------------


class TestInBatchShuffler:
    def test_each_batch_is_a_permutation_and_batches_keep_their_order(self):
        out = list(IterableWrapper(range(40)).batch(8).in_batch_shuffle())
        assert [sorted(b) for b in out] == [list(range(i, i + 8)) for i in range(0, 40, 8)]
        assert all(type(b) is DataChunk for b in out)  # as torchdata

    def test_draws_are_random_sample_of_the_pass_generator(self, monkeypatch):
        monkeypatch.setattr(InBatchShuffler, "_pass_seed", lambda self: 1234)
        batches = [list(range(i, i + 5)) for i in range(0, 30, 5)] + [("a", "b", "c")]
        rng = random.Random(1234)
        assert list(InBatchShuffler(IterableWrapper(batches))) == [rng.sample(b, len(b)) for b in batches]

    def test_seed_and_epochs(self):
        pipe = IterableWrapper(range(60)).batch(10).in_batch_shuffle().set_seed(5)
        first = list(pipe)
        assert list(pipe) == first
        assert list(IterableWrapper(range(60)).batch(10).in_batch_shuffle().set_seed(5)) == first
        assert list(pipe.set_epoch(1)) != first

    def test_set_shuffle_and_graph_settings(self):
        pipe = IterableWrapper(range(9)).batch(3).in_batch_shuffle()
        pipe.set_shuffle(False)
        assert list(pipe) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
        graph_settings.apply_shuffle_settings(pipe, shuffle=True)
        assert pipe._enabled
        graph_settings.apply_shuffle_settings(pipe, shuffle=False)
        assert list(pipe) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
        check_resume(lambda: IterableWrapper(range(9)).batch(3).in_batch_shuffle().set_shuffle(False))

    def test_len_is_the_sources(self):
        assert len(IterableWrapper(range(10)).batch(3).in_batch_shuffle()) == 4
        with pytest.raises(TypeError, match="IterableWrapper"):
            len(IterableWrapper(iter([[1]])).in_batch_shuffle())

    def test_contract(self):
        pipe = IterableWrapper(range(20)).batch(4).in_batch_shuffle().set_seed(1)
        check_datapipe(pipe, build=lambda src: src.batch(2).in_batch_shuffle())
        # unseeded: the batches differ from pass to pass, their items do not
        out = check_datapipe(IterableWrapper(range(20)).batch(4).in_batch_shuffle().map(sorted))
        assert out == [list(range(i, i + 4)) for i in range(0, 20, 4)]

    def test_resume(self):
        check_resume(lambda: IterableWrapper(range(30)).batch(4).in_batch_shuffle().set_seed(2), EVERY_K)
        check_resume(lambda: IterableWrapper(range(30)).batch(4).in_batch_shuffle().set_seed(2), [3], through="torch")

    def test_unseeded_resume_goes_on_with_the_saved_pass(self):
        pipe = IterableWrapper(range(40)).batch(5).in_batch_shuffle()
        it = iter(pipe)
        head = [next(it) for _ in range(3)]
        state = pickle.loads(pickle.dumps(it.state_dict()))
        rest = list(it)
        again = iter(IterableWrapper(range(40)).batch(5).in_batch_shuffle())
        again.load_state_dict(state)
        assert list(again) == rest and len(head) == 3

    def test_a_batch_that_is_not_a_sequence(self):
        pipe = IterableWrapper([[1, 2], {3, 4}]).in_batch_shuffle()
        with pytest.raises(TypeError) as info:
            list(pipe)
        assert "InBatchShuffler" in notes(info.value) and "batch 1" in notes(info.value)

    def test_arguments(self):
        with pytest.raises(TypeError, match="InBatchShuffler: datapipe must be an IterDataPipe"):
            InBatchShuffler([[1, 2]])

    def test_pickles(self):
        pipe = IterableWrapper(range(8)).map(lambda x: x + 1).batch(4).in_batch_shuffle().set_seed(0)
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe)


# -- ShuffledFlatMapper ----------------------------------------------------------------------------


def reference_shuffled_flatmap(items, size, rng, fn=lambda x: x):
    """torchdata's documented draws: an index first; while the buffer is full, the next element of the
    chosen iterable, then a new index (an exhausted iterable leaves without a new draw); once the
    source is done, an index among the iterables left before each element."""
    buf, out = [], []
    idx = rng.randint(0, size - 1)
    for x in items:
        while len(buf) == size:
            try:
                out.append(next(buf[idx]))
            except StopIteration:
                del buf[idx]
                continue
            idx = rng.randint(0, size - 1)
        buf.append(iter(fn(x)))
    while buf:
        idx = rng.randint(0, len(buf) - 1)
        try:
            out.append(next(buf[idx]))
        except StopIteration:
            del buf[idx]
    return out


def ragged(n, seed=0):
    rng = random.Random(seed)
    return [[f"{i}.{j}" for j in range(rng.randint(0, 5))] for i in range(n)]


def gen_of(item):
    yield from item


class TestShuffledFlatMapper:
    @pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
    def test_draws_are_torchdatas(self, monkeypatch, size):
        monkeypatch.setattr(ShuffledFlatMapper, "_pass_seed", lambda self: 99)
        items = ragged(30)
        assert list(IterableWrapper(items).shuffled_flatmap(buffer_size=size)) == \
            reference_shuffled_flatmap(items, size, random.Random(99))
        assert list(IterableWrapper(items).shuffled_flatmap(gen_of, buffer_size=size)) == \
            reference_shuffled_flatmap(items, size, random.Random(99))

    def test_every_element_once_each_iterable_in_order(self):
        items = ragged(50, seed=3)
        out = list(IterableWrapper(items).shuffled_flatmap(buffer_size=5))
        assert sorted(out) == sorted(x for item in items for x in item)
        for item in items:
            assert [x for x in out if x in item] == item

    def test_torchdata_example(self):
        source = IterableWrapper([[1, 2, 3, 4], "abcd", "ABCD"])
        out = list(source.shuffled_flatmap(buffer_size=2))
        assert sorted(map(str, out)) == sorted("1234abcdABCD")

    def test_fn_and_columns(self):
        pairs = [(i, "xy" * i) for i in range(4)]
        off = IterableWrapper(pairs).shuffled_flatmap(str.upper, input_col=1).set_shuffle(False)
        assert list(off) == list("XYXYXYXYXYXY")
        assert list(IterableWrapper(pairs).shuffled_flatmap(input_col=1).set_shuffle(False)) == list("xy" * 6)
        two = IterableWrapper([(1, 2, 3)]).shuffled_flatmap(input_col=[0, 2]).set_shuffle(False)
        assert list(two) == [1, 3]  # torchdata: several columns with fn=None flatten as their tuple
        add = IterableWrapper([(1, 2), (3, 4)]).shuffled_flatmap(lambda a, b: [a, b], input_col=[0, 1])
        assert sorted(add) == [1, 2, 3, 4]

    def test_set_shuffle_off_is_flatmap(self):
        items = ragged(20)
        assert list(IterableWrapper(items).shuffled_flatmap().set_shuffle(False)) == [x for i in items for x in i]
        check_resume(lambda: IterableWrapper(items).shuffled_flatmap(gen_of).set_shuffle(False), EVERY_K)

    def test_seed_and_epochs(self):
        build = lambda: IterableWrapper(ragged(40)).shuffled_flatmap(buffer_size=4).set_seed(1)  # noqa: E731
        first = list(build())
        assert list(build()) == first
        assert list(build().set_epoch(2)) != first

    def test_len(self):
        assert len(IterableWrapper([[1, 2], "abc", ()]).shuffled_flatmap()) == 5
        with pytest.raises(TypeError, match="ShuffledFlatMapper.*relies on the output of its function"):
            len(IterableWrapper([[1]]).shuffled_flatmap(list))
        with pytest.raises(TypeError, match="ShuffledFlatMapper.*no len"):
            len(IterableWrapper([gen_of([1])]).shuffled_flatmap())

    def test_len_during_a_pass_leaves_the_pass_alone(self):
        build = lambda: IterableWrapper(ragged(30)).shuffled_flatmap(buffer_size=3).set_seed(4)  # noqa: E731
        full = list(build())
        pipe = build()
        it = iter(pipe)
        head = [next(it) for _ in range(10)]
        assert len(pipe) == len(full)
        state = it.state_dict()
        again = iter(build())
        again.load_state_dict(state)
        assert head + list(again) == full

    def test_contract(self):
        check_datapipe(IterableWrapper(ragged(25)).shuffled_flatmap(buffer_size=3).set_seed(0),
                       build=lambda src: src.shuffled_flatmap(lambda x: [x, x]))
        check_datapipe(IterableWrapper(ragged(25)).shuffled_flatmap(gen_of, buffer_size=3))

    @pytest.mark.parametrize("fn", [None, gen_of, tuple])
    def test_resume(self, fn):
        check_resume(lambda: IterableWrapper(ragged(12)).shuffled_flatmap(fn, buffer_size=3).set_seed(6), EVERY_K)

    def test_resume_through_torch_and_before_the_first_item_unseeded(self):
        check_resume(lambda: IterableWrapper(ragged(12)).shuffled_flatmap(gen_of).set_seed(6), [9], through="torch")
        pipe = IterableWrapper(ragged(20)).shuffled_flatmap(buffer_size=4)  # unseeded: its own draw each pass
        it = iter(pipe)
        state = it.state_dict()
        full = list(it)
        again = iter(pipe)
        again.load_state_dict(state)
        assert list(again) == full

    def test_errors_of_fn_name_the_item(self):
        def bad(x):
            if x == 3:
                raise Boom(x)
            return [x]

        with pytest.raises(Boom) as info:
            list(IterableWrapper(range(6)).shuffled_flatmap(bad, buffer_size=2))
        assert "ShuffledFlatMapper(" in notes(info.value) and "item 3" in notes(info.value)

        def late(x):
            yield x
            if x == 2:
                raise Boom(x)

        with pytest.raises(Boom) as info:
            list(IterableWrapper(range(6)).shuffled_flatmap(late, buffer_size=2))
        assert "item 2" in notes(info.value)

    def test_arguments(self):
        with pytest.raises(ValueError, match=r"^ShuffledFlatMapper\(buffer_size=0\): buffer_size should be larger than 0$"):
            IterableWrapper([]).shuffled_flatmap(buffer_size=0)
        with pytest.raises(TypeError, match="ShuffledFlatMapper: fn must be callable"):
            IterableWrapper([]).shuffled_flatmap(3)
        with pytest.raises(ValueError, match="ShuffledFlatMapper: The function"):
            IterableWrapper([]).shuffled_flatmap(lambda a, b: [a], input_col=0)

    def test_pickles(self):
        pipe = IterableWrapper(ragged(10)).shuffled_flatmap(lambda x: x[::-1], buffer_size=3).set_seed(2)
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe)


# -- MaxTokenBucketizer ----------------------------------------------------------------------------


@dataclasses.dataclass(order=True, frozen=True)
class ByLength:
    length: int
    data: object = dataclasses.field(compare=False)


def reference_bucketize(items, max_token_count, len_fn=len, min_len=0, max_len=None, buffer_size=1000,
                        include_padding=False):
    """torchdata's documented behaviour: a min-heap of ``buffer_size`` items ordered by length alone
    (``PrioritizedItem``), each popped item joins the batch unless it would exceed the count."""
    max_len = max_token_count if max_len is None else max_len
    heap, out = [], []
    batch, tokens, longest = [], 0, 0

    def take():
        nonlocal batch, tokens, longest
        d = heapq.heappop(heap)
        if include_padding:
            longest = max(longest, d.length)
            grown = (len(batch) + 1) * longest
        else:
            grown = tokens + d.length
        if grown > max_token_count:
            out.append(batch)
            batch, tokens, longest = [d.data], d.length, d.length
        else:
            batch.append(d.data)
            tokens = grown

    for x in items:
        length = len_fn(x)
        if min_len <= length <= max_len:
            heapq.heappush(heap, ByLength(length, x))
            if len(heap) == buffer_size:
                take()
    while heap:
        take()
    if batch:
        out.append(batch)
    return out


def words(n, seed=0):
    rng = random.Random(seed)
    return [f"{i}:" + "x" * rng.randint(0, 9) for i in range(n)]  # many equal lengths, distinct items


class TestMaxTokenBucketizer:

    def test_batches_are_datachunks_as_torchdata(self):
        out = list(IterableWrapper(["a", "bb", "ccc", "d"]).max_token_bucketize(4, buffer_size=2))
        assert out and all(type(b) is DataChunk for b in out)
        assert sorted(x for b in out for x in b) == ["a", "bb", "ccc", "d"]
    def test_torchdata_examples(self):
        source = IterableWrapper(["1", "11", "1", "1111", "111", "1", "11", "11", "111"])
        assert list(source.max_token_bucketize(max_token_count=5)) == \
            [["1", "1", "1", "11"], ["11", "11"], ["111"], ["111"], ["1111"]]
        assert list(source.max_token_bucketize(max_token_count=4, buffer_size=4)) == \
            [["1", "1", "1"], ["11", "11"], ["11"], ["111"], ["111"], ["1111"]]

    @pytest.mark.parametrize("kw", [
        {"max_token_count": 12}, {"max_token_count": 12, "buffer_size": 5}, {"max_token_count": 30, "buffer_size": 1},
        {"max_token_count": 20, "include_padding": True, "buffer_size": 7},
        {"max_token_count": 15, "min_len": 4, "max_len": 8, "buffer_size": 9},
    ])
    def test_same_batches_as_torchdata_ties_included(self, kw):
        items = words(80, seed=len(kw))
        assert list(IterableWrapper(items).max_token_bucketize(**kw)) == reference_bucketize(items, **kw)

    def test_token_counts_stay_within_the_limit(self):
        batches = list(IterableWrapper(words(100)).max_token_bucketize(16, include_padding=True, buffer_size=10))
        assert all(len(b) * max(map(len, b)) <= 16 for b in batches)
        assert sum(map(len, batches)) == 100 - sum(len(w) > 16 for w in words(100))

    def test_len_fn_and_filter(self):
        pipe = IterableWrapper([5, 1, 9, 3, 7]).max_token_bucketize(10, len_fn=lambda x: x, min_len=2, max_len=8)
        assert list(pipe) == [[3, 5], [7]]

    def test_arguments(self):
        src = IterableWrapper([])
        with pytest.raises(ValueError, match="``min_len`` should be larger than 0 and equal to or smaller than ``max_len``"):
            src.max_token_bucketize(5, min_len=6)
        with pytest.raises(ValueError, match="min_len=-1"):
            src.max_token_bucketize(5, min_len=-1)
        with pytest.raises(ValueError, match="``max_token_count`` must be equal to or greater than ``max_len``"):
            src.max_token_bucketize(5, max_len=6)
        with pytest.raises(ValueError, match=r"^MaxTokenBucketizer\(buffer_size=0\): 'buffer_size' is required"):
            src.max_token_bucketize(5, buffer_size=0)
        with pytest.raises(TypeError, match="MaxTokenBucketizer: len_fn must be callable"):
            src.max_token_bucketize(5, len_fn=3)
        with pytest.raises(TypeError, match="MaxTokenBucketizer: max_token_count must be an int"):
            src.max_token_bucketize("5")

    def test_len_is_unknown(self):
        with pytest.raises(TypeError, match="MaxTokenBucketizer.*no len"):
            len(IterableWrapper(["a"]).max_token_bucketize(3))

    def test_len_fn_error_names_the_item(self):
        with pytest.raises(TypeError) as info:
            list(IterableWrapper(["ab", "c", 5, "d"]).max_token_bucketize(3))
        assert "MaxTokenBucketizer(3)" in notes(info.value) and "item 2" in notes(info.value)

    def test_contract_and_resume(self):
        check_datapipe(IterableWrapper(words(40)).max_token_bucketize(12, buffer_size=6),
                       build=lambda src: src.map(str).max_token_bucketize(3, buffer_size=2))
        check_resume(lambda: IterableWrapper(words(40)).max_token_bucketize(12, buffer_size=6), EVERY_K)
        check_resume(lambda: IterableWrapper(words(40)).max_token_bucketize(20, include_padding=True), EVERY_K,
                     through="torch")

    def test_pickles(self):
        pipe = IterableWrapper(words(20)).max_token_bucketize(10, len_fn=lambda w: len(w) // 2)
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe)


# -- ParagraphAggregator ---------------------------------------------------------------------------

LINES = [("f1", "Line1"), ("f1", "Line2"), ("f2", "Line2,1"), ("f2", "Line2,2"), ("f2", "Line2,3"),
         ("f2", ""), ("f2", "p2"), ("f3", ""), ("f3", ""), ("f3", "a"), ("f4", "b")]


class TestParagraphAggregator:
    def test_torchdata_example(self):
        source = IterableWrapper(LINES[:5])
        assert list(source.lines_to_paragraphs(joiner=lambda ls: " ".join(ls))) == \
            [("f1", "Line1 Line2"), ("f2", "Line2,1 Line2,2 Line2,3")]

    def test_empty_lines_and_files_end_paragraphs(self):
        assert list(IterableWrapper(LINES).lines_to_paragraphs()) == [
            ("f1", "Line1\nLine2"), ("f2", "Line2,1\nLine2,2\nLine2,3"), ("f2", "p2"), ("f3", "a"), ("f4", "b")]
        assert list(IterableWrapper([]).lines_to_paragraphs()) == []
        assert list(IterableWrapper([("f", "")]).lines_to_paragraphs()) == []

    def test_len_is_unknown(self):
        with pytest.raises(TypeError, match="ParagraphAggregator.*no len"):
            len(IterableWrapper(LINES).lines_to_paragraphs())

    def test_contract_and_resume(self):
        check_datapipe(IterableWrapper(LINES).lines_to_paragraphs(), build=lambda src: src.map(
            lambda x: ("f", str(x))).lines_to_paragraphs())
        check_resume(lambda: IterableWrapper(LINES).lines_to_paragraphs(joiner=tuple), EVERY_K)

    def test_errors(self):
        with pytest.raises(ValueError) as info:
            list(IterableWrapper([("f", "a"), ("f", "b", "c")]).lines_to_paragraphs())
        assert "item 1" in notes(info.value) and "(file name, line) pair" in notes(info.value)

        def joiner(lines):
            raise Boom(lines)

        with pytest.raises(Boom) as info:
            list(IterableWrapper(LINES).lines_to_paragraphs(joiner=joiner))
        assert "ParagraphAggregator(joiner)" in notes(info.value)
        with pytest.raises(TypeError, match="ParagraphAggregator: joiner must be callable"):
            IterableWrapper(LINES).lines_to_paragraphs(joiner="\n")

    def test_pickles(self):
        pipe = IterableWrapper(LINES).lines_to_paragraphs(joiner=lambda ls: "|".join(ls))
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe)


# -- Rows2Columnar ---------------------------------------------------------------------------------


class TestRows2Columnar:
    def test_torchdata_examples(self):
        dp = IterableWrapper([[{"a": 1}, {"b": 2, "a": 1}], [{"a": 1, "b": 200}, {"b": 2, "c": 3, "a": 100}]])
        out = list(dp.rows2columnar())
        assert all(type(d) is defaultdict for d in out)
        assert out == [{"a": [1, 1], "b": [2]}, {"a": [1, 100], "b": [200, 2], "c": [3]}]
        assert list(dp.rows2columnar(column_names=["a"])) == [{"a": [1, 1]}, {"a": [1, 100]}]
        names = ["1st_in_batch", "2nd_in_batch", "3rd_in_batch", "4th_in_batch"]
        assert list(IterableWrapper([[[0, 1, 2, 3], [4, 5, 6, 7]]]).rows2columnar(column_names=names)) == [
            {"1st_in_batch": [0, 4], "2nd_in_batch": [1, 5], "3rd_in_batch": [2, 6], "4th_in_batch": [3, 7]}]

    def test_missing_key_and_long_rows(self):
        with pytest.raises(KeyError) as info:
            list(IterableWrapper([[{"a": 1}], [{"b": 2}]]).rows2columnar(["a"]))
        assert "Rows2Columnar" in notes(info.value) and "batch 1" in notes(info.value)
        with pytest.raises(IndexError, match="row 1 has more than 2 values.*list index out of range"):
            list(IterableWrapper([[[1, 2], [3, 4, 5]]]).rows2columnar(["a", "b"]))
        with pytest.raises(IndexError, match="more than 0 values"):
            list(IterableWrapper([[[1]]]).rows2columnar())

    def test_arguments_and_len(self):
        with pytest.raises(TypeError, match="Rows2Columnar: column_names must be a list"):
            IterableWrapper([]).rows2columnar("ab")
        assert len(IterableWrapper([[{"a": 1}]] * 3).rows2columnar()) == 3

    def test_contract_and_resume(self):
        batches = [[{"a": i, "b": -i}, {"a": i + 1}] for i in range(6)]
        check_datapipe(IterableWrapper(batches).rows2columnar(), build=lambda src: src.batch(2).rows2columnar(["x", "y"]),
                       probe_data=[[1, 2], [3, 4], [5, 6]])
        check_resume(lambda: IterableWrapper(batches).rows2columnar(("a",)), EVERY_K)


# -- ShardExpander ---------------------------------------------------------------------------------


class TestShardExpander:
    def test_torchdata_examples(self):
        assert list(IterableWrapper(["ds-{00..05}.tar"]).shard_expand()) == [
            "ds-00.tar", "ds-01.tar", "ds-02.tar", "ds-03.tar", "ds-04.tar", "ds-05.tar"]
        assert list(IterableWrapper(["imgs_{00..02}.tar", "labels_{00..02}.tar"]).shard_expand()) == [
            "imgs_00.tar", "imgs_01.tar", "imgs_02.tar", "labels_00.tar", "labels_01.tar", "labels_02.tar"]

    def test_padding_nesting_and_plain_names(self):
        assert list(IterableWrapper(["data-{000..009}.tar"]).shard_expand())[::9] == ["data-000.tar", "data-009.tar"]
        assert list(IterableWrapper(["a{8..11}"]).shard_expand()) == ["a8", "a9", "a10", "a11"]
        assert list(IterableWrapper(["a{0..10}"]).shard_expand())[-2:] == ["a9", "a10"]
        assert list(IterableWrapper(["{1..2}{0..1}x"]).shard_expand()) == ["10x", "11x", "20x", "21x"]
        assert list(IterableWrapper(["plain.tar", "{a..b}", "{1.2}"]).shard_expand()) == ["plain.tar", "{a..b}", "{1.2}"]
        assert len(list(IterableWrapper(["imagenet-{000000..001199}.tar"]).shard_expand())) == 1200

    @pytest.mark.parametrize("spec, phrase", [
        ("x{5..3}", "shard_expand: bad range in in shard spec x{5..3}."),
        ("x{3..3}", "shard_expand: bad range in in shard spec x{3..3}."),
        ("{0..1}-{3..3}.a", "shard_expand: bad range in in shard spec -{3..3}.a."),  # the rest, as torchdata
        ("x{01..100}", "shard_expand: low bound must not start with 0 if low bound is shorter"),
        ("x{100..99}", "shard_expand: low bound must be shorter than high bound"),
    ])
    def test_bad_ranges(self, spec, phrase):  # torchdata's phrases, after the stage, position and item
        with pytest.raises(ValueError) as info:
            list(IterableWrapper(["ok", spec]).shard_expand())
        assert str(info.value).startswith(f"ShardExpander: item 1 {spec!r}")
        assert str(info.value).endswith(phrase)

    def test_not_a_string(self):
        with pytest.raises(TypeError) as info:
            list(IterableWrapper(["a{1..2}", 7]).shard_expand())
        assert "ShardExpander" in notes(info.value) and "item 1" in notes(info.value)

    def test_len_is_unknown(self):
        with pytest.raises(TypeError, match="ShardExpander.*no len"):
            len(IterableWrapper(["a"]).shard_expand())

    def test_contract_and_resume(self):
        specs = ["s{0..3}", "plain", "t{00..02}-{1..2}"]
        check_datapipe(IterableWrapper(specs).shard_expand(), build=lambda src: src.map(lambda i: f"x{{0..{i + 1}}}")
                       .shard_expand())
        check_resume(lambda: IterableWrapper(specs).shard_expand(), EVERY_K)


# -- BatchMapper -----------------------------------------------------------------------------------


def plus_one(batch):
    return [x + 1 for x in batch]


def pairs_gen(batch):
    for x in batch:
        yield x
        yield -x


class TestBatchMapper:
    def test_torchdata_example(self):
        assert list(IterableWrapper(range(5)).map_batches(plus_one, batch_size=3)) == [1, 2, 3, 4, 5]

    def test_fn_sees_whole_batches_and_may_change_the_count(self):
        seen = []

        def fn(batch):
            seen.append(list(batch))
            return [sum(batch)]

        assert list(IterableWrapper(range(7)).map_batches(fn, 3)) == [3, 12, 6]
        assert seen == [[0, 1, 2], [3, 4, 5], [6]]
        assert list(IterableWrapper(range(3)).map_batches(pairs_gen, 2)) == [0, 0, 1, -1, 2, -2]
        assert list(IterableWrapper(range(4)).map_batches(lambda b: [], 2)) == []

    def test_input_col(self):
        rows = [(1, "a"), (2, "b"), (3, "c")]
        assert list(IterableWrapper(rows).map_batches(lambda xs: xs, 2, input_col=1)) == ["a", "b", "c"]
        assert list(IterableWrapper(rows).map_batches(lambda xs: xs, 2, input_col=[1, 0])) == [["a", 1], ["b", 2], ["c", 3]]
        dicts = [{"k": i} for i in range(3)]
        assert list(IterableWrapper(dicts).map_batches(plus_one, 5, input_col="k")) == [1, 2, 3]

    def test_arguments_and_len(self):
        with pytest.raises(ValueError, match=r"^BatchMapper\(batch_size=0\): Batch size is required to be larger than 0!$"):
            IterableWrapper([]).map_batches(plus_one, 0)
        with pytest.raises(TypeError, match="BatchMapper: fn must be callable"):
            IterableWrapper([]).map_batches(None, 2)
        with pytest.raises(ValueError, match="BatchMapper: The function"):
            IterableWrapper([]).map_batches(lambda a, b: a, 2)
        with pytest.raises(TypeError, match=r"^BatchMapper\(plus_one\): BatchMapper's length relies on the output of its function\.$"):
            len(IterableWrapper(range(3)).map_batches(plus_one, 2))

    def test_fn_errors_name_the_batch(self):
        def fn(batch):
            if 4 in batch:
                raise Boom(batch)
            return batch

        with pytest.raises(Boom) as info:
            list(IterableWrapper(range(9)).map_batches(fn, 2))
        assert "BatchMapper(" in notes(info.value) and "batch 2" in notes(info.value)
        with pytest.raises(TypeError) as info:
            list(IterableWrapper(range(3)).map_batches(lambda b: None, 2))
        assert "batch 0" in notes(info.value)

    def test_contract(self):
        check_datapipe(IterableWrapper(range(11)).map_batches(plus_one, 3),
                       build=lambda src: src.map_batches(pairs_gen, 3), probe_data=range(5))

    @pytest.mark.parametrize("fn", [plus_one, pairs_gen, tuple])
    def test_resume(self, fn):
        check_resume(lambda: IterableWrapper(range(11)).map_batches(fn, 3), EVERY_K)

    def test_pickles(self):
        pipe = IterableWrapper(range(7)).map_batches(lambda b: b[::-1], 3)
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe) == [2, 1, 0, 5, 4, 3, 6]


# -- ThreadPoolMapper ------------------------------------------------------------------------------

_jitter = random.Random(0)


def slow_ten(x):
    time.sleep(_jitter.random() * 0.002)  # completion order differs from source order
    return x * 10


class TestThreadPoolMapper:
    def test_is_a_concurrent_ordered_map(self):
        pipe = IterableWrapper(range(40)).threadpool_map(slow_ten, max_workers=4)
        assert isinstance(pipe, Mapper) and pipe.concurrency == 4 and pipe.ordered
        assert list(pipe) == [x * 10 for x in range(40)]

    def test_runs_on_worker_threads(self):
        names = set()

        def fn(x):
            names.add(threading.current_thread().name)
            time.sleep(0.001)
            return x

        assert list(IterableWrapper(range(20)).threadpool_map(fn, max_workers=3)) == list(range(20))
        assert names and all("ThreadPoolMapper(fn)" in n for n in names)

    def test_workers_and_scheduled_tasks(self):
        src = IterableWrapper(range(3))
        assert src.threadpool_map(abs).concurrency == ThreadPoolMapper(src, abs).concurrency >= 5
        assert src.threadpool_map(abs, scheduled_tasks=2, max_workers=8).concurrency == 2
        assert src.threadpool_map(abs, max_workers=1).concurrency == 1
        assert list(src.threadpool_map(abs, max_workers=1)) == [0, 1, 2]

    def test_torchdata_columns_examples(self):
        rows = [(i, i) for i in range(5)]
        assert list(IterableWrapper(rows).threadpool_map(slow_ten, input_col=1)) == [(i, i * 10) for i in range(5)]
        assert list(IterableWrapper(rows).threadpool_map(slow_ten, input_col=1, output_col=-1)) == \
            [(i, i, i * 10) for i in range(5)]
        dicts = [{"a": 1}]
        assert list(IterableWrapper(dicts).threadpool_map(slow_ten, input_col="a", output_col="b")) == [{"a": 1, "b": 10}]
        assert dicts == [{"a": 1}]

    def test_fn_errors_pass_through(self):
        def fn(x):
            if x == 7:
                raise Boom(x)
            return x

        with pytest.raises(Boom) as info:
            list(IterableWrapper(range(20)).threadpool_map(fn, max_workers=3))
        assert info.value.args == (7,)
        assert "ThreadPoolMapper(fn)" in notes(info.value) and "item 7" in notes(info.value)

    def test_arguments(self):
        src = IterableWrapper([])
        with pytest.raises(ValueError, match=r"^ThreadPoolMapper\(scheduled_tasks=0\): 'scheduled_tasks' is required to be a"):
            src.threadpool_map(abs, scheduled_tasks=0)
        with pytest.raises(ValueError, match=r"^ThreadPoolMapper\(max_workers=0\): 'max_workers' is required to be a"):
            src.threadpool_map(abs, max_workers=0)
        with pytest.raises(TypeError, match=r"ThreadPoolMapper: threadpool_kwargs \['initializer'\] are not supported"):
            src.threadpool_map(abs, initializer=print)
        with pytest.raises(ValueError, match=r"^ThreadPoolMapper\(output_col=1\): `output_col` must be None when `input_col`"):
            src.threadpool_map(abs, output_col=1)
        with pytest.raises(ValueError, match="ThreadPoolMapper: The function"):
            src.threadpool_map(lambda a, b: a, input_col=0)
        with pytest.raises(TypeError, match="ThreadPoolMapper: source_datapipe must be an IterDataPipe"):
            ThreadPoolMapper([1], abs)
        assert src.threadpool_map(abs, thread_name_prefix="io").threadpool_kwargs == {"thread_name_prefix": "io"}

    def test_len_is_the_sources(self):
        assert len(IterableWrapper(range(6)).threadpool_map(abs)) == 6

    def test_contract_and_resume(self, no_thread_leak):
        check_datapipe(IterableWrapper(range(30)).threadpool_map(slow_ten, max_workers=3),
                       build=lambda src: src.threadpool_map(abs, max_workers=2))
        check_resume(lambda: IterableWrapper(range(30)).threadpool_map(slow_ten, max_workers=3), [0, 1, 13, 29, 30])

    def test_pickles(self):
        pipe = IterableWrapper(range(5)).threadpool_map(lambda x: -x, max_workers=2)
        assert list(pickle.loads(pickle.dumps(pipe))) == [0, -1, -2, -3, -4]


async def _times_ten(x):
    await asyncio.sleep(random.random() / 1000)  # completion order shuffled on purpose
    return x * 10


class TestBatchAsyncMapper:
    def test_source_order_flat_and_batched(self):
        pipe = IterableWrapper(range(23)).async_map_batches(_times_ten, batch_size=4)
        assert isinstance(pipe, BatchAsyncMapper) and pipe.concurrency == 4
        assert list(pipe) == [x * 10 for x in range(23)] and len(pipe) == 23
        batched = IterableWrapper(range(7)).async_map_batches(_times_ten, 3, flatten=False)
        out = list(batched)
        assert out == [[0, 10, 20], [30, 40, 50], [60]] and all(type(b) is DataChunk for b in out)
        assert len(batched) == 3

    def test_columns_as_torchdata(self):
        rows = [(i, i) for i in range(4)]
        assert list(IterableWrapper(rows).async_map_batches(_times_ten, 2, input_col=1)) == [(i, i * 10) for i in range(4)]
        assert list(IterableWrapper(rows).async_map_batches(_times_ten, 2, input_col=1, output_col=-1)) == [
            (i, i, i * 10) for i in range(4)]

    def test_concurrency_is_capped_by_max_concurrency(self):
        assert IterableWrapper(range(3)).async_map_batches(_times_ten, 64, max_concurrency=5).concurrency == 5

    def test_errors_pass_through_with_a_note(self):
        async def fails(x):
            if x == 3:
                raise KeyError(x)
            return x

        with pytest.raises(KeyError) as info:
            list(IterableWrapper(range(6)).async_map_batches(fails, 2))
        assert any("BatchAsyncMapper" in n for n in info.value.__notes__)

    def test_bad_arguments(self):
        src = IterableWrapper(range(3))
        with pytest.raises(TypeError, match="^BatchAsyncMapper: Expected a corotine function with an async def syntax"):
            src.async_map_batches(lambda x: x, 2)
        with pytest.raises(ValueError, match="batch_size"):
            src.async_map_batches(_times_ten, 0)
        with pytest.raises(ValueError, match="max_concurrency"):
            src.async_map_batches(_times_ten, 2, max_concurrency=0)
        with pytest.raises(TypeError, match="flatten must be a bool"):
            src.async_map_batches(_times_ten, 2, flatten="no")

    def test_contract_pickle_and_resume(self):
        check_datapipe(IterableWrapper(range(12)).async_map_batches(_times_ten, 4), expected=[x * 10 for x in range(12)])
        check_datapipe(IterableWrapper(range(5)).async_map_batches(_times_ten, 2, flatten=False),
                       expected=[[0, 10], [20, 30], [40]])
        clone = pickle.loads(pickle.dumps(IterableWrapper(range(4)).async_map_batches(_times_ten, 2)))
        assert list(clone) == [0, 10, 20, 30]


def test_async_map_batches_keeps_the_functional_methods():
    pipe = IterableWrapper([(1, (2, 3))]).async_map_batches(_times_ten_pair, 2)
    assert list(pipe.flatten()) == [(10, 2, 3)]


async def _times_ten_pair(item):
    return (item[0] * 10, item[1])
