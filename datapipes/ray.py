"""Ray: a stage's calls on a Ray cluster (:class:`RayExecutor`), a pipe handed to Ray Data and Ray
Train (:func:`to_dataset`), and a Ray Dataset or ``DataIterator`` read as a pipe's source
(:func:`from_ray`). docs/howto/cluster.rst walks from one host to a cluster.

Install with ``pip install "datapipes[ray]"``; importing this module without Ray raises
``ImportError`` saying so. Nothing here starts Ray: call ``ray.init(...)`` (or ``ray.init("auto")``
on a cluster) first, or Ray starts a local runtime at the first task, with its own defaults.

What stays on the driver: the order of the items, the bound on the items in flight, failure budgets
and the pass's position (``state_dict()``), so a pipe with a Ray stage resumes exactly. What Ray
cannot give back is a position inside a Ray Dataset: a pass over :func:`from_ray` cannot resume, and
says so.
"""

from __future__ import annotations

import concurrent.futures
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any

try:
    import ray
    import ray.data
    from ray.data.block import BlockAccessor, BlockMetadata
    from ray.data.datasource import Datasource, ReadTask
except ImportError as e:  # pragma: no cover - the [ray] extra is missing
    raise ImportError(
        f"datapipes.ray needs Ray with Ray Data: pip install 'datapipes[ray]' (importing it failed: {e})"
    ) from e

from ._runtime.passes import Pass
from ._checks import require_int
from ._runtime.seeds import draw_seed
from ._runtime.worker import set_loader_seed
from .datapipe import IterDataPipe
from .graph import stage_label, traverse
from .iter.sharding import apply_sharding, is_sharding_stage
from .iter.util import _Unresumable

__all__ = ["RayDataReader", "RayExecutor", "from_ray", "to_dataset"]

# -- RayExecutor -----------------------------------------------------------------------------------

#: callables a Ray worker process keeps, by the id of their object in Ray's object store
_KEPT: OrderedDict[str, Any] = OrderedDict()
_KEPT_LIMIT = 32
_KEPT_LOCK = threading.Lock()
_MISSING = object()
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colours of Ray's error text


class _Shipped:
    """A callable placed in Ray's object store once per executor: a worker process fetches it at its
    first call and keeps it (:data:`_KEPT`), so a function with a heavy setup done at its first call
    (a model, a tokenizer) keeps it across calls, and each task carries a reference, not the callable."""

    __slots__ = ("key", "ref")

    def __init__(self, ref: Any) -> None:
        self.key = ref.hex()
        self.ref = ref  # nested in this object, so Ray passes the reference and the worker fetches it once

    def __getstate__(self) -> tuple[str, Any]:
        return self.key, self.ref

    def __setstate__(self, state: tuple[str, Any]) -> None:
        self.key, self.ref = state


def _unship(value: Any) -> Any:
    if type(value) is not _Shipped:
        return value
    with _KEPT_LOCK:
        found = _KEPT.get(value.key, _MISSING)
        if found is not _MISSING:
            _KEPT.move_to_end(value.key)
            return found
    found = ray.get(value.ref)
    with _KEPT_LOCK:
        _KEPT[value.key] = found
        while len(_KEPT) > _KEPT_LIMIT:
            _KEPT.popitem(last=False)
    return found


