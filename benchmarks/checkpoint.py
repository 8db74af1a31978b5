"""Checkpoint cost: how long ``state_dict()`` takes, how big the state is, and how long a resumed
loader takes to yield its first item or batch, in two scenarios, every system side by side in one run:

1. One pass, no workers: a shuffle(buffer_size=10,000) over 100,000 paths, stopped after 20,000 /
   80,000 items.

   - datapipes: ``it.state_dict()`` of the pass. A resumed pass positions its source by index and
     restores the shuffle's buffer and generator: where the shuffle reads a list directly (the first
     row) the buffer is recomputed from how far the source was read (the draws replayed on
     positions); where it reads a ``map`` (the second row) the buffer's 10,000 items are saved;
   - torchdata's ``StatefulDataLoader`` over the same pipe written with ``torch.utils.data.datapipes``
     (num_workers=0): torch DataPipes keep no state of their own, so its state is small and a resumed
     loader replays the items already yielded (its cost grows with the stopping point).

2. A 2-worker DataLoader: ``IterableWrapper(paths).shuffle(buffer_size=10_000).sharding_filter()
   .map(path_number)`` (the number in each path: ints, which the default collate stacks),
   batch_size=64, num_workers=2, stopped after 100 / 400 of an epoch's 1,564 batches; then the
   batches/s (and CPU seconds, the process and its workers) of whole epochs, median of a few.

   - datapipes: ``DataLoader(pipe, batch_size=64, num_workers=2, seed=0)``. Each worker runs its
     shard (each one shuffles the whole source, then keeps its half at ``sharding_filter``) and
     sends the shard's state, pickled, with a batch while taking states has cost it at most
     ``datapipes.loader.shards.SNAPSHOT_BUDGET`` (2%) of its time so far; with the other batches
     it sends ``None`` and the loader counts them past that worker's last state. The loader keeps,
     for each worker, the state as of the last batch handed over; ``state_dict()`` decodes those
     (``pickle.loads``). A resumed loader starts two new workers, each loading its state and
     recomputing the batches past it. The epochs also run with ``SNAPSHOT_BUDGET = 0`` (patched
     before the workers fork, which they inherit: each takes its first state only), which shows
     what taking and sending states costs the workers.
   - torchdata: ``StatefulDataLoader`` (shuffle=True and a seeded generator: torch's loader enables
     the DataPipes' shuffle and seeds it in every worker from one shared seed, so both workers
     shuffle alike before ``sharding_filter``) with the default ``snapshot_every_n_steps=1``: with
     every batch a worker computes its state (that of its dataset and its dataset's iterator, where
     they define ``state_dict``) and sends the change since its last one; every n steps the main
     process takes a snapshot (its own state and the workers' last ones), and ``state_dict()``
     returns the last snapshot and the steps since it, which a resumed loader replays. torch
     DataPipes define no ``state_dict``, so the workers' states are empty and a resumed loader
     starts its workers and replays every batch yielded so far: its cost grows with the stopping
     point. Its epochs also run with ``snapshot_every_n_steps=None`` (no snapshots). With workers
     it resumes into another order (torchdata 0.11): the snapshot records the shared seed that the
     iterator's ``_reset`` draws after the workers were started with the one drawn in
     ``__init__``, so the resumed workers seed the shuffle differently; the table says so where the
     first batch after resuming is not the one the interrupted loader gave.

Run:  .venv-bench/bin/python benchmarks/checkpoint.py        (bash benchmarks/setup.sh first)
      .venv/bin/python benchmarks/checkpoint.py              (datapipes alone)
      .venv/bin/python benchmarks/checkpoint.py --only workers --batch-stops 20 --repeats 1 --epochs 1
                                                             (a quick run of scenario 2)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import multiprocessing
import pickle
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the datapipes of this checkout

import torch  # noqa: E402

import datapipes.loader.shards as shards  # noqa: E402
from datapipes import DataLoader  # noqa: E402
from datapipes.iter import IterableWrapper  # noqa: E402

ITEMS = 100_000
BUFFER = 10_000
BATCH = 64
WORKERS = 2


PATHS = [f"/data/train/img_{i:07d}.jpg" for i in range(ITEMS)]  # made once, shared by every build


def path_number(path: str) -> int:
    """The 2-worker pipe's cheap per-item work: the number in a path (ints: default collate stacks them)."""
    return int(path[-11:-4])


