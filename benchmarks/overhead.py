"""Per-item overhead: 200,000 ints through map -> filter -> batch(32), side by side in one run.

The limit is the same work written as a plain generator chain. Beside it: datapipes, torch's own
``torch.utils.data.datapipes`` and ``torchdata.nodes`` (each where importable; the peers live in the
benchmark environment, ``bash benchmarks/setup.sh``). A second table runs a single pure ``map``
stage against a one-line generator; its target row reads the list as the generator does
(``IterableWrapper(deepcopy=False)``), and the row beside it adds torch's default source, whose
per-pass check that the items need no copy costs about 16 ns per item. A third row reads a deque,
whose iterator cannot tell its position: there the stage counts its items for the error note (the
list's iterator, a range's or another serial map's tells it, so nothing is counted). Two more rows
run the map's other serial loops, under ``on_error="skip"`` and with ``rng="python"`` (a generator
per item): reported, to compare across changes. The chain uses the defaults.

Run:  .venv-bench/bin/python benchmarks/overhead.py        (or .venv/bin/python: datapipes alone)

Targets (docs/performance.rst, "Targets"): the chain at >= 0.67x the plain chain's rate; one map stage within
1.3x of a generator's time per item.

Every system runs the same functions on the same list, the runs of one repeat are interleaved
(so drift hits every system alike), and each figure is the median of ``--repeats`` passes, timed by
process CPU time (``--clock cpu``, the default: every system here runs on the calling thread, so
on a shared machine it leaves out the time other processes took) with wall time beside. Nothing
in the measuring loop calls torch: a torch op would wake torch's thread pool and steal time from the
pipeline being measured.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the datapipes of this checkout

import datapipes.iter  # noqa: E402  (registers the functional methods)
from benchmarks import _results  # noqa: E402
from datapipes import IterDataPipe  # noqa: E402

BATCH = 32


def inc(x: int) -> int:
    return x + 1


def keep(x: int) -> bool:
    return x % 3 != 0


# -- the limit: a plain generator chain ------------------------------------------------------------


def _gen_map(fn: Callable[[Any], Any], source: Iterable[Any]) -> Iterator[Any]:
    for x in source:
        yield fn(x)


def _gen_filter(fn: Callable[[Any], Any], source: Iterable[Any]) -> Iterator[Any]:
    for x in source:
        if fn(x):
            yield x


def _gen_batch(n: int, source: Iterable[Any]) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for x in source:
        batch.append(x)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def plain_chain(data: list[int]) -> Iterable[Any]:
    return _gen_batch(BATCH, _gen_filter(keep, _gen_map(inc, data)))


def plain_map(data: list[int]) -> Iterable[Any]:
    return _gen_map(inc, data)


# -- datapipes -------------------------------------------------------------------------------------


def datapipes_chain(data: list[int]) -> Iterable[Any]:
    return datapipes.iter.IterableWrapper(data).map(inc).filter(keep).batch(BATCH)


def datapipes_map(data: list[int]) -> Iterable[Any]:
    # The stage alone: a source that hands the list's items over as the generator's loop does.
    return datapipes.iter.IterableWrapper(data, deepcopy=False).map(inc)


def datapipes_map_counted(data: list[int]) -> Iterable[Any]:
    # The stage over a source that cannot tell its own position (a deque's iterator, as fast as the
    # list's): the stage counts its items for the error note's position, about 12 ns per item on
    # CPython 3.11. Over a list, tuple, range or another such map the source tells it instead.
    # Reported, not judged: the target row is the one above. The deque is built once per list,
    # outside the timing.
    held = _DEQUES.get(id(data))
    if held is None or held[0] is not data:
        held = _DEQUES[id(data)] = (data, collections.deque(data))
    return datapipes.iter.IterableWrapper(held[1], deepcopy=False).map(inc)


_DEQUES: dict[int, tuple[list[int], collections.deque[int]]] = {}


def inc_seeded(x: int, rng: Any) -> int:
    return x + 1


def datapipes_map_skipping(data: list[int]) -> Iterable[Any]:
    # on_error="skip": the loop that catches each item's failure (none here) and counts its items.
    # Reported, not judged, to follow across changes (issue 41: within 15% of before).
    return datapipes.iter.IterableWrapper(data, deepcopy=False).map(inc, on_error="skip")


def datapipes_map_seeded(data: list[int]) -> Iterable[Any]:
    # rng="python": a random.Random per item, seeded from the pass seed and the item's position (the
    # generator's construction is most of the cost). Reported, not judged, as the row above.
    return datapipes.iter.IterableWrapper(data, deepcopy=False).map(inc_seeded, rng="python")


def datapipes_map_copying(data: list[int]) -> Iterable[Any]:
    # torch's default source (deepcopy=True): the check that the list's items need no copy, per pass.
    return datapipes.iter.IterableWrapper(data).map(inc)


# -- torch.utils.data.datapipes (ships with torch) -----------------------------------------------------


def _torch_datapipes() -> Any:
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its deprecation warning
            from torch.utils.data.datapipes.iter import IterableWrapper
    except ImportError as e:
        return f"not importable ({e})"
    return IterableWrapper


def torch_chain(wrapper: Any) -> Callable[[list[int]], Iterable[Any]]:
    return lambda data: wrapper(data).map(inc).filter(keep).batch(BATCH)


def torch_map(wrapper: Any) -> Callable[[list[int]], Iterable[Any]]:
    return lambda data: wrapper(data).map(inc)


# -- torchdata.nodes (benchmark environment only) ------------------------------------------------------


def _torchdata_nodes() -> Any:
    try:
        import torchdata.nodes as nodes
    except ImportError as e:
        return f"not importable ({e}); run bash benchmarks/setup.sh and use .venv-bench/bin/python"

    class Filter(nodes.BaseNode):  # type: ignore[misc,name-defined]
        """torchdata.nodes has no filter node: the one a nodes user writes (state kept)."""

        def __init__(self, source: Any, fn: Callable[[Any], Any]) -> None:
            super().__init__()
            self.source = source
            self.fn = fn

        def reset(self, initial_state: dict[str, Any] | None = None) -> None:
            super().reset(initial_state)
            self.source.reset(initial_state["source"] if initial_state else None)

        def next(self) -> Any:
            while True:
                x = next(self.source)
                if self.fn(x):
                    return x

        def get_state(self) -> dict[str, Any]:
            return {"source": self.source.state_dict()}

    return types.SimpleNamespace(nodes=nodes, Filter=Filter)


def nodes_chain(nodes: Any) -> Callable[[list[int]], Iterable[Any]]:
    def build(data: list[int]) -> Iterable[Any]:
        n = nodes.nodes
        node = n.Batcher(nodes.Filter(n.Mapper(n.IterableWrapper(data), inc), keep), BATCH, drop_last=False)
        return n.Loader(node)

    return build


def nodes_map(nodes: Any) -> Callable[[list[int]], Iterable[Any]]:
    n = nodes.nodes
    return lambda data: n.Loader(n.Mapper(n.IterableWrapper(data), inc))


# -- measuring -----------------------------------------------------------------------------------------


def consume(build: Callable[[list[int]], Iterable[Any]], data: list[int]) -> tuple[float, float]:
    """(wall, CPU) seconds to build the pipeline and drain it; the consumer costs next to nothing.

    Every system measured here runs on the calling thread, so its CPU time equals its wall time on
    an idle machine; on a shared one, CPU time leaves out the time other processes took the core.
    """
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    collections.deque(build(data), maxlen=0)
    return time.perf_counter() - wall, time.process_time() - cpu


def measure_runs(
    systems: dict[str, Callable[[list[int]], Iterable[Any]]], data: list[int], repeats: int
) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) seconds of every repeat per system: one warm-up pass each, then the systems
    interleaved within each repeat."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in systems}
    for name, build in systems.items():
        consume(build, data)
    for _ in range(repeats):
        for name, build in systems.items():
            times[name].append(consume(build, data))
    return times


def medians_of(times: dict[str, list[tuple[float, float]]]) -> dict[str, tuple[float, float]]:
    return {
        name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for name, t in times.items()
    }


def measure(
    systems: dict[str, Callable[[list[int]], Iterable[Any]]], data: list[int], repeats: int
) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per system (see :func:`measure_runs`)."""
    return medians_of(measure_runs(systems, data, repeats))


