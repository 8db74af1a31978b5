"""datapipes.spdl: SPDL 0.8's PipelineBuilder, Pipeline and DataLoader on the datapipes engine.

SPDL is not installed in the test environment: every expected value below was computed once by
running the same code with ``spdl`` 0.8.0 (``from spdl.pipeline import PipelineBuilder``,
``from spdl.dataloader import DataLoader``) and is written out literally. Completion order is
compared as a multiset (sorted), input order as a list. Where datapipes.spdl deliberately differs
(documented in the module), the test says so.
"""

import asyncio
import gc
import logging
import pickle
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pytest

import datapipes
from datapipes.spdl import Aggregator, DataLoader, Pipeline, PipelineBuilder, PipelineFailure
from datapipes.testing import check_datapipe, check_resume, threads_started_since

WAIT = 10  # seconds: the bound of every blocking read


def run(pipeline, timeout=WAIT):
    with pipeline.auto_stop():
        return list(pipeline.get_iterator(timeout=timeout))


def build(source, *steps, sink=3, **kwargs):
    """PipelineBuilder().add_source(source), then each (method, args, kwargs) step, a sink, build()."""
    builder = PipelineBuilder().add_source(source)
    for name, args, kw in steps:
        getattr(builder, name)(*args, **kw)
    kwargs.setdefault("num_threads", 1)
    return builder.add_sink(sink).build(**kwargs)


def jitter(x):
    """Identity after a random sleep: completion order differs from input order on purpose."""
    time.sleep(random.random() * 0.003)
    return x


def fail_odd(x):
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


def pieces(x):
    yield x
    yield -x


class Sum3(Aggregator):
    """Sums of three items (the last sum may hold fewer)."""

    def __init__(self):
        self.buffer = []

    def accumulate(self, item):
        self.buffer.append(item)
        if len(self.buffer) == 3:
            total, self.buffer = sum(self.buffer), []
            return total
        return None

    def flush(self):
        return sum(self.buffer) if self.buffer else None


class Gate:
    """A source that yields ``first``, then waits for ``release`` before yielding ``second``."""

    def __init__(self, first, second):
        self.first, self.second = first, second
        self.release = threading.Event()

    def __iter__(self):
        yield self.first
        assert self.release.wait(WAIT)
        yield self.second


# -- SPDL's documented examples ---------------------------------------------------------------------


class TestDocumentedExamples:
    def test_introduction(self):
        # SPDL's "Building and Running Pipeline" page
        pipeline = (
            PipelineBuilder()
            .add_source(range(12))
            .pipe(lambda x: 2 * x)
            .pipe(lambda x: x + 1)
            .aggregate(3)
            .add_sink(3)
            .build(num_threads=1)
        )
        pipeline.start()
        assert list(pipeline) == [[1, 3, 5], [7, 9, 11], [13, 15, 17], [19, 21, 23]]
        pipeline.stop()

    def test_collate_and_aggregate(self):
        # spdl.pipeline.defs.Collate and Aggregate docstrings
        assert run(build(range(10), ("aggregate", (3,), {}))) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
        assert run(build(range(10), ("aggregate", (3,), {"drop_last": True}))) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
        batch = run(build(range(4), ("aggregate", (2,), {})))[0]
        assert type(batch) is list  # SPDL's Collate gives plain lists

    def test_custom_aggregator(self):
        # spdl.pipeline.defs.Aggregator docstring: SizeBasedAggregator
        class SizeBasedAggregator(Aggregator):
            def __init__(self, threshold=10):
                self.threshold, self.buffer, self.size = threshold, [], 0

            def accumulate(self, item):
                self.buffer.append(item)
                self.size += len(item)
                if self.size >= self.threshold:
                    result = "".join(self.buffer)
                    self.buffer, self.size = [], 0
                    return result
                return None

            def flush(self):
                if self.buffer:
                    result = "".join(self.buffer)
                    self.buffer, self.size = [], 0
                    return result
                return None

        words = ["a", "bb", "ccc", "dddd", "e", "ff"]
        assert run(build(words, ("aggregate", (SizeBasedAggregator(threshold=10),), {}))) == ["abbcccdddd", "eff"]
        dropped = build(words, ("aggregate", (SizeBasedAggregator(threshold=10),), {"drop_last": True}))
        assert run(dropped) == ["abbcccdddd"]

    def test_concurrency_page(self):
        # SPDL's "Concurrency" page: download (async, concurrency 4) then preprocess (2 threads)
        async def download(x):
            await asyncio.sleep(random.random() * 0.003)
            return x * 10

        pipeline = (
            PipelineBuilder()
            .add_source(range(20))
            .pipe(download, concurrency=4)
            .pipe(jitter, concurrency=2)
            .add_sink(3)
            .build(num_threads=2)
        )
        assert sorted(run(pipeline)) == [x * 10 for x in range(20)]

    def test_dataloader_docstring_shape(self):
        # spdl.dataloader.DataLoader's example, with plain Python in place of spdl.io
        loader = DataLoader(
            src=range(10),
            preprocessor=lambda x: x * 2,
            batch_size=3,
            aggregator=lambda batch: sum(batch),
            transfer_fn=lambda total: -total,
            output_order="input",
        )
        assert list(loader) == [-6, -24, -42, -18]


