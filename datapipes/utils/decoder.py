"""torch DataPipes' ``utils.decoder``: a :class:`Decoder` that turns ``(key, bytes)`` pairs into
Python objects through a list of handlers, and the handlers themselves.

A handler is a function ``handler(extension, data)`` that returns the decoded object, or ``None``
when it does not handle that extension (the next handler is then tried; data no handler takes
stays as it is). The handlers here, as in torch:

- :func:`basichandlers`: text, class numbers, JSON, ``torch.save`` files (``.pt``, weights only)
  and, only when asked by name (``allow_pickle=True``), pickles;
- :func:`imagehandler` / :class:`ImageHandler`: images through Pillow, to numpy, torch or PIL
  (see :data:`imagespecs`);
- :func:`mathandler`: MATLAB ``.mat`` files (needs scipy), :func:`videohandler` (needs
  torchvision), :func:`audiohandler` (needs torchaudio). A missing package raises
  ``ModuleNotFoundError`` naming it when a file of that kind is decoded, not before.

:class:`~datapipes.iter.RoutedDecoder` (``routed_decode``) applies a :class:`Decoder` to the
``(path, stream)`` pairs of a pipe.

**Pickles are opt-in.** Unpickling runs whatever code the file's author chose, so a ``.pyd`` or
``.pickle`` member of a shard from a shared bucket could run code on the reading machine. As
``numpy.load`` does, nothing is unpickled unless the caller asks by name: ``allow_pickle=True`` on
:class:`Decoder`, ``routed_decode`` or :func:`basichandlers`; without it a pickle raises
:class:`PickleRefused` naming the file. ``.pt`` files are read with ``torch.load(weights_only=True)``
(tensors and plain containers only) unless ``allow_pickle=True``. See docs/howto/security.rst.

>>> import json
>>> from datapipes.utils.decoder import Decoder, basichandlers
>>> Decoder(basichandlers)([("a.json", json.dumps({"x": 1}).encode()), ("b.cls", b"7")])
{'a.json': {'x': 1}, 'b.cls': 7}
"""

from __future__ import annotations

import io
import json
import os
import pickle
import tempfile
from typing import Any, Callable, Iterable

from .._checks import require_bool

__all__ = [
    "Decoder",
    "ImageHandler",
    "MatHandler",
    "PickleRefused",
    "audiohandler",
    "basichandlers",
    "extension_extract_fn",
    "handle_extension",
    "imagehandler",
    "imagespecs",
    "mathandler",
    "videohandler",
]

Handler = Callable[[str, Any], Any]

# -- basic types -----------------------------------------------------------------------------------

_TEXT = frozenset(("txt", "text", "transcript"))
_INT = frozenset(("cls", "cls2", "class", "count", "index", "inx", "id"))
_JSON = frozenset(("json", "jsn"))
_PICKLE = frozenset(("pyd", "pickle"))


class PickleRefused(ValueError):
    """A pickle met where nobody asked for unpickling (``allow_pickle=False``, the default): a
    ``ValueError``, as ``numpy.load`` raises for the same reason. The message says how to opt in."""


