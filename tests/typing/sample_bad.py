"""Lines mypy must reject: each line marked ``# E: <error code>`` must give that error, and no
other line may give one (tests/test_typing.py checks both). Everything here still runs: module-level
lines are type errors only, and calls that would fail at run time sit in a function never called.
"""

from __future__ import annotations

from datapipes import IterDataPipe, MapDataPipe
from datapipes.iter import IterableWrapper
from datapipes.map import SequenceWrapper

ints = IterableWrapper([1, 2, 3])
words = IterableWrapper(["a", "b"])

# the result type follows fn: str, not int (mypy names the argument that cannot give an int)
wrong_map: IterDataPipe[int] = IterableWrapper([1]).map(str)  # E: arg-type
wrong_map_later: IterDataPipe[int] = ints.map(lambda x: x * 0.5).filter(bool)  # E: assignment
# batches are lists of items, not items
wrong_batch: IterDataPipe[int] = ints.batch(2)  # E: assignment
# zip gives tuples in source order
wrong_zip: IterDataPipe[int] = ints.zip(words)  # E: assignment
wrong_zip_use = ints.zip(words).map(lambda pair: pair[1] + 1)  # E: operator
# fork returns a list of pipes, not a pipe
wrong_fork: IterDataPipe[int] = ints.fork(2)  # E: assignment
# map-style map stays map-style
wrong_kind: IterDataPipe[str] = SequenceWrapper([1]).map(str)  # E: assignment
# the map-style shuffle gives an iterable-style pipe
wrong_shuffle: MapDataPipe[int] = SequenceWrapper([1]).shuffle()  # E: assignment
# enumerate pairs the index first
wrong_enum: IterDataPipe[tuple[int, str]] = ints.enumerate()  # E: assignment
# filter keeps the element type
wrong_filter: IterDataPipe[str] = ints.filter(bool)  # E: assignment


def never_called() -> None:
    # fn must accept the element type
    ints.map(str.upper)  # E: arg-type
    # the predicate too
    words.filter(lambda w: w + 1)  # E: operator
    # batch_size is an int
    ints.batch("32")  # E: call-overload
    # a keyword that no pipe takes
    ints.batch(32, drop_lats=True)  # E: call-overload
    # a misspelt method
    ints.maps(str)  # E: attr-defined
    # on_error is "raise" or "skip"
    ints.map(str, on_error="ignore")  # E: call-overload
    # the executor is "thread", "process" or an Executor
    ints.map(str, concurrency=4, executor="processes")  # E: call-overload
    # rng names a generator kind
    ints.map(str, rng="random")  # E: call-overload
    # shuffle's buffer_size is keyword-only, as in torch DataPipes
    ints.shuffle(100)  # E: call-overload
    # zip takes pipes, not lists
    ints.zip([1, 2])  # E: call-overload
    # map-style pipes have no filter
    SequenceWrapper([1]).filter(bool)  # E: attr-defined
    # to_map_datapipe without a key_value_fn needs (key, value) items
    ints.to_map_datapipe()  # E: call-arg
    # demux's classifier returns an index
    ints.demux(2, str)  # E: arg-type
