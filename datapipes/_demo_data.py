"""A small generated image-classification dataset, for the demo and the end-to-end benchmark.

:func:`make_dataset` writes JPEG files in one folder per class plus ``labels.csv``, the table that
maps each class folder to its label index (as ImageNet's synset table does)::

    root/
      labels.csv            folder,label,description
      circle/00000.jpg      ~500x375 RGB JPEGs
      square/00001.jpg
      ...

Each image is a coloured gradient in a random direction, film-grain noise and one shape whose kind
and colour depend on the class (a circle, a square, a triangle, ...), placed and sized at random. The
bytes depend only on ``seed`` and the image's index (not on the number of threads writing them), so
two runs with the same seed write identical files. The work is in Pillow's and numpy's C code, which
releases the GIL, so a few threads write ~1,000 images in about a second.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     info = make_dataset(d, 20, seed=0)
...     labels = read_labels(info.labels_csv)
...     info.num_images, info.classes[:3], labels["circle"], labels["dots"]
(20, ('circle', 'square', 'triangle'), 0, 9)
"""

from __future__ import annotations

import csv
import math
import os
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageOps

from ._runtime.tuning import usable_cpus

__all__ = ["CLASSES", "DatasetInfo", "make_dataset", "read_labels"]

#: The classes: (folder name, what the images show). The label index is the position here.
CLASSES: tuple[tuple[str, str], ...] = (
    ("circle", "a filled red circle"),
    ("square", "a filled green square"),
    ("triangle", "a filled blue triangle"),
    ("diamond", "a filled yellow diamond"),
    ("ring", "a magenta ring"),
    ("cross", "a cyan cross"),
    ("stripes", "orange diagonal stripes"),
    ("checker", "a purple checkerboard patch"),
    ("star", "a white five-pointed star"),
    ("dots", "a grid of black dots"),
)

_COLOURS = (
    (220, 40, 40), (40, 180, 60), (40, 70, 220), (235, 210, 40), (210, 50, 200),
    (40, 200, 210), (245, 140, 30), (120, 50, 170), (250, 250, 250), (15, 15, 15),
)

LABELS_CSV = "labels.csv"

_RAMP = Image.linear_gradient("L")


@dataclass(frozen=True)
class DatasetInfo:
    """What :func:`make_dataset` wrote.

    Attributes:
        root: the dataset folder.
        labels_csv: the path of ``labels.csv`` (``folder,label,description``).
        classes: the class folder names, in label order.
        num_images: how many JPEG files were written.
        image_size: ``(width, height)`` of every image.
        paths: the image paths, in index order.
    """

    root: str
    labels_csv: str
    classes: tuple[str, ...]
    num_images: int
    image_size: tuple[int, int]
    paths: tuple[str, ...]


def _grain(seed: int, width: int, height: int) -> Image.Image:
    """A grey RGB noise texture twice the image size; each image crops its own window of it."""
    rng = np.random.default_rng(seed)
    grey = rng.integers(0, 256, (2 * height, 2 * width, 1), dtype=np.uint8)
    return Image.fromarray(np.repeat(grey, 3, axis=2), "RGB")


def _jitter(colour: tuple[int, int, int], rnd: random.Random) -> tuple[int, int, int]:
    r, g, b = (min(255, max(0, c + rnd.randint(-25, 25))) for c in colour)
    return (r, g, b)


