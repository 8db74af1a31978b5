"""What an *observed* pass adds: hooks, statistics for serial stages, and the periodic reporter.

A pass is observed when a hook (:mod:`datapipes.hooks`) is attached to a stage of its graph, or when
it starts inside :func:`observing` (``profile`` does that). Then, when the pass is built, every
stage's iterator is wrapped by an :class:`Observed` iterator that

- fires the ``stage_start``/``stage_stop`` hooks of the stage;
- keeps the stage's :class:`~datapipes._engine.StageStats` (a serial stage gets one of kind
  ``"serial"``): items out, failures, and the time spent in the stage itself. Self time is the time
  inside the stage's ``next()`` less the time inside the ``next()`` of the observed stages it pulled on
  the same thread (a thread-local account of the callees' time, as a profiler keeps), so a stage is
  charged for its own work and for waiting on its workers, never for its upstream's work;

and a reporter thread calls the ``periodic`` hooks at their intervals. An unobserved pass creates
none of this: its serial stages run bare, and only its concurrent stages keep statistics (those they
keep anyway).

Concurrent stages call their task hooks through :func:`task_hooks` (the engine wraps ``fn``).
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Callable, Iterator

from .._engine.stats import StageStats
from ..graph import stage_label, walk
from ..hooks import logger, overrides

__all__ = ["Observed", "Observer", "Reporter", "TaskHooks", "observing", "pending_observation"]

_local = threading.local()
_tl = threading.local()  # per thread: seconds spent in observed callees of the running next()


class observing:  # noqa: N801 - used as a context manager, like contextlib's
    """``with observing(hooks): it = iter(pipe)``: the next pass started on this thread inside the
    block is observed, with ``hooks`` (a sequence of :class:`~datapipes.hooks.Hook`, may be empty)
    watching every stage of it, besides the hooks attached to its stages."""

    __slots__ = ("hooks", "saved")

    def __init__(self, hooks: Any = ()) -> None:
        self.hooks = tuple(hooks)

    def __enter__(self) -> observing:
        self.saved = getattr(_local, "hooks", None)
        _local.hooks = self.hooks
        return self

    def __exit__(self, *exc: Any) -> None:
        _local.hooks = self.saved


def pending_observation() -> tuple[Any, ...] | None:
    """The hooks of the :func:`observing` block this thread is in (taken by the next pass), or None."""
    hooks = getattr(_local, "hooks", None)
    if hooks is not None:
        _local.hooks = None
    return hooks  # type: ignore[no-any-return]


class TaskHooks:
    """The task hooks watching one concurrent stage: ``starts`` and ``ends`` (bound methods)."""

    __slots__ = ("starts", "ends")

    def __init__(self, hooks: list[Any]) -> None:
        self.starts = [h.task_start for h in hooks if overrides(h, "task_start")]
        self.ends = [h.task_end for h in hooks if overrides(h, "task_end")]

    def __bool__(self) -> bool:
        return bool(self.starts or self.ends)


class Observed:
    """The iterator of one stage in an observed pass: the stage's own iterator, with its hooks fired
    and its statistics kept (see the module)."""

    __slots__ = ("it", "stats", "hooks", "counts", "state", "observer", "order", "__weakref__")

    def __init__(self, it: Iterator[Any], stats: StageStats, hooks: list[Any], counts: bool,
                 observer: Observer) -> None:
        self.it = it
        self.stats = stats
        self.hooks = hooks
        self.counts = counts  # a serial stage: this wrapper counts its items
        self.state = 0  # 0: not started, 1: running, 2: ended
        self.observer = observer
        self.order = 0  # the stage's place in graph order (ended downstream first)

    def __iter__(self) -> Observed:
        return self

    def __next__(self) -> Any:
        if self.state == 0:
            self._start()
        stats = self.stats
        tl = _tl
        outer = getattr(tl, "child", 0.0)
        tl.child = 0.0
        t = time.perf_counter()
        try:
            x = next(self.it)
        except BaseException as e:
            dt = time.perf_counter() - t
            stats.self_s += dt - tl.child
            tl.child = outer + dt
            if self.counts and not isinstance(e, (StopIteration, GeneratorExit)):
                stats._fail += 1
            self.stop()
            raise
        dt = time.perf_counter() - t
        stats.self_s += dt - tl.child
        tl.child = outer + dt
        if self.counts:
            stats._out += 1
        return x

    def _start(self) -> None:
        self.state = 1
        stats = self.stats
        if self.counts:
            stats.begin([])
        self.observer.started(self)
        for hook in self.hooks:
            hook.stage_start(stats)

    def stop(self) -> None:
        """End the stage's observation (idempotent): mark its statistics ended, fire ``stage_stop``."""
        if self.state == 2:
            return
        started, self.state = self.state == 1, 2
        if self.counts:
            self.stats.end()
        if started:
            for hook in self.hooks:
                hook.stage_stop(self.stats)
        self.observer.stopped(self)

    def __del__(self) -> None:
        # Dropped mid-pass (a stage that stops pulling a source drops it rather than closing it):
        # its stage has ended.
        if self.state == 1:
            try:
                self.stop()
            except Exception:  # noqa: BLE001 - nowhere to raise to from a finaliser
                logger.exception("datapipes: a stage_stop hook raised while its stage was collected")

    def close(self) -> None:
        close = getattr(self.it, "close", None)
        try:
            if close is not None:
                close()
        finally:
            self.stop()

    def __length_hint__(self) -> int:
        hint = getattr(self.it, "__length_hint__", None)
        return int(hint()) if hint is not None else 0


