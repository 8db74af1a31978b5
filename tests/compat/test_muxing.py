"""torchdata's multiplexing pipes (datapipes/iter/muxing.py): MultiplexerLongest [mux_longest] and
SampleMultiplexer: behaviour as torchdata 0.9 documents it, argument errors, len(), the pipe contract,
checkpoint and pickling."""

import pytest

from datapipes.iter import IterableWrapper, MultiplexerLongest, SampleMultiplexer
from datapipes.testing import check_datapipe, check_resume

W = IterableWrapper


# -- MultiplexerLongest ----------------------------------------------------------------------------


class TestMultiplexerLongest:
    def test_torchdata_example(self):
        dp1, dp2, dp3 = W(range(5)), W(range(10, 15)), W(range(20, 25))
        assert list(dp1.mux_longest(dp2, dp3)) == [0, 10, 20, 1, 11, 21, 2, 12, 22, 3, 13, 23, 4, 14, 24]

    def test_uneven(self):
        pipe = MultiplexerLongest(W([1, 2, 3]), W([]), W(["a"]), W([None, None]))
        assert list(pipe) == [1, "a", None, 2, None, 3]
        assert len(pipe) == 6

    def test_arguments_and_len(self):
        with pytest.raises(ValueError):
            MultiplexerLongest()
        with pytest.raises(TypeError):
            MultiplexerLongest(W([1]), "ab")
        with pytest.raises(TypeError, match="MultiplexerLongest"):
            len(W([1]).mux_longest(W(x for x in [1])))

    def test_contract_and_resume(self):
        check_datapipe(W([1, 2, 3]).mux_longest(W("a")), expected=[1, "a", 2, 3], build=lambda src: src.mux_longest(W([9])))
        assert check_resume(lambda: W(range(3)).mux_longest(W("a"), W([10, 11, 12, 13])), ks=range(9)) == \
            [0, "a", 10, 1, 11, 2, 12, 13]


# -- SampleMultiplexer -----------------------------------------------------------------------------


class TestSampleMultiplexer:
    def test_torchdata_example(self):
        d = {W([0] * 10): 99999999, W([1] * 10): 0.0000001}
        assert list(SampleMultiplexer(pipes_to_weights_dict=d, seed=0)) == [0] * 10 + [1] * 10

    def test_every_item_once_each_input_in_order(self):
        a, b, c = W(range(0, 20)), W(range(100, 110)), W(range(200, 230))
        out = list(SampleMultiplexer({a: 1, b: 2, c: 0.5}))
        assert sorted(out) == sorted([*range(20), *range(100, 110), *range(200, 230)])
        for lo in (0, 100, 200):
            mine = [x for x in out if lo <= x < lo + 100]
            assert mine == sorted(mine)
        assert len(SampleMultiplexer({a: 1, b: 2, c: 0.5})) == 60

    def test_weights_shape_the_mix(self):
        out = list(SampleMultiplexer({W([0] * 2000).cycle(): 3.0, W([1]).cycle(): 1.0}, seed=1).header(4000))
        assert 0.70 < out.count(0) / len(out) < 0.80

    def test_seeds(self):
        def make(seed=None):
            return SampleMultiplexer({W(range(10)): 1, W(range(10, 20)): 1}, seed=seed)

        seeded = make(seed=7)
        assert list(seeded) == list(seeded) == list(make(seed=7))
        assert list(make(seed=7)) != list(make(seed=8))
        pipe = make().set_seed(3)
        first = list(pipe)
        assert list(pipe) == first and list(pipe.set_epoch(1)) != first
        assert SampleMultiplexer._is_random

    def test_arguments(self):
        with pytest.raises(ValueError, match="Empty dictionary"):
            SampleMultiplexer({})
        with pytest.raises(ValueError, match="Expecting a positive and non-zero weight"):
            SampleMultiplexer({W([1]): 0})
        with pytest.raises(ValueError, match="finite"):
            SampleMultiplexer({W([1]): float("inf")})
        with pytest.raises(TypeError, match="must be a number"):
            SampleMultiplexer({W([1]): "1"})
        with pytest.raises(TypeError, match="IterDataPipe"):
            SampleMultiplexer({"ab": 1})
        with pytest.raises(TypeError, match="seed"):
            SampleMultiplexer({W([1]): 1}, seed=1.5)
        with pytest.raises(TypeError, match="dict"):
            SampleMultiplexer([W([1])])

    def test_contract_and_resume(self):
        check_datapipe(SampleMultiplexer({W(range(5)): 1, W("abc"): 2}, seed=4),
                       build=lambda src: SampleMultiplexer({src: 1, W([7]): 1}, seed=0))
        check_datapipe(SampleMultiplexer({W(range(5)): 1, W("abc"): 2}))  # unseeded: passes agree as multisets
        check_resume(lambda: SampleMultiplexer({W(range(6)): 1, W(range(10, 14)): 2, W([None]): 1}, seed=3), ks=range(12))
