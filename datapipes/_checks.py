"""Argument checks shared by every stage's constructor: errors that name the stage and the argument."""

from __future__ import annotations

from typing import Any

__all__ = ["ArgumentError", "ArgumentTypeError", "phrased", "require_bool", "require_callable", "require_int"]


class ArgumentError(ValueError, AssertionError):
    """A bad argument value where torch DataPipes ``assert`` (``batch_size=0``, ``buffer_size=0``, ...):
    a ``ValueError`` that is also an ``AssertionError``, so code written for torch that catches
    ``AssertionError`` keeps working. The message names the stage and the argument, then ends with
    torch's own phrase."""

    __module__ = "datapipes.errors"  # its public home (re-exported there)


class ArgumentTypeError(TypeError, AssertionError):
    """As :class:`ArgumentError`, for a ``TypeError`` (an argument of the wrong kind) where torch
    DataPipes ``assert``."""

    __module__ = "datapipes.errors"


def phrased(stage: str, phrase: str, **values: Any) -> str:
    """One sentence for an argument error whose words torch DataPipes or torchdata already have:
    the stage and the values at fault, then their phrase, said once.

    >>> phrased("Batcher", "Batch size is required to be larger than 0!", batch_size=0)
    'Batcher(batch_size=0): Batch size is required to be larger than 0!'
    """
    args = ", ".join(f"{name}={value!r}" for name, value in values.items())
    return f"{stage}({args}): {phrase}" if args else f"{stage}: {phrase}"


def require_bool(value: Any, stage: str, name: str, *, ints: bool = False) -> bool:
    """``value`` as a bool; ``TypeError`` naming ``stage`` and ``name`` unless it is a bool (or, with
    ``ints``, any int: torch's flags take ``0`` and ``1`` too).

    >>> require_bool(1, "Batcher", "drop_last", ints=True)
    True
    >>> require_bool("yes", "Batcher", "drop_last")
    Traceback (most recent call last):
    ...
    TypeError: Batcher: drop_last must be a bool, got str
    """
    if not isinstance(value, int if ints else bool):
        raise TypeError(f"{stage}: {name} must be a bool, got {type(value).__name__}")
    return bool(value)


def require_callable(value: Any, stage: str, name: str, optional: bool = False) -> None:
    """Raise ``TypeError`` naming ``stage`` and ``name`` unless ``value`` is callable (or None when
    ``optional``)."""
    if value is None and optional:
        return
    if not callable(value):
        raise TypeError(f"{stage}: {name} must be callable, got {type(value).__name__}")


def require_int(
    value: Any, stage: str, name: str, minimum: int | None = None, optional: bool = False, torch_assert: str | None = None
) -> None:
    """Raise ``TypeError``/``ValueError`` naming ``stage`` and ``name`` unless ``value`` is an int
    (not a bool) of at least ``minimum`` (or None when ``optional``).

    ``torch_assert``: where torch DataPipes or torchdata ``assert`` the minimum, their message; a
    value below it then raises :class:`ArgumentError` (also an ``AssertionError``) saying that
    message after the stage and the value (:func:`phrased`).

    >>> require_int(3, "Batcher", "batch_size", minimum=1)
    >>> require_int(0, "Batcher", "batch_size", minimum=1)
    Traceback (most recent call last):
    ...
    ValueError: Batcher: batch_size must be >= 1, got 0
    >>> require_int(0, "Batcher", "batch_size", minimum=1, torch_assert="Batch size is required to be larger than 0!")
    Traceback (most recent call last):
    ...
    datapipes.errors.ArgumentError: Batcher(batch_size=0): Batch size is required to be larger than 0!
    """
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{stage}: {name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        if torch_assert is None:
            raise ValueError(f"{stage}: {name} must be >= {minimum}, got {value}")
        raise ArgumentError(phrased(stage, torch_assert, **{name: value}))
