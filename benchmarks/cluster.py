"""Executors on a cluster: a stage on Ray tasks, Ray actors and a Dask client, beside our process executor.

Two workloads, all systems in one process, repeats interleaved, medians:

1. **CPU-bound fn** (pure Python, about 3 ms an item; ``--items`` of them): ``map(fn,
   executor="process", concurrency=<cores>)`` (its own chunking) against ``map(fn,
   executor=RayExecutor(), chunksize=32, concurrency=2 * <cores>)`` on a local Ray runtime of
   ``<cores>`` CPUs. Target (issue 23): Ray reaches at least 90% of the process executor's items/s,
   in the median.
2. **Overhead per item** (``fn`` returns its item): milliseconds of wall time per item through each
   executor, one item per submit and ``chunksize=32``: Ray tasks, Ray actors (one per core), Dask's
   ``Client.get_executor()`` on a ``LocalCluster`` of one single-threaded worker process per core,
   our process executor. No target: the figures for docs/performance.rst.

Both stages are built once and iterated once per repeat: the process executor's warm pool and Ray's
and Dask's worker processes are started before the first timed repeat (one untimed pass each).

    .venv/bin/python benchmarks/cluster.py                 # 2 cores here; Ray and distributed from requirements-test.txt
    .venv/bin/python benchmarks/cluster.py --cores 16 --items 8000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def calibrate(target_s: float = 0.003) -> int:
    """Loop iterations of :func:`burn` that take about ``target_s`` seconds here."""
    n = 10_000
    while True:
        t = time.perf_counter()
        burn_n(n)
        took = time.perf_counter() - t
        if took > 0.05:
            return max(1, int(n * target_s / took))
        n *= 2


def burn_n(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


class Burn:
    """The CPU-bound fn: ``n`` loop iterations of pure Python (picklable, so every executor takes it)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, x: int) -> int:
        burn_n(self.n)
        return x


def identity(x: Any) -> Any:
    return x


def timed(pipe: Any, n: int) -> float:
    """Seconds for one pass of ``pipe`` (checked to give ``n`` items)."""
    t = time.perf_counter()
    count = sum(1 for _ in pipe)
    took = time.perf_counter() - t
    if count != n:
        raise RuntimeError(f"{pipe!r} gave {count} items, expected {n}")
    return took


def interleaved(systems: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    for run in systems.values():  # warm up: pools, workers, imports
        run()
    out: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(repeats):
        for name, run in systems.items():
            out[name].append(run())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cores", type=int, default=2, help="CPUs given to every system (default 2)")
    parser.add_argument("--items", type=int, default=960, help="items of the CPU-bound workload (default 960)")
    parser.add_argument("--overhead-items", type=int, default=600,
                        help="items per system of the overhead workload, one per submit (x8 with chunks; default 600)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per system, interleaved (default 5)")
    parser.add_argument("--only", action="append", choices=["cpu", "overhead"])
    parser.add_argument("--json", metavar="PATH", help="also write the figures and the machine to PATH")
    args = parser.parse_args(argv)
    only = set(args.only or ["cpu", "overhead"])

    import ray
    from distributed import Client, LocalCluster

    from datapipes.iter import IterableWrapper
    from datapipes.ray import RayExecutor

    cores = args.cores
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False, logging_level="warning")
    workloads: list[dict[str, Any]] = []
    failed = False
    print(f"{cores} cores; Ray {ray.__version__}; python {sys.version.split()[0]}; medians of {args.repeats}")
    try:
        if "cpu" in only:
            burn = Burn(calibrate())
            n = args.items
            source = IterableWrapper(range(n))
            process = source.map(burn, executor="process", concurrency=cores)
            with RayExecutor() as tasks:
                on_ray = source.map(burn, executor=tasks, chunksize=32, concurrency=2 * cores)
                runs = interleaved({
                    "datapipes map(executor='process')": lambda: timed(process, n),
                    "datapipes map(executor=RayExecutor(), chunksize=32)": lambda: timed(on_ray, n),
                }, args.repeats)
            t0 = time.perf_counter()
            burn(0)
            one = time.perf_counter() - t0
            print(f"\n1. CPU-bound fn ({one * 1e3:.1f} ms an item, {n} items), items/s")
            rates = {name: [n / s for s in times] for name, times in runs.items()}
            base = statistics.median(rates["datapipes map(executor='process')"])
            systems = []
            for name, values in rates.items():
                median = statistics.median(values)
                print(f"  {name:<55} {median:>8.0f}  x{median / base:.2f}  (runs: "
                      f"{', '.join(f'{v:.0f}' for v in values)})")
                systems.append(_results.system(name, "datapipes", median, values, base))
            ratio = statistics.median(rates["datapipes map(executor=RayExecutor(), chunksize=32)"]) / base
            passed = ratio >= 0.90
            failed |= not passed
            print(f"  target: Ray with chunksize=32 >= 0.90x the process executor: x{ratio:.2f} "
                  f"{'PASS' if passed else 'FAIL'}")
            workloads.append({"name": "cpu", "title": f"CPU-bound fn, {one * 1e3:.1f} ms an item", "unit": "items/s",
                              "baseline": "datapipes map(executor='process')", "systems": systems,
                              "targets": [{"text": "Ray chunksize=32 >= 0.90x process", "value": ratio,
                                           "passed": passed}]})

        if "overhead" in only:
            small, large = args.overhead_items, args.overhead_items * 8
            sizes: dict[str, int] = {}

            def stages(executors: dict[str, Any]) -> dict[str, Callable[[], float]]:
                out: dict[str, Callable[[], float]] = {}
                for name, executor in executors.items():
                    for chunk in (1, 32):
                        n = small if chunk == 1 else large
                        pipe = IterableWrapper(range(n)).map(identity, executor=executor, chunksize=chunk,
                                                             concurrency=4 * cores)
                        key = f"{name}, {'one item per submit' if chunk == 1 else 'chunksize=32'}"
                        out[key] = (lambda p, k: lambda: timed(p, k))(pipe, n)
                        sizes[key] = n
                return out

            with LocalCluster(n_workers=cores, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                    Client(cluster) as client, RayExecutor() as tasks:
                runs = interleaved(stages({"Ray tasks": tasks, "Dask get_executor()": client.get_executor(),
                                           "process executor": "process"}), args.repeats)
            # Actors hold their CPUs while they live: measured on their own, or the tasks above would
            # wait for CPUs forever.
            with RayExecutor(actors=cores) as actors:
                runs.update(interleaved(stages({"Ray actors": actors}), args.repeats))
            print("\n2. overhead per item (fn returns its item), ms of wall time per item")
            systems = []
            for key, times in runs.items():
                per_item = [s / sizes[key] * 1e3 for s in times]
                median = statistics.median(per_item)
                print(f"  {key:<45} {median:>8.3f} ms  (runs: {', '.join(f'{v:.3f}' for v in per_item)})")
                systems.append(_results.system(key, "reference", 1e3 / median, [1e3 / v for v in per_item],
                                               ms_per_item=median))
            workloads.append({"name": "overhead", "title": "overhead per item", "unit": "items/s",
                              "baseline": None, "systems": systems, "targets": []})
    finally:
        ray.shutdown()
    if args.json:
        _results.write(args.json, _results.document("cluster", vars(args), workloads))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
