"""``python -m datapipes demo``: the generated dataset, the image pipeline, the command and its errors."""

import collections
import csv
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from datapipes import _demo_data as demo_data
from datapipes.__main__ import DecodeResize, build_pipe, main
from datapipes.testing import check_datapipe

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = ["--batch-size", "8", "--size", "32", "--concurrency", "2", "--no-progress"]


def run_demo(capsys, *args):
    rc = main(["demo", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo-data")
    return demo_data.make_dataset(root, 24, seed=3, size=(96, 72))


def files_under(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


class TestMakeDataset:
    def test_layout_and_labels_csv(self, dataset):
        assert dataset.num_images == 24 and len(dataset.paths) == 24
        assert dataset.classes == tuple(name for name, _ in demo_data.CLASSES)
        counts = collections.Counter(os.path.basename(os.path.dirname(p)) for p in dataset.paths)
        assert counts == {name: 3 if i < 4 else 2 for i, name in enumerate(dataset.classes)}
        with open(dataset.labels_csv, newline="") as f:
            rows = list(csv.DictReader(f))
        assert [r["folder"] for r in rows] == list(dataset.classes)
        assert [int(r["label"]) for r in rows] == list(range(10))
        assert demo_data.read_labels(dataset.labels_csv) == {c: i for i, c in enumerate(dataset.classes)}

    def test_images_are_jpegs_of_the_size(self, dataset):
        with Image.open(dataset.paths[0]) as img:
            assert (img.format, img.mode, img.size) == ("JPEG", "RGB", (96, 72))

    def test_same_seed_same_bytes_whatever_the_threads(self, tmp_path):
        a = demo_data.make_dataset(tmp_path / "a", 6, seed=1, size=(64, 48), threads=1)
        b = demo_data.make_dataset(tmp_path / "b", 6, seed=1, size=(64, 48), threads=3)
        c = demo_data.make_dataset(tmp_path / "c", 6, seed=2, size=(64, 48), threads=1)
        read = lambda info: [open(p, "rb").read() for p in info.paths]  # noqa: E731
        assert read(a) == read(b)
        assert read(a) != read(c)

    def test_classes_differ_in_content(self, tmp_path):
        info = demo_data.make_dataset(tmp_path, 10, seed=0, size=(128, 96))
        arrays = [np.asarray(Image.open(p), dtype=np.int16) for p in info.paths]
        assert all(np.abs(arrays[i] - arrays[i + 1]).mean() > 5 for i in range(9))

    def test_zero_images_and_fewer_classes(self, tmp_path):
        info = demo_data.make_dataset(tmp_path, 0, num_classes=3)
        assert info.num_images == 0 and info.classes == ("circle", "square", "triangle")
        assert files_under(tmp_path) == ["labels.csv"]
        assert sorted(os.listdir(tmp_path)) == ["circle", "labels.csv", "square", "triangle"]

    @pytest.mark.parametrize("kwargs, err, match", [
        ({"num_images": -1}, ValueError, "num_images must be >= 0"),
        ({"num_images": 2.0}, TypeError, "num_images must be an int"),
        ({"num_classes": 11}, ValueError, "num_classes must be at most 10"),
        ({"num_classes": 0}, ValueError, "num_classes must be >= 1"),
        ({"quality": 100}, ValueError, "quality must be in 1..95"),
        ({"threads": 0}, ValueError, "threads must be >= 1"),
        ({"size": (500,)}, ValueError, r"size must be \(width, height\)"),
        ({"size": (16, 16)}, ValueError, "two ints >= 32"),
    ])
    def test_bad_arguments(self, tmp_path, kwargs, err, match):
        with pytest.raises(err, match=match):
            demo_data.make_dataset(tmp_path, **{"num_images": 1, **kwargs})


class TestReadLabels:
    @pytest.mark.parametrize("text, match", [
        ("name,label\na,0\n", "needs 'folder' and 'label' columns"),
        ("folder,label\na,zero\n", "data row 1: label must be an integer, got 'zero'"),
        ("folder,label\na,0\nb,1\na,2\n", "data row 3: folder 'a' is listed twice"),
    ])
    def test_bad_csv(self, tmp_path, text, match):
        path = tmp_path / "labels.csv"
        path.write_text(text)
        with pytest.raises(ValueError, match=match):
            demo_data.read_labels(path)

    def test_extra_columns_and_order(self, tmp_path):
        path = tmp_path / "labels.csv"
        path.write_text("label,folder,note\n7,dog,x\n3,cat,y\n")
        assert demo_data.read_labels(path) == {"dog": 7, "cat": 3}


class TestDecodeResize:
    def test_reads_closes_resizes_and_labels(self, dataset):
        fn = DecodeResize(40, str(dataset.root), {c: 10 + i for i, c in enumerate(dataset.classes)})
        path = dataset.paths[1]  # class 1: square
        stream = open(path, "rb")
        image, label = fn((path, stream))
        assert stream.closed
        assert image.shape == (3, 40, 40) and image.dtype == np.uint8 and image.flags.c_contiguous
        assert label == 11
        want = np.asarray(Image.open(path).convert("RGB").resize((40, 40), Image.Resampling.BILINEAR))
        assert np.array_equal(image, want.transpose(2, 0, 1))

    def test_grey_jpeg_becomes_rgb(self, tmp_path):
        (tmp_path / "cat").mkdir()
        path = str(tmp_path / "cat" / "g.jpg")
        Image.new("L", (50, 40), 90).save(path)
        image, label = DecodeResize(16, str(tmp_path), {"cat": 0})((path, open(path, "rb")))
        assert image.shape == (3, 16, 16) and label == 0

    def test_corrupt_file_raises_and_closes(self, tmp_path):
        (tmp_path / "cat").mkdir()
        path = tmp_path / "cat" / "bad.jpg"
        path.write_bytes(b"not a jpeg")
        stream = open(path, "rb")
        with pytest.raises(OSError) as info:
            DecodeResize(16, str(tmp_path), {"cat": 0})((str(path), stream))
        assert stream.closed
        assert f"while decoding {path}" in info.value.__notes__


class TestBuildPipe:
    def build(self, dataset, **kw):
        labels = {c: i for i, c in enumerate(dataset.classes)}
        args = dict(count=dataset.num_images, size=16, batch_size=5, concurrency=2,
                    device=torch.device("cpu"), seed=0)
        args.update(kw)
        return build_pipe(str(dataset.root), labels, **args)

    def test_every_image_once_with_its_label(self, dataset):
        pipe = self.build(dataset)
        batches = list(pipe)
        assert len(pipe) == len(batches) == 5
        assert [tuple(b[0].shape) for b in batches] == [(5, 3, 16, 16)] * 4 + [(4, 3, 16, 16)]
        assert all(b[0].dtype == torch.uint8 and b[1].dtype == torch.int64 for b in batches)
        labels = torch.cat([b[1] for b in batches]).tolist()
        assert collections.Counter(labels) == collections.Counter(i % 10 for i in range(24))

    def test_seed_decides_the_order(self, dataset):
        order = lambda seed: torch.cat([b[1] for b in self.build(dataset, seed=seed)]).tolist()  # noqa: E731
        assert order(0) == order(0)
        assert order(0) != order(1)

    def test_limit(self, dataset):
        pipe = self.build(dataset, limit=7)
        assert len(pipe) == 2
        assert sum(len(b[1]) for b in pipe) == 7

    def test_contract(self, dataset, no_thread_leak):
        check_datapipe(self.build(dataset))

    def test_cpu_pipe_has_no_device_stages(self, dataset):
        assert "Collator" in repr(self.build(dataset)).rsplit("->", 1)[-1]


class TestDemoCommand:
    def test_generated_run(self, capsys, no_thread_leak):
        rc, out, _ = run_demo(capsys, "--images", "40", *FAST)
        assert rc == 0, out
        assert "generated 40 JPEGs (500x375, 10 classes)" in out
        assert "labels: 10 classes from" in out and "parse_csv_as_dict" in out
        # --device auto: batches go to the current CUDA device where there is one, else stay on the CPU
        where = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
        assert f"first batch: images (8, 3, 32, 32) torch.uint8 on {where}" in out
        assert re.search(r"time to first batch: \d+ ms", out)
        assert re.search(r"throughput: [\d,]+ images/s \(40 images in 5 batches", out)
        assert "Mapper(DecodeResize)" in out
        assert re.search(r"bottleneck: \S", out)
        tmp = re.search(r"labels.csv in (\S+) in", out).group(1)
        assert not os.path.exists(tmp), "the generated dataset must be removed"

    def test_progress_bar_goes_to_stderr(self, capsys):
        rc, out, err = run_demo(capsys, "--images", "16", "--batch-size", "8", "--size", "16")
        assert rc == 0
        assert "16/16" in err and "img" in err
        assert "16/16" not in out

    def test_data_folder(self, capsys, dataset):
        before = files_under(dataset.root)
        rc, out, _ = run_demo(capsys, "--data", str(dataset.root), *FAST)
        assert rc == 0, out
        assert f"data: {dataset.root}" in out
        assert "(24 images in 3 batches" in out
        assert "bottleneck:" in out
        assert files_under(dataset.root) == before, "a --data folder is read, never changed"

    def test_data_folder_with_images_limit(self, capsys, dataset):
        rc, out, _ = run_demo(capsys, "--data", str(dataset.root), "--images", "10", *FAST)
        assert rc == 0
        assert "(10 images in 2 batches" in out

    def test_data_folder_without_labels_csv(self, capsys, tmp_path):
        for name in ("zebra", "ant"):
            (tmp_path / name / "deeper").mkdir(parents=True)
            Image.new("RGB", (40, 30), "blue").save(tmp_path / name / "deeper" / "x.JPEG")
        rc, out, _ = run_demo(capsys, "--data", str(tmp_path), *FAST)
        assert rc == 0, out
        assert "labels: 2 classes from the class folder names" in out
        assert "0=ant, 1=zebra" in out

    def test_labels_option(self, capsys, dataset, tmp_path):
        csv_path = tmp_path / "mine.csv"
        csv_path.write_text("folder,label\n" + "".join(f"{c},{100 + i}\n" for i, c in enumerate(dataset.classes)))
        rc, out, _ = run_demo(capsys, "--data", str(dataset.root), "--labels", str(csv_path), *FAST)
        assert rc == 0
        assert f"from {csv_path}" in out and "100=circle" in out

    @pytest.mark.parametrize("case, match", [
        ("missing", "no such folder"),
        ("file", "not a folder"),
        ("empty", r"no JPEG files \(\*\.jpg, \*\.jpeg\) in it or its subfolders"),
        ("loose", "lie directly in the folder; the demo expects one subfolder per class"),
        ("unlabelled", "no label for the class folder"),
        ("bad-csv", "label must be an integer"),
    ])
    def test_bad_data_folder(self, capsys, tmp_path, case, match):
        data = tmp_path / "data"
        if case == "file":
            data.write_text("x")
        elif case != "missing":
            data.mkdir()
            (data / "notes.txt").write_text("no images here")
        if case == "loose":
            Image.new("RGB", (8, 8)).save(data / "a.jpg")
        if case in ("unlabelled", "bad-csv"):
            (data / "cat").mkdir()
            Image.new("RGB", (8, 8)).save(data / "cat" / "a.jpg")
            (data / "labels.csv").write_text("folder,label\ndog,0\n" if case == "unlabelled" else "folder,label\ncat,x\n")
        rc, out, err = run_demo(capsys, "--data", str(data), *FAST)
        assert rc == 2
        assert err.startswith("python -m datapipes demo: error: ")
        assert re.search(match, err), err
        assert "Traceback" not in err

    def test_corrupt_image_names_the_file(self, capsys, tmp_path):
        (tmp_path / "cat").mkdir()
        Image.new("RGB", (40, 30)).save(tmp_path / "cat" / "a.jpg")
        (tmp_path / "cat" / "b.jpg").write_bytes(b"\xff\xd8 truncated")
        with pytest.raises(OSError) as info:
            main(["demo", "--data", str(tmp_path), *FAST])
        notes = "\n".join(info.value.__notes__)
        assert str(tmp_path / "cat" / "b.jpg") in notes and "Mapper(DecodeResize)" in notes

    def test_missing_labels_file(self, capsys, dataset, tmp_path):
        rc, _, err = run_demo(capsys, "--data", str(dataset.root), "--labels", str(tmp_path / "nope.csv"))
        assert rc == 2 and "--labels" in err and "no such file" in err

    @pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where CUDA is missing")
    def test_cuda_without_cuda(self, capsys, dataset):
        rc, _, err = run_demo(capsys, "--data", str(dataset.root), "--device", "cuda")
        assert rc == 2 and "CUDA is not available" in err

    def test_bad_device(self, capsys, dataset):
        rc, _, err = run_demo(capsys, "--data", str(dataset.root), "--device", "toaster")
        assert rc == 2 and "--device toaster: not a torch device" in err

    @pytest.mark.parametrize("args", [["--images", "0"], ["--batch-size", "x"], ["--size", "-3"], ["--bogus"]])
    def test_bad_options(self, capsys, args):
        with pytest.raises(SystemExit) as info:
            main(["demo", *args])
        assert info.value.code == 2
        assert "usage: python -m datapipes demo" in capsys.readouterr().err

    def test_usage_and_unknown_command(self, capsys):
        assert main([]) == 2
        assert "usage: python -m datapipes demo" in capsys.readouterr().out
        assert main(["--help"]) == 0
        assert main(["train"]) == 2
        assert "unknown command 'train'" in capsys.readouterr().err

    @pytest.mark.gpu
    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    def test_on_the_gpu(self, capsys):
        rc, out, _ = run_demo(capsys, "--images", "40", "--device", "cuda", *FAST)
        assert rc == 0, out
        assert f"on cuda:{torch.cuda.current_device()}" in out and "PinMemory" in out and "CudaMover" in out

    @pytest.mark.slow
    def test_module_entry_point(self, tmp_path):
        proc = subprocess.run(
            [sys.executable, "-m", "datapipes", "demo", "--images", "40", "--no-progress"],
            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=110,
        )
        assert proc.returncode == 0, proc.stderr
        assert "first batch: images (32, 3, 224, 224) torch.uint8" in proc.stdout
        assert "images/s" in proc.stdout and "bottleneck:" in proc.stdout
