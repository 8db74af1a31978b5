"""Autotuning benchmark (``concurrency="auto"``): the tuner against a sweep of fixed concurrencies.

    .venv-bench/bin/python benchmarks/autotune.py                  # all three workloads, 3 repeats
    .venv-bench/bin/python benchmarks/autotune.py --only io --repeats 5
    .venv-bench/bin/python benchmarks/autotune.py --quick           # a smoke run (seconds)
    .venv-bench/bin/python benchmarks/autotune.py --json results/autotune.json

Each workload runs the same pipe with every fixed ``concurrency`` of a sweep and with
``concurrency="auto"``, side by side in one run, interleaved repeat by repeat (drift hits all
alike); the figures are medians over the repeats. Before each fresh-process run the script waits
(up to ``--wait-idle`` seconds) for the machine to be idle, as ``end_to_end.py`` does. Every ``auto`` run is a fresh pass, so the tuner
starts from scratch each time and its exploration is inside the clock. Rows:

- each fixed concurrency of the sweep, the best of them marked;
- the tf.data-style fixed guess, ``concurrency = usable CPUs`` (what a fixed ``AUTOTUNE`` default
  picks without measuring);
- ``concurrency="auto"``: its throughput as a share of the sweep's best and of the guess, and
  where the tuner settled (the stage's ``stats.workers`` and ``stats.tuning`` at the end).

Workloads:

- decode: Pillow decode + resize to 224x224 of in-memory ~500x375 JPEGs (the workload of
  ``concurrency.py``), 2,000 images a run, each run in a fresh process (the clock starts when the
  JPEGs are in memory), so no run inherits another's allocator state or thread pools.
- process: the same decode on worker processes (``executor="process"``): ``auto`` starts one
  process per CPU and is tuned within them; each run starts its pool inside the clock.
- e2e: the end-to-end image pipeline of ``end_to_end.py`` (a generated JPEG folder -> read ->
  decode/resize -> batch 32 -> uint8 tensor), 1,000 images, each run in a fresh process
  (``--malloc tuned`` pins ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` there).
- io: ``fn`` sleeps 2 ms per item, then, from ``--switch`` seconds on, 20 ms; the consumer spends
  1 ms of its own per item (a sleep), so it takes at most ~900 items/s: about 2 workers keep up
  with it at 2 ms and about 20 at 20 ms. Each run lasts ``--switch + --after`` seconds. Besides the
  throughput over the whole run and over each phase, the auto rows give the *re-tune time*: from
  the latency change until the throughput over a 0.5 s window is back within 90% of the new
  steady state, taken as the best fixed concurrency's rate at 20 ms (what the tuner can reach;
  a tuner stuck at a poor setting never gets there), and the workers it chose over time.

Targets (printed PASS/FAIL): on decode, process and e2e, ``auto`` >= 95% of the sweep's best fixed
concurrency; on io, ``auto`` re-tunes within 3 s. No torch call sits in a measuring loop.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _results  # noqa: E402

AUTO = "auto"
TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "268435456"}
WORKLOADS: dict[str, dict[str, Any]] = {}
OK = [True]
WAIT_IDLE = [0.0]  # seconds to wait for an idle machine before each fresh-process run


def usable_cpus() -> int:
    """The CPUs this process may use, counted as the library counts them (``os.process_cpu_count``
    where Python has it, else the affinity mask, else ``os.cpu_count``)."""
    from datapipes._runtime.tuning import usable_cpus as library_count  # imported late: torch comes with it

    return library_count()


def cpu_sweep(cores: int) -> list[int]:
    """Fixed concurrencies to try for CPU-bound work on ``cores`` CPUs (the guess, ``cores``, included)."""
    return sorted({1, 2, 4, max(1, cores // 2), cores, cores + max(1, cores // 2), 2 * cores})


def label(c: int | str) -> str:
    return "datapipes map(concurrency='auto')" if c == AUTO else f"datapipes map(concurrency={c})"


def auto_stats(it: Any) -> dict[str, Any]:
    """The auto stage's workers and last tuning decision at the end of a pass, from ``it.stats()``."""
    for _, s in it.stats():
        if getattr(s, "auto", False):
            return {"workers": s.workers, "tuning": s.tuning}
    return {}


