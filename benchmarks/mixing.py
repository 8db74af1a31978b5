"""Mixing sources in exact proportions (issue 40): how far a mixture's prefixes stray from their
shares, what a Mixer costs per item beside ``mux``, and resume across loader layouts.

Workloads (``--only`` picks some):

- ``deviation``: ``--draws`` (default 1,000,000) items from 5 in-memory sources for several weight
  vectors (uneven ones such as 1:17:2:5:75 included): the largest ``|drawn_i - w_i * n|`` over every
  prefix ``n`` and source ``i``, for ``exact=True`` (target: under 1 item; Tijdeman's bound is
  ``1 - 1/(2(k-1))``) and for seeded random draws (``exact=False``, SampleMultiplexer's way), whose
  drift grows like the square root of the prefix. By tokens (``by="tokens"``, items of 1 to 512
  tokens), the largest deviation in tokens against the stated bound ``(k - 1) * L`` (``L`` the
  longest item).
- ``overhead``: ns per item of ``Mixer`` over 5 ``IterableWrapper(range)`` sources beside
  ``mux`` over the same sources (target: at most 1 us more per item), medians of ``--repeats``.
- ``resume``: a ``Mixer`` (``stop="first_exhausted"``) followed by one ``sharding_filter`` in a
  ``datapipes.DataLoader``; states taken at ``--points`` random batches with 0 or 2 workers and
  resumed with the other layout: every item delivered exactly once, and the shares of the whole
  stream still exact.
- ``layouts``: each worker mixing its own shard of each source (every source below its own
  ``sharding_filter``): states taken at ``--points`` random positions with (workers, ranks) in
  (0, 1), (2, 1), (2, 2) and resumed with each other layout, the shards driven in this process as
  the loader's workers and ranks drive them: no item twice, none of what the new shards passed
  lost, and each new shard's mixture exact.

    .venv-bench/bin/python benchmarks/mixing.py
    .venv-bench/bin/python benchmarks/mixing.py --only deviation --draws 200000

``--json PATH`` writes the figures (benchmarks/_results.py's schema). Exit status 1 when a target is
missed.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from fractions import Fraction
from typing import Any, Callable

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _results  # noqa: E402

WEIGHTS = {"1:1:1:1:1": (1, 1, 1, 1, 1), "1:17:2:5:75": (1, 17, 2, 5, 75), "0.3:0.2:0.2:0.2:0.1": (0.3, 0.2, 0.2, 0.2, 0.1),
           "1:2:4:8:16": (1, 2, 4, 8, 16), "0.01:0.01:0.01:0.01:0.96": (0.01, 0.01, 0.01, 0.01, 0.96)}
NAMES = ("a", "b", "c", "d", "e")
WORKLOADS: list[dict[str, Any]] = []
FAILED: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)




def endless(tag: int) -> Any:
    from datapipes.iter import IterableWrapper

    return IterableWrapper(range(tag * 10**9, tag * 10**9 + 10**8), deepcopy=False)


def max_deviation(sources: np.ndarray, weights: tuple[float, ...], lengths: np.ndarray | None = None) -> float:
    """The largest |drawn_i - w_i * n| over every prefix n (by items), or in tokens with ``lengths``."""
    exact = [Fraction(w).limit_denominator(2**20) for w in weights]
    share = np.array([float(w / sum(exact)) for w in exact])
    worst = 0.0
    for i in range(len(weights)):
        if lengths is None:
            drawn = np.cumsum(sources == i)
            n = np.arange(1, sources.size + 1)
        else:
            drawn = np.cumsum(np.where(sources == i, lengths, 0))
            n = np.cumsum(lengths)
        worst = max(worst, float(np.abs(drawn - share[i] * n).max()))
    return worst


def bench_deviation(args: argparse.Namespace) -> None:
    from datapipes.iter import IterableWrapper, Mixer

    w = {"name": "deviation", "title": f"largest deviation of a prefix from its share, {args.draws:,} draws, "
         "5 sources", "unit": "items", "baseline": None, "systems": [], "targets": []}
    say(f"deviation: {args.draws:,} draws from 5 sources; the largest |drawn_i - w_i n| over every prefix n")
    say("| weights | exact=True | bound 1 - 1/(2(k-1)) | exact=False (seeded random) |")
    for label, weights in WEIGHTS.items():
        row: dict[str, float] = {}
        for exact in (True, False):
            mixer = Mixer({n: endless(k) for k, n in enumerate(NAMES)}, dict(zip(NAMES, weights)), exact=exact,
                          seed=None if exact else 0, with_source=True).header(args.draws)
            index = {n: k for k, n in enumerate(NAMES)}
            drawn = np.fromiter((index[name] for name, _ in mixer), np.int8, args.draws)
            row["exact" if exact else "random"] = max_deviation(drawn, weights)
        k = sum(1 for x in weights if x > 0)
        bound = 1 - 1 / (2 * (k - 1))
        say(f"| {label} | {row['exact']:.4f} | {bound:.4f} | {row['random']:.1f} |")
        w["systems"].append(_results.system(f"Mixer {label}", "datapipes", None, status="ok",
                                            exact_max_deviation=row["exact"], random_max_deviation=row["random"],
                                            bound=bound))
        _results.target(w, FAILED, f"{label}: exact prefixes within 1 item", row["exact"], row["exact"] < 1)
    # By tokens: items of 1 to 512 tokens, lengths drawn per source.
    rng = np.random.default_rng(0)
    n_tok = min(args.draws, 200_000)
    lens = [rng.integers(1, 513, n_tok) for _ in NAMES]
    sources = {n: IterableWrapper([np.zeros(int(x), np.int8) for x in lens[k]], deepcopy=False)
               for k, n in enumerate(NAMES)}
    weights = WEIGHTS["1:17:2:5:75"]
    mixer = Mixer(sources, dict(zip(NAMES, weights)), by="tokens", stop="first_exhausted", with_source=True)
    index = {n: k for k, n in enumerate(NAMES)}
    drawn, lengths = [], []
    for name, item in mixer:
        drawn.append(index[name])
        lengths.append(item.size)
    dev = max_deviation(np.array(drawn), weights, np.array(lengths))
    bound = (len(NAMES) - 1) * 512
    say(f"by tokens (1:17:2:5:75, items of 1-512 tokens, {len(drawn):,} draws): largest deviation {dev:.1f} tokens, "
        f"bound (k-1) L = {bound}")
    w["systems"].append(_results.system("Mixer by tokens 1:17:2:5:75", "datapipes", None, status="ok",
                                        tokens_max_deviation=dev, bound=bound))
    _results.target(w, FAILED, "by tokens: within (k-1) L", dev, dev <= bound)
    WORKLOADS.append(w)


def per_item(make: Callable[[], Any], n: int, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        it = iter(make())
        t = time.perf_counter()
        for _ in range(n):
            next(it)
        out.append((time.perf_counter() - t) / n * 1e9)
    return out


def bench_overhead(args: argparse.Namespace) -> None:
    from datapipes.iter import Mixer

    n = args.draws
    runs = {
        "mux": lambda: endless(0).mux(*[endless(k) for k in range(1, 5)]),
        "Mixer 1:1:1:1:1": lambda: Mixer({m: endless(k) for k, m in enumerate(NAMES)}, dict.fromkeys(NAMES, 1)),
        "Mixer 1:17:2:5:75": lambda: Mixer({m: endless(k) for k, m in enumerate(NAMES)},
                                           dict(zip(NAMES, WEIGHTS["1:17:2:5:75"]))),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.repeats):  # interleaved
        for k, make in runs.items():
            times[k] += per_item(make, n, 1)
    med = {k: statistics.median(v) for k, v in times.items()}
    w = {"name": "overhead", "title": f"ns per item, {n:,} items from 5 sources", "unit": "ns/item",
         "baseline": "mux", "systems": [], "targets": []}
    say(f"overhead: {n:,} items from 5 IterableWrapper(range) sources, medians of {args.repeats}")
    say("| system | ns/item | more than mux |")
    for k, v in med.items():
        say(f"| {k} | {v:.0f} | {v - med['mux']:+.0f} |")
        w["systems"].append(_results.system(k, "peer" if k == "mux" else "datapipes", None, status="ok",
                                            ns_per_item=v, runs_ns=times[k]))
    for k in runs:
        if k != "mux":
            _results.target(
                w, FAILED, f"{k}: at most 1 us per item more than mux", med[k] - med["mux"], med[k] - med["mux"] <= 1000)
    WORKLOADS.append(w)


def bench_resume(args: argparse.Namespace) -> None:
    import io

    import torch

    import datapipes
    from datapipes.iter import IterableWrapper, Mixer

    sizes = {"a": 300, "b": 1000, "c": 600}
    weights = {"a": 1, "b": 3, "c": 2}

    def pipe() -> Any:
        sources = {n: IterableWrapper([f"{n}{i}" for i in range(m)]) for n, m in sizes.items()}
        return Mixer(sources, weights, stop="first_exhausted").sharding_filter()

    def loader(workers: int) -> Any:
        return datapipes.DataLoader(pipe(), batch_size=8, num_workers=workers, collate_fn=list)

    whole = [x for b in loader(0) for x in b]
    rng = random.Random(0)
    w = {"name": "resume", "title": f"resume a mixture across layouts, {args.points} states", "unit": "states",
         "baseline": None, "systems": [], "targets": []}
    for before, after in ((0, 2), (2, 0)):
        bad = 0
        n_batches = len(list(loader(before)))
        for _ in range(args.points):
            k = rng.randrange(1, n_batches)
            first = loader(before)
            it = iter(first)
            got = [x for _, b in zip(range(k), it) for x in b]
            state = first.state_dict()
            del it, first
            buf = io.BytesIO()
            torch.save(state, buf)
            resumed = loader(after)
            resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
            got += [x for b in resumed for x in b]
            if sorted(got) != sorted(whole) or len(got) != len(whole):
                bad += 1
        say(f"resume, num_workers {before} -> {after}: {args.points - bad} of {args.points} resumed epochs deliver "
            f"every item of the mixture exactly once ({len(whole)} items)")
        w["systems"].append(_results.system(f"{before} -> {after} workers", "datapipes", None, status="ok",
                                            exact=args.points - bad, points=args.points))
        _results.target(w, FAILED, f"{before} -> {after} workers: every item once", args.points - bad, bad == 0)
    WORKLOADS.append(w)


LAYOUTS = ((0, 1), (2, 1), (2, 2))  # (num_workers, ranks)


def _layout(layout: tuple[int, int]) -> str:
    workers, ranks = layout
    return f"{workers}w x {ranks}r"


def bench_layouts(args: argparse.Namespace) -> None:
    """Each worker mixing its own shard of each source (every source below its own
    ``sharding_filter``, a 2-thread map reading ahead after it), states taken at ``--points`` random
    positions of a layout of (workers, ranks) and resumed with another. The shards are driven in
    this process as the loader's workers drive them (``ShardStream`` passes, ``plan`` resuming them,
    the state through ``torch.save``/``torch.load(weights_only=True)``), each shard of the old
    layout stopped at its own random item."""
    import io

    import torch

    from datapipes._runtime.passes import PassConfig
    from datapipes.iter import IterableWrapper, Mixer
    from datapipes.loader.shards import ShardStream, plan

    sizes = {"a": 240, "b": 720, "c": 480}
    weights = {"a": 1, "b": 3, "c": 2}
    order = {n: [f"{n}{i}" for i in np.random.default_rng(i).permutation(m)] for i, (n, m) in enumerate(sizes.items())}
    seed, epoch = 11, 0

    def pipe() -> Any:
        sources = {n: IterableWrapper(order[n]).sharding_filter().map(str, concurrency=2) for n in sizes}
        return Mixer(sources, weights, stop="first_exhausted")

    def shard_items(p: Any, count: int, index: int, state: Any, stop: int | None) -> tuple[list[Any], Any]:
        stream = ShardStream(p, PassConfig(seed, epoch, index, (count, index)), state)
        if stop == 0:
            return [], stream.state()
        items = stream.items()
        got = []
        try:
            for x in items:
                got.append((x, stream.in_tail))
                if stop is not None and len(got) == stop:
                    return got, stream.state()
            return got, stream.state()
        finally:
            items.close()

    p = pipe()
    lengths = {}
    for layout in LAYOUTS:
        count = max(layout[0], 1) * layout[1]
        lengths[layout] = [len(shard_items(p, count, i, None, None)[0]) for i in range(count)]
    pairs = [(a, b) for a in LAYOUTS for b in LAYOUTS if a != b]
    rng = random.Random(0)
    w = {"name": "layouts", "title": f"per-source sharding resumed with another layout, {args.points} states",
         "unit": "states", "baseline": None, "systems": [], "targets": []}
    results = {pair: [0, 0, 0.0, 0] for pair in pairs}  # points, good, worst deviation, tail items
    for point in range(args.points):
        before, after = pairs[point % len(pairs)]
        count = max(before[0], 1) * before[1]
        delivered: list[str] = []
        shards = []
        for i in range(count):
            got, state = shard_items(p, count, i, None, rng.randrange(0, lengths[before][i]))
            delivered += [x for x, _ in got]
            shards.append(state)
        per_rank = max(before[0], 1)
        saved = [{"layout": [before[1], r, per_rank], "shards": shards[r * per_rank:(r + 1) * per_rank], "next": 0,
                  "ended": False} for r in range(before[1])]
        buf = io.BytesIO()
        torch.save(saved, buf)
        saved = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
        new_count, new_per_rank = max(after[0], 1) * after[1], max(after[0], 1)
        reached: dict[str, list[int]] = {n: [] for n in sizes}
        deviation, tail = 0.0, 0
        for r in range(after[1]):
            states, _ = plan(pipe(), saved, (after[1], r, new_per_rank), seed, epoch)
            for j, state in enumerate(states):
                index = r * new_per_rank + j
                got, _ = shard_items(pipe(), new_count, index, state, None)
                delivered += [x for x, _ in got]
                tail += sum(in_tail for _, in_tail in got)
                main = [x for x, in_tail in got if not in_tail]
                if main:
                    deviation = max(deviation, max_deviation(
                        np.array([list(sizes).index(x[0]) for x in main], dtype=np.int64), tuple(weights.values())))
                for n in sizes:
                    pos = [order[n].index(x) for x in main if x[0] == n]
                    reached[n].append(max(pos, default=-1))
        seen = set(delivered)
        lost = sum(1 for n in sizes for x in order[n][:min(reached[n])] if x not in seen)
        res = results[(before, after)]
        res[0] += 1
        res[1] += int(len(seen) == len(delivered) and lost == 0)
        res[2] = max(res[2], deviation)
        res[3] += tail
    for (before, after), (points, good, deviation, tail) in results.items():
        if not points:
            continue
        label = f"{_layout(before)} -> {_layout(after)}"
        say(f"per-source sharding, {label}: {good} of {points} resumed epochs deliver every item once "
            f"(none twice, none of what the new shards passed lost), {tail} items finished by tails, each new "
            f"shard's mixture within {deviation:.3f} items of its shares")
        w["systems"].append(_results.system(label, "datapipes", None, status="ok", exact=good, points=points,
                                            tail_items=tail, max_deviation=round(deviation, 4)))
        _results.target(w, FAILED, f"{label}: every item once", good, good == points)
        _results.target(w, FAILED, f"{label}: new shards exact (under 1 item)", deviation, deviation < 1)
    WORKLOADS.append(w)


SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {
    "deviation": bench_deviation, "overhead": bench_overhead, "resume": bench_resume, "layouts": bench_layouts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=1_000_000)
    parser.add_argument("--points", type=int, default=500, help="states taken and resumed per layout change")
    parser.add_argument("--repeats", type=int, default=5)
    return _results.run_sections("mixing", parser, SECTIONS, WORKLOADS, FAILED, argv)


if __name__ == "__main__":
    sys.exit(main())