def basichandlers(extension: str, data: bytes, *, allow_pickle: bool = False) -> Any:
    """Decode the bytes of a file of a basic type, chosen by its extension.

    Args:
        extension: the file's extension, without the dot (``"json"``).
        data: the file's bytes.
        allow_pickle: unpickle ``pyd``/``pickle`` files, and read ``pt`` files with
            ``torch.load(weights_only=False)``. Off by default (as ``numpy.load``'s): unpickling
            runs whatever code the file's author chose, so turn it on only for files you trust.
            As a handler, ``functools.partial(basichandlers, allow_pickle=True)``, or
            ``allow_pickle=True`` on :class:`Decoder` / ``routed_decode``, which do that for you.

    Returns:
        - ``txt``, ``text``, ``transcript``: the UTF-8 text (``str``);
        - ``cls``, ``cls2``, ``class``, ``count``, ``index``, ``inx``, ``id``: an ``int`` (``None``
          when the bytes are not an integer);
        - ``json``, ``jsn``: ``json.loads(data)``;
        - ``pyd``, ``pickle``: ``pickle.loads(data)``, with ``allow_pickle=True`` only;
        - ``pt``: ``torch.load`` of the bytes, ``weights_only=True`` (tensors and plain
          containers) unless ``allow_pickle=True``;
        - any other extension: ``None`` (not handled).

    Raises:
        PickleRefused: (a ``ValueError``) a ``pyd``/``pickle`` file without ``allow_pickle=True``.
        Whatever the decoding raises (``UnicodeDecodeError``, ``json.JSONDecodeError``, torch's
        ``UnpicklingError`` for a ``.pt`` file that holds more than weights, ...).

    The extension must be one of these words exactly (torch's function also takes any part of
    ``"txt text transcript"`` or ``"json jsn"``, such as ``""`` or ``"xt"``, which looks unintended).
    torch's function unpickles ``pyd``/``pickle`` files unasked.

    Example:
        >>> import pickle
        >>> from datapipes.utils.decoder import basichandlers
        >>> basichandlers("json", b'{"a": 1}'), basichandlers("cls", b"3")
        ({'a': 1}, 3)
        >>> basichandlers("pickle", pickle.dumps("some data"), allow_pickle=True)
        'some data'
        >>> basichandlers("jpg", b"...") is None
        True
    """
    if extension in _TEXT:
        return data.decode("utf-8")
    if extension in _INT:
        try:
            return int(data)
        except ValueError:
            return None
    if extension in _JSON:
        return json.loads(data)
    if extension in _PICKLE:
        if not allow_pickle:
            raise PickleRefused(
                f"basichandlers: refusing to unpickle a .{extension} file: unpickling runs whatever code the "
                f"file's author put in it. Decode pickles only from data you trust, and say so with "
                f"allow_pickle=True (routed_decode(allow_pickle=True), Decoder(..., allow_pickle=True) or "
                f"functools.partial(basichandlers, allow_pickle=True))"
            )
        return pickle.loads(data)  # noqa: S301 - asked for by name: allow_pickle=True
    if extension == "pt":
        import torch

        # Explicit: torch before 2.6 (which setup.cfg admits) defaulted to weights_only=False.
        return torch.load(io.BytesIO(data), weights_only=not allow_pickle)
    return None


# -- images ----------------------------------------------------------------------------------------

#: The image specifications :class:`ImageHandler` takes: ``spec -> (array type, element type, mode)``.
imagespecs: dict[str, tuple[str, str | None, str]] = {
    "l8": ("numpy", "uint8", "l"),
    "rgb8": ("numpy", "uint8", "rgb"),
    "rgba8": ("numpy", "uint8", "rgba"),
    "l": ("numpy", "float", "l"),
    "rgb": ("numpy", "float", "rgb"),
    "rgba": ("numpy", "float", "rgba"),
    "torchl8": ("torch", "uint8", "l"),
    "torchrgb8": ("torch", "uint8", "rgb"),
    "torchrgba8": ("torch", "uint8", "rgba"),
    "torchl": ("torch", "float", "l"),
    "torchrgb": ("torch", "float", "rgb"),
    "torch": ("torch", "float", "rgb"),
    "torchrgba": ("torch", "float", "rgba"),
    "pill": ("pil", None, "l"),
    "pil": ("pil", None, "rgb"),
    "pilrgb": ("pil", None, "rgb"),
    "pilrgba": ("pil", None, "rgba"),
}

_IMAGE_EXTENSIONS = frozenset(("jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm"))


class UnknownImageSpec(ValueError, AssertionError):
    """An image specification :class:`ImageHandler` does not know: a ``ValueError``, and an
    ``AssertionError`` as torch's (code written for torch that catches that keeps working)."""


def handle_extension(extensions: str, f: Callable[[Any], Any]) -> Handler:
    """A handler that calls ``f(data)`` for the keys ending in one of ``extensions``.

    Args:
        extensions: space-separated extensions, compared case-insensitively; one with dots
            (``"seg.jpg"``) needs that many trailing parts of the key (``"x.seg.jpg"``).
        f: the decoding function, given the data.

    Returns:
        ``handler(key, data)``: ``f(data)`` for a matching key, else ``None``.

    torch's version looks only at the first extension of the list (it returns ``None`` after
    it); here each of them is tried.

    Example:
        >>> from datapipes.utils.decoder import handle_extension
        >>> h = handle_extension("jpg jpeg", len)
        >>> h("photo.JPEG", b"abc"), h("photo.png", b"abc")
        (3, None)
        >>> handle_extension("seg.jpg", len)("x.seg.jpg", b"ab")
        2
    """
    targets = [t.split(".") for t in extensions.lower().split()]
    return _ExtensionHandler(targets, f)


