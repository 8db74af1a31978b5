"""End-to-end image benchmark (targets: docs/performance.rst, "Targets"; issue 5): a JPEG folder -> batches of uint8 tensors.

    .venv-bench/bin/python benchmarks/end_to_end.py                   # every system, 5 runs, both mallocs
    .venv-bench/bin/python benchmarks/end_to_end.py --repeats 7 --malloc tuned
    .venv-bench/bin/python benchmarks/end_to_end.py --only datapipes,nodes,limit --concurrency 2,3,4
    .venv-bench/bin/python benchmarks/end_to_end.py --cores 16 --repeats 3       # a many-core host
    nice -n -10 .venv-bench/bin/python benchmarks/end_to_end.py --repeats 5   # on a shared machine

Workload: 1,000 generated ~500x375 JPEGs in class folders on disk (``datapipes._demo_data``, seed 0)
-> read -> decode + resize to 224x224 -> ``(3, 224, 224)`` uint8 arrays -> batches of 32 -> a uint8
tensor ``(32, 3, 224, 224)`` (the last one ``(8, 3, 224, 224)``). No shuffling.

Every system runs in a FRESH PROCESS (this script started again with ``--child``), one after the
other, interleaved repeat by repeat, so none inherits another's warm allocator, thread pools or page
faults; the figures are medians over the repeats. In the child, the clock starts after the imports,
when the system starts building its pipeline (listing the files is inside the clock), and stops at
the last batch:

- images/s: 1,000 images over that whole time (start-up and time to first batch included);
- first batch: from building the pipeline to holding the first batch;
- peak RSS: the child's ``VmHWM`` plus the ``VmHWM`` of each of its worker processes, read while the
  last batch is held (workers still alive), from ``/proc``;
- CPU s: user + system time of the child and its workers; cores used: CPU s over wall time. On a
  shared machine a run that got fewer cores shows it here; before each run the script waits (up
  to ``--wait-idle`` seconds) for the machine to be idle.

Systems, all with the same per-image decode function (:func:`decode_bytes`: Pillow open, ``draft``
(a no-op at this size: 1/2 scale would be 250x188, under 224), RGB, bilinear resize, channels-first
copy) and the same thread count where they use threads. ``--cores N`` (default 2) gives every system
N: DataLoader workers, process pools, the limit's threads, and the default ``--concurrency``. Each
peer runs in the form its documentation gives:

- ``datapipes``: ``FileLister -> open_files("b") -> map(decode, concurrency=C) -> batch(32) -> collate()``;
- ``datapipes_natural``: the pipe a user writes first, ``FileLister -> open_files("b") -> map(read) ->
  map(decode, concurrency=C) -> batch(32) -> collate()``: the read as its own serial map;
- ``datapipes_process``: ``FileLister -> map(load, executor="process", concurrency=N) -> batch(32) ->
  collate()``: the paths go to the worker processes, which read and decode;
- ``torch DataLoader(num_workers=0)`` / ``(num_workers=N)``: a map-style ``Dataset`` over the file
  list, ``batch_size=32``, torch's default collate (shared-memory batches in workers);
- ``torch DataPipes + DataLoader(num_workers=N)``: ``torch.utils.data.datapipes`` ``FileLister ->
  sharding_filter -> FileOpener -> Mapper(decode)`` through the DataLoader (batch 32, default collate);
- ``torchdata.nodes``: ``IterableWrapper -> ParallelMapper(C threads, in order) -> Batcher(32) ->
  Mapper(stack) -> Prefetcher(2) -> Loader``, and the same with ``method="process"`` and N workers;
- ``spdl.pipeline``: ``add_source(paths) -> pipe(decode, concurrency=C) -> aggregate(32) ->
  pipe(stack) -> add_sink(3)``, ``build(num_threads=C)``, SPDL's default completion order; and the
  same with the decode on a ``ProcessPoolExecutor(N)`` (``pipe(..., executor=)``);
- ``limit``: every file read into memory first (outside the clock), then a plain
  ``ThreadPoolExecutor(N)`` decoding them with 2N futures in flight, grouped by 32 and stacked.

``stack`` (nodes, SPDL, limit) is ``torch.from_numpy(np.stack(batch))``: numpy's copy, no torch
kernel, so no peer pays for torch's intra-op thread pool. Nothing in a measuring loop calls torch.

Runs: each repeat runs every system once, one after the other (a run side by side); ``--repeats``
(default 5) such runs. The table shows medians over the runs; each target is also judged run by run
(our figure over the peer's, the limit's or DataLoader(num_workers=N)'s of the same run) and passes
only when it held in EVERY run: its line gives the min / median / max of the run ratios and how many
runs it held in (``--json``: the target's ``run_values`` and ``runs_passed``).

Targets (printed PASS/FAIL, measured with the tuned malloc and the default one):
- datapipes ahead of every peer in images/s, and >= 75% of the limit; the natural pipe too ahead of
  every peer;
- datapipes' time to first batch <= 1/3 of torch DataLoader(num_workers=N)'s;
- datapipes' peak RSS <= 1/2 of torch DataLoader(num_workers=N)'s (its workers included);
- the process stage >= torch DataLoader(num_workers=N) and nodes' process mapper in images/s, with
  its first batch within 2x of the thread stage's; from 8 cores, >= 90% of the core limit (N over
  the CPU time per image of the serial DataLoader(num_workers=0) run).

Malloc: decoding on the main thread page-faults far more than on a worker thread under glibc's
default, dynamic mmap threshold (docs/performance.rst); every system is therefore run twice, with the
default malloc and with ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` pinned in the child's
environment.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _results  # noqa: E402

SIZE = 224
BATCH = 32
TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "268435456"}

SYSTEMS = ["datapipes", "datapipes_natural", "datapipes_process", "dataloader0", "dataloaderN", "datapipes_torch", "nodes", "nodes_process",
           "spdl", "spdl_process", "limit"]
#: ``{c}``: the concurrency of the run; ``{n}``: the cores every system is given (``--cores``)
LABELS = {
    "datapipes": "datapipes (concurrency={c})",
    "datapipes_natural": "datapipes natural pipe: map(read) -> map(decode, concurrency={c})",
    "datapipes_process": "datapipes map(executor=\"process\", concurrency={n})",
    "dataloader0": "torch DataLoader(num_workers=0)",
    "dataloaderN": "torch DataLoader(num_workers={n})",
    "datapipes_torch": "torch DataPipes + DataLoader(num_workers={n})",
    "nodes": "torchdata.nodes ({c} threads, Prefetcher)",
    "nodes_process": "torchdata.nodes ({n} processes, Prefetcher)",
    "spdl": "spdl.pipeline ({c} threads)",
    "spdl_process": "spdl.pipeline (ProcessPoolExecutor({n}))",
    "limit": "limit: ThreadPoolExecutor({n}), bytes in memory",
}
#: systems whose concurrency is ``--concurrency`` (each value: one row); the others are given ``--cores``
THREADED = ("datapipes", "datapipes_natural", "nodes", "spdl")
OURS = ("datapipes", "datapipes_natural", "datapipes_process")
PEERS = ["dataloader0", "dataloaderN", "datapipes_torch", "nodes", "nodes_process", "spdl", "spdl_process"]
ALIASES = {"dataloader2": "dataloaderN"}  # the name of the row before --cores
#: the cores every system is given (``--cores``): workers, processes, the limit's threads
CORES = 2


def label(system: str, c: int | str) -> str:
    return LABELS[system].format(c=c, n=CORES)


# -- the shared per-image work (imported lazily: the parent process never decodes) -----------------


def decode_bytes(data: bytes) -> Any:
    """JPEG bytes -> a ``(3, 224, 224)`` uint8 array: the one decode function every system runs."""
    import numpy as np
    from PIL import Image

    img: Image.Image = Image.open(io.BytesIO(data))
    img.draft("RGB", (SIZE, SIZE))
    if img.mode != "RGB":
        img = img.convert("RGB")
    img = img.resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    return np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1))


def load(path: str) -> Any:
    """A path -> its decoded image (peers that take paths)."""
    with open(path, "rb") as f:
        return decode_bytes(f.read())


def load_pair(item: tuple[str, Any]) -> Any:
    """A ``(path, stream)`` pair from ``open_files`` -> its decoded image (datapipes, torch DataPipes)."""
    _, stream = item
    try:
        data = stream.read()
    finally:
        stream.close()
    return decode_bytes(data)


def stack(batch: list[Any]) -> Any:
    import numpy as np
    import torch

    return torch.from_numpy(np.stack(batch))


def list_jpegs(root: str) -> list[str]:
    out: list[str] = []
    for folder, _, files in os.walk(root):
        out.extend(os.path.join(folder, f) for f in files if f.endswith(".jpg"))
    out.sort()
    return out


# -- peak RSS (psutil is not installed: /proc) ------------------------------------------------------


def _hwm_kb(pid: int | str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def workers_hwm_kb() -> dict[int, int]:
    """``{pid: VmHWM}`` of this process's descendants alive now."""
    out: dict[int, int] = {}
    todo = _children(os.getpid())
    while todo:
        pid = todo.pop()
        out[pid] = _hwm_kb(pid)
        todo.extend(_children(pid))
    return out


