"""Errors that code ported from torch DataPipes catches or matches: the exception classes torch
raises (``TypeError`` for an unknown length, ``AssertionError`` for its asserted arguments,
``IndexError`` for a too deep ``unbatch``),
with our context first and torch's phrase intact at the end of the message; and ``filter`` over
several input columns, as torch passes them."""

import pickle
import re

import numpy as np
import pytest
import torch.utils.data.datapipes.iter as torch_iter

import datapipes.iter as our_iter
import datapipes.iter.mapping.filter as filter_module
from datapipes import IterDataPipe, MapDataPipe
from datapipes._checks import ArgumentError, ArgumentTypeError, require_int
from datapipes.datapipe import lacks_len, source_len
from datapipes.iter import Filter, IterableWrapper, Sampler
from datapipes.iter.batching import UnbatchLevelError
from datapipes.map import SequenceWrapper
from datapipes.testing import check_datapipe

# torch's pipes warn at construction about functions plain pickle cannot reach
pytestmark = pytest.mark.filterwarnings("ignore:(Lambda|Local) function is not supported by pickle")

LEN_PHRASE = r"instance doesn't have valid length$"


class NoLen(IterDataPipe):
    """A source without ``__len__``, as torch's tests write it (``IDP_NoLen``)."""

    def __iter__(self):
        yield from range(6)


class MapNoLen(MapDataPipe):
    """A map-style source that defines no ``__len__`` (the base class's raises)."""

    def __getitem__(self, index):
        return index


class LenRaises(IterDataPipe):
    """A source whose ``__len__`` raises the exception it is given (a bug inside it, say)."""

    def __init__(self, error):
        self.error = error

    def __iter__(self):
        yield from range(3)

    def __len__(self):
        raise self.error


class TorchStyleNoLen(IterDataPipe):
    """A source whose ``__len__`` says, in torch's words, that it has no length."""

    def __iter__(self):
        yield from range(3)

    def __len__(self):
        raise TypeError(f"{type(self).__name__} instance doesn't have valid length")


def keep_even(x):
    return x % 2 == 0


# -- A1: a stage whose len() delegates to a source without one ---------------------------------------

#: functional name -> a stage over the given source whose ``len()`` is the source's (or derived from it)
ITER_STAGES = {
    "map": lambda s: s.map(abs),
    "collate": lambda s: s.collate(),
    "batch": lambda s: s.batch(2),
    "bucketbatch": lambda s: s.bucketbatch(2),
    "shuffle": lambda s: s.shuffle(),
    "unbatch(0)": lambda s: s.unbatch(unbatch_level=0),
    "enumerate": lambda s: s.enumerate(),
    "cycle(2)": lambda s: s.cycle(2),
    "sharding_filter": lambda s: s.sharding_filter(),
    "prefetch": lambda s: s.prefetch(2),
    "fork child": lambda s: s.fork(2)[0],
    "concat": lambda s: s.concat(IterableWrapper([1])),
    "zip": lambda s: s.zip(IterableWrapper([1])),
    "zip_longest": lambda s: s.zip_longest(IterableWrapper([1])),
    "add_index": lambda s: s.add_index(),
    "repeat": lambda s: s.repeat(2),
    "in_batch_shuffle": lambda s: s.in_batch_shuffle(),
}


@pytest.mark.parametrize("name", sorted(ITER_STAGES))
def test_len_over_a_source_without_len_ends_with_torchs_phrase(name):
    pipe = ITER_STAGES[name](NoLen())
    with pytest.raises(TypeError, match=LEN_PHRASE) as e:
        len(pipe)
    message = str(e.value)
    stage = type(pipe).__name__
    assert message.startswith(f"{stage}"), message  # our context first: the stage asked
    assert message.endswith(f"{stage} instance doesn't have valid length"), message
    assert "(NoLen defines no __len__)" in message  # and why: the source named
    # one sentence: each of "has no len()" and torch's phrase once
    assert message.count("instance doesn't have valid length") == 1, message
    assert message.count("has no len()") == 1, message


def test_random_split_child_without_total_length_names_the_source():
    class Sized(IterDataPipe):
        n = 6

        def __iter__(self):
            yield from range(self.n)

        def __len__(self):
            if self.n is None:
                raise TypeError("Sized has no len() now")
            return self.n

    source = Sized()
    child = source.random_split(weights={"a": 0.5, "b": 0.5}, seed=0, target="a")
    assert len(child) == 3
    source.n = None
    with pytest.raises(TypeError, match=LEN_PHRASE) as e:
        len(child)
    assert str(e.value).startswith("SplitterIterator('a'): source_datapipe has no len() (Sized has no len() now)")


