"""torch's readers of ``(path, stream)`` pairs: RoutedDecoder [routed_decode], which decodes each
file by its extension through :class:`datapipes.utils.decoder.Decoder`, and StreamReader
[read_from_stream], which reads streams in chunks.

**Checkpoints** (``it.state_dict()``). ``routed_decode`` keeps no position (one item out per item
in). ``read_from_stream`` stopped inside a stream saves its path and the bytes (or characters) read;
the resumed pass opens that file again through the opener upstream (``open_files``, ...; an
in-memory stream, ``io.BytesIO`` or ``io.StringIO``, is copied into the state instead), skips what
was read, and goes on. A stream that can be neither opened again nor copied makes ``state_dict()``
raise ``TypeError`` naming the stage.

``routed_decode`` unpickles nothing unless asked by name (``allow_pickle=True``): a ``.pyd`` or
``.pickle`` file from data you did not write could run code (see :mod:`datapipes.utils.decoder`).

>>> import io
>>> from datapipes.iter import IterableWrapper
>>> files = IterableWrapper([("a.json", io.BytesIO(b'{"x": 1}')), ("b.txt", io.BytesIO(b"hi"))])
>>> list(files.routed_decode())
[('a.json', {'x': 1}), ('b.txt', 'hi')]
"""

from __future__ import annotations

import io
from itertools import chain
from typing import Any, Callable, Iterable, Iterator

from .._checks import require_bool
from .._runtime.passes import Pass
from .._runtime.validate import check_dict, check_int, invalid
from .._engine import abandon
from .._engine import close_iterator as _close
from .._engine.lifecycle import Resumable
from ..datapipe import NO_LEN, IterDataPipe, functional_datapipe, len_unknown, require_callable, require_int, require_pipe, source_len, stage_label
from ..errors import add_stage_note
from ..utils.decoder import Decoder, basichandlers, extension_extract_fn, imagehandler
from ._readers import _from_memory, _inner, _memory_copy, _pair, _reopener
from .util import IterableWrapper

__all__ = ["RoutedDecoder", "StreamReader"]


# -- RoutedDecoder ---------------------------------------------------------------------------------


def _as_pipe(datapipe: Any, stage: str, name: str) -> IterDataPipe[Any]:
    """``datapipe`` itself, or a plain iterable of items wrapped as torch's ``Iterable`` parameters
    take it: ``IterableWrapper(datapipe, deepcopy=False)`` (the streams are the caller's own)."""
    if isinstance(datapipe, IterDataPipe):
        return datapipe
    if isinstance(datapipe, (str, bytes)) or not (hasattr(type(datapipe), "__iter__") or hasattr(type(datapipe), "__getitem__")):
        raise TypeError(
            f"{stage}: {name} must be an IterDataPipe or an iterable of (path, data) pairs, got {type(datapipe).__name__}"
        )
    return IterableWrapper(datapipe, deepcopy=False)


def _routed(pipe: RoutedDecoder, it: Iterator[Any], decode: Callable[[Any, Any], Any]) -> Iterator[tuple[Any, Any]]:
    stage = stage_label(pipe)
    n = 0
    try:
        for item in it:
            path, data = _pair(item, stage, n)
            try:
                value = decode(path, data)
            except Exception as e:
                add_stage_note(e, stage, n, f"file {path!r}, item")
                raise
            yield path, value
            n += 1
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise


