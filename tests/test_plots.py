"""benchmarks/*.py --json and benchmarks/plots.py: the results schema, and PNG charts drawn from it.

overhead.py and concurrency.py run for real at their smallest settings (a few seconds each);
end_to_end.py starts a fresh process per system (several seconds each), so its JSON writer runs on
an in-memory result instead. The charts need matplotlib (a benchmark dependency, not a test one):
those tests skip without it; the schema tests do not.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")


def script(name):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", os.path.join(BENCH, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(name, *args, timeout=120):
    return subprocess.run([sys.executable, os.path.join(BENCH, f"{name}.py"), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def check_schema(doc, benchmark):
    assert doc["schema"] == 1 and doc["benchmark"] == benchmark
    m = doc["machine"]
    for key in ("python", "torch", "cpu_count", "platform", "date", "command"):
        assert m[key], key
    assert doc["workloads"]
    for w in doc["workloads"]:
        assert w["name"] and w["title"] and w["unit"] in ("items/s", "images/s")
        names = [s["name"] for s in w["systems"]]
        assert len(names) == len(set(names)), names
        assert w["baseline"] is None or w["baseline"] in names
        ok = [s for s in w["systems"] if s["status"] == "ok"]
        assert ok and any(s["role"] == "datapipes" for s in ok)
        for s in ok:
            assert s["throughput"] > 0 and s["runs"] and all(r > 0 for r in s["runs"])
            assert min(s["runs"]) <= s["throughput"] <= max(s["runs"])
            if w["baseline"]:
                assert s["ratio"] == pytest.approx(s["throughput"] / next(
                    b["throughput"] for b in ok if b["name"] == w["baseline"]))
        for t in w.get("targets", []):
            assert isinstance(t["passed"], bool) and t["text"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """The three benchmarks' JSON: overhead and concurrency run for real, end_to_end from memory."""
    d = tmp_path_factory.mktemp("results")
    out = {}
    proc = run("overhead", "--items", "300", "--repeats", "2", "--json", str(d / "overhead.json"))
    assert proc.returncode in (0, 1), proc.stderr  # 1: a target missed, which a 300-item run may do
    assert "map -> filter -> batch(32) (300 items" in proc.stdout
    out["overhead"] = d / "overhead.json"
    proc = run("concurrency", "--quick", "--only", "io", "--only", "overhead",
               "--json", str(d / "concurrency.json"))
    assert proc.returncode == 0, proc.stderr
    assert "io: 400 items" in proc.stdout and "datapipes map(concurrency=4)" in proc.stdout
    out["concurrency"] = d / "concurrency.json"
    out["end_to_end"] = d / "end_to_end.json"
    e2e = script("end_to_end")
    e2e._results.write(str(out["end_to_end"]), end_to_end_doc(e2e))
    return out


def end_to_end_doc(e2e):
    """end_to_end.py's JSON writer on a tiny in-memory result (what its children would return)."""
    def child(system, k):
        return {"system": system, "images": 40, "seconds": 0.1 + 0.01 * k, "first_s": 0.05 + 0.01 * k,
                "steady_ips": 300.0, "rss_mb": 250.0 + k, "workers": 2 if system == "dataloaderN" else 0,
                "cpu_s": 0.2}

    order = [("datapipes", 2), ("dataloader0", 0), ("dataloaderN", 0), ("spdl", 2), ("limit", 0)]
    results = {f"{s}:{c}": [child(s, k) for k in range(3)] for s, c in order}
    failed = {"spdl:2": "RuntimeError: boom"}
    del results["spdl:2"]
    med = e2e.table(results, order, failed, ["nodes"])
    targets = []
    e2e.verdicts(med, 2, targets)
    workload = e2e.workload_json("default", {}, results, order, failed, ["nodes"], med, targets)
    return e2e._results.document("end_to_end", {"images": 40, "repeats": 3}, [workload])


def test_overhead_json(results):
    doc = json.loads(results["overhead"].read_text())
    check_schema(doc, "overhead")
    assert [w["name"] for w in doc["workloads"]] == ["map -> filter -> batch(32)", "one map stage"]
    chain = doc["workloads"][0]
    assert chain["baseline"] == "plain generator chain (the limit)"
    roles = {s["name"]: s["role"] for s in chain["systems"]}
    assert roles["plain generator chain (the limit)"] == "limit" and roles["datapipes"] == "datapipes"
    limit = chain["systems"][0]
    assert limit["ratio"] == 1.0 and len(limit["runs"]) == 2 and limit["ns_per_item"] > 0
    assert "overhead.py --items 300 --repeats 2 --json" in doc["machine"]["command"]
    assert doc["settings"] == {"items": 300, "repeats": 2, "clock": "cpu"}
    assert [t["text"] for t in chain["targets"]] == ["chain rate >= 0.67x plain"]