# -- the systems (each returns an iterator of batches; the clock runs around building + iterating) -----


def run_datapipes(root: str, c: int) -> Iterator[Any]:
    from datapipes.iter import FileLister

    pipe = FileLister(root, "*.jpg", recursive=True).open_files(mode="b").map(load_pair, concurrency=c).batch(BATCH).collate()
    return iter(pipe)


class JpegFolder:
    """The map-style dataset a torch user writes: the file list, one decoded image per index."""

    def __init__(self, root: str) -> None:
        self.paths = list_jpegs(root)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Any:
        return load(self.paths[i])


def read_pair(item: tuple[str, Any]) -> bytes:
    """A ``(path, stream)`` pair from ``open_files`` -> the file's bytes (the natural pipe's first map)."""
    _, stream = item
    try:
        return stream.read()
    finally:
        stream.close()


def run_datapipes_natural(root: str, c: int) -> Iterator[Any]:
    """The pipe a user writes first: the read as its own (serial) map before the concurrent decode."""
    from datapipes.iter import FileLister

    pipe = (FileLister(root, "*.jpg", recursive=True).open_files(mode="b").map(read_pair)
            .map(decode_bytes, concurrency=c).batch(BATCH).collate())
    return iter(pipe)


def run_datapipes_process(root: str, n: int) -> Iterator[Any]:
    """Our natural pipe for GIL-bound work: the paths go to ``n`` worker processes, which read and decode."""
    from datapipes.iter import FileLister

    pipe = FileLister(root, "*.jpg", recursive=True).map(load, executor="process", concurrency=n).batch(BATCH).collate()
    return iter(pipe)


