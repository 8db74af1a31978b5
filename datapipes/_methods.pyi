# Typed declarations of the functional methods that ``functional_datapipe`` registers on
# IterDataPipe and MapDataPipe at run time. Type checkers and IDEs read this file instead of
# _methods.py; tests/test_typing.py keeps it in sync with the registry (every registered name, the
# same parameter names in the same order as the class constructor, nothing unregistered).
#
# Conventions: the last declaration of a method is the general one and takes every parameter;
# overloads before it narrow the result type for common calls (no input_col, no wrapper_class,
# keep_key=True, ...). Stages that count skipped failures (on_error="skip") return their own class
# where its element type is as precise, so ``pipe.map(f, on_error="skip").failures`` type-checks.

from collections.abc import AsyncIterable, Awaitable, Callable, Coroutine, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from typing import IO, Any, Generic, Literal, TypeVar, overload

import torch

from .datapipe import IterDataPipe, MapDataPipe
from .iter.archive import TarArchiveLoader, ZipArchiveLoader
from .iter.fileio import FileOpener
from .iter.image import ImageDecoder
from .iter.io.http import HttpReader, OnlineReader
from .iter.io.json import JsonParser
from .iter.mapping import FlatMapper, Filter, Mapper
from .iter.remote import FSSpecFileOpener
from .iter.parquet import ParquetDataFrameLoader
from .iter.s3 import S3FileLoader

T_co = TypeVar("T_co", covariant=True)
U = TypeVar("U")
V = TypeVar("V")
K = TypeVar("K", bound=Hashable)
Key = TypeVar("Key")
T1 = TypeVar("T1")
T2 = TypeVar("T2")
T3 = TypeVar("T3")
T4 = TypeVar("T4")

# A column of a tuple/list/dict item (index or key), or several columns.
_Col = Hashable | Sequence[Hashable]
_OnError = Literal["raise", "skip"]
_Executor = Literal["thread", "process"] | Executor
_Rng = Literal["python", "numpy", "torch"]

