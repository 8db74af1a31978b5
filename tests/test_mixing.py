"""Mixer: exact shares (Tijdeman's bound in items, a bound in tokens), stop modes, weights schedules,
statistics, nesting, and exact resume (serial at every item, and under the DataLoader)."""

import pickle
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datapipes import DataLoader
from datapipes.iter import IterableWrapper as W
from datapipes.iter import mixing
from datapipes.iter.mixing import Mixer
from datapipes.testing import check_resume

from helpers import plain_process  # noqa: F401 - an autouse fixture: no RANK/WORLD_SIZE from the environment

NAMES = "abcdefgh"


def endless(k):
    return {NAMES[i]: W(range(1_000_000)) for i in range(k)}


def drawn_sources(weights, n, **kw):
    """The source of each of the first ``n`` items of a mix of endless sources."""
    k = len(weights)
    pipe = Mixer(endless(k), dict(zip(NAMES, weights)), with_source=True, stop="never", **kw)
    it = iter(pipe)
    return [next(it)[0] for _ in range(n)]


def max_deviation(weights, sources):
    """max over prefixes and sources of |drawn_i - w_i n|, the weights taken as exact fractions."""
    fractions = [Fraction(w).limit_denominator(1 << 20) if float(Fraction(w).limit_denominator(1 << 20)) == w
                 else Fraction(w) for w in weights]
    total = sum(fractions)
    index = np.array([NAMES.index(s) for s in sources])
    worst = Fraction(0)
    n = np.arange(1, len(sources) + 1, dtype=object)
    for i, f in enumerate(fractions):
        counts = np.cumsum(index == i).astype(object)
        dev = max(abs(c - f / total * t) for c, t in zip(counts, n))
        worst = max(worst, dev)
    return worst


def bound(weights):
    k = sum(1 for w in weights if w)
    return Fraction(0) if k == 1 else 1 - Fraction(1, 2 * (k - 1))


class TestExactItems:
    @pytest.mark.parametrize("weights", [[1, 17, 2], [1, 17, 2, 5, 75], [0.3, 0.7], [1, 1, 1, 1, 1, 1, 1, 3.3]])
    def test_tijdeman_bound_on_known_vectors(self, weights):
        sources = drawn_sources(weights, 3000)
        dev = max_deviation(weights, sources)
        assert dev <= bound(weights) < 1, dev

    def test_the_lag_rule_vector_stays_within_the_bound_over_a_long_stream(self):
        counts = np.zeros(5, dtype=np.int64)
        src = mixing._Schedule((1, 17, 2, 5, 75))
        s, worst = [0] * 5, 0.0
        for start in range(0, 200_000, mixing.BLOCK):
            block, _ = src.block(start, s, mixing.BLOCK)
            cum = np.cumsum(np.eye(5, dtype=np.int64)[block], axis=0) + counts
            t = np.arange(start + 1, start + len(block) + 1)[:, None]
            worst = max(worst, float(np.abs(cum - t * np.array([1, 17, 2, 5, 75]) / 100).max()))
            counts = cum[-1]
        assert worst <= 0.875

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.one_of(st.integers(0, 40), st.floats(0.01, 5.0)), min_size=1, max_size=8)
           .filter(lambda ws: any(ws)))
    def test_every_prefix_is_within_the_bound(self, weights):
        sources = drawn_sources(weights, 400)
        assert max_deviation(weights, sources) <= bound(weights)
        for name, w in zip(NAMES, weights):
            if not w:
                assert name not in sources  # a weight of 0 is never drawn

    @settings(max_examples=25, deadline=None)
    @given(st.lists(st.integers(1, 30), min_size=2, max_size=6))
    def test_blocks_computed_without_a_period_are_the_same_draws(self, weights):
        m = sum(weights)
        periodic = mixing._Schedule(tuple(weights))
        s1, s2 = [0] * len(weights), [0] * len(weights)
        a, _ = periodic.block(5, s1, 3 * m)
        b = mixing._edf(tuple(weights), s2, 0, 3 * m + 5)[5:]
        assert a == b

    def test_draws_follow_the_weights_and_the_dict_order(self):
        pipe = Mixer({"a": W("abcdef"), "b": W("XYZ")}, {"a": 2, "b": 1}, stop="first_exhausted")
        assert "".join(pipe) == "aXbcYdeZf"
        assert "".join(Mixer({"a": W("ab"), "b": W("XY")}, {"a": 1, "b": 1}, stop="first_exhausted")) == "aXbY"


