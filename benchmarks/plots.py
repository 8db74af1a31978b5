"""Draw the benchmark results (``--json`` of overhead.py, concurrency.py, end_to_end.py) as PNG charts.

    .venv-bench/bin/python benchmarks/plots.py results/*.json --out docs/_static/perf

For every workload of every file: a bar chart of each system's throughput (the median; error bars
from the lowest to the highest run where the script repeats; the plain/limit version as a dashed
line), and for end_to_end.py also the time to first batch and the peak RSS. Each chart's title
names the workload, its footer the machine the figures came from and the command that produced
them (both read from the JSON). ``--rst FILE`` also writes reStructuredText ``figure`` directives
for docs/performance.rst.

Needs matplotlib (``pip install matplotlib``; benchmarks/requirements.txt puts it in .venv-bench/),
imported only when drawing, with the Agg backend (no display). The JSON schema is described in
benchmarks/_results.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
from typing import Any

SCHEMA = 1
COLORS = {"datapipes": "#1f77b4", "limit": "#7f7f7f", "reference": "#c7c7c7", "peer": "#ff7f0e"}


class ResultsError(ValueError):
    """A results file that does not follow the schema of benchmarks/_results.py."""


def load(path: str) -> dict[str, Any]:
    """Read one results file and check the parts of the schema the charts use."""
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ResultsError(f"{path}: not a benchmark results file of schema {SCHEMA} (written by --json)")
    for key in ("benchmark", "machine", "workloads"):
        if key not in doc:
            raise ResultsError(f"{path}: no {key!r}")
    for w in doc["workloads"]:
        for key in ("name", "unit", "systems"):
            if key not in w:
                raise ResultsError(f"{path}: workload {w.get('name')!r} has no {key!r}")
        for s in w["systems"]:
            if "name" not in s or "status" not in s or (s["status"] == "ok" and "throughput" not in s):
                raise ResultsError(f"{path}: workload {w['name']!r}: system {s!r} lacks name/status/throughput")
    return doc


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def machine_line(machine: dict[str, Any]) -> str:
    parts = [f"Python {machine.get('python', '?')}", f"torch {machine.get('torch') or '-'}",
             f"{machine.get('cpu_count', '?')} CPUs", str(machine.get("platform", "?"))]
    if machine.get("load_avg") is not None:
        parts.append(f"load {machine['load_avg']}")
    env = machine.get("env") or {}
    if env:
        parts.append(" ".join(f"{k}={v}" for k, v in env.items()))
    return f"Machine: {', '.join(parts)}; {machine.get('date', '?')}"


def command_line(machine: dict[str, Any]) -> str:
    return f"Command: {machine.get('command', '?')}"


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as e:
        raise RuntimeError("benchmarks/plots.py needs matplotlib: pip install matplotlib "
                           "(or bash benchmarks/setup.sh, which installs it into .venv-bench/)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _fmt(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 1:
        return f"{v:.1f}"
    return f"{v:.3g}"


def _tick(v: float, _pos: Any = None) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:g}{suffix}"
    return f"{v:g}"


def bar_chart(plt: Any, path: str, title: str, xlabel: str, rows: list[dict[str, Any]], footer: list[str],
              line: tuple[float, str] | None = None) -> str:
    """A horizontal bar chart: ``rows`` of ``{"name", "role", "value" (or None), "low", "high", "note"}``
    (``low``/``high``: the spread, drawn as an error bar), top to bottom; ``line``: a dashed reference
    at ``(value, label)``."""
    n = len(rows)
    fig, ax = plt.subplots(figsize=(9.5, 1.9 + 0.42 * n))
    ys = list(range(n))[::-1]
    values = [r["value"] or 0.0 for r in rows]
    colors = [COLORS.get(r["role"], COLORS["peer"]) for r in rows]
    ax.barh(ys, values, color=colors, height=0.65)
    for y, r in zip(ys, rows):
        if r["value"] is not None and r.get("low") is not None and r.get("high") is not None and r["high"] > r["low"]:
            ax.errorbar(r["value"], y, xerr=[[r["value"] - r["low"]], [r["high"] - r["value"]]], fmt="none",
                        ecolor="black", elinewidth=1, capsize=3)
    top = max([r.get("high") or r["value"] or 0.0 for r in rows] + [line[0] if line else 0.0, 1e-12])
    for y, r in zip(ys, rows):
        label = r.get("note") or ""
        if r["value"] is not None:
            label = f"{_fmt(r['value'])}  {label}".rstrip()
        x = max(r.get("high") or 0.0, r["value"] or 0.0)
        ax.text(x + top * 0.01, y, label, va="center", fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.8})
    if line is not None:
        ax.axvline(line[0], color="black", linestyle="--", linewidth=1)
        ax.text(line[0], n - 0.45, f" {line[1]}", fontsize=7, va="bottom")
    ax.set_yticks(ys)
    ax.set_yticklabels([r["name"] for r in rows], fontsize=8)
    ax.set_xlim(0, top * 1.32)
    ax.xaxis.set_major_formatter(plt.FuncFormatter(_tick))
    ax.set_ylim(-0.6, n - 0.1)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_title("\n".join(textwrap.wrap(title, 95)), fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    lines = [part for text in footer for part in textwrap.wrap(text, 160, subsequent_indent="    ")]
    fig.set_figheight(fig.get_figheight() + 0.13 * len(lines))
    footer_h = 0.13 * len(lines) + 0.12
    fig.tight_layout(rect=(0, footer_h / fig.get_figheight(), 1, 1))
    for i, text in enumerate(lines):
        fig.text(0.01, (0.06 + 0.13 * (len(lines) - 1 - i)) / fig.get_figheight(), text, fontsize=6.5,
                 family="monospace", va="bottom")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _spread(runs: list[float] | None) -> tuple[float | None, float | None]:
    if runs and len(runs) > 1:
        return min(runs), max(runs)
    return None, None


def throughput_rows(workload: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for s in workload["systems"]:
        if s["status"] != "ok":
            rows.append({"name": s["name"], "role": s.get("role", "peer"), "value": None, "note": s["status"]})
            continue
        low, high = _spread(s.get("runs"))
        note = f"{s['ratio']:.2f}x" if s.get("ratio") is not None and workload.get("baseline") else ""
        rows.append({"name": s["name"], "role": s.get("role", "peer"), "value": s["throughput"], "low": low,
                     "high": high, "note": note})
    return rows


def metric_rows(workload: dict[str, Any], key: str, runs_key: str, scale: float) -> list[dict[str, Any]]:
    rows = []
    for s in workload["systems"]:
        if s["status"] != "ok" or key not in s:
            rows.append({"name": s["name"], "role": s.get("role", "peer"), "value": None,
                         "note": s["status"] if s["status"] != "ok" else "not measured"})
            continue
        low, high = _spread(s.get(runs_key))
        rows.append({"name": s["name"], "role": s.get("role", "peer"), "value": s[key] * scale,
                     "low": None if low is None else low * scale, "high": None if high is None else high * scale})
    return rows


def render(doc: dict[str, Any], out: str, prefix: str) -> list[tuple[str, str]]:
    """Draw every chart of one results document into ``out``; return ``(path, caption)`` pairs."""
    plt = _pyplot()
    machine = doc["machine"]
    footer = [machine_line(machine), command_line(machine)]
    script = f"{doc['benchmark']}.py"
    written = []
    for w in doc["workloads"]:
        title = f"{script}: {w.get('title') or w['name']}"
        runs = max((len(s.get("runs") or []) for s in w["systems"]), default=0)
        spread = f"median of {runs} runs, bars: lowest to highest run" if runs > 1 else "one run"
        env = w.get("env")
        foot = footer if not env else [footer[0] + "; " + " ".join(f"{k}={v}" for k, v in env.items()), footer[1]]
        limit = next((s for s in w["systems"] if s.get("role") == "limit" and s["status"] == "ok"), None)
        line = (limit["throughput"], "limit") if limit else None
        base = f"{prefix}-{slug(w['name'])}"
        ratio = [f"Beside each bar: the median, and its ratio to {w['baseline']}'s."] if w.get("baseline") else []
        path = bar_chart(plt, os.path.join(out, base + ".png"), title,
                         f"{w['unit']} ({spread}; higher is better)", throughput_rows(w), ratio + foot, line)
        written.append((path, f"{title}: throughput"))
        if any("first_batch_s" in s for s in w["systems"]):
            path = bar_chart(plt, os.path.join(out, base + "-first-batch.png"), f"{title}: time to first batch",
                             f"ms ({spread}; lower is better)",
                             metric_rows(w, "first_batch_s", "first_batch_runs", 1000.0), foot)
            written.append((path, f"{title}: time to first batch"))
        if any("peak_rss_mb" in s for s in w["systems"]):
            path = bar_chart(plt, os.path.join(out, base + "-peak-rss.png"), f"{title}: peak memory",
                             f"peak RSS, MB, workers included ({spread}; lower is better)",
                             metric_rows(w, "peak_rss_mb", "peak_rss_runs", 1.0), foot)
            written.append((path, f"{title}: peak memory"))
    return written


def rst(figures: list[tuple[str, str, dict[str, Any]]], relative_to: str) -> str:
    out = []
    for path, caption, machine in figures:
        out += [f".. figure:: /{os.path.relpath(path, relative_to)}", f"   :alt: {caption}", "",
                f"   {caption}. {machine_line(machine)}. {command_line(machine)}", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="JSON files written by the benchmarks' --json")
    parser.add_argument("--out", required=True, help="folder for the PNG files (created if missing)")
    parser.add_argument("--rst", metavar="FILE", help="also write reStructuredText figure directives to FILE, "
                        "paths relative to --docs")
    parser.add_argument("--docs", default="docs", help="the Sphinx source folder --rst paths start from (default docs)")
    args = parser.parse_args(argv)
    try:
        docs = [(path, load(path)) for path in args.results]
    except (OSError, ValueError) as e:
        print(f"plots.py: {e}", file=sys.stderr)
        return 2
    counts: dict[str, int] = {}
    for _, doc in docs:
        counts[doc["benchmark"]] = counts.get(doc["benchmark"], 0) + 1
    os.makedirs(args.out, exist_ok=True)
    figures = []
    try:
        for path, doc in docs:
            # Two files of one benchmark (two runs, two machines) are told apart by their file names.
            prefix = slug(doc["benchmark"]) if counts[doc["benchmark"]] == 1 else slug(os.path.splitext(
                os.path.basename(path))[0])
            figures += [(p, c, doc["machine"]) for p, c in render(doc, args.out, prefix)]
    except RuntimeError as e:
        print(f"plots.py: {e}", file=sys.stderr)
        return 2
    for p, _, _ in figures:
        print(p)
    if args.rst:
        with open(args.rst, "w") as f:
            f.write(rst(figures, args.docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
