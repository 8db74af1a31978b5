"""datapipes.DataLoader's state with worker processes, and resuming it with another number of workers
or ranks: with the same layout the batches after a resume are exactly those of the uninterrupted
pass; with another, every item not yet delivered is delivered exactly once.

Ranks are simulated with the ``RANK``/``WORLD_SIZE`` environment variables (what torchrun sets; the
loaders get an explicit seed, so no process group is needed to agree on one); the real two-rank
gloo run is in tests/test_distributed.py.
"""

import json
import os
import pickle
import random
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest
import torch

from datapipes import DataLoader
from datapipes.iter import FileLister, IterableWrapper
from datapipes.loader import shards

from helpers import plain_process  # noqa: F401 - an autouse fixture

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

N = 60


def times_ten(x):
    return x * 10


def slow_ten(x):
    time.sleep(random.random() * 0.002)
    return x * 10


def items_pipe():
    return IterableWrapper(range(N)).shuffle().sharding_filter().map(times_ten)


def in_flight_pipe():
    """A concurrent map below the filter: each shard holds items in flight when it saves."""
    return IterableWrapper(range(N)).shuffle().sharding_filter().map(slow_ten, concurrency=3)


def shuffled_below_pipe():
    """A shuffle below the filter: each shard's buffer holds items it took and has not yielded."""
    return IterableWrapper(range(N)).sharding_filter().shuffle(buffer_size=7).map(times_ten)


PIPES = {"items": items_pipe, "in flight": in_flight_pipe, "shuffled below": shuffled_below_pipe}


def make(build, workers, **kw):
    if workers:
        kw["multiprocessing_context"] = "fork"
    return DataLoader(build(), batch_size=4, seed=5, num_workers=workers, **kw)


def flat(batches):
    return [x for b in batches for x in (b.tolist() if hasattr(b, "tolist") else b)]


