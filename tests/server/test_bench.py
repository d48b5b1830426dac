"""`helios bench` against a real `helios serve`: every metric present and consistent with the requests."""
import subprocess

import pytest

from test_server import Server  # tests/server/test_server.py, beside this file


@pytest.fixture(scope="module")
def tiny_server(tiny_folder):
    s = Server("--model", str(tiny_folder), "--served-model-name", "tiny", "--max-batch-size", "16", api_key=None)
    yield s
    assert s.stop() == 0


def run_bench(*args):
    return subprocess.run(["helios", "bench", *args], capture_output=True, text=True, timeout=600)


def test_bench_helios30_metrics_are_present_and_sane(tiny_server, tmp_path):
    from helios.bench.report import TABLE_ROWS, load_run
    out = tmp_path / "run.json"
    r = run_bench("--base-url", tiny_server.url + "/v1", "--model", "tiny", "--workload", "helios-30",
                  "--out", str(out), "--plot", str(tmp_path / "run.png"), "--forbid-eos")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "| TTFT p50 (s) |" in r.stdout and (tmp_path / "run.png").stat().st_size > 10_000
    run = load_run(out)
    m = run.metrics["overall"]
    for _, key in TABLE_ROWS:
        assert key in m, key
    assert m["requests"] == 30 and m["completed"] == 30 and m["errors"] == 0 and m["completion_ratio"] == 1.0
    assert m["max_token_hit_rate"] == 1.0
    assert m["output_tokens"] == 10 * 16 + 10 * 128 + 10 * 64
    assert 10 * (512 + 32 + 128) * 0.9 <= m["prompt_tokens"] <= 10 * (512 + 32 + 128) * 1.1
    assert m["ttft_p50_s"] <= m["ttft_p95_s"] <= m["ttft_p99_s"] and m["e2e_p50_s"] <= m["e2e_p95_s"]
    assert 1 <= m["avg_concurrency"] <= m["peak_concurrency"] <= 30
    assert 0 <= m["drain_fraction"] <= 1 and m["output_tok_s"] < m["total_tok_s"]
    for rec in run.records:
        assert rec.send_s <= rec.first_token_s <= rec.end_s and rec.output_tokens == rec.max_tokens
    assert set(run.metrics["by_class"]) == {"prefill-heavy", "decode-heavy", "balanced"}
    assert run.metrics["by_class"]["decode-heavy"]["output_tokens"] == 1280
    assert run.machine["cpus"] >= 1 and run.config["num_requests"] == 30


def test_prefix_share_reports_cache_hits(tiny_server, tmp_path):
    from helios.bench.report import load_run
    out = tmp_path / "prefix.json"
    r = run_bench("--base-url", tiny_server.url + "/v1", "--model", "tiny", "--workload", "prefix-share",
                  "--max-concurrency", "4", "--out", str(out))
    assert r.returncode == 0, r.stderr + r.stdout
    m = load_run(out).metrics["overall"]
    assert m["cache_hit_rate"] > 0.5 and m["restored_tokens"] >= 512 * 12


@pytest.mark.slow
def test_compare_prints_ratios(tiny_server, tmp_path):
    from helios.bench.report import load_run
    paths = []
    for rate in ("inf", "20"):
        p = tmp_path / f"decode-{rate}.json"
        r = run_bench("--base-url", tiny_server.url + "/v1", "--model", "tiny", "--workload", "decode-16",
                      "--request-rate", rate, "--engine", f"rate-{rate}", "--out", str(p))
        assert r.returncode == 0, r.stderr
        paths.append(str(p))
    r = run_bench("--compare", *paths)
    assert r.returncode == 0 and "rate-20 / rate-inf" in r.stdout and "×" in r.stdout
    poisson = load_run(paths[1])
    sends = sorted(rec.send_s for rec in poisson.records)
    assert sends[-1] - sends[0] > 0.2  # Poisson arrivals are spread out, not all at once


def test_repeat_reports_the_median_of_each_metric(tiny_server, tmp_path):
    from helios.bench.report import load_run
    out = tmp_path / "rep.json"
    r = run_bench("--base-url", tiny_server.url + "/v1", "--model", "tiny", "--workload", "decode-16",
                  "--repeat", "3", "--out", str(out))
    assert r.returncode == 0, r.stderr + r.stdout
    run = load_run(out)
    assert len(run.repetitions) == 3 and "median of 3 repetitions" in r.stdout
    for key in ("output_tok_s", "ttft_p50_s", "e2e_p95_s"):
        values = sorted(rep[key] for rep in run.repetitions)
        assert run.metrics["overall"][key] == values[1], key
    assert run.metrics["overall"]["output_tokens"] == 16 * 64 and run.metrics["overall"]["errors"] == 0


def test_repetitions_use_new_prompts(tiny_server, tmp_path):
    "Repeating the same 512-token prompts would restore them from the prefix cache; new text per repetition does not."
    from helios.bench.report import load_run
    out = tmp_path / "rep30.json"
    # a seed no other test of this module used, so the server has not seen repetition 0's prompts either
    r = run_bench("--base-url", tiny_server.url + "/v1", "--model", "tiny", "--workload", "helios-30",
                  "--repeat", "2", "--seed", "100", "--out", str(out))
    assert r.returncode == 0, r.stderr + r.stdout
    assert [rep["restored_tokens"] for rep in load_run(out).repetitions] == [0, 0]


@pytest.mark.slow
def test_merge_takes_the_median_of_runs_made_apart(tiny_server, tmp_path):
    "peers.sh runs each repetition in its own round; --merge makes them one run, as --repeat would."
    from helios.bench.report import load_run
    paths = []
    for seed in range(3):
        p = tmp_path / f"decode.{seed}.json"
        r = run_bench("--base-url", tiny_server.url + "/v1", "--model", "tiny", "--workload", "decode-16",
                      "--seed", str(200 + seed), "--engine", "tiny", "--out", str(p))
        assert r.returncode == 0, r.stderr
        paths.append(str(p))
    out = tmp_path / "merged.json"
    r = run_bench("--merge", *paths, "--out", str(out))
    assert r.returncode == 0 and "median of 3 repetitions run apart" in r.stdout, r.stderr
    merged, singles = load_run(out), [load_run(p).metrics["overall"] for p in paths]
    for key in ("output_tok_s", "ttft_p95_s", "e2e_p50_s"):
        assert merged.metrics["overall"][key] == sorted(s[key] for s in singles)[1], key
    other = tmp_path / "other.json"
    assert run_bench("--base-url", tiny_server.url + "/v1", "--model", "tiny", "--workload", "decode-16",
                     "--engine", "another", "--out", str(other)).returncode == 0
    r = run_bench("--merge", paths[0], str(other))
    assert r.returncode != 0 and "one engine and workload" in r.stderr


@pytest.mark.parametrize("engines", [["helios"], ["helios", "vllm-fp32-all"], ["helios", "vllm-fp32-all", "llama-server"]])
def test_compare_table_rows_have_as_many_cells_as_its_header(engines):
    "One run or several (the committed side-by-side results): every row of the markdown table has the header's cells."
    from pathlib import Path
    from helios.bench.report import compare_table, load_run
    results = Path(__file__).parents[2] / "benchmarks" / "results"
    lines = compare_table([load_run(results / f"decode-16.{e}.json") for e in engines]).splitlines()
    cells = lambda line: line.strip().strip("|").split("|")
    assert len(cells(lines[0])) == 2 * len(engines) and all(len(cells(l)) == 2 * len(engines) for l in lines)
    assert lines[0].split("|")[1].strip() == "metric" and all(c.strip() for c in cells(lines[0]))
