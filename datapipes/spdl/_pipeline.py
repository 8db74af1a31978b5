"""SPDL's :class:`Pipeline` and :class:`PipelineFailure`, running one pass of an ordinary pipe.

A :class:`Pipeline` is what :meth:`PipelineBuilder.build` returns: it holds the built pipe
(``pipeline.pipe``) and runs one pass of it (a new pass per epoch for a continuous source). Reads
with a ``timeout`` go through a reader thread the pipeline owns, so a read that times out leaves the
pass running and the next read takes the item it was waiting for; reads without one pull the pass
on the caller's thread.
"""

from __future__ import annotations

import queue
import re
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Generic, Iterator, Sequence, TypeVar

from .._engine import close_iterator
from ..datapipe import IterDataPipe

__all__ = ["Pipeline", "PipelineFailure"]

T = TypeVar("T")

_EOF_MSG = "Reached the end of the pipeline."
#: how long :meth:`Pipeline.stop` waits, without a timeout, for a reader stuck in a stalled pass
_STOP_GRACE_S = 3.0

_ITEM, _END, _ERR = 0, 1, 2
_TIMED_OUT = object()  # what _Pass.next returns when no item came in time
_NOT_STARTED, _STARTED, _STOPPED = 0, 1, 2

#: the message of the ExceptionGroup a stage raises when its ``max_failures`` budget is exceeded
#: (:class:`datapipes.errors.PassFailures`)
_BUDGET = re.compile(r"^stage (?P<stage>.*): (?P<count>\d+) failures, more than max_failures=(?P<limit>\d+)$")


class PipelineFailure(ExceptionGroup[Exception]):
    """The error a :class:`Pipeline` (and :class:`~datapipes.spdl.DataLoader`) raises when its pass
    fails, as SPDL's ``spdl.pipeline.PipelineFailure``: an :class:`ExceptionGroup`, so
    ``except PipelineFailure``, ``except*`` and ``.exceptions`` work as they do with SPDL.

    It holds what ended the pass: the exception a source or an aggregator raised (the same object,
    with the note naming the stage), or, when a stage failed more than its ``max_failures``, a
    ``RuntimeError("The pipeline stage (...) failed N times, which exceeds the threshold (k).")``
    whose ``__cause__`` is the group of that stage's failures. Failures within the budget are
    logged and the items dropped, as SPDL does; they never raise.

    Args:
        message: the group's message (SPDL's is ``"pipeline stages failed"``).
        exceptions: the failures.

    Example:
        >>> from datapipes.spdl import PipelineBuilder, PipelineFailure
        >>> def source():
        ...     yield 1
        ...     raise KeyError("lost")
        >>> pipeline = PipelineBuilder().add_source(source()).add_sink(3).build(num_threads=1)
        >>> got = []
        >>> try:
        ...     for item in pipeline:
        ...         got.append(item)
        ... except PipelineFailure as e:
        ...     print(got, repr(e.exceptions[0]))
        [1] KeyError('lost')
    """

    def derive(self, excs: Sequence[Exception]) -> PipelineFailure:  # type: ignore[override]
        return PipelineFailure(self.message, excs)


def _failure(exc: Exception) -> PipelineFailure:
    """The :class:`PipelineFailure` SPDL raises for ``exc``, the exception that ended a pass."""
    match = _BUDGET.match(exc.message) if type(exc) is ExceptionGroup else None
    if match is None:
        return PipelineFailure("pipeline stages failed", [exc])
    over = RuntimeError(
        f"The pipeline stage ({match['stage']}) failed {match['count']} times, which exceeds the threshold "
        f"({match['limit']})."
    )
    over.__cause__ = exc
    return PipelineFailure("pipeline stages failed", [over])


def _read(it: Iterator[Any], requests: queue.SimpleQueue[bool], results: queue.SimpleQueue[tuple[int, Any]]) -> None:
    """The reader thread: one ``next(it)`` per request, until the ``False`` sentinel; then it closes
    ``it`` (the thread that may be inside ``it`` is the one that closes it)."""
    try:
        while requests.get():
            try:
                results.put((_ITEM, next(it)))
            except StopIteration:
                results.put((_END, None))
            except BaseException as e:  # noqa: BLE001 - the reader raises the same object
                results.put((_ERR, e))
    finally:
        try:
            close_iterator(it)
        except Exception:  # noqa: BLE001 - an error while closing has nowhere to go
            pass


