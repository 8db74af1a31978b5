"""SPDL's ``spdl.dataloader.DataLoader``: :class:`datapipes.DataLoader` with SPDL's signature, defaults
and failure handling, its stages built by :class:`~datapipes.spdl.PipelineBuilder`, the rest
translated into the loader's torch spelling as :class:`datapipes.DataLoader` translates it
(:func:`datapipes.loader.spdl_spelling.from_spdl`)."""

from __future__ import annotations

from typing import Any, AsyncIterable, Callable, Iterable, Iterator

from ..loader import DataLoader as _DataLoader
from ..loader.spdl_spelling import from_spdl
from ._builder import PipelineBuilder
from ._pipeline import _failure

__all__ = ["DataLoader"]


def _spdl_errors(it: Iterator[Any]) -> Iterator[Any]:
    """The loader's batches; what ends the pass raised as SPDL does (:class:`PipelineFailure`), but
    the ``TimeoutError`` of ``timeout``."""
    try:
        yield from it
    except TimeoutError:
        raise
    except Exception as e:
        raise _failure(e) from None


class DataLoader(_DataLoader[Any]):
    """SPDL's data loader (``spdl.dataloader.DataLoader``): the items of ``src`` preprocessed
    concurrently, grouped, aggregated, transferred and buffered, with SPDL's arguments and
    defaults.

    It is a :class:`datapipes.DataLoader` whose stages are those :class:`PipelineBuilder` builds
    for SPDL's ``PipelineBuilder().add_source(src).pipe(preprocessor, concurrency=num_threads,
    output_order=...).aggregate(batch_size, drop_last=...).pipe(aggregator, ...).pipe(transfer_fn)``:
    results in completion order by default, a failing item logged and dropped, ``None`` results
    dropped. Beyond SPDL, ``state_dict()``/``load_state_dict()`` and ``set_epoch()`` work as on
    :class:`datapipes.DataLoader`, and ``loader.pipe`` is the pipe it runs.

    Args:
        src: the items: an iterable or an async iterable. A re-iterable source (a list, a range)
            gives a new epoch at every ``iter(loader)``; a generator gives one (iterating the loader
            again raises a ``PipelineFailure`` whose ``RuntimeError`` says so, where SPDL yields
            nothing).
        preprocessor: a function, async function, generator function or async generator function
            applied to each item, ``num_threads`` at a time.
        batch_size: items per list given to ``aggregator`` (``None`` or ``0``: no grouping).
        drop_last: drop the last, incomplete list.
        aggregator: a function (or async function) applied to each list, ``num_threads`` at a time.
        transfer_fn: applied to each aggregate on one thread (a device copy).
        buffer_size: aggregates buffered ahead of the consumer.
        num_threads: the most worker threads the stages run together.
        timeout: seconds to wait for each aggregate (``TimeoutError`` after); ``None``: no limit.
        output_order: ``"completion"`` (the default) or ``"input"``.

    Raises:
        PipelineFailure: while iterating, the source (or a stage's pass) failed: after the
            aggregates before the failure.
        TimeoutError: while iterating, no aggregate came within ``timeout`` seconds.

    Example:
        >>> from datapipes.spdl import DataLoader
        >>> loader = DataLoader(range(10), preprocessor=lambda x: x * 2, batch_size=3, output_order="input")
        >>> list(loader)
        [[0, 2, 4], [6, 8, 10], [12, 14, 16], [18]]
        >>> sorted(sum(DataLoader(range(10), preprocessor=lambda x: x * 2, batch_size=3), []))
        [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]
    """

    def __init__(
        self,
        src: Iterable[Any] | AsyncIterable[Any],
        *,
        preprocessor: Callable[[Any], Any] | None = None,
        batch_size: int | None = None,
        drop_last: bool = False,
        aggregator: Callable[[list[Any]], Any] | None = None,
        transfer_fn: Callable[[Any], Any] | None = None,
        buffer_size: int = 3,
        num_threads: int = 8,
        timeout: float | None = None,
        output_order: str = "completion",
    ) -> None:
        where = "datapipes.spdl.DataLoader"
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"{where}: num_threads must be an int >= 1, got {num_threads!r}")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 0):
            raise ValueError(f"{where}: batch_size must be an int >= 0 or None, got {batch_size!r}")
        builder: PipelineBuilder[Any, Any] = PipelineBuilder().add_source(src)
        if preprocessor is not None:
            builder.pipe(preprocessor, concurrency=num_threads, output_order=output_order)
        if batch_size:
            builder.aggregate(batch_size, drop_last=drop_last)
        if aggregator is not None:
            builder.pipe(aggregator, concurrency=num_threads, output_order=output_order)
        if transfer_fn is not None:
            builder.pipe(transfer_fn)  # one at a time: devices copy one batch at a time
        stages = builder._stages().set_budget(max_threads=num_threads)
        self._from_spdl(from_spdl(src=stages, buffer_size=buffer_size, num_threads=num_threads, timeout=timeout,
                                  output_order=output_order))

    def __iter__(self) -> Iterator[Any]:
        return _spdl_errors(super().__iter__())
