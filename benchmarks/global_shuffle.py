"""The map-style shuffle over N indices: a seeded bijection computed a block at a time against the
permutation list it replaced, for time to the first item, indices per second and peak memory.

The source is a map-style pipe of ``N`` virtual items (``__getitem__`` returns its index, nothing
held), read by ``SequenceWrapper``'s way of reading: ``datapipe[i]`` for each ``i`` of the order.

- ``permutation list``, the baseline (the map-style ``shuffle`` up to this change, written out
  here): ``np.random.default_rng(seed).permutation(N).tolist()`` at ``iter()``, then
  ``map(datapipe.__getitem__, order)``: about 36 bytes an index, and nothing comes before the whole
  list is drawn.
- ``bijection``: ``datapipes.map.Shuffler`` (a Feistel network with cycle-walking over the
  positions, ``datapipes/map/_bijection.py``).

Workloads (``--only`` picks some):

- ``compare``: both, at each N of ``--sizes`` (default 10**6 and 10**7): the time from ``iter()`` to
  the first item, indices per second over a whole pass (``iter()`` included), and the peak memory
  that ``tracemalloc`` traces from ``iter()`` through the first ``--traced`` items (default
  10**6; the baseline's peak is its list, drawn at ``iter()``). Medians of ``--repeats``, each run
  with its own seed, the systems interleaved; ratios against the baseline.
- ``billion``: the bijection alone at ``--big`` (default 10**9) indices, where the baseline's list
  would take about 36 GB: first item, indices per second over the first ``--prefix`` (default
  10**7) items, peak memory over the first ``--traced`` items. Targets: peak under 1 MB, first
  item under 1 s.

    .venv/bin/python benchmarks/global_shuffle.py
    .venv/bin/python benchmarks/global_shuffle.py --only billion --prefix 1000000

``--json PATH`` writes the figures (benchmarks/_results.py's schema). Exit status 1 when a target is
missed.
"""

from __future__ import annotations

import argparse
import collections
import gc
import itertools
import os
import statistics
import sys
import time
import tracemalloc
from typing import Any, Callable, Iterator

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _results  # noqa: E402

from datapipes import MapDataPipe  # noqa: E402
from datapipes.map import Shuffler  # noqa: E402

WORKLOADS: list[dict[str, Any]] = []
FAILED: list[str] = []
BASELINE, OURS = "permutation list", "bijection"


def say(text: str = "") -> None:
    print(text, flush=True)


class Virtual(MapDataPipe[int]):
    """``n`` items, each its own index, held nowhere."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __getitem__(self, index: int) -> int:
        return index

    def __len__(self) -> int:
        return self.n


def permutation_list(dp: Virtual, seed: int) -> Iterator[int]:
    """The map-style shuffle's pass before the bijection: the whole order drawn as a list at ``iter()``."""
    return map(dp.__getitem__, np.random.default_rng(seed).permutation(len(dp)).tolist())


def bijection(dp: Virtual, seed: int) -> Iterator[int]:
    return iter(Shuffler(dp).set_seed(seed))


SYSTEMS: dict[str, Callable[[Virtual, int], Iterator[int]]] = {BASELINE: permutation_list, OURS: bijection}


def consume(it: Iterator[int], count: int) -> None:
    collections.deque(itertools.islice(it, count), maxlen=0)  # in C: nothing of ours per item


def first_item(open_: Callable[[Virtual, int], Iterator[int]], dp: Virtual, seed: int) -> float:
    """Seconds from ``iter()`` to the first item."""
    gc.collect()
    t = time.perf_counter()
    it = open_(dp, seed)
    next(it)
    return time.perf_counter() - t


def rate(open_: Callable[[Virtual, int], Iterator[int]], dp: Virtual, seed: int, count: int) -> float:
    """Indices per second over the first ``count`` items, ``iter()`` included."""
    gc.collect()
    t = time.perf_counter()
    it = open_(dp, seed)
    consume(it, count)
    return count / (time.perf_counter() - t)


def peak(open_: Callable[[Virtual, int], Iterator[int]], dp: Virtual, seed: int, count: int) -> int:
    """The peak bytes that tracemalloc traces from ``iter()`` through the first ``count`` items."""
    gc.collect()
    tracemalloc.start()
    try:
        it = open_(dp, seed)
        consume(it, count)
        return tracemalloc.get_traced_memory()[1]
    finally:
        del it
        tracemalloc.stop()


def warm_up() -> None:
    """Imports and first-use caches (numpy's SeedSequence, the pass machinery), once per process."""
    for open_ in SYSTEMS.values():
        consume(open_(Virtual(10_000), 0), 10_000)