@pytest.mark.parametrize("name", ["map", "batch", "shuffle", "concat", "zip"])
def test_map_style_stages_too(name):
    build = {
        "map": lambda s: s.map(abs),
        "batch": lambda s: s.batch(2),
        "shuffle": lambda s: s.shuffle(),
        "concat": lambda s: s.concat(SequenceWrapper([1])),
        "zip": lambda s: s.zip(SequenceWrapper([1])),
    }[name]
    pipe = build(MapNoLen())
    with pytest.raises(TypeError, match=LEN_PHRASE) as e:
        len(pipe)
    assert str(e.value).startswith(type(pipe).__name__)
    assert "MapNoLen" in str(e.value)


def _torch_wrapper_says_no_valid_length():
    """Whether the installed torch's IterableWrapper over an iterable without a length says so in
    torch's phrase (torch >= 2.9; before, Python's "object of type ... has no len()" came through)."""
    try:
        len(torch_iter.IterableWrapper(iter(())))
    except TypeError as e:
        return re.search(LEN_PHRASE, str(e)) is not None
    return False


def test_the_same_as_torchs_stage_over_the_same_source():
    torch_source = torch_iter.IterableWrapper(iter(range(3)))
    # torch < 2.9 raises the same type, with Python's words for the iterator
    older = r"^object of type 'range_iterator' has no len\(\)$"
    torch_phrase = LEN_PHRASE if _torch_wrapper_says_no_valid_length() else older
    with pytest.raises(TypeError, match=torch_phrase):
        len(torch_source.map(abs))
    with pytest.raises(TypeError, match=LEN_PHRASE):
        len(NoLen().map(abs))


def test_a_chain_names_the_first_reason_once():
    pipe = NoLen().map(abs).batch(2).shuffle().enumerate()
    with pytest.raises(TypeError, match=LEN_PHRASE) as e:
        len(pipe)
    assert str(e.value) == (
        "Enumerator: source_datapipe has no len() (NoLen defines no __len__), so Enumerator instance doesn't have "
        "valid length"
    )


def test_a_reason_given_by_a_stage_below_is_kept_without_its_torch_phrase():
    with pytest.raises(TypeError, match=LEN_PHRASE) as e:
        len(IterableWrapper(range(4)).filter(keep_even).map(abs))
    assert str(e.value) == (
        "Mapper(abs): datapipe has no len() (Filter(keep_even): how many items pass the filter is known only after "
        "iterating), so Mapper instance doesn't have valid length"
    )


def test_a_source_that_says_so_in_torchs_words_counts_as_without_len():
    with pytest.raises(TypeError, match=LEN_PHRASE) as e:
        len(TorchStyleNoLen().batch(2))
    assert str(e.value) == (
        "Batcher(2): datapipe has no len() (TorchStyleNoLen instance doesn't have valid length), so Batcher "
        "instance doesn't have valid length"
    )


@pytest.mark.parametrize("error", [ValueError("negative"), TypeError("unsupported operand type(s) for +")],
                         ids=["ValueError", "other TypeError"])
@pytest.mark.parametrize("name", ["map", "batch", "shuffle", "enumerate", "concat"])
def test_other_errors_of_the_sources_len_propagate_unchanged(name, error):
    pipe = ITER_STAGES[name](LenRaises(error))
    with pytest.raises(type(error)) as e:
        len(pipe)
    assert e.value is error
    assert str(e.value) == str(error) and not getattr(e.value, "__notes__", None)


def test_with_a_length_nothing_changes():
    source = IterableWrapper(range(7))
    assert len(source.map(abs).batch(2).shuffle()) == 4
    assert len(source.batch(3, drop_last=True)) == 2
    assert source_len(source.map(abs), source) == 7


def test_lacks_len():
    assert lacks_len(NoLen(), TypeError("anything"))  # the type defines no __len__
    assert lacks_len(TorchStyleNoLen(), TypeError("X instance doesn't have valid length"))
    assert not lacks_len(LenRaises(None), TypeError("unsupported operand type(s)"))


# -- A2: arguments torch asserts on --------------------------------------------------------------------


def both(error_type, *also):
    """The exception info of a call that must raise an instance of every one of the given classes."""

    class _Both:
        def __init__(self):
            self.raised = None

        def __enter__(self):
            return self

        def __exit__(self, kind, value, tb):
            assert value is not None, "nothing was raised"
            for cls in (error_type, *also):
                assert isinstance(value, cls), (type(value).__mro__, cls)
            self.raised = value
            return True

    return _Both()