# -- stages -------------------------------------------------------------------------------------


class TestStages:
    async_inputs = list(range(10))

    def test_sync_function_completion_and_input_order(self):
        completion = build(range(30), ("pipe", (jitter,), {"concurrency": 8}), num_threads=8)
        assert sorted(run(completion)) == list(range(30))
        ordered = build(range(30), ("pipe", (jitter,), {"concurrency": 8, "output_order": "input"}), num_threads=8)
        assert run(ordered) == list(range(30))

    def test_async_function(self):
        async def afn(x):
            await asyncio.sleep(0.001 * (5 - x % 5))
            return x * 10

        expected = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90]  # spdl: sorted(completion) and input order
        assert sorted(run(build(range(10), ("pipe", (afn,), {"concurrency": 5})))) == expected
        assert run(build(range(10), ("pipe", (afn,), {"concurrency": 5, "output_order": "input"}))) == expected

    def test_generator_functions(self):
        def sgen(x):
            for i in range(x):
                yield (x, i)

        async def agen(x):
            for i in range(x):
                await asyncio.sleep(0)
                yield (x, i)

        four = [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]  # spdl, range(4), concurrency 1
        five = four + [(4, 0), (4, 1), (4, 2), (4, 3)]  # spdl, range(5), concurrency 3, sorted
        assert run(build(range(4), ("pipe", (sgen,), {}))) == four
        assert run(build(range(4), ("pipe", (agen,), {}))) == four
        assert sorted(run(build(range(5), ("pipe", (sgen,), {"concurrency": 3}), num_threads=3))) == five
        assert sorted(run(build(range(5), ("pipe", (agen,), {"concurrency": 3})))) == five
        # SPDL 0.8 fails every call of a sync generator in an input-ordered stage (it yields
        # nothing); here the items come in input order.
        ordered = build(range(5), ("pipe", (sgen,), {"concurrency": 3, "output_order": "input"}), num_threads=3)
        assert run(ordered) == five
        with pytest.raises(ValueError, match="async generator function when `output_order` is 'input'"):
            PipelineBuilder().add_source(range(4)).pipe(agen, output_order="input")

    @pytest.mark.parametrize("concurrency", [1, 3])
    def test_generator_failing_midway_keeps_its_items_before(self, concurrency):
        def gen_fail(x):
            yield x
            if x == 1:
                raise ValueError("gen")
            yield x + 100

        async def agen_fail(x):
            yield x
            if x == 1:
                raise ValueError("agen")
            yield x + 100

        for op in (gen_fail, agen_fail):
            pipeline = build(range(3), ("pipe", (op,), {"concurrency": concurrency}), num_threads=3)
            assert sorted(run(pipeline)) == [0, 1, 2, 100, 102]  # spdl: the same

    def test_containers(self):
        assert run(build(["a", "b"], ("pipe", ({"a": 1, "b": 2},), {}))) == [1, 2]
        assert run(build([2, 0], ("pipe", (["x", "y", "z"],), {}))) == ["z", "x"]

    def test_async_source(self):
        async def source():
            for i in range(4):
                await asyncio.sleep(0)
                yield i

        assert run(build(source(), ("pipe", (lambda x: x + 1,), {}))) == [1, 2, 3, 4]

    def test_disaggregate(self):
        steps = ("aggregate", (3,), {}), ("disaggregate", (), {})
        assert run(build(range(10), *steps)) == list(range(10))

    def test_none_results_are_dropped(self):
        # spdl: a pipe stage passes no None on; a source, an aggregate keep them; disaggregate drops them
        def gen_none(x):
            yield x
            yield None

        assert run(build(range(6), ("pipe", (lambda x: None if x % 2 else x,), {}))) == [0, 2, 4]
        assert run(build([1, None, 2])) == [1, None, 2]
        assert run(build([1, None, 2], ("pipe", (lambda x: x,), {}))) == [1, 2]
        assert run(build([[1, None, 2], [3]], ("disaggregate", (), {}))) == [1, 2, 3]
        assert run(build([1, None, 2, 3], ("aggregate", (2,), {}))) == [[1, None], [2, 3]]
        assert run(build(range(3), ("pipe", (gen_none,), {}))) == [0, 1, 2]

    def test_executor(self):
        with ThreadPoolExecutor(2) as pool:
            pipeline = build(range(10), ("pipe", (jitter,), {"executor": pool, "concurrency": 2}))
            assert sorted(run(pipeline)) == list(range(10))

    def test_name_names_the_stage(self):
        pipeline = build(range(3), ("pipe", (fail_odd,), {"concurrency": 2, "name": "myop"}), ("aggregate", (2,), {}))
        assert repr(pipeline.pipe) == "IterableWrapper -> Mapper(myop) -> Filter(not_none) -> Batcher(2) -> Prefetcher(3)"

    def test_continuous_source_gives_one_epoch_per_iterator(self):
        pipeline = (
            PipelineBuilder()
            .add_source([1, 2, 3], continuous=True)
            .pipe(lambda x: x * 10)
            .aggregate(2)
            .add_sink(3)
            .build(num_threads=1)
        )
        with pipeline.auto_stop():
            epochs = [list(pipeline.get_iterator(timeout=WAIT)) for _ in range(2)] + [list(pipeline)]
        assert epochs == [[[10, 20], [30]]] * 3  # spdl: the same


