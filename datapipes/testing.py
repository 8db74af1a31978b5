"""A contract checker for pipes: run it on your own pipes as we run it on ours.

:func:`check_datapipe` iterates a pipe several ways and raises :class:`ContractViolation` (an
``AssertionError``) naming the broken rule:

- re-iteration equals the first pass (as a multiset when the graph has an unseeded random stage);
- a pickle round trip yields the same items (lambdas included, through cloudpickle);
- ``len(pipe)``, where defined, equals the number of items yielded; where undefined it raises
  ``TypeError`` (never another type, so ``list(pipe)`` still works);
- ``bool(pipe)`` is true without calling ``len``;
- an iterator closed (or dropped) after one item leaves no thread behind;
- a pass stopped after ``k`` items (the first, the middle, the last) and saved with
  ``it.state_dict()`` resumes exactly in a new pass (``load_state_dict``), or ``state_dict()``
  refuses with a ``TypeError`` (as a stage of your own does that neither declares itself
  stateless nor gives its iterator ``state_dict``/``load_state_dict``); one declared stateless
  that keeps a position of its own fails here;
- with ``build``, an exception raised by the source reaches the consumer as the same object.

:func:`check_resume` checks the checkpoint law: a pass stopped after ``k`` items, saved with
``it.state_dict()`` and resumed by a new pass's ``load_state_dict``, yields exactly what the
uninterrupted pass yields after its first ``k`` items.

>>> from datapipes.iter import IterableWrapper
>>> from datapipes.testing import check_datapipe, check_resume
>>> check_datapipe(IterableWrapper(range(5)).map(lambda x: x + 1), expected=[1, 2, 3, 4, 5])
[1, 2, 3, 4, 5]
>>> check_datapipe(IterableWrapper(range(6)), build=lambda src: src.batch(2))
[0, 1, 2, 3, 4, 5]
>>> check_resume(lambda: IterableWrapper(range(5)).map(lambda x: x + 1))
[1, 2, 3, 4, 5]
"""

from __future__ import annotations

import dataclasses
import gc
import io
import itertools
import pickle
import threading
import time
from collections import Counter
from typing import Any, Callable, Iterable, Sized, cast

from ._runtime import passes as _pass
from ._runtime.traits import traits_of
from ._engine import close_iterator
from .datapipe import IterDataPipe, MapDataPipe
from .graph import traverse
from .iter import IterableWrapper

__all__ = [
    "ContractViolation",
    "check_datapipe",
    "check_resume",
    "items_equal",
    "same_multiset",
    "threads_started_since",
]


class ContractViolation(AssertionError):
    """A pipe broke a rule of the pipe contract; the message names the rule and the pipe."""


class _ProbeError(Exception):
    """Raised by the checker's probe source to see the error come through unchanged."""


