"""The checks of :class:`~datapipes.loader.DataLoader`'s arguments: the data and the arguments both
spellings share (the SPDL translation, :mod:`.spdl_spelling`, checks them first, as the loader does,
so a call reports the same first error in either spelling), and torch's arguments about worker
processes, with torch's rules and its warning for more workers than CPUs.

Where torch's ``DataLoader`` refuses the same value, the message says torch's words first, then
ours (:func:`torch_phrased`), so code that matches torch's message keeps working.
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from dataclasses import dataclass
from typing import Any

from .._checks import require_bool, require_callable
from .._runtime import tuning
from .distributed import _WHERE

__all__ = ["NOT_GIVEN", "ArgumentTypeError", "WorkerArguments", "check_pin_memory_device", "check_shared",
           "check_timeout", "check_workers", "data_of", "require_positive", "torch_phrased", "warn_worker_number"]

_EVEN = (None, "drop", "pad")


class _NotGiven:
    """The default of ``batch_size`` in the loader's signature: torch's spelling reads it as ``1``
    (torch's default), SPDL's as ``None`` (SPDL's), so a call can tell "not given" from ``None``."""

    def __repr__(self) -> str:
        return "1"  # what help() shows: torch's default (SPDL's spelling reads None)

    def __reduce__(self) -> str:
        return "NOT_GIVEN"  # the module's one instance


#: ``batch_size`` not given (see :class:`_NotGiven`).
NOT_GIVEN = _NotGiven()


def torch_phrased(torch_message: str, detail: str) -> str:
    """A loader argument error in torch DataLoader's words, then ours: ``DataLoader: <torch's
    message> (<detail>)``, torch's message whole, so that a pattern written for it still matches."""
    return f"{_WHERE}: {torch_message} ({detail})"


def data_of(given: dict[str, Any]) -> tuple[Any, str]:
    """What the loader reads and the name it was given by: ``given`` maps each name the loader
    takes it by (torch's ``dataset``, the first positional argument; ``pipe``; SPDL's ``src``) to
    the value passed (None: not passed). ``TypeError`` naming both where two are passed."""
    named = [(name, value) for name, value in given.items() if value is not None]
    if len(named) > 1:
        (first, _), (second, _) = named[:2]
        raise TypeError(f"{_WHERE}: give the data once, as {first} or as {second}, not both")
    if not named:
        raise TypeError(f"{_WHERE}: missing the data: DataLoader.__init__() missing 1 required positional argument: "
                        f"'dataset' (DataLoader(dataset, ...), DataLoader(pipe=...), or DataLoader(src=...) in "
                        f"SPDL's spelling)")
    return named[0][1], named[0][0]


class ArgumentTypeError(TypeError, ValueError):
    """A value of the wrong type where torch's loader raises ``ValueError`` (``batch_size="8"``,
    ``drop_last="yes"``): a ``TypeError``, as a wrong type is throughout the library, and a
    ``ValueError``, so code written for torch's loader still catches it."""


def require_positive(value: Any, name: str, *, optional: bool = False) -> None:
    """``value`` an int >= 1 (or None where ``optional``), else torch's words: ``ArgumentTypeError``
    (a ``TypeError`` and a ``ValueError``) for another type, ``ValueError`` below 1, saying
    ``<name> should be a positive integer value``."""
    if value is None and optional:
        return
    phrase = f"{name} should be a positive integer value, but got {name}={value}"
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an int or None" if optional else "an int"
        raise ArgumentTypeError(torch_phrased(phrase, f"{name} must be {kind}, got {type(value).__name__}"))
    if value < 1:
        raise ValueError(torch_phrased(phrase, f"{name} must be >= 1, got {value}"))


def check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{_WHERE}: timeout must be a number of seconds or None, got {type(timeout).__name__}")
    if timeout == 0:
        return None  # torch's default: no timeout
    if not timeout > 0:
        raise ValueError(torch_phrased("timeout option should be non-negative",
                                       f"timeout must be > 0 (or 0 or None: no timeout), got {timeout!r}"))
    return float(timeout)


def check_shared(batch_size: Any, drop_last: Any, seed: Any, even_batches: Any,
                 timeout: Any) -> tuple[bool, float | None]:
    """Check the arguments of both spellings, in the loader's order; returns ``drop_last`` as a bool
    and ``timeout`` in seconds (``None``: no timeout)."""
    require_positive(batch_size, "batch_size", optional=True)
    if not isinstance(drop_last, int):  # torch's flags take 0 and 1 too
        raise ArgumentTypeError(torch_phrased(f"drop_last should be a boolean value, but got drop_last={drop_last}",
                                              f"drop_last must be a bool, got {type(drop_last).__name__}"))
    drop = bool(drop_last)
    if drop and batch_size is None:
        raise ValueError(torch_phrased("batch_size=None option disables auto-batching and is mutually exclusive "
                                       "with drop_last", "drop_last=True needs a batch_size, got batch_size=None"))
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"{_WHERE}: seed must be an int or None, got {type(seed).__name__}")
    if even_batches not in _EVEN or isinstance(even_batches, bool):
        raise ValueError(f"{_WHERE}: even_batches must be None, 'drop' or 'pad', got {even_batches!r}")
    return drop, check_timeout(timeout)


@dataclass(frozen=True)
class WorkerArguments:
    """The torch-spelling arguments about worker processes, checked (:func:`check_workers`)."""

    num_workers: int
    persistent_workers: bool
    prefetch_factor: int | None
    #: the context object (torch's attribute holds the context a start method's name stands for)
    multiprocessing_context: Any
    worker_init_fn: Any
    in_order: bool
    snapshot_every_n_steps: int | None


def check_workers(num_workers: Any, persistent_workers: Any, prefetch_factor: Any, multiprocessing_context: Any,
                  worker_init_fn: Any, in_order: Any, snapshot_every_n_steps: Any) -> WorkerArguments:
    """Check torch's (and torchdata's) arguments about worker processes with torch's rules and
    phrases: ``prefetch_factor``, ``persistent_workers`` and ``multiprocessing_context`` need workers,
    and ``worker_init_fn`` is not called without (both as in torch); ``multiprocessing_context`` is a
    start method's name or a ``multiprocessing`` context, checked here rather than at the first pass."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int):
        raise TypeError(f"{_WHERE}: num_workers must be an int, got {type(num_workers).__name__}")
    if num_workers < 0:
        raise ValueError(torch_phrased("num_workers option should be non-negative; use num_workers=0 to disable "
                                       "multiprocessing.", f"num_workers must be >= 0, got {num_workers}"))
    if prefetch_factor is not None:
        if isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, int):
            raise TypeError(f"{_WHERE}: prefetch_factor must be an int or None, got {type(prefetch_factor).__name__}")
        if num_workers == 0:
            raise ValueError(torch_phrased(
                "prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 to enable "
                "multiprocessing, otherwise set prefetch_factor to None.",
                "prefetch_factor needs num_workers > 0, got num_workers=0"))
        if prefetch_factor < 0:
            raise ValueError(torch_phrased("prefetch_factor option should be non-negative",
                                           f"prefetch_factor must be >= 1, got {prefetch_factor}"))
        if prefetch_factor == 0:  # torch asserts it at the first pass
            raise ValueError(f"{_WHERE}: prefetch_factor must be >= 1, got 0")
    persistent = require_bool(persistent_workers, _WHERE, "persistent_workers", ints=True)
    if persistent and num_workers == 0:
        raise ValueError(torch_phrased("persistent_workers option needs num_workers > 0",
                                       "persistent_workers needs num_workers > 0, got num_workers=0"))
    context = _context(multiprocessing_context, num_workers)
    require_callable(worker_init_fn, _WHERE, "worker_init_fn", optional=True)
    ordered = require_bool(in_order, _WHERE, "in_order", ints=True)
    require_positive(snapshot_every_n_steps, "snapshot_every_n_steps", optional=True)
    return WorkerArguments(num_workers, persistent, 2 if prefetch_factor is None and num_workers else prefetch_factor,
                           context, worker_init_fn, ordered, snapshot_every_n_steps)


def _context(context: Any, num_workers: int) -> Any:
    """torch's check of ``multiprocessing_context``: the context a start method's name stands for, or
    the context given; None for None."""
    if context is None:
        return None
    if num_workers == 0:
        raise ValueError(f"{_WHERE}: multiprocessing_context can only be used with multi-process loading "
                         f"(num_workers > 0), but got num_workers={num_workers}")
    if isinstance(context, str):
        import torch.multiprocessing

        valid = torch.multiprocessing.get_all_start_methods()
        if context not in valid:
            raise ValueError(f"{_WHERE}: multiprocessing_context option should specify a valid start method in "
                             f"{valid!r}, but got multiprocessing_context={context!r}")
        context = torch.multiprocessing.get_context(context)
    if not isinstance(context, multiprocessing.context.BaseContext):
        raise TypeError(f"{_WHERE}: multiprocessing_context option should be a valid context object or a string "
                        f"specifying the start method, but got multiprocessing_context={context}")
    return context


def check_pin_memory_device(pin_memory_device: Any, pin_memory: bool, stacklevel: int) -> str:
    """torch's deprecated ``pin_memory_device``: a str, ignored, with torch's warning where
    ``pin_memory`` is set (the batches are pinned for the current accelerator, and go where
    ``device=`` says)."""
    if not isinstance(pin_memory_device, str):
        raise TypeError(f"{_WHERE}: pin_memory_device must be a str, got {type(pin_memory_device).__name__}")
    if pin_memory and pin_memory_device:
        warnings.warn(f"pin_memory_device is deprecated, the current accelerator will be used as the device,"
                      f"ignore pin_memory_device='{pin_memory_device}'.", UserWarning, stacklevel=stacklevel + 1)
    return pin_memory_device


def warn_worker_number(num_workers: int, stacklevel: int) -> None:
    """torch's warning (``DataLoader.check_worker_number_rationality``, its words) where the loader
    would start more worker processes than the CPUs this process may use
    (:func:`datapipes._runtime.tuning.usable_cpus`, the library's one reading of it)."""
    if not num_workers:
        return
    cpus = tuning.usable_cpus()
    if num_workers <= cpus:
        return
    cpuset_checked = hasattr(os, "process_cpu_count") or hasattr(os, "sched_getaffinity")
    warnings.warn(
        f"This DataLoader will create {num_workers} worker processes in total. Our suggested max number of worker "
        f"in current system is {cpus}{'' if cpuset_checked else ' (`cpuset` is not taken into account)'}, which is "
        f"smaller than what this DataLoader is going to create. Please be aware that excessive worker creation "
        f"might get DataLoader running slow or even freeze, lower the worker number to avoid potential "
        f"slowness/freeze if necessary.",
        UserWarning, stacklevel=stacklevel + 1,
    )