class IterMethods(Generic[T_co]):
    """The functional methods of ``IterDataPipe``."""

    # -- mapping/: map, filter, flatmap, map_batches, threadpool_map, async_map_batches ------------
    # map: an async fn gives its awaited result; with rng, fn is called as fn(item, rng=generator);
    # with input_col, fn receives columns and the result is Any.
    @overload
    def map(
        self,
        fn: Callable[[T_co], Coroutine[Any, Any, U]],
        input_col: None = ...,
        output_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal["auto"] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
        timeout: float | None = ...,
        chunksize: int | None = ...,
        rng: None = ...,
    ) -> Mapper[U]: ...
    @overload
    def map(
        self,
        fn: Callable[[T_co], U],
        input_col: None = ...,
        output_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal["auto"] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
        timeout: float | None = ...,
        chunksize: int | None = ...,
        rng: None = ...,
    ) -> Mapper[U]: ...
    @overload
    def map(
        self,
        fn: Callable[..., Coroutine[Any, Any, U]],
        input_col: None = ...,
        output_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal["auto"] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
        timeout: float | None = ...,
        chunksize: int | None = ...,
        rng: _Rng,
    ) -> Mapper[U]: ...
    @overload
    def map(
        self,
        fn: Callable[..., U],
        input_col: None = ...,
        output_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal["auto"] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
        timeout: float | None = ...,
        chunksize: int | None = ...,
        rng: _Rng,
    ) -> Mapper[U]: ...
    @overload
    def map(
        self,
        fn: Callable[..., Any],
        input_col: _Col,
        output_col: _Col | None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal["auto"] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
        timeout: float | None = ...,
        chunksize: int | None = ...,
        rng: _Rng | None = ...,
    ) -> Mapper[Any]: ...
    @overload
    def filter(
        self,
        filter_fn: Callable[[T_co], object],
        input_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> Filter[T_co]: ...
    @overload
    def filter(
        self,
        filter_fn: Callable[..., object],
        input_col: Hashable | Sequence[Hashable],
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> Filter[T_co]: ...
    @overload
    def flatmap(
        self: IterMethods[Iterable[U]],
        fn: None = ...,
        input_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal["auto"] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
    ) -> FlatMapper[U]: ...
    @overload
    def flatmap(
        self,
        fn: Callable[[T_co], AsyncIterable[U]],
        input_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal["auto"] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
    ) -> FlatMapper[U]: ...
    @overload
    def flatmap(
        self,
        fn: Callable[[T_co], Iterable[U]],
        input_col: None = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal["auto"] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
    ) -> FlatMapper[U]: ...
    @overload
    def flatmap(
        self,
        fn: Callable[..., Iterable[U] | AsyncIterable[U]],
        input_col: _Col,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        concurrency: int | Literal["auto"] = ...,
        ordered: bool = ...,
        executor: _Executor = ...,
    ) -> FlatMapper[U]: ...
    @overload
    def map_batches(
        self, fn: Callable[[list[T_co]], Iterable[U]], batch_size: int, input_col: None = ...
    ) -> IterDataPipe[U]: ...
    @overload
    def map_batches(
        self, fn: Callable[[list[Any]], Iterable[U]], batch_size: int, input_col: _Col | None = ...
    ) -> IterDataPipe[U]: ...
    @overload
    def threadpool_map(
        self,
        fn: Callable[[T_co], U],
        input_col: None = ...,
        output_col: None = ...,
        scheduled_tasks: int = ...,
        max_workers: int | None = ...,
        **threadpool_kwargs: Any,
    ) -> IterDataPipe[U]: ...
    @overload
    def threadpool_map(
        self,
        fn: Callable[..., Any],
        input_col: _Col | None = ...,
        output_col: _Col | None = ...,
        scheduled_tasks: int = ...,
        max_workers: int | None = ...,
        **threadpool_kwargs: Any,
    ) -> IterDataPipe[Any]: ...
    @overload
    def async_map_batches(
        self,
        async_fn: Callable[[T_co], Awaitable[U]],
        batch_size: int,
        input_col: None = ...,
        output_col: None = ...,
        max_concurrency: int = ...,
        flatten: Literal[True] = ...,
    ) -> IterDataPipe[U]: ...
    @overload
    def async_map_batches(
        self,
        async_fn: Callable[..., Awaitable[Any]],
        batch_size: int,
        input_col: _Col | None = ...,
        output_col: _Col | None = ...,
        max_concurrency: int = ...,
        flatten: bool = ...,
    ) -> IterDataPipe[Any]: ...

    # -- batching.py, grouping.py ------------------------------------------------------------------
    @overload
    def batch(self, batch_size: int, drop_last: bool = ...) -> IterDataPipe[list[T_co]]: ...
    @overload
    def batch(
        self, batch_size: int, drop_last: bool = ..., wrapper_class: Callable[[list[T_co]], U] = ...
    ) -> IterDataPipe[U]: ...
    @overload
    def unbatch(self: IterMethods[Iterable[U]], unbatch_level: Literal[1] = ...) -> IterDataPipe[U]: ...
    @overload
    def unbatch(self, unbatch_level: int = ...) -> IterDataPipe[Any]: ...
    def bucketbatch(
        self,
        batch_size: int,
        drop_last: bool = ...,
        batch_num: int = ...,
        bucket_num: int = ...,
        sort_key: Callable[[list[T_co]], Iterable[T_co]] | None = ...,
        use_in_batch_shuffle: bool = ...,
        *,
        key: Callable[[T_co], Any] | None = ...,
    ) -> IterDataPipe[list[T_co]]: ...
    @overload
    def groupby(
        self,
        group_key_fn: Callable[[T_co], Hashable],
        *,
        keep_key: Literal[False] = ...,
        buffer_size: int | None = ...,
        group_size: int | None = ...,
        guaranteed_group_size: int | None = ...,
        drop_remaining: bool = ...,
    ) -> IterDataPipe[list[T_co]]: ...
    # keep_key=True pairs each group with its key's type; with a lambda as group_key_fn mypy cannot
    # tell this overload from the general one and gives Any.
    @overload
    def groupby(
        self,
        group_key_fn: Callable[[T_co], Key],
        *,
        keep_key: Literal[True],
        buffer_size: int | None = ...,
        group_size: int | None = ...,
        guaranteed_group_size: int | None = ...,
        drop_remaining: bool = ...,
    ) -> IterDataPipe[tuple[Key, list[T_co]]]: ...
    @overload
    def groupby(
        self,
        group_key_fn: Callable[[T_co], Hashable],
        *,
        keep_key: bool = ...,
        buffer_size: int | None = ...,
        group_size: int | None = ...,
        guaranteed_group_size: int | None = ...,
        drop_remaining: bool = ...,
    ) -> IterDataPipe[Any]: ...

    # -- combinatorics.py --------------------------------------------------------------------------
    @overload
    def shuffle(self, *, buffer_size: int = ..., unbatch_level: Literal[0] = ...) -> IterDataPipe[T_co]: ...
    @overload
    def shuffle(self, *, buffer_size: int = ..., unbatch_level: int = ...) -> IterDataPipe[Any]: ...
    # target=None gives the list of every split; a split name gives that one pipe
    @overload
    def random_split(  # type: ignore[overload-overlap]
        self, weights: Mapping[K, float], seed: int, total_length: int | None = ..., target: None = ...
    ) -> list[IterDataPipe[T_co]]: ...
    @overload
    def random_split(
        self, weights: Mapping[K, float], seed: int, total_length: int | None = ..., *, target: K
    ) -> IterDataPipe[T_co]: ...
    @overload
    def random_split(
        self, weights: Mapping[K, float], seed: int, total_length: int | None, target: K
    ) -> IterDataPipe[T_co]: ...

    # -- zipping.py --------------------------------------------------------------------------------
    @overload
    def zip(self, /) -> IterDataPipe[tuple[T_co]]: ...
    @overload
    def zip(self, dp1: IterDataPipe[T1], /) -> IterDataPipe[tuple[T_co, T1]]: ...
    @overload
    def zip(self, dp1: IterDataPipe[T1], dp2: IterDataPipe[T2], /) -> IterDataPipe[tuple[T_co, T1, T2]]: ...
    @overload
    def zip(
        self, dp1: IterDataPipe[T1], dp2: IterDataPipe[T2], dp3: IterDataPipe[T3], /
    ) -> IterDataPipe[tuple[T_co, T1, T2, T3]]: ...
    @overload
    def zip(
        self, dp1: IterDataPipe[T1], dp2: IterDataPipe[T2], dp3: IterDataPipe[T3], dp4: IterDataPipe[T4], /
    ) -> IterDataPipe[tuple[T_co, T1, T2, T3, T4]]: ...
    @overload
    def zip(self, *datapipes: IterDataPipe[Any]) -> IterDataPipe[tuple[Any, ...]]: ...
    def zip_longest(self, *datapipes: IterDataPipe[Any], fill_value: Any = ...) -> IterDataPipe[tuple[Any, ...]]: ...
    # zip_with_iter / zip_with_map: (source item, matched item) by default; merge_fn's result with
    # one; keep_key=True pairs the key with either.
    @overload
    def zip_with_iter(
        self,
        ref_datapipe: IterDataPipe[U],
        key_fn: Callable[[T_co], Hashable],
        ref_key_fn: Callable[[U], Hashable] | None = ...,
        keep_key: Literal[False] = ...,
        buffer_size: int | None = ...,
        merge_fn: None = ...,
    ) -> IterDataPipe[tuple[T_co, U]]: ...
    @overload
    def zip_with_iter(
        self,
        ref_datapipe: IterDataPipe[U],
        key_fn: Callable[[T_co], Hashable],
        ref_key_fn: Callable[[U], Hashable] | None = ...,
        keep_key: Literal[False] = ...,
        buffer_size: int | None = ...,
        *,
        merge_fn: Callable[[T_co, U], V],
    ) -> IterDataPipe[V]: ...
    @overload
    def zip_with_iter(
        self,
        ref_datapipe: IterDataPipe[U],
        key_fn: Callable[[T_co], Hashable],
        ref_key_fn: Callable[[U], Hashable] | None = ...,
        keep_key: bool = ...,
        buffer_size: int | None = ...,
        merge_fn: Callable[[T_co, U], Any] | None = ...,
    ) -> IterDataPipe[Any]: ...
    @overload
    def zip_with_map(
        self,
        map_datapipe: MapDataPipe[U],
        key_fn: Callable[[T_co], Any],
        merge_fn: None = ...,
        keep_key: Literal[False] = ...,
    ) -> IterDataPipe[tuple[T_co, U]]: ...
    @overload
    def zip_with_map(
        self,
        map_datapipe: MapDataPipe[U],
        key_fn: Callable[[T_co], Any],
        merge_fn: Callable[[T_co, U], V],
        keep_key: Literal[False] = ...,
    ) -> IterDataPipe[V]: ...
    @overload
    def zip_with_map(
        self,
        map_datapipe: MapDataPipe[U],
        key_fn: Callable[[T_co], Any],
        merge_fn: Callable[[T_co, U], Any] | None = ...,
        keep_key: bool = ...,
    ) -> IterDataPipe[Any]: ...
    def unzip(
        self, sequence_length: int, buffer_size: int = ..., columns_to_skip: Sequence[int] | None = ...
    ) -> list[IterDataPipe[Any]]: ...

    # -- muxing.py ---------------------------------------------------------------------------------
    def concat(self, *datapipes: IterDataPipe[U]) -> IterDataPipe[T_co | U]: ...
    def mux(self, *datapipes: IterDataPipe[U]) -> IterDataPipe[T_co | U]: ...
    def mux_longest(self, *datapipes: IterDataPipe[U]) -> IterDataPipe[T_co | U]: ...

    # -- broadcast/: fork, demux, round_robin_demux (children sharing one pass over the source) ----
    def fork(
        self, num_instances: int, buffer_size: int = ..., copy: Literal["shallow", "deep"] | None = ...
    ) -> list[IterDataPipe[T_co]]: ...
    def demux(
        self,
        num_instances: int,
        classifier_fn: Callable[[T_co], int | None],
        drop_none: bool = ...,
        buffer_size: int = ...,
    ) -> list[IterDataPipe[T_co]]: ...
    def round_robin_demux(self, num_instances: int, buffer_size: int = ...) -> list[IterDataPipe[T_co]]: ...

    # -- reshaping.py ------------------------------------------------------------------------------
    def add_index(self, index_name: Hashable = ...) -> IterDataPipe[dict[Any, Any]]: ...
    def repeat(self, times: int) -> IterDataPipe[T_co]: ...
    # slice / flatten / drop reshape each item: the element type is the item's kind, not tracked.
    def slice(
        self, index: int | list[Hashable], stop: int | None = ..., step: int | None = ...
    ) -> IterDataPipe[Any]: ...
    def flatten(self, indices: Hashable | list[Hashable] | None = ...) -> IterDataPipe[Any]: ...
    def drop(self, indices: Hashable | list[Hashable]) -> IterDataPipe[Any]: ...
    def set_length(self, length: int) -> IterDataPipe[T_co]: ...
    def rows2columnar(self, column_names: Sequence[Hashable] | set[Hashable] | frozenset[Hashable] | None = ...) -> IterDataPipe[dict[Any, list[Any]]]: ...

    # -- shuffling.py: shuffles inside a batch or a buffer of iterables ----------------------------
    def in_batch_shuffle(self: IterMethods[Sequence[U]]) -> IterDataPipe[list[U]]: ...
    # fn=None flattens each item (or its input_col columns); with input_col, fn receives columns.
    @overload
    def shuffled_flatmap(
        self: IterMethods[Iterable[U]], fn: None = ..., input_col: None = ..., buffer_size: int = ...
    ) -> IterDataPipe[U]: ...
    @overload
    def shuffled_flatmap(
        self, fn: Callable[[T_co], Iterable[U]], input_col: None = ..., buffer_size: int = ...
    ) -> IterDataPipe[U]: ...
    @overload
    def shuffled_flatmap(
        self, fn: Callable[..., Iterable[Any]] | None = ..., input_col: _Col | None = ..., buffer_size: int = ...
    ) -> IterDataPipe[Any]: ...

    # -- bucketing.py ------------------------------------------------------------------------------
    def max_token_bucketize(
        self,
        max_token_count: int,
        len_fn: Callable[[T_co], Any] = ...,
        min_len: int = ...,
        max_len: int | None = ...,
        buffer_size: int = ...,
        include_padding: bool = ...,
    ) -> IterDataPipe[list[T_co]]: ...

    # -- text.py -----------------------------------------------------------------------------------
    # items are (file name, line) pairs; the default joiner joins str lines with newlines
    @overload
    def lines_to_paragraphs(self: IterMethods[tuple[V, str]]) -> IterDataPipe[tuple[V, str]]: ...
    @overload
    def lines_to_paragraphs(
        self: IterMethods[tuple[V, Any]], joiner: Callable[[list[Any]], U] = ...
    ) -> IterDataPipe[tuple[V, U]]: ...
    def shard_expand(self: IterMethods[str]) -> IterDataPipe[str]: ...

    # -- s3.py: torchdata's S3 pipes on fsspec and s3fs (the pipe's items are s3:// URLs) -----------
    def list_files_by_s3(
        self,
        length: int = ...,
        request_timeout_ms: int = ...,
        region: str = ...,
        masks: str | list[str] = ...,
        *,
        recursive: bool = ...,
        retries: int = ...,
        backoff: float = ...,
        **storage_options: Any,
    ) -> IterDataPipe[str]: ...
    def load_files_by_s3(
        self,
        request_timeout_ms: int = ...,
        region: str = ...,
        buffer_size: int | None = ...,
        multi_part_download: bool | None = ...,
        *,
        kwargs_for_open: dict[str, Any] | None = ...,
        retries: int = ...,
        backoff: float = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        **storage_options: Any,
    ) -> S3FileLoader: ...

    # -- parquet.py: paths or (path, stream) pairs -> rows, record batches, tables (pyarrow) ---------
    # (rows are dicts; batches are pyarrow.RecordBatch and tables pyarrow.Table, typed Any so that
    # type-checking needs no pyarrow)
    @overload
    def parse_parquet(
        self,
        *,
        columns: Sequence[str] | None = ...,
        batch_size: int = ...,
        as_batches: Literal[False] = ...,
        return_path: Literal[False] = ...,
        use_threads: bool = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> IterDataPipe[dict[str, Any]]: ...
    @overload
    def parse_parquet(
        self,
        *,
        columns: Sequence[str] | None = ...,
        batch_size: int = ...,
        as_batches: Literal[False] = ...,
        return_path: Literal[True],
        use_threads: bool = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> IterDataPipe[tuple[str, dict[str, Any]]]: ...
    @overload
    def parse_parquet(
        self,
        *,
        columns: Sequence[str] | None = ...,
        batch_size: int = ...,
        as_batches: bool = ...,
        return_path: bool = ...,
        use_threads: bool = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> IterDataPipe[Any]: ...
    def load_parquet_as_df(
        self,
        dtype: Any = ...,
        columns: Sequence[str] | None = ...,
        device: str | torch.device = ...,
        use_threads: bool = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> ParquetDataFrameLoader: ...

    # -- cache/ (on-disk cache, hashes) and io/ (HTTP, single compressed files, TFRecord) ----------
    def on_disk_cache(
        self,
        filepath_fn: Callable[[T_co], str] | None = ...,
        hash_dict: dict[str, str] | None = ...,
        hash_type: Literal["sha256", "md5"] = ...,
        extra_check_fn: Callable[[str], bool] | None = ...,
    ) -> IterDataPipe[T_co]: ...
    def end_caching(
        self,
        mode: Literal["wb", "w", "wt"] = ...,
        filepath_fn: Callable[[Any], str] | None = ...,
        *,
        same_filepath_fn: bool = ...,
        skip_read: bool = ...,
        timeout: float | None = ...,
    ) -> IterDataPipe[str]: ...
    def check_hash(
        self, hash_dict: dict[str, str], hash_type: Literal["sha256", "md5"] = ..., rewind: bool = ...
    ) -> IterDataPipe[T_co]: ...
    def read_from_http(
        self,
        timeout: float | tuple[float | None, float | None] | None = ...,
        skip_on_error: bool = ...,
        *,
        retries: int = ...,
        backoff: float = ...,
        **kwargs: Any,
    ) -> HttpReader: ...
    def read_from_remote(
        self,
        *,
        timeout: float | tuple[float | None, float | None] | None = ...,
        skip_on_error: bool = ...,
        retries: int = ...,
        backoff: float = ...,
        **kwargs: Any,
    ) -> OnlineReader: ...
    def load_from_bz2(self, length: int = ...) -> IterDataPipe[tuple[str, IO[bytes]]]: ...
    def load_from_xz(self, length: int = ...) -> IterDataPipe[tuple[str, IO[bytes]]]: ...
    def extract(self, file_type: str | None = ...) -> IterDataPipe[tuple[str, IO[bytes]]]: ...
    def load_from_tfrecord(
        self,
        spec: dict[str, tuple[tuple[int, ...] | None, torch.dtype | None]] | None = ...,
        length: int = ...,
        *,
        length_check: bool = ...,
    ) -> IterDataPipe[dict[str, Any]]: ...

    # -- decoding.py: torch's RoutedDecoder and StreamReader ------------------------------------------
    # (Callable, Any are imported at the top of _methods.pyi already; nothing to add there)
    def routed_decode(
        self, *handlers: Callable[[str, Any], Any], key_fn: Callable[[Any], Any] = ...
    ) -> IterDataPipe[tuple[str, Any]]: ...
    def read_from_stream(self, chunk: int | None = ...) -> IterDataPipe[tuple[str, Any]]: ...

    # -- util.py, cache/memory.py, sharding.py -----------------------------------------------------
    def header(self, limit: int | None = ...) -> IterDataPipe[T_co]: ...
    def cycle(self, count: int | None = ...) -> IterDataPipe[T_co]: ...
    def enumerate(self, starting_index: int = ...) -> IterDataPipe[tuple[int, T_co]]: ...
    def in_memory_cache(self, size: float | None = ...) -> IterDataPipe[T_co]: ...
    def sharding_filter(self, sharding_group_filter: int | None = ...) -> IterDataPipe[T_co]: ...

    # -- distributed.py: torchdata's distributed stages ----------------------------------------------
    def fullsync(self, timeout: float = ..., buffer_size: int = ...) -> IterDataPipe[T_co]: ...
    def sharding_round_robin_dispatch(self, sharding_group_filter: int | None = ...) -> IterDataPipe[T_co]: ...

    # -- fileio.py: local files and fsspec URLs (the pipe's items are paths / URLs) ----------------
    def list_files(
        self,
        masks: str | list[str] = ...,
        *,
        recursive: bool = ...,
        abspath: bool = ...,
        non_deterministic: bool = ...,
        length: int = ...,
    ) -> IterDataPipe[str]: ...
    def open_files(
        self,
        mode: str = ...,
        encoding: str | None = ...,
        length: int = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> FileOpener: ...
    def save_to_disk(self, mode: str = ..., filepath_fn: Callable[[Any], Any] | None = ...) -> IterDataPipe[str]: ...
    def list_files_by_fsspec(
        self,
        masks: str | list[str] = ...,
        *,
        recursive: bool = ...,
        retries: int = ...,
        backoff: float = ...,
        **storage_options: Any,
    ) -> IterDataPipe[str]: ...
    def open_files_by_fsspec(
        self,
        mode: str = ...,
        *,
        kwargs_for_open: dict[str, Any] | None = ...,
        encoding: str | None = ...,
        retries: int = ...,
        backoff: float = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        **storage_options: Any,
    ) -> FSSpecFileOpener: ...
    def save_by_fsspec(
        self,
        mode: str = ...,
        filepath_fn: Callable[[Any], Any] | None = ...,
        *,
        kwargs_for_open: dict[str, Any] | None = ...,
        **storage_options: Any,
    ) -> IterDataPipe[str]: ...

    # -- io/csv.py, io/json.py, io/lines.py: (path, stream) pairs -> records -----------------------
    @overload
    def parse_csv(
        self,
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: Literal[False] = ...,
        as_tuple: Literal[False] = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        **fmtparams: Any,
    ) -> IterDataPipe[list[str]]: ...
    @overload
    def parse_csv(
        self,
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: Literal[False] = ...,
        as_tuple: Literal[True],
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        **fmtparams: Any,
    ) -> IterDataPipe[tuple[str, ...]]: ...
    @overload
    def parse_csv(
        self,
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: bool = ...,
        as_tuple: bool = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        **fmtparams: Any,
    ) -> IterDataPipe[Any]: ...
    @overload
    def parse_csv_files(
        self,
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: Literal[True] = ...,
        as_tuple: Literal[False] = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        **fmtparams: Any,
    ) -> IterDataPipe[tuple[str, list[str]]]: ...
    @overload
    def parse_csv_files(
        self,
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: bool = ...,
        as_tuple: bool = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        **fmtparams: Any,
    ) -> IterDataPipe[Any]: ...
    @overload
    def parse_csv_as_dict(
        self,
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: Literal[False] = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        **fmtparams: Any,
    ) -> IterDataPipe[dict[str, str]]: ...
    @overload
    def parse_csv_as_dict(
        self,
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: Literal[True],
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        **fmtparams: Any,
    ) -> IterDataPipe[tuple[str, dict[str, str]]]: ...
    @overload
    def parse_csv_as_dict(
        self,
        *,
        skip_lines: int = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: bool = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        **fmtparams: Any,
    ) -> IterDataPipe[Any]: ...
    def parse_json_files(
        self,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
        **kwargs: Any,
    ) -> JsonParser: ...
    # lines are str from text streams (or with decode=True), bytes from binary ones
    @overload
    def readlines(
        self,
        *,
        skip_lines: int = ...,
        strip_newline: bool = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: Literal[True] = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> IterDataPipe[tuple[str, Any]]: ...
    @overload
    def readlines(
        self,
        *,
        skip_lines: int = ...,
        strip_newline: bool = ...,
        decode: bool = ...,
        encoding: str = ...,
        errors: str = ...,
        return_path: bool = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> IterDataPipe[Any]: ...

    # -- archive.py: (path, stream) pairs of archives -> (member path, in-memory stream) -----------
    def load_from_tar(
        self,
        mode: str = ...,
        length: int = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> TarArchiveLoader: ...
    def load_from_zip(
        self,
        length: int = ...,
        *,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> ZipArchiveLoader: ...
    def webdataset(self) -> IterDataPipe[dict[str, Any]]: ...
    def decompress(self, file_type: str | None = ...) -> IterDataPipe[tuple[str, IO[bytes]]]: ...

    # -- image.py: encoded images (bytes, streams or (path, stream) pairs) -> arrays / PIL images ---
    def decode_image(
        self,
        *,
        mode: str | None = ...,
        size: tuple[int, int] | None = ...,
        resample: int = ...,
        draft: bool = ...,
        output: Literal["numpy", "pil"] = ...,
        layout: Literal["hwc", "chw"] = ...,
        on_error: _OnError = ...,
        max_failures: int | float | None = ...,
        warn_failures: int | float | None = ...,
    ) -> ImageDecoder: ...

    # -- mapping/batches.py: collate; device.py ----------------------------------------------------
    def collate(self, conversion: Callable[[T_co], U] | None = ..., collate_fn: Callable[[T_co], U] | None = ...) -> IterDataPipe[Any]: ...
    def pin_memory(self, pin_memory_fn: Callable[[T_co], T_co] | None = ..., buffer_size: int = ...) -> IterDataPipe[T_co]: ...
    def to_device(self, device: str | int | torch.device, non_blocking: bool = ..., *, collate: bool = ...) -> IterDataPipe[Any]: ...
    def to_cuda(self, device: str | int | torch.device | None = ..., non_blocking: bool = ..., *, collate: bool = ...) -> IterDataPipe[Any]: ...

    # -- prefetch.py -------------------------------------------------------------------------------
    def prefetch(self, buffer_size: int = ...) -> IterDataPipe[T_co]: ...

    # -- map/converter.py: to a map-style pipe ------------------------------------------------------
    @overload
    def to_map_datapipe(self: IterMethods[tuple[Any, V]], key_value_fn: None = ...) -> MapDataPipe[V]: ...
    @overload
    def to_map_datapipe(self, key_value_fn: Callable[[T_co], tuple[Any, V]]) -> MapDataPipe[V]: ...

class MapMethods(Generic[T_co]):
    """The functional methods of ``MapDataPipe``."""

    @overload
    def map(self) -> MapDataPipe[T_co]: ...
    @overload
    def map(self, fn: Callable[[T_co], U], input_col: None = ..., output_col: None = ...) -> MapDataPipe[U]: ...
    @overload
    def map(self, fn: Callable[..., Any] = ..., input_col: _Col = ..., output_col: _Col | None = ...) -> MapDataPipe[Any]: ...
    @overload
    def batch(self, batch_size: int, drop_last: bool = ...) -> MapDataPipe[list[T_co]]: ...
    @overload
    def batch(
        self, batch_size: int, drop_last: bool = ..., wrapper_class: Callable[[list[T_co]], U] = ...
    ) -> MapDataPipe[U]: ...
    def concat(self, *datapipes: MapDataPipe[U]) -> MapDataPipe[T_co | U]: ...
    @overload
    def zip(self, /) -> MapDataPipe[tuple[T_co]]: ...
    @overload
    def zip(self, dp1: MapDataPipe[T1], /) -> MapDataPipe[tuple[T_co, T1]]: ...
    @overload
    def zip(self, dp1: MapDataPipe[T1], dp2: MapDataPipe[T2], /) -> MapDataPipe[tuple[T_co, T1, T2]]: ...
    @overload
    def zip(
        self, dp1: MapDataPipe[T1], dp2: MapDataPipe[T2], dp3: MapDataPipe[T3], /
    ) -> MapDataPipe[tuple[T_co, T1, T2, T3]]: ...
    @overload
    def zip(self, *datapipes: MapDataPipe[Any]) -> MapDataPipe[tuple[Any, ...]]: ...
    def shuffle(self, *, indices: Sequence[Any] | None = ...) -> IterDataPipe[T_co]: ...
    def to_iter_datapipe(self, indices: Sequence[Any] | None = ...) -> IterDataPipe[T_co]: ...
    def in_memory_cache(self, cache_fn: Callable[[int], Any] | None = ...) -> MapDataPipe[T_co]: ...
    def unzip(self, sequence_length: int, columns_to_skip: Sequence[int] | None = ...) -> list[MapDataPipe[Any]]: ...