def items_equal(a: Any, b: Any) -> bool:
    """Deep equality that understands numpy arrays and torch tensors inside nested containers."""
    if type(a) is not type(b):
        # int vs numpy int and the like compare by value
        try:
            return bool(a == b)
        except Exception:
            return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(items_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(items_equal(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return all(items_equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    mod = type(a).__module__
    if mod == "numpy":
        import numpy as np

        return bool(np.array_equal(a, b))
    if mod == "torch":
        import torch

        return bool(torch.equal(a, b))
    result = a == b
    return result if isinstance(result, bool) else bool(result)


def _freeze(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_freeze(v) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple(sorted(((repr(k), _freeze(v)) for k, v in x.items()))))
    if type(x).__module__ in ("numpy", "torch") and hasattr(x, "shape"):
        return ("array", tuple(x.shape), repr(x.tolist()))
    try:
        hash(x)
        return x
    except TypeError:
        return ("repr", repr(x))


def same_multiset(a: Iterable[Any], b: Iterable[Any]) -> bool:
    """True when ``a`` and ``b`` hold the same items the same number of times, in any order."""
    return Counter(map(_freeze, a)) == Counter(map(_freeze, b))


def _all_equal(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(items_equal(x, y) for x, y in zip(a, b))


def threads_started_since(before: set[threading.Thread], timeout: float = 5.0) -> list[threading.Thread]:
    """Threads alive now that were not in ``before``, after waiting up to ``timeout`` s for them to end."""
    deadline = time.monotonic() + timeout
    while True:
        extra = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not extra or time.monotonic() >= deadline:
            return extra
        for t in extra:
            t.join(timeout=max(0.0, min(0.05, deadline - time.monotonic())))


def _unseeded_random(pipe: Any) -> bool:
    return any(t._is_random and t._seed is None for t in map(traits_of, traverse(pipe)))


def _collect(pipe: Any, limit: int | None) -> list[Any]:
    it = iter(pipe)
    try:
        return list(it if limit is None else itertools.islice(it, limit))
    finally:
        close_iterator(it)


def _probe_source(data: list[Any]) -> IterDataPipe[Any]:
    class _Probe:
        def __init__(self) -> None:
            self.error = _ProbeError("probe error from the source")

        def __iter__(self) -> Any:
            yield from data
            raise self.error

    return IterableWrapper(_Probe())


def check_datapipe(
    pipe: IterDataPipe[Any] | MapDataPipe[Any],
    expected: Iterable[Any] | None = None,
    *,
    ordered: bool | None = None,
    limit: int | None = None,
    check_pickle: bool = True,
    check_close: bool = True,
    check_state: bool = True,
    build: Callable[[IterDataPipe[Any]], IterDataPipe[Any]] | None = None,
    probe_data: Iterable[Any] | None = None,
    timeout: float = 5.0,
) -> list[Any]:
    """Check ``pipe`` against the pipe contract and return the items of its first pass.

    Args:
        pipe: the pipe to check.
        expected: the items the pipe should yield (compared in order, or as a multiset when
            ``ordered`` is false).
        ordered: whether passes must agree in order. ``None``: ordered unless the graph holds an
            unseeded random stage (shuffle, sample, split), whose passes agree as multisets.
        limit: check only the first ``limit`` items (for endless pipes such as ``cycle()``);
            the ``len`` rule is then skipped.
        check_pickle: check the pickle round trip.
        check_close: check that an iterator closed after one item leaves no thread behind.
        check_state: check that passes stopped after ``k`` items resume exactly from their
            ``state_dict()`` (through pickle), or refuse to save with a ``TypeError``. The full
            law at every ``k``, and through ``torch.save``, is :func:`check_resume`'s.
        build: a function building the pipe under test over a given source pipe. The checker
            feeds it a source that yields ``probe_data`` then raises, and checks that the very same
            exception object reaches the consumer.
        probe_data: the items the probe source yields before raising (default ``range(4)``).
        timeout: seconds to wait for threads to end after a close.

    Raises:
        ContractViolation: a rule was broken; the message says which.
    """
    name = repr(pipe)
    if ordered is None:
        ordered = not _unseeded_random(pipe)

    def agree(a: list[Any], b: list[Any]) -> bool:
        return _all_equal(a, b) if ordered else same_multiset(a, b)

    if bool(pipe) is not True:
        raise ContractViolation(f"{name}: bool(pipe) must be True")

    first = _collect(pipe, limit)
    if expected is not None:
        want = list(expected)
        if not agree(first, want):
            raise ContractViolation(f"{name}: yielded {first!r:.500}, expected {want!r:.500}")

    if isinstance(pipe, IterDataPipe):
        it = iter(pipe)
        try:
            lazy = _pass.unbuilt(it) if isinstance(it, _pass.PassIterator) else []
        finally:
            close_iterator(it)
        if lazy:
            raise ContractViolation(
                f"{name}: {[type(s).__name__ for s in lazy]} did not create the iterators of their sources when "
                f"iter() was called: a stage of this package creates its upstream iterators in __iter__, as "
                f"part of the pass"
            )

    second = _collect(pipe, limit)
    if not agree(first, second):
        raise ContractViolation(
            f"{name}: a second pass differs from the first ({'in order' if ordered else 'as a multiset'}): "
            f"{first!r:.300} vs {second!r:.300}"
        )

    if limit is None:
        try:
            n = len(cast(Sized, pipe))  # a pipe without a length raises TypeError here, as it may
        except TypeError:
            pass
        except Exception as e:  # noqa: BLE001 - any other type is the violation
            raise ContractViolation(f"{name}: len() must return an int or raise TypeError, raised {e!r}") from e
        else:
            if n != len(first):
                raise ContractViolation(f"{name}: len() is {n} but a pass yielded {len(first)} items")

    if check_pickle:
        try:
            clone = pickle.loads(pickle.dumps(pipe))
        except Exception as e:
            raise ContractViolation(f"{name}: pickle round trip failed: {e!r}") from e
        again = _collect(clone, limit)
        if not agree(first, again):
            raise ContractViolation(f"{name}: the unpickled pipe yields {again!r:.300}, not {first!r:.300}")

    if check_state and isinstance(pipe, IterDataPipe):
        _check_state(pipe, first, limit, ordered, name)

    if check_close:
        before = set(threading.enumerate())
        it = iter(pipe)
        next(it, None)
        close = getattr(it, "close", None)
        if close is not None:
            close()
        del it
        gc.collect()
        left = threads_started_since(before, timeout)
        if left:
            raise ContractViolation(f"{name}: threads left running after close: {[t.name for t in left]}")

    if build is not None:
        data = list(range(4) if probe_data is None else probe_data)
        probe = _probe_source(data)
        error = probe.iterable.error  # type: ignore[attr-defined]
        built = build(probe)
        try:
            for _ in built:
                pass
        except _ProbeError as e:
            if e is not error:
                raise ContractViolation(f"{name}: the source's exception was replaced by an equal copy") from e
        except BaseException as e:
            raise ContractViolation(f"{name}: the source's _ProbeError came out as {type(e).__name__}: {e!r}") from e
        else:
            raise ContractViolation(f"{name}: the source's exception was swallowed")

    return first


def _check_state(pipe: IterDataPipe[Any], first: list[Any], limit: int | None, ordered: bool, name: str) -> None:
    """check_datapipe's resume rule, at the first, the middle and the last item of ``first``."""
    n = len(first)
    for k in sorted({min(1, n), n // 2, max(n - 1, 0)}):
        it: Any = iter(pipe)
        try:
            head = list(itertools.islice(it, k))
            try:
                state = _pickle_round_trip(it.state_dict())
            except TypeError:
                return  # the pipe refuses to save a position it could not resume: allowed
        finally:
            close_iterator(it)
        again: Any = iter(pipe)
        try:
            again.load_state_dict(state)
            rest = list(again if limit is None else itertools.islice(again, limit - k))
        finally:
            close_iterator(again)
        if (_all_equal(head + rest, first) if ordered else same_multiset(head + rest, first)):
            continue
        if not ordered or _all_equal(head, first[:k]):
            raise ContractViolation(
                f"{name}: a pass stopped after {k} of {n} items and resumed from its state_dict() yields "
                f"{rest!r:.300}, the uninterrupted pass {first[k:]!r:.300} after them. A stage of your own that "
                f"keeps a position (a counter, a buffer, an open file) gives its iterator state_dict() and "
                f"load_state_dict() (docs/howto/checkpoint.rst, 'Your own stages')"
            )


def _resume_points(n: int) -> list[int]:
    return sorted({0, min(1, n), n // 2, max(n - 1, 0), n})


def _pickle_round_trip(state: Any) -> Any:
    return pickle.loads(pickle.dumps(state))


def _torch_round_trip(state: Any) -> Any:
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


_ROUND_TRIPS = {"pickle": _pickle_round_trip, "torch": _torch_round_trip}


def _multiset_difference(a: list[Any], b: list[Any]) -> list[Any]:
    """The items of ``a`` that ``b`` lacks (one per missing occurrence)."""
    want = Counter(map(_freeze, b))
    out = []
    for x in a:
        key = _freeze(x)
        if want[key]:
            want[key] -= 1
        else:
            out.append(x)
    return out


def check_resume(
    build: Callable[[], IterDataPipe[Any]],
    ks: Iterable[int] | Callable[[int], Iterable[int]] | None = None,
    *,
    ordered: bool = True,
    through: str = "pickle",
    convert: Callable[[Any], Any] | None = None,
) -> list[Any]:
    """Check that passes of ``build()`` stopped after ``k`` items resume exactly; return the items of
    the uninterrupted pass.

    For each ``k``, a pass of ``build()`` is stopped after its first ``k`` items, its
    ``it.state_dict()`` goes through ``pickle`` (or ``torch.save``/``torch.load``) and is loaded
    into a new pass of a new ``build()`` before its first ``next()``; the first ``k`` items and what
    the resumed pass yields must make up the uninterrupted pass.

    Args:
        build: builds the pipe under test, the same way at each call (a new graph for every pass,
            as a process that resumes a run builds its pipe anew).
        ks: the numbers of items after which to stop: ints from 0 to the length of the
            uninterrupted pass, or a function of that length returning them. Default: 0, 1, the
            middle, the length minus one and the length.
        ordered: whether the first ``k`` items followed by the resumed ones must equal the
            uninterrupted pass in order; when false (a stage yielding in completion order), they
            must hold the same items the same number of times: nothing lost, nothing repeated.
        through: ``"pickle"`` or ``"torch"``: how the state travels between the two passes.
        convert: a function applied to each item as it is taken, before the pass goes on (read a
            stream before the pass that opened it is closed); the items compared are its results.

    Returns:
        The items of the uninterrupted pass (converted).

    Raises:
        ContractViolation: the items around a resume differ from the uninterrupted pass; the
            message names the pipe, ``k`` and what differs.
        ValueError: ``through`` is not ``"pickle"`` or ``"torch"``, or a ``k`` is out of range.

    An exception raised by the pipe (a stage that cannot save its position raises ``TypeError``)
    comes through unchanged, with a note naming the pipe and ``k``.

    >>> from datapipes.iter import IterableWrapper
    >>> from datapipes.testing import check_resume
    >>> check_resume(lambda: IterableWrapper(range(7)).batch(3), ks=range(4), through="torch")
    [[0, 1, 2], [3, 4, 5], [6]]

    See also:
        :func:`check_datapipe`, the contract every pipe keeps.
    """
    if through not in _ROUND_TRIPS:
        raise ValueError(f"through must be 'pickle' or 'torch', got {through!r}")
    round_trip = _ROUND_TRIPS[through]
    take: Callable[[Any], Any] = (lambda x: x) if convert is None else convert

    pipe = build()
    name = repr(pipe)
    full = [take(x) for x in pipe]
    n = len(full)
    points = _resume_points(n) if ks is None else list(ks(n) if callable(ks) else ks)
    for k in points:
        if not isinstance(k, int) or not 0 <= k <= n:
            raise ValueError(f"ks: {k!r} is not an int from 0 to {n}, the number of items {name} yields")

    for k in points:
        try:
            it: Any = iter(build())
            try:
                head = [take(x) for x in itertools.islice(it, k)]
                state = round_trip(it.state_dict())
            finally:
                close_iterator(it)
            again: Any = iter(build())
            try:
                again.load_state_dict(state)
                rest = [take(x) for x in again]
            finally:
                close_iterator(again)
        except Exception as e:
            e.add_note(f"check_resume: {name}, a pass stopped after {k} items and resumed through {through}")
            raise
        where = f"{name}: a pass stopped after {k} of {n} items and resumed through {through}"
        if len(head) < k:
            raise ContractViolation(
                f"{name}: a pass to stop after {k} items ended after {len(head)}, the first after {n}"
            )
        if ordered:
            if not _all_equal(head, full[:k]):
                raise ContractViolation(
                    f"{where}: its first {k} items {head!r:.300} differ from the uninterrupted pass's "
                    f"{full[:k]!r:.300} (the pipe does not repeat its passes)"
                )
            if not _all_equal(rest, full[k:]):
                raise ContractViolation(
                    f"{where}: yields {rest!r:.300} after them, the uninterrupted pass {full[k:]!r:.300}"
                )
        elif not same_multiset(head + rest, full):
            lost = _multiset_difference(full, head + rest)
            extra = _multiset_difference(head + rest, full)
            raise ContractViolation(
                f"{where}: {len(lost)} items lost {lost!r:.200}, {len(extra)} repeated or new {extra!r:.200}"
            )
    return full
