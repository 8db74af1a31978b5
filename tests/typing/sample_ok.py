"""Code that must type-check with mypy (tests/test_typing.py runs it) and run as written.

``assert_type`` fails mypy when the declared result type differs; at run time it returns its
argument, and the ``assert``s check that the declared types describe what the pipes really yield.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any, assert_type

from datapipes import IterDataPipe, MapDataPipe
from datapipes.iter import (
    BucketBatcher, Concater, Cycler, Enumerator, FileLister, FileOpener, Filter, FlatMapper, Header,
    InMemoryCacheHolder, IterableWrapper, Mapper, Multiplexer, Prefetcher, ShardingFilter, WebDatasetGrouper,
)
from datapipes.iter.broadcast.demux import DemultiplexerChild
from datapipes.iter.broadcast.fork import ForkerChild
from datapipes.map import Concater as MapConcater, MapToIterConverter, SequenceWrapper, Shuffler as MapShuffler

# names exported from the subpackages of datapipes.iter, as mypy sees them
from datapipes.iter import Demultiplexer, Forker, HashChecker, HttpReader, OnDiskCacheHolder, TFRecordLoader  # noqa: E402

assert all(isinstance(c, type) for c in (Demultiplexer, Forker, HashChecker, HttpReader, OnDiskCacheHolder, TFRecordLoader))

ints = IterableWrapper([1, 2, 3, 4])
assert_type(ints, IterableWrapper[int])

# map: the element type follows fn's result
strs: IterDataPipe[str] = IterableWrapper([1]).map(str)
assert_type(ints.map(str), Mapper[str])
assert_type(ints.map(lambda x: x * 0.5), Mapper[float])
assert list(strs) == ["1"]
# stages that skip and count failures return their own class: .failures type-checks
parsed = IterableWrapper(["1", "x"]).map(int, on_error="skip")
assert list(parsed) == [1] and parsed.failures.count == 1


async def double(x: int) -> int:
    return 2 * x


# an async fn gives its awaited result type
assert_type(ints.map(double), Mapper[int])
assert list(ints.map(double)) == [2, 4, 6, 8]
# concurrent map: the same result type, whatever the executor
assert_type(ints.map(str, concurrency=4, ordered=False, executor="thread"), Mapper[str])
assert sorted(ints.map(str, concurrency=2, ordered=False)) == ["1", "2", "3", "4"]


def jitter(x: int, rng: random.Random) -> float:
    return x + rng.random() / 2


# with rng, fn is called as fn(item, rng=generator)
assert_type(ints.map(jitter, rng="python"), Mapper[float])
assert [round(y) for y in ints.map(jitter, rng="python")] == [1, 2, 3, 4]
assert_type(ints.prefetch(2), Prefetcher[int])
assert list(ints.prefetch(2)) == [1, 2, 3, 4]
# with input_col, fn receives columns: the result is Any
pairs = IterableWrapper([(1, "a"), (2, "b")])
assert_type(pairs, IterableWrapper[tuple[int, str]])
assert_type(pairs.map(str.upper, input_col=1), Mapper[Any])
assert list(pairs.map(str.upper, input_col=1)) == [(1, "A"), (2, "B")]

# filter keeps the type; its predicate sees the element type
evens = ints.filter(lambda x: x % 2 == 0)
assert_type(evens, Filter[int])
assert list(evens) == [2, 4]
assert_type(pairs.filter(lambda c: c == "a", input_col=1), Filter[tuple[int, str]])

# flatmap: elements of the returned iterable; without fn, the items are flattened
assert_type(ints.flatmap(lambda x: [str(x)] * x), FlatMapper[str])
assert_type(IterableWrapper([[1], [2, 3]]).flatmap(), FlatMapper[int])
assert list(IterableWrapper([[1], [2, 3]]).flatmap()) == [1, 2, 3]


async def repeat_async(x: int) -> AsyncIterator[str]:
    for _ in range(x):
        yield str(x)


# an async generator function gives its elements too
assert_type(ints.flatmap(repeat_async), FlatMapper[str])
assert list(IterableWrapper([1, 2]).flatmap(repeat_async)) == ["1", "2", "2"]

# batch -> lists; unbatch undoes it; wrapper_class decides the batch type
batches = ints.batch(3)
assert_type(batches, IterDataPipe[list[int]])
assert list(batches) == [[1, 2, 3], [4]]
assert_type(batches.unbatch(), IterDataPipe[int])
assert list(batches.unbatch()) == [1, 2, 3, 4]
assert_type(ints.batch(2, wrapper_class=tuple), IterDataPipe[tuple[int, ...]])
assert list(ints.batch(2, drop_last=True, wrapper_class=tuple)) == [(1, 2), (3, 4)]
assert_type(ints.bucketbatch(2, key=lambda x: -x), BucketBatcher[int])

# groupby: lists, or (key, list) pairs with keep_key=True
words = IterableWrapper(["apple", "avocado", "banana"])
assert_type(words.groupby(lambda w: w[0]), IterDataPipe[list[str]])


def initial(word: str) -> str:
    return word[0]


keyed = words.groupby(initial, keep_key=True)
assert_type(keyed, IterDataPipe[tuple[str, list[str]]])
assert list(keyed) == [("a", ["apple", "avocado"]), ("b", ["banana"])]

# combining: zip gives tuples of the element types, concat and mux unions, fork/demux lists of pipes
zipped = ints.zip(words)
assert_type(zipped, IterDataPipe[tuple[int, str]])
assert list(zipped) == [(1, "apple"), (2, "avocado"), (3, "banana")]
assert_type(ints.zip(words, strs), IterDataPipe[tuple[int, str, str]])
assert_type(ints.concat(ints), Concater[int])
assert_type(ints.concat(words), Concater[int | str])
assert list(ints.concat(words)) == [1, 2, 3, 4, "apple", "avocado", "banana"]
assert_type(ints.mux(ints), Multiplexer[int])
left, right = ints.fork(2)
assert_type(left, ForkerChild[int])
assert list(left) == list(right) == [1, 2, 3, 4]
odd, even = ints.demux(2, lambda x: x % 2)
assert_type(odd, DemultiplexerChild[int])
assert list(odd) == [2, 4]

# small utilities keep the type; enumerate pairs with the index
assert_type(ints.header(2), Header[int])
assert_type(ints.cycle(2), Cycler[int])
assert_type(ints.enumerate(), Enumerator[int])
assert list(ints.enumerate(starting_index=1))[0] == (1, 1)
assert_type(ints.in_memory_cache(), InMemoryCacheHolder[int])
assert_type(ints.sharding_filter(), ShardingFilter[int])
assert_type(ints.shuffle(), IterDataPipe[int])
assert_type(ints.shuffle(buffer_size=2), IterDataPipe[int])
assert sorted(ints.shuffle()) == [1, 2, 3, 4]
train, valid = ints.random_split({"train": 0.5, "valid": 0.5}, seed=0)
assert_type(train, IterDataPipe[int])
assert_type(ints.random_split({"train": 1, "valid": 3}, seed=0, target="valid"), IterDataPipe[int])
assert sorted([*train, *valid]) == [1, 2, 3, 4]

# a chain: the element type flows through every stage
chain: IterDataPipe[list[str]] = ints.map(lambda x: x + 1).filter(lambda x: x > 1).map(str).batch(2)
assert list(chain) == [["2", "3"], ["4", "5"]]

# between the two kinds
table = IterableWrapper([("a", 1), ("b", 2)]).to_map_datapipe()
assert_type(table, MapDataPipe[int])
assert table["b"] == 2
assert_type(words.to_map_datapipe(lambda w: (w[0], len(w))), MapDataPipe[int])

# sources: paths -> (path, stream) pairs -> records
import io  # noqa: E402

from datapipes.iter import FSSpecFileOpener, ImageDecoder, JsonParser, TarArchiveLoader  # noqa: E402

files = IterableWrapper(["."]).list_files(masks="*.csv")
assert_type(files, FileLister)
assert_type(files.open_files(mode="b"), FileOpener)
assert_type(files.open_files_by_fsspec(), FSSpecFileOpener)


def csv_text() -> IterableWrapper[tuple[str, io.StringIO]]:
    return IterableWrapper([("a.csv", io.StringIO("x,y\n1,2\n"))])


assert_type(csv_text().parse_csv(), IterDataPipe[list[str]])
assert list(csv_text().parse_csv(skip_lines=1)) == [["1", "2"]]
assert_type(csv_text().parse_csv(as_tuple=True), IterDataPipe[tuple[str, ...]])
assert list(csv_text().parse_csv(as_tuple=True)) == [("x", "y"), ("1", "2")]
assert_type(csv_text().parse_csv_files(), IterDataPipe[tuple[str, list[str]]])
assert list(csv_text().parse_csv_files())[0] == ("a.csv", ["x", "y"])
assert_type(csv_text().parse_csv_as_dict(), IterDataPipe[dict[str, str]])
assert list(csv_text().parse_csv_as_dict()) == [{"x": "1", "y": "2"}]
assert_type(csv_text().parse_csv_as_dict(return_path=True), IterDataPipe[tuple[str, dict[str, str]]])
path, line = next(iter(csv_text().readlines()))
assert (path, line) == ("a.csv", "x,y")
json_docs = IterableWrapper([("a.json", io.StringIO('{"k": [1]}'))]).parse_json_files()
assert_type(json_docs, JsonParser)
assert list(json_docs) == [("a.json", {"k": [1]})]

# archives and images
assert_type(files.open_files(mode="b").load_from_tar(), TarArchiveLoader)
assert_type(files.open_files(mode="b").load_from_zip().webdataset(), WebDatasetGrouper)
assert_type(files.open_files(mode="b").decode_image(size=(224, 224), layout="chw"), ImageDecoder)

# map-style pipes
seq = SequenceWrapper([10, 20, 30])
assert_type(seq, SequenceWrapper[int])
assert_type(seq.map(str), MapDataPipe[str])
assert seq.map(str)[1] == "20"
assert_type(seq.batch(2), MapDataPipe[list[int]])
assert seq.batch(2)[1] == [30]
assert_type(seq.concat(seq), MapConcater[int])
assert_type(seq.zip(seq.map(str)), MapDataPipe[tuple[int, str]])
assert seq.zip(seq.map(str))[0] == (10, "10")
assert_type(seq.shuffle(), MapShuffler[int])
assert_type(seq.to_iter_datapipe(), MapToIterConverter[int])
assert list(seq.to_iter_datapipe()) == [10, 20, 30]

# every pipe is a torch dataset
from torch.utils.data import Dataset, IterableDataset  # noqa: E402

as_torch: IterableDataset[str] = strs
as_dataset: Dataset[int] = seq
