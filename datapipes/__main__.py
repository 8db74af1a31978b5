"""Command line: ``python -m datapipes demo`` runs an image-classification input pipeline.

The demo generates a small dataset (JPEG files in one folder per class, plus ``labels.csv`` mapping
each folder to its label) in a temporary folder, or takes yours with ``--data``, then runs::

    list_files("*.jpg", recursive) -> shuffle -> open_files("b") -> map(decode + resize, concurrency=N)
      -> batch -> collate -> pin_memory -> to_cuda            (the last two when there is a GPU)

with a progress bar, and prints the time to the first batch, the throughput and the per-stage profile
naming the bottleneck (``datapipes.profile``). The temporary folder is removed afterwards.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from typing import Any, Sequence

import numpy as np
from PIL import Image

_MASKS = ["*.jpg", "*.jpeg", "*.JPG", "*.JPEG"]


class DemoError(Exception):
    """A problem with the demo's input (a bad ``--data`` folder or labels file): printed, exit code 2."""


# -- the per-image work -----------------------------------------------------------------------------


class DecodeResize:
    """``(path, stream) -> (image, label)``: read the JPEG, decode it, resize it to ``size x size``.

    The image is a ``(3, size, size)`` uint8 array (channels first, as torchvision has them); the
    label is the index of the image's class folder (the first folder under ``root``). Runs on the
    concurrent map's worker threads: Pillow releases the GIL while it decodes and resizes, and the
    channels-first copy is made here rather than on the consumer's thread.

    >>> import io, os
    >>> buf = io.BytesIO(); Image.new("RGB", (500, 375), "red").save(buf, "JPEG"); _ = buf.seek(0)
    >>> image, label = DecodeResize(224, "data", {"cat": 0, "dog": 1})((os.path.join("data", "dog", "1.jpg"), buf))
    >>> image.shape, image.dtype, label, buf.closed
    ((3, 224, 224), dtype('uint8'), 1, True)
    """

    __slots__ = ("size", "prefix", "labels")

    def __init__(self, size: int, root: str, labels: dict[str, int]) -> None:
        self.size = size
        self.prefix = os.path.join(root, "")
        self.labels = labels

    def __call__(self, item: tuple[str, Any]) -> tuple[np.ndarray, int]:
        path, stream = item
        try:
            data = stream.read()
        finally:
            stream.close()
        try:
            img: Image.Image = Image.open(io.BytesIO(data))
            size = (self.size, self.size)
            img.draft("RGB", size)  # JPEG: decode at 1/2, 1/4 or 1/8 scale where that still covers `size`
            if img.mode != "RGB":
                img = img.convert("RGB")
            if img.size != size:
                img = img.resize(size, Image.Resampling.BILINEAR)
        except Exception as e:
            e.add_note(f"while decoding {path}")  # Pillow's message names a BytesIO, not the file
            raise
        chw = np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1))
        return chw, self.labels[path[len(self.prefix):].split(os.sep, 1)[0]]


class ProgressBar:
    """The last stage: counts images into a tqdm bar and notes when the first batch arrived."""

    def __init__(self, total: int, enabled: bool) -> None:
        from tqdm import tqdm

        class Bar(tqdm):  # type: ignore[misc, type-arg]
            monitor_interval = 0  # no tqdm monitor thread (it would outlive the demo's pass)

        self.bar = Bar(total=total, unit="img", desc="images", disable=not enabled, file=sys.stderr,
                       dynamic_ncols=True)
        self.first_at: float | None = None
        self.first: Any = None
        self.images = 0

    def __call__(self, batch: tuple[Any, Any]) -> tuple[Any, Any]:
        n = len(batch[1])
        if self.first_at is None:
            self.first_at = time.perf_counter()
            self.first = batch
        self.images += n
        self.bar.update(n)
        return batch

    def close(self) -> None:
        self.bar.close()


# -- the data ---------------------------------------------------------------------------------------


