"""Command line: ``python -m datapipes demo`` runs a pipeline over generated data.

The demo generates a small tabular dataset (one CSV-like text line per record), then builds and runs
a lazy pipe over it: parse -> drop bad records -> shuffle -> batch -> stack into tensors. It prints
the graph, a first batch, the counts and the throughput.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Sequence


def _make_records(n: int, seed: int) -> list[str]:
    """``n`` text records ``id,label,x0,x1,x2,x3``; about 1% are malformed, as real data is."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        label = rng.randrange(10)
        feats = ",".join(f"{rng.gauss(label, 1.0):.4f}" for _ in range(4))
        line = f"{i},{label},{feats}"
        if rng.random() < 0.01:
            line = line.replace(",", ";", 1)  # a corrupt record
        lines.append(line)
    return lines


def _parse(line: str) -> tuple[list[float], int]:
    _, label, *feats = line.split(",")
    return [float(f) for f in feats], int(label)


def _stack(batch: list[tuple[list[float], int]]):  # -> tuple[torch.Tensor, torch.Tensor]
    import torch

    feats, labels = zip(*batch)
    return torch.tensor(feats, dtype=torch.float32), torch.tensor(labels, dtype=torch.int64)


def demo(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m datapipes demo", description=__doc__)
    parser.add_argument("--records", type=int, default=200_000, help="records to generate (default 200000)")
    parser.add_argument("--batch-size", type=int, default=256, help="batch size (default 256)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the data and the shuffle (default 0)")
    args = parser.parse_args(argv)
    if args.records < 1 or args.batch_size < 1:
        parser.error("--records and --batch-size must be >= 1")

    from datapipes.graph import describe
    from datapipes.iter import IterableWrapper

    print(f"generating {args.records:,} records ...")
    records = _make_records(args.records, args.seed)

    t0 = time.perf_counter()
    parsed = IterableWrapper(records).map(_parse, on_error="skip")
    pipe = parsed.shuffle(buffer_size=10_000).batch(args.batch_size).map(_stack)
    pipe.set_seed(args.seed)
    print("\nthe pipe (nothing has run yet):")
    print(describe(pipe))
    print(f"\nlen(pipe) = {len(pipe)} batches (computed from the source, at call time)")

    batches = items = 0
    first = None
    t1 = time.perf_counter()
    for feats, labels in pipe:
        if first is None:
            first = (feats, labels)
            print(f"first batch after {1000 * (time.perf_counter() - t0):.1f} ms: "
                  f"features {tuple(feats.shape)} {feats.dtype}, labels {labels[:8].tolist()} ...")
        batches += 1
        items += len(labels)
    elapsed = time.perf_counter() - t1
    print(f"\n{batches} batches, {items:,} records in {elapsed:.2f} s: {items / elapsed:,.0f} records/s")
    print(f"malformed records skipped: {parsed.failures.count} "
          f"(e.g. {parsed.failures.recent[0].exception!r})" if parsed.failures.count else "no malformed records")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m datapipes demo [--records N] [--batch-size B] [--seed S]")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        return demo(rest)
    print(f"unknown command {command!r}; try: python -m datapipes demo", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
