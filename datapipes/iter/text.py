"""Stages over strings: ParagraphAggregator [lines_to_paragraphs] joins ``(file name, line)`` pairs
into paragraphs; ShardExpander [shard_expand] expands the brace ranges of shard names.

Names, parameters, defaults and outputs follow torchdata 0.9; the differences are listed in each
docstring. Every ``_open(ctx)`` creates its source's iterator at once (``ctx.open``), as part of the
pass it is handed (:mod:`datapipes._runtime.passes`), and hands it to the generator that does the work.

Checkpoint and resume (docs/howto/checkpoint.rst): each pass records a run that its loop writes
to, never once per line read: ``lines_to_paragraphs`` writes the paragraph being gathered before it
yields one; ``shard_expand`` the iterator over a spec's names as it takes the spec, and its state
lists the names not yet yielded from a copy of that iterator.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator, TypeVar, overload

from .._engine import abandon
from .._engine.lifecycle import Resumable
from .._positions import remaining
from .._runtime.passes import Pass
from .._runtime.validate import check_dict, check_int, check_list, invalid
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_callable, require_pipe, stage_label
from ..errors import add_stage_note, call_lines, raised_at

U = TypeVar("U")
V = TypeVar("V")

__all__ = ["ParagraphAggregator", "ShardExpander"]


def _check_common(state: dict[str, Any]) -> None:
    """The checks every state of these stages shares: a dict, holding ``ended`` (True) or ``next``
    (the source's next item, an int >= 0)."""
    check_dict(state)
    if "ended" in state and state["ended"] is not True:
        invalid(f"state['ended'] must be True, got {state['ended']!r:.100}")
    if "next" in state or "ended" not in state:
        check_int(state, "next")


# -- ParagraphAggregator ---------------------------------------------------------------------------


def _join_lines(lines: list[str]) -> str:
    """torchdata's default joiner: the lines joined by newlines."""
    return "\n".join(lines)


class _ParagraphRun(Resumable):
    """The position of a ``lines_to_paragraphs`` pass: the items read, the file of the paragraph
    being gathered and its lines (at most one paragraph's). The loop writes them before each
    ``yield`` (once per paragraph); a pass that has ended saves ``{"ended": True}``."""

    __slots__ = ("loaded", "ended", "n", "file", "lines")

    def __init__(self) -> None:
        super().__init__()
        self.loaded: dict[str, Any] | None = None  # the state loaded, saved as it is until the pass starts
        self.ended = False
        self.n = 0
        self.file: Any = None
        self.lines: list[Any] = []

    def state(self) -> dict[str, Any]:
        if not self.started:
            return {"next": 0} if self.loaded is None else dict(self.loaded)
        if self.ended:
            return {"ended": True}
        return {"next": self.n, "file": self.file, "lines": list(self.lines)}

    def load(self, state: dict[str, Any]) -> None:
        _check_common(state)
        self.loaded, self.ended = state, "ended" in state
        if not self.ended:
            self.n, self.file = state["next"], state.get("file")
            self.lines = list(check_list(state, "lines", default=[]))


def _paragraphs(pipe: ParagraphAggregator, it: Iterator[Any], run: _ParagraphRun) -> Iterator[tuple[Any, Any]]:
    joiner = pipe.joiner
    run.started = True
    if run.ended:
        return
    # ``n`` (the items read), ``prev`` (the file of the paragraph being gathered) and ``lines`` (its
    # lines) are written to ``run`` before each paragraph is yielded.
    n, prev, lines = run.n, run.file, run.lines
    try:
        for item in it:
            filename, line = item
            n += 1
            if prev is None:
                prev = filename
            if line and prev == filename:
                lines.append(line)
            else:  # a new file, or an empty line: the paragraph ends
                done, name = lines, prev
                lines = [line] if line else []
                prev = filename
                if done:
                    run.n, run.file, run.lines = n, prev, lines
                    yield name, joiner(done)
        if lines:
            done, lines = lines, []
            run.n, run.file, run.lines = n, prev, lines
            yield prev, joiner(done)
    except Exception as e:
        if raised_at(e, _ITEM_LINES):
            add_stage_note(e, stage_label(pipe), n)
            e.add_note(f"{stage_label(pipe)}: each item must be a (file name, line) pair")
        elif raised_at(e, _JOINER_LINES):
            add_stage_note(e, stage_label(pipe))
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise
    finally:
        run.ended = True


_ITEM_LINES = call_lines(_paragraphs, "item")
_JOINER_LINES = call_lines(_paragraphs, "joiner")


@functional_datapipe("lines_to_paragraphs")
class ParagraphAggregator(IterDataPipe[tuple[Any, Any]]):
    """Join consecutive lines of the same file into paragraphs
    (functional name: ``lines_to_paragraphs``).

    Items are ``(file name, line)`` pairs, as ``readlines`` yields them. Consecutive non-empty lines
    of one file make a paragraph; a paragraph ends at an empty line or where the file name changes.

    Args:
        source_datapipe: the source pipe, yielding ``(file name, line)`` pairs.
        joiner: a function joining a paragraph's lines (a list); default: ``"\\n".join``.

    Yields:
        ``(file name, joiner(lines))`` for each paragraph, in order.

    Raises:
        Whatever ``joiner`` raises, as the same object, with a note naming the stage; an item that
        is not a pair raises Python's unpacking error with notes naming the stage and the item.

    ``len()`` raises ``TypeError``: the number of paragraphs is known only after iterating.

    Checkpoint: the state holds the file name and lines of the paragraph being gathered.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> lines = IterableWrapper([("f1", "Line1"), ("f1", "Line2"), ("f2", "Line2,1"), ("f2", "Line2,2"),
        ...                          ("f2", ""), ("f2", "Line2,3")])
        >>> list(lines.lines_to_paragraphs(joiner=lambda ls: " ".join(ls)))
        [('f1', 'Line1 Line2'), ('f2', 'Line2,1 Line2,2'), ('f2', 'Line2,3')]

    See also: :class:`~datapipes.iter.LineReader`.
    """

    _saves = "the file name and the lines of the paragraph being gathered"

    _repr_fields = ("joiner",)

    @overload
    def __init__(self: IterDataPipe[tuple[V, str]], source_datapipe: IterDataPipe[tuple[V, str]]) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[tuple[V, U]],
        source_datapipe: IterDataPipe[tuple[V, Any]],
        joiner: Callable[[list[Any]], U] = ...,
    ) -> None: ...
    def __init__(
        self, source_datapipe: IterDataPipe[tuple[Any, Any]], joiner: Callable[[list[Any]], Any] = _join_lines
    ) -> None:
        require_pipe(source_datapipe, "ParagraphAggregator", "source_datapipe")
        require_callable(joiner, "ParagraphAggregator", "joiner")
        self.source_datapipe = source_datapipe
        self.joiner = joiner

    def _open(self, ctx: Pass) -> Iterator[tuple[Any, Any]]:
        it = ctx.open(self.source_datapipe)
        run = _ParagraphRun()
        ctx.track(self, run)
        return _paragraphs(self, it, run)

    def __len__(self) -> int:
        raise len_unknown(self, "the number of paragraphs is known only after iterating", NO_LEN)


