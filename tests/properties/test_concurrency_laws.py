"""Laws of the concurrency engine (docs/architecture.rst, "Laws"), checked on random inputs and random timing."""

import random
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from datapipes.iter import IterableWrapper
from datapipes.testing import same_multiset, threads_started_since

items = st.lists(st.integers(-1000, 1000), max_size=60)
concurrency = st.integers(1, 8)


def jittered(f):
    def fn(x):
        time.sleep(random.random() * 0.0003)  # shuffle completion order on purpose
        return f(x)

    return fn


def square(x):
    return x * x


class NoThreadLeft:
    def __enter__(self):
        self.before = set(threading.enumerate())

    def __exit__(self, *exc):
        left = threads_started_since(self.before, timeout=5.0)
        assert not left, [t.name for t in left]


@given(items, concurrency)
def test_concurrent_ordered_map_equals_serial_map(xs, c):
    with NoThreadLeft():
        assert list(IterableWrapper(xs).map(jittered(square), concurrency=c)) == [x * x for x in xs]


@given(items, concurrency)
def test_unordered_map_yields_the_same_multiset(xs, c):
    with NoThreadLeft():
        out = list(IterableWrapper(xs).map(jittered(square), concurrency=c, ordered=False))
        assert same_multiset(out, [x * x for x in xs])


@given(items, concurrency, st.booleans())
def test_async_map_equals_serial_map(xs, c, ordered):
    import asyncio

    async def fn(x):
        await asyncio.sleep(random.random() * 0.0003)
        return x * x

    with NoThreadLeft():
        out = list(IterableWrapper(xs).map(fn, concurrency=c, ordered=ordered))
        assert out == [x * x for x in xs] if ordered else same_multiset(out, [x * x for x in xs])


STAGES = [
    ("map", lambda p: p.map(lambda x: x + 1)),
    ("cmap", lambda p: p.map(jittered(lambda x: x * 3), concurrency=3)),
    ("filter", lambda p: p.filter(lambda x: x % 3 != 0)),
    ("flatmap", lambda p: p.flatmap(lambda x: [x, -x])),
]


@given(items, st.lists(st.sampled_from(range(len(STAGES))), min_size=1, max_size=4), st.data())
def test_prefetch_anywhere_leaves_the_output_unchanged(xs, chain, data):
    def build(prefetch_at, buffer_size):
        pipe = IterableWrapper(xs)
        for k, s in enumerate(chain):
            if k == prefetch_at:
                pipe = pipe.prefetch(buffer_size)
            pipe = STAGES[s][1](pipe)
        return pipe.prefetch(buffer_size) if prefetch_at == len(chain) else pipe

    at = data.draw(st.integers(0, len(chain)))
    size = data.draw(st.integers(1, 5))
    with NoThreadLeft():
        assert list(build(at, size)) == list(build(-1, size))


@given(items, concurrency, st.integers(0, 2**32))
def test_same_seed_same_order_with_concurrency(xs, c, seed):
    def build():
        pipe = IterableWrapper(xs).shuffle().map(jittered(square), concurrency=c)
        return pipe.map(lambda x, rng: (x, rng.random()), rng="python", concurrency=c).set_seed(seed)

    with NoThreadLeft():
        first = list(build())
        assert list(build()) == first
        serial = list(IterableWrapper(xs).shuffle().map(square).map(lambda x, rng: (x, rng.random()), rng="python")
                      .set_seed(seed))
        assert first == serial


class Failure(Exception):
    pass


@given(items, concurrency, st.sets(st.integers(0, 59), max_size=5), st.booleans())
def test_fn_raising_at_random_positions(xs, c, bad, ordered):
    def fn(pair):
        k, x = pair
        time.sleep(random.random() * 0.0003)
        if k in bad:
            raise Failure(k)
        return x

    src = list(enumerate(xs))
    with NoThreadLeft():
        pipe = IterableWrapper(src).map(fn, concurrency=c, ordered=ordered, on_error="skip")
        out = list(pipe)
        assert same_multiset(out, [x for k, x in src if k not in bad])
        if ordered:
            assert out == [x for k, x in src if k not in bad]
        assert pipe.failures.count == len(bad & set(range(len(xs))))
        got = []
        try:
            for y in IterableWrapper(src).map(fn, concurrency=c, ordered=ordered):
                got.append(y)
        except Failure as e:
            assert e.args[0] in bad and f"at item {e.args[0]}" in e.__notes__[0]
            if ordered:  # the first failure in output order, after exactly the items before it
                assert e.args[0] == min(bad & set(range(len(xs)))) and got == xs[: e.args[0]]
        else:
            assert not bad & set(range(len(xs))) and (got == xs if ordered else same_multiset(got, xs))


@given(items, concurrency, st.integers(0, 60))
def test_source_raising_at_a_random_position(xs, c, at):
    err = Failure("source")

    class Source:
        def __iter__(self):
            for k, x in enumerate(xs):
                if k == at:
                    raise err
                yield x

    got = []
    with NoThreadLeft():
        try:
            for y in IterableWrapper(Source()).map(jittered(square), concurrency=c):
                got.append(y)
        except Failure as e:
            assert e is err and at < len(xs)
        assert got == [x * x for x in xs[:at]]


@settings(max_examples=5)
@given(st.lists(st.integers(), max_size=40), st.integers(1, 2), st.integers(1, 8), st.booleans())
def test_process_map_equals_serial_map(xs, c, chunksize, ordered):
    out = list(IterableWrapper(xs).map(lambda x: x * 2, concurrency=c, executor="process", chunksize=chunksize,
                                       ordered=ordered))
    assert out == [2 * x for x in xs] if ordered else same_multiset(out, [2 * x for x in xs])