def run_dataloader(root: str, workers: int) -> Iterator[Any]:
    from torch.utils.data import DataLoader

    return iter(DataLoader(JpegFolder(root), batch_size=BATCH, num_workers=workers))  # type: ignore[arg-type]


def run_datapipes_torch(root: str, n: int) -> Iterator[Any]:
    from torch.utils.data import DataLoader
    from torch.utils.data.datapipes.iter import FileLister

    dp = FileLister(root, "*.jpg", recursive=True).sharding_filter().open_files(mode="b").map(load_pair)
    return iter(DataLoader(dp, batch_size=BATCH, num_workers=n))


def run_nodes(root: str, c: int, method: str = "thread") -> Iterator[Any]:
    """torchdata.nodes as its documentation builds a loader: the mapper, the batcher, a
    ``Prefetcher`` in front of the ``Loader`` (it overlaps the consumer's work with the graph's)."""
    import torchdata.nodes as tn

    node = tn.ParallelMapper(tn.IterableWrapper(list_jpegs(root)), load, num_workers=c, method=method, in_order=True)
    node = tn.Mapper(tn.Batcher(node, BATCH, drop_last=False), stack)
    return iter(tn.Loader(tn.Prefetcher(node, prefetch_factor=2)))


def run_spdl(root: str, c: int, processes: int = 0) -> Iterator[Any]:
    """SPDL's pipeline; with ``processes``, the decode stage on a ``ProcessPoolExecutor`` of that size
    (SPDL's documented way to run GIL-bound work)."""
    from spdl.pipeline import PipelineBuilder

    executor = None
    if processes:
        from concurrent.futures import ProcessPoolExecutor

        executor = ProcessPoolExecutor(processes)
    pipeline = (
        PipelineBuilder().add_source(list_jpegs(root)).pipe(load, concurrency=processes or c, executor=executor)
        .aggregate(BATCH).pipe(stack).add_sink(3).build(num_threads=processes or c)
    )

    def run() -> Iterator[Any]:
        try:
            with pipeline.auto_stop():
                yield from pipeline.get_iterator(timeout=600)
        finally:
            if executor is not None:
                executor.shutdown()

    return run()


def run_limit(datas: list[bytes], n: int = 2) -> Iterator[Any]:
    """Decode in-memory bytes on a plain ``ThreadPoolExecutor(n)``, ``2 * n`` futures in flight.

    A bounded window rather than ``ex.map`` over everything: ``ex.map`` first submits all 1,000
    items from the main thread, a Python loop that holds the GIL while the workers queue for it
    between images (seen here: first batch ~150-200 ms instead of ~60-90 ms, and a lower rate).
    """
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    window = 2 * n

    def run() -> Iterator[Any]:
        with ThreadPoolExecutor(n) as ex:
            submit = ex.submit
            pending: deque[Any] = deque()
            batch = []
            for data in datas:
                pending.append(submit(decode_bytes, data))
                if len(pending) < window:
                    continue
                batch.append(pending.popleft().result())
                if len(batch) == BATCH:
                    yield stack(batch)
                    batch = []
            while pending:
                batch.append(pending.popleft().result())
                if len(batch) == BATCH:
                    yield stack(batch)
                    batch = []
            if batch:
                yield stack(batch)

    return run()


