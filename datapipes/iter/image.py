"""Image decoding through Pillow: ImageDecoder [decode_image].

The work per image (decoding, draft scaling, colour conversion, resizing) runs in Pillow's C code,
which releases the GIL while it works, so it overlaps with other threads (reading files ahead,
another pipe decoding); the Python around it is a few calls per image.
"""

from __future__ import annotations

import io
from typing import Any, Iterator

import numpy as np
from PIL import Image, ImageMode

from .._checks import require_bool
from .._engine import abandon
from .._engine import close_iterator as _close
from .._runtime.passes import Pass
from ..datapipe import IterDataPipe, functional_datapipe, require_pipe, source_len, stage_label
from ..errors import WARN_FAILURES, _OnError, policy_and_log
from ._readers import _budget_stateless, _count_run, _CountRun, _on_fail

__all__ = ["ImageDecoder"]

_OUTPUTS = ("numpy", "pil")
_LAYOUTS = ("hwc", "chw")
_RESAMPLE = {int(r): r for r in Image.Resampling}
_BYTES = (bytes, bytearray, memoryview)


class _Decode:
    """The per-image function: ``fileobj -> image``, built once per pass from the pipe's options.

    The options are tested per image: a few nanoseconds against a decode of 100 µs or more.
    """

    __slots__ = ("mode", "size", "resample", "draft", "finish")

    def __init__(self, pipe: ImageDecoder) -> None:
        self.mode = pipe.mode
        self.size = None if pipe.size is None else (pipe.size[1], pipe.size[0])  # Pillow: (w, h)
        self.resample = pipe.resample
        self.draft = pipe.draft
        self.finish = _FINISH[pipe.output, pipe.layout]

    def __call__(self, fp: Any) -> Any:
        img: Image.Image = Image.open(fp)
        size = self.size
        if self.draft:
            # JPEG only (a no-op elsewhere): decode at 1/2, 1/4 or 1/8 scale, still >= size.
            img.draft(self.mode, size)  # type: ignore[arg-type]
        img.load()
        if self.mode is not None and img.mode != self.mode:
            img = img.convert(self.mode)
        if size is not None and img.size != size:
            img = img.resize(size, self.resample)
        return self.finish(img)


def _hwc(img: Image.Image) -> np.ndarray:
    a = np.array(img)  # a writable copy (np.asarray of an image is read-only)
    return a[:, :, None] if a.ndim == 2 else a


def _chw(img: Image.Image) -> np.ndarray:
    a = np.asarray(img)
    if a.ndim == 2:
        return a[None].copy()
    return np.ascontiguousarray(a.transpose(2, 0, 1))


def _pil(img: Image.Image) -> Image.Image:
    return img


_FINISH = {("numpy", "hwc"): _hwc, ("numpy", "chw"): _chw, ("pil", "hwc"): _pil}


def _decode_one(decode: _Decode, item: Any, stage: str) -> Any:
    """Decode one item: bytes, a binary stream, or a ``(path, stream-or-bytes)`` pair."""
    if type(item) is tuple and len(item) == 2:
        path, data = item
        return path, _decode_data(decode, data, stage)
    return _decode_data(decode, item, stage)


def _decode_data(decode: _Decode, data: Any, stage: str) -> Any:
    if isinstance(data, _BYTES):
        return decode(io.BytesIO(data))
    if getattr(data, "read", None) is None:
        raise TypeError(
            f"{stage}: items must be bytes, a binary stream or (path, stream) pairs, got {type(data).__name__}"
        )
    try:
        return decode(data)
    finally:
        _close(data)


def _where(item: Any, n: int) -> tuple[str, int]:
    if type(item) is tuple and len(item) == 2:
        return f"file {item[0]!r}, item", n
    return "item", n


def _images(pipe: ImageDecoder, it: Iterator[Any], run: _CountRun) -> Iterator[Any]:
    decode = _Decode(pipe)
    stage = stage_label(pipe)
    on_fail = _on_fail(pipe, stage)
    try:
        for n, item in run.begin(it, on_fail):  # n: the item being decoded
            try:
                out = _decode_one(decode, item, stage)
            except Exception as e:
                on_fail(e, *_where(item, n))
                continue
            yield out
    except BaseException:
        abandon(it)  # this frame names the upstream: release it now, not at collection
        raise
    finally:
        run.end()


def _check_size(size: Any, stage: str) -> tuple[int, int] | None:
    if size is None:
        return None
    if (
        not isinstance(size, (tuple, list))
        or len(size) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in size)
    ):
        raise TypeError(f"{stage}: size must be (height, width), a pair of ints, or None; got {size!r}")
    if size[0] < 1 or size[1] < 1:
        raise ValueError(f"{stage}: size must be positive, got {size!r}")
    return (size[0], size[1])