def sizes(state: Any) -> tuple[int, int]:
    """(pickle bytes, torch.save bytes) of a state."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return len(pickle.dumps(state)), buf.tell()


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


@contextlib.contextmanager
def quiet_torchdata() -> Iterator[None]:
    """Silence torchdata's "naively fast-forwarding your dataset by N steps" (a log record, not a
    warning): the fast-forward is what the resume column measures."""
    log = logging.getLogger("torchdata.stateful_dataloader.stateful_dataloader")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def torchdata_missing() -> str | None:
    """Why torchdata's ``StatefulDataLoader`` cannot be used here (None: it can)."""
    try:
        importlib.import_module("torchdata.stateful_dataloader")
    except ImportError as e:
        return f"not importable ({e}); run bash benchmarks/setup.sh and use .venv-bench/bin/python"
    return None


def stop_workers(it: Any) -> None:
    """End a loader pass now, its worker processes with it."""
    close = getattr(it, "close", None) or getattr(it, "_shutdown_workers", None)
    if close is not None:
        close()


# -- 1. one pass, no workers -----------------------------------------------------------------------


def datapipes_system(stop: int, repeats: int, after_map: bool = False) -> dict[str, float]:
    def build() -> Any:
        source = IterableWrapper(PATHS)
        if after_map:  # the shuffle reads a map: its buffer cannot be recomputed, the state holds it
            source = source.map(str.upper)
        return source.shuffle(buffer_size=BUFFER).set_seed(0)

    it = iter(build())
    head = [next(it) for _ in range(stop)]
    save = median_time(it.state_dict, repeats)
    state = it.state_dict()
    expected = next(it)

    def resume() -> Any:
        again = iter(build())
        again.load_state_dict(state)
        first = next(again)
        again.close()
        return first

    first = resume()
    assert first == expected and len(head) == stop, "datapipes did not resume where it stopped"
    pickled, saved = sizes(state)
    return {"state_dict_ms": save * 1e3, "pickle_kib": pickled / 1024, "torch_save_kib": saved / 1024,
            "resume_ms": median_time(resume, repeats) * 1e3}


def torchdata_system(stop: int, repeats: int) -> dict[str, float] | str:
    try:
        from torch.utils.data.datapipes.iter import IterableWrapper as TorchWrapper
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as e:
        return f"not importable ({e}); run bash benchmarks/setup.sh and use .venv-bench/bin/python"

    def build() -> Any:
        pipe = TorchWrapper(PATHS).shuffle(buffer_size=BUFFER)
        return StatefulDataLoader(pipe, batch_size=None, num_workers=0, shuffle=True,
                                  generator=torch.Generator().manual_seed(0))

    loader = build()
    it = iter(loader)
    for _ in range(stop):
        next(it)
    save = median_time(loader.state_dict, repeats)
    state = loader.state_dict()
    expected = next(it)

    def resume() -> Any:
        again = build()
        again.load_state_dict(state)
        with quiet_torchdata():
            return next(iter(again))

    first = resume()
    same = first == expected
    pickled, saved = sizes(state)
    out: dict[str, float] = {"state_dict_ms": save * 1e3, "pickle_kib": pickled / 1024, "torch_save_kib": saved / 1024,
                             "resume_ms": median_time(resume, repeats) * 1e3}
    if not same:
        out["resumed_elsewhere"] = 1.0
    return out


# -- 2. a 2-worker DataLoader ----------------------------------------------------------------------


def datapipes_loader() -> DataLoader:
    pipe = IterableWrapper(PATHS).shuffle(buffer_size=BUFFER).sharding_filter().map(path_number)
    return DataLoader(pipe, batch_size=BATCH, num_workers=WORKERS, seed=0)


def torchdata_loader(snapshot_every_n_steps: int | None = 1) -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper as TorchWrapper
    from torchdata.stateful_dataloader import StatefulDataLoader

    pipe = TorchWrapper(PATHS).shuffle(buffer_size=BUFFER).sharding_filter().map(path_number)
    return StatefulDataLoader(pipe, batch_size=BATCH, num_workers=WORKERS, shuffle=True,
                              generator=torch.Generator().manual_seed(0),
                              snapshot_every_n_steps=snapshot_every_n_steps)


def loader_checkpoint(build: Callable[[], Any], stop: int, repeats: int) -> dict[str, float]:
    """state_dict time and size after ``stop`` batches, and the time from building a loader that
    loads the state to its first batch (stopping its workers is not counted)."""
    loader = build()
    it = iter(loader)
    for _ in range(stop):
        next(it)
    save = median_time(loader.state_dict, repeats)
    state = loader.state_dict()
    expected = next(it)
    stop_workers(it)

    def resume() -> tuple[Any, float]:
        t = time.perf_counter()
        again = build()
        again.load_state_dict(state)
        with quiet_torchdata():
            again_it = iter(again)
            first = next(again_it)
        took = time.perf_counter() - t
        stop_workers(again_it)
        return first, took

    first, _ = resume()
    times = [resume()[1] for _ in range(repeats)]
    pickled, saved = sizes(state)
    out = {"state_dict_ms": save * 1e3, "pickle_kib": pickled / 1024, "torch_save_kib": saved / 1024,
           "resume_ms": statistics.median(times) * 1e3}
    if not (first.shape == expected.shape and torch.equal(first, expected)):
        out["resumed_elsewhere"] = 1.0
    return out