class TestTokens:
    @settings(max_examples=40, deadline=None)
    @given(st.lists(st.integers(1, 20), min_size=1, max_size=5),
           st.lists(st.integers(0, 12), min_size=1, max_size=30), st.randoms(use_true_random=False))
    def test_every_prefix_is_within_k_minus_one_longest_items(self, weights, lengths, rnd):
        k = len(weights)
        sources = {NAMES[i]: W([[0] * rnd.choice(lengths) for _ in range(40)]) for i in range(k)}
        pipe = Mixer(sources, dict(zip(NAMES, weights)), by="tokens", with_source=True, stop="never")
        total_w = sum(weights)
        tokens = [0] * k
        longest = 0
        it = iter(pipe)
        for _ in range(300):
            name, item = next(it)
            longest = max(longest, len(item))
            tokens[NAMES.index(name)] += len(item)
            total = sum(tokens)
            for i, w in enumerate(weights):
                dev = Fraction(w * total, total_w) - tokens[i]
                assert -(1 - Fraction(w, total_w)) * longest <= dev <= (k - 2 + Fraction(w, total_w)) * longest

    def test_tokens_of_dicts_and_len_fn(self):
        docs = W([{"tokens": [1] * 9}] * 10)
        short = W([{"tokens": [2]}] * 90)
        out = list(Mixer({"long": docs, "short": short}, {"long": 1, "short": 1}, by="tokens",
                         stop="first_exhausted", with_source=True))
        drawn = Counter(name for name, _ in out)
        assert drawn["long"] * 9 == pytest.approx(drawn["short"], abs=9)
        pipe = Mixer({"a": W(range(50)), "b": W(range(50))}, {"a": 1, "b": 1}, by="tokens",
                     len_fn=lambda x: 1 + x % 2, stop="first_exhausted")
        assert len(list(pipe)) > 0

    def test_random_token_draws_approach_the_shares(self):
        pipe = Mixer({"a": W([[0] * 8] * 10_000), "b": W([[0] * 2] * 10_000)}, {"a": 1, "b": 1}, exact=False,
                     by="tokens", seed=0, stop="first_exhausted", with_source=True)
        out = [name for name, _ in pipe][:3000]
        tokens = Counter({"a": 0, "b": 0})
        for name in out:
            tokens[name] += 8 if name == "a" else 2
        assert tokens["a"] / sum(tokens.values()) == pytest.approx(0.5, abs=0.05)


