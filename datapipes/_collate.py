"""Turning a list of samples into one batch of tensors (:func:`collate`), and applying a function to
every tensor of a nested sample (:func:`map_tensors`, used by ``pin_memory``; :func:`map_converted`
and :func:`map_collated`, which first turn numpy values and lists of samples into tensors, used by
``to_device`` / ``to_cuda``).

They walk the same structures: tuples, lists, dicts (and other mappings), namedtuples and
dataclass instances, nested to any depth.

>>> import numpy as np
>>> batch = collate([{"x": np.zeros((2, 2), np.uint8), "y": 1}, {"x": np.ones((2, 2), np.uint8), "y": 0}])
>>> batch["x"].shape, batch["x"].dtype, batch["y"]
(torch.Size([2, 2, 2]), torch.uint8, tensor([1, 0]))
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Mapping, MutableMapping
from operator import itemgetter
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import get_worker_info

from ._chunk import DataChunk

__all__ = ["collate", "map_collated", "map_converted", "map_tensors"]

_Path = tuple[Any, ...]  # the keys, field names and indices leading from a sample to a field


# -- error messages ----------------------------------------------------------------------------------


def _where(path: _Path, i: int) -> str:
    """``field 'image' (sample 3)``, ``field '[0].label' (sample 1)``, or ``sample 2`` at the top."""
    if not path:
        return f"sample {i}"
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            text += f".{part}" if text else part
        else:
            text += f"[{part!r}]"
    return f"field '{text}' (sample {i})"


def _type_name(x: Any) -> str:
    t = type(x)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _mixed(path: _Path, i: int, x: Any, first: Any) -> TypeError:
    return TypeError(f"collate: {_where(path, i)}: {_type_name(x)} differs from {_type_name(first)} of sample 0")


def _differs(path: _Path, i: int, what: str, got: Any, want: Any) -> ValueError:
    return ValueError(f"collate: {_where(path, i)}: {what} {got} differs from {want} of sample 0")


def _dtype_differs(path: _Path, i: int, got: Any, want: Any) -> TypeError:
    return TypeError(f"collate: {_where(path, i)}: dtype {got} differs from {want} of sample 0")


# -- output allocation -------------------------------------------------------------------------------


def _empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A new CPU tensor for a batch; inside a DataLoader worker it lives in shared memory, so sending
    it to the main process costs no copy (as torch's ``default_collate`` does)."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    n = 1
    for s in shape:
        n *= s
    storage = torch.UntypedStorage._new_shared(n * dtype.itemsize)  # type: ignore[no-untyped-call]  # torch leaves it untyped
    strides = torch.empty(shape, dtype=dtype, device="meta").stride()
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, strides)


_TORCH_DTYPES: dict[np.dtype[Any], torch.dtype] = {}


def _torch_dtype(dt: np.dtype[Any], path: _Path) -> torch.dtype:
    found = _TORCH_DTYPES.get(dt)
    if found is None:
        if dt.kind in "OUSVMm":
            raise TypeError(f"collate: {_where(path, 0)}: numpy arrays of dtype {dt} cannot become a tensor")
        try:
            found = torch.from_numpy(np.empty(0, dt)).dtype
        except (TypeError, ValueError) as e:
            raise TypeError(f"collate: {_where(path, 0)}: numpy arrays of dtype {dt} cannot become a tensor") from e
        _TORCH_DTYPES[dt] = found
    return found


# -- leaves --------------------------------------------------------------------------------------------


def _tensors(samples: Sequence[Any], path: _Path) -> torch.Tensor:
    first = samples[0]
    dt = first.dtype
    if all(type(x) is torch.Tensor and x.dtype is dt for x in samples):
        try:
            if get_worker_info() is not None and first.device.type == "cpu":
                return torch.stack(samples, out=_empty((len(samples), *first.shape), dt))  # type: ignore[arg-type]
            return torch.stack(samples)  # type: ignore[arg-type]
        except RuntimeError as e:  # shapes or devices differ, or nested tensors: say which field and sample
            _refuse_nested(samples, path, e)
            _check_tensors(samples, path, e)
            raise
    _refuse_nested(samples, path, None)
    _check_tensors(samples, path, None)
    return torch.stack(samples)  # type: ignore[arg-type]


def _refuse_nested(samples: Sequence[Any], path: _Path, error: BaseException | None) -> None:
    """Nested tensors (``torch.nested``, either layout) have no batch: torch's ``default_collate``
    refuses them, and so does :func:`collate`, with torch's message after the field and sample."""
    for i, x in enumerate(samples):
        if isinstance(x, torch.Tensor) and x.is_nested:
            raise RuntimeError(
                f"collate: {_where(path, i)}: Batches of nested tensors are not currently supported by the default "
                "collate_fn; please provide a custom collate_fn to handle them appropriately."
            ) from error