def check_same_output(systems: dict[str, Callable[[list[int]], Iterable[Any]]], data: list[int]) -> None:
    want = [list(b) if isinstance(b, list) else b for b in next(iter(systems.values()))(data)]
    for name, build in systems.items():
        got = [list(b) if isinstance(b, list) else b for b in build(data)]
        if got != want:
            raise SystemExit(f"{name} yields something else than the plain version: {got[:2]} vs {want[:2]}")


def table(title: str, medians: dict[str, tuple[float, float]], n: int, limit: str, clock: int) -> list[str]:
    """Rows of ns/item and rate vs the limit, by the chosen clock (0 wall, 1 CPU), the other beside."""
    base = medians[limit][clock]
    other = "wall" if clock else "CPU"
    lines = [
        f"{title} ({n:,} items, medians of the repeats, {'CPU' if clock else 'wall'} time)",
        f"  {'system':34s} {'ns/item':>8s} {'items/s':>11s} {'rate vs plain':>14s} {'(' + other + ' ns/item)':>18s}",
    ]
    for name, t in medians.items():
        lines.append(
            f"  {name:34s} {t[clock] / n * 1e9:8.0f} {n / t[clock]:11,.0f} {base / t[clock]:13.3f}x "
            f"{t[1 - clock] / n * 1e9:17.0f}"
        )
    return lines


