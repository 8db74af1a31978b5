"""Worker start time: torch's DataLoader and datapipes.DataLoader side by side, per start method.

    .venv/bin/python benchmarks/worker_start.py                    # fork, spawn, forkserver x 1, 2, 4 workers
    .venv/bin/python benchmarks/worker_start.py --methods spawn --workers 2 --repeats 9
    .venv/bin/python benchmarks/worker_start.py --methods spawn --workers 4 --workloads map --payload-mb 256
    .venv/bin/python benchmarks/worker_start.py --quick --workloads map     # smoke run: a few seconds

For every start method (``multiprocessing_context``: fork, spawn, forkserver) and number of workers
(1, 2, 4), each system builds a loader with ``batch_size=32`` and is timed from ``iter(loader)`` to
its first batch (what starting the workers costs: torch's ``iter()`` starts them, ours the first
``next()``; both are inside the clock) and to the end of a short epoch (``--items`` ints, the
workers stopped: neither loader is persistent). Beside the wall times, the CPU time of the epoch:
this process's and its workers' (counted once they are reaped: steadier than wall time on a shared
machine; a forkserver worker is the server's child, not ours, and goes uncounted). Two workloads:

- ``map``: a map-style dataset of ints (``__getitem__``/``__len__``), read by index, collated into
  tensors in the workers: ``torch.utils.data.DataLoader(ds, ...)`` beside
  ``datapipes.DataLoader(ds, ...)``; ``--payload-mb N`` has it hold a tensor of N MiB too, which
  spawn and forkserver pickle for every worker;
- ``iterable``: a torch ``IterableDataset`` that shards itself (``get_worker_info()``), in both
  loaders; beside them the same ints as a DataPipe,
  ``IterableWrapper(range(n)).sharding_filter().map(item)``, in ``datapipes.DataLoader`` and in
  torch's DataLoader (where torch's workers unpickle our pipe: the cost of the pipe itself, apart
  from the loader's).

Every figure is the median of ``--repeats`` runs, the systems' runs interleaved within each repeat
(after one warm-up run of every system; the forkserver is started before any run, so its one-off
start is timed in none). The ``x torch`` columns are the system's figure over torch's DataLoader's
(above 1: slower than torch). The load average is printed before and after; ``--wait-idle S``
waits up to S seconds for an idle machine before each run.

What this script keeps out of its own top-level imports matters: a ``spawn`` worker re-imports the
main module (this file: torch, nothing of datapipes), and so does a ``forkserver`` worker on
CPython 3.11 and 3.12, whose server never preloads ``__main__`` (CPython gh-126631, fixed in 3.13).
So, as in torch's own ``test_multiprocessing_contexts`` (test/test_dataloader.py, whose module does
not import datapipes), only a worker of ours imports datapipes. A user's script that imports
datapipes at its top pays that import in every spawned worker whichever loader it uses. Under
``PYTHONDONTWRITEBYTECODE`` the modules of a checkout whose ``.pyc`` is out of date are compiled
again by every worker: the script prints how many there are.

After every run no worker may be left (``multiprocessing.active_children()``); at the end the
forkserver this script started is stopped too. A worker left running is reported and the script
exits 1. There is no target: the figures are reported (docs/performance.rst, "Worker start time").
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import multiprocessing
import os
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the datapipes of this checkout

import torch  # noqa: E402  (both loaders need it; a spawned worker imports it for either)
from torch.utils.data import Dataset, IterableDataset, get_worker_info  # noqa: E402

from benchmarks import _results  # noqa: E402  (the standard library only)
from benchmarks.end_to_end import wait_idle  # noqa: E402  (its module imports the standard library only)

METHODS = ("fork", "spawn", "forkserver")
WORKLOADS = ("map", "iterable")
BATCH = 32

# -- the data (module level: a spawned worker finds it by name in this module) ---------------------


class Ints(Dataset):  # type: ignore[type-arg]
    """A map-style dataset of ``n`` ints, holding ``payload_mb`` MiB of tensor besides (``--payload-mb``:
    what a dataset holding its data in memory hands every spawned worker)."""

    def __init__(self, n: int, payload_mb: float = 0.0) -> None:
        self.n = n
        self.payload = torch.zeros(int(payload_mb * 2**18)) if payload_mb else None  # float32: 4 bytes

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(index)
        return index

    def __len__(self) -> int:
        return self.n


class ShardedInts(IterableDataset):  # type: ignore[type-arg]
    """``range(n)``, each DataLoader worker yielding its share (``get_worker_info()``), as torch's
    documentation shards an ``IterableDataset``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


