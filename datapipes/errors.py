"""The shared error policy: what a stage does when its function (or a reader) fails on one item.

Every stage that calls user code or parses user data takes the same two arguments:

- ``on_error="raise"`` (the default): the first failure reaches the consumer as the very exception
  object that was raised (type, args and traceback intact), with a note naming the stage and the
  position of the failing item in the stage's input.
- ``on_error="skip"``: the failing item is dropped and counted; iteration goes on. With
  ``max_failures=k`` the pass tolerates ``k`` failures: the ``k+1``-th raises an
  :class:`ExceptionGroup` whose message names the stage and that holds every failure of the pass.
  ``max_failures=None`` tolerates any number.

Failures are counted per stage across passes in :class:`FailureLog` (``pipe.failures``), readable
while and after iterating. Only :class:`Exception` subclasses are handled: ``KeyboardInterrupt``
and ``SystemExit`` always pass through.

>>> from datapipes.iter import IterableWrapper
>>> pipe = IterableWrapper([1, 0, 2]).map(lambda x: 1 // x, on_error="skip")
>>> list(pipe), pipe.failures.count
([1, 0], 1)
"""

from __future__ import annotations

import dis
import threading
from collections import deque
from typing import Any, Callable, NamedTuple

from ._checks import ArgumentError, ArgumentTypeError

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "ErrorPolicy",
    "Failure",
    "FailureLog",
    "PassFailures",
    "add_stage_note",
    "call_lines",
    "policy_and_log",
    "raised_at",
]

_ON_ERROR = ("raise", "skip")
_RECENT = 16  # failures kept for inspection in a FailureLog


class Failure(NamedTuple):
    """One skipped failure: the position of the item in the stage's input and the exception."""

    position: int
    exception: BaseException


_NOTE_LOOKBACK = 4  # how many of an exception's last notes add_stage_note looks at


def add_stage_note(exc: BaseException, stage: str, position: int | None = None, what: str = "item") -> None:
    """Add a note naming ``stage`` (and the failing ``what`` at ``position``) to ``exc``.

    The exception object itself is left as it was raised (type, args, traceback); only a note is
    added, once per stage, so re-raising through nested stages does not repeat it. An object raised
    again and again (a ``fn`` that re-raises one cached exception, skipped each time under
    ``on_error="skip"``) keeps one note per stage, naming its latest position: the cost per call is
    constant (only the last few notes are looked at) and the notes do not grow.

    >>> e = ValueError("bad")
    >>> for i in range(3):
    ...     add_stage_note(e, "Mapper(f)", i)
    >>> e.__notes__
    ['[datapipes] raised in stage Mapper(f) at item 2']
    """
    stage_part = f"[datapipes] raised in stage {stage}"
    note = f"{stage_part} at {what} {position}" if position is not None else stage_part
    notes = getattr(exc, "__notes__", None)
    if notes:
        cut = len(stage_part)
        for k in range(len(notes) - 1, max(-1, len(notes) - 1 - _NOTE_LOOKBACK), -1):
            old = notes[k]
            if old == note:
                return
            if isinstance(old, str) and old.startswith(stage_part) and old[cut:cut + 1] in ("", " "):
                notes[k] = note
                return
    exc.add_note(note)


def call_lines(func: Callable[..., Any], local: str = "fn") -> frozenset[int]:
    """The source lines of ``func`` that load the local variable ``local`` (its call sites).

    Serial hot loops wrap the whole loop in one ``try`` (free in CPython 3.11+) instead of one per
    item; when an exception arrives, :func:`raised_at` tells from the line it passed through
    whether the user's function raised it or the source did.
    """
    lines: set[int] = set()
    for ins in dis.get_instructions(func):
        if ins.opname.startswith("LOAD_FAST"):
            names = ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)
            if local in names and ins.positions is not None and ins.positions.lineno is not None:
                lines.add(ins.positions.lineno)
    if not lines:
        raise ValueError(f"{func.__qualname__} never loads {local!r}")
    return frozenset(lines)


def raised_at(exc: BaseException, lines: frozenset[int]) -> bool:
    """True when ``exc`` passed through the catching frame on one of ``lines``."""
    tb = exc.__traceback__
    return tb is not None and tb.tb_lineno in lines