def _stop_reader(requests: queue.SimpleQueue[bool], thread: threading.Thread, timeout: float) -> None:
    requests.put(False)
    if thread is not threading.current_thread():
        thread.join(timeout)


class _Pass:
    """One pass of the pipeline's pipe, read on the caller's thread or through a reader thread.

    ``next(it)`` runs on one thread at a time: the reader's while a request is outstanding (a read
    with a timeout, or the read-ahead of :meth:`Pipeline.start`), the caller's otherwise. The reader
    thread is owned by the pass: :meth:`close` (idempotent) stops it, and the pipeline's
    ``weakref.finalize`` closes the pass if the pipeline is dropped unstopped.
    """

    def __init__(self, it: Iterator[Any]) -> None:
        self.it = it
        self.requests: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self.results: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.outstanding = False  # a next() asked of the reader whose result has not been taken
        self.closed = False

    def request(self) -> None:
        """Ask the reader thread for the next item (starting the thread on first use)."""
        if self.thread is None:
            self.thread = threading.Thread(target=_read, args=(self.it, self.requests, self.results),
                                           name="datapipes.spdl pipeline reader", daemon=True)
            self.thread.start()
        self.requests.put(True)
        self.outstanding = True

    def next(self, timeout: float | None) -> Any:
        """The next item; ``StopIteration`` at the end; ``_TIMED_OUT`` (the pass goes on) when no
        item came within ``timeout`` seconds; what the pass raised, as the same object."""
        if not self.outstanding:
            if timeout is None:
                return next(self.it)
            self.request()
        try:
            kind, value = self.results.get(True, timeout)
        except queue.Empty:
            return _TIMED_OUT
        self.outstanding = False
        if kind == _ITEM:
            return value
        if kind == _END:
            raise StopIteration
        raise value

    def unread_failure(self) -> BaseException | None:
        """The exception of a read-ahead that has failed and that no read has taken (without
        waiting), or None."""
        if not self.outstanding:
            return None
        try:
            kind, value = self.results.get_nowait()
        except queue.Empty:
            return None
        self.outstanding = False
        return value if kind == _ERR else None

    def close(self, timeout: float) -> None:
        """Stop the pass: its threads stop; a reader stuck in a stalled source is abandoned after
        ``timeout`` seconds (a daemon thread: it closes the pass when the source returns)."""
        if self.closed:
            return
        self.closed = True
        if self.thread is not None:
            _stop_reader(self.requests, self.thread, timeout)  # the reader closes the iterator
        else:
            close_iterator(self.it)


