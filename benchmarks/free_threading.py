"""What free-threaded CPython buys a pipeline (issue 36; target: docs/performance.rst, "Targets"): the
GIL-held workload of concurrency.py (json.loads of ~2 KB + a pure-Python loop, about 20 us an item)
run serially, on a thread stage with 2 threads and on a process stage with 2 workers, under each
interpreter given, side by side in one run.

    python benchmarks/free_threading.py --python .venv/bin/python --python .venv-3.13t/bin/python

The free-threaded environment is built as CI builds its leg::

    VENV=.venv-3.13t PYTHON=$(bash scripts/freethreaded-python.sh) \\
        REQUIREMENTS=requirements-freethreaded.txt bash scripts/setup.sh

Each interpreter runs this script again in a child process (``--child``), which times its three
systems with their repeats interleaved and prints its medians as JSON; the parent tabulates them.
On a GIL build the thread stage cannot beat serial: only one thread runs Python at a time. On 2 cores
the limit of any system is 2x serial. Target on the free-threaded interpreter: the thread stage at
2 threads >= 1.6x serial, and ahead of the process stage (which pays for pickling every item and
result across processes).

The thread stage hands its threads chunks of about 1 ms of work, sized from the measured cost of the
function; the process stage sends chunks of about 10 ms, sized the same way (as in concurrency.py);
a fourth row runs the thread form on an executor (``executor=ThreadPoolExecutor(2),
chunksize=64``: one task a chunk). ``--json PATH``
writes the figures (benchmarks/_results.py's schema).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _results  # noqa: E402
from benchmarks.concurrency import gil_work, make_docs, timings  # noqa: E402

SYSTEMS = ("serial", "thread stage (2 threads)", "process stage (2 processes)",
           "executor stage (ThreadPoolExecutor(2), chunksize)")


def child(n: int, repeats: int, chunksize: int) -> dict[str, Any]:
    """Time the three systems in this interpreter: {system: [seconds per repeat]}, plus what it is."""
    from concurrent.futures import ThreadPoolExecutor

    from datapipes.iter import IterableWrapper

    docs = make_docs(n)
    source = IterableWrapper(docs, deepcopy=False)
    threads = source.map(gil_work, concurrency=2)
    processes = source.map(gil_work, concurrency=2, executor="process")  # chunks sized from fn's cost
    pool = ThreadPoolExecutor(2)
    chunked = source.map(gil_work, concurrency=2, executor=pool, chunksize=chunksize)
    expected = [gil_work(d) for d in docs]

    def serial() -> list[int]:
        return [gil_work(d) for d in docs]

    runs: dict[str, Callable[[], list[int]]] = {
        SYSTEMS[0]: serial, SYSTEMS[1]: lambda: list(threads), SYSTEMS[2]: lambda: list(processes),
        SYSTEMS[3]: lambda: list(chunked)}
    for name, run in runs.items():  # warm up: the process stage's first pass starts its workers
        assert run() == expected, name
    times = timings(runs, repeats)  # the systems interleaved repeat by repeat
    pool.shutdown()
    gil = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
    return {"python": sys.version.split()[0], "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
            "gil_enabled": gil, "executable": sys.executable, "times": times}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", action="append", help="an interpreter with datapipes installed (repeat; "
                        "default: this one)")
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunksize", type=int, default=64)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.items, args.repeats, args.chunksize)))
        return 0

    results = []
    for python in args.python or [sys.executable]:
        cmd = [python, os.path.abspath(__file__), "--child", "--items", str(args.items),
               "--repeats", str(args.repeats), "--chunksize", str(args.chunksize)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            print(f"{python}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
            return 2
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))

    n = args.items
    print(f"GIL-held work: {n:,} items of json.loads ({len(make_docs(1)[0])} bytes) + a Python loop; "
          f"chunksize {args.chunksize}; medians of {args.repeats} repeats; {os.cpu_count()} CPUs\n")
    print("| interpreter | system | items/s | vs serial |")
    print("|---|---|---|---|")
    workloads, failed = [], False
    for r in results:
        kind = "free-threaded" + (", GIL ENABLED" if r["gil_enabled"] else "") if r["free_threaded"] else "GIL"
        label = f"CPython {r['python']} ({kind})"
        med = {name: statistics.median(ts) for name, ts in r["times"].items()}
        systems = []
        for name in SYSTEMS:
            ratio = med[SYSTEMS[0]] / med[name]
            print(f"| {label} | {name} | {n / med[name]:,.0f} | {ratio:.2f}x |")
            systems.append({"name": name, "role": "reference" if name == SYSTEMS[0] else "datapipes", "status": "ok",
                            "throughput": n / med[name], "runs": [n / t for t in r["times"][name]], "ratio": ratio})
        targets = []
        if r["free_threaded"]:
            speedup = med[SYSTEMS[0]] / med[SYSTEMS[1]]
            ahead = med[SYSTEMS[2]] / med[SYSTEMS[1]]
            targets = [{"text": "thread stage at 2 threads >= 1.6x serial", "value": speedup, "passed": speedup >= 1.6},
                       {"text": "thread stage ahead of the process stage", "value": ahead, "passed": ahead > 1.0}]
        workloads.append({"name": f"gil-{r['python']}{'t' if r['free_threaded'] else ''}", "title": label,
                          "unit": "items/s", "baseline": SYSTEMS[0], "systems": systems, "targets": targets})
    print()
    for w in workloads:
        for t in w["targets"]:
            failed |= not t["passed"]
            print(f"{'PASS' if t['passed'] else 'FAIL'}  {w['title']}: {t['text']} ({t['value']:.2f}x)")
    if args.json:
        settings = {"items": n, "repeats": args.repeats, "chunksize": args.chunksize,
                    "pythons": [r["executable"] for r in results]}
        _results.write(args.json, _results.document("free_threading", settings, workloads))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
