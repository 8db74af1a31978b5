"""TokenizerStage [tokenize]: texts encoded into token ids by a tokenizer's batch call, one int32
array per document, in order, serially or on the engine's workers.

The tokenizer is a Hugging Face ``tokenizers.Tokenizer`` (``encode_batch``), a ``transformers``
tokenizer (called on a list of texts, ``["input_ids"]`` taken), or any function from a list of
texts to a list of id sequences. Neither library is imported here: they are recognised by what they
have (duck typing), so the stage works without them and ``tokenizers`` stays an optional extra.

Documents go to the tokenizer in batches of ``batch_size`` (cut on the consumer's thread, where the
items are checked), and the ids come back as arrays built on the worker that ran the batch, so the
consumer's thread only hands them on.

Threads, processes and the tokenizer's own parallelism. ``tokenizers`` runs ``encode_batch`` in
Rust without the GIL and splits the batch over a Rayon thread pool of its own, one thread per CPU
(``TOKENIZERS_PARALLELISM`` turns it off). So:

- ``concurrency=1`` or ``2`` worker threads (``executor="thread"``, the default) is the
  recommended setting with ``tokenizers``: the Rayon pool already uses every CPU for each batch, and
  a second thread keeps it busy while the first turns ids into arrays (the only part that holds the
  GIL). More threads only queue behind the same pool.
- ``executor="process"`` suits tokenizers that hold the GIL (a slow ``transformers`` tokenizer, a
  Python function); with ``tokenizers`` threads do better, as the arrays cross no process boundary.
  If processes it is, set ``TOKENIZERS_PARALLELISM=false`` before the first encode: the pool's
  workers are then forked (no Rayon thread runs in the parent) and each encodes on one CPU, so
  ``concurrency`` processes use that many. Left on, the Rayon threads the parent started make
  forking unclean, so each worker starts as a fresh interpreter with a Rayon pool of every CPU, and
  ``concurrency`` such pools compete for the same CPUs. (A process forked by other means after the
  parent used the pool, a ``DataLoader`` worker say, gets the library's warning "The current
  process just got forked, after parallelism has already been used. Disabling parallelism..." and
  encodes on one thread.)
- The tokenizer travels to worker processes by pickle (``tokenizers.Tokenizer`` pickles; so must a
  function or a ``transformers`` tokenizer). The stage's own code that runs there pickles by value,
  so a worker started as a fresh interpreter imports NumPy and what the tokenizer needs, not this
  package (which imports torch).

Checkpoint and resume (docs/howto/checkpoint.rst): a pass's state holds the position of the next
document and the documents it has pulled from its source and not yet yielded, as they came (the
rest of the current batch, the batches in flight); a resumed pass encodes them again first, so the
arrays themselves are never saved. A tokenizer gives each document the same ids whatever batch it is
in (padding, which would not, is refused), so the resumed pass yields exactly what the
uninterrupted one would.

>>> from datapipes.iter import IterableWrapper
>>> from datapipes.iter.tokenize import TokenizerStage
>>> def char_ids(texts):
...     return [[ord(c) for c in t] for t in texts]
>>> [a.tolist() for a in TokenizerStage(IterableWrapper(["hi", "yo"]), char_ids, eos_id=0)]
[[104, 105, 0], [121, 111, 0]]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from concurrent.futures import Executor
from itertools import chain, islice
from operator import length_hint
from typing import Any, Callable, Iterator, Literal, overload

import numpy as np
from numpy import dtype, int32, ndarray

from .._engine import EngineRun, StageSink, StageSpec, StageStats, abandon, close_iterator, concurrent_map, is_async_callable, new_stats
from .._engine.lifecycle import Resumable
from .._positions import remaining
from .._runtime import shares
from .._runtime.passes import Pass
from .._runtime.validate import check_int, check_list
from ..datapipe import IterDataPipe, functional_datapipe, require_int, require_pipe, source_len, stage_label
from ..errors import add_stage_note
from .mapping._shared import _Executor, _check_concurrency, _stage_concurrency

__all__ = ["TokenizerStage"]

_STAGE = "TokenizerStage"
#: the documents encoded in one call of the tokenizer, by default (docs/performance.rst, "Tokenize")
DEFAULT_BATCH_SIZE = 64
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
#: the most worker threads a concurrent stage may run (``concurrency="auto"`` included): with the
#: batch size, it bounds the documents a loaded state may hold (see ``_TokenizeRun.load``)
_MAX_WORKERS = 128
_Kind = Literal["tokenizers", "transformers", "callable"]


# -- the worker's side -----------------------------------------------------------------------------
#
# What runs on a worker (a thread, or a process that unpickles it) is a closure made by
# ``_batch_encoder``. It refers to NumPy, builtins and its own cells only, so cloudpickle pickles it
# by value and a worker process started as a fresh interpreter never imports this package (which
# imports torch). It returns the arrays as a list, or, where the tokenizer's output cannot become
# int32 arrays, a tuple ``(arrays of the documents before, index, exception class, message)`` that
# the consumer turns into the stage's error at the document's position.


def _batch_encoder(kind: _Kind, tokenizer: Any, add_special_tokens: bool | None, eos_id: int | None,
                   trusted: bool) -> Callable[[list[str]], Any]:
    """The function a pass runs on each batch of texts: the texts' ids as int32 arrays.

    ``trusted``: the tokenizer is a ``tokenizers`` one whose vocabulary fits int32, so its ids (lists
    of ints below the vocabulary size) go straight into arrays; any other output is checked (ints,
    one flat sequence per text, every id within int32) with a few vectorised operations per text.
    """
    kwargs = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
    lo, hi = _INT32_MIN, _INT32_MAX

    if kind == "tokenizers":
        # encode_batch_fast (tokenizers >= 0.20) gives the same ids without computing offsets
        batch_call = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch

        def ids_of(texts: list[str]) -> Any:
            return [e.ids for e in batch_call(texts, **kwargs)]
    elif kind == "transformers":
        call_kwargs = dict(kwargs, return_attention_mask=False, return_token_type_ids=False)

        def ids_of(texts: list[str]) -> Any:
            return tokenizer(texts, **call_kwargs)["input_ids"]
    else:
        ids_of = tokenizer

    def checked(ids: Any) -> Any:
        """One text's ids as a new int32 array, or ``(exception class, message)``."""
        a = np.asarray(ids)
        if a.ndim != 1:
            return TypeError, f"the tokenizer gave an array of shape {a.shape} for it, not one flat sequence of ids"
        if a.dtype.kind not in "iu":
            if a.size == 0:
                return np.empty(0, int32)
            if a.dtype.kind == "O" and all(type(x) is int for x in a.tolist()):
                return ValueError, (f"the tokenizer gave the id {max(a.tolist(), key=abs)}, which does not fit int32 "
                                    f"(the tokens' dtype)")
            return TypeError, f"the tokenizer gave ids of dtype {a.dtype}, not integers"
        if a.dtype != int32 and a.size:
            small, big = int(a.min()), int(a.max())
            if small < lo or big > hi:
                return ValueError, (f"the tokenizer gave the id {big if big > hi else small}, which does not fit "
                                    f"int32 (the tokens' dtype)")
        return a.astype(int32)  # a copy: never memory the tokenizer may reuse

    def counted(ids: Any, texts: list[str]) -> Any:
        if not hasattr(ids, "__len__") or isinstance(ids, (str, bytes, Mapping)):
            return [], 0, TypeError, (f"the tokenizer returned {type(ids).__name__} for a batch of {len(texts)} texts, "
                                      f"not one id sequence per text")
        if len(ids) != len(texts):
            return [], 0, ValueError, (f"the tokenizer returned {len(ids)} id sequences for a batch of {len(texts)} "
                                       f"texts (this item and the next {len(texts) - 1}), not one per text")
        return None

    if trusted and eos_id is None:
        def encode(texts: list[str]) -> Any:
            return [np.array(ids, int32) for ids in ids_of(texts)]
    elif trusted:
        def encode(texts: list[str]) -> Any:
            out: list[Any] = []
            for ids in ids_of(texts):
                ids.append(eos_id)  # a new list from each Encoding.ids
                out.append(np.array(ids, int32))
            return out
    else:
        def encode(texts: list[str]) -> Any:
            all_ids = ids_of(texts)
            wrong = counted(all_ids, texts)
            if wrong is not None:
                return wrong
            out: list[Any] = []
            for j, ids in enumerate(all_ids):
                a = checked(ids)
                if type(a) is tuple:
                    return out, j, a[0], a[1]
                if eos_id is not None:
                    a = np.append(a, int32(eos_id))
                out.append(a)
            return out

    return encode