def mb(n: float) -> str:
    return f"{n / 2**20:.2f} MB" if n < 2**30 else f"{n / 2**30:.2f} GB"


def measure(names: list[str], n: int, count: int, traced: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """``{system: {"first_s": [...], "rate": [...], "peak": [...]}}`` over ``repeats`` seeds, interleaved."""
    dp = Virtual(n)
    out: dict[str, dict[str, list[float]]] = {k: {"first_s": [], "rate": [], "peak": []} for k in names}
    for seed in range(repeats):
        for name in names:
            open_ = SYSTEMS[name]
            out[name]["first_s"].append(first_item(open_, dp, seed))
            out[name]["rate"].append(rate(open_, dp, seed, count))
            out[name]["peak"].append(peak(open_, dp, seed, traced))
    return out


def record(w: dict[str, Any], name: str, figures: dict[str, list[float]], base: dict[str, float] | None) -> dict[str, float]:
    med = {k: statistics.median(v) for k, v in figures.items()}
    extra: dict[str, Any] = {"first_item_s": med["first_s"], "peak_bytes": med["peak"], "runs_first_item_s": figures["first_s"],
                             "runs_peak_bytes": figures["peak"]}
    if base is not None:
        extra["first_item_speedup"] = base["first_s"] / med["first_s"]
        extra["memory_ratio"] = med["peak"] / base["peak"]
    w["systems"].append(_results.system(name, "datapipes" if name == OURS else "reference", med["rate"],
                                        runs=figures["rate"], baseline=None if base is None else base["rate"], **extra))
    return med


def bench_compare(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    for n in sizes:
        traced = min(n, args.traced)
        figures = measure([BASELINE, OURS], n, n, traced, args.repeats)
        w = {"name": f"compare_{n}", "title": f"map-style shuffle of {n:,} indices", "unit": "indices/s",
             "baseline": BASELINE, "systems": [], "targets": []}
        say(f"compare, N = {n:,}: medians of {args.repeats}; first item from iter(), indices/s over a whole pass "
            f"(iter() included), peak traced memory through the first {traced:,} items")
        say("| system | first item | indices/s | peak memory |")
        base = record(w, BASELINE, figures[BASELINE], None)
        ours = record(w, OURS, figures[OURS], base)
        for name, med in ((BASELINE, base), (OURS, ours)):
            say(f"| {name} | {med['first_s'] * 1e3:.2f} ms | {med['rate'] / 1e6:.1f} M | {mb(med['peak'])} |")
        say(f"bijection / list: time to the first item {ours['first_s'] / base['first_s']:.3g}x, indices/s "
            f"{ours['rate'] / base['rate']:.3g}x, peak memory {ours['peak'] / base['peak']:.3g}x")
        WORKLOADS.append(w)


def bench_billion(args: argparse.Namespace) -> None:
    n, count = args.big, min(args.big, args.prefix)
    traced = min(n, args.traced)
    figures = measure([OURS], n, count, traced, args.repeats)
    w = {"name": "billion", "title": f"map-style shuffle of {n:,} indices (the list would take ~{mb(36 * n)})",
         "unit": "indices/s", "baseline": None, "systems": [], "targets": []}
    med = record(w, OURS, figures[OURS], None)
    say(f"billion, N = {n:,} (a permutation list would hold about {mb(36 * n)}): medians of {args.repeats}")
    say(f"| bijection | first item {med['first_s'] * 1e3:.2f} ms | {med['rate'] / 1e6:.1f} M indices/s over the "
        f"first {count:,} | peak {mb(med['peak'])} through the first {traced:,} |")
    _results.target(w, FAILED, "peak memory under 1 MB", med["peak"], med["peak"] < 2**20)
    _results.target(w, FAILED, "first item under 1 s", med["first_s"], med["first_s"] < 1)
    WORKLOADS.append(w)


SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {"compare": bench_compare, "billion": bench_billion}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000,10000000", help="comma-separated N for compare")
    parser.add_argument("--big", type=int, default=10**9, help="N for billion")
    parser.add_argument("--prefix", type=int, default=10**7, help="items timed at --big")
    parser.add_argument("--traced", type=int, default=10**6, help="items read under tracemalloc")
    parser.add_argument("--repeats", type=int, default=3)
    warm_up()
    return _results.run_sections("global_shuffle", parser, SECTIONS, WORKLOADS, FAILED, argv)


if __name__ == "__main__":
    sys.exit(main())
