"""Smaller behaviours of torch DataPipes that PyTorch's test_datapipe.py relies on, as our own tests:
StreamWrapper's repr, RoutedDecoder and the openers over plain iterables, custom sharding groups, the
map-style Mapper's identity default, the exact "(functional name: ``x``)" phrase, SequenceWrapper's
deep copy at construction, the map-style shuffle's ``set_shuffle``, the fork/demux reset messages
ending in torch's sentences, and a fork/demux child whose iterator died of a BufferError keeping its
place, as torch's does."""

import inspect
import io
import os
import pickle
import pydoc
import threading
import warnings

import pytest
import torch
import torch.utils.data.graph_settings as torch_graph_settings
from torch.utils.data import DataLoader
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES as TORCH_PRIORITIES

from datapipes import graph_settings
from datapipes.graph import traverse
from datapipes.iter import FileOpener, IterableWrapper, RoutedDecoder
from datapipes.iter.sharding import SHARDING_PRIORITIES, ShardingFilter, apply_sharding
from datapipes.map import Mapper, SequenceWrapper
from datapipes.map.combinatorics import Shuffler as MapShuffler
from datapipes.testing import check_datapipe
from datapipes.utils.common import StreamWrapper

RESET = ("Some child DataPipes are not exhausted when __iter__ is called. We are resetting the buffer and "
         "each child DataPipe will read from the start again.")
INVALIDATED = ("This iterator has been invalidated, because a new iterator has been created from one of the "
               "ChildDataPipes of ")


# -- A5: StreamWrapper.__repr__ ----------------------------------------------------------------------


class TestStreamWrapperRepr:
    def test_without_a_name(self):
        f = io.BytesIO(b"x")
        assert repr(StreamWrapper(f)) == f"StreamWrapper<{f!r}>"

    def test_with_a_name_unquoted_and_no_space(self):
        f = io.StringIO("x")
        assert repr(StreamWrapper(f, name="data/a.txt")) == f"StreamWrapper<data/a.txt,{f!r}>"
        assert repr(StreamWrapper(f, name=7)) == f"StreamWrapper<7,{f!r}>"

    def test_an_opener_names_its_streams_by_path(self, tmp_path):
        path = os.path.join(tmp_path, "a.txt")
        with open(path, "w") as f:
            f.write("hi")
        [(got, stream)] = list(FileOpener([path]))
        with stream:
            assert got == path and repr(stream).startswith(f"StreamWrapper<{path},<_io.TextIOWrapper")


# -- A6: RoutedDecoder and the openers take plain iterables ------------------------------------------


class TestPlainIterableSources:
    def test_routed_decoder_over_a_list_of_streams(self):
        streams = [io.BytesIO(b"hi"), io.BytesIO(b"[1, 2]")]
        pipe = RoutedDecoder([("a.txt", streams[0]), ("b.json", streams[1])])
        assert isinstance(pipe.datapipe, IterableWrapper) and pipe.datapipe.deepcopy is False
        assert len(pipe) == 2
        assert list(pipe) == [("a.txt", "hi"), ("b.json", [1, 2])]
        assert all(s.closed for s in streams)  # the caller's own streams were read, not copies

    def test_routed_decoder_over_a_list_of_bytes_is_a_full_pipe(self):
        pairs = [("a.txt", b"x"), ("n.cls", b"3")]
        check_datapipe(RoutedDecoder(pairs), expected=[("a.txt", "x"), ("n.cls", 3)])

    def test_routed_decoder_over_a_generator_reads_once(self):
        pipe = RoutedDecoder(("f.txt", s.encode()) for s in "ab")
        assert list(pipe) == [("f.txt", "a"), ("f.txt", "b")]
        with pytest.raises(RuntimeError):
            list(pipe)

    def test_routed_decoder_keeps_a_pipe_as_it_is(self):
        src = IterableWrapper([("a.txt", b"x")])
        assert RoutedDecoder(src).datapipe is src

    @pytest.mark.parametrize("bad", [3, None, "a.txt", b"a.txt"])
    def test_routed_decoder_refuses_what_is_not_an_iterable_of_pairs(self, bad):
        with pytest.raises(TypeError, match="RoutedDecoder: datapipe must be an IterDataPipe or an iterable"):
            RoutedDecoder(bad)

    def test_file_opener_over_a_generator_and_a_set(self, tmp_path):
        paths = []
        for name in ("a", "b"):
            paths.append(os.path.join(tmp_path, name))
            with open(paths[-1], "w") as f:
                f.write(name.upper())

        def read(pipe):
            out = []
            for path, stream in pipe:
                with stream:
                    out.append((path, stream.read()))
            return sorted(out)

        assert read(FileOpener(p for p in paths)) == [(paths[0], "A"), (paths[1], "B")]
        assert read(FileOpener(set(paths))) == [(paths[0], "A"), (paths[1], "B")]
        assert read(FileOpener(tuple(paths))) == [(paths[0], "A"), (paths[1], "B")]

    def test_file_opener_refuses_a_single_path(self, tmp_path):
        with pytest.raises(TypeError, match=r"FileOpener: datapipe must be .* got the single path 'x.txt'; pass \['x.txt'\]"):
            FileOpener("x.txt")
        with pytest.raises(TypeError, match="FileOpener: datapipe must be an IterDataPipe, got int"):
            FileOpener(5)