def _check_tensors(samples: Sequence[Any], path: _Path, error: BaseException | None) -> None:
    first = samples[0]
    dt, shape, dev = first.dtype, first.shape, first.device
    for i, x in enumerate(samples):
        if not isinstance(x, torch.Tensor):
            raise _mixed(path, i, x, first) from error
        if x.dtype is not dt:
            raise _dtype_differs(path, i, x.dtype, dt) from error
        if x.shape != shape:
            raise _differs(path, i, "shape", tuple(x.shape), tuple(shape)) from error
        if x.device != dev:
            raise _differs(path, i, "device", x.device, dev) from error


def _arrays(samples: Sequence[Any], path: _Path) -> torch.Tensor:
    first = samples[0]
    dt, shape = first.dtype, first.shape
    if not all(type(x) is np.ndarray and x.dtype == dt and x.shape == shape for x in samples):
        for i, x in enumerate(samples):
            if not isinstance(x, np.ndarray):
                raise _mixed(path, i, x, first)
            if x.dtype != dt:
                raise _dtype_differs(path, i, x.dtype, dt)
            if x.shape != shape:
                raise _differs(path, i, "shape", x.shape, shape)
    out = _empty((len(samples), *shape), _torch_dtype(dt, path))
    np.stack(samples, out=out.numpy())
    return out


def _numpy_scalars(samples: Sequence[Any], path: _Path) -> torch.Tensor:
    first = samples[0]
    t = type(first)
    if not all(type(x) is t for x in samples):
        for i, x in enumerate(samples):
            if type(x) is not t:
                raise _mixed(path, i, x, first)
    dtype = _torch_dtype(first.dtype, path)
    out = _empty((len(samples),), dtype)
    out.numpy()[:] = samples
    return out


def _number_kind(x: Any) -> str | None:
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, int):
        return "int"
    if isinstance(x, float) and not isinstance(x, np.generic):
        return "float"
    return None


_INTS = frozenset({int})
_FLOATS = frozenset({int, float})
_BOOLS = frozenset({bool})


def _int64_range(samples: Sequence[Any], path: _Path, error: BaseException) -> None:
    for i, x in enumerate(samples):
        if isinstance(x, int) and not -(2**63) <= x < 2**63:
            raise ValueError(f"collate: {_where(path, i)}: int {x} does not fit in int64") from error
    raise error


def _numbers(samples: Sequence[Any], path: _Path) -> torch.Tensor:
    """Python numbers: ints -> int64, floats (ints among them allowed) -> float64, bools -> bool."""
    types = set(map(type, samples))
    try:
        if types <= _INTS:
            return torch.tensor(samples, dtype=torch.int64)
        if types <= _FLOATS:
            return torch.tensor(samples, dtype=torch.float64)
        if types <= _BOOLS:
            return torch.tensor(samples, dtype=torch.bool)
    except (OverflowError, RuntimeError, ValueError) as e:
        _int64_range(samples, path, e)
    kinds = [_number_kind(x) for x in samples]  # subclasses (IntEnum, ...) and mixtures
    first = kinds[0]
    for i, kind in enumerate(kinds):
        if kind is None or (kind != first and {kind, first} != {"int", "float"}):
            raise _mixed(path, i, samples[i], samples[0])
    dtype = torch.float64 if "float" in kinds else torch.int64 if first == "int" else torch.bool
    try:
        return torch.tensor([int(x) if dtype is torch.int64 else x for x in samples], dtype=dtype)
    except (OverflowError, RuntimeError, ValueError) as e:
        _int64_range(samples, path, e)
        raise


