"""torchdata 0.9's argument checks, error types, phrases, orders and lengths, as its own tests
(pytorch/data v0.9.0, test/test_iterdatapipe.py and friends) rely on them, written here as our own
tests; and error messages that say each thing once (one sentence: the stage and the values at
fault, then the words torch or torchdata users match on)."""

import io
import re
import warnings

import pytest

from datapipes import IterDataPipe
from datapipes.iter import (
    Concater,
    Cycler,
    FlatMapper,
    Header,
    IterableWrapper,
    MapKeyZipper,
    MapToIterConverter,
    SampleMultiplexer,
    Sampler,
)
from datapipes.map import IterToMapConverter, SequenceWrapper

W = IterableWrapper


class NoLen(IterDataPipe):
    """A source that defines no ``__len__``."""

    def __init__(self, n=6):
        self.n = n

    def __iter__(self):
        yield from range(self.n)


async def plus_one(x):
    return x + 1


def ident(x):
    return x


# -- torchdata's types and words where it refuses an argument ------------------------------------------

#: name -> (the call, the exception classes it must be an instance of, the whole message)
REFUSED = {
    "cycle(-1)": (lambda: W([1]).cycle(-1), (ValueError,), "Cycler: Expected non-negative count, got -1"),
    "set_length(-1)": (lambda: W([1]).set_length(-1), (ValueError, AssertionError),
                       "LengthSetter(length=-1): length must be >= 0"),
    "shuffled_flatmap(buffer_size=0)": (lambda: W([1]).shuffled_flatmap(buffer_size=0), (ValueError, AssertionError),
                                        "ShuffledFlatMapper(buffer_size=0): buffer_size should be larger than 0"),
    "map_batches(fn, 0)": (lambda: W([1]).map_batches(ident, 0), (ValueError, AssertionError),
                           "BatchMapper(batch_size=0): Batch size is required to be larger than 0!"),
    "bucketbatch(0)": (lambda: W([1]).bucketbatch(0), (ValueError, AssertionError),
                       "BucketBatcher(batch_size=0): Batch size is required to be larger than 0!"),
    "bucketbatch(batch_num=-1)": (lambda: W([1]).bucketbatch(2, batch_num=-1), (ValueError, AssertionError),
                                  "BucketBatcher(batch_num=-1): Number of batches is required to be larger than 0!"),
    "bucketbatch(bucket_num=0)": (lambda: W([1]).bucketbatch(2, bucket_num=0), (ValueError, AssertionError),
                                  "BucketBatcher(bucket_num=0): Number of buckets is required to be larger than 0!"),
    "round_robin_demux(0)": (lambda: W([1]).round_robin_demux(0), (ValueError,),
                             "RoundRobinDemultiplexer: Expected `num_instaces` larger than 0, but 0 is found"),
    "fork(0)": (lambda: W([1]).fork(0), (ValueError,), "Forker: Expected `num_instances` larger than 0, but 0 is found"),
    "demux(-1)": (lambda: W([1]).demux(-1, ident), (ValueError,),
                  "Demultiplexer: Expected `num_instances` larger than 0, but -1 is found"),
    "unzip(0)": (lambda: W([(1, 2)]).unzip(0), (RuntimeError,),
                 "UnZipper(sequence_length=0, columns_to_skip=None): All instances are being filtered out in "
                 "UnZipperIterDataPipe. Please check the input `sequence_length` and `columns_to_skip`."),
    "map-style unzip(0)": (lambda: SequenceWrapper([(1, 2)]).unzip(0), (ValueError,),
                           "UnZipper: Expected `sequence_length` larger than 0, but 0 is found"),
    "prefetch(0)": (lambda: W([1]).prefetch(0), (ValueError,),
                    "Prefetcher(buffer_size=0): 'buffer_size' is required to be a positive integer."),
    "readlines(skip_lines=-1)": (lambda: W([("a", io.StringIO("x"))]).readlines(skip_lines=-1), (ValueError,),
                                 "LineReader(skip_lines=-1): 'skip_lines' is required to be a positive integer."),
    "zip_with_iter(buffer_size=0)": (
        lambda: W([1]).zip_with_iter(W([1]), key_fn=ident, buffer_size=0), (ValueError,),
        "IterKeyZipper(buffer_size=0): 'buffer_size' is required to be either None or a positive integer."),
    "zip_with_iter over a list": (
        lambda: W([1]).zip_with_iter([1], key_fn=ident), (TypeError,),
        "IterKeyZipper: ref_datapipe must be a IterDataPipe, but its type is <class 'list'> instead."),
    "zip_with_map over a list": (
        lambda: MapKeyZipper(W([1]), [1], key_fn=ident), (TypeError,),
        "MapKeyZipper: map_datapipe must be a MapDataPipe, but its type is <class 'list'> instead."),
    "IterToMapConverter of a list": (lambda: IterToMapConverter([1]), (TypeError,),
                                     "IterToMapConverter can only apply on IterDataPipe, but found <class 'list'>"),
    "MapToIterConverter of a list": (lambda: MapToIterConverter([1]), (TypeError,),
                                     "MapToIterConverter can only apply on MapDataPipe, but found <class 'list'>"),
    "threadpool_map(scheduled_tasks=0)": (
        lambda: W([1]).threadpool_map(ident, scheduled_tasks=0), (ValueError,),
        "ThreadPoolMapper(scheduled_tasks=0): 'scheduled_tasks' is required to be a positive integer."),
    "threadpool_map(output_col=1)": (
        lambda: W([1]).threadpool_map(ident, output_col=1), (ValueError,),
        "ThreadPoolMapper(output_col=1): `output_col` must be None when `input_col` is None."),
    "map(output_col=[1, 2])": (
        lambda: W([(1, 2)]).map(ident, input_col=0, output_col=[1, 2]), (ValueError,),
        "Mapper(output_col=[1, 2]): `output_col` must be a single-element list or tuple"),
    "max_token_bucketize(buffer_size=0)": (
        lambda: W(["a"]).max_token_bucketize(2, buffer_size=0), (ValueError,),
        "MaxTokenBucketizer(buffer_size=0): 'buffer_size' is required to be a positive integer."),
    "async_map_batches of a plain function": (
        lambda: W([1]).async_map_batches(ident, 2), (ValueError, TypeError),
        "BatchAsyncMapper: Expected a corotine function with an async def syntax, but got a <class 'function'> "
        "(use map(fn, concurrency=n) or threadpool_map for a plain function)"),
    "random_split with an unknown target": (
        lambda: W(range(4)).random_split(weights={"a": 1, "b": 1}, seed=0, target="c"), (KeyError,),
        "RandomSplitter: `target=c` does not match any key in `weights` ['a', 'b']"),
    "random_split without total_length": (
        lambda: NoLen().random_split(weights={"a": 1, "b": 1}, seed=0), (TypeError,),
        "RandomSplitter needs `total_length`, but it is unable to infer it from the `source_datapipe` "
        "(NoLen defines no __len__)"),
    "check_hash(hash_type='sha1')": (
        lambda: W([("a", io.BytesIO())]).check_hash({}, hash_type="sha1"), (ValueError,),
        "HashChecker(hash_type='sha1'): Invalid hash_type requested, should be one of ['sha256', 'md5']"),
    "check_hash without the file's hash": (
        lambda: list(W([("a", io.BytesIO(b""))]).check_hash({})), (RuntimeError,), "HashChecker: Unspecified hash for file a"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_as_torchdata_refuses(case):
    call, kinds, message = REFUSED[case]
    with pytest.raises(kinds[0]) as info:
        call()
    assert all(isinstance(info.value, kind) for kind in kinds), type(info.value).__mro__
    text = info.value.args[0] if isinstance(info.value, KeyError) else str(info.value)
    assert text == message


def test_the_random_split_length_is_checked_before_the_target():
    with pytest.raises(TypeError, match="needs `total_length`"):
        NoLen().random_split(weights={"a": 1}, seed=0, target="nope")


# -- buffer_size=0 and negative buffer sizes, as torch's fork and demux take them -----------------------


def test_a_lone_child_reads_freely_with_buffer_size_0():
    (middle,) = W([(i, i + 10, i + 20) for i in range(5)]).unzip(3, columns_to_skip=[0, 2], buffer_size=0)
    assert list(middle) == [10, 11, 12, 13, 14]


def test_buffer_size_0_lets_no_child_read_ahead():
    a, b = W(range(4)).fork(2, buffer_size=0)
    with pytest.raises(BufferError):
        next(iter(a))
    # a round robin over items that come in turn needs no buffer
    evens, odds = W(range(6)).round_robin_demux(2, buffer_size=0)
    assert [x for pair in zip(evens, odds) for x in pair] == list(range(6))
    low, high = W([0, 1, 2, 3]).demux(2, lambda x: int(x >= 2), buffer_size=0)
    with pytest.raises(BufferError):
        list(high)  # 0 and 1 would wait for the other child


@pytest.mark.parametrize("split", ["fork", "demux", "unzip", "round_robin_demux"])
def test_a_negative_buffer_size_is_unbounded_with_torchs_warning(split):
    build = {
        "fork": lambda s: s.fork(2, buffer_size=-5),
        "demux": lambda s: s.demux(2, lambda x: int(x[0] >= 50), buffer_size=-5),
        "unzip": lambda s: s.unzip(2, buffer_size=-5),
        "round_robin_demux": lambda s: s.round_robin_demux(2, buffer_size=-5),
    }[split]
    with pytest.warns(UserWarning, match=r"\(buffer_size=-5\): Unlimited buffer size is set for "):
        a, b = build(W([(i, i) for i in range(100)]))
    assert len(list(b)) + len(list(a)) > 0  # b read to its end first: everything for a waited


# -- torchdata's orders ----------------------------------------------------------------------------------


def test_bucketbatch_with_one_bucket_keeps_the_sorted_order():
    pipe = W(range(31)).bucketbatch(3, drop_last=True, batch_num=100, bucket_num=1, sort_key=sorted)
    for seed in range(5):
        assert list(pipe.set_seed(seed)) == [[x, x + 1, x + 2] for x in range(0, 30, 3)]


def test_bucketbatch_shuffles_batches_in_runs_of_bucket_num():
    # buckets of 3 batches (batch_num=3), shuffled in runs of 2 batches (bucket_num=2) of the
    # stream of sorted buckets, as torchdata's batch(bucket_num).in_batch_shuffle().unbatch()
    buckets = []

    def sort_bucket(bucket):
        buckets.append(sorted(bucket))
        return sorted(bucket)

    pipe = W(range(24)).bucketbatch(1, batch_num=3, bucket_num=2, sort_key=sort_bucket)
    seen = set()
    for seed in range(8):
        buckets.clear()
        order = [x for [x] in pipe.set_seed(seed)]
        stream = [x for bucket in buckets for x in bucket]
        assert [sorted(order[i:i + 2]) for i in range(0, 24, 2)] == [sorted(stream[i:i + 2]) for i in range(0, 24, 2)]
        seen.add(tuple(order))
    assert len(seen) > 1


def test_bucketbatch_streaming_batch_buffer_holds_a_bucket_of_batches():
    # batch_size=2, batch_num=3: torchdata shuffles the batches through a buffer of 6 (2 * 3), so
    # the first batch out can be any of the first 6
    pipe = W(range(40)).bucketbatch(2, batch_num=3, key=ident, use_in_batch_shuffle=False)
    firsts = {next(iter(pipe.set_seed(seed)))[0] // 2 for seed in range(60)}
    assert max(firsts) >= 3 and firsts <= set(range(6))


# -- lengths -----------------------------------------------------------------------------------------------


def test_bucketbatch_with_sort_key_has_no_len():
    assert len(W(range(10)).bucketbatch(3, key=ident)) == 4
    with pytest.raises(TypeError, match=r"^BucketBatcher\(3\) has no len\(\): sort_key may return a bucket"):
        len(W(range(10)).bucketbatch(3, sort_key=sorted))


def test_header_over_a_source_without_len_has_none():
    # torchdata guesses its limit, with a warning; a len() here is exact or unknown
    with pytest.raises(TypeError, match=r"^Header\(5\): its source may yield fewer than limit=5 items "
                                        r"\(NoLen defines no __len__\), so Header instance doesn't have valid length$"):
        len(NoLen(3).header(5))
    with pytest.raises(TypeError, match=r"^Header\(None\): The length of this HeaderIterDataPipe cannot be determined, "
                                        r"since source_datapipe has no len\(\) \(NoLen defines no __len__\)$"):
        len(Header(NoLen(), None))
    assert list(NoLen(3).header(5)) == [0, 1, 2]


def test_in_memory_cache_has_a_len_once_loaded():
    pipe = NoLen(4).in_memory_cache()
    with pytest.raises(TypeError, match="InMemoryCacheHolder instance doesn't have valid length until the cache is "
                                        "loaded$"):
        len(pipe)
    assert list(pipe) == [0, 1, 2, 3] and len(pipe) == 4


@pytest.mark.parametrize("build, phrase", [
    (lambda: Cycler(W([1])), r"^Cycler\(None\): This Cycler instance cycles forever, and therefore doesn't have "
                             r"valid length$"),
    (lambda: W([[1]]).flatmap(list), r"^FlatMapper\(list\): FlatMapper's length relies on the output of its function"),
    (lambda: W([1]).map_batches(ident, 2), r"^BatchMapper\(ident\): BatchMapper's length relies on the output of its "
                                           r"function\.$"),
    (lambda: W([[1]]).shuffled_flatmap(list), r"^ShuffledFlatMapper\(list\): ShuffledFlatMapper's length relies on "),
    (lambda: W(range(13)).random_split(weights={"a": 0.6, "b": 0.4}, seed=0)[0],
     r"^SplitterIterator\('a'\): Lengths of the split cannot be known in advance, since the weights "),
], ids=["cycle()", "flatmap", "map_batches", "shuffled_flatmap", "random_split"])
def test_lengths_torchdata_cannot_know_say_so_in_its_words(build, phrase):
    with pytest.raises(TypeError, match=phrase):
        len(build())


def test_to_map_datapipe_len_over_a_source_without_len_warns():
    pipe = W(range(6)).filter(lambda x: x % 2 == 0).to_map_datapipe(lambda x: (x, x))
    with pytest.warns(UserWarning, match=r"^IterToMapConverter: Data from prior DataPipe are loaded to get length of "):
        assert len(pipe) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(W([(1, 2)]).to_map_datapipe()) == 1  # a source with a length: no warning


# -- the rest of torchdata's words --------------------------------------------------------------------------


def test_to_map_datapipe_speaks_as_dict_does():
    with pytest.raises(TypeError, match=r"^IterToMapConverter: item 0: Cannot convert dictionary update element "
                                        r"<class 'int'> \(0\) to a sequence$"):
        list(W(range(3)).to_map_datapipe())
    with pytest.raises(ValueError, match=r"^IterToMapConverter: key_value_fn's result for item 0: dictionary update "
                                         r"sequence element has length 1, 2 is required$"):
        list(W(range(3)).to_map_datapipe(lambda d: (d,)))
    pipe = W([(1, "a"), (1, "b")]).to_map_datapipe()
    with pytest.warns(UserWarning, match=r"^IterToMapConverter: Found duplicate key 1 at item 1, .*Please check your "
                                         r"`key_value_fn`$"):
        assert pipe[1] == "b"
    with pytest.raises(IndexError, match=r"^IterToMapConverter \(1 keys\): Index 7 is invalid for IterToMapConverter\.$"):
        pipe[7]


def test_flatmap_without_fn_flattens_the_columns():
    rows = W([(0, [1, 2], 3), (4, [5], 6)])
    assert list(rows.flatmap(input_col=1)) == [1, 2, 5]
    assert list(rows.flatmap(input_col=(0, 2))) == [0, 3, 4, 6]
    assert list(FlatMapper(W([[1, 2, [3, 4]]]), input_col=[0, 2])) == [1, [3, 4]]


def test_rows2columnar_takes_a_set_of_names_for_dict_rows():
    rows = W([[{"a": 0, "b": 1, "c": 2}, {"a": 10, "b": 11, "c": 12}]])
    assert [dict(c) for c in rows.rows2columnar({"a", "c"})] == [{"a": [0, 10], "c": [2, 12]}]
    with pytest.raises(TypeError, match="column_names is a set, which has no order"):
        list(W([[[0, 1]]]).rows2columnar({"a", "b"}))


# -- one sentence per message -----------------------------------------------------------------------------


def test_batch_minus_one_says_it_once():
    with pytest.raises(ValueError) as info:
        W([1]).batch(-1)
    assert str(info.value) == "Batcher(batch_size=-1): Batch size is required to be larger than 0!"


def test_len_of_a_nested_pipe_says_it_once():
    pipe = W(range(5)).filter(bool).map(abs).batch(2).shuffle()
    with pytest.raises(TypeError) as info:
        len(pipe)
    message = str(info.value)
    assert message == ("Shuffler(10000): datapipe has no len() (Filter(bool): how many items pass the filter is known "
                       "only after iterating), so Shuffler instance doesn't have valid length")
    assert message.count("has no len()") == 1 and "; " not in message


#: messages that once said the same thing twice (our words, then torch's or torchdata's): each in
#: one sentence now
ONCE = {
    "batch(0)": (lambda: W([1]).batch(0), "Batcher(batch_size=0): Batch size is required to be larger than 0!"),
    "shuffle(buffer_size=0)": (lambda: W([1]).shuffle(buffer_size=0),
                               "Shuffler(buffer_size=0): buffer_size should be larger than 0"),
    "groupby(group_size > buffer_size)": (
        lambda: W([1]).groupby(ident, group_size=5, buffer_size=4),
        "Grouper(group_size=5, buffer_size=4): group_size must be > 0 and <= buffer_size"),
    "groupby(guaranteed_group_size=2)": (
        lambda: W([1]).groupby(ident, guaranteed_group_size=2),
        "Grouper(guaranteed_group_size=2, group_size=None): guaranteed_group_size must be > 0 and <= group_size and "
        "group_size must be set"),
    "repeat(1)": (lambda: W([1]).repeat(1), "Repeater: The number of repetition must be > 1, got 1"),
    "Concater()": (lambda: Concater(), "Concater: Expected at least one DataPipe, but got nothing"),
    "SampleMultiplexer({})": (lambda: SampleMultiplexer({}),
                              "SampleMultiplexer: Empty dictionary passed to SampleMultiplexerDataPipe"),
    "SampleMultiplexer weight 0": (lambda: SampleMultiplexer({W([1]): 0}),
                                   "SampleMultiplexer: pipe 0: Expecting a positive and non-zero weight, got 0"),
    "threadpool_map(max_workers=0)": (
        lambda: W([1]).threadpool_map(ident, max_workers=0),
        "ThreadPoolMapper(max_workers=0): 'max_workers' is required to be a positive integer."),
    "add_index of an int": (lambda: list(W([1]).add_index()),
                            "IndexAdder('index'), item 0 (int): We only support adding index to row or batch in dict "
                            "type"),
    "unbatch too deep": (lambda: list(W([[1], 2]).unbatch()),
                         "Unbatcher(1): item 1 is an int, not a list or tuple: unbatch_level 1 exceeds the depth of "
                         "the DataPipe"),
    "Sampler over a source without len": (lambda: Sampler(NoLen()),
                                          "Sampler: datapipe has no len() (NoLen defines no __len__): Sampler class "
                                          "requires input datapipe implemented `__len__`"),
    "len of a Filter": (lambda: len(W([1]).filter(bool)),
                        "Filter(bool) has no len(): how many items pass the filter is known only after iterating"),
    "len of a map over a generator": (lambda: len(W(x for x in [1]).map(abs)),
                                      "Mapper(abs): datapipe has no len() (IterableWrapper: its source, a generator, "
                                      "has no length), so Mapper instance doesn't have valid length"),
    "len of a tar loader": (lambda: len(W([("a", io.BytesIO())]).load_from_tar()),
                            "TarArchiveLoader('r:*'): the number of members is known only after reading (pass "
                            "length=... to set it), so TarArchiveLoader instance doesn't have valid length"),
}


@pytest.mark.parametrize("case", sorted(ONCE))
def test_each_message_says_it_once(case):
    call, message = ONCE[case]
    with pytest.raises(Exception) as info:  # noqa: PT011 - the types are checked by the tests above
        call()
    assert str(info.value) == message
    assert message.count("has no len()") <= 1 and message.count("doesn't have valid length") <= 1