def item(x: int) -> int:
    """The DataPipe's map function (by name: plain pickle carries it)."""
    return x


# -- the systems -----------------------------------------------------------------------------------


def torch_loader(data: Any, method: str, workers: int, batch: int) -> Any:
    return torch.utils.data.DataLoader(data, batch_size=batch, num_workers=workers, multiprocessing_context=method)


def datapipes_loader(data: Any, method: str, workers: int, batch: int) -> Any:
    import datapipes  # here, not at the top: see the module docstring

    return datapipes.DataLoader(data, batch_size=batch, num_workers=workers, multiprocessing_context=method)


def datapipe(n: int) -> Any:
    from datapipes.iter import IterableWrapper

    return IterableWrapper(range(n)).sharding_filter().map(item)


#: workload -> [(system name, the loader's builder, the data's builder)]; the first is the baseline
SYSTEMS: dict[str, list[tuple[str, Callable[..., Any], Callable[[int], Any]]]] = {
    "map": [
        ("torch DataLoader", torch_loader, Ints),
        ("datapipes.DataLoader", datapipes_loader, Ints),
    ],
    "iterable": [
        ("torch DataLoader (IterableDataset)", torch_loader, ShardedInts),
        ("datapipes.DataLoader (IterableDataset)", datapipes_loader, ShardedInts),
        ("datapipes.DataLoader (DataPipe)", datapipes_loader, datapipe),
        ("torch DataLoader (DataPipe)", torch_loader, datapipe),
    ],
}

TITLES = {
    "map": "map-style dataset of ints, read by index",
    "iterable": "IterableDataset sharding itself / the same ints as a DataPipe",
}


# -- measuring -------------------------------------------------------------------------------------


class LeftRunning(RuntimeError):
    """Worker processes still alive after a loader's epoch ended."""


def one_run(build: Callable[..., Any], data: Callable[[int], Any], method: str, workers: int, items: int,
            batch: int, payload_mb: float = 0.0) -> tuple[dict[str, Any], list[int]]:
    """The figures of one new loader's epoch, timed from ``iter()``, and the ints it yielded; every
    worker stopped when the epoch ends (checked). Figures: ``first_s`` and ``epoch_s`` (wall),
    ``cpu_s`` (this process's CPU time over the epoch) and ``workers_cpu_s`` (the CPU time of the
    workers, counted once they are reaped; None for forkserver workers, which are the server's
    children, not ours)."""
    loader = build(data(items, payload_mb) if data is Ints else data(items), method, workers, batch)
    gc.collect()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time()
    start = time.perf_counter()
    it = iter(loader)
    first = next(it)
    first_s = time.perf_counter() - start
    got = first.tolist()
    for b in it:
        got.extend(b.tolist())
    epoch_s = time.perf_counter() - start
    cpu_s = time.process_time() - cpu
    del it, loader, first
    gc.collect()
    left = _wait_children(5.0)
    if left:
        raise LeftRunning(f"{len(left)} worker process(es) still alive after the epoch: {left}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    workers_cpu = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    return {"first_s": first_s, "epoch_s": epoch_s, "cpu_s": cpu_s,
            "workers_cpu_s": None if method == "forkserver" else workers_cpu}, got


