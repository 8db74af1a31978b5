"""Where each shard of a loader pass stands, and how a state saved with one layout of workers and
ranks resumes with another.

A *shard* is one process's share of a loader pass: worker ``w`` of ``W`` on rank ``r`` of ``R`` reads
shard ``r * W + w`` of ``R * W`` (with ``num_workers=0`` each rank is one shard, ``W = 1``). It runs
passes of the *worker pipe* (the user's pipe, then ``batch`` and ``collate``), and its position is a
*shard state*, plain data::

    {"tails": [pass state, ...], "main": pass state or None, "done": bool}

``main`` is the position of the shard's own pass (``None``: not started). ``tails`` are passes left
over from an earlier layout (below) that still hold items; a shard yields what its tails hold first,
then its main pass. The loader keeps, for every shard of its rank, the state as of the last batch it
handed to the user (:class:`ShardsRun`): worker processes send their state with every batch, and
what the loader's own buffers hold ahead of the user is not counted as delivered.

Resuming with the same layout, each shard resumes its own state: the batches come exactly as an
uninterrupted pass would give them. With another layout (:func:`redistribute`), every item not yet
delivered is delivered exactly once:

- what each old shard's stages below ``sharding_filter`` had taken and still held (a map's work in
  flight, the rest of a file being read, a shuffle buffer after the filter) is finished by a *tail*:
  the old shard's pass, resumed with its ``sharding_filter`` closed (it takes nothing new);
- what no old shard had taken is split among the new shards: their ``sharding_filter`` reads the
  source again from the start of the epoch, skips what the old layout took (old shard ``s`` took
  its first ``kept[s]`` items, recorded in its state) and keeps its share of the rest (a *layer*;
  layouts changed several times in one epoch stack their layers).

This needs a pipe whose ``sharding_filter`` gives the same items in the same order in every
pass of the epoch: no stage above it yields in completion order or reads a one-shot source.
"""

from __future__ import annotations

import contextlib
import gc
import pickle
import threading
import time
import weakref
from collections import deque
from itertools import islice
from typing import Any, Callable, Generator, Iterator, NoReturn, cast

from .._runtime import passes as _pass, shares
from .._runtime.passes import Pass, PassConfig, check_state, configured, stage_keys
from ..datapipe import IterDataPipe, source_len
from ..graph import sources_of, stage_label, walk
from ..iter.sharding import is_sharding_stage
from .._runtime.worker import placement

__all__ = ["InProcess", "Pickled", "ShardStream", "ShardsRun", "check_loader_state", "loader_layout", "merged_states",
           "pickled", "plan", "redistribute"]

_WHERE = "DataLoader.load_state_dict"

#: the state of a shard that has not started
FRESH: dict[str, Any] = {"tails": [], "main": None, "done": False}