def _strings(samples: Sequence[Any], path: _Path) -> list[Any]:
    if len(set(map(type, samples))) != 1:
        kind = str if isinstance(samples[0], str) else (bytes, bytearray)
        for i, x in enumerate(samples):
            if not isinstance(x, kind):
                raise _mixed(path, i, x, samples[0])
    return list(samples)


def _images(samples: Sequence[Any], path: _Path) -> torch.Tensor:
    """PIL images -> a (N, C, H, W) tensor, channels first as torchvision has them."""
    from PIL import Image

    first = samples[0]
    mode, size = first.mode, first.size
    for i, x in enumerate(samples):
        if not isinstance(x, Image.Image):
            raise _mixed(path, i, x, first)
        if x.mode != mode:
            raise TypeError(f"collate: {_where(path, i)}: image mode {x.mode!r} differs from {mode!r} of sample 0")
        if x.size != size:
            c = len(first.getbands())
            raise _differs(path, i, "shape", (c, x.size[1], x.size[0]), (c, size[1], size[0]))
    a = np.asarray(first)
    chw = (a.shape[2], a.shape[0], a.shape[1]) if a.ndim == 3 else (1, *a.shape)
    out = _empty((len(samples), *chw), _torch_dtype(a.dtype, path))
    view = out.numpy()
    for i, x in enumerate(samples):
        a = a if i == 0 else np.asarray(x)
        view[i] = a.transpose(2, 0, 1) if a.ndim == 3 else a
    return out


# -- containers ----------------------------------------------------------------------------------------


def _same_type(samples: Sequence[Any], path: _Path) -> None:
    if len(set(map(type, samples))) != 1:
        first = samples[0]
        for i, x in enumerate(samples):
            if type(x) is not type(first):
                raise _mixed(path, i, x, first)


def _mappings(samples: Sequence[Any], path: _Path) -> Any:
    first = samples[0]
    t = type(first)
    if t is dict and len(set(map(type, samples))) == 1 and len(set(map(len, samples))) == 1:
        try:  # same size and every key of sample 0 present: the same keys
            cols = [(k, list(map(itemgetter(k), samples))) for k in first]
        except KeyError:
            _check_keys(samples, path)
            raise
        return {k: _collate(col, (*path, k)) for k, col in cols}
    _check_keys(samples, path)
    values = {k: _collate([x[k] for x in samples], (*path, k)) for k in first.keys()}
    if t is dict:
        return values
    try:
        if isinstance(first, MutableMapping):
            clone = copy.copy(first)  # keeps the mapping's own settings (a defaultdict's factory)
            clone.update(values)
            return clone
        return t(values)
    except TypeError:
        return values


def _check_keys(samples: Sequence[Any], path: _Path) -> None:
    first = samples[0]
    keys = first.keys()
    for i, x in enumerate(samples):
        if type(x) is not type(first):
            raise _mixed(path, i, x, first)
        if x.keys() != keys:
            missing = [k for k in keys if k not in x]
            extra = [k for k in x.keys() if k not in keys]
            raise ValueError(f"collate: {_where(path, i)}: keys differ from those of sample 0 "
                             f"(missing {missing}, extra {extra})")


def _columns(samples: Sequence[Any], path: _Path) -> list[Any]:
    n = len(samples[0])
    for i, x in enumerate(samples):
        if len(x) != n:
            raise _differs(path, i, "length", len(x), n)
    return [_collate(col, (*path, j)) for j, col in enumerate(zip(*samples))]


def _tuples(samples: Sequence[Any], path: _Path) -> list[Any]:
    # A list, as torch's default_collate makes of tuples (code written for it indexes, unpacks or
    # appends to the result; a namedtuple stays one).
    _same_type(samples, path)
    return _columns(samples, path)


