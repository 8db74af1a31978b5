"""Stages over strings: ParagraphAggregator [lines_to_paragraphs] joins ``(file name, line)`` pairs
into paragraphs; ShardExpander [shard_expand] expands the brace ranges of shard names.

Names, parameters, defaults and outputs follow torchdata 0.9; the differences are listed in each
docstring. Every ``__iter__`` creates its source's iterator at once, as part of the pass being built
(:mod:`datapipes._runtime.passes`), and hands it to the generator that does the work.

Checkpoint and resume (docs/howto/checkpoint.rst), read when a state is taken at no cost per item:
``lines_to_paragraphs`` keeps the paragraph being gathered; ``shard_expand`` the names of the current
spec not yet yielded.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator, TypeVar, overload

from .._runtime import passes as _pass
from .._engine import abandon
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_callable, require_pipe, stage_label
from ..errors import add_stage_note, call_lines, raised_at

U = TypeVar("U")
V = TypeVar("V")

__all__ = ["ParagraphAggregator", "ShardExpander"]


# -- ParagraphAggregator ---------------------------------------------------------------------------


def _join_lines(lines: list[str]) -> str:
    """torchdata's default joiner: the lines joined by newlines."""
    return "\n".join(lines)


def _paragraphs(pipe: ParagraphAggregator, it: Iterator[Any], run: _pass.FrameRun) -> Iterator[tuple[Any, Any]]:
    joiner = pipe.joiner
    run.started = True
    resume = run.resume
    # The position, read by _paragraph_state: ``n`` (the items read), ``prev`` (the file of the
    # paragraph being gathered), ``lines`` (its lines). Both are updated before a paragraph is yielded.
    n = 0
    prev: Any = None
    lines: list[Any] = []
    if resume is not None:
        if "ended" in resume:
            return
        n, prev, lines = int(resume["next"]), resume.get("file"), list(resume.get("lines", ()))
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
                    yield name, joiner(done)
        if lines:
            done, lines = lines, []
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


_ITEM_LINES = call_lines(_paragraphs, "item")
_JOINER_LINES = call_lines(_paragraphs, "joiner")


def _paragraph_state(*, n: int, prev: Any, lines: list[Any]) -> dict[str, Any]:
    """A ``lines_to_paragraphs`` pass's state: the items read, the file and lines of the paragraph
    being gathered (at most one paragraph's lines)."""
    return {"next": n, "file": prev, "lines": list(lines)}


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

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        run = _pass.FrameRun(_paragraph_state)
        return _pass.track_generator(self, _paragraphs(self, iter(self.source_datapipe), run), run)

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


def _shard_expand(pipe: ShardExpander, it: Iterator[Any], run: _pass.FrameRun) -> Iterator[str]:
    label = stage_label(pipe)
    run.started = True
    n = 0
    try:
        resume = run.resume
        if resume is not None:
            if "ended" in resume:
                return
            n = int(resume["next"])
            if resume.get("rest"):
                n -= 1
                yield from list(resume["rest"])
                n += 1
        for spec in it:
            yield from _shard_names(spec, (label, n, spec))
            n += 1
    except Exception as e:
        if raised_at(e, _SPEC_LINES) and not isinstance(e, ValueError):
            add_stage_note(e, label, n)  # not a str (re.search's TypeError)
        abandon(it)
        raise
    except BaseException:
        abandon(it)
        raise


_SPEC_LINES = call_lines(_shard_expand, "spec")


def _rest_state(*, n: int, yielding_from: Any) -> dict[str, Any]:
    """A pass's state between two outputs of one item: the position of the source's next item and
    the outputs of the current one not yet yielded."""
    rest = [] if yielding_from is None else _pass.remaining(yielding_from)
    return {"next": n + 1, "rest": rest}


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

    def __iter__(self) -> Iterator[str]:
        run = _pass.FrameRun(_rest_state)
        return _pass.track_generator(self, _shard_expand(self, iter(self.source_datapipe), run), run)

    def __len__(self) -> int:
        raise len_unknown(self, "the number of names is known only after iterating", NO_LEN)