def child(system: str, root: str, c: int, n: int = 2) -> dict[str, Any]:
    """Run one system once in this (fresh) process; return its figures."""
    import warnings

    warnings.filterwarnings("ignore")
    # Imports happen before the clock: numpy, Pillow's JPEG plugin, torch, and the system's own package.
    import numpy  # noqa: F401
    import torch  # noqa: F401
    from PIL import Image, JpegImagePlugin  # noqa: F401

    Image.init()
    build: Callable[[], Iterator[Any]]
    if system in ("datapipes", "datapipes_natural", "datapipes_process"):
        import datapipes.iter  # noqa: F401

        build = {"datapipes": lambda: run_datapipes(root, c), "datapipes_natural": lambda: run_datapipes_natural(root, c),
                 "datapipes_process": lambda: run_datapipes_process(root, n)}[system]
    elif system in ("dataloader0", "dataloaderN"):
        import torch.utils.data  # noqa: F401

        build = lambda: run_dataloader(root, 0 if system == "dataloader0" else n)  # noqa: E731
    elif system == "datapipes_torch":
        import torch.utils.data.datapipes.iter  # noqa: F401

        build = lambda: run_datapipes_torch(root, n)  # noqa: E731
    elif system in ("nodes", "nodes_process"):
        import torchdata.nodes  # noqa: F401

        build = (lambda: run_nodes(root, c)) if system == "nodes" else (lambda: run_nodes(root, n, "process"))
    elif system in ("spdl", "spdl_process"):
        import spdl.pipeline  # noqa: F401

        build = (lambda: run_spdl(root, c)) if system == "spdl" else (lambda: run_spdl(root, c, processes=n))
    elif system == "limit":
        datas = []
        for p in list_jpegs(root):
            with open(p, "rb") as f:
                datas.append(f.read())
        build = lambda: run_limit(datas, n)  # noqa: E731
    else:
        raise SystemExit(f"unknown system {system!r}")
    expected = len(list_jpegs(root))
    last = (expected + BATCH - 1) // BATCH
    cpu0 = os.times()
    thread0 = time.thread_time()
    t0 = time.perf_counter()
    it = build()
    first_at = 0.0
    shape = None
    images = batches = 0
    workers: dict[int, int] = {}
    for batch in it:
        if batches == 0:
            first_at = time.perf_counter()
            shape, dtype = tuple(batch.shape), str(batch.dtype)
        images += batch.shape[0]
        batches += 1
        if batches == last:  # workers are still alive while the last batch is held
            workers = workers_hwm_kb()
    t1 = time.perf_counter()
    thread_cpu = time.thread_time() - thread0
    del it  # a DataLoader joins its workers here, so their CPU time is counted below
    gc.collect()
    cpu1 = os.times()
    if images != expected or shape != (BATCH, 3, SIZE, SIZE) or dtype != "torch.uint8":
        raise SystemExit(f"{system}: got {images} images, first batch {shape} {dtype}; expected {expected}, "
                         f"({BATCH}, 3, {SIZE}, {SIZE}) torch.uint8")
    own = _hwm_kb("self")
    return {
        "system": system,
        "images": images,
        "seconds": t1 - t0,
        "first_s": first_at - t0,
        "steady_ips": (images - BATCH) / max(t1 - first_at, 1e-9),
        "rss_mb": (own + sum(workers.values())) / 1024,
        "workers": len(workers),
        "cpu_s": (cpu1.user + cpu1.system + cpu1.children_user + cpu1.children_system)
        - (cpu0.user + cpu0.system + cpu0.children_user + cpu0.children_system),
        # this thread's own CPU time: in DataLoader(num_workers=0), the serial work of every image
        # (read, decode, resize), without what torch's intra-op threads spend in its collate
        "thread_cpu_s": thread_cpu,
    }


# -- the parent: generate, run every system in fresh processes, tabulate -----------------------------


def available(system: str, python: str) -> bool:
    mod = {"nodes": "torchdata.nodes", "nodes_process": "torchdata.nodes", "spdl": "spdl.pipeline",
           "spdl_process": "spdl.pipeline", "datapipes_torch": "torch.utils.data.datapipes.iter"}
    if system not in mod:
        return True
    r = subprocess.run([python, "-c", f"import {mod[system]}"], capture_output=True)
    return r.returncode == 0