def _lists(samples: Sequence[Any], path: _Path) -> list[Any]:
    _same_type(samples, path)
    return _columns(samples, path)


def _sequence_subclass(samples: Sequence[Any], path: _Path) -> Any:
    _same_type(samples, path)
    cols = _columns(samples, path)
    try:
        return type(samples[0])(cols)
    except TypeError:
        return cols  # as default_collate, when the type cannot be built from a list


def _namedtuples(samples: Sequence[Any], path: _Path) -> Any:
    _same_type(samples, path)
    first = samples[0]
    cols = [_collate(col, (*path, name)) for name, col in zip(first._fields, zip(*samples))]
    return type(first)(*cols)


def _dataclasses(samples: Sequence[Any], path: _Path) -> Any:
    """A new instance of the same dataclass whose every field is batched. It is built without
    calling ``__init__`` / ``__post_init__``: checks written for one sample do not run on a batch."""
    _same_type(samples, path)
    cls: Any = type(samples[0])
    out = cls.__new__(cls)
    for f in dataclasses.fields(cls):
        name = f.name
        object.__setattr__(out, name, _collate([getattr(x, name) for x in samples], (*path, name)))
    return out


def _unsupported(samples: Sequence[Any], path: _Path) -> Any:
    raise TypeError(
        f"collate: {_where(path, 0)}: cannot batch {_type_name(samples[0])}; collate handles tensors, numpy "
        "arrays and scalars, Python numbers and bools, str, bytes, PIL images, and tuples, lists, dicts, "
        "namedtuples and dataclasses of them (pass collate_fn= for other types)"
    )


_Handler = Callable[[Sequence[Any], _Path], Any]

#: exact type -> handler; other types are classified once by :func:`_classify` and cached here.
_HANDLERS: dict[type, _Handler] = {
    torch.Tensor: _tensors,
    np.ndarray: _arrays,
    int: _numbers,
    float: _numbers,
    bool: _numbers,
    str: _strings,
    bytes: _strings,
    bytearray: _strings,
    tuple: _tuples,
    list: _lists,
    dict: _mappings,
}


def _classify(t: type) -> _Handler:
    if issubclass(t, torch.Tensor):
        return _tensors
    if issubclass(t, (str, bytes, bytearray)):  # before numpy: numpy.str_ is a str
        return _strings
    if issubclass(t, np.ndarray):
        return _arrays
    if issubclass(t, np.generic):
        return _numpy_scalars
    if issubclass(t, (bool, int, float)):
        return _numbers
    if issubclass(t, tuple):
        return _namedtuples if hasattr(t, "_fields") else _sequence_subclass
    if issubclass(t, list):
        return _sequence_subclass
    if issubclass(t, Mapping):
        return _mappings
    if dataclasses.is_dataclass(t):
        return _dataclasses
    pil = sys.modules.get("PIL.Image")
    if pil is not None and issubclass(t, pil.Image):
        return _images
    return _unsupported


def _collate(samples: Sequence[Any], path: _Path) -> Any:
    t = type(samples[0])
    handler = _HANDLERS.get(t)
    if handler is None:
        handler = _HANDLERS[t] = _classify(t)
    return handler(samples, path)


