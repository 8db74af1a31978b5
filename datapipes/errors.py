"""The shared error policy: what a stage does when its function (or a reader) fails on one item.

Every stage that calls user code or parses user data takes the same two arguments:

- ``on_error="raise"`` (the default): the first failure reaches the consumer as the very exception
  object that was raised (type, args and traceback intact), with a note naming the stage and the
  position of the failing item in the stage's input.
- ``on_error="skip"``: the failing item is dropped and counted; iteration goes on. With
  ``max_failures=k`` the pass tolerates ``k`` failures: the ``k+1``-th raises an
  :class:`ExceptionGroup` whose message names the stage and that holds every failure of the pass.
  ``max_failures=None`` tolerates any number. A float between 0 and 1 is a share of the items the
  stage has taken in (``0.05``: 5%), judged at each failure once the pass has seen
  :data:`MIN_ITEMS_FOR_SHARE` items.

Skipping is not silent (see docs/howto/errors.rst): each pass logs what it skips to the
``datapipes`` logger at WARNING (the first :data:`LOGGED_ONE_BY_ONE` failures one by one, then at
most one line every :data:`LOG_INTERVAL` seconds counting the rest), and a summary line when it
ends; a pass that skips more than ``warn_failures`` of its items (a count, or a share: by default
:data:`WARN_FAILURES`, 10%) also warns once with a :class:`RuntimeWarning`.

Failures are counted per stage across passes in :class:`FailureLog` (``pipe.failures``), readable
while and after iterating. Only :class:`Exception` subclasses are handled: ``KeyboardInterrupt``
and ``SystemExit`` always pass through.

What the library writes about a failure (notes, log lines, warnings, the budget's message) has the
secrets of any URL in it masked (``https://***@host/a?X-Amz-Signature=***``: see
``datapipes._redact``); the exception object itself is the one that was raised.

>>> from datapipes.iter import IterableWrapper
>>> pipe = IterableWrapper([1, 0, 2]).map(lambda x: 1 // x, on_error="skip")
>>> list(pipe), pipe.failures.count
([1, 0], 1)
"""

from __future__ import annotations

import dis
import logging
import re
import threading
import time
import warnings
from collections import deque
from typing import Any, Callable, Literal, NamedTuple

from ._checks import ArgumentError, ArgumentTypeError
from ._redact import redact

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "ErrorPolicy",
    "Failure",
    "FailureLog",
    "LOGGED_ONE_BY_ONE",
    "LOG_INTERVAL",
    "MIN_ITEMS_FOR_SHARE",
    "PassFailures",
    "SizeLimitError",
    "WARN_FAILURES",
    "add_stage_note",
    "call_lines",
    "policy_and_log",
    "raised_at",
]

_ON_ERROR = ("raise", "skip")
#: what a stage takes as ``on_error``
_OnError = Literal["raise", "skip"]
_RECENT = 16  # failures kept for inspection in a FailureLog

#: The default ``warn_failures``: a pass that skips more than this share of its items warns.
WARN_FAILURES = 0.1
#: A share (``max_failures`` or ``warn_failures`` given as a float) is judged while a pass runs only
#: once it has taken in this many items: the first few items tell little about a rate.
MIN_ITEMS_FOR_SHARE = 100
#: The failures of a pass logged one by one; later ones are counted in periodic lines.
LOGGED_ONE_BY_ONE = 10
#: Seconds between two lines that count the failures no longer logged one by one.
LOG_INTERVAL = 10.0
_KEPT_UNDER_SHARE = 100  # the latest failures the ExceptionGroup of a share budget holds

logger = logging.getLogger("datapipes")