ASSERTED = {
    "batch(0)": (lambda: IterableWrapper(range(3)).batch(0), ValueError,
                 "Batcher(batch_size=0): ", "Batch size is required to be larger than 0!"),
    "batch(batch_size=-1)": (lambda: IterableWrapper(range(3)).batch(batch_size=-1), ValueError,
                             "Batcher(batch_size=-1): ", "Batch size is required to be larger than 0!"),
    "map-style batch(0)": (lambda: SequenceWrapper(range(3)).batch(0), ValueError,
                           "Batcher(batch_size=0): ", "Batch size is required to be larger than 0!"),
    "shuffle(buffer_size=0)": (lambda: IterableWrapper(range(3)).shuffle(buffer_size=0), ValueError,
                               "Shuffler(buffer_size=0): ", "buffer_size should be larger than 0"),
    "Sampler over a source without len": (lambda: Sampler(NoLen()), TypeError,
                                          "Sampler: datapipe has no len() (NoLen defines no __len__): ",
                                          "Sampler class requires input datapipe implemented `__len__`"),
    "groupby group_size=0": (lambda: IterableWrapper(range(3)).groupby(abs, group_size=0), ValueError,
                             "Grouper(group_size=0): ", "group_size must be > 0 and <= buffer_size"),
    "groupby group_size > buffer_size": (
        lambda: IterableWrapper(range(3)).groupby(abs, group_size=5, buffer_size=4), ValueError,
        "Grouper(group_size=5, buffer_size=4): ", "group_size must be > 0 and <= buffer_size"),
    "groupby buffer_size=0 with a group_size": (
        lambda: IterableWrapper(range(3)).groupby(abs, group_size=1, buffer_size=0), ValueError,
        "Grouper(buffer_size=0): ", "group_size must be > 0 and <= buffer_size"),
    "groupby guaranteed_group_size without group_size": (
        lambda: IterableWrapper(range(3)).groupby(abs, guaranteed_group_size=2), ValueError,
        "Grouper(guaranteed_group_size=2, group_size=None): ",
        "guaranteed_group_size must be > 0 and <= group_size and group_size must be set"),
    "groupby guaranteed_group_size > group_size": (
        lambda: IterableWrapper(range(3)).groupby(abs, group_size=2, guaranteed_group_size=3), ValueError,
        "Grouper(guaranteed_group_size=3, group_size=2): ",
        "guaranteed_group_size must be > 0 and <= group_size and group_size must be set"),
    "groupby guaranteed_group_size=0": (
        lambda: IterableWrapper(range(3)).groupby(abs, group_size=2, guaranteed_group_size=0), ValueError,
        "Grouper(guaranteed_group_size=0): ",
        "guaranteed_group_size must be > 0 and <= group_size and group_size must be set"),
    # torchdata asserts these (its own words)
    "bucketbatch batch_size=0": (lambda: IterableWrapper(range(3)).bucketbatch(0), ValueError,
                                 "BucketBatcher(batch_size=0): ", "Batch size is required to be larger than 0!"),
    "bucketbatch batch_num=0": (lambda: IterableWrapper(range(3)).bucketbatch(2, batch_num=0), ValueError,
                                "BucketBatcher(batch_num=0): ", "Number of batches is required to be larger than 0!"),
    "bucketbatch bucket_num=0": (lambda: IterableWrapper(range(3)).bucketbatch(2, bucket_num=0), ValueError,
                                 "BucketBatcher(bucket_num=0): ", "Number of buckets is required to be larger than 0!"),
}


@pytest.mark.parametrize("case", sorted(ASSERTED))
def test_asserted_arguments_raise_ours_and_assertion_error(case):
    build, ours, start, theirs = ASSERTED[case]
    with both(ours, AssertionError) as e:
        build()
    message = str(e.raised)
    assert message == start + theirs, message  # one sentence: the stage and the values, then their words
    assert isinstance(e.raised, ArgumentTypeError if ours is TypeError else ArgumentError)


@pytest.mark.parametrize("case", ["batch(0)", "shuffle(buffer_size=0)", "Sampler over a source without len",
                                  "groupby group_size > buffer_size"])