def interleaved(runs: dict[Any, Callable[[], dict[str, Any]]], repeats: int) -> dict[Any, list[dict[str, Any]]]:
    """Each run's result dict in every repeat, the runs interleaved repeat by repeat."""
    out: dict[Any, list[dict[str, Any]]] = {k: [] for k in runs}
    for r in range(repeats):
        for key, run in runs.items():
            out[key].append(run())
        print(f"  repeat {r + 1}/{repeats} done", file=sys.stderr, flush=True)
    return out


def report(name: str, title: str, unit: str, n_of: Callable[[dict[str, Any]], float],
           results: dict[Any, list[dict[str, Any]]], cores: int, extra: Callable[[Any, list[dict[str, Any]]], str]
           = lambda c, rows: "") -> dict[str, float]:
    """Print the sweep's table and the auto row; record them for --json. Returns throughput by key."""
    rate = {c: statistics.median(n_of(r) / r["seconds"] for r in rows) for c, rows in results.items()}
    fixed = {c: v for c, v in rate.items() if c != AUTO}
    best = max(fixed, key=lambda c: fixed[c])
    guess = cores if cores in fixed else min(fixed, key=lambda c: abs(c - cores))
    WORKLOADS[name] = {"name": name, "title": title, "unit": unit, "baseline": label(best), "systems": [],
                       "targets": []}
    print(f"  {'system':<44} {unit:>12}  vs best fixed", flush=True)
    for c, v in rate.items():
        rows = results[c]
        tags = []
        if c == best:
            tags.append("best fixed")
        if c == guess:
            tags.append(f"tf.data-style guess: concurrency = CPUs ({cores})")
        note = ", ".join(tags)
        if c == AUTO:
            workers = [r.get("workers") for r in rows]
            note = (f"{v / fixed[best]:.1%} of the best fixed (concurrency={best}), {v / fixed[guess]:.1%} of the "
                    f"guess; settled at {workers} workers: {rows[-1].get('tuning', '')!r}")
        more = extra(c, rows)
        print(f"  {label(c):<44} {v:>12,.1f}  {v / fixed[best]:>6.1%}  {note}{more}", flush=True)
        role = "datapipes" if c == AUTO else "reference"
        fields: dict[str, Any] = {"concurrency": c, "seconds": statistics.median(r["seconds"] for r in rows)}
        if c == AUTO:
            fields.update(workers=[r.get("workers") for r in rows], tuning=[r.get("tuning") for r in rows])
        for key in ("phase1", "phase2", "retune_s", "timeline"):
            if key in rows[0]:
                vals = [r[key] for r in rows]
                fields[key] = vals if key == "timeline" else (
                    statistics.median(vals) if all(x is not None for x in vals) else vals)
        WORKLOADS[name]["systems"].append(_results.system(
            label(c), role, v, runs=[n_of(r) / r["seconds"] for r in rows], note=note, **fields))
    _results.add_ratios(WORKLOADS[name])
    return rate


def target(name: str, text: str, value: float, passed: bool) -> None:
    OK[0] &= passed
    print(f"  {'PASS' if passed else 'FAIL'}  {text}", flush=True)
    WORKLOADS[name]["targets"].append({"text": text, "value": value, "passed": passed})


# -- (a) Pillow decode, in this process -------------------------------------------------------------------


def decode_child(n: int, c: int | str, executor: str = "thread") -> dict[str, Any]:
    """One decode run in this (fresh) process: ``n`` in-memory JPEGs through ``map(decode, concurrency=c)``
    on threads, or on worker processes (``executor="process"``: their start is inside the clock)."""
    from benchmarks.concurrency import decode, make_jpegs
    from datapipes.iter import IterableWrapper

    pool = make_jpegs(32)
    items = [pool[k % len(pool)] for k in range(n)]
    decode(items[0])
    t = time.perf_counter()
    it = iter(IterableWrapper(items).map(decode, concurrency=c, executor=executor))
    count = sum(1 for _ in it)
    out = {"seconds": time.perf_counter() - t, "items": count}
    out.update(auto_stats(it))
    return out