# -- failures -------------------------------------------------------------------------------------


class TestFailures:
    def test_failures_are_logged_and_the_items_dropped(self, caplog):
        caplog.set_level(logging.ERROR, logger="datapipes.spdl")
        pipeline = build(range(6), ("pipe", (fail_odd,), {"concurrency": 3}), num_threads=3)
        assert sorted(run(pipeline)) == [0, 2, 4]  # spdl: the same
        records = [r for r in caplog.records if r.name == "datapipes.spdl"]
        assert len(records) == 3
        assert all(r.levelno == logging.ERROR and r.getMessage() == "Task [1:fail_odd] failed." for r in records)
        assert sorted(str(r.exc_info[1]) for r in records) == ["odd 1", "odd 3", "odd 5"]
        # the pipe logs them as well once pickled (sent to a worker process, say)
        caplog.clear()
        assert sorted(pickle.loads(pickle.dumps(pipeline.pipe))) == [0, 2, 4]
        assert [r.getMessage() for r in caplog.records if r.name == "datapipes.spdl"] == ["Task [1:fail_odd] failed."] * 3

    @pytest.mark.parametrize(("where", "limit", "failed"), [("build", 2, 3), ("build", 0, 1), ("stage", 1, 2)])
    def test_max_failures_exceeded(self, where, limit, failed, caplog):
        step_kw = {"max_failures": limit} if where == "stage" else {}
        build_kw = {"max_failures": limit} if where == "build" else {}
        pipeline = build(range(10), ("pipe", (fail_odd,), step_kw), sink=1, **build_kw)
        got = []
        with pytest.raises(PipelineFailure) as info:
            with pipeline.auto_stop():
                for x in pipeline.get_iterator(timeout=WAIT):
                    got.append(x)
        # spdl: PipelineFailure('pipeline stages failed', [RuntimeError('The pipeline stage (...)
        # failed 3 times, which exceeds the threshold (2).')]) after the items before the failure
        assert got == [0, 2, 4, 6, 8][:failed]
        assert info.value.message == "pipeline stages failed"
        (error,) = info.value.exceptions
        assert type(error) is RuntimeError
        assert str(error) == (f"The pipeline stage (Mapper(fail_odd)) failed {failed} times, which exceeds the "
                              f"threshold ({limit}).")
        assert [str(e) for e in error.__cause__.exceptions] == [f"odd {2 * i + 1}" for i in range(failed)]

    def test_within_the_budget_nothing_raises(self):
        assert sorted(run(build(range(6), ("pipe", (fail_odd,), {}), max_failures=3))) == [0, 2, 4]

    def test_stage_budget_overrides_builds(self):
        pipeline = build(range(6), ("pipe", (fail_odd,), {"max_failures": -1}), max_failures=0)
        assert run(pipeline) == [0, 2, 4]

    def test_failure_rates_are_refused(self):
        with pytest.raises(TypeError, match="Fraction"):
            PipelineBuilder().add_source(range(3)).pipe(abs, max_failures=Fraction(1, 10))
        with pytest.raises(TypeError, match="Fraction"):
            PipelineBuilder().add_source(range(3)).add_sink(3).build(num_threads=1, max_failures=Fraction(1, 10))

    def test_source_failure(self):
        def source():
            yield 1
            yield 2
            raise KeyError("src")

        pipeline = build(source())
        got = []
        with pytest.raises(PipelineFailure) as info:
            for x in pipeline.get_iterator(timeout=WAIT):
                got.append(x)
        assert got == [1, 2]  # spdl: the same, then PipelineFailure([KeyError('src')])
        (error,) = info.value.exceptions
        assert type(error) is KeyError and error.args == ("src",)
        with pytest.raises(PipelineFailure) as again:  # every later read raises it again
            pipeline.get_item(timeout=WAIT)
        assert again.value is info.value
        pipeline.stop()

    def test_stop_raises_a_failure_no_read_has_seen(self):
        def source():
            raise KeyError("at once")
            yield

        pipeline = build(source())
        with pytest.raises(PipelineFailure) as info:  # spdl: the same
            with pipeline.auto_stop():
                deadline = time.monotonic() + WAIT
                while not pipeline._pass.results.qsize() and time.monotonic() < deadline:
                    time.sleep(0.01)  # the read-ahead of start() meets the failure
        assert type(info.value.exceptions[0]) is KeyError
        pipeline.stop()  # once only
        with pytest.raises(PipelineFailure):
            pipeline.get_item(timeout=WAIT)

    def test_aggregator_failure_ends_the_pass(self):
        class Broken(Aggregator):
            def accumulate(self, item):
                if item == 2:
                    raise ZeroDivisionError("agg")
                return item

            def flush(self):
                return None

        got = []
        with pytest.raises(PipelineFailure) as info:
            for x in build(range(5), ("aggregate", (Broken(),), {})):
                got.append(x)
        assert got == [0, 1]
        assert type(info.value.exceptions[0]) is ZeroDivisionError

    def test_pipeline_failure_is_an_exception_group(self):
        failure = PipelineFailure("pipeline stages failed", [KeyError("a"), ValueError("b")])
        assert isinstance(failure, ExceptionGroup)
        keys, rest = failure.split(KeyError)
        assert type(keys) is PipelineFailure and type(rest) is PipelineFailure
        with pytest.raises(ExceptionGroup):
            try:
                raise failure
            except* KeyError:
                pass