def _wait_children(timeout: float) -> list[str]:
    """The child processes still alive after up to ``timeout`` s (multiprocessing's view: the
    workers of every start method, the forkserver's included)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = multiprocessing.active_children()  # also reaps those that ended
        if not alive or time.monotonic() > deadline:
            return [f"{p.name} (pid {p.pid})" for p in alive]
        time.sleep(0.01)


def _nothing() -> None:
    pass


def warm_forkserver() -> None:
    """Start the forkserver and wait until it has served a process, so that its one-off start is
    timed in no run (its workers still import this module each, on CPython 3.11 and 3.12)."""
    p = multiprocessing.get_context("forkserver").Process(target=_nothing)
    p.start()
    p.join()


def stop_forkserver() -> None:
    """Stop the forkserver this process started, if any (it would otherwise live until we exit)."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)  # CPython 3.9+; private, so looked up
    if stop is not None:
        stop()


def load() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def stale_bytecode() -> tuple[int, int]:
    """(modules of the datapipes package without an up-to-date ``.pyc``, modules in all), read from
    the files (nothing imported). Under ``PYTHONDONTWRITEBYTECODE`` every spawned worker compiles
    those again: in a checkout that is being edited they inflate our worker's start."""
    root = Path(__file__).resolve().parent.parent / "datapipes"
    stale = total = 0
    for py in root.rglob("*.py"):
        total += 1
        pyc = Path(importlib.util.cache_from_source(str(py)))
        try:
            head = pyc.read_bytes()[:16]
        except OSError:
            stale += 1
            continue
        st = py.stat()
        flags = int.from_bytes(head[4:8], "little")
        if flags == 0 and (int.from_bytes(head[8:12], "little") != int(st.st_mtime) & 0xFFFFFFFF
                           or int.from_bytes(head[12:16], "little") != st.st_size & 0xFFFFFFFF):
            stale += 1
    return stale, total


Row = dict[str, Any]
Results = dict[tuple[str, str, int, str], list[Row]]

#: (key of a run's figures, column title, scale to the column's unit)
FIGURES = (("first_s", "first batch ms", 1e3), ("epoch_s", "epoch ms", 1e3), ("cpu_total_s", "CPU ms", 1e3))


def medians(rows: list[Row]) -> dict[str, Any]:
    """The median of each figure over the runs (None where a run has none: forkserver's workers)."""
    out: dict[str, Any] = {}
    for key in ("first_s", "epoch_s", "cpu_s", "workers_cpu_s", "cpu_total_s"):
        values = [r[key] for r in rows if r.get(key) is not None]
        out[key] = statistics.median(values) if values and len(values) == len(rows) else None
    return out


def table(results: Results, methods: list[str], workers: list[int], workloads: list[str], repeats: int) -> list[str]:
    """Markdown rows: per workload, start method and workers, each system's median first batch,
    epoch and CPU time (this process and its workers), and each one's ratio to the workload's
    baseline (torch's DataLoader)."""
    head = " | ".join(f"{title} | x torch" for _, title, _ in FIGURES)
    lines = [f"medians of {repeats} run(s); first batch and epoch: wall time from iter(); CPU: this process and its "
             f"workers over the epoch (-: forkserver workers are not ours to count); x torch: the system's / "
             f"torch DataLoader's", "",
             f"| workload | start | workers | system | {head} |",
             "|---|---|---:|---|" + "---:|---:|" * len(FIGURES)]
    for workload in workloads:
        base_name = SYSTEMS[workload][0][0]
        for method in methods:
            for w in workers:
                base = medians(results[(workload, method, w, base_name)])
                for name, _, _ in SYSTEMS[workload]:
                    m = medians(results[(workload, method, w, name)])
                    cells = []
                    for key, _, scale in FIGURES:
                        value, ref = m[key], base[key]
                        cells.append("-" if value is None else f"{value * scale:,.0f}")
                        cells.append("" if name == base_name or value is None or not ref else f"{value / ref:.2f}x")
                    lines.append(f"| {workload} | {method} | {w} | {name} | {' | '.join(cells)} |")
    return lines