class TestStopAndSources:
    def test_first_exhausted_ends_at_the_draw_that_finds_a_source_ended(self):
        pipe = Mixer({"a": W(range(3)), "b": W(range(10, 100))}, {"a": 1, "b": 1}, stop="first_exhausted")
        assert list(pipe) == [0, 10, 1, 11, 2, 12] and len(pipe) == 6

    def test_all_exhausted_restarts_until_every_source_ended_once(self):
        pipe = Mixer({"a": W(range(2)), "b": W(range(10, 15))}, {"a": 1, "b": 1})
        assert list(pipe) == [0, 10, 1, 11, 0, 12, 1, 13, 0, 14, 1]

    def test_never_restarts_forever(self):
        pipe = Mixer({"a": W("ab"), "b": W("X")}, {"a": 1, "b": 1}, stop="never").header(9)
        assert "".join(pipe) == "aXbXaXbXa"

    def test_a_restarted_source_is_a_new_pass_of_it(self):
        shuffled = W(range(6)).shuffle()
        pipe = Mixer({"a": shuffled, "b": W(range(100, 200))}, {"a": 1, "b": 1}, stop="all_exhausted").set_seed(3)
        out = [x for x in pipe if x < 100]  # b's 100 items take 101 draws of a: 16 rounds and 5 items
        rounds = [out[i:i + 6] for i in range(0, 96, 6)]
        assert len(out) == 101 and all(sorted(r) == list(range(6)) for r in rounds)
        # each round is a new pass of the source: its shuffle draws a new order (Pass.reseed), the same
        # orders in every pass with this seed, and in a pass resumed mid-round
        assert len({tuple(r) for r in rounds}) > 8
        assert [x for x in pipe if x < 100] == out
        it = iter(pipe)
        head = [next(it) for _ in range(50)]
        state = it.state_dict()
        resumed = iter(pipe)
        resumed.load_state_dict(state)
        assert [x for x in head + list(resumed) if x < 100] == out

    def test_a_source_empty_once_restarted_is_named(self):
        pipe = Mixer({"a": W([]), "b": W(range(5))}, {"a": 1, "b": 1}, stop="never")
        with pytest.raises(ValueError, match="source 'a' yields no item once restarted"):
            list(pipe)
        assert list(Mixer({"a": W([]), "b": W(range(5))}, {"a": 1, "b": 1}, stop="first_exhausted")) == []

    def test_with_source_and_zero_weights(self):
        pipe = Mixer({"a": W("ab"), "z": W("Z"), "b": W("XY")}, {"a": 1, "z": 0, "b": 1}, with_source=True,
                     stop="first_exhausted")
        assert list(pipe) == [("a", "a"), ("b", "X"), ("a", "b"), ("b", "Y")]

    def test_random_draws_are_seeded_and_follow_the_weights(self):
        def build(seed):
            return Mixer(endless(2), {"a": 3, "b": 1}, exact=False, seed=seed, with_source=True).header(4000)
        a, b = list(build(1)), list(build(1))
        assert a == b and a != list(build(2))
        assert Counter(n for n, _ in a)["a"] / 4000 == pytest.approx(0.75, abs=0.03)

    def test_a_mixer_of_mixers(self):
        inner = Mixer({"x": W("xxxxxxxx"), "y": W("yyyyyyyy")}, {"x": 1, "y": 1}, stop="never")
        pipe = Mixer({"inner": inner, "c": W("c" * 100)}, {"inner": 2, "c": 1}, stop="first_exhausted").header(12)
        assert "".join(pipe) == "xcyxcyxcyxcy"
        check_resume(lambda: Mixer({"inner": Mixer({"x": W("xxxx"), "y": W("yy")}, {"x": 1, "y": 1}),
                                    "c": W("c" * 7)}, {"inner": 2, "c": 1}), ks=lambda n: range(n + 1))


class TestSchedule:
    def test_a_schedule_is_called_every_block_and_changes_the_shares(self, monkeypatch):
        monkeypatch.setattr(mixing, "BLOCK", 6)
        calls = []

        def curriculum(n):
            calls.append(n)
            return {"a": 1, "b": 0} if n < 12 else {"a": 0, "b": 1}

        pipe = Mixer({"a": W(range(100)), "b": W(range(100, 200))}, curriculum, stop="first_exhausted").header(18)
        assert list(pipe) == list(range(12)) + list(range(100, 106))
        assert calls == [0, 6, 12]

    def test_a_schedule_in_tokens_is_called_with_the_tokens(self, monkeypatch):
        monkeypatch.setattr(mixing, "BLOCK", 4)
        calls = []

        def weights(tokens):
            calls.append(tokens)
            return {"a": 1, "b": 1}

        list(Mixer({"a": W(["aa"] * 10), "b": W(["bbb"] * 10)}, weights, by="tokens", stop="first_exhausted").header(8))
        assert calls == [0, 10]  # 4 draws of 2 and 3 tokens; the 9th draw, never asked, would call it with 20

    def test_a_bad_schedule_result_names_the_count(self, monkeypatch):
        pipe = Mixer({"a": W(range(5)), "b": W(range(5))}, lambda n: {"a": 1}, stop="first_exhausted")
        with pytest.raises(ValueError, match=r"Mixer: weights\(0\) has no weight for 'b'"):
            list(pipe)