# -- the pipeline's lifecycle ------------------------------------------------------------------------


class TestLifecycle:
    def test_runs_once(self):
        pipeline = build(range(3))
        pipeline.start()
        with pytest.raises(RuntimeError, match="^The pipeline was already started.$"):
            pipeline.start()
        assert list(pipeline) == [0, 1, 2]
        assert list(pipeline.get_iterator()) == []
        with pytest.raises(EOFError, match="^Reached the end of the pipeline.$"):
            pipeline.get_item(timeout=1)
        pipeline.stop()
        with pytest.raises(EOFError, match="^Reached the end of the pipeline.$"):
            pipeline.get_item(timeout=1)
        pipeline.stop()  # idempotent
        with pytest.raises(RuntimeError, match="already started"):
            pipeline.start()

    def test_starts_on_first_read(self):
        assert list(build(range(3))) == [0, 1, 2]
        assert build(range(3)).get_item(timeout=WAIT) == 0

    def test_stop_before_start_leaves_it_usable(self):
        pipeline = build(range(3))
        pipeline.stop()  # spdl: a no-op
        assert list(pipeline) == [0, 1, 2]

    def test_timeout_on_a_stalled_source(self):
        gate = Gate("first", "second")
        pipeline = build(gate)
        with pipeline.auto_stop(timeout=WAIT):
            it = pipeline.get_iterator(timeout=0.2)
            assert next(it) == "first"
            with pytest.raises(TimeoutError) as info:
                next(it)
            assert type(info.value) is TimeoutError
            assert str(info.value) == "The next item is not available after 0.2 sec."  # spdl's message
            gate.release.set()
            assert next(it) == "second"  # the pipeline and the iterator go on
            assert list(it) == []

    def test_timed_and_untimed_reads_mix(self):
        pipeline = build(range(50), ("pipe", (jitter,), {"concurrency": 4}), num_threads=4)
        got = []
        with pipeline.auto_stop():
            for i in range(50):
                got.append(pipeline.get_item(timeout=WAIT if i % 3 else None))
            with pytest.raises(EOFError):
                pipeline.get_item(timeout=WAIT)
        assert sorted(got) == list(range(50))

    def test_break_and_stop_leave_no_thread(self):
        before = set(threading.enumerate())
        pipeline = build(range(10_000), ("pipe", (jitter,), {"concurrency": 4}), num_threads=4)
        with pipeline.auto_stop():
            for i, _ in enumerate(pipeline.get_iterator(timeout=WAIT)):
                if i == 5:
                    break
        assert threads_started_since(before, timeout=5) == []

    def test_untimed_break_leaves_no_thread(self):
        before = set(threading.enumerate())
        pipeline = build(range(10_000), ("pipe", (jitter,), {"concurrency": 4}), num_threads=4)
        for i, _ in enumerate(pipeline):
            if i == 5:
                break
        pipeline.stop()
        assert threads_started_since(before, timeout=5) == []

    def test_dropped_pipeline_stops_its_threads(self):
        before = set(threading.enumerate())
        pipeline = build(range(10_000), ("pipe", (jitter,), {"concurrency": 4}), num_threads=4)
        pipeline.start()
        assert pipeline.get_item(timeout=WAIT) is not None
        del pipeline
        gc.collect()
        assert threads_started_since(before, timeout=5) == []

    def test_stop_with_a_stalled_source_returns(self, no_thread_leak):
        gate = Gate(1, 2)
        pipeline = build(gate)
        pipeline.start()
        assert pipeline.get_item(timeout=WAIT) == 1
        with pytest.raises(TimeoutError):
            pipeline.get_item(timeout=0.05)
        pipeline.stop(timeout=0.05)  # the reader waits in the stalled source: abandoned
        gate.release.set()  # it then closes the pass (no_thread_leak waits for it)


