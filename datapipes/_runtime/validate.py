"""Checks of a loaded state: the types and ranges of what a stage takes from it.

A state may come from someone else (a checkpoint passed between jobs), so what a stage's run takes
from it is checked once, as it is loaded, never per item (docs/architecture.rst, "The stage
protocol"). A check raises ``ValueError`` saying which value is wrong and what it must be::

    state['index'] must be an int from 0 to 10, got -3

A run's ``restore`` calls these without knowing its stage; the pass names the stage and the key of
its state around that message (``load_state_dict: IterableWrapper (state['stages']['0:IterableWrapper']):
...``). A caller that knows the stage passes it as ``where``.

>>> check_int({"index": 3}, "index", hi=10)
3
>>> check_int({"index": -3}, "index", hi=10)
Traceback (most recent call last):
...
ValueError: state['index'] must be an int from 0 to 10, got -3
"""

from __future__ import annotations

import random
from typing import Any, Mapping, NoReturn

__all__ = ["check_bool", "check_dict", "check_engine", "check_int", "check_list", "check_loop_state", "check_number",
           "check_rng", "check_str", "invalid", "reason"]

_MISSING: Any = object()


def invalid(message: str, where: str = "") -> NoReturn:
    """Raise the ``ValueError`` of a state that does not fit: ``message``, after ``where`` (the
    stage) when given."""
    raise ValueError(f"load_state_dict: {where}: {message}" if where else message)


def reason(exc: BaseException) -> str:
    """What a run's ``restore`` raised, as the end of a sentence naming its stage: a ``KeyError``
    says which key the state lacks; a message of ours loses its ``load_state_dict:`` lead."""
    if type(exc) is KeyError and exc.args:
        return f"the state has no {exc.args[0]!r}"
    text = str(exc)
    return text.removeprefix("load_state_dict: ") or type(exc).__name__


def _shown(value: Any) -> str:
    return f"{value!r:.100}"


