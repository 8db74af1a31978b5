"""Concurrency benchmarks (issue 4; targets: docs/performance.rst, "Targets"): our engine side by side with the plain-Python limit
and the peers, medians of repeats (ours and the plain limit interleaved repeat by repeat; the peers
run after them), over several runs.

    .venv-bench/bin/python benchmarks/concurrency.py            # everything, 5 runs
    .venv-bench/bin/python benchmarks/concurrency.py --only async --only gil --runs 7
    .venv-bench/bin/python benchmarks/concurrency.py --only io   # io, async, decode, gil, overhead
    .venv-bench/bin/python benchmarks/concurrency.py --quick     # fewer items and repeats, one run (a smoke run)

A *run* is one fresh process (this script started again with ``--runs 1``) in which every system of a
workload runs side by side, ``--repeats`` times each, interleaved; a run's figure for a system is the
median of its repeats. With ``--runs N`` (default 5; 1 with ``--quick``) the script prints each run's
tables, then the spread over the runs: for every system its ratio to the workload's baseline, and for
every target its value, as min / median / max over the runs, and whether the target held in EVERY run
(a target that holds on the median but not in every run is a miss). ``--json`` then holds every
repeat of every run in each system's ``runs`` (the throughput is their median), each system's
per-run ratios (``run_ratios``), and each target's per-run values (``run_values``); ``passed`` is
true only when the target held in every run.

Workloads and targets:
- io: 2,000 items, fn sleeps 5 ms, 32 threads: >= 97% of a plain ThreadPoolExecutor's rate.
- async: 20,000 items, ``await asyncio.sleep(0.005)``, 256 tasks: >= 95% of plain asyncio's rate.
- decode: Pillow decode + resize to 224x224 of in-memory ~500x375 JPEGs, 2 threads: >= 95% of a
  plain 2-thread pool (default malloc, and with MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_
  pinned, run in a child process).
- gil: json.loads of ~2 KB + a pure-Python loop per item, 100,000 items, executor="process" on 2
  workers: >= 1.5x serial and >= 95% of multiprocessing.Pool.imap at its best chunksize. The pipe is
  built once and iterated once per repeat, as epochs are: its first pass starts the workers (shown
  on a row of its own), the timed passes reuse them (the stage keeps its pool warm across passes),
  as the Pool is started before its timing.
- overhead: a trivial fn, 4 workers: per-item cost <= 1.2x a bounded ThreadPoolExecutor window.

Peers (torchdata.nodes, spdl.pipeline) run when importable (the benchmark venv, .venv-bench/);
otherwise their rows say "not installed". No torch call sits in a measuring loop.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import io
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _results  # noqa: E402
from datapipes.iter import IterableWrapper  # noqa: E402

ROWS: list[tuple[str, str, str, str]] = []
# The same figures as numbers, for --json (the schema of benchmarks/_results.py): workload name -> record.
WORKLOADS: dict[str, dict[str, Any]] = {}


def median_time(run: Callable[[], Any], repeats: int) -> float:
    return medians({"run": run}, repeats)["run"]


def timings(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Wall time of each run in every repeat, the runs interleaved repeat by repeat (drift hits all alike)."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
    return times


def medians(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median wall time of each run (see :func:`timings`)."""
    return {k: statistics.median(v) for k, v in timings(runs, repeats).items()}


def workload(name: str, title: str, unit: str, baseline: str | None) -> None:
    """Open the JSON record of a workload; ``baseline`` names the row the ratios are taken against."""
    WORKLOADS[name] = {"name": name, "title": title, "unit": unit, "baseline": baseline, "systems": [],
                       "targets": []}


def row(workload: str, runner: str, value: str, note: str = "", *, n: int | None = None,
        times: list[float] | None = None, role: str | None = None, **extra: Any) -> None:
    """Print one row; record it for --json: throughput ``n`` over the median of ``times`` (each
    repeat's wall seconds), the rate of every repeat as its spread."""
    ROWS.append((workload, runner, value, note))
    print(f"  {runner:<42} {value:>16}  {note}", flush=True)
    if workload in WORKLOADS:
        role = role or _results.role_of(runner)
        if n is None or not times:
            status = value if value in ("not installed", "failed") else "ok"
            WORKLOADS[workload]["systems"].append(_results.system(runner, role, None, status=status, note=note))
        else:
            WORKLOADS[workload]["systems"].append(_results.system(
                runner, role, n / statistics.median(times), runs=[n / t for t in times],
                seconds=statistics.median(times), note=note, **extra))