def _scan(root: str) -> tuple[list[str], list[str]]:
    """The JPEG files under ``root`` and their class folders (sorted), or a clear :class:`DemoError`."""
    from .iter import FileLister

    if not os.path.exists(root):
        raise DemoError(f"--data {root}: no such folder")
    if not os.path.isdir(root):
        raise DemoError(f"--data {root}: not a folder (expected a folder with one subfolder per class)")
    paths = list(FileLister(root, _MASKS, recursive=True))
    if not paths:
        raise DemoError(f"--data {root}: no JPEG files ({', '.join(_MASKS[:2])}) in it or its subfolders")
    prefix = os.path.join(root, "")
    loose = [p for p in paths if os.sep not in p[len(prefix):]]
    if loose:
        raise DemoError(
            f"--data {root}: {os.path.basename(loose[0])} (and {len(loose) - 1} more) lie directly in the folder; "
            f"the demo expects one subfolder per class ({os.path.join(root, '<class>', '<image>.jpg')})"
        )
    folders = sorted({p[len(prefix):].split(os.sep, 1)[0] for p in paths})
    return paths, folders


def _labels(root: str, labels_csv: str | None, folders: list[str]) -> tuple[dict[str, int], str]:
    """``{folder: label}`` and a line saying where the labels came from."""
    from ._demo_data import LABELS_CSV, read_labels

    if labels_csv is None and os.path.isfile(os.path.join(root, LABELS_CSV)):
        labels_csv = os.path.join(root, LABELS_CSV)
    if labels_csv is None:
        return {f: i for i, f in enumerate(folders)}, "from the class folder names, in sorted order (no labels.csv)"
    if not os.path.isfile(labels_csv):
        raise DemoError(f"--labels {labels_csv}: no such file")
    try:
        labels = read_labels(labels_csv)
    except ValueError as e:
        raise DemoError(str(e)) from None
    missing = [f for f in folders if f not in labels]
    if missing:
        raise DemoError(f"{labels_csv}: no label for the class folder(s) {', '.join(missing[:5])}")
    return labels, f"from {labels_csv} (read with open_files -> parse_csv_as_dict)"