class _ExtensionHandler:
    __slots__ = ("targets", "f")

    def __init__(self, targets: list[list[str]], f: Callable[[Any], Any]) -> None:
        self.targets = targets
        self.f = f

    def __call__(self, key: str, data: Any) -> Any:
        parts = key.lower().split(".")
        for target in self.targets:
            if len(target) <= len(parts) and parts[-len(target):] == target:
                return self.f(data)
        return None

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ExtensionHandler, (self.targets, self.f))


class ImageHandler:
    """A handler decoding image files through Pillow, as ``imagespec`` says.

    Args:
        imagespec: one of :data:`imagespecs`:

            - ``"l8"``, ``"rgb8"``, ``"rgba8"``: a numpy ``uint8`` array, ``(H, W)`` or ``(H, W, C)``;
            - ``"l"``, ``"rgb"``, ``"rgba"``: a numpy ``float32`` array in ``[0, 1]``;
            - ``"torchl8"``, ``"torchrgb8"``, ``"torchrgba8"``: a ``uint8`` tensor ``(C, H, W)``;
            - ``"torchl"``, ``"torchrgb"``, ``"torch"``, ``"torchrgba"``: a ``float32`` tensor
              ``(C, H, W)`` in ``[0, 1]``;
            - ``"pill"``, ``"pil"``, ``"pilrgb"``, ``"pilrgba"``: a PIL image (mode L, RGB, RGBA).

    Handles the extensions ``jpg``, ``jpeg``, ``png``, ``ppm``, ``pgm``, ``pbm``, ``pnm`` (any
    case); returns ``None`` for others. The image is converted to the spec's mode first.

    Raises:
        UnknownImageSpec: (a ``ValueError`` and an ``AssertionError``, torch's type) the spec is not
            one of these.

    The grey torch specs (``"torchl8"``, ``"torchl"``) give a ``(1, H, W)`` tensor; torch's handler
    fails on them (it transposes a 2-D array as if it had channels).

    Example:
        >>> import io
        >>> from PIL import Image
        >>> from datapipes.utils.decoder import ImageHandler
        >>> buf = io.BytesIO(); Image.new("RGB", (4, 2), (255, 0, 0)).save(buf, "PNG")
        >>> ImageHandler("torchrgb8")("png", buf.getvalue()).shape
        torch.Size([3, 2, 4])
        >>> ImageHandler("rgb")("png", buf.getvalue())[0, 0].tolist()
        [1.0, 0.0, 0.0]
    """

    def __init__(self, imagespec: str) -> None:
        if imagespec not in imagespecs:
            raise UnknownImageSpec(
                f"ImageHandler: unknown image specification: {imagespec!r} (one of {', '.join(imagespecs)})"
            )
        self.imagespec = imagespec.lower()

    def __call__(self, extension: str, data: bytes) -> Any:
        if extension.lower() not in _IMAGE_EXTENSIONS:
            return None
        from PIL import Image

        atype, etype, mode = imagespecs[self.imagespec]
        with io.BytesIO(data) as stream:
            opened = Image.open(stream)
            opened.load()
        img = opened.convert(mode.upper())
        if atype == "pil":
            return img
        import numpy as np

        a = np.asarray(img)
        if atype == "numpy":
            return a if etype == "uint8" else a.astype(np.float32) / 255.0
        import torch

        chw = a[None].copy() if a.ndim == 2 else np.ascontiguousarray(a.transpose(2, 0, 1))
        t = torch.from_numpy(chw)
        return t if etype == "uint8" else t / 255.0

    def __repr__(self) -> str:
        return f"ImageHandler({self.imagespec!r})"


def imagehandler(imagespec: str) -> ImageHandler:
    """The image handler for ``imagespec`` (see :class:`ImageHandler`).

    >>> from datapipes.utils.decoder import imagehandler
    >>> imagehandler("pil")
    ImageHandler('pil')
    """
    return ImageHandler(imagespec)


# -- video, audio, mat (optional packages) ----------------------------------------------------------