def target(workload: str, text: str, value: float, passed: bool) -> None:
    if workload in WORKLOADS:
        WORKLOADS[workload]["targets"].append({"text": text, "value": value, "passed": passed})


def results_json(settings: dict[str, Any]) -> dict[str, Any]:
    """Everything recorded so far as the results JSON, with each row's ratio to its workload's baseline."""
    return _results.document("concurrency", settings, [_results.add_ratios(w) for w in WORKLOADS.values()])


def peer(name: str) -> Any:
    try:
        if name == "torchdata.nodes":
            import torchdata.nodes as mod  # type: ignore[import-not-found]
        else:
            import spdl.pipeline as mod  # type: ignore[import-not-found]
        return mod
    except Exception:  # noqa: BLE001 - any import failure means the peer cannot run here
        return None


def run_nodes(items: list[Any], fn: Callable[[Any], Any], workers: int, method: str = "thread") -> int:
    nodes = peer("torchdata.nodes")
    node = nodes.ParallelMapper(nodes.IterableWrapper(items), fn, num_workers=workers, method=method, in_order=True)
    return sum(1 for _ in nodes.Loader(node))


def run_spdl(items: list[Any], fn: Callable[[Any], Any], workers: int) -> int:
    pl = peer("spdl.pipeline")
    pipe = pl.PipelineBuilder().add_source(items).pipe(fn, concurrency=workers).add_sink(workers * 2).build(num_threads=workers)
    n = 0
    with pipe.auto_stop():
        for _ in pipe.get_iterator(timeout=600):
            n += 1
    return n


def peers_rows(workload: str, items: list[Any], fn: Callable[[Any], Any], workers: int, repeats: int,
               scale: Callable[[float], str], spdl_fn: Callable[[Any], Any] | None = None) -> None:
    for name, runner in (("torchdata.nodes", run_nodes), ("spdl.pipeline", run_spdl)):
        if peer(name) is None:
            row(workload, name, "not installed")
            continue
        f = spdl_fn if (name == "spdl.pipeline" and spdl_fn is not None) else fn
        try:
            times = timings({"run": lambda: runner(items, f, workers)}, repeats)["run"]
        except Exception as e:  # noqa: BLE001 - a peer's failure is reported, not fatal
            row(workload, name, "failed", repr(e)[:60])
            continue
        row(workload, name, scale(statistics.median(times)), n=len(items), times=times)


# -- I/O-bound, threads ------------------------------------------------------------------------------


def sleep_5ms(x: int) -> int:
    time.sleep(0.005)
    return x


def bench_io(n: int, repeats: int) -> None:
    print(f"io: {n} items, fn sleeps 5 ms, 32 threads", flush=True)
    ideal = n * 0.005 / 32
    items = list(range(n))

    def ours() -> None:
        for _ in IterableWrapper(items).map(sleep_5ms, concurrency=32):
            pass

    def plain() -> None:
        with ThreadPoolExecutor(32) as ex:
            for _ in ex.map(sleep_5ms, items):
                pass

    workload("io", f"io: {n:,} items, fn sleeps 5 ms, 32 threads", "items/s", "plain ThreadPoolExecutor(32)")
    ts = timings({"plain": plain, "ours": ours}, repeats)
    m = {k: statistics.median(v) for k, v in ts.items()}
    t_plain, t_ours = m["plain"], m["ours"]
    row("io", "plain ThreadPoolExecutor(32)", f"{n / t_plain:,.0f} items/s", f"{ideal / t_plain:.0%} of ideal",
        n=n, times=ts["plain"], role="limit")
    row("io", "datapipes map(concurrency=32)", f"{n / t_ours:,.0f} items/s",
        f"{ideal / t_ours:.0%} of ideal, {t_plain / t_ours:.1%} of the plain pool (target >= 97%)", n=n, times=ts["ours"])
    target("io", ">= 97% of the plain pool's rate", t_plain / t_ours, t_plain / t_ours >= 0.97)
    peers_rows("io", items, sleep_5ms, 32, repeats, lambda t: f"{n / t:,.0f} items/s")


# -- I/O-bound, async --------------------------------------------------------------------------------


async def asleep_5ms(x: int) -> int:
    await asyncio.sleep(0.005)
    return x


