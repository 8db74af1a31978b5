"""torchdata's RoundRobinDemultiplexer [round_robin_demux] (datapipes/iter/broadcast/demux.py): behaviour
as torchdata 0.9 documents it, argument errors, len(), the pipe contract, checkpoint and pickling."""

import pickle

import pytest

from datapipes.iter import IterableWrapper, RoundRobinDemultiplexer
from datapipes.iter.broadcast.demux import RoundRobinDemultiplexerChild
from datapipes.testing import check_datapipe, check_resume

W = IterableWrapper


# -- RoundRobinDemultiplexer -----------------------------------------------------------------------


class TestRoundRobinDemultiplexer:
    def test_torchdata_example(self):
        dp1, dp2 = W(range(5)).round_robin_demux(2)
        assert list(dp1) == [0, 2, 4] and len(dp1) == 3
        assert list(dp2) == [1, 3] and len(dp2) == 2
        assert isinstance(dp1, RoundRobinDemultiplexerChild)

    @pytest.mark.parametrize("n, k", [(0, 3), (7, 3), (9, 3), (2, 4)])
    def test_lengths_match_items(self, n, k):
        children = RoundRobinDemultiplexer(W(range(n)), k)
        for i, child in enumerate(children):
            assert list(child) == list(range(i, n, k)) == list(range(n))[i::k]
            assert len(child) == len(list(range(n))[i::k])

    def test_one_instance_is_one_child(self):
        (only,) = W("abc").round_robin_demux(1)
        assert list(only) == ["a", "b", "c"]

    def test_buffer_bound(self):
        a, b = W(range(10)).round_robin_demux(2, buffer_size=2)
        with pytest.raises(BufferError, match="RoundRobinDemultiplexer"):
            list(a)

    def test_arguments(self):
        with pytest.raises(ValueError, match="^RoundRobinDemultiplexer: Expected `num_instaces` larger than 0"):
            W([1]).round_robin_demux(0)
        with pytest.raises(TypeError):
            RoundRobinDemultiplexer([1, 2], 2)
        with pytest.raises(TypeError, match="has no len"):
            len(W(x for x in [1]).round_robin_demux(2)[0])

    def test_contract_pickle_and_resume(self):
        a, b, c = W(range(8)).round_robin_demux(3)
        check_datapipe(b, expected=[1, 4, 7], build=lambda src: src.round_robin_demux(1)[0])
        x, y = pickle.loads(pickle.dumps([a, c]))
        assert list(x.zip(y)) == [(0, 2), (3, 5)]

        def build():
            p, q, r = W(range(10)).round_robin_demux(3)
            return p.mux_longest(q, r)

        assert check_resume(build, ks=range(11)) == list(range(10))