def _call(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What a Ray task or actor runs for one ``submit``."""
    return _unship(fn)(*[_unship(a) for a in args], **kwargs)


class _Host:
    """An actor of a :class:`RayExecutor`'s pool: its calls run one at a time in its own process,
    which keeps the callables it was sent."""

    def call(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return _call(fn, args, kwargs)


_task = ray.remote(_call)
_host = ray.remote(_Host)


#: seconds a cancelled task may take to stop before its worker process is killed
_FORCE_AFTER = 1.0


def _force_cancel(ref: Any) -> None:
    if not ray.is_initialized():  # shut down meanwhile (and ray.wait would start a new runtime)
        return
    try:
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            ray.cancel(ref, force=True)
    except Exception:  # noqa: BLE001 - it ended meanwhile, or Ray is shut down
        pass


def _unwrapped(error: BaseException) -> BaseException:
    """The exception a task raised, as its own type: Ray's ``RayTaskError`` wraps it (and subclasses
    its type); the original travels as ``cause``. Ray's own failures (a dead worker or actor, a lost
    object, a cancelled task) pass as they are."""
    if isinstance(error, ray.exceptions.RayTaskError):
        cause = error.__dict__.get("cause")
        if isinstance(cause, BaseException) and not isinstance(cause, ray.exceptions.RayError):
            # str() of Ray's error is its header (the task, its pid and node) and the traceback there
            cause.add_note("raised on the Ray cluster, in " + _ANSI.sub("", str(error)).strip())
            return cause
    return error


class _RayFuture(Future[Any]):
    """The future of one Ray call: it holds the call's ``ObjectRef`` (so the result stays alive), and
    :meth:`cancel` reaches the task with ``ray.cancel``, running or not."""

    def __init__(self, ref: Any, owner: RayExecutor, actor: int | None) -> None:
        super().__init__()
        self.ref = ref
        self._owner = owner
        self._actor = actor

    def cancel(self) -> bool:
        # The future stays PENDING until Ray answers, so a running task can be cancelled too. Ray
        # interrupts a running task with a KeyboardInterrupt, which Python sees only between two
        # bytecodes: a task blocked in C (a sleep, a read, a long numpy call) goes on. A task that has
        # not ended _FORCE_AFTER seconds later is stopped by killing its worker process, so its CPUs
        # go back to the cluster. (Ray does not kill for an actor's call: the actor runs it to its
        # end, and shutdown() kills the actors.)
        if not super().cancel():
            return False
        self._owner._settled(self)
        if not ray.is_initialized():  # Ray was shut down, and its tasks with it
            return True
        try:
            ray.cancel(self.ref)
        except Exception:  # noqa: BLE001 - the task ended meanwhile, or Ray is shut down: nothing to stop
            return True
        if self._actor is None:
            timer = threading.Timer(_FORCE_AFTER, _force_cancel, (self.ref,))
            timer.daemon = True
            timer.start()
        return True

    def _take(self, inner: Future[Any]) -> None:
        """Copy the outcome of Ray's own future for the reference onto this one."""
        self._owner._settled(self)
        try:
            try:
                value = inner.result()
            except BaseException as e:  # noqa: BLE001 - handed to the future's reader, as a thread pool does
                try:
                    e = _unwrapped(e)
                except Exception:  # noqa: BLE001 - Ray's error as it is, rather than a future never done
                    pass
                self.set_exception(e)
            else:
                self.set_result(value)
        except concurrent.futures.InvalidStateError:  # cancelled meanwhile: the outcome is not wanted
            pass


def _non_negative(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"RayExecutor: {name} must be a number >= 0, got {value!r}")
    return value


