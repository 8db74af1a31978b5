"""Result transfer from worker processes (issue 22): MB/s of arrays handed from workers to the consumer.

    .venv-bench/bin/python benchmarks/transfer.py                  # 150 KB, 1 MB and 8 MB arrays, 5 runs
    .venv-bench/bin/python benchmarks/transfer.py --sizes 150528 --repeats 3 --workers 4

Workload: each worker makes an array of the given size by copying one it made at start (about the
cost of a memcpy: what is measured is the way back, not the work) and returns it; the consumer
touches each result (sums one byte per page, so a lazily mapped result pays for its mapping) and
drops it. 1 GB of results per run (at least 200 items). The clock starts after the imports (numpy,
torch, datapipes), when the system is built, so it includes starting the workers. Every system runs in a fresh process, one
after the other, repeat by repeat (a run side by side); the figures are medians over the runs and
the target is judged in every run.

Systems, all with ``--workers`` worker processes:

- ``datapipes``: ``IterableWrapper(range(n)).map(make, executor="process", concurrency=W)``: large
  buffers come back in a memfd that the consumer maps (docs/architecture.rst, "Process stages");
- ``datapipes, in band``: the same with the buffers copied through the pipe, as before;
- ``torch DataLoader``: ``DataLoader(dataset, batch_size=None, num_workers=W)`` over a dataset
  returning the same arrays as tensors (torch's shared-memory tensor storage, one item at a time);
- ``torch DataLoader, batches``: the same with ``batch_size=32`` (the workers collate into shared
  memory: one copy in the worker, none in the consumer);
- ``datapipes, batches``: ``IterableWrapper(range(n)).batch(32).map(make_batch, executor="process")``:
  each worker stacks 32 arrays, and the stacked batch comes back through the memfd;
- ``datapipes, then collate``: ``datapipes`` followed by ``.batch(32).collate()``, the consumer
  stacking each batch (what a pipe with a process stage does: ``benchmarks/end_to_end.py``);
- ``datapipes, then collate, forked by the consumer``: the same with ``DATAPIPES_PROCESS_START=fork``:
  every worker forked by the consumer before the pool's threads start, where a pool of 6 workers or
  more is otherwise forked by a zygote while they start (docs/architecture.rst, "Process stages");
- ``threads, then collate``: ``datapipes, then collate`` on ``W`` threads
  (``map(make, concurrency=W)``): the first batch a process stage's is judged against (with
  ``--work-ms`` the items wait without the GIL, as the threads of a real I/O-bound stage do);
- ``datapipes.DataLoader``: ``datapipes.DataLoader(pipe, batch_size=32, num_workers=W)`` over
  ``IterableWrapper(range(n)).sharding_filter().map(make_tensor)``, its workers collating into
  shared memory and sending each batch's descriptors in one message over a socket of their own
  (docs/architecture.rst, "The loader");
- ``datapipes.DataLoader, torch's queue``: the same with ``DATAPIPES_WORKER_FDS=0``: the batches'
  storages handed over by torch's worker queue, one connection per storage (what torch's
  DataLoader does).

``--work-ms MS`` makes every item wait about ``MS`` first (jittered per item, the same in every
system), and sizes each run to about two seconds of the workers' work: a sleep costs no CPU, so 16
workers keep 16 items in progress on a 2-CPU machine, and what the table shows is the pipeline
itself (the window of chunks in flight, the consumer's cost per message) at 16 workers, as a
many-core host runs it. The table then adds items/s and their share of the workers' rate
(``W / (1.1 MS)``)::

    .venv-bench/bin/python benchmarks/transfer.py --work-ms 4 --workers 16 --sizes 150528 --repeats 3 \
        --only datapipes,datapipes_collate,dataloader_batch

The *first* column is the time from building the system to its first result (the first batch, for
the systems that batch): what starting the workers costs. With ``--work-ms`` and both
``threads_collate`` and ``datapipes_collate`` run, it reports the process stage's first batch
against the thread stage's (``end_to_end.py`` judges the 2x target on real images)::

    .venv-bench/bin/python benchmarks/transfer.py --work-ms 5 --workers 16 --sizes 150528 --repeats 7 \
        --only threads_collate,datapipes_collate,datapipes_collate_direct

The *worker RSS* column is the largest peak resident set of the system's worker processes
(``getrusage(RUSAGE_CHILDREN)`` once they are all reaped; pages of shared memory they touched
count): what a worker holds at its busiest, e.g. a DataLoader worker's batch being made beside the
one it sent.

Targets, in every run: datapipes' MB/s >= torch DataLoader's (item by item); datapipes.DataLoader's
>= the same loader's through torch's queue, for arrays up to 256 KB (larger batches are reported,
not judged: see ``JUDGED_UP_TO``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _results  # noqa: E402

#: the largest array size at which the loader's descriptor channel is judged against torch's queue:
#: what it saves is a connection per batch (a fixed cost), which larger batches hide behind their
#: copies and this machine's run-to-run spread (1 GB is 4 batches of 8 MiB arrays)
JUDGED_UP_TO = 256 << 10
#: with ``--work-ms``, seconds of the workers' work in a run (the items are sized from it)
ITEMS_S = 2.0

SYSTEMS = {
    "datapipes": "datapipes (memfd)",
    "inband": "datapipes, in band (before)",
    "dataloader": "torch DataLoader (shared-memory tensors)",
    "dataloader_batch": "torch DataLoader, batches of 32",
    "datapipes_batch": "datapipes (memfd), batches of 32 stacked in the worker",
    "datapipes_collate": "datapipes (memfd), then batch(32).collate() in the consumer",
    "datapipes_collate_direct": "datapipes (memfd), then collate; every worker forked by the consumer",
    "threads_collate": "datapipes threads, then batch(32).collate()",
    "loader_batch": "datapipes.DataLoader(num_workers=W), batches of 32",
    "loader_batch_queue": "datapipes.DataLoader(num_workers=W), batches of 32, through torch's queue",
}
_ARRAY: list[Any] = []
#: seconds each item waits before its array is made (``--work-ms``; 0: none)
WORK_S = 0.0
#: the mean of :func:`work_s`'s factor: the workers' rate is ``W / (WORK_MEAN * WORK_S)``
WORK_MEAN = 1.1


def work_s(i: int) -> float:
    """Item ``i``'s wait with ``--work-ms``: ``WORK_S`` times a factor drawn from ``i`` alone (the same
    in every system and run): uniform in 0.5-1.5, and three times that for one item in 20. Its mean
    is ``WORK_MEAN`` (1.1) times ``WORK_S``."""
    r = random.Random(i)
    f = r.uniform(0.5, 1.5)
    return WORK_S * f * (3.0 if r.random() < 0.05 else 1.0)


def make(i: int, size: int) -> Any:
    import numpy as np

    if WORK_S:
        time.sleep(work_s(i))  # a wait, not CPU: W workers keep W items in progress on any number of cores
    if not _ARRAY:
        _ARRAY.append(np.arange(size, dtype=np.uint8))
    return _ARRAY[0].copy()


class Arrays:
    """A map-style dataset of ``n`` tensors of ``size`` bytes (torch's DataLoader)."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch

        return torch.from_numpy(make(i, self.size))


def make_batch(indices: list[int], size: int) -> Any:
    """32 arrays stacked into one (``(32, size)``): a batch collated in the worker."""
    import numpy as np

    return np.stack([make(i, size) for i in indices])


def make_tensor(i: int, size: int) -> Any:
    import torch

    return torch.from_numpy(make(i, size))


def items(system: str, n: int, size: int, workers: int) -> Iterator[Any]:
    import functools

    if system == "datapipes_batch":
        from datapipes.iter import IterableWrapper

        return iter(IterableWrapper(range(n)).batch(32).map(functools.partial(make_batch, size=size),
                                                            executor="process", concurrency=workers))
    if system in ("loader_batch", "loader_batch_queue"):
        if system == "loader_batch_queue":
            os.environ["DATAPIPES_WORKER_FDS"] = "0"
        import datapipes
        from datapipes.iter import IterableWrapper

        pipe = IterableWrapper(range(n)).sharding_filter().map(functools.partial(make_tensor, size=size))
        return iter(datapipes.DataLoader(pipe, batch_size=32, num_workers=workers))
    if system in ("datapipes_collate", "datapipes_collate_direct", "threads_collate"):
        from datapipes.iter import IterableWrapper

        if system == "datapipes_collate_direct":
            os.environ["DATAPIPES_PROCESS_START"] = "fork"
        executor = "thread" if system == "threads_collate" else "process"
        return iter(IterableWrapper(range(n)).map(functools.partial(make, size=size), executor=executor,
                                                  concurrency=workers).batch(32).collate())
    if system in ("datapipes", "inband"):
        from datapipes._engine import _procworker
        from datapipes.iter import IterableWrapper

        if system == "inband":
            _procworker.OOB_SUPPORTED = False  # the pools started from here copy buffers through their pipes
        return iter(IterableWrapper(range(n)).map(functools.partial(make, size=size), executor="process",
                                                  concurrency=workers))
    from torch.utils.data import DataLoader

    if system == "dataloader":
        return iter(DataLoader(Arrays(n, size), batch_size=None, num_workers=workers))  # type: ignore[arg-type]
    return iter(DataLoader(Arrays(n, size), batch_size=32, num_workers=workers))  # type: ignore[arg-type]


def child(system: str, size: int, workers: int) -> dict[str, Any]:
    import numpy as np
    import torch
    import torch.utils.data  # noqa: F401 - every system's imports happen before the clock

    import datapipes.iter  # noqa: F401

    n = max(200, (1 << 30) // size) if not WORK_S else max(200, int(ITEMS_S * workers / (WORK_MEAN * WORK_S)))
    page = 4096
    t0 = time.perf_counter()
    first = None
    total = 0
    check = 0
    for x in items(system, n, size, workers):
        if first is None:
            first = time.perf_counter() - t0
        a = x.numpy() if isinstance(x, torch.Tensor) else x
        rows = a.reshape(-1, size)  # one row per array (a batch holds several)
        check += int(rows[:, ::page].sum())  # touch every page of the result
        total += rows.nbytes
        del x, a, rows
    seconds = time.perf_counter() - t0
    gc.collect()  # the pipe, its iterator's owner: its warm pool shuts down (a DataLoader's workers already have)
    # the largest peak RSS of the worker processes, all reaped by now (a zygote's workers are adopted)
    worker_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    expected = int(np.arange(size, dtype=np.uint8)[::page].astype(np.int64).sum())
    per_item = expected * n
    if total != n * size or check != per_item:
        raise SystemExit(f"{system}: got {total} bytes (checksum {check}), expected {n * size} ({per_item})")
    return {"system": system, "seconds": seconds, "mb_s": total / seconds / 1e6, "items": n, "items_s": n / seconds,
            "first_ms": 1000 * (first or 0.0), "worker_mb": worker_mb}


def run_child(system: str, size: int, workers: int) -> dict[str, Any] | str:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", system, "--sizes", str(size), "--workers", str(workers),
           "--work-ms", str(1000 * WORK_S)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return (r.stderr.strip().splitlines() or ["failed"])[-1][:120]
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="150528,1048576,8388608",
                        help="comma list of array sizes in bytes (default: a 3x224x224 uint8 image, 1 MiB, 8 MiB)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of every system (default 2)")
    parser.add_argument("--repeats", type=int, default=5, help="runs, each running every system once (default 5)")
    parser.add_argument("--only", default=None, help="comma list of systems: " + ",".join(SYSTEMS))
    parser.add_argument("--work-ms", type=float, default=0.0,
                        help="each item first waits about this long (a sleep, jittered per item: see work_s), so "
                             "that --workers 16 behaves as 16 busy workers would on any machine: the many-core "
                             "proxy of a process stage's pipeline (its window, its consumer); runs last about "
                             f"{ITEMS_S:.0f} s of work each, and report items/s against the workers' rate")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global WORK_S
    WORK_S = args.work_ms / 1000
    if WORK_S < 0:
        parser.error(f"--work-ms must be >= 0, got {args.work_ms}")
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.child:
        print(json.dumps(child(args.child, sizes[0], args.workers)))
        return 0
    systems = list(SYSTEMS) if args.only is None else args.only.split(",")
    for s in systems:
        if s not in SYSTEMS:
            parser.error(f"--only: unknown system {s!r}; choose from {','.join(SYSTEMS)}")
    import torch

    what = "1 GB of results each" if not WORK_S else (
        f"each item waits {args.work_ms:g} ms x U(0.5, 1.5) (x3 for 1 in 20) first: the workers' rate is "
        f"{args.workers / (WORK_MEAN * WORK_S):,.0f} items/s")
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPUs; {args.workers} worker "
          f"processes; medians of {args.repeats} fresh-process runs, {what}")
    ok = True
    for size in sizes:
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
        failed: dict[str, str] = {}
        for r in range(args.repeats):
            for s in systems:
                if s in failed:
                    continue
                _results.record_run(run_child(s, size, args.workers), s, runs[s], failed,
                                    f"{size:,} bytes, run {r + 1} {SYSTEMS[s]}",
                                    lambda o: f"{o['mb_s']:,.0f} MB/s, {o['items_s']:,.0f} items/s, "
                                              f"first {o['first_ms']:.0f} ms")
        print(f"\n### arrays of {size:,} bytes\n")
        if WORK_S:
            rate = args.workers / (WORK_MEAN * WORK_S)
            print("| system | MB/s | vs torch DataLoader | first | worker RSS | items/s | of the workers' rate |")
            print("|---|---:|---:|---:|---:|---:|---:|")
        else:
            print("| system | MB/s | vs torch DataLoader | first | worker RSS |")
            print("|---|---:|---:|---:|---:|")
        base = runs.get("dataloader") or []
        base_med = statistics.median(r["mb_s"] for r in base) if base else None
        for s in systems:
            if s in failed:
                print(f"| {SYSTEMS[s]} | failed: {failed[s]} | |")
                continue
            med = statistics.median(r["mb_s"] for r in runs[s])
            first = statistics.median(r["first_ms"] for r in runs[s])
            rss = statistics.median(r["worker_mb"] for r in runs[s])
            row = (f"| {SYSTEMS[s]} | {med:,.0f} | {f'{med / base_med:.2f}x' if base_med else '-'} | {first:.0f} ms | "
                   f"{rss:,.0f} MB |")
            if WORK_S:
                ips = statistics.median(r["items_s"] for r in runs[s])
                row += f" {ips:,.0f} | {ips / rate:.0%} |"
            print(row)
        ours = runs.get("datapipes") or []
        if ours and base:
            ratios = [a["mb_s"] / b["mb_s"] for a, b in zip(ours, base)]
            held = sum(r >= 1.0 for r in ratios)
            passed = held == len(ratios)
            ok &= passed
            print(f"\n  {'PASS' if passed else 'FAIL'}  datapipes >= torch DataLoader's MB/s in every run: run ratios min "
                  f"{min(ratios):.2f}, median {statistics.median(ratios):.2f}, max {max(ratios):.2f}, held in "
                  f"{held}/{len(ratios)}")
        threads = runs.get("threads_collate") or []
        for s in ("datapipes_collate", "datapipes_collate_direct"):
            procs = runs.get(s) or []
            if procs and threads:
                ratios = [a["first_ms"] / b["first_ms"] for a, b in zip(procs, threads)]
                print(f"  (reported)  first batch of {SYSTEMS[s]} over the threads': run ratios min {min(ratios):.2f}, "
                      f"median {statistics.median(ratios):.2f}, max {max(ratios):.2f}")
        channel, queue = runs.get("loader_batch") or [], runs.get("loader_batch_queue") or []
        if channel and queue:
            ratios = [a["mb_s"] / b["mb_s"] for a, b in zip(channel, queue)]
            held = sum(r >= 1.0 for r in ratios)
            spread = (f"run ratios min {min(ratios):.2f}, median {statistics.median(ratios):.2f}, max {max(ratios):.2f}, "
                      f"held in {held}/{len(ratios)}")
            if size <= JUDGED_UP_TO:
                passed = held == len(ratios)
                ok &= passed
                print(f"  {'PASS' if passed else 'FAIL'}  datapipes.DataLoader's descriptor channel >= torch's queue in "
                      f"every run: {spread}")
            else:
                print(f"  (not judged)  datapipes.DataLoader's descriptor channel vs torch's queue: {spread}; a batch of "
                      f"{32 * size / 2**20:.0f} MiB costs its copies, not its connections")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