def datapipes_workers(stop: int, repeats: int) -> dict[str, float]:
    got = loader_checkpoint(datapipes_loader, stop, repeats)
    assert "resumed_elsewhere" not in got, "datapipes.DataLoader did not resume where it stopped"
    return got


def torchdata_workers(stop: int, repeats: int) -> dict[str, float] | str:
    missing = torchdata_missing()
    if missing is not None:
        return missing
    try:
        return loader_checkpoint(torchdata_loader, stop, repeats)
    except Exception as e:  # noqa: BLE001 - reported, not raised: the table says what it raised
        return f"raised {type(e).__name__}: {str(e)[:200]}"


@contextlib.contextmanager
def snapshot_budget(budget: float) -> Iterator[None]:
    """``datapipes.loader.shards.SNAPSHOT_BUDGET`` set to ``budget`` for the passes started inside
    (forked workers inherit it)."""
    saved = shards.SNAPSHOT_BUDGET
    shards.SNAPSHOT_BUDGET = budget
    try:
        yield
    finally:
        shards.SNAPSHOT_BUDGET = saved


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and of its children that have ended (the workers:
    a pass joins them when it ends)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def epoch(build: Callable[[], Any], budget: float | None = None) -> tuple[int, float, float]:
    """(batches, wall seconds, CPU seconds of the process and its workers) of one whole epoch of a
    new loader, from ``iter()`` to the end (its workers stopped)."""
    with snapshot_budget(shards.SNAPSHOT_BUDGET if budget is None else budget), quiet_torchdata():
        loader = build()
        cpu, t = cpu_seconds(), time.perf_counter()
        count = sum(1 for _ in loader)
        return count, time.perf_counter() - t, cpu_seconds() - cpu


def epoch_rates(epochs: int) -> dict[str, tuple[int, float, float] | str]:
    """Per system, (batches, median batches/s, median CPU seconds) of ``epochs`` epochs, the
    systems' epochs interleaved (a new order each round); a string where a system could not run.
    The systems come in pairs: states on, then off."""
    budget = shards.SNAPSHOT_BUDGET
    systems: dict[str, Callable[[], tuple[int, float, float]]] = {
        f"datapipes.DataLoader, states on (SNAPSHOT_BUDGET={budget:g})": lambda: epoch(datapipes_loader),
        "datapipes.DataLoader, states off (SNAPSHOT_BUDGET=0)": lambda: epoch(datapipes_loader, 0.0),
        "torchdata StatefulDataLoader, snapshot_every_n_steps=1": lambda: epoch(torchdata_loader),
        "torchdata StatefulDataLoader, snapshot_every_n_steps=None": lambda: epoch(lambda: torchdata_loader(None)),
    }
    measured: dict[str, list[tuple[int, float, float]]] = {name: [] for name in systems}
    failed: dict[str, str] = {}
    missing = torchdata_missing()
    if missing is not None:
        for name in list(systems)[2:]:
            failed[name] = missing
    names = [name for name in systems if name not in failed]
    for round_ in range(epochs):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            if name in failed:
                continue
            try:
                measured[name].append(systems[name]())
            except Exception as e:  # noqa: BLE001 - reported, not raised
                failed[name] = f"raised {type(e).__name__}: {str(e)[:200]}"
    out: dict[str, tuple[int, float, float] | str] = {}
    for name, runs in measured.items():
        if name in failed:
            out[name] = failed[name]
        else:
            out[name] = (runs[0][0], statistics.median(count / wall for count, wall, _ in runs),
                         statistics.median(cpu for _, _, cpu in runs))
    return out


def ratio(a: float, b: float, width: int = 9) -> str:
    """``a / b`` as ``1.23x`` (``123x`` from 100 on), right-aligned in ``width``."""
    if not b:
        return f"{'-':>{width}s}"
    r = a / b
    return f"{r:{width - 1}.0f}x" if r >= 100 else f"{r:{width - 1}.2f}x"