# -- A8: sharding groups of one's own ------------------------------------------------------------------


class TestCustomShardingGroups:
    def test_a_filter_per_group_including_a_custom_one(self):
        source = IterableWrapper(range(24))
        by_rank = source.sharding_filter(SHARDING_PRIORITIES.DISTRIBUTED)
        by_custom = by_rank.sharding_filter(sharding_group_filter=42)
        for stage in (by_rank, by_custom):
            stage.apply_sharding(2, 0, sharding_group=SHARDING_PRIORITIES.DISTRIBUTED)
            stage.apply_sharding(3, 2, sharding_group=42)
        # by_rank keeps the even items; by_custom keeps every third of those, from the third on
        assert list(by_custom) == [4, 10, 16, 22] and len(by_custom) == 4

    def test_custom_groups_combine_by_their_ints_the_highest_fastest(self):
        pipe = IterableWrapper(range(12)).sharding_filter()
        pipe.apply_sharding(2, 1, sharding_group=SHARDING_PRIORITIES.MULTIPROCESSING)
        pipe.apply_sharding(3, 2, sharding_group=300)
        # 300 > MULTIPROCESSING (3): shard 2 + 3 * 1 = 5 of 6
        assert (pipe.num_of_instances, pipe.instance_id) == (6, 5)
        assert list(pipe) == [5, 11] and len(pipe) == 2

    def test_graph_function_with_a_custom_group(self):
        pipe = IterableWrapper(range(10)).sharding_filter(sharding_group_filter=-5).map(lambda x: x * 10)
        assert apply_sharding(pipe, 4, 3, sharding_group=-5) is pipe
        assert list(pipe) == [30, 70]

    def test_a_filtered_custom_group_never_applied_keeps_everything(self):
        assert list(IterableWrapper(range(4)).sharding_filter(sharding_group_filter=300)) == [0, 1, 2, 3]

    def test_members_stay_members_and_custom_groups_stay_ints(self):
        pipe = ShardingFilter(IterableWrapper(range(4)), TORCH_PRIORITIES.MULTIPROCESSING)
        assert pipe.sharding_group_filter is SHARDING_PRIORITIES.MULTIPROCESSING
        pipe.apply_sharding(2, 0, sharding_group=2)
        pipe.apply_sharding(2, 1, sharding_group=9)
        assert set(pipe.groups) == {SHARDING_PRIORITIES.DISTRIBUTED, 9}
        assert all(type(g) in (SHARDING_PRIORITIES, int) for g in pipe.groups)

    @pytest.mark.parametrize("first, then", [(SHARDING_PRIORITIES.DEFAULT, 300), (300, SHARDING_PRIORITIES.DEFAULT)])
    def test_default_does_not_mix_with_a_custom_group(self, first, then):
        pipe = IterableWrapper(range(6)).sharding_filter()
        pipe.apply_sharding(2, 1, sharding_group=first)
        with pytest.raises(ValueError, match="cannot mix the DEFAULT sharding group with other groups") as info:
            pipe.apply_sharding(3, 0, sharding_group=then)
        assert isinstance(info.value, RuntimeError)  # torch's type too
        assert "300" in str(info.value)
        assert len(pipe.groups) == 1  # nothing applied by the refused call

    @pytest.mark.parametrize("bad", [True, False, "300", 3.0, None])
    def test_groups_must_be_ints(self, bad):
        pipe = IterableWrapper(range(6)).sharding_filter()
        with pytest.raises(TypeError, match="sharding_group must be a SHARDING_PRIORITIES member or an int"):
            pipe.apply_sharding(2, 0, sharding_group=bad)
        if bad is not None:
            with pytest.raises(TypeError, match="ShardingFilter: sharding_group_filter must be a SHARDING_PRIORITIES"):
                IterableWrapper([1]).sharding_filter(sharding_group_filter=bad)

    def test_custom_groups_survive_pickling(self):
        pipe = IterableWrapper(range(12)).sharding_filter(sharding_group_filter=77)
        pipe.apply_sharding(4, 1, sharding_group=77)
        copy = pickle.loads(pickle.dumps(pipe))
        assert copy.groups == {77: (4, 1)} and copy.sharding_group_filter == 77
        assert list(copy) == [1, 5, 9]


