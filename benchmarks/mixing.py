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
  stream still exact. (Ranks are not run here: a rank is another process group.)

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


SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {
    "deviation": bench_deviation, "overhead": bench_overhead, "resume": bench_resume}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=1_000_000)
    parser.add_argument("--points", type=int, default=500, help="states taken and resumed per layout change")
    parser.add_argument("--repeats", type=int, default=5)
    return _results.run_sections("mixing", parser, SECTIONS, WORKLOADS, FAILED, argv)


if __name__ == "__main__":
    sys.exit(main())
