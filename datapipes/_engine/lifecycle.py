"""Two protocols every layer above shares: ``close``/``with`` (the engine's worker pools, loop
references and producers) and a run's ``restore`` before it starts (docs/architecture.rst, "The
stage protocol")."""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from typing import Any, Callable, Self


#: what a run's restore() raises once its pass has yielded an item (checkpoints: datapipes._runtime.passes)
STARTED = "load_state_dict: this pass has already started; call it before the first next()"


class Resumable(ABC):
    """The position of one stage in one pass (a *run*; docs/architecture.rst, "The stage protocol").

    ``state()`` gives the position as plain data, read between two items; ``restore(state)`` loads
    one before the pass's first item. The guard lives here: once the run's pass has started
    (``started``, set by the run's loop as it begins), ``restore`` raises ``RuntimeError`` instead
    of calling :meth:`load`, since a position can only be taken up from the start.
    """

    __slots__ = ("started",)

    def __init__(self) -> None:
        self.started = False

    @abstractmethod
    def state(self) -> Any:
        """The position, as plain data (ints, strings, lists, dicts)."""

    def restore(self, state: Any) -> None:
        if self.started:
            raise RuntimeError(STARTED)
        if type(state) is not dict:  # every run's state is a dict: a state from elsewhere is checked first
            raise ValueError(f"the state must be a dict, got {type(state).__name__}: {state!r:.100}")
        self.load(state)

    @abstractmethod
    def load(self, state: Any) -> None:
        """Take ``state`` up for the pass about to start (``restore`` checked that it has not)."""


class Closeable:
    """``close()`` runs the object's ``weakref.finalize`` (``_finalizer``, set in its constructor;
    ``None`` while there is nothing to stop), so it is idempotent and also runs when the object is
    collected; ``with obj:`` closes it on exit."""

    _finalizer: Callable[[], Any] | None

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def close_iterator(it: Any) -> None:
    """Close an iterator (an upstream pass, a stream) if it can be closed; plain iterators cannot.

    Stages call it on an upstream iterator whose pass they abandon (their consumer closed them, or
    an exception is on its way out), so the upstream's threads, processes and files are released at
    once instead of whenever the frames of a traceback that still names the iterator are collected.
    A pass that ends normally, or a ``header`` that reached its limit, only drops its upstream
    iterator: what it already passed downstream (open streams from ``open_files``, say) stays valid,
    and the dropped iterator's own finaliser releases the rest.
    """
    close = getattr(it, "close", None)
    if close is not None:
        close()


def abandon(src: Any) -> None:
    """Called in an ``except`` clause: close the upstream of a pass that an exception leaves.

    Without this, a failing pass's upstream (its worker threads, processes, event-loop reference,
    open files) would live as long as the traceback that names this frame, that is until the cyclic
    garbage collector runs: the exception the consumer holds refers to the frame, the frame to
    ``src``. An error from closing has nowhere better to go than the exception already leaving.
    """
    if sys.exc_info()[0] is GeneratorExit:
        # The pass was closed or dropped: its upstream is dropped with this frame, as a closed
        # generator chain always did. Closing it here would also close, when a pass is merely
        # dropped, the streams an opener upstream handed out (they stay valid: fileio.py).
        return
    try:
        close_iterator(src)
    except Exception:  # noqa: BLE001
        pass
