"""Smoke runs of benchmark scripts whose main use is on machines CI does not have (a GPU).

They measure nothing here: they check that the scripts still run against the current API, so a
session that is lent a GPU finds a working benchmark.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_overlap.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_gpu_overlap_smoke_run_on_the_cpu(tmp_path):
    proc = run("--device", "cpu", "--images", "40", "--repeats", "1", "--concurrency", "2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "1. end to end (2 batches of 32, concurrency 2, medians of 1)" in out
    for system in ("datapipes, CPU only (pin_memory)", "datapipes + to_device(cpu) + step",
                   "torch DataLoader(2, pin_memory) + .to() + step"):
        assert system in out
    assert "smoke run on the CPU" in out and "PASS" not in out and "FAIL" not in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_gpu_overlap_without_cuda_says_so():
    proc = run("--images", "8")
    assert proc.returncode == 2
    assert "CUDA is not available" in proc.stderr and "--device cpu" in proc.stderr


AUTOTUNE = os.path.join(ROOT, "benchmarks", "autotune.py")


@pytest.mark.slow
def test_autotune_smoke_run(tmp_path):
    out = tmp_path / "autotune.json"
    proc = subprocess.run(
        [sys.executable, AUTOTUNE, "--quick", "--images", "48", "--sweep", "1,2", "--io-sweep", "2,8",
         "--switch", "0.5", "--after", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stderr  # 1: a target missed (a smoke run's figures mean nothing)
    for title in ("decode: 48 JPEG decode", "e2e: 48 JPEGs on disk", "io: fn sleeps 2 ms, then 20 ms"):
        assert title in proc.stdout
    assert proc.stdout.count("datapipes map(concurrency='auto')") == 3
    assert "re-tunes within 3 s" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "autotune" and doc["settings"]["quick"] is True
    assert [w["name"] for w in doc["workloads"]] == ["decode", "e2e", "io"]
    for w in doc["workloads"]:
        names = [s["name"] for s in w["systems"]]
        assert "datapipes map(concurrency='auto')" in names and w["baseline"] in names
        assert len(w["targets"]) == 1