# -- building -------------------------------------------------------------------------------------


class TestBuildErrors:
    # spdl raises the same exception types (its messages are kept where we name the argument)
    @pytest.mark.parametrize(
        ("make", "error", "match"),
        [
            (lambda: PipelineBuilder().add_source(range(3)).add_sink(0), ValueError, "greater than 0. Found: 0"),
            (lambda: PipelineBuilder().add_source(range(3)).add_sink(1).add_sink(1), ValueError, "Sink is already set."),
            (lambda: PipelineBuilder().add_source(range(3)).add_source(range(3)), ValueError, "Source already set."),
            (lambda: PipelineBuilder().add_source(range(3)).build(num_threads=1), RuntimeError, "Did you call `add_sink`"),
            (lambda: PipelineBuilder().add_sink(3).build(num_threads=1), RuntimeError, "Did you call `add_source`"),
            (lambda: PipelineBuilder().add_source(range(3)).pipe(abs, concurrency=0), ValueError, "must be >= 1"),
            (lambda: PipelineBuilder().add_source(range(3)).pipe(abs, output_order="foo"), ValueError, "Found: foo"),
            (lambda: PipelineBuilder().add_source(range(3)).aggregate("x"), TypeError, "either int or Aggregator"),
            (lambda: PipelineBuilder().add_source(range(3)).add_sink(3).build(), TypeError, "num_threads"),
            (lambda: PipelineBuilder().add_source(3), TypeError, "iterable"),
            (lambda: PipelineBuilder().add_source(range(3)).pipe(3), TypeError, "op must be"),
        ],
    )
    def test_errors(self, make, error, match):
        with pytest.raises(error, match=match):
            make()

    def test_executor_with_an_async_op(self):
        async def afn(x):
            return x

        with ThreadPoolExecutor(1) as pool, pytest.raises(ValueError, match="`executor` cannot be specified"):
            PipelineBuilder().add_source(range(3)).pipe(afn, executor=pool)

    def test_spdl_hook_and_queue_classes_are_refused(self):
        builder = PipelineBuilder().add_source(range(3)).add_sink(3)
        with pytest.raises(TypeError, match="add_hook"):
            builder.build(num_threads=1, task_hook_factory=lambda info: [])
        with pytest.raises(TypeError, match="queue_class"):
            builder.build(num_threads=1, queue_class=object)