@functional_datapipe("routed_decode")
class RoutedDecoder(IterDataPipe[tuple[str, Any]]):
    """Decode the file of each ``(path, stream)`` pair by its extension and yield ``(path, decoded)``
    (functional name: ``routed_decode``).

    Args:
        datapipe: a pipe of ``(path, data)`` pairs; ``data`` a binary stream (read to its end and
            closed) or bytes. Any other iterable of pairs (a list, ...) is taken as torch's is:
            wrapped in ``IterableWrapper(datapipe, deepcopy=False)`` (a generator then gives one
            pass only).
        handlers: the decoding handlers (see :mod:`datapipes.utils.decoder`), the first one that
            returns something other than ``None`` winning. None given: ``basichandlers`` then
            ``imagehandler("torch")`` (text, numbers, JSON, ``.pt`` weights, pickles with
            ``allow_pickle=True``; images as float ``(C, H, W)`` tensors).
        key_fn: what the handlers are given of each path; default: its extension without the dot.
            Another ``key_fn`` needs handlers of its own (the default ones look at extensions).
        allow_pickle: let ``basichandlers`` (among the default handlers, or among yours) unpickle
            ``.pyd``/``.pickle`` files and read ``.pt`` files whole (``weights_only=False``).
            ``False`` by default, as ``numpy.load``'s: unpickling runs whatever code the file's
            author chose, so a shard from a shared bucket could run code on this machine. Turn it
            on only for data you trust. (torch's ``RoutedDecoder`` unpickles unasked.)

    Yields:
        ``(path, decoded)``: the handlers' result, or the bytes themselves when no handler took
        them. A path whose extension no handler knows passes its bytes through.

    Raises:
        Whatever a handler or reading raises (``UnicodeDecodeError``, ``json.JSONDecodeError``, an
        image Pillow cannot read, ...), as the same object with a note naming the stage and the file.
        :class:`~datapipes.utils.decoder.PickleRefused` (a ``ValueError``): a pickle without
        ``allow_pickle=True``. TypeError: an item is not a ``(path, data)`` pair.

    ``len()`` is the source's length. Unlike torch's (deprecated there since 1.12) it warns nothing.

    Example:
        >>> import io, pickle
        >>> from datapipes.iter import IterableWrapper
        >>> files = IterableWrapper([("n.cls", io.BytesIO(b"3")), ("p.pyd", io.BytesIO(pickle.dumps([1, 2])))])
        >>> list(files.routed_decode(allow_pickle=True))  # files we made ourselves: trusted
        [('n.cls', 3), ('p.pyd', [1, 2])]
        >>> upper = lambda ext, data: data.decode().upper() if ext == "txt" else None
        >>> list(IterableWrapper([("a.txt", b"hi")]).routed_decode(upper))
        [('a.txt', 'HI')]

    See also: :class:`datapipes.utils.decoder.Decoder`, :class:`~datapipes.iter.ImageDecoder`.
    """

    _saves = "nothing: at a boundary their position is their source's"

    _stateless = True  # one item out per item in: its position is its source's

    def __init__(
        self,
        datapipe: Iterable[tuple[str, Any]],
        *handlers: Callable[[str, Any], Any],
        key_fn: Callable[[Any], Any] = extension_extract_fn,
        allow_pickle: bool = False,
    ) -> None:
        stage = "RoutedDecoder"
        datapipe = _as_pipe(datapipe, stage, "datapipe")
        for k, h in enumerate(handlers):
            require_callable(h, stage, f"handlers[{k}]")
        require_callable(key_fn, stage, "key_fn")
        require_bool(allow_pickle, stage, "allow_pickle")
        if not handlers:
            handlers = (basichandlers, imagehandler("torch"))
        self.datapipe = datapipe
        self.decoder = Decoder(*handlers, key_fn=key_fn, allow_pickle=allow_pickle)

    def add_handler(self, *handler: Callable[[str, Any], Any]) -> None:
        """Put ``handler`` before the handlers already there (they come first), for the passes
        started from now on."""
        for k, h in enumerate(handler):
            require_callable(h, "RoutedDecoder.add_handler", f"handler[{k}]")
        self.decoder.add_handler(*handler)

    def _open(self, ctx: Pass) -> Iterator[tuple[str, Any]]:
        decoder = self.decoder  # the handlers as the pass starts: add_handler() changes later passes only
        pass_decoder = Decoder(*decoder.handlers, key_fn=decoder.key_fn, allow_pickle=decoder.allow_pickle)
        return _routed(self, ctx.open(self.datapipe), pass_decoder._decode_item)

    def __len__(self) -> int:
        return source_len(self, self.datapipe)


# -- StreamReader ----------------------------------------------------------------------------------

_SKIP_PIECE = 1 << 20


class _StreamRun(Resumable):
    """The position of a ``read_from_stream`` pass: the item being read (``n``), its path and
    stream, and the bytes or characters of it read (``at``). The loop writes the item's fields once
    per stream and ``at`` once per chunk; a state taken then (the loop is at its ``yield``, inside a
    stream) holds the item, the path and ``at``, and with no opener upstream to open the file again,
    a copy of the in-memory stream. A pass that has ended saves ``{"ended": True}``."""

    __slots__ = ("stage", "reopen", "loaded", "ended", "n", "path", "stream", "at", "file")

    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage
        self.reopen: Callable[[Any, int], Any] | None = None  # set as the pass starts
        self.loaded: dict[str, Any] | None = None  # the state loaded, saved as it is until the pass starts
        self.ended = False
        self.n = -1
        self.path: Any = None
        self.stream: Any = None
        self.at = 0
        self.file: dict[str, Any] | None = None  # the file a resumed pass reads first

    def state(self) -> dict[str, Any]:
        if not self.started:
            return {"next": 0} if self.loaded is None else dict(self.loaded)
        if self.ended:
            return {"ended": True}
        file: dict[str, Any] = {"path": self.path, "at": self.at, "memory": None}
        if self.reopen is None:
            file["memory"] = _memory_copy(self.stream, self.stage, self.path)
        return {"n": self.n, "file": file}

    def load(self, state: dict[str, Any]) -> None:
        check_dict(state)
        if "ended" in state and state["ended"] is not True:
            invalid(f"state['ended'] must be True, got {state['ended']!r:.100}")
        if "next" in state:  # a state taken before the first item: {"next": 0}
            check_int(state, "next")
        n = check_int(state, "n", -1, default=-1)
        file = state.get("file")
        if file is not None:
            check_dict(file, "state['file']", keys=("path", "at", "memory"))
            check_int(file, "at")
        self.loaded, self.ended = state, "ended" in state
        self.n, self.file = n, file