def _draw_shape(draw: ImageDraw.ImageDraw, kind: int, box: tuple[int, int, int, int],
                colour: tuple[int, int, int], rnd: random.Random) -> None:
    x0, y0, x1, y1 = box
    cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
    r = (x1 - x0) // 2
    name = CLASSES[kind][0]
    if name == "circle":
        draw.ellipse(box, fill=colour)
    elif name == "square":
        draw.rectangle(box, fill=colour)
    elif name == "triangle":
        draw.polygon([(cx, y0), (x1, y1), (x0, y1)], fill=colour)
    elif name == "diamond":
        draw.polygon([(cx, y0), (x1, cy), (cx, y1), (x0, cy)], fill=colour)
    elif name == "ring":
        draw.ellipse(box, outline=colour, width=max(4, r // 4))
    elif name == "cross":
        w = max(6, r // 3)
        draw.rectangle((cx - w, y0, cx + w, y1), fill=colour)
        draw.rectangle((x0, cy - w, x1, cy + w), fill=colour)
    elif name == "stripes":
        w = max(4, r // 5)
        for k in range(-2 * r, 2 * r, 3 * w):
            draw.line([(x0 + k, y1), (x0 + k + 2 * r, y0)], fill=colour, width=w)
    elif name == "checker":
        step = max(8, r // 3)
        for i, x in enumerate(range(x0, x1, step)):
            for j, y in enumerate(range(y0, y1, step)):
                if (i + j) % 2 == 0:
                    draw.rectangle((x, y, x + step - 1, y + step - 1), fill=colour)
    elif name == "star":
        turn = rnd.uniform(0, 2 * math.pi)
        points = []
        for k in range(10):
            rad = r if k % 2 == 0 else r * 0.4
            a = turn + k * math.pi / 5
            points.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
        draw.polygon(points, fill=colour)
    else:  # dots
        step = max(10, r // 2)
        dot = max(3, step // 4)
        for x in range(x0, x1, step):
            for y in range(y0, y1, step):
                draw.ellipse((x - dot, y - dot, x + dot, y + dot), fill=colour)


def _render(index: int, label: int, seed: int, size: tuple[int, int], grain: Image.Image) -> Image.Image:
    """Image ``index`` of class ``label``: a function of ``(seed, index)`` only."""
    rnd = random.Random(f"{seed}:{index}")
    width, height = size
    # Pillow's 256x256 ramp, turned by a random angle and scaled onto the image in one affine map
    # (output pixel -> ramp pixel); the scale keeps the turned image inside the ramp.
    turn = rnd.uniform(0, 2 * math.pi)
    scale = 255 / math.hypot(width, height)
    cos, sin = scale * math.cos(turn), scale * math.sin(turn)
    cx, cy = width / 2, height / 2
    affine = (cos, -sin, 128 - cos * cx + sin * cy, sin, cos, 128 - sin * cx - cos * cy)
    gradient = _RAMP.transform(size, Image.Transform.AFFINE, affine, Image.Resampling.NEAREST)
    dark = tuple(rnd.randint(0, 110) for _ in range(3))
    light = tuple(rnd.randint(120, 255) for _ in range(3))
    img = ImageOps.colorize(gradient, dark, light)
    gx, gy = rnd.randrange(width), rnd.randrange(height)
    img = Image.blend(img, grain.crop((gx, gy, gx + width, gy + height)), rnd.uniform(0.08, 0.2))
    side = rnd.randint(min(size) // 4, min(size) * 2 // 3)
    x0, y0 = rnd.randrange(width - side), rnd.randrange(height - side)
    _draw_shape(ImageDraw.Draw(img), label, (x0, y0, x0 + side, y0 + side), _jitter(_COLOURS[label], rnd), rnd)
    return img


def _check(num_images: object, size: object, num_classes: object, quality: object, threads: object) -> None:
    for name, value, low in (("num_images", num_images, 0), ("num_classes", num_classes, 1),
                             ("quality", quality, 1), ("threads", threads, 1)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"make_dataset: {name} must be an int, got {type(value).__name__}")
        if value < low:
            raise ValueError(f"make_dataset: {name} must be >= {low}, got {value!r}")
    if not isinstance(num_classes, int) or num_classes > len(CLASSES):
        raise ValueError(f"make_dataset: num_classes must be at most {len(CLASSES)}, got {num_classes!r}")
    if not isinstance(quality, int) or quality > 95:
        raise ValueError(f"make_dataset: quality must be in 1..95, got {quality!r}")
    if (
        not isinstance(size, (tuple, list))
        or len(size) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 32 for v in size)
    ):
        raise ValueError(f"make_dataset: size must be (width, height), two ints >= 32, got {size!r}")


def make_dataset(
    root: str | os.PathLike[str],
    num_images: int = 1000,
    *,
    seed: int = 0,
    size: Sequence[int] = (500, 375),
    num_classes: int = len(CLASSES),
    quality: int = 90,
    threads: int | None = None,
) -> DatasetInfo:
    """Write ``num_images`` JPEGs in class folders under ``root``, plus ``root/labels.csv``.

    Args:
        root: the folder to write into (created if missing).
        num_images: how many images; image ``i`` belongs to class ``i % num_classes``.
        seed: the seed the content depends on.
        size: ``(width, height)`` of the images.
        num_classes: how many classes, at most ``len(CLASSES)``.
        quality: the JPEG quality.
        threads: how many threads write images (default: the CPUs this process may use, at most 8:
            1 on 1 CPU, 2 on 2, 8 on 16 or 128: Pillow's encoder releases the GIL, and a demo-sized
            dataset gains nothing from more).

    Returns:
        A :class:`DatasetInfo`.

    Raises:
        TypeError, ValueError: a bad argument (the message names it).
    """
    _check(num_images, size, num_classes, quality, 1 if threads is None else threads)
    width, height = int(size[0]), int(size[1])
    root = os.fspath(root)
    classes = tuple(name for name, _ in CLASSES[:num_classes])
    for name in classes:
        os.makedirs(os.path.join(root, name), exist_ok=True)
    labels_csv = os.path.join(root, LABELS_CSV)
    with open(labels_csv, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["folder", "label", "description"])
        for label, (name, description) in enumerate(CLASSES[:num_classes]):
            out.writerow([name, label, description])
    grain = _grain(seed, width, height)
    paths = tuple(os.path.join(root, classes[i % num_classes], f"{i:05d}.jpg") for i in range(num_images))

    def write(i: int) -> None:
        _render(i, i % num_classes, seed, (width, height), grain).save(paths[i], "JPEG", quality=quality)

    workers = threads if threads is not None else min(8, usable_cpus())
    if workers == 1 or num_images < 8:
        for i in range(num_images):
            write(i)
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="datapipes demo data") as ex:
            for _ in ex.map(write, range(num_images)):
                pass
    return DatasetInfo(root, labels_csv, classes, num_images, (width, height), paths)


def read_labels(labels_csv: str | os.PathLike[str]) -> dict[str, int]:
    """``{folder: label}`` from a labels CSV with ``folder`` and ``label`` columns, read through the
    pipes themselves (``open_files`` -> ``parse_csv_as_dict``).

    Raises:
        ValueError: the CSV lacks a ``folder`` or ``label`` column, a label is not an integer, or a
        folder is listed twice (the message names the file and the row).
    """
    from .iter import IterableWrapper

    labels: dict[str, int] = {}
    rows = IterableWrapper([os.fspath(labels_csv)]).open_files(mode="b").parse_csv_as_dict()
    for n, row in enumerate(rows, start=1):
        if "folder" not in row or "label" not in row:
            raise ValueError(f"{labels_csv}: needs 'folder' and 'label' columns, found {sorted(row)}")
        try:
            label = int(row["label"])
        except ValueError:
            raise ValueError(f"{labels_csv}, data row {n}: label must be an integer, got {row['label']!r}") from None
        if row["folder"] in labels:
            raise ValueError(f"{labels_csv}, data row {n}: folder {row['folder']!r} is listed twice")
        labels[row["folder"]] = label
    return labels