def workload_json(title: str, times: dict[str, list[tuple[float, float]]], n: int, limit: str, clock: int,
                  targets: list[dict[str, Any]]) -> dict[str, Any]:
    """One table as a workload of the results JSON (benchmarks/_results.py): items/s by the chosen
    clock (median and every repeat), the ratio to the limit, ns/item by both clocks."""
    medians = medians_of(times)
    base = n / medians[limit][clock]
    systems = [
        _results.system(
            name, "limit" if name == limit else _results.role_of(name), n / m[clock],
            runs=[n / t[clock] for t in times[name]], baseline=base,
            ns_per_item=m[clock] / n * 1e9, wall_ns_per_item=m[0] / n * 1e9, cpu_ns_per_item=m[1] / n * 1e9,
        )
        for name, m in medians.items()
    ]
    return {"name": title, "title": f"{title}, {n:,} ints", "unit": "items/s", "baseline": limit,
            "systems": systems, "targets": targets}


def results_json(chain: dict[str, list[tuple[float, float]]], single: dict[str, list[tuple[float, float]]], n: int,
                 clock: int, settings: dict[str, Any], skipped: list[str]) -> dict[str, Any]:
    """The figures main() prints, as the results JSON: the chain and the single stage, their targets."""
    chain_m, single_m = medians_of(chain), medians_of(single)
    chain_ratio = chain_m["plain generator chain (the limit)"][clock] / chain_m["datapipes"][clock]
    map_cost = single_m["datapipes map"][clock] / single_m["plain generator (the limit)"][clock]
    workloads = [
        workload_json("map -> filter -> batch(32)", chain, n, "plain generator chain (the limit)", clock,
                      [{"text": "chain rate >= 0.67x plain", "value": chain_ratio, "passed": chain_ratio >= 0.67}]),
        workload_json("one map stage", single, n, "plain generator (the limit)", clock,
                      [{"text": "one map stage <= 1.3x a generator's time", "value": map_cost,
                        "passed": map_cost <= 1.3}]),
    ]
    for w in workloads:
        w["systems"] += [_results.system(s.split(":")[0], "peer", None, status="not installed") for s in skipped]
    return _results.document("overhead", {**settings, "clock": "cpu" if clock else "wall"}, workloads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200_000, help="ints through the chain (default 200,000)")
    parser.add_argument("--repeats", type=int, default=5, help="passes per system; the median is shown (default 5)")
    parser.add_argument(
        "--clock", choices=("cpu", "wall"), default="cpu",
        help="the time the ratios and targets use: process CPU time (default: robust on a shared machine, "
        "since every system here runs on the calling thread) or wall time; the other is shown beside",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures and the machine to PATH "
                        "(the schema of benchmarks/_results.py; benchmarks/plots.py draws them)")
    args = parser.parse_args(argv)
    if args.items < 1 or args.repeats < 1:
        parser.error("--items and --repeats must be >= 1")

    missing = [name for name in ("map", "filter", "batch") if name not in IterDataPipe._functions]  # type: ignore[attr-defined]
    if missing:
        print(f"overhead.py: datapipes has no {', '.join(missing)} yet (IterDataPipe._functions): nothing to measure",
              file=sys.stderr)
        return 2

    data = list(range(args.items))
    chain: dict[str, Callable[[list[int]], Iterable[Any]]] = {
        "plain generator chain (the limit)": plain_chain,
        "datapipes": datapipes_chain,
    }
    single: dict[str, Callable[[list[int]], Iterable[Any]]] = {
        "plain generator (the limit)": plain_map,
        "datapipes map": datapipes_map,
        "datapipes map, source deepcopy=True": datapipes_map_copying,
        "datapipes map, counting (deque source)": datapipes_map_counted,
        "datapipes map, on_error=\"skip\"": datapipes_map_skipping,
        "datapipes map, rng=\"python\"": datapipes_map_seeded,
    }
    skipped = []
    torch_dp = _torch_datapipes()
    if isinstance(torch_dp, str):
        skipped.append(f"torch.utils.data.datapipes: {torch_dp}")
    else:
        chain["torch.utils.data.datapipes"] = torch_chain(torch_dp)
        single["torch.utils.data.datapipes map"] = torch_map(torch_dp)
    nodes = _torchdata_nodes()
    if isinstance(nodes, str):
        skipped.append(f"torchdata.nodes: {nodes}")
    else:
        chain["torchdata.nodes"] = nodes_chain(nodes)
        single["torchdata.nodes Mapper"] = nodes_map(nodes)

    check_same_output(chain, data[:1000])
    check_same_output(single, data[:1000])

    import platform

    import torch

    print(f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} cores "
          f"(load {os.getloadavg()[0]:.2f}), {args.items:,} ints, {args.repeats} repeats, "
          f"map -> filter (keeps 2/3) -> batch({BATCH})")
    chain_runs = measure_runs(chain, data, args.repeats)
    single_runs = measure_runs(single, data, args.repeats)
    chain_medians, single_medians = medians_of(chain_runs), medians_of(single_runs)
    clock = 1 if args.clock == "cpu" else 0
    lines = table("map -> filter -> batch(32)", chain_medians, args.items, "plain generator chain (the limit)", clock)
    lines += [""] + table("one map stage", single_medians, args.items, "plain generator (the limit)", clock)
    chain_ratio = chain_medians["plain generator chain (the limit)"][clock] / chain_medians["datapipes"][clock]
    map_cost = single_medians["datapipes map"][clock] / single_medians["plain generator (the limit)"][clock]
    lines += [
        "",
        f"target: chain rate >= 0.67x plain: {chain_ratio:.3f}x  {'PASS' if chain_ratio >= 0.67 else 'FAIL'}",
        f"target: one map stage <= 1.3x a generator's time: {map_cost:.3f}x  {'PASS' if map_cost <= 1.3 else 'FAIL'}",
    ]
    lines += [f"skipped {s}" for s in skipped]
    print("\n".join(lines))
    if args.json:
        _results.write(args.json, results_json(chain_runs, single_runs, args.items, clock,
                                               {"items": args.items, "repeats": args.repeats}, skipped))
    return 0 if chain_ratio >= 0.67 and map_cost <= 1.3 else 1


if __name__ == "__main__":
    sys.exit(main())
