"""Exception types and message phrases that torch DataPipes users match on: for each case, torch's
own pipe and ours raise (or warn) the same type, and our message holds torch's phrase intact, at its
end (our context, naming the stage, comes first)."""

import warnings

import pytest
import torch.utils.data.datapipes.iter as torch_iter
import torch.utils.data.datapipes.map as torch_map
from torch.utils.data import graph_settings as torch_settings

import datapipes.iter as our_iter
import datapipes.map as our_map
from datapipes import graph_settings


def two(a, b):
    return a + b


def one(a):
    return a


def kw_only(a, *, b):
    return a


def phrase(theirs):
    """torch's message with its class names spelled as ours (``FilterIterDataPipe`` -> ``Filter``)."""
    return str(theirs).replace("IterDataPipe instance", " instance").replace("MapDataPipe instance", " instance")


CASES = {
    "concat of nothing": lambda m: m.Concater(),
    "concat of a list": lambda m: m.Concater(m.IterableWrapper([1]), [2]),
    "zip of a range": lambda m: m.Zipper(range(3)),
    # A stage over a source without len(): torch's stage says so in its own name (ours, naming the
    # source's reason first). Over a source that has __len__ but raises from it (an IterableWrapper
    # of a generator), torch passes the source's message through; ours still names the stage asked,
    # so the message ends with "Shuffler instance doesn't have valid length" (tests/compat/
    # test_reference_errors.py).
    "len of a shuffle over a filter": lambda m: len(m.IterableWrapper([1]).filter(bool).shuffle()),
    "len of a map over a filter": lambda m: len(m.IterableWrapper([1]).filter(bool).map(abs)),
    "len of a generator": lambda m: len(m.IterableWrapper(x for x in [1])),
    "map: fn takes too many": lambda m: m.Mapper(m.IterableWrapper([(1, 2)]), two, input_col=0),
    "map: fn takes too few": lambda m: m.Mapper(m.IterableWrapper([(1, 2)]), one, input_col=[0, 1]),
    "map: keyword-only without default": lambda m: m.Mapper(m.IterableWrapper([1]), kw_only, input_col=0),
    "filter: fn takes too many": lambda m: m.Filter(m.IterableWrapper([(1, 2)]), two, input_col=0),
}


# Where torch accepts what we refuse (zip or mux of nothing, which yield nothing there; a map-style
# Mapper whose fn does not fit input_col, which fails at the first item there), ours raises at
# construction: listed in docs/migration.rst.


# Cases an older supported torch words differently: its message, and the newer torch's phrase ours
# ends with on every torch. torch 2.9 gave IterableWrapper a __len__ that says "IterableWrapper
# instance doesn't have valid length" where torch 2.5-2.8 let Python's message through.
OLDER_TORCH = {
    "len of a generator": ("object of type 'generator' has no len()",
                           "IterableWrapper instance doesn't have valid length"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_type_and_torchs_phrase_at_the_end(case):
    build = CASES[case]
    with pytest.raises(Exception) as theirs:
        build(torch_iter)
    with pytest.raises(type(theirs.value)) as ours:
        build(our_iter)
    expected = phrase(theirs.value)
    older, newer = OLDER_TORCH.get(case, (None, None))
    if expected == older:
        expected = newer  # the installed torch is older than the wording we keep
    assert str(ours.value).endswith(expected), (str(ours.value), str(theirs.value))


MAP_CASES = {
    "concat of nothing": lambda m: m.Concater(),
    "concat of a list": lambda m: m.Concater(m.SequenceWrapper([1]), [2]),
}


@pytest.mark.parametrize("case", sorted(MAP_CASES))
def test_map_style_too(case):
    build = MAP_CASES[case]
    with pytest.raises(Exception) as theirs:
        build(torch_map)
    with pytest.raises(type(theirs.value)) as ours:
        build(our_map)
    assert str(ours.value).endswith(phrase(theirs.value)), (str(ours.value), str(theirs.value))


@pytest.mark.parametrize("name, make", [("fork", lambda m: m.IterableWrapper([1]).fork(2, buffer_size=-1)),
                                        ("demux", lambda m: m.IterableWrapper([1]).demux(2, one, buffer_size=-1))])
def test_unlimited_buffer_warning(name, make):
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        make(torch_iter)
    with pytest.warns(UserWarning) as ours:
        make(our_iter)
    torch_phrase = str(theirs[0].message)
    assert f"Unlimited buffer size is set for `{name}`" in torch_phrase
    assert any(torch_phrase in str(w.message) for w in ours)


def test_sharding_twice():
    def build(m):
        return m.IterableWrapper(range(4)).sharding_filter().map(one).sharding_filter()

    with pytest.raises(RuntimeError, match="Sharding twice on a single pipeline"):
        torch_settings.apply_sharding(build(torch_iter), 2, 0)
    with pytest.raises(RuntimeError, match="Sharding twice on a single pipeline is likely unintended"):
        graph_settings.apply_sharding(build(our_iter), 2, 0)


def test_functions_that_fit_their_columns_are_accepted():
    def with_default(a, b=1):
        return a + b

    def star(*args):
        return sum(args)

    pipe = our_iter.IterableWrapper([(1, 2)])
    assert list(pipe.map(with_default, input_col=0)) == [(2, 2)]
    assert list(pipe.map(star, input_col=[0, 1])) == [(3,)]  # the columns replaced by the result
    assert list(pipe.map(len)) == [2]  # a built-in whose signature can be read
    assert list(pipe.map(lambda x, rng: x, rng="python")) == [(1, 2)]  # the stage passes rng=
