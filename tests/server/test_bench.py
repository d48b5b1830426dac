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


def test_seed30_runs_helios30_through_a_closed_loop_of_8_workers(tiny_server, tmp_path):
    from helios.bench.report import load_run
    out = tmp_path / "seed.json"
    r = run_bench("--base-url", tiny_server.url + "/v1", "--model", "tiny", "--workload", "seed-30", "--out", str(out),
                  "--forbid-eos")
    assert r.returncode == 0, r.stderr + r.stdout
    run = load_run(out)
    m = run.metrics["overall"]
    assert m["completed"] == 30 and m["output_tokens"] == 10 * 16 + 10 * 128 + 10 * 64
    assert run.config["max_concurrency"] == 8 and m["peak_concurrency"] == 8  # never more than the 8 workers
    sends = sorted(rec.send_s for rec in run.records)
    ends = sorted(rec.end_s for rec in run.records)
    assert all(sends[8 + i] >= ends[i] for i in range(22))  # request 9 and later start only when one has ended


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


def test_decode_1_sends_one_request_at_a_time(tiny_server, tmp_path):
    "decode-1 is batch-1 decode: its own closed loop of one client worker, so no two requests overlap."
    from helios.bench.report import load_run
    out = tmp_path / "single.json"
    r = run_bench("--base-url", tiny_server.url + "/v1", "--model", "tiny", "--workload", "decode-1", "--out", str(out))
    assert r.returncode == 0, r.stderr + r.stdout
    run = load_run(out)
    m = run.metrics["overall"]
    assert m["peak_concurrency"] == 1 and m["output_tokens"] == 4 * 128 and m["errors"] == 0
    spans = sorted((rec.send_s, rec.end_s) for rec in run.records)
    assert all(end <= next_send for (_, end), (next_send, _) in zip(spans, spans[1:]))
    assert m["decode_tok_s_p50"] > 0


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


@pytest.fixture(scope="module")
def smol_tokenizer():
    from helios.tokenizer import load_tokenizer
    from helios.weights import default_model_path
    return load_tokenizer(default_model_path())


def test_kv_memory_workloads_are_deterministic_and_outgrow_the_benchmark_pools(smol_tokenizer):
    "chat-short lets answers end and holds 1,024 tokens of max_tokens; prefix-spill shares more pages than its pool."
    from _scripts import load_script
    from helios.bench.workloads import WORKLOADS, shared_pages
    bench = load_script("kv_memory_bench").EXPERIMENTS
    tok = smol_tokenizer
    chat = WORKLOADS["chat-short"](tok)
    assert chat == WORKLOADS["chat-short"](tok) and chat != WORKLOADS["chat-short"](tok, 1)
    assert len(chat) == 48 and all(s.chat and s.stop_at_eos and s.max_tokens == 1024 for s in chat)
    lengths = [len(tok.encode(s.prompt)) for s in chat]
    assert 40 <= min(lengths) and max(lengths) <= 200
    # full reservation (prompt, the chat template's few dozen tokens and 1,024) fits at most 4 in the chat pool;
    # on-demand starts each with the one page its prompt needs
    pages, per_request = bench["chat-short"]["pages"], -(-(max(lengths) + 64 + 1024) // 256)
    assert pages // per_request <= 4 and pages >= 16
    spill = WORKLOADS["prefix-spill"](tok)
    assert spill == WORKLOADS["prefix-spill"](tok) and spill != WORKLOADS["prefix-spill"](tok, 1)
    prefixes = [s.prompt.split("\n\nQuestion: ")[0] for s in spill]
    assert len(spill) == 32 and len(set(prefixes)) == 8 and prefixes == prefixes[:8] * 4  # each back after 7 others
    assert not any(s.stop_at_eos or s.chat for s in spill)
    assert shared_pages(tok, spill) >= 2 * bench["prefix-spill"]["pages"]  # twice what the device pool holds


def test_chat_specs_go_to_the_chat_endpoint_and_may_end_at_eos():
    "The request bodies the client sends, and a streamed chat answer counted from its deltas and usage."
    import asyncio
    import json

    import httpx
    from helios.bench.client import send_request
    from helios.bench.workloads import RequestSpec
    seen = []

    def reply(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.path, body))
        chat = request.url.path.endswith("/chat/completions")
        chunk = lambda text: {"choices": [{"delta": {"content": text}} if chat else {"text": text}]}
        events = [chunk("Hello"), chunk(" there"), {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}]
        return httpx.Response(200, text="".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n")

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(reply)) as client:
            chat = RequestSpec("c", "What is 2 + 2?", 1024, chat=True, stop_at_eos=True, sampling={"repetition_penalty": 1.1})
            plain = RequestSpec("p", "Once upon a time", 8)
            return [await send_request(client, "http://x/v1", "m", s, None, [2]) for s in (chat, plain)]

    chat_rec, plain_rec = asyncio.run(go())
    (chat_path, chat_body), (plain_path, plain_body) = seen
    assert chat_path == "/v1/chat/completions" and chat_body["messages"] == [{"role": "user", "content": "What is 2 + 2?"}]
    assert "ignore_eos" not in chat_body and "logit_bias" not in chat_body and chat_body["repetition_penalty"] == 1.1
    assert "prompt" not in chat_body and chat_body["max_tokens"] == 1024
    assert plain_path == "/v1/completions" and plain_body["ignore_eos"] is True and plain_body["logit_bias"] == {"2": -100}
    for rec in (chat_rec, plain_rec):
        assert rec.ok and rec.output_tokens == 2 and rec.prompt_tokens == 7 and len(rec.chunk_s) == 2


def test_bench_offers_every_workload():
    from helios.bench.workloads import WORKLOADS
    from helios.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["bench"]
    assert next(a for a in sub._actions if a.dest == "workload").choices == list(WORKLOADS)


def test_kv_memory_script_reads_the_servers_metrics():
    "The Prometheus text the script scrapes, and what it makes of /health samples."
    from _scripts import load_script
    kv = load_script("kv_memory_bench")
    text = ('# HELP helios:num_preemptions_total x\nhelios:num_preemptions_total{model_name="m"} 3.0\n'
            'helios:kv_offload_bytes_total{model_name="m",direction="to_host"} 1024.0\n'
            'helios:kv_offload_bytes_total{model_name="m",direction="to_device"} 512.0\n'
            'helios:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 2.0\n')
    prom = kv.parse_metrics(text)
    assert prom == {"helios:num_preemptions_total": 3, 'helios:kv_offload_bytes_total{direction="to_host"}': 1024,
                    'helios:kv_offload_bytes_total{direction="to_device"}': 512}
    assert kv.metric(prom, "helios:num_preemptions_total") == 3 and kv.metric(prom, "helios:missing") is None
    assert kv.metric(prom, "helios:kv_offload_bytes_total", direction="to_device") == 512
    assert kv.metric(prom, "helios:kv_offload_bytes_total") == 1536
    samples = [(t, {"running": r, "waiting": 0, "kv_pages": {"host": {"cached": t}}}) for t, r in enumerate([9, 2, 4, 6, 9])]
    s = kv.server_side(samples, 1, 3, prom, 20)
    assert s["running_peak"] == 6 and s["running_mean"] == 4 and s["host_cached_pages_peak"] == 3 and s["preemptions"] == 3