class TestErrors:
    @pytest.mark.parametrize("kwargs, error, words", [
        ({"weights": {"a": 1}}, ValueError, "no weight for 'b'"),
        ({"weights": {"a": 1, "b": 1, "c": 2}}, ValueError, "weights for 'c', which are no source"),
        ({"weights": {"a": 0, "b": 0.0}}, ValueError, "every weight is 0"),
        ({"weights": {"a": -1, "b": 1}}, ValueError, "the weight of 'a' must be a finite number >= 0, got -1"),
        ({"weights": {"a": float("nan"), "b": 1}}, ValueError, "the weight of 'a' must be a finite number"),
        ({"weights": {"a": "1", "b": 1}}, TypeError, "the weight of 'a' must be a number, got str"),
        ({"weights": [1, 2]}, TypeError, "weights must be a dict of source names to weights"),
        ({"stop": "longest"}, ValueError, "stop must be one of 'first_exhausted', 'all_exhausted', 'never'"),
        ({"by": "bytes"}, ValueError, "by must be one of 'items', 'tokens', got 'bytes'"),
        ({"len_fn": len}, ValueError, "len_fn counts an item's tokens: it needs by='tokens'"),
        ({"seed": 3}, ValueError, "seed seeds the random draws of exact=False"),
        ({"exact": "yes"}, TypeError, "exact must be a bool"),
        ({"sources": {"a": [1, 2]}}, TypeError, r"sources\['a'\] must be an IterDataPipe, got list"),
        ({"sources": {}}, ValueError, "sources is empty"),
        ({"sources": {1: W([1])}, "weights": {1: 1}}, TypeError, "the names of sources must be str"),
    ])
    def test_arguments(self, kwargs, error, words):
        args = {"sources": {"a": W([1]), "b": W([2])}, "weights": {"a": 1, "b": 1}, **kwargs}
        with pytest.raises(error, match=words):
            Mixer(args.pop("sources"), args.pop("weights"), **args)

    def test_len_is_known_only_when_exact_in_items_and_first_exhausted(self, monkeypatch):
        two = {"a": W(range(7)), "b": W(range(30))}
        pipe = Mixer(two, {"a": 1, "b": 3}, stop="first_exhausted")
        assert len(pipe) == len(list(pipe)) == 29
        monkeypatch.setattr(mixing, "PERIOD_LIMIT", 0)  # the walk without a cached period
        assert len(Mixer(two, {"a": 1, "b": 3}, stop="first_exhausted")) == 29
        for kw, why in [({}, "restarts ended sources"), ({"stop": "first_exhausted", "exact": False}, "random"),
                        ({"stop": "first_exhausted", "by": "tokens"}, "tokens")]:
            with pytest.raises(TypeError, match=why):
                len(Mixer(two, {"a": 1, "b": 1}, **kw))
        with pytest.raises(TypeError, match="schedule"):
            len(Mixer(two, lambda n: {"a": 1, "b": 1}, stop="first_exhausted"))
        with pytest.raises(TypeError, match=r"sources\['a'\]"):
            len(Mixer({"a": W(iter([1])), "b": W([2])}, {"a": 1, "b": 1}, stop="first_exhausted"))

    def test_len_fn_results_are_checked(self):
        pipe = Mixer({"a": W(range(3))}, {"a": 1}, by="tokens", len_fn=lambda x: -1)
        with pytest.raises(ValueError, match="len_fn returned -1 for item 0 .from source 'a'"):
            list(pipe)


