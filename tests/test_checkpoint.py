"""Checkpoint and resume of a pass: ``it.state_dict()`` and ``iter(pipe).load_state_dict(state)``.

The law (docs/howto/checkpoint.rst): a pass stopped after k items and resumed from its state yields exactly
what the uninterrupted pass yields after its first k items (completion-order stages: exactly the
items not yet yielded, nothing twice).
"""

import asyncio
import pickle
import random
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from datapipes.iter import IterableWrapper
from datapipes.testing import ContractViolation, check_resume

from helpers import PlusOne, StatefulSource


def jitter(x):
    time.sleep(random.random() * 0.001)
    return x * 10


async def ajitter(x):
    await asyncio.sleep(random.random() * 0.001)
    return x * 10


ORDERED = {
    "threads": lambda: StatefulSource(60).map(jitter, concurrency=4),
    "async": lambda: StatefulSource(60).map(ajitter, concurrency=8),
    "seeded rng": lambda: StatefulSource(60).map(
        lambda x, rng: (x, rng.random()), concurrency=3, rng="python").set_seed(3),
    "serial chain": lambda: StatefulSource(60).map(lambda x: x + 1).filter(lambda x: x % 3 != 0).map(str),
    "prefetch": lambda: StatefulSource(60).map(jitter, concurrency=2).prefetch(5),
    "nested prefetch": lambda: StatefulSource(60).prefetch(3).map(jitter, concurrency=2).prefetch(2).filter(
        lambda x: x % 7 != 0),
    "skip failures": lambda: StatefulSource(60).map(lambda x: 1 // (x % 5), concurrency=3, on_error="skip"),
    "processes": lambda: StatefulSource(60).map(lambda x: x * 10, concurrency=2, executor="process", chunksize=3),
    "processes, seeded": lambda: StatefulSource(40).map(lambda x, rng: (x, rng.random()), concurrency=2,
                                                        executor="process", rng="python").set_seed(5),
}


class TestExact:
    @pytest.mark.parametrize("name", sorted(ORDERED))
    def test_ordered_resume_equals_the_uninterrupted_pass(self, name):
        check_resume(ORDERED[name], lambda n: sorted({0, 1, 5, n // 2, n - 1, n}))

    @pytest.mark.parametrize("fn", [jitter, ajitter], ids=["threads", "async"])
    def test_completion_order_resume_yields_exactly_the_rest(self, fn):  # processes: test_process_completion_order
        build = lambda: StatefulSource(60).map(fn, concurrency=6, ordered=False)  # noqa: E731
        full = check_resume(build, (0, 1, 17, 59, 60), ordered=False)
        assert sorted(full) == sorted(x * 10 for x in range(60))

    def test_state_through_torch_save(self):
        check_resume(ORDERED["nested prefetch"], [20], through="torch")

    def test_resume_in_a_fresh_process(self, tmp_path):
        code = textwrap.dedent(f"""
            import sys, torch
            sys.path.insert(0, {str(tmp_path)!r})
            sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
            from helpers import PlusOne, StatefulSource
            from test_checkpoint import jitter
            build = lambda: StatefulSource(40).map(jitter, concurrency=3).prefetch(4)
            if sys.argv[1] == "save":
                it = iter(build())
                head = [next(it) for _ in range(13)]
                torch.save({{"head": head, "state": it.state_dict()}}, sys.argv[2])
            else:
                saved = torch.load(sys.argv[2], weights_only=False)
                it = iter(build())
                it.load_state_dict(saved["state"])
                print(saved["head"] + list(it) == list(build()))
        """)
        script = tmp_path / "run.py"
        script.write_text(code)
        path = str(tmp_path / "state.pt")
        subprocess.run([sys.executable, str(script), "save", path], check=True, timeout=120)
        out = subprocess.run([sys.executable, str(script), "load", path], check=True, timeout=120,
                             capture_output=True, text=True)
        assert out.stdout.strip() == "True", out.stderr


class TestProtocol:
    def test_state_is_plain_data(self):
        it = iter(ORDERED["prefetch"]())
        next(it)
        state = it.state_dict()
        assert state["format"] == "datapipes.pass/1"
        assert state["graph"] == ["Prefetcher", "Mapper", "StatefulSource"]
        pickle.dumps(state)

    def test_load_after_the_first_item_is_refused(self):
        it = iter(StatefulSource(10).map(jitter, concurrency=2))
        state = it.state_dict()
        next(it)
        with pytest.raises(RuntimeError, match="before the first next"):
            it.load_state_dict(state)

    def test_a_pipe_of_another_shape_is_named(self):
        it = iter(StatefulSource(10).map(jitter, concurrency=2))
        state = it.state_dict()
        other = iter(StatefulSource(10).prefetch().map(jitter, concurrency=2))
        with pytest.raises(ValueError, match=r"at stage 1 .* it has StatefulSource, this pipe has Prefetcher"):
            other.load_state_dict(state)
        with pytest.raises(ValueError, match="not a state"):
            other.load_state_dict({"stages": {}})

    def test_a_stage_that_cannot_save_is_named(self):
        it = iter(IterableWrapper(x for x in range(10)).map(jitter, concurrency=2))
        next(it)
        with pytest.raises(TypeError, match=r"IterableWrapper cannot save its position"):
            it.state_dict()
        it.close()

    def test_stateless_stages_written_elsewhere_work_unchanged(self):
        check_resume(lambda: PlusOne(StatefulSource(30).map(jitter, concurrency=3)), [11])


class Forgetful(StatefulSource):
    """A source whose iterator ignores the state it is given: a resumed pass starts again."""

    def __iter__(self):
        it = super().__iter__()
        it.load_state_dict = lambda state: None
        return it


class TestCheckResume:
    """``datapipes.testing.check_resume`` catches the pipes that break the law and names them."""

    def test_a_pass_that_starts_again_is_named_with_its_k(self):
        with pytest.raises(ContractViolation, match=r"Forgetful -> Mapper\(str\): a pass stopped after 2 of 5 items"):
            check_resume(lambda: Forgetful(5).map(str), [0, 2])

    def test_unordered_names_what_was_repeated(self):
        message = r"after 3 of 6 items .*: 0 items lost \[\], 3 repeated or new \[0, 1, 2\]"
        with pytest.raises(ContractViolation, match=message):
            check_resume(lambda: Forgetful(6), [3], ordered=False)

    def test_returns_the_uninterrupted_pass_through_torch(self):
        assert check_resume(lambda: StatefulSource(4).batch(3), range(3), through="torch") == [[0, 1, 2], [3]]

    def test_bad_arguments_are_named(self):
        with pytest.raises(ValueError, match="through must be 'pickle' or 'torch', got 'json'"):
            check_resume(lambda: StatefulSource(3), through="json")
        with pytest.raises(ValueError, match="ks: 4 is not an int from 0 to 3"):
            check_resume(lambda: StatefulSource(3), [1, 4])

    def test_an_error_of_the_pipe_comes_through_with_a_note(self):
        with pytest.raises(TypeError, match="one-shot generator") as info:
            check_resume(lambda: IterableWrapper(x for x in range(5)), [2])
        assert "check_resume: IterableWrapper, a pass stopped after 2 items" in info.value.__notes__[-1]


ALLOWED = ["map", "cmap", "umap", "filter", "prefetch"]


@given(
    n=st.integers(0, 40),
    stages=st.lists(st.sampled_from(ALLOWED), max_size=4),
    k=st.integers(0, 45),
)
def test_law_resume_equals_the_uninterrupted_run(n, stages, k):
    def build():
        pipe = StatefulSource(n)
        for s in stages:
            if s == "map":
                pipe = pipe.map(lambda x: x * 2)
            elif s == "cmap":
                pipe = pipe.map(jitter, concurrency=3)
            elif s == "umap":
                pipe = pipe.map(jitter, concurrency=3, ordered=False)
            elif s == "filter":
                pipe = pipe.filter(lambda x: x % 3 != 1)
            else:
                pipe = pipe.prefetch(2)
        return pipe

    check_resume(build, lambda n: [min(k, n)], ordered="umap" not in stages)


def _noisy(x, rng):
    return x + rng.random()


class TestDataLoader:
    """datapipes.DataLoader follows torchdata's StatefulDataLoader convention: state_dict() at any
    time, load_state_dict() before the next iter(), which resumes (or starts the next epoch)."""

    @staticmethod
    def build():
        from datapipes import DataLoader

        return DataLoader(StatefulSource(50).map(_noisy, concurrency=3, rng="python"), batch_size=4, seed=7)

    def test_resume_mid_epoch(self):
        full = [b.tolist() for b in self.build()]
        for k in (0, 1, 6, 12, 13):
            loader = self.build()
            it = iter(loader)
            head = [next(it).tolist() for _ in range(k)]
            state = pickle.loads(pickle.dumps(loader.state_dict()))
            again = self.build()
            again.load_state_dict(state)
            assert head + [b.tolist() for b in again] == full, k

    def test_resume_in_a_later_epoch_keeps_its_seed_and_epoch(self):
        loader = self.build()
        epochs = [[b.tolist() for b in loader] for _ in range(2)]
        assert epochs[0] != epochs[1]  # each epoch draws anew
        it = iter(loader)  # epoch 2
        head = [next(it).tolist() for _ in range(5)]
        state = loader.state_dict()
        rest_then = [b.tolist() for b in it]
        again = self.build()
        again.load_state_dict(state)
        assert [b.tolist() for b in again] == rest_then
        assert again.epoch == 2
        assert head  # (the first five batches were delivered before the save)

    def test_a_state_of_positions_loads_with_torch_loads_default(self, tmp_path):
        # weights_only=True, torch.load's default: a state of positions is plain data it accepts
        import torch

        loader = self.build()
        it = iter(loader)
        head = [next(it).tolist() for _ in range(4)]
        torch.save(loader.state_dict(), tmp_path / "state.pt")
        it.close()
        again = self.build()
        again.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
        assert head + [b.tolist() for b in again] == [b.tolist() for b in self.build()]

    @pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
    def test_through_torch_distributed_checkpoint(self, tmp_path):
        # DCP writes the state as it is (plain data); loading wants a template of the saved shape,
        # which a resumed state need not share with a fresh one: give DCP the state as one pickled
        # leaf (as torchtitan does with StatefulDataLoader), beside the model's tensors.
        import torch
        import torch.distributed.checkpoint as dcp

        full = [b.tolist() for b in self.build()]
        loader = self.build()
        it = iter(loader)
        head = [next(it).tolist() for _ in range(5)]
        dcp.save({"weights": torch.arange(3.0), "data": loader.state_dict()}, checkpoint_id=tmp_path / "plain")
        dcp.save({"weights": torch.arange(3.0), "data": pickle.dumps(loader.state_dict())},
                 checkpoint_id=tmp_path / "leaf")
        it.close()
        saved = {"weights": torch.zeros(3), "data": b""}
        dcp.load(saved, checkpoint_id=tmp_path / "leaf")
        again = self.build()
        again.load_state_dict(pickle.loads(saved["data"]))
        assert saved["weights"].tolist() == [0.0, 1.0, 2.0]
        assert head + [b.tolist() for b in again] == full

    def test_a_state_saved_between_epochs_starts_the_next_one(self):
        loader = self.build()
        [b for b in loader]
        state = loader.state_dict()
        second = [b.tolist() for b in loader]
        again = self.build()
        again.load_state_dict(state)
        assert [b.tolist() for b in again] == second


@pytest.mark.slow
def test_process_completion_order_resume_yields_exactly_the_rest():
    check_resume(lambda: StatefulSource(40).map(lambda x: x * 10, concurrency=2, executor="process", ordered=False,
                                                chunksize=2), [0, 1, 13, 39, 40], ordered=False)