def test_concurrency_json(results):
    doc = json.loads(results["concurrency"].read_text())
    check_schema(doc, "concurrency")
    by_name = {w["name"]: w for w in doc["workloads"]}
    assert set(by_name) == {"io", "overhead"}
    io = by_name["io"]
    assert io["baseline"] == "plain ThreadPoolExecutor(32)"
    systems = {s["name"]: s for s in io["systems"]}
    assert systems["plain ThreadPoolExecutor(32)"]["role"] == "limit"
    assert len(systems["datapipes map(concurrency=32)"]["runs"]) == 1  # --quick: one repeat
    assert doc["settings"] == {"only": ["io", "overhead"], "quick": True, "repeats": 1}
    for peer in ("torchdata.nodes", "spdl.pipeline"):  # rows for the peers, run or not
        assert systems[peer]["status"] in ("ok", "not installed", "failed")
    over = {s["name"]: s for s in by_name["overhead"]["systems"]}
    s = over["datapipes map(concurrency=4)"]
    assert s["us_per_item"] == pytest.approx(1e6 / s["throughput"])


def test_end_to_end_json(results, capsys):
    doc = json.loads(results["end_to_end"].read_text())
    check_schema(doc, "end_to_end")
    (w,) = doc["workloads"]
    assert w["name"] == "default malloc" and w["baseline"] == "torch DataLoader(num_workers=0)"
    systems = {s["name"]: s for s in w["systems"]}
    ours = systems["datapipes (concurrency=2)"]
    assert ours["throughput"] == pytest.approx(40 / 0.11)  # the median run's images/s
    assert ours["runs"] == pytest.approx([40 / 0.1, 40 / 0.11, 40 / 0.12])
    assert ours["first_batch_s"] == pytest.approx(0.06) and ours["first_batch_runs"] == pytest.approx([0.05, 0.06, 0.07])
    assert ours["peak_rss_mb"] == 251.0 and ours["peak_rss_runs"] == [250.0, 251.0, 252.0]
    assert systems["limit: ThreadPoolExecutor(2), bytes in memory"]["role"] == "limit"
    assert systems["spdl.pipeline (2 threads)"]["status"] == "failed"
    assert systems["torchdata.nodes (- threads, Prefetcher)"]["status"] == "not installed"
    assert {t["text"].split(":")[0] for t in w["targets"]} >= {"ahead of every peer", ">= 75% of the limit"}
    # the same figures as the printed table
    end_to_end_doc(script("end_to_end"))
    assert "| datapipes (concurrency=2) | 364 | 1.00x | 300 | 60 | 251 |" in capsys.readouterr().out


def test_plots_rejects_what_is_not_a_results_file(tmp_path, capsys):
    plots = script("plots")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": 99}))
    assert plots.main([str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "not a benchmark results file" in capsys.readouterr().err


def test_plots_without_matplotlib_names_the_install(results, tmp_path, monkeypatch, capsys):
    plots = script("plots")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert plots.main([str(results["overhead"]), "--out", str(tmp_path)]) == 2
    assert "pip install matplotlib" in capsys.readouterr().err


def test_plots_draws_every_chart(results, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plots = script("plots")
    out = tmp_path / "perf"
    rst = tmp_path / "figures.rst"
    paths = [str(results[k]) for k in ("overhead", "concurrency", "end_to_end")]
    assert plots.main([*paths, "--out", str(out), "--rst", str(rst), "--docs", str(tmp_path)]) == 0
    want = {"overhead-map-filter-batch-32.png", "overhead-one-map-stage.png", "concurrency-io.png",
            "concurrency-overhead.png", "end-to-end-default-malloc.png", "end-to-end-default-malloc-first-batch.png",
            "end-to-end-default-malloc-peak-rss.png"}
    assert {p.name for p in out.iterdir()} == want
    for p in out.iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    assert sorted(os.path.basename(x) for x in capsys.readouterr().out.split()) == sorted(want)
    text = rst.read_text()
    assert text.count(".. figure:: /perf/") == 7 and "Command: " in text and "overhead.py --items 300" in text


def test_two_runs_of_one_benchmark_keep_their_file_names(results, tmp_path):
    pytest.importorskip("matplotlib")
    plots = script("plots")
    a, b = tmp_path / "e2e-quiet.json", tmp_path / "e2e-busy.json"
    a.write_bytes(results["end_to_end"].read_bytes())
    b.write_bytes(results["end_to_end"].read_bytes())
    assert plots.main([str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert "e2e-quiet-default-malloc.png" in names and "e2e-busy-default-malloc-peak-rss.png" in names