class RayExecutor(Executor):
    """A ``concurrent.futures.Executor`` whose calls run as Ray tasks, or on a pool of Ray actors.

    ``pipe.map(fn, concurrency=16, executor=RayExecutor(), chunksize=32)`` runs ``fn`` on the
    cluster, 32 items per task and 16 tasks in flight, while the order, the bound on items in flight,
    failure budgets and the position for ``state_dict()`` stay with the pass on the driver. Give it a
    ``chunksize``: a Ray task costs about a millisecond, so one task per item only pays for an ``fn``
    that takes far longer (docs/performance.rst, "Executors on a cluster").

    Args:
        num_cpus, num_gpus, resources: what each task (or each actor) reserves on the cluster, as in
            ``ray.remote``: ``num_cpus=1`` and ``num_gpus=0`` by default; ``resources`` maps custom
            resource names to amounts.
        runtime_env: Ray's ``runtime_env`` for the tasks or actors (``{"pip": [...]}``,
            ``{"env_vars": {...}}``, ...). The worker processes must be able to import ``datapipes``
            and whatever ``fn`` needs: on a cluster, install them there or list them here.
        actors: ``None`` (the default) runs each call as a task. An int ``n`` starts a pool of ``n``
            actors at the first call; each call goes to the actor with the fewest calls in flight. An
            actor is one process that stays: use one for an ``fn`` with a heavy setup (a model, a
            tokenizer) that it does at its first call and keeps. Actors hold their CPUs (and GPUs)
            until :meth:`shutdown`, also while idle: tasks of other stages that need them wait,
            without an error (give those stages a ``timeout``).
        max_retries: times Ray runs a task again after its worker process died (not after ``fn``
            raised); for actors, times an actor is restarted and its call retried. ``-1``: no limit.

    Callables (the function given to :meth:`submit`, and arguments that are callable) travel to the
    cluster once per executor, as Ray exports a remote function once, and a worker process keeps
    them: a callable whose state changes between calls sees its first state there.

    Errors: an exception raised by the call arrives with its own type (not as Ray's
    ``RayTaskError``), with a note holding its traceback on the cluster; in a pipe, the stage adds
    its own note (the stage and the item). Ray's own failures (a worker that died, a lost object)
    arrive as Ray raises them.

    :meth:`cancel` of a future calls ``ray.cancel``, whether the task has started or not, so closing
    a pass frees the CPUs its tasks held: a task that has not stopped a second later (one blocked in C
    code, which Ray's interrupt does not reach) has its worker process killed. An actor's call runs
    to its end. A task that cannot be scheduled (its resources are held by
    actors, or no node has them) waits in Ray's queue: give the stage a ``timeout=`` to fail the pass
    instead. The executor is a context manager; :meth:`shutdown` releases the actors. A copy made by
    pickling (a pipe sent to DataLoader workers or to a Ray task) is a new executor with the same
    settings.

    Example (not run here: it needs a Ray runtime):

    .. code-block:: python

        import ray
        from datapipes.iter import IterableWrapper
        from datapipes.ray import RayExecutor

        ray.init()
        with RayExecutor(num_cpus=1) as cluster:
            pipe = IterableWrapper(paths).map(decode, concurrency=16, executor=cluster, chunksize=32)
            for item in pipe:
                ...
    """

    def __init__(self, *, num_cpus: float = 1, num_gpus: float = 0, resources: Mapping[str, float] | None = None,
                 runtime_env: Mapping[str, Any] | None = None, actors: int | None = None,
                 max_retries: int = 0) -> None:
        self.num_cpus = _non_negative(num_cpus, "num_cpus")
        self.num_gpus = _non_negative(num_gpus, "num_gpus")
        if resources is not None:
            if not isinstance(resources, Mapping):
                raise TypeError(f"RayExecutor: resources must be a mapping of resource names to amounts or None, "
                                f"got {type(resources).__name__}")
            for key, amount in resources.items():
                if not isinstance(key, str):
                    raise TypeError(f"RayExecutor: resources: the name of a resource must be a str, got {key!r}")
                _non_negative(amount, f"resources[{key!r}]")
            resources = dict(resources)
        if runtime_env is not None and not isinstance(runtime_env, Mapping):
            raise TypeError(f"RayExecutor: runtime_env must be a mapping (Ray's runtime_env) or None, "
                            f"got {type(runtime_env).__name__}")
        require_int(actors, "RayExecutor", "actors", minimum=1, optional=True)
        require_int(max_retries, "RayExecutor", "max_retries", minimum=-1)
        self.resources = resources
        self.runtime_env = None if runtime_env is None else dict(runtime_env)
        self.actors = actors
        self.max_retries = max_retries
        self._lock = threading.Lock()
        self._shut = False
        self._inflight: dict[_RayFuture, int | None] = {}  # future -> the actor running it (None: a task)
        self._load: list[int] = []  # calls in flight per actor
        self._pool: list[Any] = []  # the actor handles, started at the first call
        self._shipped: OrderedDict[int, tuple[Any, _Shipped]] = OrderedDict()  # id(callable) -> (it, its ref)
        self._remote: Any = None

    def __repr__(self) -> str:
        shown = [f"num_cpus={self.num_cpus}"]
        shown += [f"{name}={value!r}" for name, value, default in (
            ("num_gpus", self.num_gpus, 0), ("resources", self.resources, None), ("actors", self.actors, None),
            ("max_retries", self.max_retries, 0)) if value != default]
        return f"RayExecutor({', '.join(shown)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return partial(RayExecutor, num_cpus=self.num_cpus, num_gpus=self.num_gpus, resources=self.resources,
                       runtime_env=self.runtime_env, actors=self.actors, max_retries=self.max_retries), ()

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.resources:
            options["resources"] = self.resources
        if self.runtime_env is not None:
            options["runtime_env"] = self.runtime_env
        return options

    def _start(self) -> None:
        """Build the remote function, or start the actors (under the lock, at the first call)."""
        if self.actors is None:
            self._remote = _task.options(max_retries=self.max_retries, retry_exceptions=False, **self._options())
            return
        actor = _host.options(max_restarts=self.max_retries, max_task_retries=self.max_retries, **self._options())
        self._pool = [actor.remote() for _ in range(self.actors)]
        self._load = [0] * self.actors

    def _ship(self, value: Any) -> Any:
        key = id(value)
        with self._lock:
            found = self._shipped.get(key)
            if found is not None:
                self._shipped.move_to_end(key)
                return found[1]
        shipped = _Shipped(ray.put(value))
        with self._lock:
            self._shipped[key] = (value, shipped)  # the callable is held, so its id is not reused
            while len(self._shipped) > _KEPT_LIMIT:
                self._shipped.popitem(last=False)
        return shipped

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run ``fn(*args, **kwargs)`` on the cluster; the future holds the call's ``ObjectRef``."""
        if self._shut:  # checked again below, under the lock; nothing is sent to Ray after shutdown
            raise RuntimeError("RayExecutor: cannot submit after shutdown()")
        payload = (self._ship(fn), tuple(self._ship(a) if callable(a) else a for a in args), kwargs)
        with self._lock:
            if self._shut:
                raise RuntimeError("RayExecutor: cannot submit after shutdown()")
            if self._remote is None and not self._pool:
                self._start()
            actor = None
            if self._pool:
                actor = min(range(len(self._load)), key=self._load.__getitem__)
                self._load[actor] += 1
        if actor is None:
            ref = self._remote.remote(*payload)
        else:
            ref = self._pool[actor].call.remote(*payload)
        future = _RayFuture(ref, self, actor)
        with self._lock:
            self._inflight[future] = actor
        ref.future().add_done_callback(future._take)
        return future

    def _settled(self, future: _RayFuture) -> None:
        """``future`` is done or cancelled: it leaves the calls in flight (and its actor's count)."""
        with self._lock:
            if self._inflight.pop(future, _MISSING) is _MISSING:
                return
            if future._actor is not None and self._load:
                self._load[future._actor] -= 1
            release = self._shut and not self._inflight
        if release:
            self._release()

    def _release(self) -> None:
        with self._lock:
            pool, self._pool, self._load = self._pool, [], []
        if not ray.is_initialized():  # the actors ended with the runtime
            return
        for actor in pool:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - the actor is gone already, or Ray is shut down
                pass

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; ``cancel_futures`` cancels those in flight (``ray.cancel``); ``wait`` waits
        for the others. The actors are killed once no call is in flight (at once with ``wait``).
        Idempotent."""
        with self._lock:
            self._shut = True
            pending = list(self._inflight)
        if cancel_futures:
            for future in pending:
                future.cancel()
        if wait:
            concurrent.futures.wait(pending)
        with self._lock:
            idle = not self._inflight
        if idle:
            self._release()


# -- to_dataset ------------------------------------------------------------------------------------

#: a block of a Dataset written by to_dataset ends at this many rows, or at about this many bytes
_BLOCK_ROWS = 1024
_BLOCK_BYTES = 64 << 20


def _row(item: Any) -> dict[str, Any]:
    """A Ray Data row: a mapping with str keys is one as it is; anything else is ``{"item": item}``,
    as ``ray.data.from_items`` stores it."""
    if isinstance(item, Mapping) and item and all(isinstance(k, str) for k in item):
        return dict(item)
    return {"item": item}


def _size(row: dict[str, Any]) -> int:
    total = 0
    for value in row.values():
        nbytes = getattr(value, "nbytes", None)
        if isinstance(nbytes, int):
            total += nbytes
        elif isinstance(value, (bytes, bytearray, str)):
            total += len(value)
        else:
            total += 64
    return total


def _block(rows: list[dict[str, Any]]) -> Any:
    return BlockAccessor.batch_to_block({key: [row[key] for row in rows] for key in rows[0]})


def _read_shard(pipe: IterDataPipe[Any], num_shards: int, index: int, seed: int) -> Iterator[Any]:
    """The blocks of shard ``index``: runs in a Ray read task, on a copy of the pipe."""
    set_loader_seed(pipe, seed)
    apply_sharding(pipe, num_shards, index)
    rows: list[dict[str, Any]] = []
    keys: tuple[str, ...] = ()
    size = 0
    for item in pipe:
        row = _row(item)
        if rows and (len(rows) >= _BLOCK_ROWS or size >= _BLOCK_BYTES or tuple(row) != keys):
            yield _block(rows)
            rows, size = [], 0
        keys = tuple(row)
        rows.append(row)
        size += _size(row)
    if rows:
        yield _block(rows)


class _PipeDatasource(Datasource):
    """A pipe as a Ray Data source: one read task per shard of its ``sharding_filter``."""

    def __init__(self, pipe: IterDataPipe[Any], num_shards: int, seed: int) -> None:
        self.pipe = pipe
        self.num_shards = num_shards
        self.seed = seed

    def get_name(self) -> str:
        return "datapipes"

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(self, parallelism: int, *args: Any, **kwargs: Any) -> list[ReadTask]:
        # Ray's signature grew keyword arguments over releases (per_task_row_limit, data_context); a
        # shard is read whole, by one task, whatever parallelism Ray asks for.
        return [
            ReadTask(partial(_read_shard, self.pipe, self.num_shards, index, self.seed),
                     BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None))
            for index in range(self.num_shards)
        ]


def to_dataset(pipe: IterDataPipe[Any], *, num_shards: int, seed: int | None = None) -> Any:
    """A ``ray.data.Dataset`` of ``pipe``'s items, read in parallel: one read task per shard.

    Args:
        pipe: an ``IterDataPipe`` with a ``sharding_filter()``: read task ``k`` reads shard ``k`` of
            ``num_shards`` (``apply_sharding``), on a copy of the pipe. The stages above the filter run
            in every task, so put it right after the source (after a shuffle, for a shuffled dataset).
        num_shards: the number of read tasks, an int >= 1 (the most reads that run at once; Ray
            starts as many as its CPUs allow).
        seed: the seed every shard shares, an int; ``None`` draws one on the driver from torch's
            global generator. Random stages above the ``sharding_filter`` that the user did not seed
            take their seeds from it, in every task alike, so a ``shuffle()`` before the filter gives
            every item exactly once. The same seed gives the same order in every epoch: for a new
            order, build a dataset per epoch with another seed.

    Returns:
        A lazy ``ray.data.Dataset``. An item that is a mapping with str keys is a row as it is; any
        other item is the row ``{"item": item}`` (``ray.data.from_items``'s convention). Ray stores
        rows in Arrow blocks: tensors come back as numpy arrays. Ray Train users pass it as
        ``datasets={"train": ds}`` and read ``ray.train.get_dataset_shard("train")`` in each worker
        (wrap that in :func:`from_ray` to keep building the pipe there).

    Raises:
        ValueError: ``pipe`` has no ``sharding_filter()`` (every task would read every item), or
            ``num_shards`` is not >= 1.
        TypeError: ``pipe`` is not an ``IterDataPipe``, ``num_shards`` or ``seed`` not an int.

    A Dataset's position cannot be saved: resume by what Ray Train saves (its checkpoints at epoch
    ends), or read the pipe itself where exact resume matters.
    """
    if not isinstance(pipe, IterDataPipe):
        raise TypeError(f"to_dataset: pipe must be an IterDataPipe, got {type(pipe).__name__}")
    require_int(num_shards, "to_dataset", "num_shards", minimum=1)
    require_int(seed, "to_dataset", "seed", optional=True)
    if not any(is_sharding_stage(stage) for stage in traverse(pipe)):
        raise ValueError(
            f"to_dataset: the pipe has no sharding_filter(), so each of the {num_shards} read tasks would read "
            f"every item and the Dataset would hold each of them {num_shards} times. Put .sharding_filter() right "
            f"after the source (after the shuffle, if any): {pipe!r}"
        )
    datasource = _PipeDatasource(pipe, num_shards, draw_seed() if seed is None else seed)
    return ray.data.read_datasource(datasource, override_num_blocks=num_shards)


# -- from_ray --------------------------------------------------------------------------------------

_BATCH_FORMATS = ("numpy", "pandas", "pyarrow", "default")


class RayDataReader(IterDataPipe[Any]):
    """Read a Ray ``Dataset`` or ``DataIterator`` as the source of a pipe [``from_ray``].

    Args:
        dataset: a ``ray.data.Dataset``, or a ``ray.data.DataIterator`` (what
            ``ray.train.get_dataset_shard`` and ``Dataset.streaming_split`` return).
        batch_size: ``None`` (the default) yields rows, dicts of column to value; an int >= 1 yields
            batches of that many rows (the last may be smaller), as ``iter_batches`` gives them.
        batch_format: the form of a batch, with ``batch_size``: ``"numpy"`` (a dict of column to
            array, the default), ``"pandas"``, ``"pyarrow"`` or ``"default"``.

    Yields:
        Rows, or batches, in the order Ray gives them. Each ``iter()`` reads the dataset again (a new
        epoch of a ``DataIterator``).

    Raises:
        TypeError: ``dataset`` is neither a Dataset nor a DataIterator; ``batch_size`` is not an int.
        ValueError: ``batch_size`` < 1, an unknown ``batch_format``, or a ``batch_format`` without
            ``batch_size``.

    ``len()`` raises ``TypeError``: a Dataset's size is known only by running it (``ds.count()``).
    Checkpoint: a pass cannot save its position, since Ray cannot start a Dataset mid-epoch:
    ``state_dict()`` raises ``TypeError`` naming this source, never a silent replay.

    With ``streaming_split(n)``, every one of the ``n`` iterators must be read, and at the same pace:
    Ray feeds them together, so one left unread blocks the others.
    """

    def __init__(self, dataset: Any, batch_size: int | None = None, batch_format: str = "numpy") -> None:
        if not isinstance(dataset, (ray.data.Dataset, ray.data.DataIterator)):
            raise TypeError(f"from_ray: dataset must be a ray.data.Dataset or a ray.data.DataIterator, "
                            f"got {type(dataset).__name__}")
        require_int(batch_size, "from_ray", "batch_size", minimum=1, optional=True)
        if batch_format not in _BATCH_FORMATS:
            raise ValueError(f"from_ray: batch_format must be one of {', '.join(map(repr, _BATCH_FORMATS))}, "
                             f"got {batch_format!r}")
        if batch_size is None and batch_format != "numpy":
            raise ValueError(f"from_ray: batch_format={batch_format!r} applies to batches; give batch_size too "
                             f"(without it, the items are rows)")
        self.dataset = dataset
        self.batch_size = batch_size
        self.batch_format = batch_format

    def _open(self, ctx: Pass) -> Iterator[Any]:
        ctx.track(self, _Unresumable(
            f"{stage_label(self)} cannot save its position: Ray cannot start a {type(self.dataset).__name__} again "
            f"mid-epoch, so a resumed pass would read it from its start. Save at epoch ends, or read the pipe "
            f"itself (not through Ray Data) where exact resume matters"))
        if self.batch_size is None:
            return iter(self.dataset.iter_rows())
        return iter(self.dataset.iter_batches(batch_size=self.batch_size, batch_format=self.batch_format))

    def __len__(self) -> int:
        raise TypeError(f"{stage_label(self)} has no len(): a Ray {type(self.dataset).__name__}'s size is known "
                        f"only by reading it (Dataset.count() runs it)")


def from_ray(dataset_or_iterator: Any, *, batch_size: int | None = None, batch_format: str = "numpy") -> RayDataReader:
    """A pipe reading a Ray ``Dataset`` or ``DataIterator``: see :class:`RayDataReader`.

    In a Ray Train worker: ``from_ray(ray.train.get_dataset_shard("train"), batch_size=32)``, then
    the pipe's own stages.
    """
    return RayDataReader(dataset_or_iterator, batch_size=batch_size, batch_format=batch_format)