_VIDEO_EXTENSIONS = frozenset(("mp4", "ogv", "mjpeg", "avi", "mov", "h264", "mpg", "webm", "wmv"))
_AUDIO_EXTENSIONS = frozenset(("flac", "mp3", "sox", "wav", "m4a", "ogg", "wma"))


def _need(module: str, package: str, what: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ModuleNotFoundError(
            f"Package `{package}` is required to decode {what}; install it with `pip install {package}`",
            name=package,
        ) from e


def _through_file(extension: str, data: bytes, load: Callable[[str], Any]) -> Any:
    with tempfile.TemporaryDirectory() as dirname:
        fname = os.path.join(dirname, f"file.{extension}")
        with open(fname, "wb") as stream:
            stream.write(data)
        return load(fname)


def videohandler(extension: str, data: bytes) -> Any:
    """A handler reading video files (``mp4``, ``ogv``, ``mjpeg``, ``avi``, ``mov``, ``h264``,
    ``mpg``, ``webm``, ``wmv``) with ``torchvision.io.read_video``; ``None`` for other extensions.

    Raises:
        ModuleNotFoundError: torchvision is not installed (only when a video is decoded).

    >>> from datapipes.utils.decoder import videohandler
    >>> videohandler("txt", b"") is None
    True
    """
    if extension not in _VIDEO_EXTENSIONS:
        return None
    tvio = _need("torchvision.io", "torchvision", "video files")
    return _through_file(extension, data, tvio.read_video)


def audiohandler(extension: str, data: bytes) -> Any:
    """A handler reading audio files (``flac``, ``mp3``, ``sox``, ``wav``, ``m4a``, ``ogg``,
    ``wma``) with ``torchaudio.load``; ``None`` for other extensions.

    Raises:
        ModuleNotFoundError: torchaudio is not installed (only when an audio file is decoded).

    >>> from datapipes.utils.decoder import audiohandler
    >>> audiohandler("txt", b"") is None
    True
    """
    if extension not in _AUDIO_EXTENSIONS:
        return None
    torchaudio = _need("torchaudio", "torchaudio", "audio files")
    return _through_file(extension, data, torchaudio.load)


class MatHandler:
    """A handler reading MATLAB ``.mat`` files with ``scipy.io.loadmat(stream, **loadmat_kwargs)``;
    ``None`` for other extensions.

    Raises:
        ModuleNotFoundError: scipy is not installed, when a ``.mat`` file is decoded (torch's
            raises as the handler is made).

    >>> from datapipes.utils.decoder import mathandler
    >>> mathandler(squeeze_me=True)("txt", b"") is None
    True
    """

    def __init__(self, **loadmat_kwargs: Any) -> None:
        self.loadmat_kwargs = loadmat_kwargs

    def __call__(self, extension: str, data: bytes) -> Any:
        if extension != "mat":
            return None
        sio = _need("scipy.io", "scipy", ".mat files")
        with io.BytesIO(data) as stream:
            return sio.loadmat(stream, **self.loadmat_kwargs)


def mathandler(**loadmat_kwargs: Any) -> MatHandler:
    """The ``.mat`` handler (see :class:`MatHandler`)."""
    return MatHandler(**loadmat_kwargs)


# -- the decoder -----------------------------------------------------------------------------------


def extension_extract_fn(pathname: Any) -> str:
    """The extension of ``pathname`` without its dot (``""`` when it has none), the default key of
    :class:`Decoder`.

    >>> from datapipes.utils.decoder import extension_extract_fn
    >>> extension_extract_fn("dir/a.tar.gz"), extension_extract_fn("README")
    ('gz', '')
    """
    return os.path.splitext(pathname)[1][1:]


_READ_CHUNK = 1 << 20


def _read_all(stream: Any) -> bytes:
    """All the bytes left in a binary stream, read in pieces (some streams, HTTP responses among
    them, return less than asked before their end)."""
    read = stream.read
    first = read(_READ_CHUNK)
    if not first:
        return b"" if first is None else bytes(first)
    parts = [first]
    while True:
        part = read(_READ_CHUNK)
        if not part:
            return b"".join(parts)
        parts.append(part)


class Decoder:
    """Decode ``(key, data)`` pairs through a list of handlers, the first one that returns
    something other than ``None`` winning.

    Args:
        handler: the handlers, ``handler(key_fn(key), data)``, in order of priority.
        key_fn: what the handlers are given of each key; default: the file extension
            (:func:`extension_extract_fn`).
        allow_pickle: let :func:`basichandlers`, where it is one of the handlers, unpickle
            ``pyd``/``pickle`` files and read ``pt`` files whole (``weights_only=False``). Off
            by default: unpickling runs code the file's author chose (see the module's docstring).

    Calling the decoder with one ``(key, data)`` pair, a list of them or a dict returns a dict
    ``{key: decoded}``. For each value:

    - an empty value (``b""``, ``None``) stays as it is;
    - a binary stream (an open file, a :class:`~datapipes.utils.common.StreamWrapper` around one)
      is read to its end and closed, and its bytes are decoded;
    - the value of a key starting with ``"_"`` that is ``bytes`` is decoded as UTF-8 text (as
      torch, after webdataset);
    - otherwise the handlers are tried in order; when none handles it, the value stays as it is.

    Raises:
        PickleRefused: a pickle without ``allow_pickle=True``, with a note naming its key.
        Whatever a handler or reading the stream raises.

    Example:
        >>> import io
        >>> from datapipes.utils.decoder import Decoder, basichandlers
        >>> d = Decoder(basichandlers)
        >>> d(("a.txt", io.BytesIO(b"hello")))
        {'a.txt': 'hello'}
        >>> d.add_handler(lambda ext, data: data.upper() if ext == "txt" else None)
        >>> d({"b.txt": b"hi", "c.bin": b"\\x00"})
        {'b.txt': b'HI', 'c.bin': b'\\x00'}
    """

    allow_pickle = False  # a Decoder pickled before the argument existed decodes as the default

    def __init__(
        self, *handler: Handler, key_fn: Callable[[Any], Any] = extension_extract_fn, allow_pickle: bool = False
    ) -> None:
        require_bool(allow_pickle, "Decoder", "allow_pickle")
        self.handlers: list[Handler] = list(handler)
        self.key_fn = key_fn
        self.allow_pickle = allow_pickle

    def add_handler(self, *handler: Handler) -> None:
        """Put ``handler`` (in their order) before the handlers already there: they come first."""
        if handler:
            self.handlers = list(handler) + self.handlers

    @staticmethod
    def _is_stream_handle(data: Any) -> bool:
        inner = getattr(data, "file_obj", data)
        return isinstance(inner, (io.BufferedIOBase, io.RawIOBase))

    def decode1(self, key: Any, data: Any) -> Any:
        """Decode one value under the handler key ``key`` (what ``key_fn`` gave)."""
        try:
            empty = not data
        except Exception:  # noqa: BLE001 - an array's truth value is ambiguous: not empty
            empty = False
        if empty:
            return data
        if self._is_stream_handle(data):
            stream = data
            try:
                data = _read_all(stream)
            finally:
                stream.close()
        allow_pickle = self.allow_pickle
        for f in self.handlers:
            if f is basichandlers:
                result = basichandlers(key, data, allow_pickle=allow_pickle)
            else:
                result = f(key, data)
            if result is not None:
                return result
        return data

    def _decode_item(self, key: Any, value: Any) -> Any:
        if isinstance(value, bytes) and isinstance(key, str) and key[:1] == "_":
            return value.decode("utf-8")
        try:
            return self.decode1(self.key_fn(key), value)
        except PickleRefused as e:
            e.add_note(f"Decoder: the pickle refused is the value of {key!r}")
            raise

    def decode(self, data: tuple[Any, Any] | Iterable[tuple[Any, Any]] | dict[Any, Any] | None) -> dict[Any, Any]:
        """``{key: decoded value}`` of one ``(key, data)`` pair, a list of pairs or a dict."""
        if data is None:
            return {}
        if isinstance(data, tuple):
            data = [data]
        elif isinstance(data, dict):
            data = data.items()
        return {k: self._decode_item(k, v) for k, v in data}

    def __call__(self, data: Any) -> dict[Any, Any]:
        return self.decode(data)

    def __repr__(self) -> str:
        shown = [*map(_name, self.handlers), *(["allow_pickle=True"] if self.allow_pickle else [])]
        return f"Decoder({', '.join(shown)})"


def _name(f: Any) -> str:
    return getattr(f, "__name__", None) or repr(f)