def test_torch_raises_assertion_error_for_these_too(case):
    torch_build = {
        "batch(0)": lambda: torch_iter.IterableWrapper(range(3)).batch(0),
        "shuffle(buffer_size=0)": lambda: torch_iter.IterableWrapper(range(3)).shuffle(buffer_size=0),
        "Sampler over a source without len": lambda: torch_iter.Sampler(torch_iter.IterableWrapper(iter([1]))
                                                                       .filter(bool)),
        "groupby group_size > buffer_size": lambda: torch_iter.IterableWrapper(range(3)).groupby(
            abs, group_size=5, buffer_size=4),
    }[case]
    with pytest.raises(AssertionError) as theirs:
        torch_build()
    _, _, _, phrase = ASSERTED[case]
    if case == "groupby group_size > buffer_size" and str(theirs.value) == "":
        # torch < 2.10 asserts it with no message; ours ends with torch 2.10's phrase on every torch
        # (test_asserted_arguments_raise_ours_and_assertion_error)
        return
    assert str(theirs.value) == phrase


def test_sampler_over_a_sized_source_still_builds():
    assert list(Sampler(IterableWrapper(range(3)))) == [0, 1, 2]


def test_sampler_propagates_other_errors_of_the_sources_len():
    error = ValueError("broken")
    with pytest.raises(ValueError) as e:
        Sampler(LenRaises(error))
    assert e.value is error


@pytest.mark.parametrize("build", [
    lambda: IterableWrapper(range(3)).unbatch(unbatch_level=-2),  # torch: a ValueError too
    lambda: IterableWrapper(range(3)).groupby(abs, buffer_size=0),  # torch checks no buffer_size alone
    lambda: IterableWrapper(range(3)).header(-2),
], ids=["unbatch_level=-2", "groupby buffer_size=0", "header(-2)"])
def test_checks_torch_does_not_assert_stay_plain_value_errors(build):
    with pytest.raises(ValueError) as e:
        build()
    assert not isinstance(e.value, AssertionError), type(e.value).__mro__


@pytest.mark.parametrize("build", [
    lambda: IterableWrapper(range(3)).batch("2"),
    lambda: IterableWrapper(range(3)).shuffle(buffer_size=2.0),
], ids=["batch('2')", "shuffle(buffer_size=2.0)"])
def test_wrong_types_stay_plain_type_errors(build):
    with pytest.raises(TypeError) as e:
        build()
    assert not isinstance(e.value, AssertionError)


def test_require_int_asserts_only_when_asked():
    with pytest.raises(ValueError) as e:
        require_int(0, "S", "n", minimum=1)
    assert type(e.value) is ValueError
    with pytest.raises(ArgumentError, match=r"^S\(n=0\): torch says so$"):
        require_int(0, "S", "n", minimum=1, torch_assert="torch says so")
    require_int(1, "S", "n", minimum=1, torch_assert="torch says so")


def test_argument_errors_pickle():
    with pytest.raises(ArgumentError) as e:
        IterableWrapper(range(3)).batch(0)
    again = pickle.loads(pickle.dumps(e.value))
    assert type(again) is ArgumentError and str(again) == str(e.value)


# -- A7: unbatch deeper than the data ------------------------------------------------------------------


def test_unbatch_deeper_than_the_data_is_type_and_index_error():
    pipe = IterableWrapper([[0, 1]]).unbatch(unbatch_level=5)
    with both(TypeError, IndexError) as e:
        list(pipe)
    assert isinstance(e.raised, UnbatchLevelError)
    message = str(e.raised)
    assert message.startswith("Unbatcher(5): item 0[0] is an int, not a list or tuple"), message
    assert message.endswith("unbatch_level 5 exceeds the depth of the DataPipe"), message


def test_unbatch_one_level_over_items_that_are_not_batches():
    it = iter(IterableWrapper([[0, 1], 2]).unbatch())
    assert [next(it), next(it)] == [0, 1]  # the elements before the bad item come first
    with pytest.raises(IndexError, match=r"^Unbatcher\(1\): item 1 is an int.*unbatch_level 1 exceeds the depth "
                                         r"of the DataPipe$"):
        next(it)


def test_unbatch_depth_phrase_as_torch_words_it():
    with pytest.raises(IndexError) as theirs:
        list(torch_iter.IterableWrapper([[0, 1]]).unbatch(unbatch_level=5))
    with pytest.raises(IndexError) as ours:
        list(IterableWrapper([[0, 1]]).unbatch(unbatch_level=5))
    theirs_phrase = str(theirs.value).splitlines()[0]  # torch's hook adds a line naming its pipe
    assert theirs_phrase == "unbatch_level 5 exceeds the depth of the DataPipe"
    assert str(ours.value).endswith(theirs_phrase)