class FailureLog:
    """Failures a stage has skipped, counted across all of its passes.

    ``count`` is the total; ``recent`` holds the last 16 :class:`Failure` records. Thread safe:
    concurrent workers may record into one log.
    """

    __slots__ = ("_lock", "count", "recent")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.recent: deque[Failure] = deque(maxlen=_RECENT)

    def record(self, failure: Failure) -> None:
        with self._lock:
            self.count += 1
            self.recent.append(failure)

    def clear(self) -> None:
        """Forget every recorded failure."""
        with self._lock:
            self.count = 0
            self.recent.clear()

    def __repr__(self) -> str:
        return f"FailureLog(count={self.count})"

    # A log is runtime state: a pickled pipe starts with an empty one.
    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


class ErrorPolicy:
    """A validated ``on_error`` / ``max_failures`` pair, built once at a stage's construction.

    Args:
        on_error: ``"raise"`` or ``"skip"``.
        max_failures: with ``"skip"``, how many failures one pass tolerates (``None``: any number).
        stage: the stage's name, for the messages of bad arguments.
    """

    __slots__ = ("on_error", "max_failures")

    def __init__(self, on_error: str = "raise", max_failures: int | None = None, stage: str | None = None) -> None:
        at = f"{stage}: " if stage else ""
        if on_error not in _ON_ERROR:
            raise ValueError(f"{at}on_error must be 'raise' or 'skip', got {on_error!r}")
        if max_failures is not None:
            if isinstance(max_failures, bool) or not isinstance(max_failures, int):
                raise TypeError(f"{at}max_failures must be an int or None, got {type(max_failures).__name__}")
            if max_failures < 0:
                raise ValueError(f"{at}max_failures must be >= 0 or None, got {max_failures}")
            if on_error == "raise":
                raise ValueError(f"{at}max_failures applies only with on_error='skip'")
        self.on_error = on_error
        self.max_failures = max_failures

    @property
    def skips(self) -> bool:
        return self.on_error == "skip"

    def new_pass(self, stage: str, log: FailureLog) -> PassFailures:
        """The failure bookkeeping of one pass of ``stage``."""
        return PassFailures(stage, self.max_failures, log)

    def __repr__(self) -> str:
        return f"ErrorPolicy(on_error={self.on_error!r}, max_failures={self.max_failures!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ErrorPolicy)
            and other.on_error == self.on_error
            and other.max_failures == self.max_failures
        )

    def __getstate__(self) -> tuple[str, int | None]:
        return (self.on_error, self.max_failures)

    def __setstate__(self, state: tuple[str, int | None]) -> None:
        self.on_error, self.max_failures = state


def policy_and_log(stage: Any, on_error: str, max_failures: int | None) -> tuple[ErrorPolicy, FailureLog]:
    """A stage's validated :class:`ErrorPolicy` (bad arguments named after ``stage``'s class) and
    its empty :class:`FailureLog`, for ``self._policy, self.failures = policy_and_log(self, ...)``
    in the constructor, which then picks its hot loop from ``self._policy.skips``."""
    return ErrorPolicy(on_error, max_failures, type(stage).__name__), FailureLog()


class PassFailures:
    """Failures of one pass under ``on_error="skip"``: counts them and enforces the budget.

    Keeps at most ``max_failures + 1`` exceptions (the ones the final ``ExceptionGroup`` carries);
    with no budget it keeps none beyond the stage's :class:`FailureLog`.
    """

    __slots__ = ("stage", "max_failures", "log", "count", "kept", "what")

    def __init__(self, stage: str, max_failures: int | None, log: FailureLog, what: str = "item") -> None:
        self.stage = stage
        self.max_failures = max_failures
        self.log = log
        self.count = 0
        self.kept: list[Exception] = []
        self.what = what

    def skip(self, exc: Exception, position: int | None) -> None:
        """Record a skipped failure; raise the collected failures once the budget is exceeded."""
        add_stage_note(exc, self.stage, position, self.what)
        self.count += 1
        self.log.record(Failure(-1 if position is None else position, exc))
        if self.max_failures is None:
            return
        self.kept.append(exc)
        if self.count > self.max_failures:
            raise ExceptionGroup(
                f"stage {self.stage}: {self.count} failures, more than max_failures={self.max_failures}",
                self.kept,
            )
