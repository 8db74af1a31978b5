"""Four behaviours of torch DataPipes that PyTorch's test_datapipe.py relies on, as our own tests: a
fork/demux/unzip child whose sibling overflowed the shared buffer raises ``BufferError`` too,
``fork(num_instances=1)`` is the source itself, ``filter`` refuses a result that is not a bool, and
the children of fork, demux and unzip expose ``main_datapipe`` and ``instance_id``."""

import collections
import pickle
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper as TorchWrapper

from datapipes.graph import sources_of
from datapipes.iter import Forker, IterableWrapper

TORCH_FORK_OVERFLOW = "ForkerIterDataPipe buffer overflow,buffer size {} is insufficient."
TORCH_DEMUX_OVERFLOW = "DemultiplexerIterDataPipe buffer overflow, buffer size {} is insufficient."
TORCH_NOT_BOOL = "Boolean output is required for `filter_fn` of FilterIterDataPipe, got"


def _read_until_error(it):
    """The items ``it`` yields before it raises; the exception it raised (None: it ended)."""
    got = []
    try:
        for x in it:
            got.append(x)
    except Exception as e:  # noqa: BLE001 - the caller checks the type
        return got, e
    return got, None


def _late(x):
    return 0 if x >= 5 else 1


# -- 1: a child whose sibling overflowed the shared buffer raises BufferError too --------------------------


class TestOverflowReachesTheSiblings:
    def test_fork(self):
        a, b = IterableWrapper(range(10)).fork(2, buffer_size=4)
        ia = iter(a)
        assert [next(ia) for _ in range(4)] == [0, 1, 2, 3]
        with pytest.raises(BufferError) as first:
            next(ia)
        # torch: a keeps its place (past item 4), so b may read 4 items past it, no more
        got, error = _read_until_error(iter(b))
        assert got == list(range(9)) and isinstance(error, BufferError)
        assert str(first.value).endswith(": " + TORCH_FORK_OVERFLOW.format(4))
        assert str(error).endswith(": " + TORCH_FORK_OVERFLOW.format(4))
        assert "child 1 ran more than buffer_size=4 items ahead of child 0" in str(error)
        assert "stopped with a BufferError at item 4" in str(error)

    def test_fork_child_never_started(self):
        a, b = IterableWrapper(range(10)).fork(2, buffer_size=5)
        with pytest.raises(BufferError, match=r"has not started reading.*buffer overflow,buffer size 5"):
            list(b)

    def test_fork_sibling_within_the_bound_reads_to_the_end(self):
        # as torch: the sibling raises only where it would read more than buffer_size past the
        # failed child's place; a source that ends before that is read to its end
        a, b = IterableWrapper(range(7)).fork(2, buffer_size=4)
        with pytest.raises(BufferError):
            list(a)
        assert list(b) == list(range(7))

    def test_fork_as_torchs_own(self):
        def outcome(source):
            a, b = source.fork(2, buffer_size=4)
            ia = iter(a)
            first = _read_until_error(ia)
            second = _read_until_error(iter(b))
            return first[0], type(first[1]), second[0], type(second[1])

        assert outcome(IterableWrapper(range(10))) == outcome(TorchWrapper(range(10)))
        assert outcome(IterableWrapper(range(7))) == outcome(TorchWrapper(range(7)))

    def test_demux(self):
        a, b = IterableWrapper(range(10)).demux(2, _late, buffer_size=4)
        with pytest.raises(BufferError) as first:
            next(iter(a))  # items 0-4 all wait for b
        got, error = _read_until_error(iter(b))
        assert got == [0, 1, 2, 3, 4] and isinstance(error, BufferError)  # 5-9 wait for a, which stopped
        assert str(first.value).endswith(": " + TORCH_DEMUX_OVERFLOW.format(4))
        assert str(error).endswith(": " + TORCH_DEMUX_OVERFLOW.format(4))
        assert "child 0 holds 5, which stopped with a BufferError" in str(error)

    def test_demux_as_torchs_own(self):
        def outcome(source):
            a, b = source.demux(2, _late, buffer_size=4)
            first = _read_until_error(iter(a))
            second = _read_until_error(iter(b))
            return first[0], type(first[1]), second[0], type(second[1])

        assert outcome(IterableWrapper(range(10))) == outcome(TorchWrapper(range(10)))

    def test_unzip(self):
        a, b = IterableWrapper([(i, -i) for i in range(10)]).unzip(2, buffer_size=3)
        got, error = _read_until_error(iter(a))
        assert got == [0, 1, 2] and isinstance(error, BufferError)
        got, error = _read_until_error(iter(b))
        assert got == [0, -1, -2, -3, -4, -5, -6] and isinstance(error, BufferError)
        assert str(error).startswith("UnZipper(sequence_length=2, buffer_size=3): child 1 ran more")
        assert str(error).endswith(": " + TORCH_FORK_OVERFLOW.format(3))  # torchdata's UnZipper is a fork

    def test_round_robin_demux(self):
        a, b = IterableWrapper(range(12)).round_robin_demux(2, buffer_size=2)
        got, error = _read_until_error(iter(a))
        assert got == [0, 2, 4] and isinstance(error, BufferError)  # 1, 3, 5 wait for b
        got, error = _read_until_error(iter(b))
        assert got == [1, 3, 5, 7, 9] and isinstance(error, BufferError)  # 6, 8, 10 wait for a
        assert str(error).endswith(": " + TORCH_DEMUX_OVERFLOW.format(2))

    @pytest.mark.parametrize("split", ["fork", "demux"])
    def test_iterating_the_children_again_starts_a_new_pass(self, split):
        source = IterableWrapper(range(10))
        if split == "fork":
            a, b = source.fork(2, buffer_size=2)
        else:
            a, b = source.demux(2, lambda x: x % 2, buffer_size=2)
        with pytest.raises(BufferError):
            list(a)
        got, error = _read_until_error(iter(b))
        if split == "fork":
            assert got == [0, 1, 2, 3, 4] and isinstance(error, BufferError)
        else:  # only two of a's items (6, 8) come to wait for it
            assert got == [1, 3, 5, 7, 9] and error is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # every child had left: nothing to warn about
            assert list(a.zip(b)) == ([(i, i) for i in range(10)] if split == "fork"
                                      else [(i, i + 1) for i in range(0, 10, 2)])

    def test_a_pass_with_an_overflowed_child_cannot_be_saved(self):
        a, b = IterableWrapper(range(10)).fork(2, buffer_size=2)
        it = iter(a.concat(b))
        with pytest.raises(BufferError):
            list(it)
        with pytest.raises(TypeError, match="child 0 overflowed its buffer"):
            it.state_dict()