def _device(name: str) -> Any:
    """The torch device batches go to, or a clear :class:`DemoError`."""
    import torch

    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as e:
        raise DemoError(f"--device {name}: not a torch device ({e})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DemoError(f"--device {name}: CUDA is not available here; use --device cpu (or auto)")
    return device


def build_pipe(root: str, labels: dict[str, int], *, count: int, size: int, batch_size: int,
               concurrency: int, device: Any, seed: int, limit: int | None = None) -> Any:
    """The demo's pipe over the JPEGs under ``root`` (``count`` of them), nothing run yet."""
    from .datapipe import IterDataPipe
    from .iter import FileLister

    files: IterDataPipe[str] = FileLister(root, _MASKS, recursive=True, length=count).shuffle()
    if limit is not None:
        files = files.header(limit)
    pipe: IterDataPipe[Any] = (
        files.open_files(mode="b")
        .map(DecodeResize(size, root, labels), concurrency=concurrency)
        .batch(batch_size)
        .collate()
    )
    if device.type == "cuda":
        pipe = pipe.pin_memory().to_cuda(device=device)
    elif device.type != "cpu":
        pipe = pipe.to_device(device)
    pipe.set_seed(seed)
    return pipe


# -- the command ------------------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m datapipes demo",
        description="Generate a small image-classification dataset (or use --data) and run an input pipeline "
                    "over it: list -> shuffle -> open -> decode + resize (concurrent) -> batch -> collate "
                    "-> pin_memory -> to_cuda (with a GPU); print throughput and the per-stage profile.",
    )
    parser.add_argument("--images", type=_positive, default=None,
                        help="images to generate (default 1000); with --data, use at most this many")
    parser.add_argument("--size", type=_positive, default=224, help="resize images to SIZE x SIZE (default 224)")
    parser.add_argument("--batch-size", type=_positive, default=32, help="images per batch (default 32)")
    parser.add_argument("--concurrency", type=_positive, default=None,
                        help="threads decoding images (default: the CPUs this process may use, 2 to 8)")
    parser.add_argument("--data", metavar="DIR", default=None,
                        help="use the JPEGs in DIR/<class>/*.jpg instead of generating a dataset")
    parser.add_argument("--labels", metavar="CSV", default=None,
                        help="a CSV with folder,label columns (default: DIR/labels.csv if there, else the "
                             "sorted folder names)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the generated data and the shuffle (default 0)")
    parser.add_argument("--device", default="auto",
                        help="where batches go: auto (a GPU if there is one), cpu, cuda, cuda:1, ... (default auto)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _run(args: argparse.Namespace, root: str, generated: bool) -> int:
    from ._runtime.tuning import usable_cpus
    from .profiling import profile

    device = _device(args.device)
    paths, folders = _scan(root)
    labels, source = _labels(root, args.labels, folders)
    count = len(paths)
    used = count if args.images is None or generated else min(count, args.images)
    names = {v: k for k, v in labels.items()}
    print(f"labels: {len(folders)} classes {source}")
    ranked = sorted(folders, key=lambda f: labels[f])
    print("  " + ", ".join(f"{labels[f]}={f}" for f in ranked[:10]) + (" ..." if len(ranked) > 10 else ""))
    # one decoding thread per CPU, 2 to 8 (2 on 2 CPUs, 8 on 16 or 128): a demo-sized dataset gains
    # nothing from more, and a 128-CPU host should not start 128 threads for it
    concurrency = args.concurrency or max(2, min(8, usable_cpus()))
    if device.type == "cuda":
        where = f"{device} ({_gpu_name(device)}): batches are pinned, then copied on a side stream"
    elif device.type == "cpu":
        where = "cpu (no GPU: batches stay in ordinary memory; pin_memory and to_cuda join the pipe on a GPU)"
    else:
        where = f"{device}"
    print(f"device: {where}")

    t_build = time.perf_counter()
    pipe = build_pipe(root, labels, count=count, size=args.size, batch_size=args.batch_size,
                      concurrency=concurrency, device=device, seed=args.seed,
                      limit=used if used < count else None)
    build_s = time.perf_counter() - t_build
    print("\nthe pipe (nothing has run yet):")
    from .graph import describe

    print(describe(pipe))
    print(f"len(pipe) = {len(pipe)} batches of up to {args.batch_size} (from the listing's length, at call time)\n")

    progress = ProgressBar(used, enabled=not args.no_progress)
    t_start = time.perf_counter()
    try:
        report = profile(pipe.map(progress), num_items=None, show=False)
        if device.type == "cuda":
            import torch

            torch.cuda.synchronize(device)
    finally:
        progress.close()
    elapsed = time.perf_counter() - t_start
    if progress.first is None:
        print("the pipe yielded no batch")
        return 1
    images, batch_labels = progress.first
    first_ms = 1000 * (build_s + (progress.first_at or t_start) - t_start)
    shown = batch_labels[:6].tolist()
    print(f"first batch: images {tuple(images.shape)} {images.dtype} on {images.device}, labels {shown} "
          f"({', '.join(names.get(x, '?') for x in shown)}) ...")
    print(f"time to first batch: {first_ms:.0f} ms (from building the pipe)")
    print(f"throughput: {progress.images / elapsed:,.0f} images/s ({progress.images:,} images in {report.items} "
          f"batches, {elapsed:.2f} s, {concurrency} decoding threads)")
    print("\nper-stage profile (datapipes.profile):")
    print(report.table())
    return 0


def _gpu_name(device: Any) -> str:
    import torch

    return str(torch.cuda.get_device_name(device))


def demo(argv: Sequence[str]) -> int:
    """``python -m datapipes demo [options]``: see ``--help``. Returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.data is not None:
            root = os.path.abspath(args.data)
            print(f"data: {root}")
            return _run(args, root, generated=False)
        from ._demo_data import make_dataset

        n = args.images if args.images is not None else 1000
        with tempfile.TemporaryDirectory(prefix="datapipes-demo-") as tmp:
            t = time.perf_counter()
            info = make_dataset(tmp, n, seed=args.seed)
            w, h = info.image_size
            print(f"generated {n:,} JPEGs ({w}x{h}, {len(info.classes)} classes) and labels.csv in {tmp} "
                  f"in {time.perf_counter() - t:.1f} s (removed at the end)")
            return _run(args, tmp, generated=True)
    except DemoError as e:
        print(f"python -m datapipes demo: error: {e}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m datapipes demo [--images N] [--size S] [--batch-size B] [--concurrency C] "
              "[--data DIR] [--labels CSV] [--seed S] [--device D] [--no-progress]\n"
              "       python -m datapipes demo --help   (what each option does)")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        return demo(rest)
    print(f"unknown command {command!r}; try: python -m datapipes demo", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
