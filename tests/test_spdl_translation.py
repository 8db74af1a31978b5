"""SPDL's spelling translated into the loader's torch spelling (datapipes.loader.spdl_spelling.from_spdl):
what each SPDL keyword becomes, and that datapipes.DataLoader and datapipes.spdl.DataLoader build the
same pipe from the same arguments through it."""

import pytest
import torch

import datapipes
import datapipes.spdl
from datapipes.graph import traverse
from datapipes.iter import IterableWrapper
from datapipes.iter import Batcher
from datapipes.loader import DataLoader
from datapipes.loader.spdl_spelling import from_spdl


def stages(pipe):
    """The pipe's stages, source first."""
    return list(reversed(list(traverse(pipe))))


def twice(x):
    yield x
    yield x


SHARED = {"batch_size": None, "seed": None, "even_batches": None, "timeout": None, "report_stats_interval": None,
          "max_threads": None, "max_memory": None}


class TestEachKeyword:
    def test_defaults(self):
        t = from_spdl(range(3))
        assert repr(t.pipe) == "IterableWrapper" and t.source is t.pipe
        assert t.torch == {**SHARED, "buffer": 3}
        assert (t.batch_size, t.drop_last, t.buffer_size, t.num_threads, t.output_order) == (None, False, 3, 8, "input")

    def test_src_is_the_data(self):
        data = IterableWrapper(range(3))
        assert from_spdl(src=data).pipe is data is from_spdl(data).source

    def test_preprocessor_is_a_concurrent_map(self):
        source, mapper = stages(from_spdl(range(3), preprocessor=abs, num_threads=4).pipe)
        assert (mapper.fn, mapper.concurrency, mapper.ordered) == (abs, 4, True)
        assert stages(from_spdl(range(3), preprocessor=abs, num_threads=1).pipe)[1].concurrency == 1

    def test_generator_preprocessor_is_a_flatmap(self):
        streamed = from_spdl(range(3), preprocessor=twice, num_threads=1).pipe
        assert repr(streamed) == "IterableWrapper -> FlatMapper(twice)"
        gathered = from_spdl(range(3), preprocessor=twice).pipe  # each item's outputs listed on a thread
        assert repr(gathered) == "IterableWrapper -> Mapper(twice) -> FlatMapper(None)"
        assert list(DataLoader(range(3), preprocessor=twice)) == [0, 0, 1, 1, 2, 2]

    def test_batch_size_and_drop_last_are_a_batch_stage_not_collated(self):
        t = from_spdl(range(7), batch_size=3, drop_last=True)
        batcher = stages(t.pipe)[-1]
        assert isinstance(batcher, Batcher) and (batcher.batch_size, batcher.drop_last) == (3, True)
        assert t.torch["batch_size"] is None and "drop_last" not in t.torch and "collate_fn" not in t.torch
        assert (t.batch_size, t.drop_last) == (3, True)

    def test_aggregator_and_transfer_fn_are_maps_after_the_batches(self):
        t = from_spdl(range(7), batch_size=2, aggregator=sum, transfer_fn=str, num_threads=3)
        *_, batcher, aggregate, transfer = stages(t.pipe)
        assert isinstance(batcher, Batcher)
        assert (aggregate.fn, aggregate.concurrency) == (sum, 3)
        assert (transfer.fn, transfer.concurrency) == (str, 1)  # one transfer at a time

    def test_output_order_is_whether_the_stages_keep_the_input_order(self):
        t = from_spdl(range(7), preprocessor=abs, batch_size=2, aggregator=sum, output_order="completion")
        assert [s.ordered for s in stages(t.pipe) if hasattr(s, "ordered")] == [False, False]
        assert t.output_order == "completion"

    def test_buffer_size_is_the_final_buffer(self):
        assert from_spdl(range(3), buffer_size=5).torch["buffer"] == 5

    @pytest.mark.parametrize("timeout, seconds", [(None, None), (0, None), (2, 2.0)])
    def test_timeout(self, timeout, seconds):
        assert from_spdl(range(3), timeout=timeout).torch["timeout"] == seconds

    def test_shared_keywords_pass_through(self):
        given = {"seed": 3, "even_batches": "pad", "report_stats_interval": 10.0, "max_threads": 4, "max_memory": 2**30}
        assert from_spdl(range(3), **given).torch == {**SHARED, **given, "buffer": 3}

    def test_errors_are_the_loaders(self):
        for kwargs, match in [({"buffer_size": 0}, "DataLoader: buffer_size must be >= 1, got 0"),
                              ({"output_order": "random"}, "DataLoader: output_order must be 'input' or 'completion'"),
                              ({"src": [1]}, "DataLoader: give the data once, as pipe or as src, not both")]:
            with pytest.raises((TypeError, ValueError), match=match):
                from_spdl([0], **kwargs)


SPDL_CALLS = [
    {"buffer_size": 3},
    {"batch_size": 3, "buffer_size": 2},
    {"batch_size": 3, "drop_last": True, "num_threads": 2},
    {"batch_size": 2, "timeout": 5, "output_order": "input"},
]


class TestBothEntryPoints:
    @pytest.mark.parametrize("kwargs", SPDL_CALLS)
    def test_same_pipe_for_the_same_arguments(self, kwargs):
        # datapipes.spdl.DataLoader adds SPDL's failure handling around stage functions only: without
        # them, the two entry points build the same pipe
        ours = DataLoader(range(10), **kwargs)
        spdl = datapipes.spdl.DataLoader(range(10), **{"output_order": "input", **kwargs})
        assert repr(ours.pipe) == repr(spdl.pipe)
        assert list(ours) == list(spdl)

    def test_same_pipe_over_spdl_stages(self):
        spdl = datapipes.spdl.DataLoader(range(10), preprocessor=abs, batch_size=3, aggregator=sum, buffer_size=2,
                                         num_threads=2, timeout=5)
        ours = DataLoader(src=spdl.datapipe, buffer_size=2, num_threads=2, timeout=5, output_order="completion")
        assert repr(ours.pipe) == repr(spdl.pipe)
        assert (spdl.buffer_size, spdl.num_threads, spdl.output_order) == (2, 2, "completion")

    def test_the_translation_is_the_torch_spelling_plus_the_buffer(self):
        kwargs = {"preprocessor": abs, "batch_size": 3, "aggregator": sum, "seed": 1}
        spdl_spelling = DataLoader(range(10), **kwargs)
        t = from_spdl(range(10), **kwargs)
        torch_spelling = DataLoader(t.pipe, **{k: v for k, v in t.torch.items() if k != "buffer"})
        assert repr(spdl_spelling.pipe) == f"{torch_spelling.pipe!r} -> Prefetcher(3)"
        assert list(spdl_spelling) == list(torch_spelling) == [3, 12, 21, 9]
        assert spdl_spelling.spdl and not torch_spelling.spdl
        assert repr(spdl_spelling.datapipe) == "IterableWrapper"  # what it reads, as SPDL's src

    def test_same_state_and_resume(self):
        def states(loader):
            torch.manual_seed(0)  # the seed each draws at its first pass
            it = iter(loader)
            head = [next(it), next(it)]
            return head, loader.state_dict()

        ours = states(DataLoader(range(10), batch_size=3, buffer_size=2))
        spdl = states(datapipes.spdl.DataLoader(range(10), batch_size=3, buffer_size=2, output_order="input"))
        assert ours == spdl
        resumed = datapipes.spdl.DataLoader(range(10), batch_size=3, buffer_size=2, output_order="input")
        resumed.load_state_dict(ours[1])
        assert list(resumed) == [[6, 7, 8], [9]]