class SizeLimitError(ValueError):
    """Data larger than a documented limit (an HTTP body over ``max_size``): the message names the
    file or URL, the size found and the limit, and the argument that raises it. A ``ValueError``:
    a retry cannot fix it, so it is never retried, and under ``on_error="skip"`` it is skipped and
    counted as any failure of the item."""


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
    constant (only the last few notes are looked at) and the notes do not grow. A URL in
    ``stage`` or ``what`` (a reader names the file) is shown without its secrets
    (``https://***@host/a?sig=***``).

    >>> e = ValueError("bad")
    >>> for i in range(3):
    ...     add_stage_note(e, "Mapper(f)", i)
    >>> e.__notes__
    ['[datapipes] raised in stage Mapper(f) at item 2']
    """
    stage, what = redact(stage), redact(what)  # a label or a file named by URL: shown without its secrets
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


_STAGE_NOTE = re.compile(r"\[datapipes\] raised in stage (.+) at item (\d+)$")


def noted_item(exc: BaseException) -> tuple[str, int] | None:
    """``(stage label, position)`` of the first item note :func:`add_stage_note` put on ``exc``
    (the stage that raised it), or None.

    >>> e = KeyError("k")
    >>> add_stage_note(e, "Mapper(f)", 3)
    >>> noted_item(e)
    ('Mapper(f)', 3)
    """
    for note in getattr(exc, "__notes__", None) or ():
        found = _STAGE_NOTE.match(note) if isinstance(note, str) else None
        if found:
            return found.group(1), int(found.group(2))
    return None


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


def _limit(value: Any, name: str, at: str) -> int | float | None:
    """A validated ``max_failures`` or ``warn_failures``: an int >= 0 (a number of failures), a
    float between 0 and 1 exclusive (a share of the items), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{at}{name} must be an int or None, got {type(value).__name__} "
            f"(or a float between 0 and 1 for a share of the items)"
        )
    if isinstance(value, float):
        if not 0.0 < value < 1.0:
            raise ValueError(
                f"{at}{name} as a share of the items must be a float between 0 and 1 (0.05: 5%), got {value!r}; "
                f"give an int for a number of failures"
            )
        return float(value)
    if value < 0:
        raise ValueError(f"{at}{name} must be >= 0 or None, got {value}")
    return int(value)


