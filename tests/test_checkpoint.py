"""Checkpoint and resume of a pass: ``it.state_dict()`` and ``iter(pipe).load_state_dict(state)``.

The law (DESIGN section 6): a pass stopped after k items and resumed from its state yields exactly
what the uninterrupted pass yields after its first k items (completion-order stages: exactly the
items not yet yielded, nothing twice).
"""

import asyncio
import io
import pickle
import random
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from datapipes import IterDataPipe
from datapipes.iter import IterableWrapper


class Cursor:
    """A source iterator with the two-method protocol for stages written elsewhere."""

    def __init__(self, n):
        self.n, self.i = n, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]


class Source(IterDataPipe):
    """A user-written source whose iterator keeps its own state."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return Cursor(self.n)

    def __len__(self):
        return self.n


def jitter(x):
    time.sleep(random.random() * 0.001)
    return x * 10


async def ajitter(x):
    await asyncio.sleep(random.random() * 0.001)
    return x * 10


def resumed(build, k, through=pickle):
    """The first k items of a pass, then the rest from a new pass resumed from its state."""
    it = iter(build())
    head = [next(it) for _ in range(k)]
    state = it.state_dict()
    if through is pickle:
        state = pickle.loads(pickle.dumps(state))
    else:
        buf = io.BytesIO()
        torch.save(state, buf)
        buf.seek(0)
        state = torch.load(buf, weights_only=False)
    it.close()
    again = iter(build())
    again.load_state_dict(state)
    return head, list(again)


ORDERED = {
    "threads": lambda: Source(60).map(jitter, concurrency=4),
    "async": lambda: Source(60).map(ajitter, concurrency=8),
    "seeded rng": lambda: Source(60).map(lambda x, rng: (x, rng.random()), concurrency=3, rng="python").set_seed(3),
    "serial chain": lambda: Source(60).map(lambda x: x + 1).filter(lambda x: x % 3).map(str),
    "prefetch": lambda: Source(60).map(jitter, concurrency=2).prefetch(5),
    "nested prefetch": lambda: Source(60).prefetch(3).map(jitter, concurrency=2).prefetch(2).filter(lambda x: x % 7),
    "skip failures": lambda: Source(60).map(lambda x: 1 // (x % 5), concurrency=3, on_error="skip"),
}


class TestExact:
    @pytest.mark.parametrize("name", sorted(ORDERED))
    def test_ordered_resume_equals_the_uninterrupted_pass(self, name):
        build = ORDERED[name]
        full = list(build())
        for k in sorted({0, 1, 5, len(full) // 2, len(full) - 1, len(full)}):
            head, rest = resumed(build, k)
            assert head + rest == full, (name, k)

    @pytest.mark.parametrize("fn", [jitter, ajitter], ids=["threads", "async"])
    def test_completion_order_resume_yields_exactly_the_rest(self, fn):
        build = lambda: Source(60).map(fn, concurrency=6, ordered=False)  # noqa: E731
        want = sorted(x * 10 for x in range(60))
        for k in (0, 1, 17, 59, 60):
            head, rest = resumed(build, k)
            assert sorted(head + rest) == want and not set(head) & set(rest), k

    def test_state_through_torch_save(self):
        full = list(ORDERED["nested prefetch"]())
        head, rest = resumed(ORDERED["nested prefetch"], 20, through=torch)
        assert head + rest == full

    def test_resume_in_a_fresh_process(self, tmp_path):
        code = textwrap.dedent(f"""
            import sys, torch
            sys.path.insert(0, {str(tmp_path)!r})
            sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
            from test_checkpoint import Source, jitter
            build = lambda: Source(40).map(jitter, concurrency=3).prefetch(4)
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
        assert state["graph"] == ["Prefetcher", "Mapper", "Source"]
        pickle.dumps(state)

    def test_load_after_the_first_item_is_refused(self):
        it = iter(Source(10).map(jitter, concurrency=2))
        state = it.state_dict()
        next(it)
        with pytest.raises(RuntimeError, match="before the first next"):
            it.load_state_dict(state)

    def test_a_pipe_of_another_shape_is_named(self):
        it = iter(Source(10).map(jitter, concurrency=2))
        state = it.state_dict()
        other = iter(Source(10).prefetch().map(jitter, concurrency=2))
        with pytest.raises(ValueError, match=r"at stage 1 .* it has Source, this pipe has Prefetcher"):
            other.load_state_dict(state)
        with pytest.raises(ValueError, match="not a state"):
            other.load_state_dict({"stages": {}})

    def test_a_stage_that_cannot_save_is_named(self):
        it = iter(Source(10).map(jitter, concurrency=2, executor="process"))
        with pytest.raises(TypeError, match=r"Mapper\(jitter\) cannot save its position"):
            it.state_dict()
        it.close()

    def test_stateless_stages_written_elsewhere_work_unchanged(self):
        class Plus(IterDataPipe):
            def __init__(self, dp):
                self.dp = dp

            def __iter__(self):
                for x in self.dp:
                    yield x + 1

        build = lambda: Plus(Source(30).map(jitter, concurrency=3))  # noqa: E731
        full = list(build())
        head, rest = resumed(build, 11)
        assert head + rest == full


ALLOWED = ["map", "cmap", "umap", "filter", "prefetch"]


@given(
    n=st.integers(0, 40),
    stages=st.lists(st.sampled_from(ALLOWED), max_size=4),
    k=st.integers(0, 45),
)
def test_law_resume_equals_the_uninterrupted_run(n, stages, k):
    def build():
        pipe = Source(n)
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

    full = list(build())
    k = min(k, len(full))
    head, rest = resumed(build, k)
    if "umap" in stages:
        assert sorted(head + rest) == sorted(full)
        assert len(head) + len(rest) == len(full)
    else:
        assert head + rest == full


def _noisy(x, rng):
    return x + rng.random()


class TestDataLoader:
    """datapipes.DataLoader follows torchdata's StatefulDataLoader convention: state_dict() at any
    time, load_state_dict() before the next iter(), which resumes (or starts the next epoch)."""

    @staticmethod
    def build():
        from datapipes import DataLoader

        return DataLoader(Source(50).map(_noisy, concurrency=3, rng="python"), batch_size=4, seed=7)

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

    def test_a_state_saved_between_epochs_starts_the_next_one(self):
        loader = self.build()
        [b for b in loader]
        state = loader.state_dict()
        second = [b.tolist() for b in loader]
        again = self.build()
        again.load_state_dict(state)
        assert [b.tolist() for b in again] == second

    def test_workers_are_not_supported_yet(self):
        from datapipes import DataLoader

        loader = DataLoader(Source(8).sharding_filter(), batch_size=2, num_workers=2)
        with pytest.raises(NotImplementedError, match="num_workers > 0"):
            loader.state_dict()
        with pytest.raises(ValueError, match="not a state"):
            loader.load_state_dict({})
