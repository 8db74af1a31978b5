"""Chrome trace events of a pass (:class:`TraceRecorder`), for :mod:`datapipes.profiling`'s
``profile(..., trace=...)`` and for any pass a recorder is attached to: what each stage did over
time, to open in Perfetto (https://ui.perfetto.dev) or ``chrome://tracing``."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Iterable

from ._engine.stats import StageStats
from ._redact import redact
from .hooks import Hook

__all__ = ["TraceRecorder"]


def _write_json(obj: dict[str, Any], path: str | os.PathLike[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, separators=(",", ":"))


_LANED = ("async", "process")  # stages whose tasks overlap on one thread (event loop; submit/result)
_SYNTHETIC = 1 << 32  # track ids of stage tracks and task lanes: above any thread id
_MIN_LANES = 8  # task lanes per stage and thread: at least this many, and twice the stage's workers


class TraceRecorder(Hook):
    """A hook that records what the stages of a pass do over time, as Chrome trace events: the
    format Perfetto (https://ui.perfetto.dev) and ``chrome://tracing`` open.

    Recorded, with ``time.perf_counter_ns`` (the trace's time 0 is when the recorder was made):

    - one span per stage and pass, from its first ``next()`` to its end, on a track of its own
      (``stage Mapper(f)``), with its final counts;
    - one span per task of a concurrent stage (``fn`` on one item), on the track of the thread that
      ran it (a worker thread). Tasks that overlap on one thread (an ``async`` stage's on the event
      loop; a ``process`` stage's items between handing them to the pool and taking their results
      back, on the thread reading the stage) go on lanes of their own (``Mapper(f) tasks on <thread>
      (2)``), at most twice the stage's workers or 8 per stage and thread: overlapping tasks beyond
      those are left out (counted in :attr:`dropped`). Serial stages run no tasks: they show their
      stage span and their counters, not a span per item;
    - every ``interval`` seconds and when the pass ends, counters per stage: ``items/s`` since the
      previous sample; for a concurrent stage also ``queue fill`` (the share of its output buffer
      holding ready results, averaged since the previous sample, where the stage publishes it while
      it runs), ``tasks running`` (tasks started and not ended) and ``workers`` (when it changes, as
      ``concurrency="auto"`` makes it).

    Size: at most ``max_events`` task spans and counter samples are kept (about 100 bytes each in
    the file), the first ones; later ones are counted in :attr:`dropped` and left out. Stage spans
    are always kept. Cost: a task span costs a microsecond or a few on the thread that runs the task
    (the recorder takes one lock per task start and end).

    Attach it to a pipe (``pipe.add_hook(recorder)``) or give it to ``profile(pipe, trace=...)``,
    which does; every pass it watches adds to the same recording (:meth:`events` picks some stages').

    Args:
        interval: seconds between two counter samples (``None``: only when the pass ends).
        max_events: how many task spans and counter samples to keep (``>= 0``).

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> recorder = TraceRecorder()
        >>> pipe = IterableWrapper(range(8)).map(abs, concurrency=2).add_hook(recorder)
        >>> sum(pipe)
        28
        >>> trace = recorder.trace()  # recorder.save(path) writes it as JSON
        >>> sorted({e["name"] for e in trace["traceEvents"] if e["ph"] == "X"})
        ['IterableWrapper', 'Mapper(abs)']
    """

    def __init__(self, interval: float | None = 0.05, max_events: int = 100_000) -> None:
        if interval is not None and (isinstance(interval, bool) or not isinstance(interval, (int, float))):
            raise TypeError(f"TraceRecorder: interval must be a number of seconds or None, got {type(interval).__name__}")
        if interval is not None and not interval > 0:
            raise ValueError(f"TraceRecorder: interval must be > 0 (or None), got {interval!r}")
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 0:
            raise ValueError(f"TraceRecorder: max_events must be an int >= 0, got {max_events!r}")
        self.interval = None if interval is None else float(interval)
        self.max_events = max_events
        #: task spans and counter samples left out because ``max_events`` were kept already
        self.dropped = 0
        self._t0 = time.perf_counter_ns()
        self._lock = threading.Lock()
        self._kept = 0
        self._stats: dict[int, StageStats] = {}  # id -> the statistics seen (kept alive: their ids stay theirs)
        self._passes: dict[int, list[int | None]] = {}  # id(stats) -> [start ns, stop ns or None]
        self._spans: list[tuple[StageStats, int, int, int, int, bool]] = []  # stats, tid, start, end, position, ok
        self._counters: list[tuple[StageStats, int, int, str, float]] = []  # stats, tid, ns, series, value
        # (id(stats), position) -> start, track (None: left out), what frees the track at the end, stats
        self._open: dict[tuple[int, int], tuple[int, int | None, Any, StageStats]] = {}
        self._threads: dict[int, str] = {}  # native thread id -> name
        self._real_busy: set[int] = set()  # native ids of threads whose own track holds an open task span
        self._lanes: dict[tuple[int, int], list[bool]] = {}  # (thread, id(stats)) -> lanes (busy or free)
        self._tracks: dict[tuple[Any, ...], int] = {}  # synthetic track key -> track id
        self._samples: dict[int, tuple[int, int, int, int, int]] = {}  # id(stats) -> ns, out, fill sum, n, workers

    # -- hooks (any thread) ----------------------------------------------------------------------------
    def stage_start(self, stats: StageStats) -> None:
        now = time.perf_counter_ns()
        with self._lock:
            self._stats[id(stats)] = stats
            self._passes[id(stats)] = [now, None]

    def stage_stop(self, stats: StageStats) -> None:
        now = time.perf_counter_ns()
        with self._lock:
            span = self._passes.get(id(stats))
            if span is not None and span[1] is None:
                span[1] = now

    def task_start(self, stats: StageStats, position: int) -> None:
        now = time.perf_counter_ns()
        thread = threading.get_native_id()
        key = (id(stats), position)
        with self._lock:
            if self._kept >= self.max_events:
                self._open[key] = (now, None, None, stats)  # left out: counted when it ends
                return
            if thread not in self._threads:
                self._threads[thread] = threading.current_thread().name
            if stats.kind not in _LANED and thread not in self._real_busy:
                self._real_busy.add(thread)
                self._open[key] = (now, thread, thread, stats)
                return
            lanes = self._lanes.setdefault((thread, id(stats)), [])
            lane = next((k for k, busy in enumerate(lanes) if not busy), len(lanes))
            if lane == len(lanes):
                if lane >= max(2 * stats.workers, _MIN_LANES):
                    self._open[key] = (now, None, None, stats)  # more in flight than lanes: left out
                    return
                lanes.append(True)
            else:
                lanes[lane] = True
            tid = self._track(("lane", thread, id(stats), lane))
            self._open[key] = (now, tid, (thread, id(stats), lane), stats)

    def task_end(self, stats: StageStats, position: int, ok: bool) -> None:
        now = time.perf_counter_ns()
        with self._lock:
            opened = self._open.pop((id(stats), position), None)
            if opened is None:
                return  # started before the recorder was attached
            start, tid, frees, _ = opened
            if frees.__class__ is tuple:
                self._lanes[frees[:2]][frees[2]] = False
            elif frees is not None:
                self._real_busy.discard(frees)
            if tid is None or self._kept >= self.max_events:
                self.dropped += 1
                return
            self._kept += 1
            self._spans.append((stats, tid, start, now, position, ok))

    def periodic(self, stats: list[tuple[Any, StageStats]]) -> None:
        now = time.perf_counter_ns()
        thread = threading.get_native_id()
        with self._lock:
            if thread not in self._threads:
                self._threads[thread] = threading.current_thread().name
            running: dict[int, int] = {}  # id(stats) -> tasks started and not ended
            for k, _ in self._open:
                running[k] = running.get(k, 0) + 1
            for _, s in stats:
                if s.started is None:
                    continue
                self._stats[id(s)] = s
                out, fill_sum, fill_n, workers = s.items_out, s.fill_sum, s.fill_samples, s.workers
                prev = self._samples.get(id(s))
                if prev is None:
                    prev = (int(s.started * 1e9), 0, 0, 0, -1)
                self._samples[id(s)] = (now, out, fill_sum, fill_n, workers)
                series = [("items/s", (out - prev[1]) / max(now - prev[0], 1) * 1e9)]
                if s.kind not in ("serial", "inline"):
                    if s.capacity and fill_n > prev[3]:
                        series.append(("queue fill", (fill_sum - prev[2]) / (fill_n - prev[3]) / s.capacity))
                    if workers != prev[4]:
                        series.append(("workers", float(workers)))
                    if s.kind != "prefetch":
                        series.append(("tasks running", float(running.get(id(s), 0))))
                for name, value in series:
                    if self._kept >= self.max_events:
                        self.dropped += 1
                        continue
                    self._kept += 1
                    self._counters.append((s, thread, now, name, value))

    # -- the trace -------------------------------------------------------------------------------------
    def _track(self, key: tuple[Any, ...]) -> int:
        tid = self._tracks.get(key)
        if tid is None:
            tid = self._tracks[key] = _SYNTHETIC + len(self._tracks)
        return tid

    def events(self, stats: Iterable[StageStats] | None = None) -> list[dict[str, Any]]:
        """The recorded trace events (metadata first, then in time order), for the stages whose
        statistics are in ``stats`` (default: every stage seen)."""
        with self._lock:
            known = dict(self._stats)
            passes = {k: list(v) for k, v in self._passes.items()}
            spans = list(self._spans)
            counters = list(self._counters)
            threads = dict(self._threads)
            for k in passes:
                self._track(("stage", k))
            tracks = dict(self._tracks)
        for span in spans:  # a stage whose tasks were seen before its start (attached mid-pass)
            known.setdefault(id(span[0]), span[0])
        wanted = list(known.values()) if stats is None else list(stats)
        keep = {id(s) for s in wanted}
        names = _unique_labels(wanted)
        pid = os.getpid()

        def us(ns: int) -> float:
            return round((ns - self._t0) / 1000, 3)

        meta: list[dict[str, Any]] = []
        body: list[dict[str, Any]] = []
        used: set[int] = set()
        order = {id(s): k for k, s in enumerate(wanted)}
        for key, (start, stop) in passes.items():
            if key not in keep or start is None:
                continue
            s = known[key]
            tid = tracks[("stage", key)]
            end = stop if stop is not None else time.perf_counter_ns()
            body.append({"name": names[key], "cat": "stage", "ph": "X", "pid": pid, "tid": tid, "ts": us(start),
                         "dur": round((end - start) / 1000, 3),
                         "args": {"kind": s.kind, "items_in": s.items_in, "items_out": s.items_out,
                                  "failures": s.failures}})
            meta.extend(_thread_meta(pid, tid, f"stage {names[key]}", order[key]))
        for s, tid, start, end, position, ok in spans:
            if id(s) not in keep:
                continue
            used.add(tid)
            args: dict[str, Any] = {"item": position} if ok else {"item": position, "failed": True}
            body.append({"name": names[id(s)], "cat": "task", "ph": "X", "pid": pid, "tid": tid, "ts": us(start),
                         "dur": round((end - start) / 1000, 3), "args": args})
        for s, tid, ns, series, value in counters:
            if id(s) not in keep:
                continue
            used.add(tid)
            body.append({"name": f"{names[id(s)]} {series}", "cat": "counter", "ph": "C", "pid": pid, "tid": tid,
                         "ts": us(ns), "args": {series: round(value, 3)}})
        lanes = {tid: key for key, tid in tracks.items() if key[0] == "lane"}
        for tid in sorted(used):
            if tid in lanes:
                _, thread, key, lane = lanes[tid]
                name = f"{names[key]} tasks on {threads.get(thread, thread)} ({lane + 1})"
                meta.extend(_thread_meta(pid, tid, name, 10_000 + len(wanted) + tid - _SYNTHETIC))
            else:
                meta.extend(_thread_meta(pid, tid, threads.get(tid, str(tid)), 1_000 + len(wanted)))
        body.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        meta.sort(key=lambda e: (e["tid"], e["name"]))
        return meta + body

    def trace(self, stats: Iterable[StageStats] | None = None, title: str = "datapipes") -> dict[str, Any]:
        """The Chrome trace-event JSON object: ``{"traceEvents": [...], "displayTimeUnit": "ms",
        "otherData": {...}}`` (times in microseconds), for the stages whose statistics are in
        ``stats`` (default: every stage seen); ``title`` names the process in the viewer."""
        events = self.events(stats)
        pid = os.getpid()
        head = {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "ts": 0, "args": {"name": redact(title)}}
        return {
            "traceEvents": [head, *events],
            "displayTimeUnit": "ms",
            "otherData": {"source": "datapipes TraceRecorder", "max_events": self.max_events,
                          "dropped_events": self.dropped},
        }

    def save(self, path: str | os.PathLike[str], stats: Iterable[StageStats] | None = None,
             title: str = "datapipes") -> None:
        """Write :meth:`trace` to ``path`` as JSON."""
        _write_json(self.trace(stats, title), path)


def _thread_meta(pid: int, tid: int, name: str, sort_index: int) -> list[dict[str, Any]]:
    """The metadata events naming track ``tid`` and placing it (lower ``sort_index`` first)."""
    return [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "ts": 0, "args": {"name": name}},
            {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "ts": 0,
             "args": {"sort_index": sort_index}}]


def _unique_labels(stats: list[StageStats]) -> dict[int, str]:
    """``id(stats) -> label``, a label shared by several stages numbered (``Mapper(f) #2``); a label
    that shows a URL shows it without its secrets (datapipes._redact)."""
    seen: dict[str, int] = {}
    names = {}
    for s in stats:
        label = redact(s.label)
        n = seen[label] = seen.get(label, 0) + 1
        names[id(s)] = label if n == 1 else f"{label} #{n}"
    return names