def test_unbatch_level_error_pickles():
    with pytest.raises(UnbatchLevelError) as e:
        list(IterableWrapper([[0, 1]]).unbatch(unbatch_level=3))
    again = pickle.loads(pickle.dumps(e.value))
    assert type(again) is UnbatchLevelError and str(again) == str(e.value)


# -- A12: filter -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("result", [1, 0, None, "yes", []], ids=["1", "0", "None", "str", "empty list"])
def test_filter_refuses_a_result_that_is_not_a_bool_as_torch_does(result):
    # as torch (ValueError with its phrase), not Python's filter(), which takes the truth value
    with pytest.raises(ValueError, match="Boolean output is required for `filter_fn` of FilterIterDataPipe, got"):
        list(IterableWrapper(range(3)).filter(lambda x: result))


def test_numpy_bools_are_refused_as_torch_does():
    data = np.arange(6)
    with pytest.raises(ValueError, match=r"filter_fn returned np.True_ \(numpy.bool\) for item 0"):
        list(IterableWrapper(list(data)).filter(lambda x: x % 2 == 0))  # numpy.bool_
    assert list(IterableWrapper(list(data)).filter(lambda x: bool(x % 2 == 0))) == [0, 2, 4]


def test_exceptions_of_filter_fn_keep_their_note():
    def boom(x):
        if x == 2:
            raise KeyError(x)
        return True

    with pytest.raises(KeyError) as e:
        list(IterableWrapper(range(4)).filter(boom))
    assert e.value.__notes__ == ["[datapipes] raised in stage Filter(boom) at item 2"]


def test_the_filter_loop_calls_the_predicate_once_per_item():
    calls = []

    def predicate(x):
        calls.append(x)
        return x % 3 != 0

    assert list(IterableWrapper(range(9)).filter(predicate)) == [1, 2, 4, 5, 7, 8]
    assert list(IterableWrapper([(x,) for x in range(9)]).filter(predicate, input_col=0)) == [
        (1,), (2,), (4,), (5,), (7,), (8,)]
    assert calls == list(range(9)) * 2


@pytest.mark.parametrize("cols", [[0, 2], (0, 2)], ids=["list", "tuple"])
def test_filter_over_several_columns(cols):
    data = [(d - 1, d, d + 1) for d in range(10)]

    def fits(a, b):
        return a + b < 10

    pipe = IterableWrapper(data).filter(fits, input_col=cols)
    assert list(pipe) == [(d - 1, d, d + 1) for d in range(5)]  # torch's test_filter_datapipe
    check_datapipe(pipe, [(d - 1, d, d + 1) for d in range(5)])


def test_filter_over_several_keys_of_dict_items():
    data = [{"a": 1, "b": 2, "c": 3}, {"a": 5, "b": 0, "c": 9}]
    pipe = IterableWrapper(data).filter(lambda a, c: a < c - 3, input_col=["a", "c"])
    assert list(pipe) == [{"a": 5, "b": 0, "c": 9}]


def test_filter_over_several_columns_as_torch():
    data = [(d - 1, d, d + 1) for d in range(10)]

    def fits(a, b):
        return a + b < 10

    theirs = list(torch_iter.IterableWrapper(data).filter(fits, input_col=[0, 2]))
    assert list(IterableWrapper(data).filter(fits, input_col=[0, 2])) == theirs


def test_filter_over_several_columns_skips_and_notes():
    def fits(a, b):
        if a == 2:
            raise KeyError(a)
        return a < b

    pipe = IterableWrapper([(1, 2), (2, 3), (3, 1)]).filter(fits, input_col=[0, 1], on_error="skip")
    assert list(pipe) == [(1, 2)] and pipe.failures.count == 1
    with pytest.raises(KeyError) as e:
        list(IterableWrapper([(1, 2), (2, 3)]).filter(fits, input_col=[0, 1]))
    assert e.value.__notes__ == ["[datapipes] raised in stage Filter(fits) at item 1"]


@pytest.mark.parametrize("build, match", [
    (lambda: Filter(IterableWrapper([(1, 2)]), lambda a: True, input_col=[0, 1]),
     r"^Filter: The function <lambda> takes 1 parameters, but 2 are required\.$"),
    (lambda: Filter(IterableWrapper([(1, 2)]), lambda a, b: True, input_col=[]),
     r"^Filter: input_col must name at least one column"),
], ids=["too few parameters", "no column"])
def test_filter_columns_are_checked_at_construction(build, match):
    with pytest.raises(ValueError, match=match):
        build()
