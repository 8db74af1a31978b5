"""The consumer side of a concurrent stage: the loop that pulls the source, feeds workers and yields.

A *backend* runs ``fn`` somewhere (threads, the event loop, an executor the user built); this module
drives it from the consumer's thread. The contract between the two is small, and :class:`Backend`
states it for type checkers:

- ``backend.start()`` starts the workers (called at the first ``next()``), ``backend.close()`` stops
  them (idempotent);
- ``backend.submit((i, x))`` hands item ``x`` at input position ``i`` to the workers;
- ``backend.get()`` blocks until one result record ``(i, ok, value)`` is ready (``ok`` false: ``value``
  is the exception ``fn`` raised, caught as ``BaseException`` in the worker); ``backend.records``,
  where it is not ``None``, is the deque of the records ready now, which the loop takes without
  calling ``get`` (only the consumer's thread takes from it; a backend without one makes the loop
  call ``get``, and time it, for every record);
- ``backend.ready()`` tells how many records are waiting (a statistics sample);
- ``backend.busy`` is the list of per-worker busy-time accumulators;
- ``backend.chunk`` is how many items the backend hands its workers at once (it may change as the
  pass runs): the window counts chunks, so ``window * chunk`` items are kept in flight.

The loops pull the source lazily on the consumer's thread (so upstream generators are never touched
by two threads), keep at most ``window`` items in flight (pulled and not yet handed to the consumer),
and refill one item just before yielding one, so the workers stay busy while the consumer works.
An exception raised by the source is deferred until the items pulled before it are yielded, exactly
as a serial loop would see it.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Protocol

from ..errors import ErrorPolicy, FailureLog, add_stage_note
from .lifecycle import Resumable, abandon
from .stats import StageStats

__all__ = ["Backend", "EngineRun", "failure_handler", "resumed_source", "run_stage"]

_END = object()  # the source is exhausted
_MISSING = object()  # no record stashed for this position yet


class Backend(Protocol):
    """Where a concurrent stage's ``fn`` runs (the module's docstring gives the contract):
    ``ThreadWorkers``, ``InlineWorkers``, ``ExecutorWorkers`` and ``AsyncWorkers``. A process stage
    has a loop of its own (``process.run_process_stage``), which sends chunks rather than items."""

    busy: list[float]

    @property
    def chunk(self) -> int: ...

    def start(self) -> None: ...

    def submit(self, job: tuple[int, Any], /) -> None: ...

    def get(self) -> tuple[int, bool, Any]: ...

    @property
    def records(self) -> deque[tuple[int, bool, Any]] | None: ...

    def ready(self) -> int: ...

    def close(self) -> None: ...


class EngineRun(Resumable):
    """The position of one concurrent pass, readable between two items (checkpoint and resume).

    ``inputs`` maps the position of every item pulled from the source and not yet yielded (running,
    queued or finished out of order) to the item itself; ``pulled`` counts the items pulled. A state
    saves those inputs, not their results: a resumed pass computes them again (ordered: in their
    order; completion order: exactly these, nothing yielded before is yielded again), then goes on
    with the source. Costs one dict store and one delete per item on the consumer's thread.

    A resumed pass pulls the restored inputs before its source, at most a window at a time, so it
    may yield (and be saved) while some still wait in ``pending``: a state then saves them after
    those in flight, as a pass that had pulled them would, and a state taken before the pass starts
    is the state loaded. Either way a second resume is exact, whatever the timing.
    """

    __slots__ = ("inputs", "pulled", "resume", "pending", "window", "budget", "failures")

    def __init__(self) -> None:
        self.inputs: dict[int, Any] = {}
        self.pulled = 0
        self.resume: list[Any] | None = None  # [position, input] pairs to compute first
        self.pending: deque[Any] | None = None  # restored inputs a started pass has not pulled yet
        self.started = False
        self.window = 0  # items kept in flight; the autotuner changes it while the pass runs
        # under a failure budget (max_failures): the pass's failures, whose count a state saves so
        # that a resumed pass gives up where the uninterrupted one would (see attach_budget)
        self.budget: Any = None
        self.failures = 0  # the count loaded, before the budget is attached

    def live(self, count: _FailureCount) -> Callable[[], tuple[int, int, int]]:
        """A reader of ``(items_in, items_out, failures)`` so far, for the pass's statistics."""
        inputs = self.inputs

        def read() -> tuple[int, int, int]:
            pulled, failed = self.pulled, count.n
            return pulled, max(0, pulled - len(inputs) - failed), failed

        return read

    def state(self) -> dict[str, Any]:
        pulled = self.pulled
        if self.resume is not None:  # loaded, not started: what it was given
            inputs = [[k, x] for k, x in self.resume]
        else:
            inputs = [[k, self.inputs[k]] for k in sorted(self.inputs)]
            pending = self.pending
            if pending:  # numbered as this pass will number them when it pulls them
                inputs += [[k, x] for k, x in enumerate(pending, pulled)]
                pulled += len(pending)
        state = {"pulled": pulled, "inputs": inputs}
        if self.budget is not None:
            state["failures"] = self.budget.count
        return state

    def load(self, state: dict[str, Any]) -> None:
        self.pulled = int(state["pulled"])
        self.resume = [tuple(p) for p in state["inputs"]]
        self.failures = int(state.get("failures", 0))
        if self.budget is not None:
            self.budget.count = self.failures

    def attach_budget(self, on_fail: Callable[[BaseException, int], None]) -> None:
        """Keep the failure budget of ``on_fail`` (a :func:`failure_handler`) in this run's state."""
        failures = getattr(on_fail, "failures", None)
        if failures is not None and failures.max_failures is not None:
            failures.count = self.failures
            self.budget = failures