def bench_async(n: int, repeats: int) -> None:
    print(f"async: {n} items, await asyncio.sleep(0.005), 256 tasks", flush=True)
    ideal = n * 0.005 / 256
    items = list(range(n))

    def ours() -> None:
        for _ in IterableWrapper(items).map(asleep_5ms, concurrency=256):
            pass

    async def plain_main() -> None:
        window: collections.deque[asyncio.Task[int]] = collections.deque()
        for x in items:
            window.append(asyncio.ensure_future(asleep_5ms(x)))
            if len(window) >= 256:
                await window.popleft()
        while window:
            await window.popleft()

    workload("async", f"async: {n:,} items, await asyncio.sleep(0.005), 256 tasks", "items/s",
             "plain asyncio (256-task window)")
    ts = timings({"plain": lambda: asyncio.run(plain_main()), "ours": ours}, repeats)
    m = {k: statistics.median(v) for k, v in ts.items()}
    t_plain, t_ours = m["plain"], m["ours"]
    row("async", "plain asyncio (256-task window)", f"{n / t_plain:,.0f} items/s", f"{ideal / t_plain:.0%} of ideal",
        n=n, times=ts["plain"], role="limit")
    row("async", "datapipes map(async fn, concurrency=256)", f"{n / t_ours:,.0f} items/s",
        f"{ideal / t_ours:.0%} of ideal, {t_plain / t_ours:.1%} of plain asyncio (target >= 95%)",
        n=n, times=ts["ours"])
    target("async", ">= 95% of plain asyncio's rate", t_plain / t_ours, t_plain / t_ours >= 0.95)
    if peer("spdl.pipeline") is None:
        row("async", "spdl.pipeline", "not installed")
    else:
        try:
            times = timings({"run": lambda: run_spdl(items, asleep_5ms, 256)}, repeats)["run"]
            t = statistics.median(times)
            row("async", "spdl.pipeline", f"{n / t:,.0f} items/s", f"{ideal / t:.0%} of ideal", n=n, times=times)
        except Exception as e:  # noqa: BLE001
            row("async", "spdl.pipeline", "failed", repr(e)[:60])


# -- CPU-bound, GIL released: Pillow ---------------------------------------------------------------------