def run_workers(stops: list[int], repeats: int, epochs: int) -> None:
    print(f"2. a {WORKERS}-worker DataLoader: shuffle(buffer_size={BUFFER:,}) -> sharding_filter -> map(path_number), "
          f"batch_size={BATCH}, over {ITEMS:,} paths; medians of {repeats} repeats")
    print(f"  {'system':46s} {'batches':>7s} {'state_dict':>11s} {'pickle':>9s} {'torch.save':>11s} {'resume':>9s}")
    for stop in stops:
        ours = datapipes_workers(stop, repeats)
        theirs = torchdata_workers(stop, repeats)
        for name, got in (("datapipes.DataLoader", ours), ("torchdata StatefulDataLoader + torch DataPipes", theirs)):
            if isinstance(got, str):
                print(f"  {name:46s} {stop:7,d} skipped: {got}")
                continue
            note = "  (resumed at a different batch)" if got.get("resumed_elsewhere") else ""
            print(f"  {name:46s} {stop:7,d} {got['state_dict_ms']:8.3f} ms {got['pickle_kib']:5.1f} KiB "
                  f"{got['torch_save_kib']:7.1f} KiB {got['resume_ms']:6.1f} ms{note}")
        if not isinstance(theirs, str):
            widths = {"state_dict_ms": 11, "pickle_kib": 9, "torch_save_kib": 11, "resume_ms": 9}
            cells = [ratio(ours[key], theirs[key], width) for key, width in widths.items()]
            print(f"  {'  ratio datapipes / torchdata':46s} {stop:7,d} {' '.join(cells)}")
    if epochs <= 0:
        return
    rates = epoch_rates(epochs)
    batches = next((got[0] for got in rates.values() if not isinstance(got, str)), 0)
    method = multiprocessing.get_start_method()
    patched = "" if method == "fork" else f"  (start method {method!r}: the patched budget does not reach the workers)"
    print(f"  whole epochs ({batches:,} batches), medians of {epochs}; CPU: the process and its workers{patched}")
    print(f"  {'system':58s} {'batches/s':>11s} {'on / off':>9s} {'CPU':>8s} {'on / off':>9s}")
    names = list(rates)
    for index, name in enumerate(names):
        measured = rates[name]
        if isinstance(measured, str):
            print(f"  {name:58s} skipped: {measured}")
            continue
        off = rates[names[index + 1]] if index % 2 == 0 else None  # pairs: states on, then off
        rate_ratio = cpu_ratio = ""
        if off is not None and not isinstance(off, str):
            rate_ratio, cpu_ratio = ratio(measured[1], off[1]), ratio(measured[2], off[2])
        print(f"  {name:58s} {measured[1]:9.0f}/s {rate_ratio:>9s} {measured[2]:6.2f} s {cpu_ratio:>9s}".rstrip())
    said = []
    for ours_rate, theirs_rate, which in ((rates[names[0]], rates[names[2]], "on"),
                                          (rates[names[1]], rates[names[3]], "off")):
        if not isinstance(ours_rate, str) and not isinstance(theirs_rate, str):
            said.append(f"{ours_rate[1] / theirs_rate[1]:.2f}x with states {which}")
    if said:
        print(f"  batches/s, datapipes / torchdata: {', '.join(said)}")


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")  # torchdata's, on torch 2.13
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", type=int, nargs="+", default=[20_000, 80_000],
                        help="scenario 1: items yielded before the state is taken (default 20,000 and 80,000)")
    parser.add_argument("--batch-stops", type=int, nargs="+", default=[100, 400],
                        help="scenario 2: batches yielded before the state is taken (default 100 and 400)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per measure; the median is shown")
    parser.add_argument("--epochs", type=int, default=5,
                        help="scenario 2: whole epochs per system for batches/s, the median shown (0: none)")
    parser.add_argument("--only", choices=("pass", "workers"),
                        help="run one scenario: 'pass' (1, no workers) or 'workers' (2, a 2-worker DataLoader)")
    args = parser.parse_args(argv)
    if args.only != "workers":
        print(f"1. one pass: shuffle(buffer_size={BUFFER:,}) over {ITEMS:,} paths; medians of {args.repeats} repeats")
        print(f"  {'system':46s} {'stop':>7s} {'state_dict':>11s} {'pickle':>9s} {'torch.save':>11s} {'resume':>9s}")
        for stop in args.stops:
            for name, run in (("datapipes pass", datapipes_system),
                              ("datapipes pass, shuffle after map(str.upper)",
                               lambda stop, repeats: datapipes_system(stop, repeats, after_map=True)),
                              ("torchdata StatefulDataLoader + torch DataPipes", torchdata_system)):
                got = run(stop, args.repeats)
                if isinstance(got, str):
                    print(f"  {name:46s} {stop:7,d} skipped: {got}")
                    continue
                note = "  (resumed at a different item)" if got.get("resumed_elsewhere") else ""
                print(f"  {name:46s} {stop:7,d} {got['state_dict_ms']:8.3f} ms {got['pickle_kib']:5.1f} KiB "
                      f"{got['torch_save_kib']:7.1f} KiB {got['resume_ms']:6.1f} ms{note}")
    if args.only != "pass":
        run_workers(args.batch_stops, args.repeats, args.epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
