"""Sample data for tests/compat/test_examples.py, written into a test's ``tmp_path``: CSV files with
header rows, WebDataset-style tar shards of tiny JPEGs with a CSV of annotations, and a ``.tar.gz``
of CSV splits to serve over HTTP. Each writer returns what the pipelines are expected to yield."""

import csv
import io
import tarfile

from PIL import Image

# -- 1. tabular: a folder of CSV files -------------------------------------------------------------

CSV_HEADER = ["id", "label", "x1", "x2"]


def write_csv_files(root, num_files=3, rows_per_file=10):
    """``root/sample_data<k>.csv`` with a header row and ``rows_per_file`` rows each, plus a file
    the pipeline's mask leaves out. Every 5th row is unlabelled (label ``-1``), for the filter.

    Returns ``{id: (label, x1, x2, file name)}`` for the labelled rows."""
    root.mkdir(parents=True, exist_ok=True)
    expected = {}
    for k in range(num_files):
        name = f"sample_data{k}.csv"
        with open(root / name, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(CSV_HEADER)
            for j in range(rows_per_file):
                row_id = k * rows_per_file + j
                label = -1 if row_id % 5 == 4 else row_id % 3
                x1, x2 = row_id / 4, -row_id * 0.5
                writer.writerow([row_id, label, x1, x2])
                if label != -1:
                    expected[row_id] = (label, x1, x2, name)
    (root / "notes.txt").write_text("not a CSV file\n")
    return expected


# -- 2. images in tar shards, labels in a CSV ------------------------------------------------------

CLASSES = ["cat", "dog", "owl"]


def jpeg_bytes(color, size=(8, 8)):
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def _add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_image_shards(root, num_shards=2, per_shard=3):
    """``root/shard-00000k.tar`` holding ``img_NNN.jpg`` (an 8x8 JPEG of one colour) and
    ``img_NNN.cls`` (its class index) per sample, and ``root/annotations.csv`` (``image,label,
    caption``), keyed by the image's file name, in an order unlike the shards' and with a row for an
    image no shard holds.

    Returns the samples in shard order: ``[(image name, shard name, colour, class index, label,
    caption)]``."""
    root.mkdir(parents=True, exist_ok=True)
    samples = []
    for s in range(num_shards):
        shard = f"shard-{s:06d}.tar"
        with tarfile.open(root / shard, "w") as tar:
            for j in range(per_shard):
                n = s * per_shard + j
                key = f"img_{n:03d}"
                color = (40 * n % 256, 255 - 30 * n, 100 + 20 * n)
                cls = n % len(CLASSES)
                _add(tar, f"{key}.jpg", jpeg_bytes(color))
                _add(tar, f"{key}.cls", str(cls).encode())
                samples.append((f"{key}.jpg", shard, color, cls, CLASSES[cls], f"a {CLASSES[cls]}, picture {n}"))
    rows = [(name, label, caption) for name, _, _, _, label, caption in samples]
    rows = rows[1::2] + rows[0::2]  # not the shards' order: the zipper buffers
    rows.insert(2, ("img_999.jpg", "owl", "no shard holds this one"))
    with open(root / "annotations.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "label", "caption"])
        writer.writerows(rows)
    return samples


# -- 3. a compressed archive of CSV splits, served over HTTP ---------------------------------------

TEXT_SPLITS = {
    "train": [
        (1, "Stocks rally as markets open"),
        (2, "Local team wins the cup, again"),
        (3, 'New phone has a "better" camera'),
        (1, "Central bank holds rates"),
    ],
    "test": [
        (2, "Marathon record falls"),
        (3, "Chip makers, big and small, report growth"),
    ],
}


def news_archive():
    """The bytes of ``news_csv.tar.gz``: ``news_csv/<split>.csv`` (rows ``label,text``, no header)
    and a ``news_csv/readme.txt``, as torchtext's downloads were laid out."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        _add(tar, "news_csv/readme.txt", b"Topics: 1 business, 2 sports, 3 technology\n")
        for split, rows in TEXT_SPLITS.items():
            text = io.StringIO()
            csv.writer(text).writerows(rows)
            _add(tar, f"news_csv/{split}.csv", text.getvalue().encode())
    return buf.getvalue()