# -- an ordinary pipe underneath --------------------------------------------------------------------


class TestThePipe:
    def test_num_threads_is_the_thread_budget(self):
        pipeline = build(range(40), ("pipe", (jitter,), {"concurrency": 8}), ("pipe", (jitter,), {"concurrency": 8}),
                         num_threads=4)
        it = iter(pipeline.pipe)
        assert sorted(it) == list(range(40))
        workers = [stats.workers for stage, stats in it.stats() if stats.kind == "thread"]
        assert workers == [2, 2]

    def test_report_stats_interval(self, caplog):
        caplog.set_level(logging.INFO, logger="datapipes")
        pipeline = build(range(10), ("pipe", (jitter,), {"concurrency": 2}), report_stats_interval=60)
        assert sorted(run(pipeline)) == list(range(10))
        reports = [r.getMessage() for r in caplog.records if "stage statistics" in r.getMessage()]
        assert reports and "Mapper(jitter)" in reports[-1]  # the report at the end of the pass

    def test_profile(self):
        pipeline = build(range(100), ("pipe", (jitter,), {"concurrency": 4}), ("aggregate", (10,), {}), num_threads=4)
        report = datapipes.profile(pipeline.pipe, show=False)
        assert report.items == 10
        assert "Mapper(jitter)" in [row["stage"] for row in report.stages]

    def test_the_pipe_can_be_iterated_again(self):
        pipeline = build(list(range(10)), ("pipe", (jitter,), {"concurrency": 3, "output_order": "input"}),
                         ("aggregate", (4,), {}), num_threads=3)
        assert list(pipeline.pipe) == list(pipeline.pipe) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]

    @pytest.mark.parametrize("order", ["completion", "input"])
    def test_checkpoint_and_resume(self, order):
        pipeline = build(list(range(30)), ("pipe", (jitter,), {"concurrency": 4, "output_order": order}),
                         ("aggregate", (4,), {}), num_threads=4)
        it = iter(pipeline.pipe)
        first = [next(it) for _ in range(3)]
        state = it.state_dict()
        it.close()
        resumed = iter(pipeline.pipe)
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert sorted(sum(first + rest, [])) == list(range(30))  # every item once
        if order == "input":
            assert first + rest == list(pipeline.pipe)

    def test_the_pipe_keeps_the_pipe_contract(self):
        pipeline = build(list(range(12)), ("pipe", (jitter,), {"concurrency": 3}), ("pipe", (pieces,), {"concurrency": 2}),
                         ("aggregate", (4,), {}), ("disaggregate", (), {}), num_threads=3)
        items = check_datapipe(pipeline.pipe, ordered=False)  # passes agree, pickles, closes cleanly
        assert sorted(items) == sorted([x for x in range(12)] + [-x for x in range(12)])

    @pytest.mark.parametrize("order", ["completion", "input"])
    def test_every_resume_point(self, order):
        # in completion order, what an aggregate holds depends on the order: split the lists again
        tail = [("aggregate", (Sum3(),), {})] if order == "input" else [("aggregate", (3,), {}), ("disaggregate", (), {})]

        def make():
            return build(list(range(10)), ("pipe", (jitter,), {"concurrency": 3, "output_order": order}),
                         ("pipe", (pieces,), {"concurrency": 2, "output_order": order}), *tail, num_threads=3).pipe

        check_resume(make, ordered=order == "input")

    def test_torch_dataloader(self):
        import torch.utils.data

        pipeline = build(list(range(8)), ("pipe", (lambda x: x * 2,), {}), ("aggregate", (4,), {}))
        loader = torch.utils.data.DataLoader(pipeline.pipe, batch_size=None)
        assert [list(b) for b in loader] == [[0, 2, 4, 6], [8, 10, 12, 14]]


