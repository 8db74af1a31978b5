"""Streams inside a pass state: saved as plain data, opened again when the state is loaded.

A stage's state may hold items (a concurrent map's inputs in flight, prefetched items, a shuffle
buffer, a fork's shared buffer), and an item may hold a stream: ``open_files()`` yields
``(path, stream)`` pairs. An open file cannot be written by ``pickle`` or ``torch.save``, and an
item in flight may have had its stream read already by the stage's function. So a pass state saves
each stream found in its stages' states *as it started*:

- a stream an opener handed out (``open_files``, ``open_files_by_fsspec``, ``read_from_http``,
  ``load_files_by_s3``, the decompressors after one of them) by the place of that opener in the
  graph, the path and the item's position: loading the state opens it again through the same stage
  of the new pass (same mode, encoding, storage options);
- an in-memory stream (``io.BytesIO``, ``io.StringIO``, an archive member, a decompressor over one)
  by its contents;
- any other stream makes ``state_dict()`` raise ``TypeError`` naming the stage that holds it.

A loaded stream is at its start. A state may come from someone else, so the saved form of a
stream is checked before anything is opened (:func:`prepare`): its shape, the stage it names (one
of this pass's openers) and its path, which must be one that opener's source yields: a resumed
opener opens only those, never a file or URL named by the state alone.

Which streams are known, how they are copied, checked and opened again is the business of the
package's stream stages: :mod:`datapipes.iter._readers` registers a :class:`StreamCodec` here when
it is imported. This module only walks the states (dicts, lists and tuples, 32 levels deep) and
copies a container only where something in it changed.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Callable, Protocol

__all__ = ["MARK", "StreamCodec", "freeze", "prepare", "register", "thaw"]

#: the key of the one-entry dict that stands for a saved stream inside a state
MARK = "datapipes.stream/1"

_PLAIN = frozenset((int, float, str, bytes, bool, type(None), complex))
_SEQUENCES = frozenset((list, tuple))
_DEPTH = 32


class StreamCodec(Protocol):
    def freeze(self, value: Any, key_of: Callable[[Any], str | None], where: str) -> Any:
        """``value`` itself when it is not a stream, else its saved form (plain data, without the
        mark: :func:`freeze` adds it). ``key_of(stage)``: the key of a stage of this pass, or
        ``None``. ``TypeError`` naming ``where`` for a stream that can be neither opened again nor
        copied."""

    def thaw(self, saved: Any, stage_at: Callable[[str], Any]) -> Any:
        """The stream ``saved`` stands for, at its start; ``stage_at(key)``: the stage of the new
        pass at that key. ``ValueError`` for a saved form that does not fit this pass."""

    def prepare(self, saved: list[tuple[str, Any]], stage_at: Callable[[str], Any], pass_: Any) -> None:
        """Check the saved forms ``saved`` (``(where, saved form)`` pairs: ``where`` names the stage
        whose state holds it) before any is opened, for the pass ``pass_``: ``ValueError`` naming
        ``where`` for one that :meth:`thaw` would refuse."""


_codec: list[StreamCodec] = []


def register(codec: StreamCodec) -> None:
    """Install the codec of the package's streams (once; the last registered wins)."""
    _codec[:] = [codec]


def _rebuilt(value: Any, items: list[Any]) -> Any:
    """A container of ``value``'s type holding ``items``."""
    kind = type(value)
    if kind is list:
        return items
    if kind is tuple:
        return tuple(items)
    if isinstance(value, tuple) and hasattr(kind, "_make"):  # a namedtuple
        return kind._make(items)
    try:
        return kind(items)  # a list or tuple subclass (DataChunk, ...)
    except Exception:  # noqa: BLE001 - a subclass with another constructor: plain container then
        return list(items) if isinstance(value, list) else tuple(items)


def _plain_items(items: list[Any] | tuple[Any, ...]) -> bool:
    """Whether ``items`` holds only plain values, or only lists and tuples of plain values (a buffer
    of paths, of ``(path, label)`` pairs): scanned in C, no Python call per item."""
    kinds = set(map(type, items))
    if _PLAIN.issuperset(kinds):
        return True
    if _SEQUENCES.issuperset(kinds - _PLAIN) and _PLAIN.isdisjoint(kinds):
        return _PLAIN.issuperset(map(type, chain.from_iterable(items)))
    return False


def _walk(value: Any, leaf: Callable[[Any], Any], node: Callable[[dict[Any, Any]], Any] | None, depth: int) -> Any:
    kind = type(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, dict):
        if node is not None and len(value) == 1 and MARK in value:
            return node(value)
        if depth >= _DEPTH or _PLAIN.issuperset(map(type, value.values())):  # the scan runs in C
            return value
        out: dict[Any, Any] | None = None
        for k, v in value.items():
            w = _walk(v, leaf, node, depth + 1)
            if w is not v:
                if out is None:
                    out = dict(value)
                out[k] = w
        if out is None:
            return value
        if kind is not dict:
            try:
                return kind(out)
            except Exception:  # noqa: BLE001 - a dict subclass with another constructor
                return out
        return out
    if isinstance(value, (list, tuple)):
        if depth >= _DEPTH or _plain_items(value):
            return value
        changed: list[Any] | None = None
        for i, v in enumerate(value):
            w = _walk(v, leaf, node, depth + 1)
            if w is not v and changed is None:
                changed = list(value[:i])
            if changed is not None:
                changed.append(w)
        return value if changed is None else _rebuilt(value, changed)
    return leaf(value)


def freeze(state: Any, key_of: Callable[[Any], str | None], where: str) -> Any:
    """``state`` with every stream in it replaced by its saved form (``state`` itself when it holds
    none); ``where`` names the stage whose state it is, for the ``TypeError`` of a stream that cannot
    be saved."""
    if not _codec:
        return state
    codec = _codec[0]

    def leaf(value: Any) -> Any:
        saved = codec.freeze(value, key_of, where)
        return value if saved is value else {MARK: saved}

    return _walk(state, leaf, None, 0)


def thaw(state: Any, stage_at: Callable[[str], Any]) -> Any:
    """``state`` with every saved stream in it opened again (``state`` itself when it holds none);
    the state given is not changed."""
    if not _codec:
        return state
    codec = _codec[0]
    return _walk(state, lambda v: v, lambda marked: codec.thaw(marked[MARK], stage_at), 0)


def prepare(states: list[tuple[str, Any]], stage_at: Callable[[str], Any], pass_: Any) -> None:
    """Check every saved stream in ``states`` (``(where, state)`` pairs, ``where`` naming the stage
    whose state it is) before :func:`thaw` opens any, for the pass ``pass_`` loading them (see
    :meth:`StreamCodec.prepare`)."""
    if not _codec:
        return
    found: list[tuple[str, Any]] = []
    for where, state in states:
        def node(marked: dict[Any, Any], where: str = where) -> Any:
            found.append((where, marked[MARK]))
            return marked

        _walk(state, lambda v: v, node, 0)
    if found:
        _codec[0].prepare(found, stage_at, pass_)