# -- ShardExpander ---------------------------------------------------------------------------------

_RANGE = re.compile(r"\{([0-9]+)\.\.([0-9]+)\}")


def _shard_names(spec: str, item: tuple[str, int, str]) -> list[str]:
    """The names ``spec`` expands to: each ``{lo..hi}`` range (both ends included) in turn, the
    first one outermost; ``lo`` and ``hi`` of the same width with a leading 0 pad to that width.
    ``item``: the stage's label, the item's position and the item, for the messages."""
    m = _RANGE.search(spec)
    if m is None:
        return [spec]
    rest = _shard_names(spec[m.end():], item)
    low, high = m.group(1), m.group(2)
    if len(low) == len(high) and low.startswith("0"):
        width = len(high)
    elif len(low) <= len(high):
        if low.startswith("0") and low != "0":
            raise ValueError(f"{_where(item)}: in {m.group(0)!r}: shard_expand: low bound must not start with 0 if "
                             "low bound is shorter")
        width = 0
    else:
        raise ValueError(f"{_where(item)}: in {m.group(0)!r}: shard_expand: low bound must be shorter than high bound")
    lo, hi = int(low), int(high)
    if lo >= hi:
        raise ValueError(f"{_where(item)}: shard_expand: bad range in in shard spec {spec}.")
    prefix = spec[:m.start()]
    return [f"{prefix}{str(i).zfill(width)}{r}" for i in range(lo, hi + 1) for r in rest]