def stop_after(loader, k):
    """The first ``k`` batches of a pass of ``loader`` and its state then (through pickle)."""
    it = iter(loader)
    head = [next(it).tolist() for _ in range(k)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    it.close()
    return head, state


def assert_exactly_once(got, expected):
    counts = Counter(got)
    repeated = sorted(x for x, c in counts.items() if c > 1)
    assert not repeated, f"delivered twice: {repeated}"
    assert sorted(got) == sorted(expected), f"lost: {sorted(Counter(expected) - counts)}"


class TestSameLayout:
    @pytest.mark.parametrize("name", sorted(PIPES))
    def test_two_workers_resume_exactly(self, name):
        build = PIPES[name]
        full = [b.tolist() for b in make(build, 2)]
        ks = (0, 1, 6, len(full) - 1, len(full))
        for k in ks:
            head, state = stop_after(make(build, 2), k)
            again = make(build, 2)
            again.load_state_dict(state)
            assert head + [b.tolist() for b in again] == full, k

    def test_workers_that_skip_states_recompute_the_batches_since(self, monkeypatch):
        # With no budget for states, each worker takes one (its first batch's) and counts the rest.
        monkeypatch.setattr(shards, "SNAPSHOT_BUDGET", 0.0)
        full = [b.tolist() for b in make(items_pipe, 2)]
        for k in (3, 9):
            head, state = stop_after(make(items_pipe, 2), k)
            assert sum(shard.get("skip", 0) for shard in state["pass"][0]["shards"]) == k - 2
            again = make(items_pipe, 2)
            again.load_state_dict(state)
            assert head + [b.tolist() for b in again] == full

    def test_a_state_saved_at_the_end_of_an_epoch_starts_the_next(self):
        loader = make(items_pipe, 2)
        first = [b.tolist() for b in loader]
        state = loader.state_dict()
        second = [b.tolist() for b in loader]
        assert first != second
        again = make(items_pipe, 2)
        again.load_state_dict(state)
        assert [b.tolist() for b in again] == second

    def test_persistent_workers_resume_then_go_on_with_the_next_epoch(self):
        plain = make(items_pipe, 2, persistent_workers=True)
        epochs = [[b.tolist() for b in plain] for _ in range(2)]
        plain.close()
        head, state = stop_after(make(items_pipe, 2, persistent_workers=True), 4)
        with make(items_pipe, 2, persistent_workers=True) as again:
            again.load_state_dict(state)
            assert head + [b.tolist() for b in again] == epochs[0]
            assert [b.tolist() for b in again] == epochs[1]

    def test_a_timeout_buffer_ahead_of_the_user_is_not_counted(self):
        full = [b.tolist() for b in make(in_flight_pipe, 0, timeout=30)]
        for k in (1, 7):
            head, state = stop_after(make(in_flight_pipe, 0, timeout=30), k)
            again = make(in_flight_pipe, 0, timeout=30)
            again.load_state_dict(state)
            assert head + [b.tolist() for b in again] == full

    def test_state_dict_before_the_first_pass_of_a_loaded_loader_gives_the_loaded_state(self):
        _, state = stop_after(make(items_pipe, 2), 3)
        again = make(items_pipe, 2)
        again.load_state_dict(state)
        assert again.state_dict() == state

    def test_a_stage_that_cannot_save_is_named_when_the_state_is_asked_for(self):
        def one_shot():
            return IterableWrapper(x for x in range(N)).sharding_filter()

        loader = make(one_shot, 2)
        it = iter(loader)
        next(it)
        with pytest.raises(TypeError, match=r"shard \d of this rank: IterableWrapper.*cannot save its position"):
            loader.state_dict()
        assert len(flat(it)) > 0  # the pass itself goes on


class TestOtherLayouts:
    @pytest.mark.parametrize("name", sorted(PIPES))
    @pytest.mark.parametrize("before, after", [(2, 3), (2, 0), (0, 2), (3, 1)])
    def test_every_item_not_delivered_is_delivered_once(self, name, before, after):
        build = PIPES[name]
        everything = flat(make(build, 0))
        for k in (0, 2, 5):
            head, state = stop_after(make(build, before), k)
            again = make(build, after)
            again.load_state_dict(state)
            assert_exactly_once(flat(head) + flat(again), everything)

    def test_layouts_changed_twice_in_one_epoch(self):
        everything = flat(make(in_flight_pipe, 0))
        head, state = stop_after(make(in_flight_pipe, 2), 3)
        middle = make(in_flight_pipe, 3)
        middle.load_state_dict(state)
        it = iter(middle)
        head += [next(it).tolist() for _ in range(4)]
        state = pickle.loads(pickle.dumps(middle.state_dict()))
        it.close()
        assert all(len(s["main"]["stages"]) >= 1 for s in state["pass"][0]["shards"])
        last = make(in_flight_pipe, 1)
        last.load_state_dict(state)
        assert_exactly_once(flat(head) + flat(last), everything)

    def test_workers_that_skip_states_are_settled_before_the_split(self, monkeypatch):
        monkeypatch.setattr(shards, "SNAPSHOT_BUDGET", 0.0)
        everything = flat(make(in_flight_pipe, 0))
        head, state = stop_after(make(in_flight_pipe, 2), 5)
        again = make(in_flight_pipe, 3)
        again.load_state_dict(state)
        assert_exactly_once(flat(head) + flat(again), everything)

    def test_a_file_half_read_is_finished_by_one_new_worker(self, tmp_path):
        for f in range(5):
            (tmp_path / f"part{f}.txt").write_text("".join(f"{f}-{i}\n" for i in range(7)))

        def lines():
            return (FileLister(str(tmp_path)).sharding_filter().open_files(mode="r").readlines(return_path=False)
                    .map(str.strip))

        def loader(workers):
            return DataLoader(lines(), batch_size=3, seed=1, num_workers=workers, collate_fn=list,
                              multiprocessing_context="fork" if workers else None)

        everything = flat(loader(0))
        assert len(everything) == 35
        for before, after in [(2, 3), (3, 2), (2, 0)]:
            for k in (1, 4):
                it = iter(first := loader(before))
                head = [next(it) for _ in range(k)]
                state = pickle.loads(pickle.dumps(first.state_dict()))
                it.close()
                again = loader(after)
                again.load_state_dict(state)
                assert_exactly_once(flat(head) + flat(again), everything)

    def test_ranks_times_workers_to_one_rank_and_back(self, monkeypatch):
        everything = flat(make(items_pipe, 0))
        heads, states = [], []
        for rank in range(2):  # two ranks of 2 workers each save after 3 batches
            with monkeypatch.context() as m:
                m.setenv("RANK", str(rank))
                m.setenv("WORLD_SIZE", "2")
                head, state = stop_after(make(items_pipe, 2), 3)
            heads += head
            states.append(state)
        one = make(items_pipe, 3)  # one rank, 3 workers
        one.load_state_dict(states)
        it = iter(one)
        heads += [next(it).tolist() for _ in range(2)]
        state = pickle.loads(pickle.dumps(one.state_dict()))
        it.close()
        rests = []
        for rank in range(2):  # ... then two ranks again, of 1 worker each
            with monkeypatch.context() as m:
                m.setenv("RANK", str(rank))
                m.setenv("WORLD_SIZE", "2")
                again = make(items_pipe, 1)
                again.load_state_dict(state)
                rests += flat(again)
        assert_exactly_once(flat(heads) + rests, everything)


class TestRefusals:
    def test_one_ranks_state_does_not_resume_another_layout(self, monkeypatch):
        with monkeypatch.context() as m:
            m.setenv("RANK", "1")
            m.setenv("WORLD_SIZE", "2")
            _, state = stop_after(make(items_pipe, 2), 2)
        again = make(items_pipe, 2)
        again.load_state_dict(state)
        with pytest.raises(ValueError, match=r"saved by rank\(s\) \[1\] of 2 .* needs the state of every rank"):
            iter(again)

    def test_a_pipe_without_sharding_filter_cannot_be_split_again(self, monkeypatch):
        def whole():
            return IterableWrapper(range(N)).map(times_ten)

        with monkeypatch.context() as m:
            m.setenv("RANK", "0")
            m.setenv("WORLD_SIZE", "2")
            _, state0 = stop_after(make(whole, 0), 2)
            m.setenv("RANK", "1")
            _, state1 = stop_after(make(whole, 0), 2)
        again = make(whole, 0)
        again.load_state_dict([state0, state1])
        with pytest.raises(ValueError, match=r"has no sharding_filter\(\).*same num_workers and world size"):
            iter(again)

    def test_completion_order_above_the_filter_cannot_be_split_again(self):
        def unordered():
            return IterableWrapper(range(N)).map(slow_ten, concurrency=2, ordered=False).sharding_filter()

        _, state = stop_after(make(unordered, 2), 2)
        again = make(unordered, 3)
        again.load_state_dict(state)
        with pytest.raises(ValueError, match=r"Mapper\(slow_ten.*yields in completion order \(ordered=False\)"):
            iter(again)
        same = make(unordered, 2)  # with the same layout it resumes (exactly what was not delivered)
        same.load_state_dict(state)
        assert len(flat(same)) == N - 8

    def test_states_of_different_loaders_are_refused(self):
        _, a = stop_after(make(items_pipe, 2), 1)
        b = dict(a, seed=6)
        with pytest.raises(ValueError, match="disagree on the seed"):
            make(items_pipe, 2).load_state_dict([a, b])
        with pytest.raises(ValueError, match="not a state saved by DataLoader.state_dict"):
            make(items_pipe, 2).load_state_dict({"format": "datapipes.loader/1"})


_RESUME = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[3])
    from test_loader_state import make, items_pipe, flat
    loader = make(items_pipe, int(sys.argv[2]))
    loader.load_state_dict(torch.load(sys.argv[1], weights_only=False))
    print(json.dumps(flat(loader)))