class ShardStream:
    """The items of one shard: its tails, then its main pass, each a pass of ``pipe`` taking
    ``config``'s seeds; :meth:`state` reads its position between two items.

    A state may also say ``"skip": m``: the shard stood ``m`` items past the position saved (see
    :meth:`items_with_states`); a resumed stream recomputes them and drops them.
    """

    def __init__(self, pipe: IterDataPipe[Any], config: PassConfig | None, state: dict[str, Any] | None) -> None:
        state = FRESH if state is None else state
        self.pipe = pipe
        self.config = config
        self.tails: list[Any] = list(state["tails"])
        self.main: Any = state["main"]
        self.done = bool(state["done"])
        self.skip = int(state.get("skip", 0))
        self.it: Any = None  # the pass being iterated
        self.in_tail = False
        self.error: str | None = None  # why this shard cannot save its position
        #: the hooks and budget its passes take from the loader's pass (see ``shares.inherited``)
        self.inherit: tuple[Any, Any] = (None, None)
        self._ended_stats: list[tuple[Any, Any]] = []  # the statistics of its last pass, once it ended
        self.last_pass: Any = None  # the pass it iterated last (its shards, for an error's notes)

    def state(self) -> dict[str, Any]:
        """The shard's position (``{"error": why}`` when a stage cannot save one)."""
        if self.error is not None:
            return {"error": self.error}
        if self.it is None:
            state = {"tails": list(self.tails), "main": self.main, "done": self.done}
            return {**state, "skip": self.skip} if self.skip else state
        try:
            current = self.it.state_dict()
        except TypeError as e:
            self.error = str(e)
            return {"error": self.error}
        if self.in_tail:
            return {"tails": [current, *self.tails], "main": self.main, "done": False}
        return {"tails": [], "main": current, "done": False}

    def stats(self) -> list[tuple[Any, Any]]:
        """``(stage, StageStats)`` of the pass being iterated (or of the last one, once it ended);
        empty unless the passes are observed (``inherit`` names hooks)."""
        it = self.it
        return it.stats() if it is not None else self._ended_stats

    def _start(self, state: Any) -> Any:
        hooks, budget = self.inherit
        with contextlib.ExitStack() as within:
            if self.config is not None:
                within.enter_context(configured(self.config))
            if hooks is not None:
                within.enter_context(_pass.observing(hooks))
            if budget is not None:
                within.enter_context(_pass.budgeted(*budget))
            it = cast(_pass.PassIterator, iter(self.pipe))  # a new pass: iter() gives its PassIterator
        if state is not None:
            it.load_state_dict(state)
        return it

    def items(self) -> Generator[Any, None, None]:
        """The shard's items (after the ``skip`` first ones, recomputed and dropped)."""
        skip, self.skip = self.skip, 0
        items = self._items()
        if skip:
            for _ in islice(items, skip):
                pass
        return items

    def _items(self) -> Generator[Any, None, None]:
        if self.done:
            return
        while self.tails:
            self.in_tail = True
            self.it = self._start(self.tails.pop(0))
            try:
                yield from self.it
            finally:
                self.it.close()
                self.it = None
        self.in_tail = False
        self.it = self._start(self.main)
        try:
            yield from self.it
            final = self.state()  # the last position: what a later layout must know was taken
            self.main = final.get("main") if "error" not in final else None
            self.done = True
        finally:
            self._ended_stats = self.it.stats()
            self.last_pass = self.it.pass_
            self.it.close()
            self.it = None

    def items_with_states(self, encode: Callable[[Any], Any] | None = None) -> Iterator[tuple[Any, Any]]:
        """``(item, the shard's state just after it)`` for each item, the state ``None`` for "one
        item past the last state": states travel with the items of worker processes, and taking one
        costs what the pipe's state holds (a shuffle buffer's contents: a millisecond for 10,000
        items), so one is taken only while they have cost at most :data:`SNAPSHOT_BUDGET` of the
        CPU time this thread has spent so far. A resumed shard recomputes the items since (a bounded amount: about
        ``1 / SNAPSHOT_BUDGET`` times one state's cost). A pipe that could give other items when
        recomputed (see :func:`_replay_problem`) has its state taken with every item. ``encode``
        (:func:`pickled` for a worker process) is applied to each state, its cost counted.
        """
        every = any(_replay_problem(stage) for stage in walk(self.pipe))
        clock = time.thread_time  # the CPU time this thread spends (waiting for a consumer costs none)
        began = clock()
        spent = 0.0
        for item in self.items():
            t = clock()
            if every or spent <= SNAPSHOT_BUDGET * (t - began):
                state = self.state() if encode is None else encode(self.state())
                spent += clock() - t
                yield item, state
            else:
                yield item, None
            item = state = None  # let go of a batch once yielded, not after the next one is made


#: the share of a shard's time that taking its states may cost (see ShardStream.items_with_states)
SNAPSHOT_BUDGET = 0.02

#: how many cyclic garbage collections are running (see ShardsRun.end)
_collecting = [0]


def _count_collections(phase: str, info: dict[str, Any]) -> None:
    _collecting[0] += 1 if phase == "start" else -1


gc.callbacks.append(_count_collections)


