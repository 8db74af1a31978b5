"""Smoke runs of benchmark scripts whose main use is on machines CI does not have (a GPU).

They measure nothing here: they check that the scripts still run against the current API, so a
session that is lent a GPU finds a working benchmark.
"""

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
