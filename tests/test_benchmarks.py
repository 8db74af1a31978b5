"""Smoke runs of benchmark scripts whose main use is on machines CI does not have (a GPU).

They measure nothing here: they check that the scripts still run against the current API, so a
session that is lent a GPU finds a working benchmark, and that scripts/device-check.sh (the GPU
tests and benchmarks in one command) runs with ``--device cpu``.
"""

import copy
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from helpers import import_or_skip

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_overlap.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.slow
def test_gpu_overlap_smoke_run_on_the_cpu(tmp_path):
    proc = run("--device", "cpu", "--images", "40", "--repeats", "1", "--concurrency", "2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "1. end to end (2 batches of 32, concurrency 2, medians of 1)" in out
    for system in ("datapipes, CPU only (pin_memory)", "datapipes + to_device(cpu) + step",
                   "torch DataLoader(2, pin_memory) + .to() + step"):
        assert system in out
    assert "smoke run on the CPU" in out and "PASS" not in out and "FAIL" not in out
    assert "2. copy vs compute (4 unpinned batches of 32x3x224x224 uint8" in out
    assert "to_device(cpu) then step" in out and "nothing is copied, no figure" in out


def load_gpu_overlap(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts benchmarks/ first on sys.path
    spec = importlib.util.spec_from_file_location("_bench_gpu_overlap", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_overlap_compares_devices_by_type_and_index(monkeypatch):
    # torch.device("cuda") is not torch.device("cuda:0"), while a batch's .device always has the index
    mod = load_gpu_overlap(monkeypatch)
    cuda, cuda0, cuda1, cpu = torch.device("cuda"), torch.device("cuda:0"), torch.device("cuda", 1), torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert mod.resolve(cuda) == cuda0 and mod.resolve(cuda1) == cuda1 and mod.resolve(cpu) == cpu
    assert mod.same_device(cuda, cuda0) and mod.same_device(cuda0, cuda) and mod.same_device(cpu, torch.device("cpu"))
    assert not mod.same_device(cuda, cuda1) and not mod.same_device(cuda0, cpu)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert mod.same_device(cuda, cuda1) and not mod.same_device(cuda, cuda0)


def test_gpu_overlap_copy_vs_compute_does_not_deep_copy_the_batches(monkeypatch, capsys):
    # IterableWrapper's default deep copy would time a copy of every (pinned) batch, not the transfer
    mod = load_gpu_overlap(monkeypatch)
    copied = []
    real = copy.deepcopy

    def deepcopy(x, *args, **kwargs):
        copied.append(type(x).__name__)
        return real(x, *args, **kwargs)

    monkeypatch.setattr(copy, "deepcopy", deepcopy)
    mod.copy_vs_compute(torch.device("cpu"), 1, n_batches=2, mm=16)
    assert copied == []
    assert "to_device(cpu) then step" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
@pytest.mark.slow
def test_gpu_overlap_without_cuda_says_so():
    proc = run("--images", "8")
    assert proc.returncode == 2
    assert "CUDA is not available" in proc.stderr and "--device cpu" in proc.stderr


DEVICE_CHECK = os.path.join(ROOT, "scripts", "device-check.sh")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_device_check_smoke_run_on_the_cpu(tmp_path):
    # The whole script, as a GPU host runs it, at its --device cpu sizes, with this interpreter.
    out_dir = tmp_path / "out"
    proc = subprocess.run(["bash", DEVICE_CHECK, "--device", "cpu", "--python", sys.executable],
                          env=dict(os.environ, OUT=str(out_dir)), capture_output=True, text=True, timeout=280, cwd=ROOT)
    log = proc.stdout
    assert proc.returncode == 0, log[-4000:] + proc.stderr[-2000:]
    assert f"python {sys.version.split()[0]} ({sys.executable})" in log
    assert f"torch {torch.__version__} (CUDA {torch.version.cuda})" in log
    assert re.search(r"^CPUs: \d+ \(\d+ usable by this process\)$", log, re.M) and re.search(r"^GPU: ", log, re.M)
    for part in ("1. GPU tests (pytest -m gpu)", "2. benchmarks/gpu_overlap.py (smoke)",
                 "3. benchmarks/end_to_end.py (smoke)"):
        assert f"=== {part} (limit " in log  # it ran
        assert re.search(rf"^  {re.escape(part)} +\d+ +s  (ok|ran; a target missed)", log, re.M), part  # and ended
    assert re.search(r"\d+ (skipped|passed).* in [\d.]+s", log)  # the GPU tests: skipped without CUDA
    assert "2. copy vs compute" in log and "| datapipes (concurrency=2) |" in log
    assert log.rstrip().endswith("device-check: PASSED")
    assert sorted(p.name for p in out_dir.iterdir()) == ["device-check.log", "end_to_end.json", "gpu-tests.xml"]
    assert (out_dir / "device-check.log").read_text() == log
    assert json.loads((out_dir / "end_to_end.json").read_text())["benchmark"] == "end_to_end"


AUTOTUNE = os.path.join(ROOT, "benchmarks", "autotune.py")


@pytest.mark.slow
def test_autotune_smoke_run(tmp_path):
    out = tmp_path / "autotune.json"
    proc = subprocess.run(
        [sys.executable, AUTOTUNE, "--quick", "--images", "48", "--sweep", "1,2", "--io-sweep", "2,8",
         "--switch", "0.5", "--after", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stderr  # 1: a target missed (a smoke run's figures mean nothing)
    for title in ("decode: 48 JPEG decode", "process: 48 JPEG decode + resize to 224x224 on worker processes",
                  "e2e: 48 JPEGs on disk", "io: fn sleeps 2 ms, then 20 ms"):
        assert title in proc.stdout
    assert proc.stdout.count("datapipes map(concurrency='auto')") == 4
    assert "re-tunes within 3 s" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "autotune" and doc["settings"]["quick"] is True
    assert [w["name"] for w in doc["workloads"]] == ["decode", "process", "e2e", "io"]
    for w in doc["workloads"]:
        names = [s["name"] for s in w["systems"]]
        assert "datapipes map(concurrency='auto')" in names and w["baseline"] in names
        assert len(w["targets"]) == 1


@pytest.mark.ray
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_cluster_benchmark_smoke_run():
    import_or_skip("ray", reason="Ray (requirements-test-gil.txt) runs the cluster benchmark")
    pytest.importorskip("distributed")
    script = os.path.join(ROOT, "benchmarks", "cluster.py")
    proc = subprocess.run([sys.executable, script, "--items", "64", "--overhead-items", "8", "--repeats", "1"],
                          capture_output=True, text=True, timeout=280, cwd=ROOT,
                          env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: the target missed on a tiny smoke run
    out = proc.stdout
    assert "1. CPU-bound fn" in out and "target: Ray with chunksize=32 >= 0.90x the process executor" in out
    for system in ("Ray tasks, one item per submit", "Ray actors, chunksize=32", "Dask get_executor(), chunksize=32",
                   "process executor, one item per submit"):
        assert system in out


@pytest.mark.slow
def test_transfer_many_core_proxy_smoke_run():
    # --work-ms: every item sleeps first, so that W workers behave as on W cores; the table adds
    # items/s and their share of the workers' rate, and every run prints its progress line
    script = os.path.join(ROOT, "benchmarks", "transfer.py")
    proc = subprocess.run(
        [sys.executable, script, "--work-ms", "10", "--workers", "4", "--sizes", "65536", "--repeats", "1",
         "--only", "datapipes,datapipes_collate,dataloader"],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stderr  # 1: a target missed (a smoke run's figures mean nothing)
    assert "the workers' rate is 364 items/s" in proc.stdout
    assert "| items/s | of the workers' rate |" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| datapipes (memfd)")]
    assert len(rows) == 2 and all(re.search(r"\| [\d,]+ \| \d+% \|$", row) for row in rows)
    assert proc.stderr.count("65,536 bytes, run 1 ") == 3
    assert "PASS" in proc.stdout or "FAIL" in proc.stdout


@pytest.mark.slow
def test_packing_smoke_run(tmp_path):
    # Every section at toy sizes; Grain is not in the test environments ("not installed" rows), and
    # without tokenizers (free-threaded CPython) the three sections that need it say so.
    out = tmp_path / "packing.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "packing.py"), "--docs", "400", "--texts", "120",
         "--resume-texts", "60", "--points", "2", "--repeats", "1", "--e2e-seq-len", "256", "--json", str(out)],
        capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a target missed (a smoke run's figures mean nothing)
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "packing"
    names = [w["name"] for w in doc["workloads"]]
    assert names[:3] == ["pack_concat", "pack_first_fit", "pack_best_fit"]
    for w in doc["workloads"][:3]:
        ours = next(s for s in w["systems"] if s["name"] == "datapipes")
        assert ours["throughput"] > 0 and 0 <= ours["padding_share"] < 1
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        assert "tokenize: not run: tokenizers is not installed" in proc.stdout
        return
    assert names[3:] == ["tokenize", "e2e", "resume"]
    assert "2 of 2 resumed streams equal the uninterrupted one" in proc.stdout, proc.stdout
    assert "e2e: the loaders delivered" not in proc.stdout


@pytest.mark.slow
def test_mixing_smoke_run(tmp_path):
    out = tmp_path / "mixing.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "mixing.py"), "--draws", "3000", "--points", "1",
         "--repeats", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a target missed (a smoke run's figures mean nothing)
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "mixing" and [w["name"] for w in doc["workloads"]] == ["deviation", "overhead", "resume",
                                                                                   "layouts"]
    deviation = doc["workloads"][0]
    assert all(s["exact_max_deviation"] < 1 for s in deviation["systems"] if "exact_max_deviation" in s)
    assert "1 of 1 resumed epochs deliver every item of the mixture exactly once" in proc.stdout
    assert "per-source sharding, 0w x 1r -> 2w x 1r: 1 of 1 resumed epochs deliver every item once" in proc.stdout


def test_global_shuffle_smoke_run(tmp_path):
    out = tmp_path / "global_shuffle.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "global_shuffle.py"), "--sizes", "20000", "--big", "1000000",
         "--prefix", "50000", "--traced", "20000", "--repeats", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a target missed (a smoke run's figures mean nothing)
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "global_shuffle" and [w["name"] for w in doc["workloads"]] == ["compare_20000", "billion"]
    compare = {s["name"]: s for s in doc["workloads"][0]["systems"]}
    assert set(compare) == {"permutation list", "bijection"}
    assert all(s["throughput"] > 0 and s["peak_bytes"] > 0 and s["first_item_s"] > 0 for s in compare.values())
    assert "ratio" in compare["bijection"] and "memory_ratio" in compare["bijection"]
    assert "target: peak memory under 1 MB" in proc.stdout and "bijection / list:" in proc.stdout
