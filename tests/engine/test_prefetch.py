"""Prefetcher [prefetch]."""

import gc
import threading
import time

import pytest

from datapipes.iter import IterableWrapper, Prefetcher
from datapipes.testing import check_datapipe

from engine_helpers import CountingSource


@pytest.mark.usefixtures("no_thread_leak")
class TestPrefetcher:
    def test_contract(self):
        check_datapipe(IterableWrapper(range(30)).map(lambda x: x + 1).prefetch(3), expected=list(range(1, 31)),
                       build=lambda src: src.prefetch(2))

    def test_len_empty_repr(self):
        pipe = IterableWrapper(range(7)).prefetch()
        assert len(pipe) == 7 and pipe.buffer_size == 10 and repr(pipe) == "IterableWrapper -> Prefetcher(10)"
        check_datapipe(IterableWrapper([]).prefetch(1), expected=[])
        assert list(Prefetcher(source_datapipe=IterableWrapper([None, 1]), buffer_size=1)) == [None, 1]

    def test_upstream_runs_on_a_background_thread(self):
        names = list(IterableWrapper(range(3)).map(lambda x: threading.current_thread().name).prefetch(2))
        assert all("Prefetcher(2) producer" in n for n in names)

    @pytest.mark.parametrize("buffer_size", [1, 4])
    def test_bounded_pulls_and_backpressure(self, buffer_size):
        src = CountingSource()
        it = iter(IterableWrapper(src).prefetch(buffer_size))
        for consumed in range(1, 1001):
            next(it)
            assert consumed <= src.pulled <= consumed + buffer_size
        time.sleep(0.02)
        assert src.pulled <= 1000 + buffer_size
        it.close()

    def test_overlaps_stages(self):
        # The stages upstream of prefetch run while the consumer works on an item: a map upstream
        # reaches item 2 while the consumer still holds item 0 (a serial pipe would deadlock here,
        # hence the timeout instead of a timing threshold).
        reached = threading.Event()
        thread_names = []

        def note(x):
            thread_names.append(threading.current_thread().name)
            if x == 2:
                reached.set()
            return x

        it = iter(IterableWrapper(range(20)).map(note).prefetch(4))
        assert next(it) == 0
        assert reached.wait(10), "the prefetch thread did not run ahead of the consumer"
        assert threading.current_thread().name not in thread_names
        assert list(it) == list(range(1, 20))

    def test_errors_pass_through_as_same_object(self):
        err = ValueError("upstream")

        def gen():
            yield 1
            raise err

        got = []
        with pytest.raises(ValueError) as info:
            for x in IterableWrapper(gen()).prefetch(4):
                got.append(x)
        assert info.value is err and got == [1]

    def test_keyboard_interrupt_from_source(self):
        def gen():
            yield 1
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            list(IterableWrapper(gen()).prefetch(2))

    def test_early_break_delete_and_consumer_error(self):
        for _ in IterableWrapper(CountingSource()).prefetch(3):
            break
        it = iter(IterableWrapper(CountingSource()).map(lambda x: x, concurrency=3).prefetch(3))
        next(it)
        del it
        gc.collect()
        with pytest.raises(ZeroDivisionError):
            for x in IterableWrapper(CountingSource()).prefetch(3):
                if x == 5:
                    1 / 0

    def test_close_closes_upstream_generator_on_its_thread(self):
        closed = []

        class Src:
            def __iter__(self):
                try:
                    yield from range(100)
                finally:
                    closed.append(threading.current_thread().name)

        it = iter(IterableWrapper(Src()).prefetch(2))
        next(it)
        it.close()
        assert closed and "producer" in closed[0]

    def test_stats(self):
        pipe = IterableWrapper(range(20)).prefetch(4)
        list(pipe)
        assert pipe.stats.kind == "prefetch" and pipe.stats.items_out == 20 and pipe.stats.capacity == 4

    @pytest.mark.parametrize(
        "kwargs, err, match",
        [
            ({"buffer_size": 0}, ValueError, r"^Prefetcher\(buffer_size=0\): 'buffer_size' is required to be a positive integer\.$"),
            ({"buffer_size": 1.5}, TypeError, "Prefetcher: buffer_size must be an int, got float"),
        ],
    )
    def test_bad_arguments(self, kwargs, err, match):
        with pytest.raises(err, match=match):
            Prefetcher(IterableWrapper([]), **kwargs)
        with pytest.raises(TypeError, match="Prefetcher: source_datapipe must be an IterDataPipe, got list"):
            Prefetcher([1])