# -- A9: map-style Mapper's fn defaults to the identity ------------------------------------------------


class TestMapMapperIdentityDefault:
    def test_default_is_the_identity(self):
        pipe = Mapper(SequenceWrapper(["a", "b", "c"]))
        assert pipe[2] == "c" and list(pipe) == ["a", "b", "c"] and len(pipe) == 3
        assert SequenceWrapper([4, 5]).map()[1] == 5

    def test_identity_with_columns(self):
        assert SequenceWrapper([(1, "a")]).map(input_col=1, output_col=-1)[0] == (1, "a", "a")

    def test_pickles_by_reference(self):
        pipe = SequenceWrapper([1, 2]).map()
        assert b"cloudpickle" not in pickle.dumps(pipe)
        assert list(pickle.loads(pickle.dumps(pipe))) == [1, 2]

    def test_signature_default(self):
        default = inspect.signature(Mapper).parameters["fn"].default
        item = object()
        assert default(item) is item


# -- A10: "(functional name: ``x``)" exactly ------------------------------------------------------------


@pytest.mark.parametrize(
    "method",
    [lambda: SequenceWrapper([1]).shuffle, lambda: SequenceWrapper([1]).to_iter_datapipe,
     lambda: IterableWrapper([(1, 2)]).to_map_datapipe, lambda: IterableWrapper([]).parse_csv_files],
    ids=["shuffle", "to_iter_datapipe", "to_map_datapipe", "parse_csv_files"],
)
def test_functional_name_phrase_is_exact(method):
    bound = method()
    name = bound.__name__
    assert f"(functional name: ``{name}``)" in pydoc.render_doc(bound)


# -- A11: SequenceWrapper deep-copies at construction by default ----------------------------------------


class TestSequenceWrapperCopy:
    def test_default_is_a_deep_copy(self):
        assert inspect.signature(SequenceWrapper).parameters["deepcopy"].default is True
        data = [[1], [2]]
        pipe = SequenceWrapper(data)
        data.append([3])
        data[0].append(99)
        assert list(pipe) == [[1], [2]] and len(pipe) == 2 and pipe.deepcopy is True

    def test_deepcopy_false_shares(self):
        data = [[1], [2]]
        pipe = SequenceWrapper(data, deepcopy=False)
        data[0].append(99)
        data.append([3])
        assert pipe.sequence is data and list(pipe) == [[1, 99], [2], [3]]

    def test_immutable_items_are_copied_cheaply_but_still_detached(self):
        data = list(range(1000))
        pipe = SequenceWrapper(data)
        assert pipe.sequence == data and pipe.sequence is not data
        data[0] = -1
        assert pipe[0] == 0
        frozen = tuple(range(5))
        assert SequenceWrapper(frozen).sequence is frozen  # a tuple of ints cannot change

    def test_dict_copied_too(self):
        data = {"a": [1]}
        pipe = SequenceWrapper(data)
        data["a"].append(2)
        assert pipe["a"] == [1]

    def test_uncopyable_sequence_is_shared_with_a_warning(self):
        data = [threading.Lock()]
        with pytest.warns(UserWarning, match="SequenceWrapper: the list cannot be deep-copied"):
            pipe = SequenceWrapper(data)
        assert pipe.sequence is data


# -- A13: the map-style shuffle's set_shuffle -----------------------------------------------------------


