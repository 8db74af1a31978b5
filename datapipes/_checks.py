"""Argument checks shared by every stage's constructor: errors that name the stage and the argument."""

from __future__ import annotations

from typing import Any

__all__ = ["require_callable", "require_int"]


def require_callable(value: Any, stage: str, name: str, optional: bool = False) -> None:
    """Raise ``TypeError`` naming ``stage`` and ``name`` unless ``value`` is callable (or None when
    ``optional``)."""
    if value is None and optional:
        return
    if not callable(value):
        raise TypeError(f"{stage}: {name} must be callable, got {type(value).__name__}")


def require_int(value: Any, stage: str, name: str, minimum: int | None = None, optional: bool = False) -> None:
    """Raise ``TypeError``/``ValueError`` naming ``stage`` and ``name`` unless ``value`` is an int
    (not a bool) of at least ``minimum`` (or None when ``optional``).

    >>> require_int(3, "Batcher", "batch_size", minimum=1)
    >>> require_int(0, "Batcher", "batch_size", minimum=1)
    Traceback (most recent call last):
    ...
    ValueError: Batcher: batch_size must be >= 1, got 0
    """
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{stage}: {name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{stage}: {name} must be >= {minimum}, got {value}")