def check_dict(state: Any, what: str = "the state", where: str = "", keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """``state`` itself: a dict with str keys holding every one of ``keys``."""
    if type(state) is not dict:
        invalid(f"{what} must be a dict, got {type(state).__name__}: {_shown(state)}", where)
    for key in state:
        if type(key) is not str:
            invalid(f"{what} must be a dict whose keys are str, got the key {_shown(key)}", where)
    for key in keys:
        if key not in state:
            invalid(f"{what} has no {key!r}", where)
    return state


def _get(state: Mapping[str, Any], key: str, default: Any, where: str) -> Any:
    if type(state) is not dict:
        invalid(f"the state must be a dict, got {type(state).__name__}: {_shown(state)}", where)
    value = state.get(key, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            invalid(f"the state has no {key!r}", where)
        return default
    return value


def check_int(state: Mapping[str, Any], key: str, lo: int | None = 0, hi: int | None = None, *,
              where: str = "", default: Any = _MISSING, optional: bool = False) -> Any:
    """``state[key]``: an int (not a bool) from ``lo`` to ``hi`` (inclusive; ``None``: no bound),
    ``None`` too where ``optional``; ``default`` where the key is absent (if given)."""
    value = _get(state, key, default, where)
    if value is None and optional:
        return None
    if type(value) is not int or (lo is not None and value < lo) or (hi is not None and value > hi):
        if lo is None and hi is None:
            bounds = "an int"
        elif hi is None:
            bounds = f"an int >= {lo}"
        elif lo is None:
            bounds = f"an int <= {hi}"
        else:
            bounds = f"an int from {lo} to {hi}"
        invalid(f"state[{key!r}] must be {bounds}{' or None' if optional else ''}, got {_shown(value)}", where)
    return value


def check_number(state: Mapping[str, Any], key: str, *, where: str = "", default: Any = _MISSING) -> Any:
    """``state[key]``: an int or a float (not a bool)."""
    value = _get(state, key, default, where)
    if type(value) not in (int, float):
        invalid(f"state[{key!r}] must be a number, got {_shown(value)}", where)
    return value


def check_bool(state: Mapping[str, Any], key: str, *, where: str = "", default: Any = _MISSING) -> bool:
    """``state[key]``: a bool."""
    value = _get(state, key, default, where)
    if type(value) is not bool:
        invalid(f"state[{key!r}] must be a bool, got {_shown(value)}", where)
    return value


def check_str(state: Mapping[str, Any], key: str, *, where: str = "", default: Any = _MISSING,
              optional: bool = False, choices: tuple[str, ...] | None = None) -> Any:
    """``state[key]``: a str (one of ``choices`` when given), ``None`` too where ``optional``."""
    value = _get(state, key, default, where)
    if value is None and optional:
        return None
    if type(value) is not str or (choices is not None and value not in choices):
        kind = "a str" if choices is None else f"one of {', '.join(map(repr, choices))}"
        invalid(f"state[{key!r}] must be {kind}{' or None' if optional else ''}, got {_shown(value)}", where)
    return value


def check_list(state: Mapping[str, Any], key: str, max_len: int | None = None, *, where: str = "",
               default: Any = _MISSING, optional: bool = False, limit: str = "") -> Any:
    """``state[key]``: a list (or tuple) of at most ``max_len`` items, ``None`` too where
    ``optional``. ``limit`` names the bound in the message (``"buffer_size=4"``)."""
    value = _get(state, key, default, where)
    if value is None and optional:
        return None
    if type(value) not in (list, tuple):
        invalid(f"state[{key!r}] must be a list{' or None' if optional else ''}, got {_shown(value)}", where)
    if max_len is not None and len(value) > max_len:
        invalid(f"state[{key!r}] holds {len(value)} items, more than {limit or max_len} allows", where)
    return value


def check_rng(state: Mapping[str, Any], key: str = "rng", *, where: str = "") -> Any:
    """``state[key]``: a ``random.Random`` state as plain data (``[version, [625 ints], gauss]``),
    one that ``setstate`` takes."""
    value = _get(state, key, _MISSING, where)
    try:
        if type(value) not in (list, tuple) or len(value) != 3 or type(value[1]) not in (list, tuple):
            raise TypeError("not [version, [625 ints], gauss]")
        if any(type(x) is not int for x in value[1]):
            raise TypeError("an internal value that is not an int")
        random.Random().setstate((value[0], tuple(value[1]), value[2]))
    except (TypeError, ValueError, OverflowError) as e:
        invalid(f"state[{key!r}] is not the state of a random generator ({e})", where)
    return value


def check_engine(state: Mapping[str, Any], *, where: str = "") -> None:
    """The part of a concurrent stage's state that its engine run keeps (``_engine.core.EngineRun``):
    the items pulled, the inputs not yet yielded as ``[position, item]`` pairs, positions rising and
    below the count pulled, and the failures counted under a budget."""
    pulled = check_int(state, "pulled", where=where)
    last = -1
    for pair in check_list(state, "inputs", where=where):
        if (type(pair) not in (list, tuple) or len(pair) != 2 or type(pair[0]) is not int
                or not last < pair[0] < pulled):
            invalid(f"state['inputs'] must hold [position, item] pairs, positions rising from 0 to below "
                    f"{pulled} (the items pulled), got {_shown(pair)}", where)
        last = pair[0]
    check_int(state, "failures", where=where, default=0)


def check_loop_state(state: Any, needs_next: bool = True) -> dict[str, Any]:
    """``state``, checked as the state of a serial stage's loop (``map``/``filter`` under a budget or
    with ``rng=``, ``flatmap``, ``map_batches``, ``unbatch``, ``repeat``, ``shuffled_flatmap``, SPDL's
    ``aggregate``) always has been: a dict whose ``ended`` is True, whose ``next``, ``failures`` and
    ``left`` are ints >= 0, ``rest`` a list and ``seed`` an int or None, where it holds them (a key a
    stage does not read is checked too); and, unless it has ended, holding ``next`` (the position of
    the next item; ``needs_next=False`` where a state may leave it out)."""
    check_dict(state)
    if "ended" in state and state["ended"] is not True:
        invalid(f"state['ended'] must be True, got {state['ended']!r:.100}")
    for key in ("next", "failures", "left"):
        if key in state:
            check_int(state, key)
    if "rest" in state:
        check_list(state, "rest")
    if "seed" in state:
        check_int(state, "seed", None, optional=True)
    if needs_next and "ended" not in state:
        check_int(state, "next")
    return state