class Pickled:
    """A shard's state as a worker process sends it with a batch: pickled there (so its cost counts
    against the worker's budget for states), unpickled by :class:`ShardsRun` only when a state is
    asked for. Only a worker of the loader makes one, and it travels on the loader's own channel; a
    state loaded from a checkpoint is plain data and never holds one (nothing from a checkpoint is
    unpickled)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def pickled(state: Any) -> Pickled:
    """``state``, pickled for the main process (``ShardStream.items_with_states``'s ``encode``)."""
    return Pickled(pickle.dumps(state))


class ShardsRun:
    """What a loader pass knows of its shards on this rank: each one's state as of the last batch
    handed to the user, and which shard's batch comes next (the loader takes the shards' batches in
    turn; with ``in_order=False`` as they come: each shard's batches still come in its own order, so
    its state after its last batch delivered resumes it exactly, whatever the order across shards).

    States arrive with the batches (:meth:`record`; from worker processes :class:`Pickled`, decoded
    only when a state is asked for), ahead of the user by what the loader's buffers hold; ``delivered`` (a
    one-item list the loader counts batches in as it hands them over) says how many of them count.
    With no buffer between the shard and the user, a single in-process shard is read when a state is
    asked for instead (``stream``), which costs nothing per batch.

    It outlives its pass: the loader keeps it (and not the pass's iterator, so a dropped pass still
    stops its threads and worker processes at once) and reads its state after the pass was left.
    The loader calls :meth:`end` as the pass stops, so that the state stays the one of the last
    batch delivered.
    """

    def __init__(self, layout: tuple[int, int, int], resume: list[dict[str, Any]] | None, next_shard: int,
                 delivered: list[int], config: PassConfig | None) -> None:
        self.layout = layout  # (world size, rank, shards per rank)
        self.resume = resume  # the states the shards resume from (None: a new pass)
        #: per shard: (its last state: a dict, or Pickled from a worker, items delivered past it)
        self.states: list[tuple[Any, int]] = [(FRESH if resume is None else resume[i], 0) for i in range(layout[2])]
        self.next = next_shard
        self.delivered = delivered
        self.config = config
        self.applied = 0
        self.log: deque[tuple[int, Any, int, bool]] = deque()
        self.lock = threading.Lock()
        self.stream: ShardStream | None = None
        #: the worker processes running the shards, while the pass lives (a weak reference, set by
        #: the worker stage as the pass is built: the run outlives the pass, and holds none of its
        #: processes); None in process
        self.workers: weakref.ReferenceType[Any] | None = None

    def record(self, shard: int, state: Any, next_shard: int, item: bool = True) -> None:
        """Shard ``shard`` yielded a batch (``item``; else it ended) and stands at ``state`` (``None``:
        one item past its last state); the next batch is ``next_shard``'s."""
        with self.lock:
            self.log.append((shard, state, next_shard, item))
            self._apply()

    def _apply(self) -> None:
        log, states, target = self.log, self.states, self.delivered[0]
        while log and (not log[0][3] or self.applied < target):
            shard, state, next_shard, item = log.popleft()
            last, past = states[shard]
            states[shard] = (last, past + 1) if state is None else (state, 0)
            self.next = next_shard
            self.applied += item

    def end(self, how: str) -> None:
        """The pass stopped: ``"done"`` (it ran out), ``"closed"`` (closed, dropped or collected
        after a batch) or ``"failed"`` (it raised). States that came with the batches need nothing; a
        shard read when asked (``stream``) is read one last time and let go of.

        Closed, its pass still stands after the last batch delivered (the loader closes it after
        this call), unless a cyclic garbage collection is running: the collector finalizes the
        pass's generators in any order, so some may have ended already. There, and when the pass
        failed (it can no longer say where it stood before the failure), the shard's state is where
        it started, with the batches delivered since to compute again and drop (``skip``)."""
        with self.lock:
            stream, self.stream = self.stream, None
            if stream is None:
                return
            intact = stream.done or stream.it is not None or self.delivered[0] == 0
            if how == "done" or how == "closed" and intact and not _collecting[0]:
                try:
                    state = stream.state()
                except Exception as e:  # noqa: BLE001 - a pass being closed: say why at state_dict()
                    state = {"error": f"its position could not be read as its pass closed ({type(e).__name__}: {e})"}
                self.states[0] = (state, 0)
                return
            problem = next((f"{stage_label(stage)} {why}" for stage in walk(stream.pipe)
                            if (why := _replay_problem(stage)) is not None), None)
            if problem is not None:
                what = "failed" if how == "failed" else "was collected by the cyclic garbage collector"
                self.states[0] = ({"error": f"its pass {what} after {self.delivered[0]} batches, and where it "
                                            f"stood then cannot be recomputed: {problem}; a state taken while the "
                                            f"pass ran resumes it"}, 0)
                return
            self.states[0] = (FRESH if self.resume is None else self.resume[0], self.delivered[0])

    def state(self, ended: bool) -> dict[str, Any]:
        """The pass's position on this rank (``ended``: it has run out)."""
        with self.lock:
            self._apply()
            if self.stream is not None:
                self.states[0] = (self.stream.state(), 0)
            shards = []
            for index, (state, past) in enumerate(self.states):
                if type(state) is Pickled:  # sent by this loader's worker, never read from a checkpoint
                    state = pickle.loads(state.data)
                if type(state) is not dict:
                    raise ValueError(f"DataLoader.state_dict: shard {index} of this rank stands at a "
                                     f"{type(state).__name__}, not a shard's state")
                if "error" in state:
                    raise TypeError(f"DataLoader.state_dict: shard {index} of this rank: {state['error']}")
                shards.append({**state, "skip": state.get("skip", 0) + past} if past else state)
            return {"layout": list(self.layout), "shards": shards, "next": self.next, "ended": ended}


class InProcess(IterDataPipe[Any]):
    """The source stage of the pipe :class:`~datapipes.loader.DataLoader` builds for
    ``num_workers=0``: the worker pipe, run in this process as a pass of its own (a shard, as a worker
    process runs it), whose position the loader reads for its ``state_dict``.

    ``eager``: the stages after this one buffer or read ahead, so the shard's state is taken with
    every batch (see :class:`ShardsRun`); otherwise only when asked for.
    """

    _runs_sources_elsewhere = True  # its pass is a shard's, not the loader's
    _unseen = True  # not shown in the pipe's repr: it changes no item

    def __init__(self, datapipe: IterDataPipe[Any], eager: bool) -> None:
        self.datapipe = datapipe
        self.eager = eager
        self._next_run: ShardsRun | None = None

    def prepare(self, run: ShardsRun) -> None:
        """Run the next pass as ``run`` says (seeds, resumed state) and keep its position there."""
        self._next_run = run

    def _open(self, ctx: Pass) -> Iterator[Any]:
        run, self._next_run = self._next_run, None
        if run is None:  # iterated by itself, not by the loader: a plain pass
            return ctx.open(self.datapipe)
        stream = ShardStream(self.datapipe, run.config, None if run.resume is None else run.resume[0])
        stream.inherit = shares.inherited(self, ctx)  # the loader's hooks and budget reach the shard's pass
        if not self.eager:
            run.stream = stream
            return stream.items()
        return _logged(stream, run)

    def __len__(self) -> int:
        return source_len(self, self.datapipe)


def _logged(stream: ShardStream, run: ShardsRun) -> Iterator[Any]:
    """The in-process shard's items, each recorded in ``run`` with the shard's state."""
    for item, state in stream.items_with_states():
        run.record(0, state, 0)
        yield item
    run.record(0, stream.state(), 0, item=False)


# -- resuming: the same layout, or another ----------------------------------------------------------


def plan(pipe: IterDataPipe[Any], saved: list[dict[str, Any]], layout: tuple[int, int, int],
         seed: int, epoch: int) -> tuple[list[Any], int]:
    """The states of this rank's shards (and the shard whose batch comes first) for a pass resuming
    ``saved`` (the pass states of one or every rank, as :meth:`ShardsRun.state` made them) with
    ``layout`` (world size, rank, shards per rank); ``seed`` and ``epoch`` are the saved pass's."""
    world, rank, per_rank = layout
    old_world, _, old_per_rank = saved[0]["layout"]
    by_rank = {int(state["layout"][1]): state for state in saved}
    if any(tuple(s["layout"][::2]) != (old_world, old_per_rank) for s in saved):
        raise ValueError(f"{_WHERE}: the states given were saved by loaders of different layouts "
                         f"({sorted({tuple(s['layout'][::2]) for s in saved})} as (ranks, shards per rank))")
    if (old_world, old_per_rank) == (world, per_rank) and rank in by_rank:
        mine = by_rank[rank]
        return list(mine["shards"]), int(mine["next"])
    if sorted(by_rank) != list(range(old_world)):
        raise ValueError(
            f"{_WHERE}: the state was saved by rank(s) {sorted(by_rank)} of {old_world} with {_shards(old_per_rank)} "
            f"each; resuming rank {rank} of {world} with {_shards(per_rank)} needs the state of every rank that "
            f"saved: give load_state_dict the list of all ranks' states (state_dict(all_ranks=True) gathers it)"
        )
    old = [shard for r in range(old_world) for shard in by_rank[r]["shards"]]
    count = len(old)
    old = [_settled(pipe, shard, PassConfig(seed, epoch, index, (count, index))) for index, shard in enumerate(old)]
    new = redistribute(pipe, old, world * per_rank)
    return new[rank * per_rank:(rank + 1) * per_rank], 0


def check_loader_state(state: dict[str, Any], what: str = "state") -> None:
    """Check a loader's state (what ``DataLoader.state_dict`` returned, ``format`` checked) before
    it is used: plain data of the expected types and ranges, down to each shard's pass states, whose
    stages check their own when the shard's pass loads them. ``ValueError`` naming the value."""
    for key in ("seed", "epoch", "epoch_set", "passes", "pass"):
        if key not in state:
            _refuse(f"{what} has no {key!r}")
    for key in ("epoch", "passes"):
        if type(state[key]) is not int or state[key] < 0:
            _refuse(f"{what}[{key!r}] must be an int >= 0, got {state[key]!r:.100}")
    if state["seed"] is not None and type(state["seed"]) is not int:
        _refuse(f"{what}['seed'] must be an int or None, got {state['seed']!r:.100}")
    if type(state["epoch_set"]) is not bool:
        _refuse(f"{what}['epoch_set'] must be a bool, got {state['epoch_set']!r:.100}")
    passes = state["pass"]
    if passes is None:
        return
    if type(passes) is not list or not passes:
        _refuse(f"{what}['pass'] must be None or a list of the ranks' pass states, got {passes!r:.100}")
    for r, one in enumerate(passes):
        _check_rank_state(one, f"{what}['pass'][{r}]")


def _refuse(message: str) -> NoReturn:
    raise ValueError(f"{_WHERE}: {message}")


def _check_rank_state(state: Any, what: str) -> None:
    if type(state) is not dict or any(key not in state for key in ("layout", "shards", "next", "ended")):
        _refuse(f"{what} must be a dict of 'layout', 'shards', 'next' and 'ended' (a rank's pass state), got "
                f"{str(state)[:200]}")
    layout = state["layout"]
    if (type(layout) is not list or len(layout) != 3 or any(type(x) is not int for x in layout)
            or layout[0] < 1 or not 0 <= layout[1] < layout[0] or layout[2] < 1):
        _refuse(f"{what}['layout'] must be [world size >= 1, rank below it, shards per rank >= 1], got "
                f"{layout!r:.100}")
    shards = state["shards"]
    if type(shards) is not list or len(shards) != layout[2]:
        _refuse(f"{what}['shards'] must be a list of {layout[2]} shard states (one per shard of the rank), got "
                f"{shards!r:.100}")
    if type(state["next"]) is not int or not 0 <= state["next"] < layout[2]:
        _refuse(f"{what}['next'] must be an int from 0 to {layout[2] - 1} (the shard whose batch comes next), got "
                f"{state['next']!r:.100}")
    if type(state["ended"]) is not bool:
        _refuse(f"{what}['ended'] must be a bool, got {state['ended']!r:.100}")
    for s, shard in enumerate(shards):
        _check_shard_state(shard, f"{what}['shards'][{s}]", f"shard {s} of rank {layout[1]}")


def _check_shard_state(shard: Any, what: str, which: str) -> None:
    if type(shard) is not dict:
        _refuse(f"{what} ({which}) must be a dict, got {type(shard).__name__}: a loader state is plain data "
                f"(a shard's state is never taken as pickled bytes)")
    if "error" in shard:
        if set(shard) != {"error"} or type(shard["error"]) is not str:
            _refuse(f"{what} must be {{'error': str}} or a shard's position, got {str(shard)[:200]}")
        return
    for key in ("tails", "main", "done"):
        if key not in shard:
            _refuse(f"{what} has no {key!r}")
    if type(shard["tails"]) is not list:
        _refuse(f"{what}['tails'] must be a list of pass states, got {shard['tails']!r:.100}")
    if type(shard["done"]) is not bool:
        _refuse(f"{what}['done'] must be a bool, got {shard['done']!r:.100}")
    skip = shard.get("skip", 0)
    if type(skip) is not int or skip < 0:
        _refuse(f"{what}['skip'] must be an int >= 0, got {skip!r:.100}")
    passes = [(f"{what}['tails'][{i}]", tail) for i, tail in enumerate(shard["tails"])]
    if shard["main"] is not None:
        passes.append((f"{what}['main']", shard["main"]))
    for name, one in passes:
        try:
            check_state(one, name)
        except ValueError as e:
            _refuse(str(e).removeprefix("load_state_dict: "))


def _sharding_run(run: Any, index: int) -> tuple[list[int], int, list[Any]]:
    """``(shard, kept, layers)`` of the sharding stage's state in saved shard ``index``, checked."""
    where = f"the sharding_filter's state in saved shard {index}"
    if type(run) is not dict or run.get("closed"):
        raise ValueError(f"{_WHERE}: {where} is not a position: {str(run)[:200]}")
    shard: Any = run.get("shard")
    kept, layers = run.get("kept"), run.get("layers", [])
    if type(shard) not in (list, tuple) or len(shard) != 2 or any(type(x) is not int for x in shard):
        raise ValueError(f"{_WHERE}: {where}: 'shard' must be [count, index], got {shard!r:.100}")
    if type(kept) is not int or kept < 0:
        raise ValueError(f"{_WHERE}: {where}: 'kept' must be an int >= 0, got {kept!r:.100}")
    if type(layers) is not list:
        raise ValueError(f"{_WHERE}: {where}: 'layers' must be a list, got {layers!r:.100}")
    return list(shard), kept, layers


def _settled(pipe: IterDataPipe[Any], shard: dict[str, Any], config: PassConfig) -> dict[str, Any]:
    """``shard``'s state with no items to skip: the items past its saved position recomputed here,
    on its behalf (``config.placed``), and its state taken after them."""
    if not shard.get("skip") or "error" in shard:
        return shard
    stream = ShardStream(pipe, config, shard)
    items = stream.items()  # recomputes and drops the items to skip
    try:
        return stream.state()
    finally:
        items.close()


def _shards(n: int) -> str:
    return "1 process (num_workers=0)" if n == 1 else f"{n} workers"


def _replay_problem(stage: Any) -> str | None:
    """Why ``stage`` may give other items, or another order, when its pass is run again."""
    if getattr(stage, "ordered", True) is False:
        return "yields in completion order (ordered=False)"
    if getattr(stage, "non_deterministic", False) is True:
        return "lists files in no fixed order (non_deterministic=True)"
    if stage._one_shot or stage._async:
        return "reads a one-shot or async iterable, which cannot be read again"
    return None


def redistribute(pipe: IterDataPipe[Any], old: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """The states of ``count`` new shards that together deliver exactly what the ``old`` shards
    (states, in shard order) had not delivered yet (see the module's docstring).

    Several sharding stages (a worker mixing its own shard of each source: ``Mixer`` over sources
    each below its own ``sharding_filter``) split again each on its own, their tails closing them
    all; every stage that joins sharded branches must say it can (``_splits_per_source``).

    Raises:
        ValueError: the pipe has no ``sharding_filter``; sharding stages one above another, or joined
            by a stage that cannot split per source (named); the stages above a sharding stage may
            give other items in another pass (the message names the stage); a stage below refuses
            its saved state (a ``Mixer`` that restarted a sharded source); or a saved shard was not
            read by the layout's placement (``apply_sharding`` or a sharding group filter).
    """
    keys = stage_keys(pipe)
    graph = [type(stage).__qualname__ for _, stage in keys]
    for shard in old:
        saved = (shard.get("main") or {}).get("graph")
        if saved is not None and saved != graph:
            raise ValueError(
                f"{_WHERE}: the state was saved from a pipe of another shape ({' <- '.join(saved)}; this loader runs "
                f"{' <- '.join(graph)}). A loader with num_workers > 0 adds a sharding_filter() to a pipe that has "
                f"none: put .sharding_filter() in the pipe itself to resume with another num_workers"
            )
    sharding = [(key, stage) for key, stage in keys if is_sharding_stage(stage)]
    if not sharding:
        raise ValueError(
            f"{_WHERE}: the state was saved with another number of workers or ranks, and the pipe has no "
            f"sharding_filter(): its items cannot be split again among the new ones. Resume with the same "
            f"num_workers and world size, or put one .sharding_filter() right after the source"
        )
    above = {key: {id(s) for source in (getattr(stage, "source_datapipe", None),) if source is not None
                   for s in walk(source)} for key, stage in sharding}
    upstream_ids = set().union(*above.values())
    _check_sharding_layout(keys, sharding, above, upstream_ids)
    for key, shard_stage in sharding:
        for name, stage in keys:
            problem = _replay_problem(stage) if id(stage) in above[key] else None
            if problem is not None:
                raise ValueError(
                    f"{_WHERE}: the state was saved with another number of workers or ranks; splitting what is "
                    f"left among the new ones reads the stages above {stage_label(shard_stage)} again, and "
                    f"{stage_label(stage)} {problem}, so the items left could differ from those saved. Resume "
                    f"with the same num_workers and world size, or make the stages above sharding_filter() "
                    f"deterministic"
                )
    below = [(name, stage) for name, stage in keys if id(stage) not in upstream_ids and not is_sharding_stage(stage)]
    for index, shard in enumerate(old):
        if "error" in shard:
            raise ValueError(f"{_WHERE}: shard {index} of the state saved no position: {shard['error']}")
        states = {} if shard["main"] is None else shard["main"]["stages"]
        for name, stage in below:
            check = getattr(stage, "_relayout_problem", None)
            problem = None if check is None or name not in states else check(states[name])
            if problem is not None:
                raise ValueError(f"{_WHERE}: the state was saved with another number of workers or ranks, and "
                                 f"{stage_label(stage)} in saved shard {index} {problem}")
    fresh = {key: _new_layers(key, stage_label(stage), old) for key, stage in sharding}
    upstream = {name for name, stage in keys if id(stage) in upstream_ids}
    sharding_keys = {key for key, _ in sharding}
    tails = [tail for shard in old for tail in shard["tails"]]
    tails += [_closed(shard["main"], sharding_keys, upstream, below) for shard in old
              if shard["main"] is not None and not shard["done"] and set(shard["main"]["stages"]) - sharding_keys]
    return [{"tails": tails[j::count], "done": False,
             "main": _pass.state_of(graph, {key: {**state, "shard": [count, j]} for key, state in fresh.items()})}
            for j in range(count)]


def _check_sharding_layout(keys: list[tuple[str, Any]], sharding: list[tuple[str, Any]],
                           above: dict[str, set[int]], upstream: set[int]) -> None:
    """Several sharding stages split again each on its own only side by side (none above another)
    and joined by stages made for it; ``ValueError`` naming the stage otherwise."""
    if len(sharding) < 2:
        return
    for key, stage in sharding:
        if id(stage) in upstream:
            raise ValueError(
                f"{_WHERE}: the state was saved with another number of workers or ranks, and {stage_label(stage)} "
                f"is above another sharding stage: items sharded twice cannot be split again. Resume with the "
                f"same num_workers and world size, or keep one sharding_filter per branch")
    sharded = {id(stage) for _, stage in sharding}
    for _, stage in keys:
        if id(stage) in upstream:
            continue
        branches = [src for src in sources_of(stage) if any(id(s) in sharded for s in walk(src))]
        if len(branches) > 1 and not getattr(stage, "_splits_per_source", False):
            raise ValueError(
                f"{_WHERE}: the state was saved with another number of workers or ranks, and {stage_label(stage)} "
                f"joins {len(branches)} branches each below its own sharding_filter: their items would be split "
                f"again each on its own, and what {stage_label(stage)} pairs or orders would change. Resume with "
                f"the same num_workers and world size, or put one .sharding_filter() after the join (a Mixer "
                f"splits per source)")


def _new_layers(key: str, label: str, old: list[dict[str, Any]]) -> dict[str, Any]:
    """The state of the sharding stage ``key`` in a new shard (less its ``shard``): the layers the
    old shards' states recorded, and one more for what the old layout took."""
    kept: list[int] = []
    layers: list[Any] | None = None
    for index, shard in enumerate(old):
        run = None if shard["main"] is None else shard["main"]["stages"].get(key)
        if run is None:
            kept.append(0)
            continue
        saved_shard, saved_kept, mine = _sharding_run(run, index)
        if saved_shard != [len(old), index]:
            raise ValueError(
                f"{_WHERE}: {label} of saved shard {index} read shard {saved_shard[1]} of "
                f"{saved_shard[0]}, not the shard of its worker and rank ({index} of {len(old)}: apply_sharding or "
                f"a sharding group filter was used), so its items cannot be split again; resume with the same "
                f"num_workers and world size"
            )
        kept.append(saved_kept)
        if layers is not None and mine != layers:
            raise ValueError(f"{_WHERE}: the shards of the state disagree on the layouts before it (not saved together)")
        layers = mine
    new_layers = [*(layers or []), [len(old), kept]]
    return {"shard": None, "kept": 0, "layers": new_layers, "counters": [0] * (len(new_layers) + 1)}


def _closed(main: dict[str, Any], sharding: set[str], upstream: set[str],
            below: list[tuple[str, Any]]) -> dict[str, Any]:
    """``main``, a shard's pass state, as a tail: its sharding filters closed, nothing above them
    kept, and the stages below that finish differently in a tail (``_tail_state``) told so."""
    stages = {name: state for name, state in main["stages"].items() if name not in upstream}
    for name, stage in below:
        tail_state = getattr(stage, "_tail_state", None)
        if tail_state is not None and name in stages:
            stages[name] = tail_state(stages[name])
    for key in sharding:
        stages[key] = {"closed": True}
    return _pass.state_of(main["graph"], stages)


def loader_layout(num_workers: int) -> tuple[int, int, int]:
    """(world size, rank, shards per rank) of a loader pass starting here."""
    where = placement()
    return where.world_size, where.rank, max(num_workers, 1)


def merged_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """One loader state from the states of several ranks (each one's ``pass`` entries joined)."""
    first = states[0]
    for other in states[1:]:
        for field in ("seed", "epoch"):
            if other[field] != first[field]:
                raise ValueError(f"{_WHERE}: the ranks' states disagree on the {field} "
                                 f"({first[field]!r} and {other[field]!r}): they were not saved together")
    passes = [p for one in states for p in (one["pass"] or ())]
    if passes and any(one["pass"] is None for one in states):
        raise ValueError(f"{_WHERE}: some of the ranks' states were saved before their first pass "
                         f"and others in one: they were not saved together")
    by_rank = {int(p["layout"][1]): p for p in passes}
    return {**first, "pass": [by_rank[r] for r in sorted(by_rank)] if passes else None}
