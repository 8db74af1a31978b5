"""torchdata's MaxTokenBucketizer [max_token_bucketize] (datapipes/iter/bucketing.py).

Its output depends on its algorithm (the heap order of ``max_token_bucketize``): a small reference written
from torchdata's documented behaviour runs beside ours."""

import dataclasses
import heapq
import pickle
import random

import pytest

from datapipes import DataChunk
from datapipes.iter import IterableWrapper
from datapipes.testing import check_datapipe, check_resume

EVERY_K = lambda n: range(n + 1)  # noqa: E731 - check_resume's ks: stop after every number of items


def notes(e):
    return "\n".join(getattr(e, "__notes__", []))


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
