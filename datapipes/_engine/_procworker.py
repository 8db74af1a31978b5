"""The entry point of a process-executor worker.

Run as a script by path (``python .../_procworker.py RFD WFD``), never imported as part of the
``datapipes`` package in the worker, so a worker's start-up imports only the standard library and
cloudpickle, not torch (the parent imports this module too, for :func:`make_rng` and the protocol).

Protocol over two pipes (length-framed messages of ``multiprocessing.connection.Connection``):

1. parent -> worker: ``pickle`` of ``{"sys_path": [...]}``;
2. parent -> worker: ``pickle`` of ``(fn_payload, rng_kind)`` where ``fn_payload`` is the
   cloudpickle of ``fn``; worker -> parent: ``pickle`` of ``("hello", pid, torch_imported)``;
3. parent -> worker, repeatedly: ``pickle`` of ``(chunk_id, items)``; worker -> parent:
   ``pickle`` of ``(chunk_id, seconds_in_fn, [(ok, value), ...])``;
4. parent -> worker: an empty message, or end of file: the worker exits.

SIGINT is ignored in the worker: Ctrl-C reaches the parent, which stops its workers.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import traceback
from typing import Any, Callable

_PROTOCOL = pickle.HIGHEST_PROTOCOL


def make_rng(kind: str, seed: int) -> Any:
    """A random generator of ``kind`` (``"python"``, ``"numpy"`` or ``"torch"``) seeded with ``seed``."""
    if kind == "python":
        import random

        return random.Random(seed)
    if kind == "numpy":
        import numpy

        return numpy.random.default_rng(seed)
    if kind == "torch":
        import torch

        return torch.Generator().manual_seed(seed)
    raise ValueError(f"unknown rng kind {kind!r}")


def seeded_call(fn: Callable[..., Any], kind: str) -> Callable[[Any], Any]:
    """``fn(x, rng=make_rng(kind, seed))`` for an item ``(x, seed)``."""

    def call(pair: Any) -> Any:
        return fn(pair[0], rng=make_rng(kind, pair[1]))

    return call


def dumps(obj: Any) -> bytes:
    """pickle, falling back to cloudpickle for lambdas and local classes."""
    try:
        return pickle.dumps(obj, _PROTOCOL)
    except Exception:  # noqa: BLE001 - retry with cloudpickle, which raises its own clear error
        import cloudpickle

        return cloudpickle.dumps(obj, _PROTOCOL)


def _cloud_dumps(obj: Any) -> bytes:
    # cloudpickle, not pickle, for exceptions: pickle imports the module of a class it saves by
    # reference (e.g. a test module, and with it torch); cloudpickle looks only at sys.modules.
    import cloudpickle

    return cloudpickle.dumps(obj, _PROTOCOL)


def _portable(exc: BaseException) -> BaseException:
    """``exc`` with the worker's traceback as a note, or a stand-in when it cannot travel."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        exc.add_note(f"[datapipes] traceback in worker process {os.getpid()}:\n{text.rstrip()}")
        pickle.loads(_cloud_dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - the exception does not pickle: send what it said
        stand_in = RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
        stand_in.add_note(f"[datapipes] the original exception could not be pickled; traceback in worker "
                          f"process {os.getpid()}:\n{text.rstrip()}")
        return stand_in


def _results_payload(chunk_id: int, seconds: float, out: list[Any], failed: bool) -> bytes:
    try:
        return _cloud_dumps((chunk_id, seconds, out)) if failed else dumps((chunk_id, seconds, out))
    except Exception:  # noqa: BLE001 - find the results that do not pickle and fail only those
        fixed = []
        for ok, value in out:
            try:
                dumps(value)
                fixed.append((ok, value))
            except Exception as e:  # noqa: BLE001
                err = TypeError(f"the result of fn cannot be pickled to return from the worker process: {e}")
                fixed.append((False, err))
        return _cloud_dumps((chunk_id, seconds, fixed))


def main(rfd: int, wfd: int) -> None:
    from multiprocessing.connection import Connection

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rx = Connection(rfd, writable=False)
    tx = Connection(wfd, readable=False)
    setup = pickle.loads(rx.recv_bytes())
    sys.path[:] = setup["sys_path"]
    fn_payload, rng_kind = pickle.loads(rx.recv_bytes())
    fn = pickle.loads(fn_payload)
    if rng_kind is not None:
        fn = seeded_call(fn, rng_kind)
    tx.send_bytes(pickle.dumps(("hello", os.getpid(), "torch" in sys.modules)))
    clock = time.perf_counter
    while True:
        try:
            msg = rx.recv_bytes()
        except (EOFError, OSError):
            return
        if not msg:
            return
        chunk_id, items = pickle.loads(msg)
        out = []
        failed = False
        t = clock()
        for x in items:
            try:
                out.append((True, fn(x)))
            except BaseException as e:  # noqa: BLE001 - reported to the parent with the item
                out.append((False, _portable(e)))
                failed = True
        seconds = clock() - t
        tx.send_bytes(_results_payload(chunk_id, seconds, out, failed))
        msg = items = out = None  # type: ignore[assignment]


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
