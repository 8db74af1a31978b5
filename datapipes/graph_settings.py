"""Settings applied to every stage of a graph, with the names and behaviour of torch's
``torch.utils.data.graph_settings``: :func:`apply_sharding`, :func:`apply_shuffle_settings`,
:func:`apply_random_seed` (and its old name :func:`apply_shuffle_seed`), :func:`get_all_graph_pipes`.

Code written for torch DataPipes that calls them works on our pipes by changing the import:

>>> from datapipes import graph_settings
>>> from datapipes.iter import IterableWrapper
>>> pipe = IterableWrapper(range(10)).shuffle().sharding_filter()
>>> pipe = graph_settings.apply_shuffle_settings(pipe, shuffle=False)
>>> list(graph_settings.apply_sharding(pipe, 2, 1))
[1, 3, 5, 7, 9]
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ._runtime.traits import traits_of
from .graph import get_all_graph_pipes, traverse_dps
from .iter.sharding import SHARDING_PRIORITIES, apply_sharding

__all__ = ["apply_random_seed", "apply_sharding", "apply_shuffle_seed", "apply_shuffle_settings",
           "get_all_graph_pipes", "SHARDING_PRIORITIES"]


def _is_shuffle_pipe(pipe: Any) -> bool:
    return callable(getattr(pipe, "set_shuffle", None)) and callable(getattr(pipe, "set_seed", None))


def apply_shuffle_settings(datapipe: Any, shuffle: bool | None = None) -> Any:
    """Turn every shuffling stage of ``datapipe``'s graph on (``shuffle=True``) or off
    (``shuffle=False``); ``None`` changes nothing. As torch's, when ``shuffle=True`` and the graph
    has no shuffle, one is added at the end (with torch's warning) and the new pipe returned.

    Args:
        datapipe: the last stage of the graph.
        shuffle: ``True``, ``False`` or ``None``.

    Returns:
        ``datapipe`` (or, shuffled at the end, a new pipe).
    """
    if shuffle is None:
        return datapipe
    shufflers = [p for p in get_all_graph_pipes(traverse_dps(datapipe)) if _is_shuffle_pipe(p)]
    if not shufflers and shuffle:
        warnings.warn(
            "`shuffle=True` was set, but the datapipe does not contain a `Shuffler`. Adding one at the end. "
            "Be aware that the default buffer size might not be sufficient for your task.",
            stacklevel=2,
        )
        datapipe = datapipe.shuffle()
        shufflers = [datapipe]
    for shuffler in shufflers:
        shuffler.set_shuffle(shuffle)
    return datapipe


def apply_random_seed(datapipe: Any, rng: torch.Generator) -> Any:
    """Give every random stage of ``datapipe``'s graph (shuffle, sample, seeded maps) its own seed,
    drawn from ``rng`` in graph order, as torch's does. Returns ``datapipe``.

    Raises:
        TypeError: ``rng`` is not a ``torch.Generator``.
    """
    if not isinstance(rng, torch.Generator):
        raise TypeError(f"apply_random_seed: rng must be a torch.Generator, got {type(rng).__name__}")
    seen: set[int] = set()
    for pipe in get_all_graph_pipes(traverse_dps(datapipe)):
        if id(pipe) in seen or not traits_of(pipe)._is_random:
            continue
        seen.add(id(pipe))
        pipe._seed = int(torch.empty((), dtype=torch.int64).random_(generator=rng).item())
    return datapipe


def apply_shuffle_seed(datapipe: Any, rng: torch.Generator) -> Any:
    """The old name of :func:`apply_random_seed` (deprecated in torch, with a ``FutureWarning``)."""
    warnings.warn(
        "`apply_shuffle_seed` is deprecated since 1.12 and will be removed in the future releases. "
        "Please use `apply_random_seed` instead.",
        FutureWarning,
        stacklevel=2,
    )
    return apply_random_seed(datapipe, rng)