# -- 2: fork(num_instances=1) is the source itself --------------------------------------------------------


class TestForkOfOne:
    def test_returns_the_source(self):
        source = IterableWrapper(range(3))
        assert source.fork(1) is source
        assert source.fork(num_instances=1, buffer_size=0) is source
        assert Forker(source, 1) is source
        assert source.fork(1, copy="deep") is source  # as torch: no copies of a source read once

    def test_as_torch(self):
        theirs = TorchWrapper(range(3))
        assert theirs.fork(num_instances=1) is theirs

    def test_arguments_are_still_checked(self):
        source = IterableWrapper(range(3))
        with pytest.raises(ValueError, match="copy must be None, 'shallow' or 'deep'"):
            source.fork(1, copy="unknown")
        with pytest.raises(TypeError, match="buffer_size"):
            source.fork(1, buffer_size="big")
        with pytest.raises(ValueError, match="Expected `num_instances` larger than 0, but 0 is found"):
            source.fork(0)
        with pytest.raises(TypeError):
            Forker([1, 2], 1)

    def test_no_unbounded_buffer_warning_without_a_buffer(self):
        source = IterableWrapper(range(3))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert source.fork(1, buffer_size=-1) is source

    def test_two_or_more_are_children(self):
        children = IterableWrapper(range(3)).fork(2)
        assert isinstance(children, list) and len(children) == 2


# -- 3: filter refuses a result that is not a bool -----------------------------------------------------------


def _constant(value):
    def fn(x):
        return value

    return fn


RESULTS = {
    "True": (True, True),
    "False": (False, True),
    "1": (1, False),
    "0": (0, False),
    "None": (None, False),
    "str": ("yes", False),
    "empty list": ([], False),
    "numpy True": (np.True_, False),
    "numpy False": (np.False_, False),
    "torch bool tensor": (torch.tensor(True), False),
    "torch bool tensor of one element": (torch.tensor([True]), False),
}


