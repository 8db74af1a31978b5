"""Local I/O: small files listed and read, and a large CSV parsed by rows, side by side in one run.

Two workloads, each against the same work written in plain Python (the limit):

1. ``--files`` small files (default 1,000 of 1-4 KB) in one folder, listed in sorted order and read
   whole: ``FileLister(root).open_files(mode="b")`` against ``sorted(os.scandir(root))`` + ``open``.
2. A CSV of ``--csv-mb`` MB (default 100) parsed by rows: ``parse_csv()`` over a binary stream
   (decoded in blocks), over a text stream, and with ``errors="strict"`` (decoded line by line so
   that a bad byte names its line), against ``csv.reader(open(path, newline=""))``.

Run:  .venv/bin/python benchmarks/io.py   (the data is generated in a temporary folder and removed)

Target (issue 3): each datapipes pipeline within 1.5x of its plain version's time.

The runs of one repeat are interleaved (drift hits every system alike), one warm-up pass each runs
first (the page cache is warm for all), and each figure is the median of ``--repeats`` passes, by
process CPU time (``--clock cpu``, the default: everything runs on the calling thread, so on a shared
machine CPU time leaves out what other processes took; reads from the page cache count as system
time) with wall time beside.
"""

from __future__ import annotations

import argparse
import csv
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the datapipes of this checkout

from datapipes.iter import FileLister, IterableWrapper  # noqa: E402

TARGET = 1.5


# -- data ------------------------------------------------------------------------------------------


def make_small_files(root: str, n: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    total = 0
    for i in range(n):
        data = rng.randbytes(rng.randint(1024, 4096))
        with open(os.path.join(root, f"f{i:05d}.bin"), "wb") as f:
            f.write(data)
        total += len(data)
    return total


def make_csv(path: str, mb: int, seed: int = 0) -> int:
    """A CSV of about ``mb`` MB: an id, words, floats, a quoted field with a comma; returns its rows."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "Zoë", "Besançon"]
    rows = 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "name", "x", "y", "note", "count"])
        block = [
            [i, rng.choice(words), f"{rng.random():.6f}", f"{rng.uniform(-1e3, 1e3):.3f}",
             f"{rng.choice(words)}, {rng.choice(words)}", rng.randint(0, 10**6)]
            for i in range(20_000)
        ]
        while f.tell() < mb * 1_000_000:
            w.writerows(block)
            rows += len(block)
    return rows + 1


# -- the workloads ---------------------------------------------------------------------------------


def plain_files(root: str) -> int:
    total = 0
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_file():
            with open(entry.path, "rb") as f:
                total += len(f.read())
    return total


def datapipes_files(root: str) -> int:
    total = 0
    for _, stream in FileLister(root).open_files(mode="b"):
        with stream:
            total += len(stream.read())
    return total


def plain_csv(path: str) -> int:
    n = 0
    with open(path, newline="", encoding="utf-8") as f:
        for _ in csv.reader(f):
            n += 1
    return n


def _count(pipe: Any) -> int:
    n = 0
    for _ in pipe:
        n += 1
    return n


def datapipes_csv_binary(path: str) -> int:
    return _count(IterableWrapper([path]).open_files(mode="b").parse_csv())


def datapipes_csv_text(path: str) -> int:
    return _count(IterableWrapper([path]).open_files(mode="r", encoding="utf-8").parse_csv())


def datapipes_csv_strict(path: str) -> int:
    return _count(IterableWrapper([path]).open_files(mode="b").parse_csv(errors="strict"))


# -- measuring -------------------------------------------------------------------------------------


def run(fn: Callable[[str], int], arg: str) -> tuple[float, float, int]:
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn(arg)
    return time.perf_counter() - wall, time.process_time() - cpu, out


def measure(systems: dict[str, Callable[[str], int]], arg: str, repeats: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per system, after a warm-up pass each that also checks that every
    system computes the same result."""
    results = {name: run(fn, arg)[2] for name, fn in systems.items()}
    if len(set(results.values())) != 1:
        raise SystemExit(f"the systems disagree: {results}")
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in systems}
    for _ in range(repeats):
        for name, fn in systems.items():
            wall, cpu, _ = run(fn, arg)
            times[name].append((wall, cpu))
    return {name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for name, t in times.items()}


def table(
    title: str, medians: dict[str, tuple[float, float]], limit: str, clock: int, unit: str, n: int
) -> tuple[list[str], bool]:
    base = medians[limit][clock]
    other = "wall" if clock else "CPU"
    lines = [
        f"{title} ({'CPU' if clock else 'wall'} time, medians)",
        f"  {'system':52s} {'seconds':>8s} {unit + '/s':>12s} {'time vs plain':>14s} {'(' + other + ' s)':>10s}",
    ]
    ok = True
    for name, t in medians.items():
        ratio = t[clock] / base
        verdict = ""
        if name != limit:
            verdict = "  PASS" if ratio <= TARGET else "  FAIL"
            ok = ok and ratio <= TARGET
        lines.append(f"  {name:52s} {t[clock]:8.3f} {n / t[clock]:12,.0f} {ratio:13.2f}x {t[1 - clock]:10.3f}{verdict}")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000, help="small files to list and read (default 1,000)")
    parser.add_argument("--csv-mb", type=int, default=100, help="size of the CSV in MB (default 100)")
    parser.add_argument("--repeats", type=int, default=5, help="passes per system; the median is shown (default 5)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="the time the ratios use (default cpu)")
    args = parser.parse_args(argv)
    if args.files < 1 or args.csv_mb < 1 or args.repeats < 1:
        parser.error("--files, --csv-mb and --repeats must be >= 1")
    clock = 1 if args.clock == "cpu" else 0

    import platform

    with tempfile.TemporaryDirectory(prefix="datapipes-io-") as tmp:
        root = os.path.join(tmp, "small")
        os.mkdir(root)
        make_small_files(root, args.files)
        path = os.path.join(tmp, "big.csv")
        rows = make_csv(path, args.csv_mb)
        size = os.path.getsize(path)
        print(f"python {platform.python_version()}, {os.cpu_count()} cores (load {os.getloadavg()[0]:.2f}), "
              f"{args.repeats} repeats; {args.files:,} small files; CSV {size / 1e6:.0f} MB, {rows:,} rows")

        files = measure({"plain scandir + open (the limit)": plain_files,
                         "FileLister -> open_files(mode='b')": datapipes_files}, root, args.repeats)
        lines, ok1 = table(f"{args.files:,} small files listed and read", files,
                           "plain scandir + open (the limit)", clock, "files", args.files)
        csvs = measure({
            "plain csv.reader(open(newline='')) (the limit)": plain_csv,
            "open_files(mode='b') -> parse_csv()": datapipes_csv_binary,
            "open_files(mode='r') -> parse_csv()": datapipes_csv_text,
            "open_files(mode='b') -> parse_csv(errors='strict')": datapipes_csv_strict,
        }, path, args.repeats)
        more, ok2 = table(f"CSV of {size / 1e6:.0f} MB parsed by rows", csvs,
                          "plain csv.reader(open(newline='')) (the limit)", clock, "rows", rows)
    lines += [""] + more
    verdict = "PASS" if ok1 and ok2 else "FAIL"
    lines += ["", f"target: every datapipes pipeline within {TARGET}x of its plain version: {verdict}"]
    print("\n".join(lines))
    return 0 if ok1 and ok2 else 1


if __name__ == "__main__":
    sys.exit(main())