def make_jpegs(count: int) -> list[bytes]:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    yy, xx = np.mgrid[0:375, 0:500]
    for k in range(count):
        base = (xx * (k + 1) + yy * 3) % 256
        img = np.stack([base, base[::-1], (base + 85) % 256], axis=-1)
        img = np.clip(img + rng.integers(0, 40, img.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def decode(data: bytes) -> tuple[int, int]:
    from PIL import Image

    img = Image.open(io.BytesIO(data)).convert("RGB").resize((224, 224))
    return img.size


def bench_decode(n: int, repeats: int, label: str) -> None:
    print(f"decode{label}: {n} JPEG decode + resize to 224x224, 2 threads", flush=True)
    pool_of = make_jpegs(32)
    items = [pool_of[k % len(pool_of)] for k in range(n)]

    def serial() -> None:
        for x in items:
            decode(x)

    def plain() -> None:
        with ThreadPoolExecutor(2) as ex:
            for _ in ex.map(decode, items):
                pass

    def ours() -> None:
        for _ in IterableWrapper(items).map(decode, concurrency=2):
            pass

    decode(items[0])
    w = f"decode{label}"
    workload(w, f"decode{label}: {n:,} JPEG decode + resize to 224x224, 2 threads", "images/s",
             "plain ThreadPoolExecutor(2)")
    ts = timings({"serial": serial, "plain": plain, "ours": ours}, repeats)
    m = {k: statistics.median(v) for k, v in ts.items()}
    t_serial, t_plain, t_ours = m["serial"], m["plain"], m["ours"]
    row(w, "serial", f"{n / t_serial:,.0f} img/s", "1.00x", n=n, times=ts["serial"], role="reference")
    row(w, "plain ThreadPoolExecutor(2)", f"{n / t_plain:,.0f} img/s", f"{t_serial / t_plain:.2f}x serial",
        n=n, times=ts["plain"], role="limit")
    row(w, "datapipes map(concurrency=2)", f"{n / t_ours:,.0f} img/s",
        f"{t_serial / t_ours:.2f}x serial, {t_plain / t_ours:.1%} of the plain pool (target >= 95%)",
        n=n, times=ts["ours"])
    target(w, ">= 95% of the plain pool's rate", t_plain / t_ours, t_plain / t_ours >= 0.95)
    peers_rows(w, items, decode, 2, repeats, lambda t: f"{n / t:,.0f} img/s ({t_serial / t:.2f}x serial)")


# -- CPU-bound, GIL held ------------------------------------------------------------------------------------


def make_docs(n: int) -> list[str]:
    doc = json.dumps({"id": 0, "tags": [f"tag{i}" for i in range(40)], "values": list(range(200)),
                      "text": "lorem ipsum " * 40})
    return [doc.replace('"id": 0', f'"id": {k}') for k in range(n)]


def gil_work(s: str) -> int:
    d = json.loads(s)
    total = 0
    for v in d["values"]:
        total += v * v % 7
    return total + d["id"]


def bench_gil(n: int, repeats: int, peers: bool = True) -> None:
    docs = make_docs(n)
    print(f"gil: {n} items, json.loads ({len(docs[0])} bytes) + a Python loop, 2 processes", flush=True)

    def serial() -> None:
        for d in docs:
            gil_work(d)

    pipe = IterableWrapper(docs).map(gil_work, concurrency=2, executor="process")

    def ours() -> None:
        for _ in pipe:  # the same pipe every repeat (its epochs): its workers stay warm between passes
            pass

    t = time.perf_counter()
    ours()  # the first pass starts the workers
    t_first = time.perf_counter() - t
    best = None
    with multiprocessing.Pool(2) as pool:
        list(pool.imap(gil_work, docs[:100], chunksize=16))  # start the workers
        for cs in (16, 64, 256, 1024):
            t = median_time(lambda: sum(1 for _ in pool.imap(gil_work, docs, chunksize=cs)), max(1, repeats // 2))
            if best is None or t < best[0]:
                best = (t, cs)
        assert best is not None
        cs = best[1]
        ts = timings({"serial": serial, "pool": lambda: sum(1 for _ in pool.imap(gil_work, docs, chunksize=cs)),
                      "ours": ours}, repeats)
    m = {k: statistics.median(v) for k, v in ts.items()}
    t_serial, t_pool, t_ours = m["serial"], m["pool"], m["ours"]
    pool_name = f"multiprocessing.Pool(2).imap best (chunksize={cs})"
    # The baseline's name carries the chunksize of this run; the name is the same in every run when
    # the same chunksize wins, which the spread summary needs to line runs up: name it by role instead.
    workload("gil", f"gil: {n:,} items, json.loads + a Python loop, 2 processes", "items/s", POOL_ROW)
    row("gil", "serial", f"{n / t_serial:,.0f} items/s", f"1.00x ({t_serial / n * 1e6:.1f} us/item)",
        n=n, times=ts["serial"], role="reference")
    row("gil", POOL_ROW, f"{n / t_pool:,.0f} items/s",
        f"{t_serial / t_pool:.2f}x serial (pool started before timing; best chunksize {cs})", n=n, times=ts["pool"],
        role="limit", chunksize=cs)
    row("gil", "datapipes map(executor='process', concurrency=2)", f"{n / t_ours:,.0f} items/s",
        f"{t_serial / t_ours:.2f}x serial (target >= 1.5x), {t_pool / t_ours:.1%} of the best Pool "
        "(target >= 95%); passes 2+ of one pipe (warm workers)", n=n, times=ts["ours"])
    row("gil", "datapipes, first pass (starts its workers)", f"{n / t_first:,.0f} items/s",
        f"{t_serial / t_first:.2f}x serial (one pass)", n=n, times=[t_first])
    target("gil", ">= 1.5x serial", t_serial / t_ours, t_serial / t_ours >= 1.5)
    target("gil", ">= 95% of the best Pool's rate", t_pool / t_ours, t_pool / t_ours >= 0.95)
    if not peers:
        return
    if peer("torchdata.nodes") is None:
        row("gil", "torchdata.nodes (process)", "not installed")
    else:
        try:
            times = timings({"run": lambda: run_nodes(docs, gil_work, 2, "process")}, 1)["run"]  # ~15 s a run: once
            t = times[0]
            row("gil", "torchdata.nodes (process)", f"{n / t:,.0f} items/s", f"{t_serial / t:.2f}x serial (one run)",
                n=n, times=times)
        except Exception as e:  # noqa: BLE001
            row("gil", "torchdata.nodes (process)", "failed", repr(e)[:60])


POOL_ROW = "multiprocessing.Pool(2).imap, best chunksize"


# -- overhead ---------------------------------------------------------------------------------------------------


def identity(x: int) -> int:
    return x


def bench_overhead(n: int, repeats: int) -> None:
    print(f"overhead: {n} items, trivial fn, 4 workers", flush=True)
    items = list(range(n))

    def window() -> None:
        with ThreadPoolExecutor(4) as ex:
            futures: collections.deque[Any] = collections.deque()
            for x in items:
                futures.append(ex.submit(identity, x))
                if len(futures) >= 4:
                    futures.popleft().result()
            while futures:
                futures.popleft().result()

    def ours() -> None:
        for _ in IterableWrapper(items).map(identity, concurrency=4):
            pass

    def serial() -> None:
        for _ in IterableWrapper(items).map(identity):
            pass

    workload("overhead", f"overhead: {n:,} items, trivial fn, 4 workers", "items/s",
             "bounded ThreadPoolExecutor(4) window")
    ts = timings({"window": window, "ours": ours, "serial": serial}, repeats)
    m = {k: statistics.median(v) for k, v in ts.items()}
    t_window, t_ours, t_serial = m["window"], m["ours"], m["serial"]
    row("overhead", "bounded ThreadPoolExecutor(4) window", f"{t_window / n * 1e6:.2f} us/item",
        n=n, times=ts["window"], role="limit", us_per_item=t_window / n * 1e6)
    row("overhead", "datapipes map(concurrency=4)", f"{t_ours / n * 1e6:.2f} us/item",
        f"{t_ours / t_window:.2f}x the window (target <= 1.2x)", n=n, times=ts["ours"], us_per_item=t_ours / n * 1e6)
    row("overhead", "datapipes map (serial, concurrency=1)", f"{t_serial / n * 1e6:.3f} us/item",
        n=n, times=ts["serial"], us_per_item=t_serial / n * 1e6)
    target("overhead", "per-item cost <= 1.2x the window's", t_ours / t_window, t_ours / t_window <= 1.2)


def run_once(args: argparse.Namespace, only: set[str]) -> None:
    """One run: every selected workload, its systems side by side in this process."""
    q = args.quick
    reps = 1 if q else args.repeats
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; medians of {reps} repeats", flush=True)
    if "io" in only:
        bench_io(400 if q else 2000, reps)
    if "async" in only:
        bench_async(4000 if q else 20000, reps)
    if "decode" in only:
        bench_decode(100 if q else 400, reps, args.decode_label)
        if not args.decode_label:
            env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="1048576", MALLOC_TRIM_THRESHOLD_="268435456")
            cmd = [sys.executable, os.path.abspath(__file__), "--only", "decode", "--decode-label", " (malloc pinned)",
                   "--repeats", str(reps), "--runs", "1"]
            if q:
                cmd.append("--quick")
            with tempfile.TemporaryDirectory(prefix="datapipes-concurrency-") as tmp:
                if args.json:
                    cmd += ["--json", os.path.join(tmp, "decode.json")]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
                for line in out.splitlines()[1:]:
                    print(line, flush=True)
                if args.json:
                    with open(os.path.join(tmp, "decode.json")) as f:
                        for w in json.load(f)["workloads"]:
                            w["env"] = {k: env[k] for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
                            WORKLOADS[w["name"]] = w
    if "gil" in only:
        bench_gil(20000 if q else 100000, reps, peers=args.run_index <= 1)
    if "overhead" in only:
        bench_overhead(20000 if q else 100000, reps)


# -- the spread over runs ---------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    return f"{min(values):.3f} | {statistics.median(values):.3f} | {max(values):.3f}"


def merge_runs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The workloads of several runs' JSON as one: each system's repeats of every run in ``runs`` (the
    throughput is their median) and its ratio to the baseline in each run (``run_ratios``); each
    target's value in each run (``run_values``), ``value`` their median, ``passed`` only when it held
    in every run. Systems or targets missing from a run are merged from the runs that have them."""
    merged: list[dict[str, Any]] = []
    for w in docs[0]["workloads"]:
        runs_w = [next((x for x in d["workloads"] if x["name"] == w["name"]), None) for d in docs]
        present = [x for x in runs_w if x is not None]
        out = dict(w, systems=[], targets=[], spread_runs=len(present))
        for sys_rec in w["systems"]:
            recs = [next((s for s in x["systems"] if s["name"] == sys_rec["name"]), None) for x in present]
            ok = [r for r in recs if r is not None and r.get("status") == "ok"]
            if not ok:
                out["systems"].append(sys_rec)
                continue
            every = [v for r in ok for v in r.get("runs", [r["throughput"]])]
            rec = dict(ok[0], runs=every, throughput=statistics.median(every))
            rec["run_throughputs"] = [r["throughput"] for r in ok]
            rec["run_ratios"] = [r["ratio"] for r in ok if "ratio" in r]
            if "us_per_item" in rec:
                rec["us_per_item"] = 1e6 / rec["throughput"]
            if "seconds" in rec:
                rec["seconds"] = statistics.median(r["seconds"] for r in ok if "seconds" in r)
            out["systems"].append(rec)
        for t in w["targets"]:
            vals = [next((u for u in x["targets"] if u["text"] == t["text"]), None) for x in present]
            got = [u for u in vals if u is not None]
            out["targets"].append({"text": t["text"], "value": statistics.median(u["value"] for u in got),
                                   "passed": all(u["passed"] for u in got), "run_values": [u["value"] for u in got],
                                   "runs_passed": sum(u["passed"] for u in got), "runs": len(got)})
        merged.append(_results.add_ratios(out))
    return merged


def print_spread(workloads: list[dict[str, Any]]) -> bool:
    """Print the spread table of merged workloads; True when every target held in every run."""
    ok = True
    print("\n| workload | ratio to the baseline / target | min | median | max | every run |")
    print("|---|---|---:|---:|---:|---|")
    for w in workloads:
        for s in w["systems"]:
            if len(s.get("run_ratios", [])) > 1 and s["name"] != w["baseline"]:
                print(f"| {w['name']} | {s['name']} / {w['baseline']} | {spread(s['run_ratios'])} | |")
        for t in w["targets"]:
            held = t["runs_passed"] == t["runs"]
            ok &= held
            print(f"| {w['name']} | target: {t['text']} | {spread(t['run_values'])} | "
                  f"{'PASS' if held else 'FAIL'} {t['runs_passed']}/{t['runs']} |")
    return ok


def run_many(args: argparse.Namespace, argv: list[str]) -> int:
    """``--runs N``: run this script N times in fresh processes, print each run, then the spread."""
    docs = []
    with tempfile.TemporaryDirectory(prefix="datapipes-concurrency-runs-") as tmp:
        for k in range(1, args.runs + 1):
            path = os.path.join(tmp, f"run{k}.json")
            cmd = [sys.executable, os.path.abspath(__file__), *strip_runs(argv), "--runs", "1", "--run-index", str(k),
                   "--json", path]
            print(f"\n## run {k}/{args.runs} (load average {os.getloadavg()[0]:.2f})", flush=True)
            subprocess.run(cmd, check=True)
            with open(path) as f:
                docs.append(json.load(f))
    workloads = merge_runs(docs)
    print(f"\n## spread over {args.runs} runs (each a fresh process, its systems side by side; a run's figure is "
          f"the median of its repeats)")
    ok = print_spread(workloads)
    if args.json:
        settings = dict(docs[0]["settings"], runs=args.runs)
        _results.write(args.json, _results.document("concurrency", settings, workloads))
    return 0 if ok else 1


def strip_runs(argv: list[str]) -> list[str]:
    """``argv`` without ``--runs``/``--json`` (and their values): what each run is given."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--runs", "--json", "--run-index"):
            skip = True
            continue
        if a.startswith(("--runs=", "--json=", "--run-index=")):
            continue
        out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", choices=["io", "async", "decode", "gil", "overhead"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per system in a run, interleaved (default 5)")
    parser.add_argument("--runs", type=int, default=None,
                        help="runs, each a fresh process with every system side by side (default 5; 1 with --quick)")
    parser.add_argument("--decode-label", default="", help=argparse.SUPPRESS)
    parser.add_argument("--run-index", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--json", metavar="PATH", help="also write the figures and the machine to PATH "
                        "(the schema of benchmarks/_results.py; benchmarks/plots.py draws them)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.runs is None:
        args.runs = 1 if args.quick else 5
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    if args.runs > 1:
        return run_many(args, argv)
    WORKLOADS.clear()
    only = set(args.only or ["io", "async", "decode", "gil", "overhead"])
    run_once(args, only)
    if args.json:
        reps = 1 if args.quick else args.repeats
        _results.write(args.json, results_json({"only": sorted(only), "quick": args.quick, "repeats": reps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
