"""torchdata's pipes across the modules of datapipes/iter/: their functional names register the classes,
no stage reads before iteration, and graphs with lambdas pickle."""

import pickle

from datapipes import IterDataPipe
from datapipes.iter import (
    BatchMapper,
    Dropper,
    Flattener,
    InBatchShuffler,
    IndexAdder,
    IterableWrapper,
    IterKeyZipper,
    LengthSetter,
    MapBatches,
    MapKeyZipper,
    MaxTokenBucketizer,
    MultiplexerLongest,
    ParagraphAggregator,
    Repeater,
    RoundRobinDemultiplexer,
    Rows2Columnar,
    SampleMultiplexer,
    ShardExpander,
    ShuffledFlatMapper,
    Slicer,
    ThreadPoolMapper,
    UnZipper,
    ZipperLongest,
)
from datapipes.map import SequenceWrapper

W = IterableWrapper


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


def test_pickles_with_lambdas():
    pipes = [
        W(range(3)).zip_with_iter(W(range(3)), key_fn=lambda x: x, merge_fn=lambda a, b: a + b),
        W(range(3)).zip_with_map(SequenceWrapper([5, 6, 7]), key_fn=lambda x: x, merge_fn=lambda a, b: b),
        W(range(3)).map(lambda x: (x, (x,))).flatten().slice([0]).drop(0).set_length(3),
    ]
    for pipe in pipes:
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe)


def test_functional_names_registered():
    from datapipes import IterDataPipe

    names = {"zip_with_iter": IterKeyZipper, "zip_with_map": MapKeyZipper, "unzip": UnZipper,
             "zip_longest": ZipperLongest, "mux_longest": MultiplexerLongest,
             "round_robin_demux": RoundRobinDemultiplexer, "add_index": IndexAdder, "repeat": Repeater,
             "slice": Slicer, "flatten": Flattener, "drop": Dropper, "set_length": LengthSetter}
    for name, cls in names.items():
        assert IterDataPipe._functions[name] is cls
    assert not hasattr(SampleMultiplexer, "_functional_name")
