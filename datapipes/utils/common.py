"""torch DataPipes' ``utils.common`` helpers, same names and behaviour.

:class:`StreamWrapper` is the stream the openers hand out (:mod:`datapipes.iter.fileio`);
:func:`validate_input_col` checks a function against the columns a stage gives it;
:func:`get_file_pathnames_from_root` and :func:`get_file_binaries_from_pathnames` list and open
local files as :class:`~datapipes.iter.FileLister` and :class:`~datapipes.iter.FileOpener` do.

>>> from datapipes.utils.common import match_masks, validate_input_col
>>> match_masks("a.jpg", ["*.png", "*.jpg"]), match_masks("a.txt", "*.jpg")
(True, False)
>>> validate_input_col(lambda a, b: a + b, [0, 1])
"""

from __future__ import annotations

import functools
import os
from io import IOBase
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..iter.mapping._shared import check_arity
from ..iter.fileio import StreamWrapper, _local_chunks, _mask_matcher

__all__ = [
    "StreamWrapper",
    "get_file_binaries_from_pathnames",
    "get_file_pathnames_from_root",
    "match_masks",
    "validate_input_col",
    "validate_pathname_binary_tuple",
]


def validate_input_col(fn: Callable[..., Any], input_col: int | tuple[Any, ...] | list[Any] | None) -> None:
    """Check that ``fn`` can take the columns ``input_col`` gives it, as torch's helper does.

    Args:
        fn: the function a stage will call.
        input_col: one column (any non-list value, ``None`` included: one argument), or a list or
            tuple of columns (one argument each).

    Returns:
        None when ``fn`` fits. Functions whose signature cannot be read (some built-ins) are not
        checked. A ``*args`` parameter takes any number of columns beyond the positional ones.

    Raises:
        ValueError: ``fn`` takes too few or too many positional parameters, or has keyword-only
            parameters without a default; the message keeps torch's phrases ("The function f takes
            1 parameters, but 2 are required.").

    Example:
        >>> from datapipes.utils.common import validate_input_col
        >>> def f(a, b=1, *, c=1):
        ...     return a + b + c
        >>> validate_input_col(f, 1)
        >>> validate_input_col(f, [0, 1, 2, 3])
        Traceback (most recent call last):
        ...
        ValueError: validate_input_col: The function f takes 3 parameters, but 4 are required.
    """
    check_arity(fn, input_col, "validate_input_col")


@functools.lru_cache(maxsize=64)
def _matcher(masks: str | tuple[str, ...]) -> Callable[[str], Any] | None:
    return _mask_matcher(masks if isinstance(masks, str) else list(masks))


def match_masks(name: str, masks: str | Sequence[str]) -> bool:
    """Whether the file name ``name`` matches the glob ``masks`` (one pattern or a list of them).

    An empty mask (``""`` or ``[]``) matches every name. Matching follows :func:`fnmatch.fnmatch`
    (case-insensitive where the file system is).

    >>> from datapipes.utils.common import match_masks
    >>> match_masks("x.csv", ""), match_masks("x.csv", ["*.txt"])
    (True, False)
    """
    if not masks:
        return True
    match = _matcher(masks if isinstance(masks, str) else tuple(masks))
    return match is None or match(name) is not None


def get_file_pathnames_from_root(
    root: str,
    masks: str | list[str],
    recursive: bool = False,
    abspath: bool = False,
    non_deterministic: bool = False,
) -> Iterator[str]:
    """Yield the paths of the files under ``root`` whose names match ``masks``, lazily.

    The same listing as :class:`~datapipes.iter.FileLister`: a root that is a file is listed as
    itself; within a directory files come sorted by name (unless ``non_deterministic``), then,
    with ``recursive``, those of its subdirectories in sorted order.

    Args:
        root: a directory or a file.
        masks: glob pattern(s) the file name must match (``""``: all).
        recursive: also list subdirectories.
        abspath: yield absolute paths.
        non_deterministic: skip sorting.

    Yields:
        File paths joined onto ``root`` (absolute with ``abspath``).

    Raises:
        FileNotFoundError: ``root`` does not exist; ``OSError``: a directory cannot be read.

    Example:
        >>> import os, tempfile
        >>> from pathlib import Path
        >>> from datapipes.utils.common import get_file_pathnames_from_root
        >>> with tempfile.TemporaryDirectory() as d:
        ...     for name in ("b.txt", "a.txt", "c.md"):
        ...         _ = Path(d, name).write_text("x")
        ...     [os.path.basename(p) for p in get_file_pathnames_from_root(d, "*.txt")]
        ['a.txt', 'b.txt']
    """
    root = os.fspath(root)
    if abspath:
        root = os.path.abspath(root)
    how = SimpleNamespace(recursive=recursive, non_deterministic=non_deterministic)
    match = _mask_matcher(masks)
    for paths in _local_chunks(how, root, match):  # type: ignore[arg-type]
        yield from paths


def get_file_binaries_from_pathnames(
    pathnames: Iterable[str] | str, mode: str, encoding: str | None = None
) -> Iterator[tuple[str, StreamWrapper]]:
    """Open each path and yield ``(path, stream)`` pairs, lazily, as torch's helper does.

    Args:
        pathnames: paths, or a single path.
        mode: an ``open`` mode; ``"b"`` and ``"t"`` mean ``"rb"`` and ``"rt"``.
        encoding: the text encoding (text modes only).

    Yields:
        ``(path, StreamWrapper)``: the stream closes when dropped or closed.

    Raises:
        TypeError: a path is not a str. ``OSError``: a file cannot be opened.

    Example:
        >>> import os, tempfile
        >>> from pathlib import Path
        >>> from datapipes.utils.common import get_file_binaries_from_pathnames
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = str(Path(d, "a.bin")); _ = Path(p).write_bytes(b"xy")
        ...     [s.read() for _, s in get_file_binaries_from_pathnames([p], "b")]
        [b'xy']
    """
    if isinstance(pathnames, str) or not isinstance(pathnames, Iterable):
        pathnames = [pathnames]  # type: ignore[list-item]
    if mode in ("b", "t"):
        mode = "r" + mode
    for pathname in pathnames:
        if not isinstance(pathname, str):
            raise TypeError(f"Expected string type for pathname, but got {type(pathname)}")
        yield pathname, StreamWrapper(open(pathname, mode, encoding=encoding), pathname)  # noqa: SIM115


def validate_pathname_binary_tuple(data: tuple[str, IOBase]) -> None:
    """Raise ``TypeError`` unless ``data`` is a ``(str path, stream)`` tuple, as torch's helper does.

    >>> import io
    >>> from datapipes.utils.common import validate_pathname_binary_tuple
    >>> validate_pathname_binary_tuple(("a.bin", io.BytesIO(b"")))
    >>> validate_pathname_binary_tuple(["a.bin", io.BytesIO(b"")])
    Traceback (most recent call last):
    ...
    TypeError: pathname binary data should be tuple type, but it is type <class 'list'>
    """
    if not isinstance(data, tuple):
        raise TypeError(f"pathname binary data should be tuple type, but it is type {type(data)}")
    if len(data) != 2:
        raise TypeError(f"pathname binary stream tuple length should be 2, but got {len(data)}")
    if not isinstance(data[0], str):
        raise TypeError(f"pathname within the tuple should have string type pathname, but it is type {type(data[0])}")
    if not isinstance(data[1], (IOBase, StreamWrapper)):
        raise TypeError(
            f"binary stream within the tuple should have IOBase or its subclasses as type, but it is type {type(data[1])}"
        )