""")


@pytest.mark.slow
def test_torch_save_then_resume_in_a_fresh_process(tmp_path):
    full = flat(make(items_pipe, 2))
    head, state = stop_after(make(items_pipe, 2), 5)
    path = tmp_path / "loader.pt"
    torch.save(state, path)
    here = os.path.dirname(__file__)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")])}
    for workers in (2, 3):
        out = subprocess.run([sys.executable, "-c", _RESUME, str(path), str(workers), here], capture_output=True,
                             text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        rest = json.loads(out.stdout.splitlines()[-1])
        if workers == 2:
            assert flat(head) + rest == full
        else:
            assert_exactly_once(flat(head) + rest, full)


def test_the_sharding_filter_a_loader_adds_for_its_workers_is_named(recwarn):
    def bare():
        return IterableWrapper(range(N)).map(times_ten)

    _, state = stop_after(make(bare, 2), 2)  # the loader adds sharding_filter() at the end (a warning)
    again = make(bare, 0)
    again.load_state_dict(state)
    with pytest.raises(ValueError, match=r"another shape .*put .sharding_filter\(\) in the pipe itself"):
        iter(again)
    again = make(bare, 3)  # with workers it has the same filter, and splits what is left
    again.load_state_dict(state)
    assert len(flat(again)) == N - 8
