"""Three pipelines written as torchdata 0.9 users wrote them, ported by changing imports only.

Each pipeline function below (``tabular_pipe``, ``TarImages``, ``NewsTopics``) is user code in the
style of torchdata's examples: its class and functional names, parameters and idioms. Only the
import lines point at ``datapipes`` (``from datapipes.iter import ...`` for ``from
torchdata.datapipes.iter import ...``; ``datapipes.utils.decoder`` for
``torch.utils.data.datapipes.utils.decoder``). The tests check the exact items each one yields, on
sample data that ``_example_data`` writes into ``tmp_path``.

1. Tabular (``tabular_pipe``): a folder of CSV files with header rows, ``FileLister(masks="*.csv")
   -> filter -> FileOpener(mode="rt") -> CSVParser(skip_lines=1, return_path=True) -> filter ->
   map -> shuffle -> sharding_filter -> batch -> collate``, read in-process and by
   ``torch.utils.data.DataLoader`` with two workers, ``shuffle=False`` and ``shuffle=True``.
   Follows torchdata's tutorial (docs/source/dp_tutorial.rst, "Working with DataLoader": CSV files
   of a label and features, rows made into numpy arrays, ``sharding_filter`` after ``shuffle``).
2. Images (``TarImages``): WebDataset-style tar shards (``key.jpg`` + ``key.cls``) and a CSV of
   annotations keyed by image name: ``FileLister(masks="*.tar") -> FileOpener(mode="b") ->
   load_from_tar -> routed_decode(basichandlers, imagehandler("pil")) -> webdataset``, joined with
   ``parse_csv(skip_lines=1)`` by ``IterKeyZipper(key_fn=, ref_key_fn=, keep_key=True,
   buffer_size=None, merge_fn=)``. Follows examples/vision/caltech101.py (images and annotations
   read as two pipes, decoded by ``RoutedDecoder`` with ``imagehandler("pil")``, paired by
   ``IterKeyZipper``), with the shard layout torchdata's ``webdataset`` reads.
3. Text (``NewsTopics``): a ``.tar.gz`` of CSV splits over a local HTTP server, cached on disk in
   two stages: ``IterableWrapper([url]).on_disk_cache(filepath_fn=, hash_dict=, hash_type="md5")
   .read_from_http().end_caching(mode="wb", same_filepath_fn=True)``, then ``on_disk_cache`` for the
   extracted split over ``FileOpener(mode="b").load_from_tar().filter(...)``, then
   ``FileOpener(encoding="utf-8").parse_csv().map(...)`` to ``(label, text)``. Follows
   examples/text/amazonreviewpolarity.py and imdb.py (``on_disk_cache`` with an md5
   ``hash_dict``, ``HttpReader``, ``end_caching(mode="wb", same_filepath_fn=True)``,
   ``load_from_tar``, ``parse_csv().map(...)``), with the second cache stage torchtext's datasets
   (AmazonReviewPolarity, AG_NEWS) added for the extracted file.
"""

import hashlib
import http.server
import os
import threading
from functools import partial

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

# torchdata: from torchdata.datapipes.iter import CSVParser, FileLister, FileOpener, IterableWrapper, IterKeyZipper
from datapipes.iter import CSVParser, FileLister, FileOpener, IterableWrapper, IterKeyZipper
# torch: from torch.utils.data.datapipes.utils.decoder import basichandlers, imagehandler
from datapipes.utils.decoder import basichandlers, imagehandler

from datapipes.testing import check_datapipe

from . import _example_data as data

# == 1. Tabular: CSV files, shuffled, sharded over DataLoader workers, batched and collated =========


def is_sample_file(path):
    return os.path.basename(path).startswith("sample_data")


def is_labelled(path_and_row):
    _, row = path_and_row
    return row[1] != "-1"


def to_sample(path_and_row):
    path, row = path_and_row
    return {
        "id": np.array(int(row[0]), np.int64),
        "label": np.array(row[1], np.int32),
        "data": np.array(row[2:], dtype=np.float64),
        "file": os.path.basename(path),
    }