class TestShares:
    def test_shares_of_the_latest_pass_live(self):
        pipe = Mixer({"a": W(range(100)), "b": W(range(100))}, {"a": 3, "b": 1}, stop="first_exhausted")
        assert pipe.shares is None
        it = iter(pipe)
        for _ in range(8):
            next(it)
        assert pipe.shares == {"a": {"drawn": 6, "share": 0.75, "target": 0.75},
                               "b": {"drawn": 2, "share": 0.25, "target": 0.25}}
        tokens = Mixer({"a": W(["xx"] * 4), "b": W(["y"] * 4)}, {"a": 1, "b": 1}, by="tokens", stop="first_exhausted")
        list(tokens)
        assert tokens.shares["a"]["tokens"] == 2 * tokens.shares["a"]["drawn"]
        assert tokens.shares["a"]["target"] == 0.5

    def test_live_statistics_and_profile_show_the_shares(self):
        import io

        from datapipes import profile

        def mixture():
            return Mixer({"web": W(range(1000)), "code": W(range(1000))}, {"web": 7, "code": 3},
                         stop="first_exhausted").map(lambda x: x)

        out = io.StringIO()
        report = profile(mixture(), 100, file=out)
        (row,) = [r for r in report.stages if r["shares"]]
        assert row["shares"] == {"web": {"drawn": 70, "share": 0.7, "target": 0.7},
                                 "code": {"drawn": 30, "share": 0.3, "target": 0.3}}
        assert "Mixer({'web': 7, 'code': 3}): shares of the items drawn: web 70.0% (target 70.0%), " \
               "code 30.0% (target 30.0%)" in out.getvalue()
        # the statistics of an observed pass read them live, and pickle them as plain data
        from datapipes.hooks import Hook

        it = iter(mixture().add_hook(Hook()))
        for _ in range(10):
            next(it)
        found = [st for _, st in it.stats() if st.shares]
        assert found and found[0].shares["web"]["drawn"] == 7
        from datapipes.hooks import format_stats

        assert format_stats(it.stats()).splitlines()[-1] == (
            "Mixer({'web': 7, 'code': 3}): shares web 70.0% (target 70.0%), code 30.0% (target 30.0%)")
        again = pickle.loads(pickle.dumps(found[0]))
        assert again.shares == found[0].shares and again.shares_of is None

    def test_a_mixer_is_freed_with_its_pass(self):
        import gc
        import weakref

        pipe = Mixer({"a": W(range(10)), "b": W(range(10))}, {"a": 1, "b": 1})
        list(pipe)
        assert pipe.shares is not None
        ref = weakref.ref(pipe)
        del pipe
        gc.collect()
        assert ref() is None


# -- resume ----------------------------------------------------------------------------------------


def build(stop, exact, by, named=False, schedule=False):
    sources = {"a": W(range(7)).shuffle(), "b": W([f"x{i}" for i in range(5)]),
               "c": W([(i,) * (i % 4 + 1) for i in range(6)])}
    weights = {"a": 1, "b": 2.5, "c": 0.5}
    if schedule:
        weights = lambda n: {"a": 1 + n % 3, "b": 2, "c": 1}  # noqa: E731 - called every BLOCK draws
    kw = {"len_fn": lambda x: len(str(x))} if by == "tokens" else {}
    if not exact:
        kw["seed"] = 3
    pipe = Mixer(sources, weights, exact=exact, by=by, stop=stop, with_source=named, **kw)
    return (pipe.header(60) if stop == "never" else pipe).set_seed(1)