def resumed_source(run: EngineRun, src: Iterator[Any]) -> tuple[Iterator[Any], int]:
    """The source a (possibly resumed) pass pulls, and the position of its first item: the saved
    inputs first, then the source itself. The saved inputs are renumbered to the positions just
    below ``pulled``, so that the source's items keep the positions (and item seeds) they had in
    the saved pass. A pass that is not resumed pulls ``src`` itself: nothing is added per item."""
    run.started = True
    resume, run.resume = run.resume, None
    if not resume:
        return src, run.pulled
    end = max(run.pulled, resume[-1][0] + 1)
    run.pending = pending = deque(x for _, x in resume)
    return itertools.chain(_restored(run, pending, end), src), end - len(pending)


def _restored(run: EngineRun, pending: deque[Any], end: int) -> Iterator[Any]:
    """The restored inputs, each taken off ``pending`` only as the pass pulls it (a state taken
    meanwhile saves the rest, see :meth:`EngineRun.state`); then ``run.pulled`` is ``end``, the
    position of the source's first item, for whatever reads it as the source starts (item seeds)."""
    popleft = pending.popleft
    while pending:
        yield popleft()
    run.pending = None
    run.pulled = end


class _FailureCount:
    """Failures seen by one pass (for the statistics); the handler increments it. Under
    ``on_error="skip"`` it holds the pass's :class:`~datapipes.errors.PassFailures`, which the
    loop ends when the pass ends (:meth:`end`: the summary of what the pass skipped)."""

    __slots__ = ("n", "failures")

    def __init__(self) -> None:
        self.n = 0
        self.failures: Any = None

    def end(self, seen: int) -> None:
        """The pass ended, having handed out ``seen`` items (yielded or failed)."""
        if self.failures is not None:
            self.failures.end(seen)


def failure_handler(label: str, policy: ErrorPolicy, log: FailureLog) -> tuple[Callable[[BaseException, int], None], _FailureCount]:
    """The function a pass calls on a failed item: raise it (with a note) or skip it (counted).

    Chosen once per pass. ``KeyboardInterrupt`` and other non-``Exception`` errors always propagate.
    Runs on the consumer's thread only (the :class:`~datapipes.errors.PassFailures` it uses is not
    shared with workers).
    """
    count = _FailureCount()
    if policy.skips:
        failures = policy.new_pass(label, log)

        def on_fail(exc: BaseException, position: int) -> None:
            count.n += 1
            if not isinstance(exc, Exception):
                raise exc
            failures.skip(exc, position)

        on_fail.failures = failures  # type: ignore[attr-defined]  # the budget a run's state keeps (EngineRun.attach_budget)
        count.failures = failures

    else:

        def on_fail(exc: BaseException, position: int) -> None:
            count.n += 1
            if isinstance(exc, Exception):
                add_stage_note(exc, label, position)
            raise exc

    return on_fail, count