class Pipeline(Generic[T]):
    """A built pipeline, as SPDL's ``spdl.pipeline.Pipeline``: made by
    :meth:`PipelineBuilder.build <datapipes.spdl.PipelineBuilder.build>`, it runs one pass of the
    pipe it holds, started by :meth:`start` (or by the first read) and stopped by :meth:`stop`.

    Args:
        pipe: the pipe to run (what :meth:`PipelineBuilder.build <datapipes.spdl.PipelineBuilder.build>`
            built).
        continuous: run one more pass (an epoch) at every :meth:`get_iterator`.

    Attributes:
        pipe: the ordinary pipe the builder built (``IterableWrapper -> Mapper -> ... ->
            Prefetcher``). Use it wherever a pipe goes: iterate it again (each ``iter()`` a new
            pass), ``datapipes.profile(pipeline.pipe)``, ``it.state_dict()`` of a pass,
            ``datapipes.DataLoader(pipeline.pipe, batch_size=None)`` or torch's ``DataLoader``.

    As in SPDL, the pipeline runs once: after the end of the source (or :meth:`stop`), reads raise
    ``EOFError`` and iterators are empty, and :meth:`start` cannot be called again. With
    ``add_source(..., continuous=True)`` every :meth:`get_iterator` (and ``for x in pipeline``)
    runs one more epoch over the source. A pass that fails raises :class:`PipelineFailure` after the
    items before the failure, and every later read raises it again.

    Threads: the stages' worker threads start with the pass and stop at :meth:`stop`, at the end of
    the pass, or when the pipeline is garbage collected. Reads with a ``timeout`` go through one
    reader thread (started by :meth:`start`, which also begins producing before the first read);
    reads without one run on your thread.

    Example:
        >>> from datapipes.spdl import PipelineBuilder
        >>> pipeline = PipelineBuilder().add_source(range(5)).pipe(lambda x: x * 10).add_sink(3).build(num_threads=1)
        >>> with pipeline.auto_stop():
        ...     print(list(pipeline.get_iterator(timeout=30)))
        [0, 10, 20, 30, 40]
        >>> pipeline.pipe
        IterableWrapper -> Mapper(<lambda>) -> Filter(not_none) -> Prefetcher(3)
    """

    def __init__(self, pipe: IterDataPipe[T], *, continuous: bool = False) -> None:
        self.pipe = pipe
        self._continuous = continuous
        self._state = _NOT_STARTED
        self._pass: _Pass | None = None  # the running pass (None before it, between epochs, after the end)
        self._failure: PipelineFailure | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def __repr__(self) -> str:
        return f"Pipeline({self.pipe!r})"

    # -- lifecycle ---------------------------------------------------------------------------------

    def _open(self) -> _Pass:
        run = self._pass = _Pass(iter(self.pipe))
        self._finalizer = weakref.finalize(self, run.close, 0.0)  # a pipeline dropped unstopped
        return run

    def _close(self, timeout: float) -> None:
        run, self._pass = self._pass, None
        if run is not None:
            assert self._finalizer is not None
            self._finalizer.detach()
            run.close(timeout)

    def start(self, *, timeout: float | None = None, **kwargs: Any) -> None:
        """Start the pipeline: its pass begins producing in the background, before the first read.

        Args:
            timeout: accepted as SPDL does (seconds to wait for the start); starting here does not
                wait for anything.
            kwargs: SPDL's ``daemon=``; the threads here are always daemon threads.

        Raises:
            RuntimeError: the pipeline was already started (``"The pipeline was already started."``).

        Example:
            >>> from datapipes.spdl import PipelineBuilder
            >>> pipeline = PipelineBuilder().add_source(range(3)).add_sink(2).build(num_threads=1)
            >>> pipeline.start()
            >>> list(pipeline)
            [0, 1, 2]
            >>> pipeline.stop()
        """
        unknown = set(kwargs) - {"daemon"}
        if unknown:
            raise TypeError(f"Pipeline.start: unexpected keyword arguments {sorted(unknown)}")
        if self._state != _NOT_STARTED:
            raise RuntimeError("The pipeline was already started.")
        self._state = _STARTED
        self._open().request()  # the reader thread pulls the first item now

    def stop(self, *, timeout: float | None = None) -> None:
        """Stop the pipeline: its threads stop and later reads raise ``EOFError``. Idempotent; a
        pipeline never started is left as it is (as SPDL does).

        Args:
            timeout: seconds to wait for a reader thread stuck in a stalled source (``None``: 3 s);
                such a thread is then abandoned (a daemon: it closes the pass when the source
                returns).

        Raises:
            PipelineFailure: the pass failed in the background (the read-ahead of :meth:`start`,
                or after a read that timed out) and no read has seen it yet; raised once, then by
                every later read (as SPDL does).

        Example:
            >>> from datapipes.spdl import PipelineBuilder
            >>> pipeline = PipelineBuilder().add_source(range(100)).add_sink(2).build(num_threads=1)
            >>> pipeline.start()
            >>> pipeline.get_item()
            0
            >>> pipeline.stop()
            >>> pipeline.get_item()
            Traceback (most recent call last):
            ...
            EOFError: Reached the end of the pipeline.
        """
        if self._state != _STARTED:
            return
        self._state = _STOPPED
        unread = None if self._pass is None else self._pass.unread_failure()
        self._close(_STOP_GRACE_S if timeout is None else timeout)
        if isinstance(unread, Exception) and self._failure is None:
            self._failure = _failure(unread)
            raise self._failure

    @contextmanager
    def auto_stop(self, *, timeout: float | None = None) -> Iterator[None]:
        """A context manager: :meth:`start` on entry, :meth:`stop` on exit (also when the body
        raises or breaks out of a loop).

        Args:
            timeout: given to :meth:`start` and :meth:`stop`.

        Example:
            >>> from datapipes.spdl import PipelineBuilder
            >>> pipeline = PipelineBuilder().add_source(range(1000)).add_sink(2).build(num_threads=1)
            >>> with pipeline.auto_stop():
            ...     for item in pipeline:
            ...         if item == 2:
            ...             break
            >>> item
            2
        """
        self.start(timeout=timeout)
        try:
            yield
        finally:
            self.stop(timeout=timeout)

    # -- reading -----------------------------------------------------------------------------------

    def get_item(self, *, timeout: float | None = None) -> T:
        """The next item (starting the pipeline if it was not started).

        Args:
            timeout: seconds to wait for it; ``None`` waits as long as it takes. A read that times
                out leaves the pipeline running: the next read gets the item this one waited for.

        Raises:
            TimeoutError: no item within ``timeout`` (``"The next item is not available after T
                sec."``, as SPDL).
            EOFError: the pipeline is exhausted (or, continuous, at the end of an epoch) or stopped.
            PipelineFailure: the pass failed, after the items before the failure; raised again by
                every later read.

        Example:
            >>> from datapipes.spdl import PipelineBuilder
            >>> pipeline = PipelineBuilder().add_source(["a"]).add_sink(1).build(num_threads=1)
            >>> pipeline.get_item(timeout=5)
            'a'
            >>> pipeline.get_item(timeout=5)
            Traceback (most recent call last):
            ...
            EOFError: Reached the end of the pipeline.
        """
        if self._failure is not None:
            raise self._failure
        if self._state == _NOT_STARTED:
            self._state = _STARTED
            self._open()
        run = self._pass
        if run is None:
            if self._state == _STOPPED or not self._continuous:
                raise EOFError(_EOF_MSG)
            run = self._open()  # continuous: the next epoch
        try:
            item = run.next(timeout)
        except StopIteration:
            self._close(0.0)
            raise EOFError(_EOF_MSG) from None
        except Exception as e:
            self._close(0.0)
            self._failure = _failure(e)
            raise self._failure from None
        if item is _TIMED_OUT:  # the pass goes on: the next read takes the item this one waited for
            raise TimeoutError(f"The next item is not available after {timeout} sec.")
        return item  # type: ignore[no-any-return]

    def get_iterator(self, *, timeout: float | None = None) -> Iterator[T]:
        """An iterator over the pipeline's items (one epoch), starting the pipeline if needed.

        Args:
            timeout: given to each :meth:`get_item`: a ``TimeoutError`` leaves the iterator (and
                the pipeline) usable.

        Example:
            >>> from datapipes.spdl import PipelineBuilder
            >>> pipeline = PipelineBuilder().add_source(range(3)).aggregate(2).add_sink(3).build(num_threads=1)
            >>> with pipeline.auto_stop():
            ...     for batch in pipeline.get_iterator(timeout=30):
            ...         print(batch)
            [0, 1]
            [2]
        """
        return _PipelineIterator(self, timeout)

    def __iter__(self) -> Iterator[T]:
        """``get_iterator()`` without a timeout."""
        return self.get_iterator()


class _PipelineIterator(Generic[T]):
    """One epoch of a pipeline: ``get_item(timeout)`` until ``EOFError``; a ``TimeoutError`` leaves
    it usable (a class, not a generator, which would end at the first exception)."""

    __slots__ = ("_pipeline", "_timeout", "_ended")

    def __init__(self, pipeline: Pipeline[T], timeout: float | None) -> None:
        self._pipeline = pipeline
        self._timeout = timeout
        self._ended = False

    def __iter__(self) -> _PipelineIterator[T]:
        return self

    def __next__(self) -> T:
        if self._ended:
            raise StopIteration
        try:
            return self._pipeline.get_item(timeout=self._timeout)
        except EOFError:
            self._ended = True
            raise StopIteration from None
