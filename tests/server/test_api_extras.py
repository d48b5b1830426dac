"""Per-request timings, the prefix cache's report, /tokenize and /detokenize, against a real `helios serve`."""
import json

import httpx
import pytest

from _server import Server

TIMING_FIELDS = {"queue_s", "prefix_lookup_s", "prefill_s", "decode_s", "ttft_s", "e2e_s", "decode_tokens_per_s",
                 "cached_tokens", "prompt_tokens", "completion_tokens"}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colours."}]
TOL_S = 0.005   # the timings are differences of one request's monotonic timestamps, rounded by nothing


@pytest.fixture(scope="module")
def server(tiny_folder):
    s = Server("--model", str(tiny_folder), "--served-model-name", "tiny", "--page-size", "16",
               "--kv-cache-bytes", str(1 << 20))
    yield s
    assert s.stop() == 0


def post(server: Server, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(server.url + path, headers={**server.headers, **kw.pop("headers", {})}, json=body, timeout=60, **kw)


def assert_consistent(t: dict, usage: dict):
    assert set(t) == TIMING_FIELDS, t
    assert (t["prompt_tokens"], t["completion_tokens"], t["cached_tokens"]) == (
        usage["prompt_tokens"], usage["completion_tokens"], usage["prompt_tokens_details"]["cached_tokens"])
    assert 0 <= t["queue_s"] and 0 <= t["prefix_lookup_s"] <= t["ttft_s"] <= t["e2e_s"]
    assert t["queue_s"] + t["prefill_s"] == pytest.approx(t["ttft_s"], abs=TOL_S)
    assert t["ttft_s"] + t["decode_s"] == pytest.approx(t["e2e_s"], abs=TOL_S)
    if t["completion_tokens"] > 1:
        assert t["decode_tokens_per_s"] == pytest.approx((t["completion_tokens"] - 1) / t["decode_s"], rel=1e-6)


def test_the_cache_report_lists_the_blocks_of_a_repeated_prompt(server):
    "First in this module: the only prompt repeated so far is this one, so the blocks hit are its chain."
    prompt = "The quick brown fox jumps over the lazy dog. " * 8           # 80 tokens: 5 pages of 16
    for _ in range(2): post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    server.wait_idle()
    r = post(server, "/tokenize", {"prompt": prompt})
    num_full_pages = r.json()["count"] // 16
    report = httpx.get(server.url + "/v1/cache", headers=server.headers).json()
    assert report["object"] == "prefix_cache" and report["page_size"] == 16
    assert report["num_pages"] == report["num_free_pages"] + report["num_used_pages"] + report["num_cached_pages"]
    assert report["num_used_pages"] == 0 and report["num_cached_pages"] >= num_full_pages
    chain = sorted((b for b in report["blocks"] if b["hits"] >= 1), key=lambda b: b["depth"])
    assert [b["depth"] for b in chain][:num_full_pages - 1] == list(range(1, num_full_pages))
    assert all(b["num_tokens"] == 16 and b["tier"] == "device" and b["idle_s"] >= 0 for b in chain)
    assert chain[0]["parent"] is None and all(b["parent"] == a["hash"] for a, b in zip(chain, chain[1:]))
    assert report["totals"]["hit_tokens"] >= (num_full_pages - 1) * 16
    assert httpx.get(server.url + "/v1/cache").status_code == 401            # the key guards it


def test_timings_when_asked(server):
    c = server.client()
    chat = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0,
                                     extra_body={"timings": True, "ignore_eos": True})
    assert_consistent(chat.model_extra["timings"], chat.usage.model_dump())
    plain = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4)
    assert "timings" not in (plain.model_extra or {})
    several = post(server, "/v1/completions", {"prompt": ["one", "two words"], "max_tokens": 5, "timings": True,
                                               "ignore_eos": True}).json()
    assert [t["prompt_tokens"] for t in several["timings"]] == [1, 2]   # one object per prompt
    assert all(t["completion_tokens"] == 5 for t in several["timings"])


def test_a_stream_carries_timings_on_its_final_chunk(server):
    body = {"messages": MESSAGES, "max_tokens": 8, "stream": True, "timings": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    lines = [line for line in post(server, "/v1/chat/completions", body).text.splitlines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    finish = next(ch for ch in chunks if ch["choices"] and ch["choices"][0]["finish_reason"])
    assert_consistent(finish["timings"], chunks[-1]["usage"])
    assert chunks[-1]["timings"] == finish["timings"]                       # the usage chunk, the very last one
    assert not any("timings" in ch for ch in chunks if ch is not finish and ch is not chunks[-1])


def test_return_timings_is_the_servers_default(tiny_folder):
    s = Server("--model", str(tiny_folder), "--served-model-name", "tiny", "--kv-cache-bytes", str(1 << 20),
               "--return-timings")
    try:
        on = post(s, "/v1/completions", {"prompt": "hi", "max_tokens": 3}).json()
        assert_consistent(on["timings"], on["usage"])
        assert "timings" not in post(s, "/v1/completions", {"prompt": "hi", "max_tokens": 3, "timings": False}).json()
    finally:
        assert s.stop() == 0


def test_tokenize_counts_what_chat_reports(server):
    counted = post(server, "/tokenize", {"messages": MESSAGES}).json()
    chat = server.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert counted["count"] == len(counted["tokens"]) == chat.usage.prompt_tokens
    assert counted["max_model_len"] == 2048
    without = post(server, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}).json()
    assert without["count"] < counted["count"]
    text = post(server, "/detokenize", {"tokens": counted["tokens"]}).json()["prompt"]
    assert text.startswith("<|im_start|>system\nBe brief.") and text.endswith("<|im_start|>assistant\n")
    prompt = post(server, "/tokenize", {"prompt": "Hello there", "return_token_strs": True}).json()
    completion = server.client().completions.create(model="tiny", prompt="Hello there", max_tokens=1)
    assert prompt["count"] == completion.usage.prompt_tokens and len(prompt["token_strs"]) == prompt["count"]


@pytest.mark.parametrize("path, body, param, words", [
    ("/tokenize", {}, None, ["either prompt"]),
    ("/tokenize", {"prompt": "hi", "messages": MESSAGES}, None, ["not both"]),
    ("/tokenize", {"prompt": "hi", "model": "gpt-4"}, "model", ["gpt-4"]),
    ("/tokenize", {"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools",
     ["does not render tools"]),
    ("/detokenize", {"tokens": [1, 10**9]}, "tokens", ["outside the vocabulary"]),
    ("/detokenize", {"tokens": "hi"}, "tokens", ["valid array"]),
])
def test_bad_tokenize_bodies(server, path, body, param, words):
    r = post(server, path, body)
    assert r.status_code in (400, 404), r.text
    error = r.json()["error"]
    assert error["param"] == param and all(w in error["message"] for w in words), error