class _Shown:
    """``str(exc)`` as a log line shows it, made when the line is written: its first 1000
    characters, the secrets of its URLs masked (``datapipes._redact``)."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __str__(self) -> str:
        try:
            text = str(self.exc)
        except Exception:  # noqa: BLE001 - a message that cannot be made: say so rather than fail the pass
            text = f"<str() of the {type(self.exc).__name__} failed>"
        return redact(text[:1000])


def _percent(share: float) -> str:
    """``0.695`` -> ``'69.5%'``, ``0.1`` -> ``'10%'``, ``1e-05`` -> ``'0.001%'``."""
    return f"{share * 100:.3g}%"


class ErrorPolicy:
    """A validated ``on_error`` / ``max_failures`` / ``warn_failures``, built once at a stage's
    construction.

    Args:
        on_error: ``"raise"`` or ``"skip"``.
        max_failures: with ``"skip"``, how many failures one pass tolerates: an int; a float between
            0 and 1, a share of the items the stage has taken in, judged at each failure once the
            pass has taken in :data:`MIN_ITEMS_FOR_SHARE` items; ``None``: any number.
        stage: the stage's name, for the messages of bad arguments.
        warn_failures: with ``"skip"``, past how many failures a pass warns (once, with a
            :class:`RuntimeWarning`): an int or a share, as ``max_failures`` (a share is judged
            when the pass ends, and while it runs once it has taken in :data:`MIN_ITEMS_FOR_SHARE`
            items); default :data:`WARN_FAILURES` (10%); ``None``: never.
        counts: whether the stage can count the items its failures are a share of; one that cannot
            refuses a share as ``max_failures`` (and judges only a number as ``warn_failures``).
    """

    __slots__ = ("on_error", "max_failures", "warn_failures")

    def __init__(
        self,
        on_error: str = "raise",
        max_failures: int | float | None = None,
        stage: str | None = None,
        *,
        warn_failures: int | float | None = WARN_FAILURES,
        counts: bool = True,
    ) -> None:
        at = f"{stage}: " if stage else ""
        if on_error not in _ON_ERROR:
            raise ValueError(f"{at}on_error must be 'raise' or 'skip', got {on_error!r}")
        max_failures = _limit(max_failures, "max_failures", at)
        if max_failures is not None and on_error == "raise":
            raise ValueError(f"{at}max_failures applies only with on_error='skip'")
        if isinstance(max_failures, float) and not counts:
            raise ValueError(
                f"{at}max_failures cannot be a share here: the stage does not count the items its failures "
                f"are part of; give a number of failures (an int), got {max_failures!r}"
            )
        self.on_error = on_error
        self.max_failures = max_failures
        self.warn_failures = _limit(warn_failures, "warn_failures", at)

    @property
    def skips(self) -> bool:
        return self.on_error == "skip"

    def new_pass(self, stage: str, log: FailureLog) -> PassFailures:
        """The failure bookkeeping of one pass of ``stage``."""
        return PassFailures(stage, self.max_failures, log, warn_failures=self.warn_failures)

    def __repr__(self) -> str:
        warn = "" if self.warn_failures == WARN_FAILURES else f", warn_failures={self.warn_failures!r}"
        return f"ErrorPolicy(on_error={self.on_error!r}, max_failures={self.max_failures!r}{warn})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ErrorPolicy)
            and other.on_error == self.on_error
            and other.max_failures == self.max_failures
            and other.warn_failures == self.warn_failures
        )

    def __getstate__(self) -> tuple[str, int | float | None, int | float | None]:
        return (self.on_error, self.max_failures, self.warn_failures)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.on_error, self.max_failures = state[0], state[1]
        self.warn_failures = state[2] if len(state) > 2 else WARN_FAILURES


def policy_and_log(
    stage: Any,
    on_error: str,
    max_failures: int | float | None,
    warn_failures: int | float | None = WARN_FAILURES,
    counts: bool = True,
) -> tuple[ErrorPolicy, FailureLog]:
    """A stage's validated :class:`ErrorPolicy` (bad arguments named after ``stage``'s class) and
    its empty :class:`FailureLog`, for ``self._policy, self.failures = policy_and_log(self, ...)``
    in the constructor, which then picks its hot loop from ``self._policy.skips``."""
    policy = ErrorPolicy(on_error, max_failures, type(stage).__name__, warn_failures=warn_failures, counts=counts)
    return policy, FailureLog()


class PassFailures:
    """Failures of one pass under ``on_error="skip"``: counts them, enforces the budget, reports them.

    Keeps at most ``max_failures + 1`` exceptions (the ones the final ``ExceptionGroup`` carries;
    under a share, the latest 100); with no budget it keeps none beyond the stage's
    :class:`FailureLog`.

    Reports, on the ``datapipes`` logger at WARNING: the first :data:`LOGGED_ONE_BY_ONE` failures of
    the pass one line each (the stage, the position its note names, ``type: message``), then at most
    one line every :data:`LOG_INTERVAL` seconds counting the failures since the last line; and,
    when the stage calls :meth:`end`, one summary line. Past ``warn_failures`` it warns once with a
    :class:`RuntimeWarning`. A log whose class records failures its own way (datapipes.spdl's logs
    each at ERROR, as SPDL does) reports them itself: the pass then logs and warns nothing. All of
    this runs on the failure path and at the end of the pass: a pass that skips nothing pays nothing.

    The items a pass has taken in (a share's denominator): ``items()`` where the stage sets it (a
    reader, whose failures name files and lines), else the highest failing position + 1 (the
    positions of ``what="item"`` failures are places in the stage's input).
    """

    __slots__ = ("stage", "max_failures", "log", "count", "kept", "what", "warn_failures", "items", "seen",
                 "reports", "logged", "quiet", "last_line", "warned", "ended")

    def __init__(
        self,
        stage: str,
        max_failures: int | float | None,
        log: FailureLog,
        what: str = "item",
        warn_failures: int | float | None = WARN_FAILURES,
    ) -> None:
        self.stage = redact(stage)
        self.max_failures = max_failures
        self.log = log
        self.count = 0
        self.kept: Any = deque(maxlen=_KEPT_UNDER_SHARE) if isinstance(max_failures, float) else []
        self.what = what
        self.warn_failures = warn_failures
        self.items: Callable[[], int | None] | None = None
        self.seen = 0  # the highest failing position + 1 (for what="item")
        self.reports = type(log).record is FailureLog.record
        self.logged = 0  # failures logged one by one
        self.quiet = 0  # failures since the last line that counts them
        self.last_line = 0.0  # when that line (or the last one-by-one line) was written
        self.warned = False
        self.ended = False

    def skip(self, exc: Exception, position: int | None) -> None:
        """Record a skipped failure; raise the collected failures once the budget is exceeded."""
        add_stage_note(exc, self.stage, position, self.what)
        self.count += 1
        self.log.record(Failure(-1 if position is None else position, exc))
        limit = self.max_failures
        if limit is None and not self.reports:
            return
        seen = self._seen(position)
        if limit is not None:
            self.kept.append(exc)
            if self._over(limit, seen, False):
                self.ended = True  # the group reports this pass
                raise ExceptionGroup(self._budget_message(limit, seen), list(self.kept))
        if self.reports:
            self._log(exc, position)
            warn = self.warn_failures
            if warn is not None and not self.warned and self._over(warn, seen, False):
                self._warn(warn, seen, False)

    def end(self, seen: int | None = None) -> None:
        """The pass ended (ran out, failed or was closed); ``seen``: the items it took in, where the
        stage knows. Logs the summary of a pass that skipped anything and judges its share against
        ``warn_failures``. Idempotent; silent after the budget's ``ExceptionGroup``, which reports
        the pass."""
        if self.ended:
            return
        self.ended = True
        if not self.count or not self.reports:
            return
        n = self._seen(None) if seen is None else max(seen, self.count)
        if n is None:
            logger.warning("stage %s skipped %d items in this pass (of a number it does not count); "
                           "its failures.recent holds the latest", self.stage, self.count)
        else:
            logger.warning("stage %s skipped %d of %d items (%s) in this pass; its failures.recent holds the latest",
                           self.stage, self.count, n, _percent(self.count / n))
        warn = self.warn_failures
        if warn is not None and not self.warned and self._over(warn, n, True):
            self._warn(warn, n, True)

    def _seen(self, position: int | None) -> int | None:
        """The items the pass has taken in so far (at least its failures), or None where unknown."""
        if self.items is not None:
            n = self.items()
            return None if n is None else max(n, self.count)
        if type(position) is int and self.what == "item":
            self.seen = max(self.seen, position + 1)
        return max(self.seen, self.count) if self.seen else None

    def _over(self, limit: int | float, seen: int | None, final: bool) -> bool:
        """Whether the failures so far exceed ``limit``: a number, or a share of ``seen`` (judged
        before the end only once the pass has taken in MIN_ITEMS_FOR_SHARE items)."""
        if not isinstance(limit, float):
            return self.count > limit
        if seen is None or not final and seen < MIN_ITEMS_FOR_SHARE:
            return False
        return self.count > limit * seen

    def _budget_message(self, limit: int | float, seen: int | None) -> str:
        if not isinstance(limit, float) or seen is None:
            return f"stage {self.stage}: {self.count} failures, more than max_failures={limit}"
        held = f"; the group holds the latest {len(self.kept)}" if self.count > len(self.kept) else ""
        return (f"stage {self.stage}: {self.count} failures in {seen} items ({_percent(self.count / seen)}), "
                f"more than max_failures={limit} ({_percent(limit)}) of them{held}")

    def _log(self, exc: Exception, position: int | None) -> None:
        """Log one skipped failure: one line each for the first LOGGED_ONE_BY_ONE, then a line
        counting them every LOG_INTERVAL seconds at most."""
        where = redact(self.what if position is None else f"{self.what} {position}")
        shown = _Shown(exc)  # made into text only if a line is written
        if self.logged < LOGGED_ONE_BY_ONE:
            self.logged += 1
            if self.logged < LOGGED_ONE_BY_ONE:
                logger.warning("stage %s skipped %s: %s: %.300s", self.stage, where, type(exc).__name__, shown)
                return
            self.last_line = time.monotonic()
            logger.warning("stage %s skipped %s: %s: %.300s (%d failures logged one by one: the next ones are "
                           "counted, in one line every %g s at most)", self.stage, where, type(exc).__name__, shown,
                           self.logged, LOG_INTERVAL)
            return
        self.quiet += 1
        now = time.monotonic()
        if now - self.last_line >= LOG_INTERVAL:
            logger.warning("stage %s skipped %d more in %.1f s (%d in this pass so far), the latest %s: %s: %.300s",
                           self.stage, self.quiet, now - self.last_line, self.count, where, type(exc).__name__, shown)
            self.quiet = 0
            self.last_line = now

    def _warn(self, limit: int | float, seen: int | None, final: bool) -> None:
        self.warned = True
        when = "in this pass" if final else "so far in this pass"
        if isinstance(limit, float):
            what = (f"{self.count} of {seen} items ({_percent(self.count / (seen or 1))}) {when}, "
                    f"more than warn_failures={limit} ({_percent(limit)})")
        else:
            what = f"{self.count} items {when}, more than warn_failures={limit}"
        warnings.warn(
            f"stage {self.stage} skipped {what}: is a source or a function failing? Pass warn_failures= to the "
            f"stage to change this threshold (a number, a share, or None: never warn), or max_failures= to stop "
            f"the pass past a budget; its failures.recent holds the latest failures",
            RuntimeWarning,
            stacklevel=2,
        )