class TestResume:
    @pytest.mark.parametrize("stop", ["first_exhausted", "all_exhausted", "never"])
    @pytest.mark.parametrize("exact", [True, False])
    @pytest.mark.parametrize("by", ["items", "tokens"])
    def test_every_item(self, stop, exact, by, monkeypatch):
        monkeypatch.setattr(mixing, "BLOCK", 5)  # blocks, schedule calls and random blocks cross the pass
        check_resume(lambda: build(stop, exact, by, named=True, schedule=stop == "never"), ks=lambda n: range(n + 1))

    @pytest.mark.parametrize("exact", [True, False])
    def test_every_item_without_a_cached_period(self, exact, monkeypatch):
        monkeypatch.setattr(mixing, "PERIOD_LIMIT", 0)
        monkeypatch.setattr(mixing, "BLOCK", 7)
        check_resume(lambda: build("all_exhausted", exact, "items"), ks=lambda n: range(n + 1))

    def test_every_item_with_the_real_block(self):
        for exact in (True, False):
            check_resume(lambda: build("all_exhausted", exact, "items"), ks=lambda n: range(n + 1), through="torch")

    def test_a_state_after_the_end_resumes_to_nothing(self):
        pipe = Mixer({"a": W(range(3)), "b": W(range(10))}, {"a": 1, "b": 1}, stop="first_exhausted")
        it = iter(pipe)
        assert list(it) == [0, 0, 1, 1, 2, 2]
        state = it.state_dict()
        again = iter(Mixer({"a": W(range(3)), "b": W(range(10))}, {"a": 1, "b": 1}, stop="first_exhausted"))
        again.load_state_dict(state)
        assert list(again) == []

    @pytest.mark.parametrize("change, words", [
        (lambda s: s.update(drawn=-1), r"state\['drawn'\] must be an int >= 0"),
        (lambda s: s.update(counts=[1, 2]), r"state\['counts'\] must hold an int >= 0 per source"),
        (lambda s: s.update(counts=[9, 0, 0]), r"state\['counts'\] must add up to 4"),
        (lambda s: s.update(counts=[4, 0, 0]), r"are not the schedule's at draw 4"),
        (lambda s: s.update(done="no"), r"state\['done'\] must be a bool"),
        (lambda s: s.update(restarts=None), r"state\['restarts'\] must be a list"),
        (lambda s: s.pop("counts"), r"the state has no 'counts'"),
    ])
    def test_a_hostile_state_is_refused_naming_the_stage(self, change, words):
        it = iter(build("all_exhausted", True, "items"))
        for _ in range(4):
            next(it)
        state = it.state_dict()
        (key,) = [k for k in state["stages"] if "Mixer" in k]
        change(state["stages"][key])
        again = iter(build("all_exhausted", True, "items"))
        with pytest.raises(ValueError, match=f"Mixer.*{words}"):
            again.load_state_dict(state)

    def test_a_hostile_generator_state_is_refused(self):
        it = iter(build("all_exhausted", False, "items"))
        next(it)
        state = it.state_dict()
        (key,) = [k for k in state["stages"] if "Mixer" in k]
        state["stages"][key]["rng"] = [1 << 200, 1]
        with pytest.raises(ValueError, match=r"Mixer.*state\['rng'\] must be two ints"):
            iter(build("all_exhausted", False, "items")).load_state_dict(state)


# -- under the DataLoader --------------------------------------------------------------------------


pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def sharded_sources():
    return Mixer({"a": W(range(40)).shuffle().sharding_filter(), "b": W(range(100, 130)).sharding_filter()},
                 {"a": 2, "b": 1}, stop="first_exhausted")


def sharded_after():
    return Mixer({"a": W(range(40)).shuffle(), "b": W(range(100, 130))}, {"a": 2, "b": 1},
                 stop="first_exhausted").sharding_filter()


def loader(build_, workers):
    kw = {"multiprocessing_context": "fork"} if workers else {}
    return DataLoader(build_(), batch_size=3, seed=5, num_workers=workers, **kw)


def stop_after(dl, k):
    it = iter(dl)
    head = [b.tolist() if hasattr(b, "tolist") else b for b in (next(it) for _ in range(k))]
    state = pickle.loads(pickle.dumps(dl.state_dict()))
    it.close()
    return head, state


def flat(batches):
    return [x for b in batches for x in (b.tolist() if hasattr(b, "tolist") else b)]