class Observer:
    """The observation of one pass: which hooks watch which stage, the wrappers, the reporter."""

    def __init__(self, pass_: Any, graph: list[Any], extra: tuple[Any, ...]) -> None:
        self.pass_ref = weakref.ref(pass_)
        self.watchers: dict[int, list[Any]] = {}  # id(stage) -> hooks watching it
        self.scopes: dict[int, tuple[Any, list[Any]]] = {}  # id(hook) -> (hook, stages it watches)
        in_graph = {id(s) for s in graph}

        def watch(hook: Any, stages: list[Any]) -> None:
            entry = self.scopes.setdefault(id(hook), (hook, []))
            for stage in stages:
                if id(stage) not in in_graph:
                    continue
                hooks = self.watchers.setdefault(id(stage), [])
                if not any(h is hook for h in hooks):
                    hooks.append(hook)
                    entry[1].append(stage)

        for hook in extra:
            watch(hook, graph)
        for stage in graph:
            for hook, only in stage._hooks:
                watch(hook, [stage] if only else list(walk(stage)))
        order = self.order = {id(s): i for i, s in enumerate(graph)}
        for _, stages in self.scopes.values():
            stages.sort(key=lambda s: order[id(s)])
        self.lock = threading.Lock()
        # Weak: the observer outlives its pass in the pass's finaliser, and must not keep the
        # stages' iterators (and through them the pass) alive.
        self.live: weakref.WeakSet[Observed] = weakref.WeakSet()
        self.root: Callable[[], Observed | None] = lambda: None
        self.reporter: Reporter | None = None
        periodic = [(hook, stages) for hook, stages in self.scopes.values()
                    if overrides(hook, "periodic") and getattr(hook, "interval", None)]
        self.periodic = periodic
        self.ended = False

    def wrap(self, stage: Any, it: Iterator[Any], root: bool = False) -> Iterator[Any]:
        """``it`` (``stage``'s iterator in this pass) observed."""
        pass_ = self.pass_ref()
        assert pass_ is not None
        with pass_._lock:
            stats = pass_.stats.get(id(stage))
        counts = stats is None
        if stats is None:
            stats = pass_.stats_for(stage, lambda: StageStats(stage_label(stage), "serial", 1, 0))
        live_shares = getattr(stage, "_live_shares", None)  # a stage mixing sources (Mixer)
        if live_shares is not None:  # held weakly: the statistics outlive their stage in _latest
            method = weakref.WeakMethod(live_shares)
            stats.shares_of = lambda: None if (read := method()) is None else read()
        wrapped = Observed(it, stats, self.watchers.get(id(stage), []), counts, self)
        wrapped.order = self.order.get(id(stage), 0)
        if root:
            self.root = weakref.ref(wrapped)
        return wrapped

    def task_hooks(self, stage: Any) -> TaskHooks | None:
        hooks = TaskHooks(self.watchers.get(id(stage), []))
        return hooks if hooks else None

    def started(self, wrapped: Observed) -> None:
        with self.lock:
            self.live.add(wrapped)
            start = self.reporter is None and bool(self.periodic) and not self.ended
            if start:
                self.reporter = Reporter(self.pass_ref, [(h, h.interval, self._reader(s)) for h, s in self.periodic])
        if start:
            assert self.reporter is not None
            self.reporter.start()

    def _reader(self, stages: list[Any]) -> Callable[[], list[tuple[Any, StageStats]]]:
        ids = [id(s) for s in stages]

        def read() -> list[tuple[Any, StageStats]]:
            pass_ = self.pass_ref()
            if pass_ is None:
                return []
            found = dict((id(s), (s, st)) for s, st in pass_.stage_stats())
            return [found[i] for i in ids if i in found]

        return read

    def stopped(self, wrapped: Observed) -> None:
        if wrapped is self.root():
            self.end()

    def end(self) -> None:
        """The pass ended: stop every stage still observed, a last periodic call, stop the reporter."""
        with self.lock:
            if self.ended:
                return
            self.ended = True
            live = sorted(self.live, key=lambda w: w.order)
            self.live = weakref.WeakSet()
            reporter = self.reporter
        for wrapped in live:
            wrapped.stop()
        if reporter is not None:
            reporter.close()
        if self.pass_ref() is not None:  # not when the pass is being collected: nothing left to read
            for hook, stages in self.periodic:
                hook.periodic(self._reader(stages)())


class Reporter:
    """A thread calling ``fn()`` for each ``(owner, interval, read)`` client at its interval while
    the pass lives: ``owner.periodic(read())`` for hooks. It waits on an event, so :meth:`close`
    wakes and ends it at once; it also ends when the pass is garbage collected."""

    def __init__(self, pass_ref: Any, clients: list[tuple[Any, float, Callable[[], Any]]],
                 done: Callable[[], bool] | None = None) -> None:
        self.pass_ref = pass_ref
        self.clients = clients
        self.done = done
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._main, name="datapipes stats reporter", daemon=True)
        self._finalizer = weakref.finalize(self, self.stop.set)

    def start(self) -> None:
        self.thread.start()

    def _main(self) -> None:
        now = time.monotonic()
        due = [now + interval for _, interval, _ in self.clients]
        stop = self.stop
        while True:
            wait = max(0.0, min(due) - time.monotonic())
            if stop.wait(wait):
                return
            if self.pass_ref() is None or (self.done is not None and self.done()):
                return
            now = time.monotonic()
            for k, (hook, interval, read) in enumerate(self.clients):
                if due[k] <= now:
                    due[k] = now + interval
                    try:
                        hook.periodic(read())
                    except Exception:  # noqa: BLE001 - a reporter thread has no caller to raise to
                        logger.exception("datapipes: %r.periodic raised; it is called again at its next interval", hook)

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(1.0)
