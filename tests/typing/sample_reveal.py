"""What a type checker (and an IDE on hover) shows along a chain: each ``# N:`` comment is the type
mypy must reveal on that line (tests/test_typing.py compares them). Under TYPE_CHECKING only, so
nothing runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datapipes.iter import IterableWrapper
    from datapipes.map import SequenceWrapper

    source = IterableWrapper(["3", "1", "2"])
    reveal_type(source)  # N: datapipes.iter.util.IterableWrapper[str]
    reveal_type(source.map(int))  # N: datapipes.iter.mapping.map.Mapper[int]
    reveal_type(source.map(int).batch(2))  # N: datapipes.datapipe.IterDataPipe[list[int]]
    reveal_type(source.map(int).batch(2).unbatch())  # N: datapipes.datapipe.IterDataPipe[int]
    reveal_type(source.enumerate().zip(source))  # N: datapipes.datapipe.IterDataPipe[tuple[tuple[int, str], str]]
    reveal_type(source.fork(3))  # N: list[datapipes.iter.broadcast.fork.ForkerChild[str]]
    reveal_type(source.map(len).to_map_datapipe(lambda n: (n, n * 2.0)))  # N: datapipes.datapipe.MapDataPipe[float]
    reveal_type(SequenceWrapper([1.5]).map(round).to_iter_datapipe())  # N: datapipes.map.converter.MapToIterConverter[int]