def _where(item: tuple[str, int, str]) -> str:
    label, n, spec = item
    return f"{label}: item {n} {spec!r:.200}"


class _ExpandRun(Resumable):
    """The position of a ``shard_expand`` pass: the source's item being expanded and the iterator
    over its names, written by the loop once per item read (one store); the state holds the
    position of the source's next item and the names not yet yielded (a copy of the iterator lists
    them). A pass that has ended saves ``{"ended": True}``."""

    __slots__ = ("loaded", "ended", "n", "rest", "current")

    def __init__(self) -> None:
        super().__init__()
        self.loaded: dict[str, Any] | None = None  # the state loaded, saved as it is until the pass starts
        self.ended = False
        self.n = 0  # the source's next item, as the pass starts
        self.rest: list[Any] = []  # the names a resumed pass yields first
        self.current: tuple[int, Iterator[str]] = (-1, iter(()))  # (the item, the iterator over its names)

    def state(self) -> dict[str, Any]:
        if not self.started:
            return {"next": 0} if self.loaded is None else dict(self.loaded)
        if self.ended:
            return {"ended": True}
        n, names = self.current
        return {"next": n + 1, "rest": remaining(names)}

    def load(self, state: dict[str, Any]) -> None:
        _check_common(state)
        rest = check_list(state, "rest", default=[])
        self.loaded, self.ended = state, "ended" in state
        if not self.ended:
            self.n, self.rest = state["next"], list(rest)


def _shard_expand(pipe: ShardExpander, it: Iterator[Any], run: _ExpandRun) -> Iterator[str]:
    label = stage_label(pipe)
    run.started = True
    n = run.n
    try:
        if run.ended:
            return
        if run.rest:
            n -= 1
            names = iter(run.rest)
            run.current = n, names
            yield from names
            n += 1
        for spec in it:
            names = iter(_shard_names(spec, (label, n, spec)))
            run.current = n, names
            yield from names
            n += 1
    except Exception as e:
        if raised_at(e, _SPEC_LINES) and not isinstance(e, ValueError):
            add_stage_note(e, label, n)  # not a str (re.search's TypeError)
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise
    finally:
        run.ended = True


_SPEC_LINES = call_lines(_shard_expand, "spec")


@functional_datapipe("shard_expand")
class ShardExpander(IterDataPipe[str]):
    """Expand shell-style brace ranges in shard names: ``"data-{000..009}.tar"`` gives the ten
    names ``data-000.tar`` to ``data-009.tar`` (functional name: ``shard_expand``).

    Args:
        source_datapipe: the source pipe, yielding shard specs (strings).

    Yields:
        The names of each spec in order: both ends of a range included, several ranges expanded
        as nested loops (the first outermost). When both ends have the same width and the low one
        starts with 0, the numbers are zero-padded to that width. A spec without a range is
        yielded as it is; only ``{digits..digits}`` counts as a range.

    Raises:
        ValueError: a range whose low end is not below its high end, whose low end is longer than
            its high end, or that starts with 0 and is shorter (torchdata's messages kept at the end,
            after the stage, the item's position and spec).

    ``len()`` raises ``TypeError``: the number of names is known only after iterating.

    Checkpoint: the state holds the names of the current spec not yet yielded.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(["ds-{00..05}.tar"]).shard_expand())
        ['ds-00.tar', 'ds-01.tar', 'ds-02.tar', 'ds-03.tar', 'ds-04.tar', 'ds-05.tar']
        >>> list(IterableWrapper(["{a,b}-{1..2}-{8..10}"]).shard_expand())
        ['{a,b}-1-8', '{a,b}-1-9', '{a,b}-1-10', '{a,b}-2-8', '{a,b}-2-9', '{a,b}-2-10']

    See also: :class:`~datapipes.iter.FileLister`, :class:`~datapipes.iter.FSSpecFileLister`.
    """

    _saves = "the names of the current pattern not yet yielded"

    def __init__(self, source_datapipe: IterDataPipe[str]) -> None:
        require_pipe(source_datapipe, "ShardExpander", "source_datapipe")
        self.source_datapipe = source_datapipe

    def _open(self, ctx: Pass) -> Iterator[str]:
        it = ctx.open(self.source_datapipe)
        run = _ExpandRun()
        ctx.track(self, run)
        return _shard_expand(self, it, run)

    def __len__(self) -> int:
        raise len_unknown(self, "the number of names is known only after iterating", NO_LEN)