def child_run(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run this script with ``--child ...`` in a fresh process (after waiting for an idle machine);
    return what it printed."""
    if WAIT_IDLE[0] > 0:
        from benchmarks.end_to_end import wait_idle

        wait_idle(WAIT_IDLE[0])
    cmd = [sys.executable, os.path.abspath(__file__), "--child", *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{r.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def bench_decode(n: int, repeats: int, sweep: list[int], cores: int, name: str = "decode") -> None:
    where = "worker processes (executor='process')" if name == "process" else "threads"
    print(f"\n{name}: {n:,} JPEG decode + resize to 224x224 on {where}, fixed {sweep} and 'auto' ({cores} CPUs), a "
          "fresh process per run", flush=True)
    runs: dict[Any, Callable[[], dict[str, Any]]] = {
        c: (lambda c=c: child_run([name, "--images", str(n), "--concurrency", str(c)])) for c in [*sweep, AUTO]}
    results = interleaved(runs, repeats)
    rate = report(name, f"{name}: {n:,} JPEG decode + resize on {where}, fixed concurrency sweep vs 'auto'",
                  "images/s", lambda r: r["items"], results, cores)
    best = max(v for c, v in rate.items() if c != AUTO)
    target(name, f"'auto' >= 95% of the best fixed concurrency: {rate[AUTO] / best:.1%}", rate[AUTO] / best,
           rate[AUTO] >= 0.95 * best)


# -- (b) the end-to-end image pipeline, a fresh process per run ----------------------------------------------


def e2e_child(root: str, c: int | str) -> dict[str, Any]:
    """One end-to-end run in this (fresh) process: the pipeline of end_to_end.py with ``concurrency=c``."""
    import warnings

    warnings.filterwarnings("ignore")
    import numpy  # noqa: F401 - imports before the clock, as in end_to_end.py
    import torch  # noqa: F401
    from PIL import Image, JpegImagePlugin  # noqa: F401

    from benchmarks.end_to_end import BATCH, load_pair
    from datapipes.iter import FileLister

    Image.init()
    t0 = time.perf_counter()
    pipe = FileLister(root, "*.jpg", recursive=True).open_files(mode="b").map(load_pair, concurrency=c)
    it = iter(pipe.batch(BATCH).collate())
    images = 0
    for batch in it:
        images += batch.shape[0]
    out = {"seconds": time.perf_counter() - t0, "images": images}
    out.update(auto_stats(it))
    return out


def bench_e2e(images: int, repeats: int, sweep: list[int], cores: int, malloc: str) -> None:
    from datapipes._demo_data import make_dataset

    settings = {"default": {}, "tuned": TUNED_MALLOC}
    chosen = settings if malloc == "both" else {malloc: settings[malloc]}
    with tempfile.TemporaryDirectory(prefix="datapipes-autotune-") as tmp:
        make_dataset(tmp, images, seed=0)
        for mname, extra in chosen.items():
            env = {k: v for k, v in os.environ.items() if k not in TUNED_MALLOC}
            env.update(extra)
            name = "e2e" if len(chosen) == 1 else f"e2e ({mname} malloc)"
            print(f"\n{name}: {images:,} JPEGs on disk -> decode/resize -> batch 32 -> uint8 tensor, fixed {sweep} "
                  f"and 'auto', a fresh process per run ({mname} malloc)", flush=True)

            runs: dict[Any, Callable[[], dict[str, Any]]] = {
                c: (lambda c=c, env=env: child_run(["e2e", "--root", tmp, "--concurrency", str(c)], env))
                for c in [*sweep, AUTO]}
            results = interleaved(runs, repeats)
            rate = report(name, f"end to end: {images:,} JPEGs -> batches of 32 ({mname} malloc), fixed sweep vs 'auto'",
                          "images/s", lambda r: r["images"], results, cores)
            WORKLOADS[name]["env"] = extra
            best = max(v for c, v in rate.items() if c != AUTO)
            target(name, f"'auto' >= 95% of the best fixed concurrency: {rate[AUTO] / best:.1%}", rate[AUTO] / best,
                   rate[AUTO] >= 0.95 * best)


# -- (c) I/O whose latency changes mid-run ----------------------------------------------------------------------

LATENCY = [0.002]
CONSUMER_S = 0.001
BIN_S = 0.1
WINDOW_S = 0.5


def io_fn(x: int) -> int:
    time.sleep(LATENCY[0])
    return x


def io_run(c: int | str, switch_s: float, after_s: float, before: float, after: float) -> dict[str, Any]:
    """One pass over an unbounded source for ``switch_s + after_s`` seconds; the latency goes from
    ``before`` to ``after`` at ``switch_s``. Records every item's arrival time and the stage's workers."""
    from datapipes.iter import IterableWrapper

    LATENCY[0] = before
    arrivals: list[float] = []
    workers: list[tuple[float, int]] = []
    it = iter(IterableWrapper(itertools.count()).map(io_fn, concurrency=c))
    stage = None
    t0 = time.perf_counter()
    end = t0 + switch_s + after_s
    switched = False
    next_sample = t0
    clock, sleep, add = time.perf_counter, time.sleep, arrivals.append
    for _ in it:
        now = clock()
        add(now - t0)
        if now >= next_sample:
            if stage is None:
                stage = next((s for _, s in it.stats() if s.kind != "serial"), None)
            if stage is not None:
                workers.append((round(now - t0, 3), stage.workers))
            next_sample = now + BIN_S
            if not switched and now - t0 >= switch_s:
                LATENCY[0] = after
                switched = True
            if now >= end:
                break
        sleep(CONSUMER_S)
    seconds = clock() - t0
    info = auto_stats(it)
    it.close()  # type: ignore[attr-defined]
    LATENCY[0] = before
    n1 = sum(1 for a in arrivals if a < switch_s)
    out: dict[str, Any] = {"seconds": seconds, "items": len(arrivals), "phase1": n1 / switch_s,
                           "phase2": (len(arrivals) - n1) / max(1e-9, seconds - switch_s)}
    out.update(info)
    bins = [0] * (int(seconds / BIN_S) + 1)
    for a in arrivals:
        bins[int(a / BIN_S)] += 1
    rates = [b / BIN_S for b in bins]
    if c == AUTO:
        out["rates"] = rates
        # rate and workers every 0.5 s: what the tuner did over time
        step = int(0.5 / BIN_S)
        out["timeline"] = [
            [round(k * BIN_S, 1), round(sum(rates[k:k + step]) / step), next((w for t, w in reversed(workers)
                                                                               if t <= (k + step) * BIN_S), None)]
            for k in range(0, len(rates) - step + 1, step)]
    return out


def retune_time(rates: list[float], switch_s: float, steady: float) -> float | None:
    """Seconds from the change until the rate over a 0.5 s window first reaches 90% of ``steady``."""
    k0, per = int(switch_s / BIN_S), int(WINDOW_S / BIN_S)
    for k in range(k0, len(rates) - per):
        if sum(rates[k:k + per]) / per >= 0.9 * steady:
            return round(k * BIN_S - switch_s, 2)
    return None


def bench_io(repeats: int, sweep: list[int], cores: int, switch_s: float, after_s: float) -> None:
    print(f"\nio: fn sleeps 2 ms, then 20 ms from {switch_s:g} s on ({switch_s + after_s:g} s a run); the consumer "
          f"spends 1 ms per item; fixed {sweep} and 'auto'", flush=True)
    runs: dict[Any, Callable[[], dict[str, Any]]] = {
        c: (lambda c=c: io_run(c, switch_s, after_s, 0.002, 0.020)) for c in [*sweep, AUTO]}
    results = interleaved(runs, repeats)
    # the new steady state: the best fixed concurrency's rate at 20 ms (what the tuner can reach)
    steady = max(statistics.median(r["phase2"] for r in rows) for c, rows in results.items() if c != AUTO)
    for r in results[AUTO]:
        r["retune_s"] = retune_time(r.pop("rates"), switch_s, steady)

    def phases(c: Any, rows: list[dict[str, Any]]) -> str:
        p1 = statistics.median(r["phase1"] for r in rows)
        p2 = statistics.median(r["phase2"] for r in rows)
        more = f" [2 ms: {p1:,.0f}/s, 20 ms: {p2:,.0f}/s"
        if c == AUTO:
            ts = [r["retune_s"] for r in rows]
            more += f"; re-tuned in {ts} s"
        return more + "]"

    rate = report("io", f"io: 2 ms -> 20 ms latency at {switch_s:g} s, consumer 1 ms/item; fixed sweep vs 'auto'",
                  "items/s", lambda r: r["items"], results, cores, phases)
    timeline = results[AUTO][len(results[AUTO]) // 2]["timeline"]
    print("  auto, one run: [t s, items/s over 0.5 s, workers] " + ", ".join(str(x) for x in timeline), flush=True)
    best = max(v for c, v in rate.items() if c != AUTO)
    retunes = [r["retune_s"] for r in results[AUTO]]
    med = statistics.median(t if t is not None else float("inf") for t in retunes)
    target("io", f"'auto' re-tunes within 3 s of the latency change (to 90% of the best fixed concurrency's "
           f"{steady:,.0f} items/s at 20 ms): median {med:.2f} s ({retunes})", med, med <= 3.0)
    print(f"  (whole run: 'auto' {rate[AUTO] / best:.1%} of the best fixed concurrency)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", choices=["decode", "process", "e2e", "io"])
    parser.add_argument("--quick", action="store_true", help="fewer items, values and repeats: a smoke run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting, interleaved (default 3)")
    parser.add_argument("--images", type=int, default=None, help="decode: images a run (default 2000); e2e: "
                        "JPEGs generated (default 1000)")
    parser.add_argument("--sweep", default=None, help="comma list of fixed concurrencies for decode and e2e "
                        "(default: 1, 2, 4, CPUs/2, CPUs, 1.5 x CPUs, 2 x CPUs)")
    parser.add_argument("--io-sweep", default=None, help="comma list of fixed concurrencies for io "
                        "(default 2,4,8,16,32,64)")
    parser.add_argument("--switch", type=float, default=None, help="io: seconds at 2 ms before the change (default 3)")
    parser.add_argument("--after", type=float, default=None, help="io: seconds at 20 ms after it (default 6)")
    parser.add_argument("--malloc", choices=["default", "tuned", "both"], default="default",
                        help="e2e: the children's malloc (default: glibc's default)")
    parser.add_argument("--wait-idle", type=float, default=10.0,
                        help="before each fresh-process run (decode, e2e), wait up to this many seconds for the "
                             "machine to be idle (default 10; 0: do not wait)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures and the machine to PATH "
                        "(the schema of benchmarks/_results.py)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--root", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        c = args.concurrency if args.concurrency == AUTO else int(args.concurrency)
        out = (e2e_child(args.root, c) if args.child == "e2e"
               else decode_child(args.images, c, "process" if args.child == "process" else "thread"))
        print(json.dumps(out))
        return 0
    WAIT_IDLE[0] = 0.0 if args.quick else args.wait_idle
    WORKLOADS.clear()
    OK[0] = True
    q = args.quick
    reps = 1 if q else args.repeats
    cores = usable_cpus()
    only = set(args.only or ["decode", "process", "e2e", "io"])
    sweep = [int(x) for x in args.sweep.split(",")] if args.sweep else (
        sorted({1, 2, cores}) if q else cpu_sweep(cores))
    io_sweep = [int(x) for x in args.io_sweep.split(",")] if args.io_sweep else (
        [2, 32] if q else [2, 4, 8, 16, 32, 64])
    switch_s = args.switch if args.switch is not None else (1.0 if q else 3.0)
    after_s = args.after if args.after is not None else (2.0 if q else 6.0)
    print(f"python {sys.version.split()[0]}, {cores} usable CPUs; medians of {reps} interleaved runs", flush=True)
    if "decode" in only:
        bench_decode(args.images or (300 if q else 2000), reps, sweep, cores)
    if "process" in only:
        bench_decode(args.images or (300 if q else 2000), reps, sweep, cores, "process")
    if "e2e" in only:
        bench_e2e(args.images or (200 if q else 1000), reps, sweep, cores, args.malloc)
    if "io" in only:
        bench_io(reps, io_sweep, cores, switch_s, after_s)
    if args.json:
        settings = {"only": sorted(only), "quick": q, "repeats": reps, "sweep": sweep, "io_sweep": io_sweep,
                    "switch_s": switch_s, "after_s": after_s, "malloc": args.malloc, "cpus": cores}
        _results.write(args.json, _results.document("autotune", settings, list(WORKLOADS.values())))
    return 0 if OK[0] else 1


if __name__ == "__main__":
    sys.exit(main())