class TestMapShuffleSetShuffle:
    def test_off_is_the_index_order_and_on_shuffles_again(self):
        pipe = SequenceWrapper(list(range(30))).shuffle().set_seed(3)
        shuffled = list(pipe)
        assert sorted(shuffled) == list(range(30)) and shuffled != list(range(30))
        assert pipe.set_shuffle(False) is pipe
        assert list(pipe) == list(range(30)) and len(pipe) == 30
        assert list(pipe.set_shuffle()) == shuffled  # same seed, same order

    def test_off_with_indices_keeps_their_order(self):
        pipe = SequenceWrapper({"a": 1, "b": 2, "c": 3}).shuffle(indices=["c", "a"]).set_shuffle(False)
        assert list(pipe) == [3, 1]

    def test_off_draws_nothing_from_torch(self):
        pipe = SequenceWrapper(list(range(10))).shuffle().set_shuffle(False)
        torch.manual_seed(0)
        list(pipe)
        after = torch.rand(1)
        torch.manual_seed(0)
        assert torch.equal(torch.rand(1), after)

    def test_off_pickles_and_passes_the_contract(self):
        pipe = SequenceWrapper(list(range(8))).shuffle().set_shuffle(False)
        assert list(pickle.loads(pickle.dumps(pipe))) == list(range(8))
        check_datapipe(pipe, expected=range(8))

    def test_graph_settings_find_it(self):
        pipe = SequenceWrapper(list(range(20))).shuffle().map(lambda x: x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "does not contain a `Shuffler`" warning
            assert graph_settings.apply_shuffle_settings(pipe, shuffle=False) is pipe
            assert list(pipe) == list(range(20))
            assert torch_graph_settings.apply_shuffle_settings(pipe, shuffle=True) is pipe
        assert next(s for s in traverse(pipe) if isinstance(s, MapShuffler))._enabled is True

    def test_torch_dataloader_shuffle_flag(self):
        pipe = SequenceWrapper(list(range(40))).shuffle()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            in_order = [int(x) for x in DataLoader(pipe, batch_size=None, shuffle=False)]
            shuffled = [int(x) for x in DataLoader(pipe, batch_size=None, shuffle=True)]
        assert in_order == list(range(40))
        assert sorted(shuffled) == list(range(40)) and shuffled != in_order


# -- A14: fork/demux reset messages end with torch's sentences ------------------------------------------


def _restart_mid_pass(children):
    a, b = children
    first, second = iter(a), iter(b)
    next(first)
    next(second)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        next(iter(a))
    with pytest.raises(RuntimeError) as info:
        next(second)
    [warning] = [w for w in caught if issubclass(w.category, UserWarning)]
    return str(warning.message), str(info.value)


@pytest.mark.parametrize(
    "make, label",
    [(lambda: IterableWrapper(range(6)).fork(2), "Forker(num_instances=2, buffer_size=1000)"),
     (lambda: IterableWrapper(range(6)).demux(2, abs), "Demultiplexer(abs)")],
    ids=["fork", "demux"],
)
def test_reset_messages_end_with_torchs_sentences(make, label):
    warning, error = _restart_mid_pass(make())
    assert warning.startswith(f"{label}: child 0 started a new pass while child(ren) [1]")
    assert warning.endswith(": " + RESET)
    assert error.startswith(f"{label}: child 0 started a new pass while this one was mid-pass")
    assert error.endswith(f": {INVALIDATED}{label}.")


# -- B6 (now as torch): a child whose iterator died of a BufferError keeps its place ---------------------


@pytest.mark.parametrize("split", ["fork", "demux"])
def test_a_child_whose_iterator_overflowed_still_holds_items(split):
    source = IterableWrapper(range(10))
    if split == "fork":
        a, b = source.fork(2, buffer_size=3)
    else:
        a, b = source.demux(2, lambda x: 0 if x >= 5 else 1, buffer_size=3)
    it = iter(a)
    with pytest.raises(BufferError):
        for _ in range(10):
            next(it)
    # as torch: a's place still bounds b, which overflows in turn (tests/compat/test_torch_datapipe_parity.py)
    got, ib = [], iter(b)
    with pytest.raises(BufferError):
        for x in ib:
            got.append(x)
    assert got == (list(range(7)) if split == "fork" else [0, 1, 2, 3, 4])