def workloads_json(results: Results, methods: list[str], workers: list[int], workloads: list[str], items: int,
                   batch: int) -> list[dict[str, Any]]:
    """One workload of the results JSON (benchmarks/_results.py) per (workload, start method,
    workers): per system the epoch's batches/s as its throughput (median, each run's), and the
    medians and runs of the first batch, the epoch and the CPU time (s), each with its ratio to
    torch's DataLoader (``first_batch_vs_torch``, ...: above 1, slower than torch)."""
    batches = -(-items // batch)
    out = []
    for workload in workloads:
        base_name = SYSTEMS[workload][0][0]
        for method in methods:
            for w in workers:
                base = medians(results[(workload, method, w, base_name)])
                systems = []
                for name, build, _ in SYSTEMS[workload]:
                    rows = results[(workload, method, w, name)]
                    m = medians(rows)
                    extra: dict[str, Any] = {}
                    for key, label in (("first_s", "first_batch"), ("epoch_s", "epoch"), ("cpu_s", "cpu_main"),
                                       ("workers_cpu_s", "cpu_workers"), ("cpu_total_s", "cpu_total")):
                        extra[f"{label}_s"] = m[key]
                        extra[f"{label}_runs"] = [r[key] for r in rows]
                        extra[f"{label}_vs_torch"] = m[key] / base[key] if m[key] is not None and base[key] else None
                    systems.append(_results.system(
                        name, "datapipes" if build is datapipes_loader else "peer", batches / m["epoch_s"],
                        runs=[batches / r["epoch_s"] for r in rows], **extra))
                out.append(_results.add_ratios({
                    "name": f"{workload}, {method}, {w} worker{'s' if w > 1 else ''}",
                    "title": f"{TITLES[workload]}: {items:,} ints, batch {batch}, {method}, {w} workers",
                    "unit": "batches/s", "baseline": base_name, "start_method": method, "workers": w,
                    "systems": systems, "targets": []}))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default=None,
                        help="start methods, a comma list (default: all three; with --quick: fork,spawn)")
    parser.add_argument("--workers", default="1,2,4", help="numbers of workers, a comma list (default 1,2,4)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="map, iterable or both (default both)")
    parser.add_argument("--items", type=int, default=2048, help="ints per epoch (default 2,048: 64 batches)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per system; medians are shown (default 5)")
    parser.add_argument("--payload-mb", type=float, default=0.0,
                        help="the map-style dataset also holds a tensor of this many MiB, which spawn and forkserver "
                             "pickle for every worker (default 0)")
    parser.add_argument("--wait-idle", type=float, default=0.0,
                        help="before each run, wait up to this many seconds for the machine to be idle (default 0: "
                             "do not wait)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 worker, 64 ints, 1 run, no warm-up, fork and spawn unless --methods says "
                             "otherwise (a spawned worker imports torch: about a second each)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures and the machine to PATH "
                        "(the schema of benchmarks/_results.py)")
    args = parser.parse_args(argv)
    if args.quick:
        args.methods, args.workers, args.items, args.repeats = args.methods or "fork,spawn", "1", 64, 1
    args.methods = args.methods or ",".join(METHODS)
    methods = [m for m in args.methods.split(",") if m]
    workloads = [w for w in args.workloads.split(",") if w]
    try:
        workers = [int(w) for w in args.workers.split(",") if w]
    except ValueError:
        parser.error(f"--workers must be a comma list of ints, got {args.workers!r}")
    available = multiprocessing.get_all_start_methods()
    for m in methods:
        if m not in METHODS:
            parser.error(f"--methods: unknown start method {m!r}; choose from {','.join(METHODS)}")
        if m not in available:
            parser.error(f"--methods: {m!r} is not available here (this platform has {','.join(available)})")
    for w in workloads:
        if w not in WORKLOADS:
            parser.error(f"--workloads: unknown workload {w!r}; choose from {','.join(WORKLOADS)}")
    if not workers or min(workers) < 1 or args.items < 1 or args.repeats < 1:
        parser.error("--workers, --items and --repeats must be >= 1")
    if args.payload_mb < 0:
        parser.error(f"--payload-mb must be >= 0, got {args.payload_mb}")
    # torch's advice when the workers outnumber the CPUs (4 workers on a 2-CPU machine, here on purpose)
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    stale, modules = stale_bytecode()
    payload = f", the map-style dataset holding {args.payload_mb:g} MiB" if args.payload_mb else ""
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPUs (load {load()}); "
          f"{args.items:,} ints, batch {BATCH}{payload}; start methods {', '.join(methods)}; workers {args.workers}; "
          f"{args.repeats} repeat(s)", flush=True)
    if stale and sys.dont_write_bytecode:
        print(f"note: {stale} of {modules} datapipes modules have no up-to-date .pyc and PYTHONDONTWRITEBYTECODE is "
              f"set: every spawned or forkserver worker of ours compiles them", flush=True)
    runs = [(workload, method, w, name, build, data) for method in methods for w in workers
            for workload in workloads for name, build, data in SYSTEMS[workload]]
    results: Results = {r[:4]: [] for r in runs}
    want = list(range(args.items))
    started = time.perf_counter()
    try:
        if "forkserver" in methods:
            warm_forkserver()
        if not args.quick:  # warm-up: the files every worker imports are read once, the forkserver runs
            for workload, method, w, name, build, data in runs:
                if w == workers[0]:
                    one_run(build, data, method, w, args.items, BATCH, args.payload_mb)
        for r in range(args.repeats):
            for workload, method, w, name, build, data in runs:
                if args.wait_idle > 0:
                    wait_idle(args.wait_idle)
                row, got = one_run(build, data, method, w, args.items, BATCH, args.payload_mb)
                if sorted(got) != want:
                    print(f"{name} ({method}, {w} workers) yielded other items: {len(got)} ints, "
                          f"{sorted(set(want) - set(got))[:5]} missing", file=sys.stderr)
                    return 2
                row["cpu_total_s"] = None if row["workers_cpu_s"] is None else row["cpu_s"] + row["workers_cpu_s"]
                results[(workload, method, w, name)].append(row)
                cpu = "" if row["cpu_total_s"] is None else f", CPU {row['cpu_total_s'] * 1e3:,.0f} ms"
                print(f"  run {r + 1} {workload} {method} {w}w {name}: first batch {row['first_s'] * 1e3:,.0f} ms, "
                      f"epoch {row['epoch_s'] * 1e3:,.0f} ms{cpu}", file=sys.stderr, flush=True)
    except LeftRunning as e:
        print(f"worker_start.py: {e}", file=sys.stderr)
        return 1
    finally:
        stop_forkserver()
    left = _wait_children(5.0)
    print("\n".join(["", *table(results, methods, workers, workloads, args.repeats), ""]))
    print(f"{time.perf_counter() - started:.0f} s; load {load()}; worker processes left running: {len(left)}")
    if args.json:
        settings = {"methods": methods, "workers": workers, "workloads": workloads, "items": args.items,
                    "payload_mb": args.payload_mb, "batch": BATCH, "repeats": args.repeats, "quick": args.quick,
                    "wait_idle": args.wait_idle, "stale_bytecode": stale if sys.dont_write_bytecode else 0}
        _results.write(args.json, _results.document(
            "worker_start", settings, workloads_json(results, methods, workers, workloads, args.items, BATCH)))
    if left:
        print(f"worker_start.py: left running: {left}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
