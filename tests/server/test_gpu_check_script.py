"""scripts/gpu_check.py, the one-shot check a CUDA machine runs, smoke-tested on a CPU with tiny shapes: end to end as
a command (every check that runs here passes, the CUDA-graph parts are skipped as "not on this device"), once more in
process with a CPU stand-in for the graph runner (so the graph parts' own code runs too), and its bookkeeping: a part
that raises is recorded and the rest still run, a spent budget skips what is left."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from _scripts import ROOT, load_script

SCRIPT = ROOT / "scripts" / "gpu_check.py"
TINY = ("tiny-qwen3-tied", "tiny-qwen3-untied")
CHECKS = ("float32-greedy-parity", "invariance-batch", "invariance-chunked", "invariance-prefix-cache",
          "logits-float16", "logits-bfloat16")
MEASURED = ("build", "decode-eager", "prefill-2048")
GRAPH_PARTS = ("invariance-cuda-graphs", "decode-cuda-graphs")


@pytest.fixture(scope="module")
def gpu_check():
    return load_script("gpu_check")


def by_name(report: dict) -> dict[str, dict]: return {p["name"]: p for p in report["parts"]}


def test_the_cpu_smoke_run_passes_every_check_it_can_run(tmp_path):
    out, work = tmp_path / "gpu-check.json", tmp_path / "work"
    env = dict(os.environ, OMP_NUM_THREADS="1")  # two cores shared with other jobs: one thread is several times faster
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--shapes", "tiny", "--threads", "1",
                           "--out", str(out), "--work-dir", str(work)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    parts = by_name(report)
    assert list(report["shapes"]) == list(TINY)
    for shape in TINY:
        for name in CHECKS: assert parts[f"{shape}/{name}"]["status"] == "pass", parts[f"{shape}/{name}"]
        for name in MEASURED: assert parts[f"{shape}/{name}"]["status"] == "ok", parts[f"{shape}/{name}"]
        for name in GRAPH_PARTS:
            assert parts[f"{shape}/{name}"]["status"] == "skipped"
            assert parts[f"{shape}/{name}"]["error"].startswith("graphs: not on this device")
        prefix = parts[f"{shape}/invariance-prefix-cache"]["result"]
        assert prefix["prefix_hit_tokens"] >= prefix["expected_at_least"] > 0
        decode = parts[f"{shape}/decode-eager"]["result"]["batches"]
        assert set(decode) == {"1", "8", "32"} and all(b["ms_median"] > 0 for b in decode.values())
        prefill = parts[f"{shape}/prefill-2048"]["result"]
        assert prefill["ticks_per_prompt"] == 1 and prefill["tokens_per_s"] > 0
        logits = parts[f"{shape}/logits-bfloat16"]["result"]
        assert 0 < logits["worst_rel_rms_vs_hf"] <= logits["tolerance_rel_rms"]  # measured, and recorded
    assert report["counts"]["fail"] == report["counts"]["error"] == 0
    assert report["machine"]["name"] == "cpu" and report["machine"]["torch"]
    assert not list(work.iterdir())  # the checkpoints are removed
    assert "12 passed, 0 failed, 0 errors" in proc.stdout and "tiny-qwen3-untied/prefill-2048" in proc.stdout


def stand_in_graphs(gpu_check, monkeypatch):
    """runner="cuda-graphs" on a CPU: the eager engine with chapter 17's GraphRunner over EagerGraph (a CUDA graph's
    interface that runs the function again) swapped in, captured, as a GPU would have it."""
    from helios.gpu.graphs import EagerGraph, GraphRunner
    from helios.kv.pages import pages_needed
    make_engine = gpu_check.make_engine

    def make(model, tokenizer, runner="eager", **config):
        engine = make_engine(model, tokenizer, runner="eager", **config)
        if runner != "cuda-graphs": return engine
        rows = engine.config.max_batch_size
        pages = pages_needed(engine.scheduler.max_request_tokens, engine.config.page_size)
        engine.runner = GraphRunner(model, engine.kv, rows, pages, engine.runner.backend, make_graph=EagerGraph,
                                    page_counts=(1, 2, 4))
        engine.runner.capture()
        engine.config = dataclasses.replace(engine.config, runner="cuda-graphs")
        return engine
    monkeypatch.setattr(gpu_check, "make_engine", make)


def test_the_graph_parts_run_with_a_cpu_stand_in_for_cuda_graphs(gpu_check, monkeypatch, tmp_path, threads):
    stand_in_graphs(gpu_check, monkeypatch)
    out = tmp_path / "graphs.json"
    assert gpu_check.main(["--device", "cpu", "--shapes", "tiny", "--only", "tiny-qwen3-tied", "--threads", "1",
                           "--repeats", "2", "--out", str(out), "--work-dir", str(tmp_path / "work")]) == 0
    parts = by_name(json.loads(out.read_text()))
    invariance = parts["tiny-qwen3-tied/invariance-cuda-graphs"]
    assert invariance["status"] == "pass" and invariance["result"]["graph_replays"] > 0
    decode = parts["tiny-qwen3-tied/decode-cuda-graphs"]
    assert decode["status"] == "ok", decode
    assert decode["result"]["capture"]["graphs"] > 0
    assert all(b["graph_replays"] == 2 for b in decode["result"]["batches"].values())  # every timed tick
    assert decode["result"]["tokens_match_eager"] == {"1": True, "8": True, "32": True}


def test_a_part_that_raises_is_recorded_and_the_rest_still_run(gpu_check):
    rec = gpu_check.Recorder(budget_s=60)
    def skip(): raise gpu_check.Skip("graphs: not on this device")
    rec.run("raises", lambda: 1 / 0)
    rec.run("fails", lambda: dict(passed=False))
    rec.run("passes", lambda: dict(passed=True, value=1))
    rec.run("measures", lambda: dict(ms=1.0))
    rec.run("skips", skip)
    statuses = {p["name"]: p["status"] for p in rec.parts}
    assert statuses == dict(raises="error", fails="fail", passes="pass", measures="ok", skips="skipped")
    assert "ZeroDivisionError" in rec.parts[0]["error"]
    assert rec.counts() == {"pass": 1, "fail": 1, "error": 1, "ok": 1, "skipped": 1}


def test_a_spent_budget_skips_every_part_and_still_writes_the_json(gpu_check, tmp_path):
    out = tmp_path / "budget.json"
    assert gpu_check.main(["--device", "cpu", "--shapes", "tiny", "--budget-s", "0", "--out", str(out),
                           "--work-dir", str(tmp_path / "work")]) == 0
    report = json.loads(out.read_text())
    assert report["parts"] and all(p["status"] == "skipped" for p in report["parts"])
    assert all("budget" in p["error"] for p in report["parts"])


def test_where_the_json_goes(gpu_check):
    import torch
    assert gpu_check.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    gpu = gpu_check.default_out(torch.device("cuda"), "NVIDIA H200")
    assert gpu == ROOT / "benchmarks" / "results" / "gpu-nvidia-h200.json"
    cpu = gpu_check.default_out(torch.device("cpu"), "cpu")
    assert cpu.name == "gpu-cpu-smoke.json" and ROOT / "benchmarks" not in cpu.parents  # a smoke run writes nothing here