class TestLoader:
    def test_each_worker_mixes_its_shards_and_resumes_exactly(self):
        full = [b.tolist() for b in loader(sharded_sources, 2)]
        assert sorted(flat(full)) == sorted(list(range(40)) + list(range(100, 120)))
        for k in (0, 3, len(full)):
            head, state = stop_after(loader(sharded_sources, 2), k)
            again = loader(sharded_sources, 2)
            again.load_state_dict(state)
            assert head + [b.tolist() for b in again] == full, k

    def test_one_sharding_filter_after_the_mix_splits_again(self):
        everything = flat(loader(sharded_after, 0))
        for k in (0, 2, 5):
            head, state = stop_after(loader(sharded_after, 2), k)
            again = loader(sharded_after, 1)
            again.load_state_dict(state)
            got = flat(head) + flat(again)
            assert sorted(got) == sorted(everything) and max(Counter(got).values()) == 1, k


# -- each worker mixing its own shard of each source, resumed with another layout -------------------


def _tag(x):
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    return x, 0 if info is None else info.id


A_ORDER = [int(x) for x in np.random.default_rng(3).permutation(60)]
SOURCES = [A_ORDER, list(range(100, 130))]


def per_source(concurrency=None):
    """Two sources, each below its own sharding_filter; a map that reads ahead (``concurrency``)
    between the filter and the mixture holds items a change of layout must not lose."""
    def build():
        a = W(A_ORDER).sharding_filter()
        b = W(range(100, 130)).sharding_filter()
        if concurrency:
            a, b = a.map(lambda x: x, concurrency=concurrency), b.map(lambda x: x, concurrency=concurrency)
        return Mixer({"a": a, "b": b}, {"a": 2, "b": 1}, stop="first_exhausted").map(_tag)
    return build


def tagged_loader(build_, workers):
    kw = {"multiprocessing_context": "fork"} if workers else {}
    return DataLoader(build_(), batch_size=2, seed=5, num_workers=workers, collate_fn=list, **kw)


def assert_split_again(before, after, sources):
    """No item twice, and none lost: an item of a source below what every new shard reached of it
    (each shard reads its share of a source in order) was delivered."""
    got = [x for x, _ in before + after]
    assert max(Counter(got).values()) == 1
    delivered = set(got)
    for items in sources:
        index = {x: i for i, x in enumerate(items)}
        reached = {}
        for x, shard in after:
            if x in index:
                reached[shard] = max(reached.get(shard, -1), index[x])
        frontier = min(reached.values(), default=-1)
        lost = [x for x in items[:frontier] if x not in delivered]
        assert not lost, lost