def _skip_to(stream: Any, at: int) -> None:
    """Move ``stream``, just opened, past its first ``at`` bytes (or characters)."""
    raw = _inner(stream)
    if isinstance(raw, (io.BufferedIOBase, io.RawIOBase)) and raw.seekable():
        stream.seek(at)
        return
    while at > 0:
        piece = stream.read(min(at, _SKIP_PIECE))
        if not piece:
            return
        at -= len(piece)


class _Resumed:
    """The stream a resumed pass reads first: the one the saved pass was inside."""

    __slots__ = ("path", "at", "memory")

    def __init__(self, file: dict[str, Any]) -> None:
        self.path = file["path"]
        self.at = int(file["at"])
        self.memory = file["memory"]


def _read_streams(pipe: StreamReader, ctx: Pass, it: Iterator[Any], run: _StreamRun) -> Iterator[tuple[Any, Any]]:
    stage = stage_label(pipe)
    chunk = pipe.chunk
    reopen = run.reopen = _reopener(pipe.datapipe, ctx)
    run.started = True
    n = run.n
    path: Any = None
    stream: Any = None
    done = 0
    first: list[Any] = []
    try:
        if run.ended:
            return
        if run.file is not None:
            n -= 1
            first = [_Resumed(run.file)]
        for item in chain(first, it) if first else it:
            n += 1
            done = 0
            if type(item) is _Resumed:
                path = item.path
                try:
                    stream = _from_memory(item.memory) if item.memory is not None else reopen(path, n)  # type: ignore[misc]
                    _skip_to(stream, item.at)
                except Exception as e:
                    add_stage_note(e, stage, n, f"file {path!r}, item")
                    raise
                done = item.at
            else:
                path, stream = _pair(item, stage, n)
            read = stream.read
            run.n, run.path, run.stream = n, path, stream  # the position: ``done`` is written per chunk
            while True:
                try:
                    d = read(chunk)
                except Exception as e:
                    add_stage_note(e, stage, n, f"file {path!r}, item")
                    raise
                if not d:
                    stream.close()
                    break
                done += len(d)
                run.at = done
                yield path, d
            stream = run.stream = None
    except BaseException:
        if stream is not None:
            _close(stream)
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise
    finally:
        run.ended = True
        run.stream = None


@functional_datapipe("read_from_stream")
class StreamReader(IterDataPipe[tuple[str, Any]]):
    """Read the stream of each ``(path, stream)`` pair in chunks and yield ``(path, chunk)`` pairs
    (functional name: ``read_from_stream``).

    Args:
        datapipe: a pipe of ``(path, stream)`` pairs, e.g. ``open_files(mode="b")``.
        chunk: the bytes (characters for a text stream) read per item; ``None``: the whole
            stream in one item.

    Yields:
        ``(path, data)`` for each non-empty read, in order; ``data`` is ``bytes`` for a binary
        stream, ``str`` for a text one. An empty stream yields nothing. Each stream is closed
        once read to its end (or on an error, or when the pass is closed inside it).

    Raises:
        Whatever reading raises (``OSError``), as the same object with a note naming the stage and
        the file. TypeError: an item is not a ``(path, stream)`` pair.

    ``len()`` raises ``TypeError``: the number of chunks is known only after reading. A pass saved
    inside a stream resumes there (see the module's docstring).

    Example:
        >>> import io
        >>> from datapipes.iter import IterableWrapper
        >>> dp = IterableWrapper([("alphabet", io.StringIO("abcde"))])
        >>> list(dp.read_from_stream(chunk=2))
        [('alphabet', 'ab'), ('alphabet', 'cd'), ('alphabet', 'e')]

    See also: :class:`~datapipes.iter.FileOpener`, :class:`~datapipes.iter.LineReader`.
    """

    _saves = (
        "the current stream's path and the bytes (characters) read: opened again through the opener above and "
        "read past them (an in-memory stream is saved instead)"
    )

    _repr_fields = ("chunk",)

    def __init__(self, datapipe: IterDataPipe[tuple[str, Any]], chunk: int | None = None) -> None:
        stage = "StreamReader"
        require_pipe(datapipe, stage, "datapipe")
        require_int(chunk, stage, "chunk", minimum=1, optional=True)
        self.datapipe = datapipe
        self.chunk = chunk

    def _open(self, ctx: Pass) -> Iterator[tuple[str, Any]]:
        it = ctx.open(self.datapipe)
        run = _StreamRun(stage_label(self))
        ctx.track(self, run)
        return _read_streams(self, ctx, it, run)

    def __len__(self) -> int:
        raise len_unknown(self, "the number of chunks is known only after reading the streams", NO_LEN)