# -- DataLoader -----------------------------------------------------------------------------------


class TestDataLoader:
    def test_completion_order_by_default(self):
        batches = list(DataLoader(range(10), preprocessor=lambda x: jitter(x * 2), batch_size=3, num_threads=4))
        assert sorted(len(b) for b in batches) == [1, 3, 3, 3]
        assert sorted(sum(batches, [])) == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]  # spdl: the same multiset

    def test_input_order(self):
        loader = DataLoader(range(10), preprocessor=lambda x: jitter(x * 2), batch_size=3, output_order="input")
        assert list(loader) == [[0, 2, 4], [6, 8, 10], [12, 14, 16], [18]]
        loader = DataLoader(range(7), preprocessor=lambda x: x * 10, batch_size=3, aggregator=sum, output_order="input")
        assert list(loader) == [30, 120, 60]

    def test_failures_and_nones_are_dropped(self, caplog):
        caplog.set_level(logging.ERROR, logger="datapipes.spdl")
        assert sorted(DataLoader(range(6), preprocessor=fail_odd, num_threads=2)) == [0, 2, 4]
        assert len([r for r in caplog.records if r.name == "datapipes.spdl"]) == 3
        assert sorted(DataLoader(range(6), preprocessor=lambda x: None if x % 2 else x)) == [0, 2, 4]

        def transfer(batch):
            if batch == [0, 1]:
                raise ValueError("transfer")
            return batch

        assert list(DataLoader(range(6), batch_size=2, transfer_fn=transfer, output_order="input")) == [[2, 3], [4, 5]]
        dropped = DataLoader(range(6), batch_size=2, aggregator=lambda b: None if b[0] == 2 else b, output_order="input")
        assert list(dropped) == [[0, 1], [4, 5]]

    def test_defaults_and_signature(self):
        assert list(DataLoader(range(3))) == [0, 1, 2]
        assert list(DataLoader(range(3), batch_size=0)) == [0, 1, 2]  # spdl: 0 means no grouping
        assert list(DataLoader(range(4), batch_size=2, transfer_fn=tuple, output_order="input")) == [(0, 1), (2, 3)]
        with pytest.raises(TypeError):
            DataLoader(range(3), lambda x: x)  # spdl: keyword-only after src
        loader = DataLoader(range(3))
        assert (loader.buffer_size, loader.num_threads, loader.output_order) == (3, 8, "completion")

    def test_each_iteration_is_an_epoch(self):
        loader = DataLoader(range(4), preprocessor=jitter)
        assert sorted(loader) == sorted(loader) == [0, 1, 2, 3]

    def test_generator_source_iterated_twice(self):
        # spdl yields nothing the second time; here the second pass says why it has nothing
        loader = DataLoader((i for i in range(4)), preprocessor=jitter)
        assert sorted(loader) == [0, 1, 2, 3]
        with pytest.raises(PipelineFailure) as info:
            list(loader)
        assert "one-shot" in str(info.value.exceptions[0])

    def test_timeout(self):
        gate = Gate(0, 1)
        loader = DataLoader(gate, timeout=0.1)
        it = iter(loader)
        assert next(it) == 0
        opener = threading.Timer(0.3, gate.release.set)  # the timed-out pass then closes without waiting long
        opener.start()
        with pytest.raises(TimeoutError):
            next(it)
        opener.join(WAIT)

    def test_source_failure(self):
        def source():
            yield 1
            raise KeyError("src")

        with pytest.raises(PipelineFailure) as info:
            list(DataLoader(source(), output_order="input"))
        assert type(info.value.exceptions[0]) is KeyError

    def test_num_threads_is_the_thread_budget(self):
        loader = DataLoader(range(20), preprocessor=jitter, batch_size=4, aggregator=sum, num_threads=3)
        seen = []

        class Workers(datapipes.hooks.Hook):
            def stage_start(self, stats):
                if stats.kind == "thread":
                    seen.append(stats.workers)

        loader.datapipe.add_hook(Workers())
        assert sorted(loader) == [6, 22, 38, 54, 70]
        assert sum(seen) <= 3 and len(seen) == 2

    def test_checkpoint_and_resume(self):
        def make():
            return DataLoader(list(range(20)), preprocessor=jitter, batch_size=3, num_threads=4)

        loader = make()
        it = iter(loader)
        first = [next(it) for _ in range(2)]
        state = loader.state_dict()
        del it
        resumed = make()
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert sorted(sum(first + rest, [])) == list(range(20))

    def test_stop_mid_iteration_leaves_no_thread(self):
        before = set(threading.enumerate())
        for i, _ in enumerate(DataLoader(range(10_000), preprocessor=jitter, batch_size=2, num_threads=4)):
            if i == 3:
                break
        gc.collect()
        assert threads_started_since(before, timeout=5) == []


def test_public_names():
    import datapipes.spdl as spdl

    assert sorted(spdl.__all__) == ["Aggregator", "DataLoader", "Pipeline", "PipelineBuilder", "PipelineFailure"]
    assert isinstance(build(range(1)), Pipeline)