def run_stage(
    backend: Backend,
    source: Iterable[Any],
    window: int,
    on_fail: Callable[[BaseException, int], None],
    count: _FailureCount,
    stats: StageStats,
    run: EngineRun | None = None,
    ordered: bool = True,
) -> Iterator[Any]:
    """Yield ``fn(x)`` for each source item, ``window`` chunks of ``backend.chunk`` items in flight
    at most: in source order (``ordered``: a result that comes early waits in a stash for its turn),
    or in completion order (no head-of-line blocking: a slow item delays only itself).

    Bound: when the consumer holds its ``k``-th result, at most ``k + 1 + window * chunk`` items
    have been pulled from the source (``window`` chunks pulled ahead of the consumer; ``chunk`` is
    1 where the backend takes items one by one, and at most
    :data:`~datapipes._engine.threads.MAX_CHUNK` for a thread stage sizing its own).
    """
    n_in = n_out = 0
    clock = time.perf_counter
    src: Any = None
    stash: dict[int, Any] = {}
    run = run if run is not None else EngineRun()
    inputs = run.inputs
    try:
        src, first = resumed_source(run, iter(source))
        n_in = n_out = first
        run.pulled = first
        if not run.window:
            run.window = window
        backend.start()
        stats.begin(backend.busy, run.live(count))
        submit, get, ready, records = backend.submit, backend.get, backend.ready, backend.records
        pulled = getattr(backend, "pulled", None)  # a backend sizing its chunks from the source's pace
        deferred: BaseException | None = None
        more = True
        while n_in - first < run.window:
            t = clock()
            try:
                x = next(src, _END)
            except Exception as e:
                deferred, x = e, _END
            t = clock() - t
            stats.source_s += t
            if pulled is not None:
                pulled(t, 1)
            if x is _END:
                more = False
                break
            inputs[n_in] = x
            submit((n_in, x))
            n_in += 1
            run.pulled = n_in
        rec: Any = None
        while n_out < n_in:
            rec = stash.pop(n_out, None) if stash else None  # the stash stays empty in completion order
            if rec is None:
                while records:  # the records ready: no wait to time
                    rec = records.popleft()
                    if not ordered or rec[0] == n_out:
                        break
                    stash[rec[0]] = rec
                    rec = None
                if rec is None:
                    t = clock()
                    rec = get()
                    while ordered and rec[0] != n_out:
                        stash[rec[0]] = rec
                        rec = get()
                    stats.wait_s += clock() - t
            if more:
                chunk = backend.chunk
                ahead = run.window * chunk
                if n_in - n_out + chunk <= ahead + 1:
                    # room for one more item per item taken (one by one), or a chunk's worth at once
                    stats.fill_sum += len(stash) + ready()
                    stats.fill_samples += 1
                    t, before = clock(), n_in
                    while n_in - n_out <= ahead:  # more after the window grew
                        try:
                            x = next(src, _END)
                        except Exception as e:
                            deferred, x = e, _END
                        if x is _END:
                            more = False
                            break
                        inputs[n_in] = x
                        submit((n_in, x))
                        n_in += 1
                    t = clock() - t
                    stats.source_s += t
                    run.pulled = n_in
                    if pulled is not None:
                        pulled(t, n_in - before)
            n_out += 1
            del inputs[rec[0]]
            if rec[1]:
                yield rec[2]
            else:
                on_fail(rec[2], rec[0])
            rec = None
        if deferred is not None:
            raise deferred
    except BaseException:
        abandon(src)
        raise
    finally:
        backend.close()
        stash.clear()
        stats.finish(n_in, n_out - count.n, count.n, stats.fill_sum, stats.fill_samples, stats.source_s, stats.wait_s)
        count.end(n_out)