class TestPerSourceSharding:
    def test_another_number_of_workers_splits_each_source_again(self):
        for before, after_, k in ((2, 1, 2), (2, 3, 4), (0, 2, 5), (3, 2, 1)):
            head, state = stop_after(tagged_loader(per_source(), before), k)
            again = tagged_loader(per_source(), after_)
            again.load_state_dict(state)
            rest = [tuple(x) for b in again for x in b]
            assert_split_again([tuple(x) for b in head for x in b], rest, SOURCES)
            # the new shards mix exactly: each delivers a's and b's items 2:1 within one item
            for shard in {s for _, s in rest}:
                mine = [x for x, s in rest if s == shard]
                assert abs(sum(x < 100 for x in mine) - 2 * len(mine) / 3) <= 2, (before, after_, k, shard)

    def test_the_work_in_flight_is_finished_by_a_tail(self):
        # a map with 4 threads after each filter: a shard saved mid-pass holds up to 4 items of
        # each source taken and not yet mixed; the tail (its filters closed) delivers them
        for before, after_, k in ((2, 1, 3), (1, 2, 4)):
            head, state = stop_after(tagged_loader(per_source(concurrency=4), before), k)
            again = tagged_loader(per_source(concurrency=4), after_)
            again.load_state_dict(state)
            rest = [tuple(x) for b in again for x in b]
            assert_split_again([tuple(x) for b in head for x in b], rest, SOURCES)

    def test_a_restarted_sharded_source_is_refused_naming_it(self):
        def build():
            return Mixer({"a": W(range(4)).sharding_filter(), "b": W(range(100, 140)).sharding_filter()},
                         {"a": 1, "b": 1})
        _, state = stop_after(tagged_loader(build, 2), 6)  # a (2 items a shard) has restarted
        again = tagged_loader(build, 1)
        again.load_state_dict(state)
        with pytest.raises(ValueError, match=r"restarted its sharded source\(s\) 'a' \(\d+ times?\).*Mixer\(\.\.\.\)"
                                             r"\.sharding_filter\(\)"):
            iter(again)

    def test_a_zip_of_sharded_branches_is_refused_naming_it(self):
        def build():
            return W(range(20)).sharding_filter().zip(W(range(20)).sharding_filter())
        _, state = stop_after(tagged_loader(build, 2), 2)
        again = tagged_loader(build, 1)
        again.load_state_dict(state)
        with pytest.raises(ValueError, match=r"Zipper.*joins 2 branches each below its own sharding_filter"):
            iter(again)

    def test_a_sharding_filter_above_another_is_refused(self):
        def build():
            return W(range(40)).sharding_filter().map(lambda x: x).sharding_filter()
        _, state = stop_after(tagged_loader(build, 2), 2)
        again = tagged_loader(build, 1)
        again.load_state_dict(state)
        with pytest.raises(ValueError, match="is above another sharding stage"):
            iter(again)

    def test_a_tail_state_saved_mid_tail_resumes(self):
        # a state taken while a tail drains (the second relayout) is itself resumed: nothing twice
        head, state = stop_after(tagged_loader(per_source(concurrency=4), 2), 3)
        middle = tagged_loader(per_source(concurrency=4), 1)
        middle.load_state_dict(state)
        it = iter(middle)
        first = [tuple(x) for _ in range(2) for x in next(it)]
        state2 = pickle.loads(pickle.dumps(middle.state_dict()))
        it.close()
        last = tagged_loader(per_source(concurrency=4), 3)
        last.load_state_dict(state2)
        rest = [tuple(x) for b in last for x in b]
        got = [x for b in head for x in b] + [x for x, _ in first] + [x for x, _ in rest]
        assert max(Counter(got).values()) == 1
        assert_split_again([tuple(x) for b in head for x in b] + first, rest, SOURCES)


@pytest.mark.slow
def test_a_restarting_shuffled_mixture_resumes_with_another_number_of_workers():
    # One sharding_filter after the mixture; source "a" restarts 7 times, its shuffle drawing a new
    # order each round (Pass.reseed), and a side pass that reads the stages above the filter again
    # from the epoch's start replays those rounds (their first seeds): every draw comes once.
    import torch

    import datapipes

    def loader(workers):
        a = W(list(range(5))).shuffle()
        pipe = Mixer({"a": a, "b": W(list(range(100, 140)))}, {"a": 1, "b": 1}).sharding_filter()
        return datapipes.DataLoader(pipe, batch_size=4, num_workers=workers, collate_fn=list,
                                    generator=torch.Generator().manual_seed(0))

    whole = [x for batch in loader(0) for x in batch]
    rounds = [tuple(x for x in whole if x < 100)[i:i + 5] for i in range(0, 40, 5)]
    assert len(whole) == 81 and len(set(rounds)) > 1  # b's 40 items and 41 draws of a
    for before, after, k in ((2, 3, 5), (0, 2, 7)):
        first = loader(before)
        it = iter(first)
        got = [x for _, batch in zip(range(k), it) for x in batch]
        state = first.state_dict()
        del it, first
        resumed = loader(after)
        resumed.load_state_dict(state)
        got += [x for batch in resumed for x in batch]
        assert sorted(got) == sorted(whole), (before, after, k)
