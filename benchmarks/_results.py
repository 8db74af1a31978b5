"""The JSON that ``--json PATH`` writes (overhead.py, concurrency.py, end_to_end.py) and plots.py reads.

Schema (``"schema": 1``)::

    {
      "schema": 1,
      "benchmark": "overhead" | "concurrency" | "end_to_end",
      "machine": {"python", "implementation", "torch", "cpu_count", "platform", "machine", "processor",
                  "load_avg", "date" (UTC, ISO 8601), "command" (the exact command line), "env" (MALLOC_*)},
      "settings": {...the script's options...},
      "workloads": [
        {"name": str, "title": str, "unit": "items/s" | "images/s",
         "baseline": str | null,          # the system the ratios are taken against (the plain/limit version)
         "systems": [
           {"name": str, "role": "limit" | "datapipes" | "peer" | "reference",
            "status": "ok" | "not installed" | "failed",
            "throughput": float,          # median, in the workload's unit (absent unless status is "ok")
            "runs": [float, ...],         # throughput of each run (the spread), where the script repeats
            "ratio": float,               # throughput / the baseline's, where there is a baseline
            ...                           # script-specific medians (ns_per_item, first_batch_s, peak_rss_mb, ...)
           }, ...],
         "targets": [{"text": str, "value": float, "passed": bool}, ...]
        }, ...]
    }

Only the standard library here: the scripts import it in every environment.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
from typing import Any, Callable

SCHEMA = 1


def machine() -> dict[str, Any]:
    """Where and how the figures were measured: interpreter, torch, cores, platform, date, command line."""
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "torch": torch_version,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "load_avg": load,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")},
    }


def document(benchmark: str, settings: dict[str, Any], workloads: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schema": SCHEMA, "benchmark": benchmark, "machine": machine(), "settings": settings,
            "workloads": workloads}


def system(name: str, role: str, throughput: float | None, runs: list[float] | None = None,
           baseline: float | None = None, status: str = "ok", **extra: Any) -> dict[str, Any]:
    """One system's record; ``baseline`` is the baseline's throughput (for the ratio)."""
    out: dict[str, Any] = {"name": name, "role": role, "status": status}
    if status == "ok" and throughput is not None:
        out["throughput"] = throughput
        if runs is not None:
            out["runs"] = list(runs)
        if baseline:
            out["ratio"] = throughput / baseline
    out.update(extra)
    return out


def role_of(name: str) -> str:
    return "datapipes" if name.startswith("datapipes") else "peer"


def write(path: str, doc: dict[str, Any]) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def add_ratios(workload: dict[str, Any]) -> dict[str, Any]:
    """Set each system's ``ratio`` to its throughput over the baseline system's (where both ran)."""
    base = next((s.get("throughput") for s in workload["systems"] if s["name"] == workload.get("baseline")), None)
    if base:
        for s in workload["systems"]:
            if "throughput" in s:
                s["ratio"] = s["throughput"] / base
    return workload


def record_run(out: dict[str, Any] | str, key: str, rows: list[dict[str, Any]], failed: dict[str, str], what: str,
               figures: Callable[[dict[str, Any]], str]) -> None:
    """Keep one child run's figures in ``rows`` (or, where ``out`` is its error, the failure under
    ``key``) and print one line about it to stderr (``what``: the run and the system; ``figures``:
    the run's figures as text), so that a benchmark cut short by a time limit still leaves every
    completed run's figures in its log."""
    if isinstance(out, str):
        failed[key] = out
        print(f"  {what}: failed: {out}", file=sys.stderr, flush=True)
    else:
        rows.append(out)
        print(f"  {what}: {figures(out)}", file=sys.stderr, flush=True)


def target(workload: dict[str, Any], failed: list[str], text: str, value: float, passed: bool) -> None:
    """Record a target of ``workload`` and print it; a missed one is added to ``failed``."""
    workload["targets"].append({"text": text, "value": value, "passed": passed})
    print(f"  target: {text}: {'PASS' if passed else 'FAIL'}", flush=True)
    if not passed:
        failed.append(text)


def run_sections(benchmark: str, parser: Any, sections: dict[str, Callable[[Any], None]],
                 workloads: list[dict[str, Any]], failed: list[str], argv: list[str] | None) -> int:
    """A script made of named sections: ``--only`` picks some (``parser`` gets it and ``--json``),
    each runs in turn, the figures go to ``--json``; exit status 1 if a target was missed."""
    parser.add_argument("--only", default=",".join(sections), help=f"comma-separated: {', '.join(sections)}")
    parser.add_argument("--json", help="write the figures here (benchmarks/_results.py's schema)")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in only if name not in sections]
    if unknown:
        parser.error(f"--only: unknown {unknown}; choose from {', '.join(sections)}")
    for name in only:
        sections[name](args)
        print(flush=True)
    if args.json:
        write(args.json, document(benchmark, vars(args), workloads))
    print(f"targets: {'all met' if not failed else 'missed: ' + '; '.join(failed)}", flush=True)
    return 1 if failed else 0
