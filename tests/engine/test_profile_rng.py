"""Per-item random generators (rng=). (The tests of ``datapipes.profile`` are in tests/test_profiling.py.)"""

import asyncio
import random
import time

import numpy as np
import pytest
import torch

from datapipes.iter import IterableWrapper
from datapipes.testing import check_datapipe


def augment(x, rng):
    time.sleep(random.random() * 0.001)  # scheduling noise: results must not depend on it
    return (x, rng.random())


@pytest.mark.usefixtures("no_thread_leak")
class TestItemRng:
    @pytest.mark.parametrize("kwargs", [{}, {"concurrency": 4}, {"concurrency": 4, "ordered": False},
                                        {"concurrency": 2, "executor": "process", "chunksize": 3}])
    def test_same_seed_same_values_whatever_the_concurrency(self, kwargs):
        serial = IterableWrapper(range(30)).map(augment, rng="python").set_seed(7)
        other = IterableWrapper(range(30)).map(augment, rng="python", **kwargs).set_seed(7)
        assert sorted(other) == list(serial)
        assert list(serial) == list(serial)  # re-iteration with the seed repeats the values

    def test_epoch_and_seed_change_values(self):
        pipe = IterableWrapper(range(10)).map(augment, rng="python", concurrency=2).set_seed(1)
        a = list(pipe)
        pipe.set_epoch(1)
        b = list(pipe)
        pipe.set_seed(2).set_epoch(0)
        c = list(pipe)
        assert a != b and a != c and [x for x, _ in a] == [x for x, _ in b] == list(range(10))

    def test_unseeded_follows_torch_manual_seed(self):
        pipe = IterableWrapper(range(5)).map(augment, rng="python", concurrency=3)
        torch.manual_seed(3)
        a = list(pipe)
        torch.manual_seed(3)
        assert list(pipe) == a

    def test_kinds_and_columns(self):
        def draw(v, rng):
            if isinstance(rng, np.random.Generator):
                return float(rng.random())
            if isinstance(rng, torch.Generator):
                return float(torch.rand(1, generator=rng))
            return rng.random()

        for kind in ("python", "numpy", "torch"):
            serial = list(IterableWrapper([(1, "a"), (2, "b")]).map(draw, input_col=0, rng=kind).set_seed(5))
            conc = list(IterableWrapper([(1, "a"), (2, "b")]).map(draw, input_col=0, rng=kind, concurrency=2).set_seed(5))
            assert serial == conc and serial[0][1] == "a" and serial[0][0] != serial[1][0]

    def test_async_fn_gets_rng(self):
        async def fn(x, rng):
            await asyncio.sleep(0)
            return rng.random()

        a = list(IterableWrapper(range(5)).map(fn, rng="python", concurrency=3).set_seed(9))
        b = list(IterableWrapper(range(5)).map(lambda x, rng: rng.random(), rng="python").set_seed(9))
        assert a == b

    def test_contract_and_errors_keep_positions(self):
        check_datapipe(IterableWrapper(range(8)).map(augment, rng="python", concurrency=2).set_seed(0))

        def fail(x, rng):
            if x == 3:
                raise ValueError(x)
            return x

        with pytest.raises(ValueError) as info:
            list(IterableWrapper(range(6)).map(fail, rng="python").set_seed(0))
        assert info.value.__notes__ == ["[datapipes] raised in stage Mapper(fail) at item 3"]
        pipe = IterableWrapper(range(6)).map(fail, rng="python", concurrency=2, on_error="skip").set_seed(0)
        assert list(pipe) == [0, 1, 2, 4, 5] and pipe.failures.recent[0].position == 3