class TestFilterNeedsABool:
    @pytest.mark.parametrize("name", sorted(RESULTS))
    def test_accepts_what_torch_accepts(self, name):
        value, accepted = RESULTS[name]

        def outcome(source):
            try:
                return list(source.filter(_constant(value)))
            except ValueError:
                return ValueError

        theirs, ours = outcome(TorchWrapper(range(3))), outcome(IterableWrapper(range(3)))
        assert ours == theirs
        assert (ours is not ValueError) == accepted

    @pytest.mark.parametrize("source", ["list", "deque", "generator pipe"])
    def test_message(self, source):
        data = list(range(3))
        src = {
            "list": IterableWrapper(data),  # the loop reads the position from the source
            "deque": IterableWrapper(collections.deque(data), deepcopy=False),  # the loop counts
            "generator pipe": IterableWrapper(data).map(lambda x: x),
        }[source]

        def one_at_2(x):
            return 1 if x == 2 else True

        with pytest.raises(ValueError) as info:
            list(src.filter(one_at_2))
        msg = str(info.value)
        assert msg == (f"Filter(one_at_2): filter_fn returned 1 (int) for item 2 (2), not a bool: {TORCH_NOT_BOOL} "
                       "<class 'int'>")
        assert not getattr(info.value, "__notes__", None)  # the message says it all

    def test_message_with_input_col_and_a_long_item(self):
        items = [("x" * 300, 1), ("y" * 300, 2)]

        def first_is_big(n):
            return np.bool_(n > 1)

        with pytest.raises(ValueError) as info:
            list(IterableWrapper(items).filter(first_is_big, input_col=1))
        msg = str(info.value)
        result = np.False_
        assert msg.startswith(f"Filter(first_is_big): filter_fn returned {result!r} (numpy.bool) for item 0 (('xxx")
        assert msg.endswith(f", not a bool: {TORCH_NOT_BOOL} {type(result)}")
        assert len(msg) < 400  # the item is shortened

    def test_under_on_error_skip_the_item_is_counted_and_dropped(self):
        def odd_is_none(x):
            return None if x % 2 else True

        pipe = IterableWrapper(range(6)).filter(odd_is_none, on_error="skip", warn_failures=None)
        assert list(pipe) == [0, 2, 4]
        assert pipe.failures.count == 3
        assert [(f.position, type(f.exception)) for f in pipe.failures.recent] == [(i, ValueError) for i in (1, 3, 5)]
        with pytest.raises(ExceptionGroup):
            list(IterableWrapper(range(6)).filter(odd_is_none, on_error="skip", max_failures=1))

    def test_bools_keep_and_drop(self):
        assert list(IterableWrapper(range(6)).filter(lambda x: x % 2 == 0)) == [0, 2, 4]
        assert list(IterableWrapper([(1, 2), (3, 4)]).filter(lambda a, b: a + b > 3, input_col=[0, 1])) == [(3, 4)]


# -- 4: the children expose main_datapipe and instance_id -------------------------------------------------


SPLITS = {
    "fork": lambda s: s.fork(3),
    "demux": lambda s: s.demux(3, lambda x: x % 3),
    "unzip": lambda s: s.map(lambda x: (x, x, x)).unzip(3),
}


class TestChildrenExposeTheirHub:
    @pytest.mark.parametrize("split", sorted(SPLITS))
    def test_main_datapipe_and_instance_id(self, split):
        source = IterableWrapper(range(6))
        children = SPLITS[split](source)
        hub = children[0].main_datapipe
        assert all(c.main_datapipe is hub for c in children)
        assert [c.instance_id for c in children] == [0, 1, 2]
        upstream = hub.main_datapipe
        assert upstream is source if split != "unzip" else upstream.datapipe is source
        assert hub.num_instances == 3 and hub.buffer_size == 1000

    def test_as_torchs_children(self):
        theirs = TorchWrapper(range(6))
        c0, c1 = theirs.fork(2)
        assert c0.main_datapipe is c1.main_datapipe and c0.main_datapipe.main_datapipe is theirs
        assert (c0.instance_id, c1.instance_id) == (0, 1)

    def test_walking_up_from_a_child(self):
        # torch's tests walk child -> hub -> the stages above it
        source = IterableWrapper([1, 2, 4])
        child = source.map(abs).map(str).demux(2, lambda x: 0)[0]
        assert child.main_datapipe.main_datapipe.datapipe.datapipe is source

    def test_pickled_together_they_share_one_hub(self):
        a, b = pickle.loads(pickle.dumps(IterableWrapper(range(4)).fork(2)))
        assert a.main_datapipe is b.main_datapipe
        assert list(a.main_datapipe.main_datapipe) == [0, 1, 2, 3]

    def test_main_datapipe_is_not_a_source_in_the_graph(self):
        source = IterableWrapper(range(4))
        a, _ = source.fork(2)
        assert sources_of(a) == [source]
