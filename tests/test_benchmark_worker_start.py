"""Smoke run of benchmarks/worker_start.py: worker start time, torch's DataLoader beside ours.

It measures nothing here: it checks that the script still runs against the current API (fork and
spawn workers of both loaders, over a map-style dataset, an IterableDataset and a DataPipe), prints
its table, writes its JSON, and leaves no worker process behind.
"""

import json
import os
import re
import subprocess
import sys
import time
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "worker_start.py")


def processes_marked(token):
    """The pids of the processes whose environment holds ``token`` (every process the script
    started inherits it: workers, the resource tracker, a forkserver)."""
    found = []
    needle = token.encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read():
                    found.append(int(pid))
        except OSError:  # gone meanwhile, or not ours to read
            pass
    return found


def run(*args, token):
    env = {**os.environ, "WORKER_START_SMOKE": token}
    return subprocess.run([sys.executable, SCRIPT, "--quick", *args], capture_output=True, text=True, timeout=110,
                          cwd=ROOT, env=env)


def rows(out, workload):
    """``{(start method, system): (first batch ms, epoch ms)}`` of the printed table."""
    found = {}
    for line in out.splitlines():
        m = re.match(rf"^\| {workload} \| (\w+) \| 1 \| ([^|]+?) \| ([\d,]+) \| [^|]* \| ([\d,]+) \| ", line)
        if m:
            found[(m.group(1), m.group(2))] = (int(m.group(3).replace(",", "")), int(m.group(4).replace(",", "")))
    return found


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and /proc: the start methods of Linux")
def test_worker_start_smoke_run(tmp_path):
    token = uuid.uuid4().hex
    out = tmp_path / "worker_start.json"
    # map-style: fork and spawn (what --quick runs), with the JSON
    proc = run("--workloads", "map", "--json", str(out), token=token)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "start methods fork, spawn; workers 1; 1 repeat(s)" in proc.stdout
    got = rows(proc.stdout, "map")
    assert set(got) == {(m, s) for m in ("fork", "spawn") for s in ("torch DataLoader", "datapipes.DataLoader")}
    assert all(0 < first <= epoch for first, epoch in got.values())
    assert "worker processes left running: 0" in proc.stdout
    assert proc.stderr.count("run 1 map spawn 1w ") == 2

    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "worker_start" and doc["schema"] == 1
    assert doc["settings"]["quick"] is True and doc["settings"]["methods"] == ["fork", "spawn"]
    assert [w["name"] for w in doc["workloads"]] == ["map, fork, 1 worker", "map, spawn, 1 worker"]
    for w in doc["workloads"]:
        assert w["unit"] == "batches/s" and w["baseline"] == "torch DataLoader" and w["workers"] == 1
        by_name = {s["name"]: s for s in w["systems"]}
        assert set(by_name) == {"torch DataLoader", "datapipes.DataLoader"}
        ours, torch_ = by_name["datapipes.DataLoader"], by_name["torch DataLoader"]
        assert ours["role"] == "datapipes" and torch_["role"] == "peer"
        for s in (ours, torch_):
            assert s["status"] == "ok" and s["throughput"] > 0 and len(s["runs"]) == 1
            assert 0 < s["first_batch_s"] <= s["epoch_s"] and s["cpu_total_s"] > 0
        assert ours["first_batch_vs_torch"] == pytest.approx(ours["first_batch_s"] / torch_["first_batch_s"])
        assert ours["ratio"] == pytest.approx(ours["throughput"] / torch_["throughput"])

    # the iterable workload's four systems, on fork workers (cheap: no interpreter to start)
    proc = run("--methods", "fork", "--workloads", "iterable", token=token)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(rows(proc.stdout, "iterable")) == {
        ("fork", s) for s in ("torch DataLoader (IterableDataset)", "datapipes.DataLoader (IterableDataset)",
                              "datapipes.DataLoader (DataPipe)", "torch DataLoader (DataPipe)")}

    # nothing the script started outlives it (a resource tracker ends once its pipe closes)
    deadline = time.monotonic() + 10
    while processes_marked(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_marked(token) == []
