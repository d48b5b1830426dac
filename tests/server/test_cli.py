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