def cpu_busy(seconds: float = 0.3) -> float:
    """The fraction of the machine's CPU time spent busy over ``seconds`` (from ``/proc/stat``)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)

    idle0, total0 = sample()
    time.sleep(seconds)
    idle1, total1 = sample()
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def wait_idle(limit_s: float) -> float:
    """Wait (at most ``limit_s``) until the machine is nearly idle; return the last busy fraction seen.

    On a shared machine another process's burst would otherwise land on whichever system happens to
    run then; waiting spreads the luck more evenly (medians over repeats do the rest)."""
    deadline = time.monotonic() + limit_s
    busy = cpu_busy()
    while busy > 0.1 and time.monotonic() < deadline:
        time.sleep(0.5)
        busy = cpu_busy()
    return busy


def run_child(system: str, root: str, c: int, env: dict[str, str]) -> dict[str, Any] | str:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", system, "--root", root, "--concurrency", str(c),
           "--cores", str(CORES)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return (r.stderr.strip().splitlines() or ["failed"])[-1][:100]
    return json.loads(r.stdout.strip().splitlines()[-1])


def median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def table(results: dict[str, list[dict[str, Any]]], order: list[tuple[str, int]], failed: dict[str, str],
          skipped: list[str]) -> dict[str, dict[str, float]]:
    """Print the Markdown table of medians; return them by system key."""
    med: dict[str, dict[str, float]] = {}
    for key, rows in results.items():
        if rows:
            med[key] = {k: median(rows, k) for k in ("seconds", "first_s", "steady_ips", "rss_mb", "cpu_s")}
            if all("thread_cpu_s" in r for r in rows):  # (figures written before it was measured lack it)
                med[key]["thread_cpu_s"] = median(rows, "thread_cpu_s")
            med[key]["cores"] = statistics.median(r["cpu_s"] / r["seconds"] for r in rows)
            med[key]["ips"] = rows[0]["images"] / med[key]["seconds"]
    base = med.get("dataloader0:0", {}).get("ips")
    print("| system | images/s | vs DataLoader(0) | steady images/s | first batch (ms) | peak RSS (MB) | CPU s | cores used |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for system, c in order:
        key = f"{system}:{c}"
        name = label(system, c)
        if key in failed:
            print(f"| {name} | failed: {failed[key]} | | | | | | |")
            continue
        if key not in med:
            continue
        m = med[key]
        ratio = f"{m['ips'] / base:.2f}x" if base else "-"
        print(f"| {name} | {m['ips']:,.0f} | {ratio} | {m['steady_ips']:,.0f} | {1000 * m['first_s']:.0f} | "
              f"{m['rss_mb']:,.0f} | {m['cpu_s']:.2f} | {m['cores']:.2f} |")
    for system in skipped:
        print(f"| {label(system, '-')} | not installed | | | | | | |")
    return med


def per_run(results: dict[str, list[dict[str, Any]]], c: int) -> dict[str, list[float]]:
    """The targets' ratios in each repeat (a repeat runs every system once, one after the other: a run
    side by side), over the repeats every system involved completed. Keys: ``peer`` (ours over the
    best peer of that run, images/s), ``limit`` (ours over the limit), ``first`` (our time to first batch
    over DataLoader(num_workers=N)'s), ``rss`` (our peak RSS over DataLoader(num_workers=N)'s); for the
    process stage: ``proc_peer`` (its images/s over the best of DataLoader(num_workers=N) and nodes'
    process mapper), ``proc_first`` (its time to first batch over the thread stage's); ``natural_peer``
    (the natural pipe's images/s over the best peer of that run)."""
    ours = results.get(f"datapipes:{c}") or []
    natural = results.get(f"datapipes_natural:{c}") or []
    peers = [rows for key, rows in results.items() if key.split(":")[0] in PEERS and rows]
    limit, dl2 = results.get("limit:0") or [], results.get("dataloaderN:0") or []
    ips = lambda r: r["images"] / r["seconds"]  # noqa: E731
    out: dict[str, list[float]] = {"peer": [], "limit": [], "first": [], "rss": [], "proc_peer": [], "proc_first": [],
                                   "natural_peer": [], "proc_all": []}
    for i, r in enumerate(natural):
        if peers and all(i < len(rows) for rows in peers):
            out["natural_peer"].append(ips(r) / max(ips(rows[i]) for rows in peers))
    proc = results.get("datapipes_process:0") or []
    proc_peers = [rows for key in ("dataloaderN:0", "nodes_process:0") if (rows := results.get(key))]
    everyone = peers + ([limit] if limit else [])
    for i, r in enumerate(proc):
        if proc_peers and all(i < len(rows) for rows in proc_peers):
            out["proc_peer"].append(ips(r) / max(ips(rows[i]) for rows in proc_peers))
        if everyone and all(i < len(rows) for rows in everyone):
            out["proc_all"].append(ips(r) / max(ips(rows[i]) for rows in everyone))
        if i < len(ours):
            out["proc_first"].append(r["first_s"] / ours[i]["first_s"])
    for i, r in enumerate(ours):
        if peers and all(i < len(rows) for rows in peers):
            out["peer"].append(ips(r) / max(ips(rows[i]) for rows in peers))
        if i < len(limit):
            out["limit"].append(ips(r) / ips(limit[i]))
        if i < len(dl2):
            out["first"].append(r["first_s"] / dl2[i]["first_s"])
            out["rss"].append(r["rss_mb"] / dl2[i]["rss_mb"])
    return out


def verdicts(med: dict[str, dict[str, float]], c: int, targets: list[dict[str, Any]] | None = None,
             results: dict[str, list[dict[str, Any]]] | None = None) -> bool:
    """Print the targets' PASS/FAIL lines; append each to ``targets`` (for --json) when given.

    With ``results`` (every run's figures) and two runs or more, a target passes only when it held in
    EVERY run (each repeat runs all systems side by side), and its line also gives the run ratios'
    min / median / max and how many runs it held in; without, it is judged on the medians."""
    ours = med.get(f"datapipes:{c}")
    proc = med.get("datapipes_process:0")
    if ours is None and proc is None and f"datapipes_natural:{c}" not in med:
        print("datapipes did not run: no verdicts")
        return False
    ok = True
    runs = per_run(results, c) if results is not None else {}

    def say(passed: bool, text: str, value: float = float("nan"), key: str | None = None,
            held: Callable[[float], bool] | None = None) -> None:
        nonlocal ok
        values = runs.get(key or "", [])
        extra: dict[str, Any] = {}
        if held is not None and len(values) > 1:
            n_held = sum(held(v) for v in values)
            passed = n_held == len(values)
            text += (f"; over {len(values)} runs: min {min(values):.3f}, median {statistics.median(values):.3f}, "
                     f"max {max(values):.3f}, held in {n_held}/{len(values)}")
            extra = {"run_values": values, "runs_passed": n_held, "runs": len(values)}
        ok &= passed
        print(f"  {'PASS' if passed else 'FAIL'}  {text}")
        if targets is not None:
            targets.append({"text": text, "value": value, "passed": passed, **extra})

    if proc is not None:
        ok &= process_verdicts(med, proc, ours, say)
    peers = {k: v for k, v in med.items() if k.split(":")[0] in PEERS}
    natural = med.get(f"datapipes_natural:{c}")
    if natural is not None and peers:
        best_key, best = max(peers.items(), key=lambda kv: kv[1]["ips"])
        say(natural["ips"] > best["ips"],
            f"the natural pipe (map(read) -> map(decode, concurrency={c})) ahead of every peer: {natural['ips']:,.0f} "
            f"images/s vs the best peer's {best['ips']:,.0f} ({label(*best_key.split(':'))})",
            natural["ips"] / best["ips"], "natural_peer", lambda v: v > 1.0)
    if ours is None:
        return ok
    if peers:
        best_key, best = max(peers.items(), key=lambda kv: kv[1]["ips"])
        name = label(best_key.split(':')[0], best_key.split(':')[1])
        say(ours["ips"] > best["ips"],
            f"ahead of every peer: {ours['ips']:,.0f} images/s vs the best peer's {best['ips']:,.0f} ({name})",
            ours["ips"] / best["ips"], "peer", lambda v: v > 1.0)
    limit = med.get("limit:0")
    if limit:
        say(ours["ips"] >= 0.75 * limit["ips"],
            f">= 75% of the limit: {ours['ips'] / limit['ips']:.0%} ({ours['ips']:,.0f} vs {limit['ips']:,.0f} images/s)",
            ours["ips"] / limit["ips"], "limit", lambda v: v >= 0.75)
    dl2 = med.get("dataloaderN:0")
    if dl2:
        say(ours["first_s"] <= dl2["first_s"] / 3,
            f"time to first batch <= 1/3 of DataLoader(num_workers={CORES})'s: {1000 * ours['first_s']:.0f} ms vs "
            f"{1000 * dl2['first_s']:.0f} ms ({ours['first_s'] / dl2['first_s']:.2f}x)", ours["first_s"] / dl2["first_s"],
            "first", lambda v: v <= 1 / 3)
        say(ours["rss_mb"] <= dl2["rss_mb"] / 2,
            f"peak RSS <= 1/2 of DataLoader(num_workers={CORES})'s: {ours['rss_mb']:,.0f} MB vs {dl2['rss_mb']:,.0f} MB "
            f"({ours['rss_mb'] / dl2['rss_mb']:.2f}x)", ours["rss_mb"] / dl2["rss_mb"], "rss", lambda v: v <= 0.5)
    return ok


def process_verdicts(med: dict[str, dict[str, float]], proc: dict[str, float], ours: dict[str, float] | None,
                     say: Callable[..., None]) -> bool:
    """The process stage's targets (docs/performance.rst, "many cores"): ahead of DataLoader(num_workers=N)
    and of nodes' process mapper, first batch within 2x of the thread stage's, and (from 8 cores) at
    least 90% of the core limit: N cores over the CPU time of one image, measured in the serial
    DataLoader(num_workers=0) run as its main thread's CPU time over its images. (The process's CPU
    time would count torch's intra-op threads too, which its collate wakes and which spin: on a
    16-CPU host it came to 6.8 ms of CPU per image, where DataLoader(num_workers=16) spent 4.2 ms per
    image all told, workers included, so the limit read far too low.)"""
    rivals = {k: med[k] for k in ("dataloaderN:0", "nodes_process:0") if k in med}
    if rivals:
        best_key, best = max(rivals.items(), key=lambda kv: kv[1]["ips"])
        say(proc["ips"] >= best["ips"],
            f"process stage >= DataLoader(num_workers={CORES}) and nodes' process mapper: {proc['ips']:,.0f} images/s "
            f"vs {best['ips']:,.0f} ({label(best_key.split(':')[0], CORES)})", proc["ips"] / best["ips"], "proc_peer",
            lambda v: v >= 1.0)
    if ours is not None:
        say(proc["first_s"] <= 2 * ours["first_s"],
            f"process stage's first batch within 2x of the thread stage's: {1000 * proc['first_s']:.0f} ms vs "
            f"{1000 * ours['first_s']:.0f} ms ({proc['first_s'] / ours['first_s']:.2f}x)", proc["first_s"] / ours["first_s"],
            "proc_first", lambda v: v <= 2.0)
    serial = med.get("dataloader0:0")
    if serial:
        cpu_per_image = serial.get("thread_cpu_s", serial["cpu_s"]) / (serial["ips"] * serial["seconds"])
        limit = CORES / cpu_per_image
        share = proc["ips"] / limit
        text = (f"process stage at {share:.0%} of the core limit ({proc['ips']:,.0f} of {limit:,.0f} images/s: "
                f"{CORES} cores / {1000 * cpu_per_image:.1f} ms of CPU per image)")
        if CORES >= 8:
            say(share >= 0.9, text + "; target >= 90%", share)
        else:
            print(f"  info  {text}; judged from 8 cores")
    # On a many-core host the process stage is the pipe's answer to GIL-bound work: there it must
    # lead the whole field (every peer and the thread-pool limit), not only the worker-process loaders.
    field = {k: v for k, v in med.items() if k.split(":")[0] in PEERS or k == "limit:0"}
    if CORES >= 8 and field:
        best_key, best = max(field.items(), key=lambda kv: kv[1]["ips"])
        say(proc["ips"] > best["ips"],
            f"process stage ahead of every peer and the limit ({CORES} cores): {proc['ips']:,.0f} images/s vs "
            f"{best['ips']:,.0f} ({label(*best_key.split(':'))})", proc["ips"] / best["ips"], "proc_all",
            lambda v: v > 1.0)
    return True


def workload_json(malloc: str, env: dict[str, str], results: dict[str, list[dict[str, Any]]],
                  order: list[tuple[str, int]], failed: dict[str, str], skipped: list[str],
                  med: dict[str, dict[str, float]], targets: list[dict[str, Any]]) -> dict[str, Any]:
    """One malloc setting's table as a workload of the results JSON (benchmarks/_results.py).

    ``results`` holds each system's child-process figures run by run (what :func:`child` returns),
    ``med`` their medians (what :func:`table` returns). Per system: images/s (median, and each
    run's), first batch, peak RSS, CPU s, cores used (medians, and each run's where measured per run);
    the ratio is to ``DataLoader(num_workers=0)``, the table's "vs DataLoader(0)" column."""
    systems = []
    for system, c in order:
        key = f"{system}:{c}"
        role = "limit" if system == "limit" else "datapipes" if system in OURS else "peer"
        name = label(system, c)
        if key in failed:
            systems.append(_results.system(name, role, None, status="failed", key=key, note=failed[key]))
        elif key in med:
            m, rows = med[key], results[key]
            systems.append(_results.system(
                name, role, m["ips"], runs=[r["images"] / r["seconds"] for r in rows], key=key,
                first_batch_s=m["first_s"], first_batch_runs=[r["first_s"] for r in rows],
                peak_rss_mb=m["rss_mb"], peak_rss_runs=[r["rss_mb"] for r in rows],
                steady_ips=m["steady_ips"], cpu_s=m["cpu_s"], cores=m["cores"], seconds=m["seconds"],
                workers=max(r["workers"] for r in rows)))
    for system in skipped:
        role = "datapipes" if system in OURS else "peer"
        systems.append(_results.system(label(system, "-"), role, None, status="not installed", key=system))
    what = "default malloc" if not env else "malloc pinned"
    baseline = LABELS["dataloader0"]
    return _results.add_ratios({
        "name": f"{malloc} malloc", "title": f"JPEG folder -> 224x224 uint8 batches of {BATCH} ({what})",
        "unit": "images/s", "baseline": baseline if any(s["name"] == baseline for s in systems) else None,
        "env": env, "systems": systems, "targets": targets})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1000, help="JPEGs to generate (default 1000)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="runs: each runs every system once in a fresh process, one after the other (default 5)")
    parser.add_argument("--concurrency", default=None,
                        help="datapipes' decoding threads, also given to the threaded peers; a comma list runs "
                             "datapipes once per value (the first one is judged) (default: --cores)")
    parser.add_argument("--cores", type=int, default=None,
                        help="the cores every system is given: DataLoader workers, process pools, the limit's threads, "
                             "and the default --concurrency (default 2, the proxy that every development machine runs)")
    parser.add_argument("--malloc", choices=["both", "default", "tuned"], default="both")
    parser.add_argument("--only", default=None, help="comma list of systems: " + ",".join(SYSTEMS))
    parser.add_argument("--wait-idle", type=float, default=20.0,
                        help="before each run, wait up to this many seconds for the machine to be idle (default 20; "
                             "0: do not wait)")
    parser.add_argument("--data", default=None, help="use the JPEGs under DIR instead of generating them")
    parser.add_argument("--json", metavar="PATH", help="also write the figures and the machine to PATH "
                        "(the schema of benchmarks/_results.py; benchmarks/plots.py draws them)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--root", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global CORES
    CORES = args.cores or 2
    if CORES < 1:
        parser.error(f"--cores must be >= 1, got {CORES}")
    conc = [int(x) for x in str(args.concurrency or CORES).split(",")]
    if args.child:
        print(json.dumps(child(args.child, args.root, conc[0], CORES)))
        return 0
    # A time limit's SIGTERM (`timeout`'s default) ends the runs as Ctrl-C does: the runs that
    # completed are still tabulated and written (see the KeyboardInterrupt below).
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    systems = SYSTEMS if args.only is None else [ALIASES.get(s, s) for s in args.only.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            parser.error(f"--only: unknown system {s!r}; choose from {','.join(SYSTEMS)}")
    skipped = [s for s in systems if not available(s, sys.executable)]
    order: list[tuple[str, int]] = []
    for s in systems:
        if s in skipped:
            continue
        if s == "datapipes":
            order.extend((s, c) for c in conc)
        elif s in THREADED:
            order.append((s, conc[0]))
        else:
            order.append((s, 0))
    import torch

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPUs, {CORES} given to each "
          f"system; "
          f"{args.images} JPEGs, batch {BATCH}, resize {SIZE}; medians of {args.repeats} fresh-process runs",
          flush=True)
    settings = {"default": {}, "tuned": TUNED_MALLOC}
    if args.malloc != "both":
        settings = {args.malloc: settings[args.malloc]}
    ok = True
    interrupted = False
    workloads: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="datapipes-e2e-") as tmp:
        root = args.data
        if root is None:
            from datapipes._demo_data import make_dataset

            t = time.perf_counter()
            info = make_dataset(tmp, args.images, seed=0)
            size_mb = sum(os.path.getsize(p) for p in info.paths) / 1e6
            print(f"generated {args.images} JPEGs ({info.image_size[0]}x{info.image_size[1]}, {size_mb:.0f} MB) in "
                  f"{time.perf_counter() - t:.1f} s", flush=True)
            root = tmp
        for name, extra in settings.items():
            env = {k: v for k, v in os.environ.items() if k not in TUNED_MALLOC}
            env.update(extra)
            what = "default glibc malloc" if not extra else ", ".join(f"{k}={v}" for k, v in extra.items())
            print(f"\n### malloc: {what}\n", flush=True)
            results: dict[str, list[dict[str, Any]]] = {f"{s}:{c}": [] for s, c in order}
            failed: dict[str, str] = {}
            noisy = 0
            try:
                for r in range(args.repeats):
                    for s, c in order:
                        key = f"{s}:{c}"
                        if key in failed:
                            continue
                        if args.wait_idle > 0 and wait_idle(args.wait_idle) > 0.1:
                            noisy += 1
                        _results.record_run(
                            run_child(s, root, c if c else conc[0], env), key, results[key], failed,
                            f"run {r + 1} {label(s, c)}",
                            lambda o: f"{o['images'] / o['seconds']:,.0f} images/s, first batch {1000 * o['first_s']:.0f} ms")
                    print(f"  repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
            except KeyboardInterrupt:
                # Tabulate and judge what completed (the per-run ratios use only complete repeats),
                # write the JSON, and fail: a cut-short run's targets are not a verdict.
                print(f"\ninterrupted: the figures below are of the runs that completed "
                      f"({sum(map(len, results.values()))} of {args.repeats * len(order)})", flush=True)
                interrupted = True
            med = table(results, order, failed, skipped)
            if noisy:
                print(f"\n({noisy} of {args.repeats * len(order)} runs started while the machine was busy "
                      f"after waiting {args.wait_idle:.0f} s: compare the CPU s column, which load does not inflate much)")
            print(f"\ntargets ({name} malloc):")
            targets: list[dict[str, Any]] = []
            ok &= verdicts(med, conc[0], targets, results)
            workloads.append(workload_json(name, extra, results, order, failed, skipped, med, targets))
            if interrupted:
                break
    if args.json:
        settings = {"images": args.images, "repeats": args.repeats, "concurrency": conc, "cores": CORES,
                    "malloc": args.malloc,
                    "only": systems, "wait_idle": args.wait_idle, "data": args.data, "batch": BATCH, "size": SIZE,
                    "interrupted": interrupted}
        _results.write(args.json, _results.document("end_to_end", settings, workloads))
    return 0 if ok and not interrupted else 1


if __name__ == "__main__":
    sys.exit(main())
