"""``profile(pipe, num_items=...)``: run a pipe, measure every stage and name the bottleneck.

:func:`profile` runs one *observed* pass of the pipe (see :mod:`datapipes.hooks`): every stage of the
pass, serial ones included, keeps :class:`~datapipes._engine.StageStats` (items in and out, self
time; a concurrent stage also its workers' busy time and its queue fill). The
:class:`ProfileReport` it returns shows them

- as a text table (``print(report)``, :meth:`ProfileReport.table`);
- as the pipe's Mermaid graph, each stage labelled with its figures and the bottleneck highlighted
  (:meth:`ProfileReport.to_mermaid`);
- with ``trace=``, as a Chrome trace-event file of what the stages did over time, to open in
  Perfetto (https://ui.perfetto.dev): :meth:`ProfileReport.save_trace`, recorded by a
  :class:`TraceRecorder` hook, which you can also attach to any pass yourself.

The bottleneck:

- if the thread reading the pipe spends most of its time (>= 50%) neither waiting for the last
  concurrent stage nor pulling its source, the work downstream of that stage is the limit: the serial
  stage there with the most self time, if it took half that time or more, else ``consumer`` (the
  code reading the pipe);
- otherwise, walking upstream from the last concurrent stage, the first stage whose workers are busy
  most of the time (busy fraction >= 50%) limits the pipe. The advice depends on what the process's
  CPU time and the machine's CPU use say:

  - the process kept (nearly) every CPU busy: the pipe is CPU-bound, more ``concurrency`` cannot help;
  - other processes kept the machine busy (less than half a CPU left idle, and others used half a CPU
    or more): the pipe is *CPU-starved*, and the report says how many CPUs the others took. A stage
    whose threads release the GIL (Pillow decoding) gets about one CPU of two beside a CPU hog, just
    as a GIL-bound one does on an idle machine, so no GIL verdict is given then. A thread stage whose
    workers *together* were busy most of the time is named the limit here too;
  - a thread stage's workers were busy while the process used about one CPU and the machine had idle
    CPU (half a CPU or more) that the process did not use: ``fn`` holds the GIL (use
    ``executor="process"``). A thread stage whose workers *together* were busy most of the time
    counts even if each worker alone was busy less than half the time (threads taking turns on the
    GIL show each of n workers busy about 1/n of the time). Where the machine's CPU use cannot be
    read, the advice says the GIL is one possible cause, not the cause. On free-threaded CPython
    with the GIL disabled (``sys._is_gil_enabled()`` false) the GIL cannot be the cause: the advice
    says something inside ``fn`` (a lock) serialises the threads;
  - otherwise raise its ``concurrency``;
- otherwise the stages the concurrent ones waited for are the limit: the serial stages upstream of
  the first concurrent stage when it spent most of its time pulling its source, those between two
  concurrent stages when the later one did; when no stage's workers were saturated, any stage, by
  its own time on the thread reading it (a concurrent stage whose ``fn`` is too cheap for
  concurrency spends it starting workers and handing items over). The one with the most self time
  is named when it took a fifth of the run or more; when none did (the time is spread over
  several), or without figures for the serial stages, the verdict is ``serial stages``, except on a
  CPU-starved machine, where the concurrent stage the pipe waited on most (half the time or more)
  is named: its workers were not busy and its source was not slow, so its threads were ready to run
  but had no CPU (time the report cannot see: neither in ``fn`` nor waiting on a queue);
- a pipe with no concurrent stage: its serial stage with the most self time.

A stage's *self time* is the time spent in its own ``next()``, its upstream's excluded: for a serial
stage its own work (for a source, reading); for a concurrent stage, the time the thread reading it
spends in it, which the report splits into waiting for its workers' results (``wait_share``) and
its own bookkeeping (``self_share``: starting workers, handing items over, taking results back).

The machine's CPU use is read from Linux's ``/proc/stat`` (busy and idle time of the CPUs this
process may run on) when the run starts and ends; elsewhere it is unknown (``machine_cores`` None).

>>> from datapipes.iter import IterableWrapper
>>> from datapipes.profiling import profile
>>> report = profile(IterableWrapper(range(100)).map(abs, concurrency=2).prefetch(4), show=False)
>>> report.items, [(row["stage"], row["items_out"]) for row in report.stages]
(100, [('IterableWrapper', 100), ('Mapper(abs)', 100), ('Prefetcher(4)', 100)])
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

from ._redact import redact
from ._runtime import passes as _pass
from ._trace import TraceRecorder, _write_json
from ._runtime.tuning import cpu_times as _cpu_times  # noqa: F401 - read by the tests
from ._runtime.tuning import machine_cores as _machine_cores
from ._runtime.tuning import read_proc_stat as _read_proc_stat
from ._runtime.tuning import usable_cpus
from .graph import chain_repr, sources_of
from .graph import stages as _stages
from .graph import to_mermaid as _to_mermaid

__all__ = ["ProfileReport", "TraceRecorder", "profile"]

_SATURATED = 0.5
_BACKED_UP = 0.5
_CPU_BOUND = 0.85  # share of the machine's CPUs the process used for the pipe to count as CPU-bound
_IDLE = 0.5  # CPUs left idle on the machine for the process to have had room to use more


#: how the bottleneck's node is drawn in :meth:`ProfileReport.to_mermaid`
_HIGHLIGHT = "fill:#fdd,stroke:#c00,stroke-width:3px"


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _figures(row: dict[str, Any]) -> str:
    """The figures of a Mermaid node: items/s, the self-time share, and a concurrent stage's waits
    and busy workers."""
    rate = f"{_rate(row['items_per_s'])} items/s<br/>self {row['self_share']:.0%}"
    if row["kind"] in ("serial", "inline"):
        return rate
    auto = ", auto" if row["auto"] else ""
    workers = "" if row["kind"] == "prefetch" else f" of {row['concurrency']} workers{auto}"
    return f"{rate}, waited {row['wait_share']:.0%}<br/>busy {row['busy_fraction']:.0%}{workers}"


@dataclass
class ProfileReport:
    """What :func:`profile` measured.

    Attributes:
        items: items the pipe yielded.
        seconds: wall time of the run.
        items_per_s: the pipe's output rate.
        stages: one dict per stage of the pass, serial ones included, in data-flow order (sources
            first). Keys: those of :meth:`StageStats.as_dict <datapipes._engine.StageStats.as_dict>`
            (``stage``, ``kind``, ``workers``, ``concurrency``, ``auto``, ``items_in``, ``items_out``,
            ``failures``, ``seconds``, ``items_per_s``, ``busy_s``, ``busy_fraction``, ``self_s``,
            ``queue_fill``, ``source_s``, ``wait_s``, ``tuning``, ``tokens``, ``tokens_per_s``), plus
            ``self_share``, ``wait_share``, ``source`` and ``worker``. ``self_share``: the stage's own
            time on the thread reading it over the run's ``seconds`` (``self_s``; for a concurrent stage
            ``self_s`` less ``wait_s``, the time that thread waited for its workers' results, which is
            ``wait_share``); ``source``: the stage reads no other stage. ``worker``: ``None`` for a stage
            of this process; for a stage inside DataLoader worker processes, ``"all"`` on its row totalled across them
            (``stage [N workers]``: counts and seconds summed, shares and fractions their mean) and
            the worker's id on its per-worker rows (``profile(..., per_worker=True)``).
        bottleneck: the label of the limiting stage, or ``"consumer"`` or ``"serial stages"``.
        reason: one sentence saying why.
        cpu_cores: CPU seconds this process used per wall second (all its threads; worker
            processes of ``executor="process"`` stages are not counted).
        cpus: CPUs the process may run on.
        machine_cores: CPUs kept busy by all processes together during the run, on the CPUs this
            process may run on (from ``/proc/stat``); None where it cannot be read.
        bottleneck_index: the index in ``stages`` of the limiting stage (None for ``"consumer"``
            and ``"serial stages"``).
        trace: the Chrome trace-event JSON object (``{"traceEvents": [...], ...}``) recorded with
            ``profile(..., trace=...)``; None without.
        pipe: the pipe profiled.
        stage_objects: the stages themselves, one per entry of ``stages``.
    """

    items: int
    seconds: float
    items_per_s: float
    stages: list[dict[str, Any]] = field(default_factory=list)
    bottleneck: str = ""
    reason: str = ""
    cpu_cores: float = 0.0
    cpus: int = 1
    machine_cores: float | None = None
    bottleneck_index: int | None = None
    trace: dict[str, Any] | None = field(default=None, repr=False)
    pipe: Any = field(default=None, repr=False, compare=False)
    stage_objects: list[Any] = field(default_factory=list, repr=False, compare=False)

    @property
    def other_cores(self) -> float | None:
        """CPUs kept busy by other processes during the run (None where unknown)."""
        return None if self.machine_cores is None else max(self.machine_cores - self.cpu_cores, 0.0)

    def table(self) -> str:
        """The report as a text table: one line per stage (``*`` marks the bottleneck), sources first.

        ``self``: the stage's own time on the thread reading it, as a share of the run (``self_share``);
        a concurrent stage's: ``waited``, the share of the run that thread waited for its results,
        ``busy``, its workers' busy time over (elapsed x workers), and ``queue fill``, the mean share
        of its output buffer holding results ready for the consumer (near 100%: downstream is
        slower). ``-`` where a serial stage has no such figure. A stage that counts tokens
        (``tokenize``) gets a line after the table: its tokens and tokens/s; a stage that mixes
        sources (``Mixer``), its sources' realised shares beside their targets.
        """
        head = (f"  {'stage':<30} {'kind':<8} {'workers':>7} {'items in':>9} {'items out':>9} {'items/s':>10} "
                f"{'self':>5} {'waited':>6} {'busy':>5} {'queue fill':>10}")
        lines = [head, "-" * len(head)]
        for i, r in enumerate(self.stages):
            serial = r["kind"] in ("serial", "inline")
            workers = "-" if serial else f"{r['concurrency']}{' auto' if r['auto'] else ''}"
            waited, busy, fill = ("-", "-", "-") if serial else (
                f"{r['wait_share']:.0%}", f"{r['busy_fraction']:.0%}", f"{r['queue_fill']:.0%}")
            mark = "*" if i == self.bottleneck_index else " "
            lines.append(
                f"{mark} {r['stage'][:30]:<30} {r['kind']:<8} {workers:>7} {r['items_in']:>9} {r['items_out']:>9} "
                f"{r['items_per_s']:>10.1f} {r['self_share']:>5.0%} {waited:>6} {busy:>5} {fill:>10}"
            )
        lines.append(f"  {'(pipe output)':<30} {'':<8} {'':>7} {'':>9} {self.items:>9} {self.items_per_s:>10.1f}")
        for r in self.stages:
            if r.get("tokens"):
                lines.append(f"{r['stage']}: {r['tokens']} tokens, {r['tokens_per_s']:.1f} tokens/s")
        for r in self.stages:
            if r.get("shares"):
                counted = "tokens" if any("tokens" in v for v in r["shares"].values()) else "items"
                parts = [f"{name} {v['share']:.1%} (target {v['target']:.1%})" for name, v in r["shares"].items()]
                lines.append(f"{r['stage']}: shares of the {counted} drawn: {', '.join(parts)}")
        for r in self.stages:
            if r["auto"]:
                tuning = f": {r['tuning']}" if r["tuning"] else ""
                lines.append(f"{r['stage']}: concurrency=\"auto\" chose {r['concurrency']} workers{tuning}")
        if self.machine_cores is None:
            machine = "all processes: unknown"
        else:
            machine = f"all processes: {self.machine_cores:.2f} (others {self.other_cores:.2f})"
        lines.append(f"process CPU: {self.cpu_cores:.2f} of {self.cpus} CPUs; {machine}")
        lines.append(f"bottleneck: {self.bottleneck}: {self.reason}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_mermaid(self) -> str:
        """The pipe's Mermaid graph (:func:`datapipes.graph.to_mermaid`), each stage labelled with
        its items/s and self-time share (a concurrent stage also with its workers' busy share), the
        bottleneck drawn in red (a ``classDef bottleneck``; for ``"consumer"``, a node after the
        pipe). Paste it into a Markdown file (a ``mermaid`` code block) or https://mermaid.live.

        Raises:
            ValueError: the report holds no pipe (one made by hand).
        """
        if self.pipe is None:
            raise ValueError("to_mermaid: this report holds no pipe; profile(pipe) makes one that does")
        figures = {id(stage): row for stage, row in zip(self.stage_objects, self.stages)}

        def annotate(stage: Any) -> str | None:
            row = figures.get(id(stage))
            return None if row is None else _figures(row)

        lines = [_to_mermaid(self.pipe, annotate)]
        graph = _stages(self.pipe)
        target = None
        if self.bottleneck_index is not None:
            stage = self.stage_objects[self.bottleneck_index]
            target = next((f"s{k}" for k, s in enumerate(graph) if s is stage), None)
        elif self.bottleneck == "consumer":
            lines.append(f"    s{len(graph) - 1} --> consumer([\"consumer: the code reading the pipe\"])")
            target = "consumer"
        if target is not None:
            lines.append(f"    classDef bottleneck {_HIGHLIGHT}")
            lines.append(f"    class {target} bottleneck")
        return redact("\n".join(lines))

    def save_trace(self, path: str | os.PathLike[str]) -> None:
        """Write the trace recorded with ``profile(..., trace=True)`` as a Chrome trace-event JSON file
        (open it in https://ui.perfetto.dev or ``chrome://tracing``).

        Raises:
            ValueError: the run recorded no trace (``profile`` was called without ``trace=``).
        """
        if self.trace is None:
            raise ValueError("save_trace: this report holds no trace; run profile(pipe, trace=True) (or "
                             "trace='path.json') to record one")
        _write_json(self.trace, path)


def _frac(seconds: float, row: dict[str, Any]) -> float:
    return seconds / row["seconds"] if row["seconds"] > 0 else 0.0


def _taking_turns(row: dict[str, Any]) -> bool:
    """A thread stage whose workers *together* were in ``fn`` most of the time (not pulling its source).

    The workers' summed busy time is the test, not each one's share: a ``fn`` shorter than the 5 ms
    switch interval runs to its end once it has the GIL, so each of n workers shows busy only about
    1/n of the time though the stage is the limit.
    """
    return (
        row["kind"] in ("thread", "executor")
        and row["workers"] >= 2
        and row["busy_fraction"] * row["workers"] >= _SATURATED
        and _frac(row["source_s"], row) < _SATURATED
    )


def _on_one_cpu(row: dict[str, Any], cpu_cores: float, cpus: int) -> bool:
    """:func:`_taking_turns` while the whole process used about one CPU of several: the threads take
    turns, on the GIL or on a CPU that other processes leave them (see :func:`_gil_bound`)."""
    return cpus >= 2 and 0.75 <= cpu_cores < 1.25 and _taking_turns(row)


def _starved(cpu_cores: float, cpus: int, machine_cores: float) -> bool:
    """Other processes kept the machine busy: under half a CPU idle, and half a CPU or more theirs."""
    return cpus - machine_cores < _IDLE and machine_cores - cpu_cores >= _IDLE


def _gil_bound(row: dict[str, Any], cpu_cores: float, cpus: int, machine_cores: float) -> bool:
    """:func:`_on_one_cpu`, and the machine had idle CPU (half a CPU or more) that the process did not
    use: its threads could not run though a CPU was free, so ``fn`` holds the GIL.

    Without the idle CPU the same figures come from a machine saturated by other processes (a
    GIL-free decode on two threads beside a CPU hog gets about one CPU of two), so no verdict.
    """
    return _on_one_cpu(row, cpu_cores, cpus) and cpus - machine_cores >= _IDLE


def _gil_enabled() -> bool:
    """Whether this interpreter runs with a GIL now: false only on free-threaded CPython with the GIL
    disabled (importing an extension not marked free-threading safe turns it back on)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


def _saturated_advice(row: dict[str, Any], cpu_cores: float, cpus: int, machine_cores: float | None) -> str:
    busy = f"its workers were busy {row['busy_fraction']:.0%} of the time"
    if row["kind"] == "process":
        return f"{busy}; raise its concurrency (up to the number of CPUs, {cpus}) or speed up its fn"
    if cpu_cores >= _CPU_BOUND * cpus:
        return (
            f"{busy} and the process kept {cpu_cores:.1f} of {cpus} CPUs busy: the pipe is CPU-bound, so more "
            "concurrency will not help; make fn cheaper, or spread the work over more machines"
        )
    if machine_cores is not None and _starved(cpu_cores, cpus, machine_cores):
        return (
            f"{busy} but the process got only {cpu_cores:.1f} of {cpus} CPUs. CPU-starved: other processes used "
            f"{machine_cores - cpu_cores:.1f} of {cpus} CPUs, leaving none idle, so more concurrency will not help "
            "while they run; profile again on a quieter machine to see what limits the stage itself"
        )
    # Without a GIL (free-threaded CPython, GIL disabled), threads that take turns wait on each other
    # inside fn: a lock of its own, or an extension's.
    gil = _gil_enabled()
    if machine_cores is not None and _gil_bound(row, cpu_cores, cpus, machine_cores):
        likely = ("fn most likely holds the GIL" if gil
                  else "the GIL is disabled, so something inside fn (a lock) serialises the threads")
        return (
            f"{busy} but the process used only {cpu_cores:.1f} of {cpus} CPUs while {cpus - machine_cores:.1f} stayed "
            f"idle: {likely}, so threads take turns; use executor=\"process\" (or a function that releases it)"
        )
    if machine_cores is None and _on_one_cpu(row, cpu_cores, cpus):
        return (
            f"{busy} but the process used only {cpu_cores:.1f} of {cpus} CPUs: "
            f"{'fn may hold the GIL' if gil else 'something inside fn (a lock) may serialise the threads'} (then use "
            "executor=\"process\"), or other processes took the CPUs; this machine's CPU use could not be read "
            "to tell which"
        )
    return f"{busy}; raise its concurrency or speed up its fn"


_NAMED = 0.2  # self-time share of the run for a serial stage to be named the bottleneck among several


def _self_share(row: dict[str, Any]) -> float:
    share = row.get("self_share")
    return float(share) if share is not None else _frac(row.get("self_s", 0.0), row)


def _slowest(rows: list[dict[str, Any]], candidates: list[int], where: str) -> tuple[int, str, str]:
    """The stage among ``candidates`` (indices of ``rows``) with the most self time."""
    i = max(candidates, key=lambda k: _self_share(rows[k]))
    row = rows[i]
    share = _self_share(row)
    if row["kind"] != "serial":
        return i, row["stage"], (
            f"its own work on the thread reading it (starting its workers, handing items to them and taking "
            f"results back) took {share:.0%} of the run, the most of {where}, while its workers were busy "
            f"{row['busy_fraction']:.0%} of the time: fn is too cheap to pay for concurrency; call it serially "
            "(map(fn)) or on batches"
        )
    if row.get("source", False):
        advice = ("it is a source, read on one thread: read ahead with .prefetch(n) after it, or split the "
                  "reading over several sources read concurrently")
    else:
        advice = ("it works on one item at a time, on one thread: give it workers (map(fn, concurrency=N): "
                  "threads for I/O or code that releases the GIL, executor=\"process\" for Python code that "
                  "holds it) or make it cheaper")
    return i, row["stage"], (
        f"it spent {share:.0%} of the run in its own work (its upstream excluded), the most of {where}; {advice}"
    )


def _bottleneck(
    rows: list[dict[str, Any]], cpu_cores: float = 0.0, cpus: int = 1, machine_cores: float | None = None
) -> tuple[int | None, str, str]:
    """``(index in rows, label, reason)`` of the limiting stage (the rules are in the module's
    docstring); the index is None for ``"consumer"`` and ``"serial stages"``. ``rows`` are in
    data-flow order; serial stages' rows (kind ``"serial"``) are optional: without them the serial
    stages are named as a whole."""
    conc = [i for i, r in enumerate(rows) if r["kind"] != "serial"]
    serial = [i for i, r in enumerate(rows) if r["kind"] == "serial"]
    if not conc:
        if serial:
            return _slowest(rows, serial, "the stages (none is concurrent: all run on the consumer's thread)")
        return None, "serial stages", "the pipe has no concurrent stage: every stage runs on the consumer's thread"
    last_i = conc[-1]
    last = rows[last_i]
    # Time of the thread reading the last stage: waiting for it, pulling its source (a concurrent map
    # pulls on that thread), and the rest, which is the consumer's own work.
    own = last["wait_s"] + (last["source_s"] if last["kind"] != "prefetch" else 0.0)
    consumer = 1.0 - _frac(own, last)
    if consumer >= _BACKED_UP:
        after = [i for i in serial if i > last_i]
        if after and max(rows[i].get("self_s", 0.0) for i in after) >= 0.5 * consumer * last["seconds"]:
            return _slowest(rows, after, (
                f"the serial stages after {last['stage']}, on the consumer's thread (which spent {consumer:.0%} of "
                "the time after that stage while its results were ready)"))
        return None, "consumer", (
            f"the work after {last['stage']} on the consumer's thread (serial stages downstream of it, or the "
            f"code reading the pipe) took {consumer:.0%} of the time while its results were ready"
        )
    broke_at = None
    for k in range(len(conc) - 1, -1, -1):
        row = rows[conc[k]]
        if row["kind"] != "prefetch" and (
            row["busy_fraction"] >= _SATURATED
            or _on_one_cpu(row, cpu_cores, cpus)
            or (machine_cores is not None and _starved(cpu_cores, cpus, machine_cores) and _taking_turns(row))
        ):
            return conc[k], row["stage"], _saturated_advice(row, cpu_cores, cpus, machine_cores)
        if _frac(row["source_s"], row) < _SATURATED:
            broke_at = k
            break
    if serial:
        if broke_at is None:  # every concurrent stage waited on its source: the serial stages upstream
            first = rows[conc[0]]
            candidates = [i for i in serial if i < conc[0]]
            where = (f"the serial stages upstream of {first['stage']} (which spent {_frac(first['source_s'], first):.0%} "
                     "of the time pulling its source)")
        elif broke_at < len(conc) - 1:  # the stage after conc[broke_at] waited on what lies between
            lo, hi = rows[conc[broke_at]], rows[conc[broke_at + 1]]
            candidates = [i for i in serial if conc[broke_at] < i < conc[broke_at + 1]]
            where = (f"the serial stages between {lo['stage']} and {hi['stage']} (which spent "
                     f"{_frac(hi['source_s'], hi):.0%} of the time pulling its source)")
        else:  # no stage's workers were saturated: the stages' own work on the threads reading them
            candidates = list(range(len(rows)))
            where = "the stages (no concurrent stage's workers were saturated)"
        if candidates and max(_self_share(rows[i]) for i in candidates) >= _NAMED:
            return _slowest(rows, candidates, where)
    first = rows[conc[0]]
    if _frac(first["source_s"], first) >= _SATURATED:
        return None, "serial stages", (
            f"{first['stage']} spent {_frac(first['source_s'], first):.0%} of the time pulling its source: the serial "
            "stages upstream of it (source, serial maps) limit the rate; make them concurrent or add a prefetch"
        )
    if machine_cores is not None and _starved(cpu_cores, cpus, machine_cores):
        # Waited on, its workers idle, nothing upstream slow: its threads were runnable but had no CPU
        # (a thread waiting for a CPU is neither busy in fn nor waiting on anything the report times).
        k = max(conc, key=lambda i: _frac(rows[i]["wait_s"], rows[i]))
        row = rows[k]
        if row["kind"] != "prefetch" and _frac(row["wait_s"], row) >= _SATURATED:
            return k, row["stage"], (
                f"the thread reading it waited {_frac(row['wait_s'], row):.0%} of the time for its results while "
                f"its workers were busy only {row['busy_fraction']:.0%} of the time and the process got "
                f"{cpu_cores:.1f} of {cpus} CPUs. CPU-starved: other processes used {machine_cores - cpu_cores:.1f} of "
                f"{cpus} CPUs, leaving none idle, so its threads waited for a CPU; profile again on a quieter machine "
                "to see what limits the stage itself"
            )
    top = max((rows[i] for i in conc), key=lambda r: r["busy_fraction"])
    return None, "serial stages", (
        f"no concurrent stage was saturated (busiest: {top['stage']} at {top['busy_fraction']:.0%}): the serial "
        "stages between them limit the rate"
    )


def _diagnose(
    rows: list[dict[str, Any]], cpu_cores: float = 0.0, cpus: int = 1, machine_cores: float | None = None
) -> tuple[str, str]:
    """``(label, reason)`` of :func:`_bottleneck`."""
    _, label, reason = _bottleneck(rows, cpu_cores, cpus, machine_cores)
    return label, reason

#: the share of a run the main process must spend waiting for DataLoader worker processes for the
#: bottleneck to be looked for inside them
_WAITING_ON_WORKERS = 0.5


def _inside_workers(inside: list[tuple[int, str, Any]], seconds: float,
                    per_worker: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """Rows for the stages inside DataLoader worker processes (``WorkerProcesses.worker_stats``):
    ``(shown, analysed)``. ``shown``: one row per stage totalled across the workers (counts and
    seconds summed, shares and fractions the workers' mean; labelled ``stage [N workers]``), then,
    with ``per_worker``, one row per worker and stage (``[worker k] stage``). ``analysed``: the
    workers' mean row per stage, what the bottleneck rules read (each worker runs the whole
    pipe on its own share)."""
    by_worker: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for worker, label, stats in inside:
        row = stats.as_dict()
        row["stage"] = label = redact(label)  # a label that shows a URL, without its secrets
        by_worker.setdefault(worker, []).append((label, row))
    if not by_worker:
        return None
    n = len(by_worker)
    depth = min(len(rows) for rows in by_worker.values())
    for rows in by_worker.values():
        for k, (_, d) in enumerate(rows):
            waited = 0.0 if d["kind"] in ("serial", "inline") else d["wait_s"]
            d["self_share"] = max(d["self_s"] - waited, 0.0) / seconds
            d["wait_share"] = waited / seconds
            d["source"] = k == 0
    shown: list[dict[str, Any]] = []
    analysed: list[dict[str, Any]] = []
    summed = ("items_in", "items_out", "failures", "busy_s", "self_s", "source_s", "wait_s", "tokens")
    averaged = ("seconds", "busy_fraction", "queue_fill", "self_share", "wait_share")
    for k in range(depth):
        ds = [rows[k][1] for rows in by_worker.values()]
        label = by_worker[min(by_worker)][k][0]
        mean = dict(ds[0], worker=None)
        for key in summed + averaged:
            mean[key] = sum(d[key] for d in ds) / n
        mean["shares"] = _summed_shares([d.get("shares") for d in ds])
        mean["items_per_s"] = mean["items_out"] / mean["seconds"] if mean["seconds"] else 0.0
        mean["tokens_per_s"] = mean["tokens"] / mean["seconds"] if mean["seconds"] else 0.0
        analysed.append(mean)
        total = dict(mean, stage=f"{label} [{n} workers]", worker="all")
        for key in summed:
            total[key] = sum(d[key] for d in ds)
        total["items_per_s"] = total["items_out"] / seconds
        total["tokens_per_s"] = total["tokens"] / seconds
        shown.append(total)
    if per_worker:
        for worker, rows in sorted(by_worker.items()):
            shown.extend(dict(d, stage=f"[worker {worker}] {label}", worker=worker) for label, d in rows[:depth])
    return shown, analysed


def _summed_shares(each: list[dict[str, dict[str, float]] | None]) -> dict[str, dict[str, float]] | None:
    """The shares of a mixing stage over the workers that each ran one: items (and tokens) drawn
    summed, shares and targets their mean."""
    found = [s for s in each if s]
    if not found:
        return None
    out: dict[str, dict[str, float]] = {}
    for name, first in found[0].items():
        mine = [s[name] for s in found if name in s]
        out[name] = {key: sum(v[key] for v in mine) / (1 if key in ("drawn", "tokens") else len(mine))
                     for key in first}
    return out


def profile(pipe: Any, num_items: int | None = 1000, *, show: bool = True, file: IO[str] | None = None,
            trace: bool | str | os.PathLike[str] = False, max_trace_events: int = 100_000,
            per_worker: bool = False) -> ProfileReport:
    """Run ``pipe`` for ``num_items`` items (``None``: to the end), measure every stage and name the
    bottleneck (the rules are in :mod:`datapipes.profiling`).

    The pass is observed (:mod:`datapipes.hooks`): each serial stage's items are counted and timed,
    about a microsecond per item and stage, so a pipe of very cheap stages runs slower here than
    unobserved.

    Args:
        pipe: the pipe to run (one pass; the iterator is closed at the end).
        num_items: how many items to take.
        show: print the table (to ``file``, default ``sys.stdout``).
        file: where to print.
        trace: record a Chrome trace of the run (a :class:`TraceRecorder`): a path writes it there
            as JSON, ``True`` keeps it in the report (:meth:`ProfileReport.save_trace` writes it).
        max_trace_events: the most task spans and counter samples the trace keeps.
        per_worker: with DataLoader worker processes (``profile(loader.pipe)``), also list every
            stage inside them once per worker (``[worker k] stage``), after the rows totalled
            across the workers (``stage [N workers]``), which are always there.

    Returns:
        A :class:`ProfileReport` with the same figures as data.

    Raises:
        ValueError: ``num_items`` or ``max_trace_events`` is not an int >= 1 (>= 0), or ``trace`` is
            neither a bool nor a path.

    >>> from datapipes.iter import IterableWrapper
    >>> report = profile(IterableWrapper(range(50)).map(abs).map(str, concurrency=2), num_items=None, show=False)
    >>> [(row["stage"], row["kind"], row["items_out"]) for row in report.stages]
    [('IterableWrapper', 'serial', 50), ('Mapper(abs)', 'serial', 50), ('Mapper(str)', 'thread', 50)]
    """
    if num_items is not None and (isinstance(num_items, bool) or not isinstance(num_items, int) or num_items < 1):
        raise ValueError(f"profile: num_items must be an int >= 1 or None, got {num_items!r}")
    if not isinstance(trace, (bool, str, os.PathLike)):
        raise ValueError(f"profile: trace must be True, False or a file path, got {trace!r}")
    if isinstance(max_trace_events, bool) or not isinstance(max_trace_events, int) or max_trace_events < 0:
        raise ValueError(f"profile: max_trace_events must be an int >= 0, got {max_trace_events!r}")
    recorder = TraceRecorder(max_events=max_trace_events) if trace is not False else None
    graph = _stages(pipe)
    m0 = _read_proc_stat()
    t0 = time.perf_counter()
    c0 = time.process_time()
    n = 0
    with _pass.observing(() if recorder is None else (recorder,)):
        it = iter(pipe)
    try:
        if num_items is None:
            for _ in it:
                n += 1
        else:
            for _ in it:
                n += 1
                if n >= num_items:
                    break
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    seconds = max(time.perf_counter() - t0, 1e-9)
    cpu_cores = (time.process_time() - c0) / seconds
    machine_cores = _machine_cores(m0, _read_proc_stat())
    # the CPUs as the pass read them when it started (the figure its auto stages were tuned with)
    cpus = it.pass_.budget().cpus if isinstance(it, _pass.PassIterator) else usable_cpus()
    measured = it.stats() if isinstance(it, _pass.PassIterator) else []
    order = {id(stage): k for k, stage in enumerate(graph)}
    measured.sort(key=lambda pair: order.get(id(pair[0]), len(order)))
    rows = []
    for stage, stats in measured:
        row = stats.as_dict()
        row["stage"] = redact(row["stage"])  # a label that shows a URL, without its secrets
        waited = 0.0 if stats.kind in ("serial", "inline") else row["wait_s"]
        row["self_share"] = max(row["self_s"] - waited, 0.0) / seconds
        row["wait_share"] = waited / seconds
        row["source"] = not sources_of(stage)
        row["worker"] = None
        rows.append(row)
    index, bottleneck, reason = _bottleneck(rows, cpu_cores, cpus, machine_cores)
    objects = [stage for stage, _ in measured]
    for at in range(len(objects) - 1, -1, -1):  # the stages inside DataLoader worker processes
        inside = getattr(objects[at], "worker_stats", None)
        entries = [] if inside is None else inside()
        found = _inside_workers(entries, seconds, per_worker)
        if not found:
            continue
        shown, analysed = found
        host = rows[at]
        host["wait_share"], host["self_share"] = host["self_share"], 0.0  # its time is waiting for the workers
        rows[at:at] = shown
        objects[at:at] = [None] * len(shown)
        if index is not None and index >= at:
            index += len(shown)
        if host["wait_share"] >= _WAITING_ON_WORKERS:
            k, label, why = _bottleneck(analysed)
            workers = len({w for w, _, _ in entries})
            index, bottleneck = (None if k is None else at + k), label
            reason = (f"inside the {workers} DataLoader worker processes (the main process spent "
                      f"{host['wait_share']:.0%} of the time waiting for their batches): {why}")
    report = ProfileReport(n, seconds, n / seconds, rows, bottleneck, reason, cpu_cores, cpus, machine_cores,
                           index, pipe=pipe, stage_objects=objects)
    if recorder is not None:
        report.trace = recorder.trace([stats for _, stats in measured], title=f"datapipes.profile: {chain_repr(pipe)}")
        if not isinstance(trace, bool):
            report.save_trace(trace)
    if show:
        print(report.table(), file=file if file is not None else sys.stdout)
    return report
