"""The laws of pipe composition (docs/architecture.rst, "Laws"), checked on random sources and parameters.

The concurrent and resume laws live with their features (tests/properties/test_concurrency_laws.py).
"""

import itertools
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from datapipes.iter import IterableWrapper
from datapipes.testing import check_datapipe, items_equal

ints = st.lists(st.integers(-1000, 1000), max_size=60)
small_fns = st.sampled_from([lambda x: x + 1, lambda x: x * 2, lambda x: -x, lambda x: x % 7, abs])


@given(ints, st.integers(1, 10), st.booleans())
def test_batch_then_unbatch_is_identity(data, n, drop_last):
    pipe = IterableWrapper(data).batch(n, drop_last=drop_last).unbatch()
    kept = len(data) - len(data) % n if drop_last else len(data)
    assert list(pipe) == data[:kept]


@given(ints, small_fns, small_fns)
def test_map_composes(data, f, g):
    src = IterableWrapper(data)
    assert list(src.map(f).map(g)) == list(src.map(lambda x: g(f(x))))


@given(ints, st.integers(1, 100), st.integers(0, 2**32))
def test_shuffle_is_a_reproducible_permutation(data, buffer_size, seed):
    pipe = IterableWrapper(data).shuffle(buffer_size=buffer_size).set_seed(seed)
    a = list(pipe)
    assert Counter(a) == Counter(data)
    assert list(pipe) == a
    assert list(IterableWrapper(data).shuffle(buffer_size=buffer_size).set_seed(seed)) == a


@given(ints, st.integers(1, 6))
def test_sharding_partitions_the_input(data, k):
    shards = []
    for i in range(k):
        pipe = IterableWrapper(data).sharding_filter()
        pipe.apply_sharding(k, i)
        shard = list(pipe)
        assert len(pipe) == len(shard)
        shards.append(shard)
    assert sorted(itertools.chain.from_iterable(shards)) == sorted(data)
    assert sum(map(len, shards)) == len(data)


@given(ints, st.integers(0, 80))
def test_header_yields_min_n_len(data, n):
    pipe = IterableWrapper(data).header(n)
    out = list(pipe)
    assert out == data[:n] and len(pipe) == min(n, len(data))


@given(ints, st.integers(1, 4))
def test_fork_children_each_see_everything(data, k):
    children = IterableWrapper(data).fork(k, buffer_size=len(data) + 1)
    if k == 1:  # the source itself, as torch's fork(1)
        children = [children]
    for child in children:  # one after another: the buffer holds the whole input
        assert list(child) == data


@given(st.lists(ints, min_size=1, max_size=4))
def test_concat_and_zip_match_itertools(parts):
    pipes = [IterableWrapper(p) for p in parts]
    concat = pipes[0].concat(*pipes[1:])
    assert list(concat) == list(itertools.chain(*parts)) and len(concat) == sum(map(len, parts))
    zipped = pipes[0].zip(*pipes[1:])
    assert list(zipped) == list(zip(*parts)) and len(zipped) == min(map(len, parts))


# -- random chains: len agrees with what is yielded wherever it is defined ----------------------

OPS = {
    "map": lambda p, k: p.map(lambda x: (x, k) if not isinstance(x, list) else x),
    "filter": lambda p, k: p.filter(lambda x: hash(repr(x)) % (k + 2) != 0),
    "batch": lambda p, k: p.batch(k + 1),
    "batch_drop": lambda p, k: p.batch(k + 1, drop_last=True),
    "shuffle": lambda p, k: p.shuffle(buffer_size=k + 1).set_seed(k),
    "header": lambda p, k: p.header(k * 3),
    "enumerate": lambda p, k: p.enumerate(),
    "cycle": lambda p, k: p.cycle(k % 3),
    "concat": lambda p, k: p.concat(IterableWrapper(range(k))),
    "flatmap": lambda p, k: p.flatmap(lambda x: [x] * (k % 3)),
}


@given(ints, st.lists(st.tuples(st.sampled_from(sorted(OPS)), st.integers(0, 5)), max_size=5))
def test_len_equals_count_wherever_defined(data, chain):
    pipe = IterableWrapper(data)
    for name, k in chain:
        pipe = OPS[name](pipe, k)
    out = check_datapipe(pipe, check_close=False)  # checks len == count, re-iteration, pickling
    assert isinstance(out, list)


@given(ints, st.integers(1, 4))
def test_demux_partitions(data, k):
    children = IterableWrapper(data).demux(k, lambda x: x % k, buffer_size=len(data) + 1)
    got = [list(c) for c in children]
    for i, part in enumerate(got):
        assert all(x % k == i for x in part)
        assert items_equal(part, [x for x in data if x % k == i])