def tabular_pipe(root_dir, batch_size=4):
    dp = FileLister(root_dir, masks="*.csv")
    dp = dp.filter(filter_fn=is_sample_file)
    dp = FileOpener(dp, mode="rt")
    dp = CSVParser(dp, delimiter=",", skip_lines=1, return_path=True)  # (path, row) without the header
    dp = dp.filter(is_labelled)
    dp = dp.map(to_sample)
    dp = dp.shuffle()  # DataLoader(shuffle=False) turns it off
    dp = dp.sharding_filter()  # after the shuffle: each worker reads its share of one shuffled order
    dp = dp.batch(batch_size)
    return dp.collate()


class TestTabular:
    @pytest.fixture
    def csv_root(self, tmp_path):
        root = tmp_path / "csv"
        expected = data.write_csv_files(root)  # 3 files of 10 rows, 24 of them labelled
        return root, expected

    def check_batch(self, batch, expected):
        """One collated batch: its types and dtypes, and every row as the files hold it."""
        assert set(batch) == {"id", "label", "data", "file"}
        ids = batch["id"]
        assert ids.dtype == torch.int64 and batch["label"].dtype == torch.int32
        assert batch["data"].dtype == torch.float64 and batch["data"].shape == (len(ids), 2)
        assert isinstance(batch["file"], list) and len(batch["file"]) == len(ids)
        for i, row_id in enumerate(ids.tolist()):
            label, x1, x2, name = expected[row_id]
            assert batch["label"][i].item() == label
            assert batch["data"][i].tolist() == [x1, x2]
            assert batch["file"][i] == name
        return ids.tolist()

    def test_in_process(self, csv_root):
        root, expected = csv_root
        datapipe = tabular_pipe(str(root))
        torch.manual_seed(0)
        batches = list(datapipe)
        assert [len(b["id"]) for b in batches] == [4] * 6
        ids = [i for b in batches for i in self.check_batch(b, expected)]
        assert sorted(ids) == sorted(expected) and ids != sorted(expected)  # all, once, shuffled
        torch.manual_seed(0)
        assert [b["id"].tolist() for b in datapipe] == [b["id"].tolist() for b in batches]  # as torch: seeded
        datapipe.set_seed(1)
        check_datapipe(datapipe.map(lambda b: b["id"].tolist()), ordered=True)

    def test_two_workers_shuffle_false_gives_the_files_order_sharded(self, csv_root):
        root, expected = csv_root
        dl = DataLoader(dataset=tabular_pipe(str(root)), batch_size=None, num_workers=2, shuffle=False)
        batches = list(dl)
        ids = [self.check_batch(b, expected) for b in batches]
        # No shuffle: worker w reads rows w, w+2, ... of the files' order; the loader alternates workers.
        in_order = sorted(expected)
        shards = [in_order[0::2], in_order[1::2]]
        per_worker = [[shard[k:k + 4] for k in range(0, 12, 4)] for shard in shards]
        assert ids == [per_worker[k % 2][k // 2] for k in range(6)]

    def test_two_workers_shuffle_true_gives_every_row_once(self, csv_root):
        root, expected = csv_root
        datapipe = tabular_pipe(str(root))
        dl = DataLoader(dataset=datapipe, batch_size=None, num_workers=2, shuffle=True)
        torch.manual_seed(3)
        first = [self.check_batch(b, expected) for b in dl]
        ids = [i for b in first for i in b]
        assert sorted(ids) == sorted(expected)  # every row exactly once across both workers
        assert ids != sorted(expected)
        assert [len(b) for b in first] == [4] * 6
        torch.manual_seed(3)
        assert [b["id"].tolist() for b in dl] == first  # torch.manual_seed reproduces the epoch
        second = [b["id"].tolist() for b in dl]  # the next epoch, reshuffled
        assert sorted(i for b in second for i in b) == sorted(expected) and second != first


# == 2. Images in tar shards, annotations in a CSV, joined by key ==================================

def image_name(sample):
    return os.path.basename(sample["__key__"]) + ".jpg"


def annotation_name(row):
    return row[0]


def collate_sample(sample, row):
    _, label, caption = row
    return {
        "image_path": sample["__key__"] + ".jpg",
        "image": sample[".jpg"],
        "cls": sample[".cls"],
        "label": label,
        "caption": caption,
    }


def TarImages(root):
    anns_dp = FileOpener([os.path.join(root, "annotations.csv")], mode="rt")
    anns_dp = anns_dp.parse_csv(skip_lines=1)

    images_dp = FileLister(root, masks="*.tar")
    images_dp = FileOpener(images_dp, mode="b")
    images_dp = images_dp.load_from_tar()
    images_dp = images_dp.routed_decode(basichandlers, imagehandler("pil"))
    images_dp = images_dp.webdataset()

    return IterKeyZipper(
        images_dp,
        anns_dp,
        key_fn=image_name,
        ref_key_fn=annotation_name,
        keep_key=True,
        buffer_size=None,
        merge_fn=collate_sample,
    )


class TestTarImages:
    def expected(self, root, samples):
        return [
            (name, {"image_path": os.path.join(str(root), shard, name), "cls": cls, "label": label, "caption": caption})
            for name, shard, _, cls, label, caption in samples
        ]

    def split(self, out):
        """The items with the image taken out of each, and the images."""
        rest = [(key, {k: v for k, v in sample.items() if k != "image"}) for key, sample in out]
        return rest, [sample["image"] for _, sample in out]

    def test_items_in_shard_order_with_their_annotations(self, tmp_path):
        root = tmp_path / "shards"
        samples = data.write_image_shards(root)
        out = list(TarImages(str(root)))
        rest, images = self.split(out)
        assert rest == self.expected(root, samples)
        assert [label for _, _, _, _, label, _ in samples] == [data.CLASSES[s["cls"]] for _, s in rest]
        for image, (_, _, color, *_) in zip(images, samples):
            assert isinstance(image, Image.Image) and (image.mode, image.size) == ("RGB", (8, 8))
            pixels = np.asarray(image).reshape(-1, 3).astype(int)
            assert np.abs(pixels - color).max() <= 3  # one colour, through JPEG
        # A second pass, a pickled copy, a resumed pass: the same items (PIL images compare by pixels).
        check_datapipe(TarImages(str(root)), expected=out)

    def test_a_missing_annotation_raises_torchdatas_error(self, tmp_path):
        root = tmp_path / "shards"
        data.write_image_shards(root)
        lines = (root / "annotations.csv").read_text().splitlines(keepends=True)
        (root / "annotations.csv").write_text("".join(line for line in lines if not line.startswith("img_004")))
        with pytest.raises(BufferError, match="No matching key can be found from reference DataPipe"):
            list(TarImages(str(root)))


# == 3. Text over HTTP, cached on disk in two stages =================================================

ARCHIVE = "news_csv.tar.gz"


def archive_path(root, url):
    return os.path.join(root, os.path.basename(url))


def split_path(root, split, _archive=None):
    return os.path.join(root, "news_csv", f"{split}.csv")


def is_split_member(split, member):
    path, _ = member
    return path.endswith(f"/{split}.csv")


def label_and_text(row):
    label, text = row
    return int(label), text


def NewsTopics(root, split, url, md5):
    archive_dp = IterableWrapper([url]).on_disk_cache(
        filepath_fn=partial(archive_path, root),
        hash_dict={archive_path(root, url): md5},
        hash_type="md5",
    )
    archive_dp = archive_dp.read_from_http().end_caching(mode="wb", same_filepath_fn=True)

    # A second cache: the split's CSV, extracted once from the cached archive.
    split_dp = archive_dp.on_disk_cache(filepath_fn=partial(split_path, root, split))
    split_dp = FileOpener(split_dp, mode="b").load_from_tar()
    split_dp = split_dp.filter(partial(is_split_member, split))
    split_dp = split_dp.end_caching(mode="wb", same_filepath_fn=True)

    return FileOpener(split_dp, encoding="utf-8").parse_csv().map(fn=label_and_text)


class _FileHandler(http.server.BaseHTTPRequestHandler):
    """Serves ``files`` (path -> bytes) and records every request as ``"METHOD /path"``."""

    files: dict = {}
    requests: list = []

    def _reply(self, body):
        data = self.files.get(self.path)
        self.requests.append(f"{self.command} {self.path}")
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server's naming
        self._reply(True)

    def do_HEAD(self):  # noqa: N802
        self._reply(False)

    def log_message(self, *args):
        pass


@pytest.fixture
def news_server():
    """A local HTTP server (127.0.0.1, a free port) serving ``/news_csv.tar.gz``; shut down after the test."""
    archive = data.news_archive()
    handler = type("Handler", (_FileHandler,), {"files": {"/" + ARCHIVE: archive}, "requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield {
            "url": f"http://127.0.0.1:{server.server_address[1]}/{ARCHIVE}",
            "md5": hashlib.md5(archive).hexdigest(),
            "archive": archive,
            "files": handler.files,
            "requests": handler.requests,
        }
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def downloads(requests):
    return [r for r in requests if r.startswith("GET ")]


class TestNewsTopicsOverHttp:
    def test_first_pass_downloads_later_passes_read_the_cache(self, tmp_path, news_server):
        root, url, md5 = str(tmp_path / "cache"), news_server["url"], news_server["md5"]
        requests = news_server["requests"]
        assert list(NewsTopics(root, "train", url, md5)) == data.TEXT_SPLITS["train"]
        assert downloads(requests) == ["GET /" + ARCHIVE]  # downloaded once
        with open(os.path.join(root, ARCHIVE), "rb") as f:
            assert f.read() == news_server["archive"]
        assert sorted(os.listdir(os.path.join(root, "news_csv"))) == ["train.csv"]  # only this split extracted
        seen = len(requests)
        # Later passes, and a pipeline built anew (a new run of the program): from the cache, no request.
        dp = NewsTopics(root, "train", url, md5)
        assert list(dp) == list(dp) == data.TEXT_SPLITS["train"]
        # Another split: extracted from the archive already downloaded.
        assert list(NewsTopics(root, "test", url, md5)) == data.TEXT_SPLITS["test"]
        assert sorted(os.listdir(os.path.join(root, "news_csv"))) == ["test.csv", "train.csv"]
        assert len(requests) == seen

    def test_a_download_is_one_request(self, tmp_path, news_server):
        list(NewsTopics(str(tmp_path / "cache"), "train", news_server["url"], news_server["md5"]))
        assert news_server["requests"] == ["GET /" + ARCHIVE]

    def test_an_extracted_file_removed_is_extracted_again_without_a_download(self, tmp_path, news_server):
        root, url, md5 = str(tmp_path / "cache"), news_server["url"], news_server["md5"]
        list(NewsTopics(root, "train", url, md5))
        seen = len(news_server["requests"])
        os.remove(split_path(root, "train"))
        assert list(NewsTopics(root, "train", url, md5)) == data.TEXT_SPLITS["train"]
        assert len(news_server["requests"]) == seen

    def test_a_corrupted_download_fails_the_hash_and_is_downloaded_again(self, tmp_path, news_server):
        # As torchdata: a cached file whose md5 is not hash_dict's does not count as cached.
        root, url, md5 = str(tmp_path / "cache"), news_server["url"], news_server["md5"]
        list(NewsTopics(root, "train", url, md5))
        cached = archive_path(root, url)
        with open(cached, "r+b") as f:
            f.seek(100)
            f.write(b"\x00garbage\x00")
        os.remove(split_path(root, "train"))  # so the pass reads the archive again too
        assert list(NewsTopics(root, "train", url, md5)) == data.TEXT_SPLITS["train"]
        assert downloads(news_server["requests"]) == ["GET /" + ARCHIVE] * 2
        with open(cached, "rb") as f:
            assert f.read() == news_server["archive"]
        seen = len(news_server["requests"])
        assert list(NewsTopics(root, "train", url, md5)) == data.TEXT_SPLITS["train"]
        assert len(news_server["requests"]) == seen

    def test_a_download_that_does_not_match_the_hash_raises_and_is_not_kept(self, tmp_path, news_server):
        # As torchdata: end_caching checks what it writes against hash_dict (RuntimeError).
        root, url = str(tmp_path / "cache"), news_server["url"]
        news_server["files"]["/" + ARCHIVE] = b"a page that is not the archive"
        with pytest.raises(RuntimeError, match="does not match"):
            list(NewsTopics(root, "train", url, news_server["md5"]))
        assert not os.path.exists(archive_path(root, url))
        assert downloads(news_server["requests"]) == ["GET /" + ARCHIVE]