def collate(batch: Sequence[Any]) -> Any:
    """Turn a list of samples into one batch: the samples' common structure, with batched leaves.

    Args:
        batch: a non-empty sequence of samples of the same structure (a list from ``batch(n)``).
            A tensor, a dict (or other mapping) or a dataclass instance is not a sequence of
            samples but a batch already collated: it is returned as it is, so collating twice
            stacks nothing twice.

    Returns:
        The structure of the first sample with every leaf batched along a new first dimension:

        - torch tensors are stacked (same dtype, shape and device required);
        - numpy arrays of one dtype and shape become ``torch.from_numpy(np.stack(...))``; numpy
          scalars become a 1-d tensor of their dtype;
        - Python ``int`` -> ``int64``, ``float`` -> ``float64`` (as torch's ``default_collate``;
          a field holding both ints and floats becomes ``float64``), ``bool`` -> ``bool``;
        - PIL images of one mode and size -> a ``(N, C, H, W)`` tensor, channels first as
          torchvision has them, of the dtype ``numpy.asarray(image)`` gives (``uint8`` for RGB and L);
        - ``str`` and ``bytes`` stay as a list of the values;
        - the containers are ``default_collate``'s: dicts keep their keys, tuples and lists become
          lists, namedtuples and dataclasses stay instances of their class (a dataclass batch is made
          without calling its ``__init__``), each field collated in turn.

        Inside a DataLoader worker the batched CPU tensors are allocated in shared memory, so handing
        them to the main process costs no extra copy.

    Raises:
        RuntimeError: a field holds nested tensors (``torch.nested``), which have no batch: torch's
            ``default_collate`` message, after the field and the sample.
        TypeError: a field's types (or dtypes, or image modes) differ between samples, or a type cannot
            be batched; the message names the field and the sample, e.g.
            ``collate: field 'label' (sample 2): str differs from int of sample 0``.
        ValueError: the batch is empty, or shapes, lengths or dict keys differ, e.g.
            ``collate: field 'image' (sample 3): shape (3, 224, 200) differs from (3, 224, 224) of
            sample 0``.

    >>> import torch
    >>> collate([(torch.zeros(2), 1, "a"), (torch.ones(2), 2, "b")])
    [tensor([[0., 0.],
            [1., 1.]]), tensor([1, 2]), ['a', 'b']]
    >>> collate([{"y": 1}, {"y": "one"}])
    Traceback (most recent call last):
    ...
    TypeError: collate: field 'y' (sample 1): str differs from int of sample 0

    See also: :class:`~datapipes.iter.Collator` (``pipe.collate()``), :func:`map_tensors`.
    """
    if type(batch) is not list and _already_batched(batch):
        return batch
    if len(batch) == 0:
        raise ValueError("collate: the batch is empty")
    return _collate(batch, ())


def _already_batched(batch: Any) -> bool:
    return isinstance(batch, (torch.Tensor, Mapping)) or (dataclasses.is_dataclass(batch) and not isinstance(batch, type))


