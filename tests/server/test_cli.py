"""The `helios` console script on the real default model, as a user runs it."""
import subprocess

import pytest


def run_helios(*args, stdin=None):
    return subprocess.run(["helios", *args], input=stdin, capture_output=True, text=True, timeout=300)


def test_generate_answers_the_question():
    result = run_helios("generate", "What is the capital of France?", "--max-tokens", "32", "--threads", "2")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_chat_streams_a_conversation():
    result = run_helios("chat", "--max-tokens", "24", "--threads", "2",
                        stdin="What is the capital of France?\n/exit\n")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout and result.stdout.count("> ") == 2


def test_bad_model_is_a_clean_error():
    result = run_helios("generate", "hi", "--model", "/no/such.gguf")
    assert result.returncode != 0 and "helios: error:" in result.stderr and "Traceback" not in result.stderr


def test_return_timings_from_the_flag_or_the_environment(monkeypatch):
    from helios.cli import build_parser
    assert not build_parser().parse_args(["serve"]).return_timings
    assert build_parser().parse_args(["serve", "--return-timings"]).return_timings
    monkeypatch.setenv("HELIOS_RETURN_TIMINGS", "1")
    assert build_parser().parse_args(["serve"]).return_timings


def test_kv_memory_flags():
    from helios.cli import build_parser
    args = build_parser().parse_args(["serve", "--kv-reservation", "full", "--kv-offload-bytes", "0", "--kv-watermark", "0.05"])
    assert (args.kv_reservation, args.kv_offload_bytes, args.kv_watermark) == ("full", 0, 0.05)
    assert build_parser().parse_args(["serve", "--kv-offload-bytes", "8e9"]).kv_offload_bytes == 8 * 10**9
    for bad in (["--kv-reservation", "lazy"], ["--kv-offload-bytes", "-1"], ["--kv-cache-bytes", "0"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", *bad])


def test_prefill_order_and_warm_up_flags(monkeypatch):
    from helios.cli import build_parser
    args = build_parser().parse_args(["serve", "--prefill-order", "oldest-first", "--prefill-overdue-s", "2.5", "--no-warm-up"])
    assert (args.prefill_order, args.prefill_overdue_s, args.warm_up) == ("oldest-first", 2.5, False)
    assert build_parser().parse_args(["serve"]).warm_up
    monkeypatch.setenv("HELIOS_WARM_UP", "0")
    assert not build_parser().parse_args(["serve"]).warm_up
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--prefill-order", "random"])


def test_speculative_flags_reach_the_engine_config():
    from helios.cli import build_parser, engine_settings
    from helios.config import EngineConfig
    args = build_parser().parse_args(["serve", "--speculative", "ngram", "--speculative-tokens", "6",
                                      "--speculative-ngram-min", "1", "--speculative-ngram-max", "3"])
    config = EngineConfig.from_env({}, **engine_settings(args))
    assert (config.speculative, config.speculative_tokens, config.speculative_ngram_min, config.speculative_ngram_max) == \
        ("ngram", 6, 1, 3)
    assert build_parser().parse_args(["serve"]).speculative is None  # unset: HELIOS_SPECULATIVE, then off
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--speculative", "eagle"])


def test_serve_warms_up_before_it_listens_and_counts_nothing():
    from _server import Server
    server = Server("--max-batch-size", "4", api_key=None)
    try:
        for name in ("helios:engine_ticks", "helios:prompt_tokens_total", "helios:prefix_cache_queries",
                     "helios:kv_pages_used", "helios:kv_pages_cached"):
            assert server.metric(name) == 0, name
        assert server.metric("helios:kv_pages_free") == server.metric("helios:kv_pages_total")
        reply = server.client().completions.create(model="SmolLM2-135M-Instruct", prompt="The capital of France is",
                                                   max_tokens=4, temperature=0)
        assert reply.usage.completion_tokens == 4
    finally:
        assert server.stop() == 0
    log = server.proc.stdout.read()
    assert "helios: warmed up in" in log and log.index("warmed up") < log.index("serving"), log


def test_serve_with_speculative_decoding_streams_the_same_text():
    "`helios serve --speculative ngram`: the official client streams the text it gets without drafts, and /metrics counts them."
    from _server import Server
    server = Server("--max-batch-size", "4", "--speculative", "ngram", "--no-warm-up", api_key=None)
    prompt = "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat,"
    try:
        client = server.client()
        ask = dict(model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=40, temperature=0)
        whole = client.completions.create(**ask).choices[0].text
        streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **ask) if c.choices)
        assert streamed == whole
        assert 0 < server.metric("helios:spec_decode_accepted_tokens_total") <= server.metric("helios:spec_decode_draft_tokens_total")
    finally:
        assert server.stop() == 0
    assert "speculative: ngram (4 tokens, n-grams 2-4)" in server.proc.stdout.read()
    from helios import LLM, SamplingParams
    with LLM(quiet=True) as plain:  # the text without drafts
        assert plain.generate([prompt], SamplingParams(max_tokens=40, temperature=0))[0].outputs[0].text == whole