@functional_datapipe("decode_image")
class ImageDecoder(IterDataPipe[Any]):
    """Decode images with Pillow into numpy arrays or PIL images (functional name: ``decode_image``).

    Args:
        datapipe: a pipe of encoded images: ``bytes``, binary streams, or ``(path, stream)`` pairs
            as ``open_files(mode="b")`` and the archive loaders yield (the path is kept).
        mode: the Pillow mode to convert to: ``"RGB"`` (default), ``"L"`` (grey), ``"RGBA"``, ...;
            ``None`` keeps each image's own mode.
        size: ``(height, width)`` to resize every image to exactly (the aspect ratio is not kept);
            ``None`` keeps the decoded size.
        resample: the resize filter, one of Pillow's ``Image.Resampling`` (default ``BILINEAR``).
        draft: let the JPEG decoder downscale by 2, 4 or 8 while decoding where the target ``size``
            is at most half the source (much faster; slightly different pixels). Needs ``size``;
            a no-op for other formats.
        output: ``"numpy"`` (default) or ``"pil"``.
        layout: for numpy output, ``"hwc"`` (default, ``(H, W, C)``) or ``"chw"`` (``(C, H, W)``).
            Arrays are always 3-D (a grey image has ``C = 1``), contiguous and writable; ``uint8``
            for 8-bit modes (``"L"``, ``"RGB"``, ``"RGBA"``).
        on_error: ``"raise"`` (default) or ``"skip"``: an image that fails to decode is skipped and
            counted in ``pipe.failures``.
        max_failures: with ``on_error="skip"``, failures tolerated per pass: a number, or a float
            between 0 and 1 for a share of the items (``None``: any).
        warn_failures: with ``on_error="skip"``, past how many failures (a number, or a share:
            10% by default) a pass warns once (``None``: never); see :mod:`datapipes.errors`.

    Yields:
        The decoded image for each item, or ``(path, image)`` for ``(path, stream)`` pairs, in
        order. Each stream is closed once decoded. EXIF orientation is not applied.

    Raises:
        PIL.UnidentifiedImageError (an ``OSError``) for data that is no image, ``OSError`` for a
        truncated or corrupt one: the very error Pillow raised, with a note naming the stage, the
        file (for pairs) and the item's position. TypeError: an item of another type.

    ``len()`` is the source's length.

    Example:
        >>> import io
        >>> from PIL import Image
        >>> from datapipes.iter import IterableWrapper
        >>> buf = io.BytesIO(); Image.new("RGB", (8, 6), "red").save(buf, "PNG"); png = buf.getvalue()
        >>> pairs = IterableWrapper([("r.png", io.BytesIO(png))])
        >>> [(path, a.shape, a[0, 0].tolist()) for path, a in pairs.decode_image(size=(3, 4))]
        [('r.png', (3, 4, 3), [255, 0, 0])]
        >>> [a.shape for a in IterableWrapper([png]).decode_image(mode="L", layout="chw")]
        [(1, 6, 8)]

    See also: :class:`~datapipes.iter.FileOpener`, :class:`~datapipes.iter.TarArchiveLoader`.
    """

    _saves = "same as open_files"

    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        *,
        mode: str | None = "RGB",
        size: tuple[int, int] | None = None,
        resample: int = Image.Resampling.BILINEAR,
        draft: bool = False,
        output: str = "numpy",
        layout: str = "hwc",
        on_error: _OnError = "raise",
        max_failures: int | float | None = None,
        warn_failures: int | float | None = WARN_FAILURES,
    ) -> None:
        stage = "ImageDecoder"
        require_pipe(datapipe, stage)
        if mode is not None:
            if not isinstance(mode, str):
                raise TypeError(f"{stage}: mode must be a Pillow mode str or None, got {type(mode).__name__}")
            try:
                ImageMode.getmode(mode)
            except KeyError:
                raise ValueError(f"{stage}: unknown Pillow mode {mode!r} (e.g. 'RGB', 'L', 'RGBA')") from None
        size = _check_size(size, stage)
        if isinstance(resample, bool) or not isinstance(resample, int) or resample not in _RESAMPLE:
            raise ValueError(f"{stage}: resample must be one of Pillow's Image.Resampling filters, got {resample!r}")
        require_bool(draft, stage, "draft")
        if draft and size is None:
            raise ValueError(f"{stage}: draft=True needs a target size=(height, width)")
        if output not in _OUTPUTS:
            raise ValueError(f"{stage}: output must be 'numpy' or 'pil', got {output!r}")
        if layout not in _LAYOUTS:
            raise ValueError(f"{stage}: layout must be 'hwc' or 'chw', got {layout!r}")
        if output == "pil" and layout != "hwc":
            raise ValueError(f"{stage}: layout={layout!r} applies to numpy output only, got output='pil'")
        self.datapipe = datapipe
        self.mode = mode
        self.size = size
        self.resample = _RESAMPLE[resample]
        self.draft = draft
        self.output = output
        self.layout = layout
        self._policy, self.failures = policy_and_log(self, on_error, max_failures, warn_failures)
        # one image per item (or none, skipped): its position is its source's (but a failure budget's count)
        self._stateless = _budget_stateless(self)

    def _open(self, ctx: Pass) -> Iterator[Any]:
        return _images(self, ctx.open(self.datapipe), _count_run(self, ctx))

    def __len__(self) -> int:
        return source_len(self, self.datapipe)