# -- map_tensors ---------------------------------------------------------------------------------------


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Return ``obj`` with ``fn`` applied to every torch tensor in it, the structure kept.

    Tuples, lists, dicts (and other mappings), namedtuples and dataclass instances are walked to any
    depth and rebuilt (a dataclass is shallow-copied, then its fields replaced); everything else
    (numpy arrays, numbers, strings, ...) is returned as it is.

    >>> import torch
    >>> map_tensors({"x": torch.ones(2), "id": "a"}, lambda t: t * 2)
    {'x': tensor([2., 2.]), 'id': 'a'}
    """
    t = type(obj)
    if t is torch.Tensor:
        return fn(obj)
    if t is dict:
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if t is tuple:
        return tuple([map_tensors(v, fn) for v in obj])
    if t is list or t is DataChunk:
        return [map_tensors(v, fn) for v in obj]
    if t in _LEAVES:
        return obj
    return _map_other(obj, fn, map_tensors)


_LEAVES = frozenset({str, bytes, int, float, bool, type(None), np.ndarray})
_PLAIN = frozenset({str, bytes, int, float, bool, type(None)})

_Walk = Callable[[Any, Callable[[torch.Tensor], Any]], Any]


def _map_other(obj: Any, fn: Callable[[torch.Tensor], Any], walk: _Walk) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*[walk(v, fn) for v in obj])
    if isinstance(obj, (tuple, list)):
        values = [walk(v, fn) for v in obj]
        try:
            return type(obj)(values)
        except TypeError:
            return tuple(values) if isinstance(obj, tuple) else values
    if isinstance(obj, Mapping):
        mapped = {k: walk(v, fn) for k, v in obj.items()}
        try:
            if isinstance(obj, MutableMapping):
                clone = copy.copy(obj)
                clone.update(mapped)
                return clone
            return type(obj)(mapped)  # type: ignore[call-arg]
        except TypeError:
            return mapped
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = copy.copy(obj)
        for f in dataclasses.fields(obj):
            object.__setattr__(out, f.name, walk(getattr(obj, f.name), fn))
        return out
    return obj


# -- map_converted / map_collated: what to_device and to_cuda move ---------------------------------------


def map_converted(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """As :func:`map_tensors`, with numpy values first turned into tensors (torch's
    ``default_convert``): a numpy array of a numeric or bool dtype becomes a tensor sharing its memory
    (a read-only or negatively strided array is copied first), a numpy scalar a 0-d tensor, and
    ``fn`` is applied to them as to every tensor. Numpy arrays of strings, bytes, objects or records
    are left as they are, and so are Python numbers, strings and other values. Nothing is stacked: a
    tensor, or a dict of tensors, comes back with the same tensors.

    Raises:
        TypeError: a numpy value of a dtype torch has no tensor for (``datetime64``,
            ``timedelta64``); the message names the dtype.

    >>> import numpy as np
    >>> map_converted({"x": np.arange(3), "n": np.float32(0.5), "id": "a"}, lambda t: t)
    {'x': tensor([0, 1, 2]), 'n': tensor(0.5000), 'id': 'a'}
    """
    t = type(obj)
    if t is torch.Tensor:
        return fn(obj)
    if t is np.ndarray:
        return obj if obj.dtype.kind in _NOT_NUMERIC else fn(_array_tensor(obj))
    if t is dict:
        return {k: map_converted(v, fn) for k, v in obj.items()}
    if t is tuple:
        return tuple([map_converted(v, fn) for v in obj])
    if t is list or t is DataChunk:
        return [map_converted(v, fn) for v in obj]
    if t in _PLAIN:
        return obj
    if isinstance(obj, (np.ndarray, np.generic)) and not isinstance(obj, (str, bytes)):
        if obj.dtype.kind in _NOT_NUMERIC:
            return obj
        return fn(_array_tensor(obj) if isinstance(obj, np.ndarray) else _scalar_tensor(obj))
    return _map_other(obj, fn, map_converted)


_NOT_NUMERIC = frozenset("OUSV")  # object, str, bytes, void (records): no tensor dtype, left alone


def _array_tensor(a: np.ndarray[Any, Any]) -> torch.Tensor:
    if not a.flags.writeable:  # a tensor is writable: never alias memory numpy says is read-only
        a = a.copy()
    try:
        return torch.from_numpy(a)
    except ValueError:  # negative strides
        return torch.from_numpy(a.copy())
    except TypeError as e:
        raise TypeError(f"a numpy array of dtype {a.dtype} cannot become a tensor ({e})") from None


def _scalar_tensor(x: np.generic) -> torch.Tensor:
    # Through a 0-d array: torch.as_tensor refuses some numpy scalars that from_numpy takes (a uint64
    # scalar on every torch, numpy 2's bool on torch 2.5), and is slower.
    try:
        return torch.from_numpy(np.asarray(x))
    except (TypeError, RuntimeError) as e:
        raise TypeError(f"a numpy scalar of dtype {x.dtype} cannot become a tensor ({e})") from None


def map_collated(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """A list (what ``batch()`` yields, list subclasses included) is a list of samples: it is
    collated (:func:`collate`) and ``fn`` is applied to every tensor of the batch; any other value is
    taken as one item and goes through :func:`map_converted` (numpy values become tensors, tensors
    are kept, nothing is stacked).

    Raises:
        What :func:`collate` raises for a list whose samples cannot be batched; what
        :func:`map_converted` raises.

    >>> import numpy as np, torch
    >>> map_collated([np.zeros(2), np.ones(2)], lambda t: t)
    tensor([[0., 0.],
            [1., 1.]], dtype=torch.float64)
    >>> map_collated({"x": torch.ones(2)}, lambda t: t)  # not a list: already a batch
    {'x': tensor([1., 1.])}
    """
    if isinstance(obj, list):
        return map_tensors(collate(obj), fn)
    return map_converted(obj, fn)