# -- the consumer's side ---------------------------------------------------------------------------


def _kind_of(tokenizer: Any) -> _Kind:
    """Which of the three kinds of tokenizer ``tokenizer`` is (see :class:`TokenizerStage`)."""
    if callable(getattr(tokenizer, "encode_batch", None)):
        return "tokenizers"
    if callable(tokenizer) and hasattr(tokenizer, "is_fast"):  # transformers' PreTrainedTokenizer(Fast)
        return "transformers"
    if callable(tokenizer):
        return "callable"
    raise TypeError(f"{_STAGE}: tokenizer must be a tokenizers.Tokenizer (an object with encode_batch), a transformers "
                    f"tokenizer or a function from a list of str to a list of id sequences, got "
                    f"{type(tokenizer).__name__}")


class _Shown(str):
    """What a stage's label shows of its tokenizer (a ``str`` whose repr has no quotes):
    ``TokenizerStage(BPE)``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


def _tokenizer_name(tokenizer: Any, kind: _Kind) -> _Shown:
    if kind == "tokenizers":
        model = getattr(tokenizer, "model", None)
        return _Shown(type(model).__name__ if model is not None else type(tokenizer).__name__)
    if kind == "transformers":
        return _Shown(type(tokenizer).__name__)
    name = getattr(tokenizer, "__qualname__", "") or ""
    if not name or "<locals>" in name:
        name = getattr(tokenizer, "__name__", None) or type(tokenizer).__name__
    return _Shown(name)


def _article(kind: str) -> str:
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


def _texts_error(label: str, x: Any, field: str | None, position: int) -> Exception:
    """The error for an item that holds no text, at ``position``."""
    kind = type(x).__name__
    if field is None:
        if isinstance(x, Mapping):
            e: Exception = TypeError(f"{label}: item {position} is {_article(kind)}, not a str: pass field= to name "
                                     f"the key of its text")
        else:
            e = TypeError(f"{label}: item {position} is {_article(kind)}, not a str (tokenize takes texts, or dicts "
                          f"with field= naming their text)")
    elif not isinstance(x, Mapping):
        e = TypeError(f"{label}: item {position} is {_article(kind)}, not a dict: with field={field!r} each item is a "
                      f"dict holding its text under that key")
    elif field not in x:
        keys = ", ".join(map(repr, islice(x, 5))) + (", ..." if len(x) > 5 else "")
        e = ValueError(f"{label}: item {position} has no key {field!r} (its keys: {keys or 'none'})")
    else:
        e = TypeError(f"{label}: item {position}[{field!r}] is {_article(type(x[field]).__name__)}, not a str")
    add_stage_note(e, label, position)
    return e


def _str_texts(batch: list[Any]) -> int:
    """The index of the first item of ``batch`` that is not a str, or -1."""
    if set(map(type, batch)) == {str}:
        return -1
    for j, x in enumerate(batch):
        if not isinstance(x, str):
            return j
    return -1


def _field_texts(batch: list[Any], field: str) -> tuple[list[str], int]:
    """The texts of the dict items of ``batch`` under ``field``, and the index of the first item
    that has none (-1: all have one; the texts are then those of the items before it)."""
    if set(map(type, batch)) == {dict}:
        try:
            texts = [x[field] for x in batch]
        except KeyError:
            pass
        else:
            if set(map(type, texts)) == {str}:
                return texts, -1
    texts = []
    for j, x in enumerate(batch):
        if not isinstance(x, Mapping) or field not in x or not isinstance(x[field], str):
            return texts, j
        texts.append(x[field])
    return texts, -1


class _TokenizeRun(Resumable):
    """The position of one pass: the documents it has pulled and not yet yielded, kept as they came.

    The batcher appends each batch it cuts to ``fed`` (with the position of its first document);
    the loop takes the batch back as its arrays arrive (in order: the engine yields in order) and
    yields from ``rest``, an iterator over its outputs, so a state reads the rest of the current
    batch from ``current`` and ``length_hint(rest)``, then the batches in flight, then, after an item
    that holds no text, the items from it on (``held``), then what is left of the documents a
    resumed pass was given (``pending``). The loop writes a few attributes per batch, nothing per
    document.
    """

    __slots__ = ("fed", "current", "rest", "n_out", "base", "pulled", "start", "held", "pending", "loaded",
                 "raised", "failed", "limit")

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.fed: deque[tuple[int, list[Any]]] = deque()
        self.current: list[Any] = []
        self.rest: Iterator[Any] = iter(())
        self.n_out = 0  # outputs of the current batch (its documents, or those before an item without text)
        self.base = 0  # the position of the current batch's first document
        self.pulled = 0  # the position after the last document cut into a batch
        self.start = 0  # the position of the pass's first document
        self.held: list[Any] = []
        self.pending: Iterator[Any] | None = None
        self.loaded: dict[str, Any] | None = None
        self.raised: BaseException | None = None  # what the batcher raised (the source's, or an item's error)
        self.failed = 0
        self.limit = limit

    def position(self) -> int:
        """The position of the next document to yield."""
        return self.base + self.n_out - length_hint(self.rest)

    def counts(self) -> tuple[int, int, int]:
        """``(documents in, documents out, failures)`` of this pass so far, for its statistics."""
        return self.pulled - self.start, self.position() - self.start, self.failed

    def state(self) -> dict[str, Any]:
        if not self.started:
            return dict(self.loaded) if self.loaded is not None else {"next": 0, "pending": []}
        done = self.n_out - length_hint(self.rest)
        pending = self.current[done:]
        for _, batch in self.fed:
            pending += batch
        pending += self.held
        if self.pending is not None:
            pending += remaining(self.pending)
        return {"next": self.base + done, "pending": pending}

    def load(self, state: dict[str, Any]) -> None:
        check_int(state, "next")
        check_list(state, "pending", self.limit,
                   limit=f"the stage's bound (batch_size x (2 x {_MAX_WORKERS} workers + 2): {self.limit})")
        self.loaded = {"next": state["next"], "pending": list(state["pending"])}


class _DocCounts(EngineRun):
    """The engine's run of a concurrent pass, whose live statistics count the documents (the engine
    itself counts the batches it runs)."""

    __slots__ = ("docs",)

    def __init__(self, docs: _TokenizeRun) -> None:
        super().__init__()
        self.docs = docs

    def live(self, count: Any) -> Callable[[], tuple[int, int, int]]:
        return self.docs.counts


def _batches(pipe: TokenizerStage, it: Iterator[Any], run: _TokenizeRun, label: str) -> Iterator[list[str]]:
    """The texts of consecutive batches of ``batch_size`` items (the last may be shorter), each batch
    recorded in ``run.fed``. An item without a text ends the batch before it: the items before it
    are sent, then its error is raised (the engine defers it until they are yielded); so is an
    error of the source, after the items it gave."""
    n, field, fed = pipe.batch_size, pipe.field, run.fed
    base = run.pulled
    try:
        while True:
            batch: list[Any] = []
            error: BaseException | None = None
            try:
                batch.extend(islice(it, n))  # what the source gave before raising stays in the batch
            except Exception as e:
                run.raised = error = e
            size = len(batch)
            if batch:
                if field is None:
                    bad = _str_texts(batch)
                    texts = batch if bad < 0 else batch[:bad]
                else:
                    texts, bad = _field_texts(batch, field)
                if bad >= 0:
                    run.held = batch[bad:]
                    run.raised = error = _texts_error(label, batch[bad], field, base + bad)
                    run.failed = 1
                    batch = batch[:bad]
                if batch:
                    fed.append((base, batch))
                    base += len(batch)
                    run.pulled = base
                    yield texts
                    del batch, texts
            if error is not None:
                raise error
            if size < n:
                return
    except BaseException:
        abandon(it)
        raise


def _tokenizer_failed(e: BaseException, run: _TokenizeRun, label: str, batch_size: int) -> None:
    """Where ``e`` is what the tokenizer raised on the batch at the front of ``run.fed`` (not the
    batcher's error, nor an interrupt), count it and name that batch: the stage's note names its
    first document (replacing the engine's, which named the batch's position among batches), a
    second one the documents encoded together."""
    if not isinstance(e, Exception) or e is run.raised or not run.fed:
        return
    run.failed = 1
    base, batch = run.fed[0]
    add_stage_note(e, label, base)
    e.add_note(f"[datapipes] {label} was encoding items {base} to {base + len(batch) - 1} in one call of the "
               f"tokenizer (batch_size={batch_size})")


def _documents(pipe: TokenizerStage, run: _TokenizeRun, results: Iterator[Any], stats: StageStats,
               label: str) -> Iterator[Any]:
    """Yield each batch's outputs one by one as the batches' arrays come (in order), counting the
    tokens per batch."""
    fed, field = run.fed, pipe.field
    get = results.__next__
    try:
        while True:
            try:
                out = get()
            except StopIteration:
                break
            except BaseException as e:
                _tokenizer_failed(e, run, label, pipe.batch_size)
                raise
            base, batch = fed.popleft()
            error: Exception | None = None
            if type(out) is tuple:  # ids that cannot be int32 arrays: the documents before, then the error
                out, j, kind, message = out
                error = kind(f"{label}: item {base + j}: {message}")
                add_stage_note(error, label, base + j)
            stats.tokens += sum(map(len, out))
            outputs = out if field is None else [{**x, "tokens": a} for x, a in zip(batch, out)]
            run.current, run.base, run.n_out = batch, base, len(outputs)
            run.rest = rest = iter(outputs)
            del out, outputs, batch
            yield from rest
            if error is not None:
                run.failed = 1
                run.raised = error
                raise error
    finally:
        close_iterator(results)
        stats.finish(*run.counts(), stats.fill_sum, stats.fill_samples, stats.source_s, stats.wait_s)
        stats.items_in, stats.items_out, stats.failures = run.counts()  # the engine published batches


def _source(run: _TokenizeRun, it: Iterator[Any]) -> Iterator[Any]:
    """The documents a pass batches: a resumed pass's pending documents first, then its source."""
    run.started = True
    loaded = run.loaded
    if loaded is None:
        return it
    run.loaded = None
    run.base = run.pulled = run.start = loaded["next"]
    if not loaded["pending"]:
        return it
    run.pending = pending = iter(loaded["pending"])
    return chain(pending, it)


def _tokenize_serial(pipe: TokenizerStage, it: Iterator[Any], run: _TokenizeRun, stats: StageStats,
                     label: str, encode: Callable[[list[str]], Any]) -> Iterator[Any]:
    src = _source(run, it)
    stats.begin([], run.counts)
    yield from _documents(pipe, run, map(encode, _batches(pipe, src, run, label)), stats, label)


def _tokenize_engine(pipe: TokenizerStage, ctx: Pass, it: Iterator[Any], run: _TokenizeRun, stats: StageStats,
                     label: str, encode: Callable[[list[str]], Any], concurrency: int, tune: Any) -> Iterator[Any]:
    src = _source(run, it)
    # One batch per chunk sent to a worker thread or process (a batch is work enough for a hand-over),
    # so that at most 2 * concurrency batches are in flight (the bound a state keeps).
    chunksize = None if isinstance(pipe.executor, Executor) else 1
    spec = StageSpec(label, concurrency, executor=pipe.executor, chunksize=chunksize)
    sink = StageSink(stats=stats, run=_DocCounts(run), hooks=shares.task_hooks(pipe, ctx), tune=tune, owner=pipe)
    results = concurrent_map(_batches(pipe, src, run, label), encode, spec, sink)
    yield from _documents(pipe, run, results, stats, label)


@functional_datapipe("tokenize")
class TokenizerStage(IterDataPipe[Any]):
    """Encode texts into token ids with a tokenizer's batch call (functional name: ``tokenize``).

    Args:
        datapipe: the source pipe, yielding texts (``str``), or dicts holding their text under
            ``field``.
        tokenizer: one of

            - a Hugging Face ``tokenizers.Tokenizer`` (any object with ``encode_batch``): each batch
              is encoded with ``encode_batch_fast`` where it has one (the same ids as
              ``encode_batch``, without computing offsets), else ``encode_batch``, and each
              encoding's ``ids`` taken. Padding must be off (``tokenizer.no_padding()``): it would
              make a document's ids depend on the batch it is in. Truncation applies per document;
            - a ``transformers`` tokenizer (a callable with an ``is_fast`` attribute, such as
              ``PreTrainedTokenizerFast``): called on each batch's list of texts, its
              ``["input_ids"]`` taken;
            - any other function from a list of ``str`` to a list of id sequences (one per text:
              lists, tuples or 1-D integer arrays).

            With worker processes it must pickle.
        field: ``None`` (default): items are texts. A key: items are dicts (mappings) whose text is
            ``item[field]``; each output is a new dict with the item's keys and ``"tokens"`` (a
            ``"tokens"`` key of the item's is replaced).
        eos_id: an id appended to every document's ids (``None``: nothing appended), an int from 0
            to ``2**31 - 1``.
        add_special_tokens: passed to a ``tokenizers`` or ``transformers`` tokenizer (``True``:
            its post-processor adds its special tokens, a BOS say, as ``encode_batch`` does by
            default); ``None`` (default): the tokenizer's own default. A plain function takes
            none, and refuses a value here.
        batch_size: the documents encoded in one call of the tokenizer, at least 1 (default 64).
            Larger batches give the tokenizer's own thread pool more to split, and make the state
            and the memory held larger (below).
        concurrency: ``None`` (default): each batch is encoded on the consumer's thread when the
            pass reaches it. ``N``: batches are encoded by ``N`` workers of ``executor``, at most
            ``2 * N`` batches in flight, yielded in order; ``"auto"``: tuned online, as for
            :class:`~datapipes.iter.Mapper`. With ``tokenizers`` 1 or 2 threads are enough (see
            the module's notes on its own parallelism).
        executor: ``"thread"`` (default), ``"process"``, or a ``concurrent.futures.Executor``, as
            for :class:`~datapipes.iter.Mapper`; only with ``concurrency``.

    Yields:
        For a text, a 1-D ``np.int32`` array of its ids (``eos_id`` last when given). For a dict, a
        new dict with the same keys and the array under ``"tokens"`` (the input is not changed).
        In source order, one output per input.

    Raises:
        TypeError: at construction, ``tokenizer`` is none of the three kinds, or an argument has
            the wrong type. While iterating, an item that is not a str (or, with ``field``, not a
            dict, or whose ``item[field]`` is not a str), or a tokenizer whose output is not integer
            ids, one sequence per text; the message names the stage, the item's position and what
            was found.
        ValueError: at construction, a ``tokenizers`` tokenizer with padding on, a value out of
            range, ``add_special_tokens`` with a plain function, ``executor`` without
            ``concurrency``. While iterating, a dict item without ``field``, an id that does not fit
            int32, or a tokenizer that returned another number of sequences than it was given texts.
        Whatever the tokenizer raises, as the same object, with a note naming the stage and the
        first item of the batch it was encoding, and one naming the items of that batch.

    The items before a failing one are yielded first, as a serial ``map`` would (a tokenizer that
    raises fails its whole batch: the batch's first item is where the pass stops).

    ``len()`` is the source's length.

    Concurrency: the items are cut into batches and checked on the consumer's thread, which pulls
    the source lazily; a worker runs the tokenizer on a batch and turns its ids into arrays. At
    most ``2 * concurrency`` batches are in flight beside the one being yielded, so a pass holds at
    most ``(2 * concurrency + 1) * batch_size`` documents (serially, one batch). Workers start at
    the first ``next()`` and stop when the pass ends or is closed.

    Statistics: the stage's :class:`~datapipes._engine.StageStats` (``it.stats()``, ``profile``)
    count documents as items, and its ``tokens`` the ids yielded (``eos_id`` included), counted per
    batch as it arrives; ``tokens_per_s`` is their rate. A serial pass keeps them too.

    Checkpoint: a state holds the position of the next document and the documents pulled and not
    yet yielded (at most the bound above), which a resumed pass encodes again before it goes on
    with its source.

    Example:
        >>> from datapipes.iter import IterableWrapper
        >>> from datapipes.iter.tokenize import TokenizerStage
        >>> def words(texts):
        ...     return [[len(w) for w in t.split()] for t in texts]
        >>> [a.tolist() for a in TokenizerStage(IterableWrapper(["a bb", "ccc"]), words, eos_id=0)]
        [[1, 2, 0], [3, 0]]
        >>> list(TokenizerStage(IterableWrapper([{"text": "a bb", "id": 7}]), words, field="text", concurrency=2))
        [{'text': 'a bb', 'id': 7, 'tokens': array([1, 2], dtype=int32)}]

    See also: :class:`~datapipes.iter.Mapper` (``concurrency``, ``executor``),
    :class:`~datapipes.iter.packing.TokenPacker` (``pack_tokens``), which packs the documents into
    rows.
    """

    _saves = (
        "the position of the next document and the documents pulled and not yet yielded, as they came (the rest "
        "of the current batch and the batches in flight: at most ``(2 * concurrency + 1) * batch_size``), encoded "
        "again on resume"
    )

    _repr_fields = ("_name",)

    @overload
    def __init__(
        self: IterDataPipe[ndarray[Any, dtype[int32]]],
        datapipe: IterDataPipe[str],
        tokenizer: Any,
        *,
        field: None = ...,
        eos_id: int | None = ...,
        add_special_tokens: bool | None = ...,
        batch_size: int = ...,
        concurrency: int | Literal["auto"] | None = ...,
        executor: _Executor = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: IterDataPipe[dict[str, Any]],
        datapipe: IterDataPipe[Mapping[str, Any]],
        tokenizer: Any,
        *,
        field: str,
        eos_id: int | None = ...,
        add_special_tokens: bool | None = ...,
        batch_size: int = ...,
        concurrency: int | Literal["auto"] | None = ...,
        executor: _Executor = ...,
    ) -> None: ...
    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        tokenizer: Any,
        *,
        field: str | None = None,
        eos_id: int | None = None,
        add_special_tokens: bool | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        concurrency: int | Literal["auto"] | None = None,
        executor: _Executor = "thread",
    ) -> None:
        require_pipe(datapipe, _STAGE)
        kind = _kind_of(tokenizer)
        if kind != "tokenizers" and is_async_callable(tokenizer):
            raise TypeError(f"{_STAGE}: tokenizer must be a plain function, not an async one (its batch call runs on "
                            f"the stage's workers)")
        if field is not None and not isinstance(field, str):
            raise TypeError(f"{_STAGE}: field must be a str (the key of each dict item's text) or None, got "
                            f"{type(field).__name__}")
        require_int(eos_id, _STAGE, "eos_id", minimum=0, optional=True)
        if eos_id is not None and eos_id > _INT32_MAX:
            raise ValueError(f"{_STAGE}: eos_id must fit int32 (the tokens' dtype), at most {_INT32_MAX}, got {eos_id}")
        if add_special_tokens is not None:
            if not isinstance(add_special_tokens, bool):
                raise TypeError(f"{_STAGE}: add_special_tokens must be a bool or None, got "
                                f"{type(add_special_tokens).__name__}")
            if kind == "callable":
                raise ValueError(f"{_STAGE}: add_special_tokens applies to a tokenizers or transformers tokenizer; "
                                 f"a plain function (here {_tokenizer_name(tokenizer, kind)}) adds what it adds, "
                                 f"so leave it None")
        require_int(batch_size, _STAGE, "batch_size", minimum=1)
        if concurrency is None:
            if executor != "thread":
                raise ValueError(f"{_STAGE}: executor={executor!r} needs concurrency (the workers to run batches "
                                 f"on); concurrency=None encodes on the consumer's thread")
        else:
            _check_concurrency(_STAGE, None, concurrency, True, executor, None, None, None)
        trusted = False
        if kind == "tokenizers":
            if getattr(tokenizer, "padding", None) is not None:
                raise ValueError(f"{_STAGE}: the tokenizer pads ({tokenizer.padding!r:.200}): each document's ids "
                                 f"would depend on the batch it is in. Call tokenizer.no_padding() first (pad when "
                                 f"batching, or pack with pack_tokens)")
            vocab = getattr(tokenizer, "get_vocab_size", None)
            size = vocab(with_added_tokens=True) if callable(vocab) else None
            # the library's own Tokenizer, whose ids (below the vocabulary's size) need no checks
            ours = type(tokenizer).__module__.startswith("tokenizers")
            trusted = ours and type(size) is int and size <= _INT32_MAX + 1
        self.datapipe = datapipe
        self.tokenizer = tokenizer
        self.field = field
        self.eos_id = eos_id
        self.add_special_tokens = add_special_tokens
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.executor = executor
        self._kind = kind
        self._trusted = trusted
        self._name = _tokenizer_name(tokenizer, kind)
        # Its position is its own: the documents pulled and not yet yielded (a pass always tracks a run).

    def _thread_demand(self) -> int | str | None:
        """What a pass's thread budget counts for this stage: its concurrency when it runs worker
        threads of its own, else None."""
        if self.concurrency is None or self.executor != "thread":
            return None
        return self.concurrency

    def _open(self, ctx: Pass) -> Iterator[Any]:
        it = ctx.open(self.datapipe)
        label = stage_label(self)
        encode = _batch_encoder(self._kind, self.tokenizer, self.add_special_tokens, self.eos_id, self._trusted)
        workers = max(_MAX_WORKERS, self.concurrency if isinstance(self.concurrency, int) else 0)
        run = _TokenizeRun(self.batch_size * (2 * workers + 2))
        ctx.track(self, run)
        if self.concurrency is None:
            stats = ctx.stats_for(self, lambda: StageStats(label, "serial", 1, 0))
            return _tokenize_serial(self, it, run, stats, label, encode)
        concurrency, tune = _stage_concurrency(self, ctx)
        stats = ctx.stats_for(self, lambda: new_stats(label, encode, concurrency, self.executor, tune is not None))
        return _tokenize_engine(self, ctx, it, run, stats, label, encode, concurrency, tune)

    def __len__(self) -> int:
        return source_len(self, self.datapipe)
