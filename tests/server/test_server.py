"""`helios serve` as users meet it: a real server process on 127.0.0.1, driven by the official openai client."""
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from _server import Server
from conftest import real_text


@pytest.fixture(scope="module")
def server(tiny_folder):
    # 1 MiB of KV = 16 pages of 64 tokens: a budget (1,024 tokens) below the context (2,048)
    s = Server("--model", str(tiny_folder), "--served-model-name", "tiny", "--page-size", "64",
               "--kv-cache-bytes", str(1 << 20), "--max-batch-size", "16", "--prefill-chunk-size", "256",
               "--kv-cache-dtype", "float32")  # float32 pages: the 16 above
    yield s
    assert s.stop() == 0


GREEDY = dict(temperature=0, max_tokens=12)


def test_models_health_and_metrics(server):
    assert [m.id for m in server.client().models.list().data] == ["tiny"]
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["pages"] == 16
    text = httpx.get(server.url + "/metrics", headers=server.headers).text
    for name in ("helios:num_requests_running", "helios:num_requests_waiting", "helios:kv_cache_usage_perc",
                 "helios:prefix_cache_queries_total", "helios:prefix_cache_hits_total",
                 "helios:time_to_first_token_seconds_bucket", "helios:e2e_request_latency_seconds_count",
                 "helios:time_per_output_token_seconds_sum", "helios:request_queue_time_seconds_count"):
        assert name in text, name


def test_completion_and_chat(server):
    c = server.client()
    before = server.metric("helios:generation_tokens_total")
    comp = c.completions.create(model="tiny", prompt="Hello there", **GREEDY)
    assert comp.object == "text_completion" and comp.choices[0].finish_reason == "length"
    assert comp.usage.completion_tokens == 12 and comp.usage.prompt_tokens == 2
    assert comp.usage.prompt_tokens_details.cached_tokens == 0
    chat = c.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "Be brief."},
                                                             {"role": "user", "content": "Hi"}], **GREEDY)
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 12
    assert server.metric("helios:generation_tokens_total") == before + 24
    ids = c.completions.create(model="tiny", prompt=[15, 16, 17], **GREEDY)  # token ids as the prompt
    assert ids.usage.prompt_tokens == 3
    echo = c.completions.create(model="tiny", prompt="Hello there", echo=True, **GREEDY)
    assert echo.choices[0].text == "Hello there" + comp.choices[0].text


def test_streaming_with_usage_matches_non_streaming(server):
    c = server.client()
    messages = [{"role": "user", "content": "Tell me something"}]
    full = c.chat.completions.create(model="tiny", messages=messages, **GREEDY).choices[0].message.content
    chunks = list(c.chat.completions.create(model="tiny", messages=messages, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    raw = httpx.post(server.url + "/v1/completions", headers=server.headers,
                     json={"prompt": "abc", "stream": True, **GREEDY}).text
    assert raw.rstrip().endswith("data: [DONE]")


def test_n2_seed_and_logprobs(server):
    c = server.client()
    a = c.completions.create(model="tiny", prompt="Once", n=2, seed=7, temperature=1.0, max_tokens=10)
    b = c.completions.create(model="tiny", prompt="Once", n=2, seed=7, temperature=1.0, max_tokens=10)
    other = c.completions.create(model="tiny", prompt="Once", n=2, seed=8, temperature=1.0, max_tokens=10)
    assert [ch.index for ch in a.choices] == [0, 1]
    assert [ch.text for ch in a.choices] == [ch.text for ch in b.choices]
    assert [ch.text for ch in a.choices] != [ch.text for ch in other.choices]
    assert a.choices[0].text != a.choices[1].text
    lp = c.completions.create(model="tiny", prompt="Once", logprobs=2, **GREEDY).choices[0].logprobs
    assert len(lp.tokens) == 12 and all(len(t) == 2 for t in lp.top_logprobs)
    assert all(v <= 0 for v in lp.token_logprobs)
    chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                     logprobs=True, top_logprobs=3, **GREEDY)
    content = chat.choices[0].logprobs.content
    assert len(content) == 12 and all(len(t.top_logprobs) == 3 for t in content)
    assert content[0].logprob == content[0].top_logprobs[0].logprob  # greedy picks the top token


def test_stop_strings_end_the_text_and_never_leak(server):
    c = server.client()
    text = c.completions.create(model="tiny", prompt="The sea", temperature=0, max_tokens=30).choices[0].text
    stop = text[10:14]
    assert len(stop.strip()) > 0
    cut = c.completions.create(model="tiny", prompt="The sea", temperature=0, max_tokens=30, stop=[stop])
    assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt="The sea", temperature=0, max_tokens=30, stop=[stop], stream=True) if ch.choices)
    assert streamed == cut.choices[0].text and stop not in streamed


def test_cached_tokens_on_a_repeated_long_prompt(server):
    c = server.client()
    prompt = real_text()[:3000]
    first = c.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0)
    second = c.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens > 600
    assert second.usage.prompt_tokens_details.cached_tokens >= 512
    assert server.metric("helios:prefix_cache_hits_total") >= 512


def expect_error(server, path, payload, status, *words, headers=None, raw=None):
    headers = dict(server.headers if headers is None else headers)
    if raw is not None: headers["content-type"] = "application/json"
    r = httpx.post(server.url + path, headers=headers, json=payload, content=raw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    for w in words: assert w in err["message"], (w, err["message"])
    return r


def test_errors_are_clear(server):
    expect_error(server, "/v1/completions", {"prompt": "hi", "temperature": -1}, 400, "temperature must be a finite number in [0, 100]")
    expect_error(server, "/v1/completions", {"prompt": "hi", "top_p": 2}, 400, "top_p must be a finite number in (0, 1]")
    expect_error(server, "/v1/completions", None, 400, "not valid JSON", raw=b'{"prompt": "hi",')
    expect_error(server, "/v1/completions", {"max_tokens": 3}, 400, "prompt")
    expect_error(server, "/v1/chat/completions", {"messages": []}, 400, "messages is empty")
    expect_error(server, "/v1/completions", {"prompt": "hi", "max_tokens": 3000}, 400,
                 "exceed the model's context of 2,048", "lower max_tokens")
    expect_error(server, "/v1/completions", {"prompt": "hi", "max_tokens": 1500}, 400,
                 "exceed the KV budget of 1,024 tokens", "kv_cache_bytes")
    expect_error(server, "/v1/completions", {"prompt": "hi", "logit_bias": {"abc": 1}}, 400, "logit_bias must map token ids")
    expect_error(server, "/v1/completions", {"prompt": "hi", "logit_bias": {"99999999": 1}}, 400, "outside the vocabulary")
    expect_error(server, "/v1/completions", {"prompt": "hi", "model": "gpt-4"}, 404, "'gpt-4' does not exist", "'tiny'")
    expect_error(server, "/v1/completions", {"prompt": "hi"}, 401, "API key", headers={})
    expect_error(server, "/v1/completions", {"prompt": "hi"}, 401, "API key", headers={"Authorization": "Bearer nope"})
    with pytest.raises(openai.BadRequestError, match="temperature"):
        server.client().completions.create(model="tiny", prompt="hi", temperature=-3)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong").models.list()
    assert server.metric("helios:kv_pages_used") == 0
    assert httpx.get(server.url + "/health").status_code == 200  # still serving


def test_disconnect_mid_stream_frees_pages(server):
    cancelled = server.metric("helios:request_cancelled_total")
    with httpx.stream("POST", server.url + "/v1/completions", headers=server.headers,
                      json={"prompt": "go", "max_tokens": 900, "temperature": 0, "ignore_eos": True, "stream": True}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert server.metric("helios:kv_pages_used") > 0
    assert server.wait_idle() < 2.0
    assert server.metric("helios:request_cancelled_total") == cancelled + 1


def test_disconnect_mid_request_frees_pages(server):
    cancelled = server.metric("helios:request_cancelled_total")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", headers=server.headers, timeout=0.3,
                   json={"prompt": "go", "max_tokens": 900, "temperature": 0, "ignore_eos": True})
    assert server.wait_idle() < 2.0
    assert server.metric("helios:request_cancelled_total") == cancelled + 1


def test_64_concurrent_clients_equal_sequential(server):
    rng_prompts = [(real_text()[i * 37: i * 37 + 20 + (i * 53) % 400], 4 + i % 13) for i in range(64)]
    c = server.client(max_retries=0, timeout=120)
    ask = lambda pm: c.completions.create(model="tiny", prompt=pm[0], max_tokens=pm[1], temperature=0).choices[0].text
    with ThreadPoolExecutor(64) as pool:
        together = list(pool.map(ask, rng_prompts))
    alone = [ask(pm) for pm in rng_prompts]
    assert together == alone
    server.wait_idle()
    health = httpx.get(server.url + "/health").json()
    assert health["running"] == 0 and health["waiting"] == 0


def test_full_wait_list_is_a_429_then_serves_again(tiny_folder):
    s = Server("--model", str(tiny_folder), "--max-queue", "1", "--max-batch-size", "1", api_key=None)
    try:
        body = {"prompt": "hello", "max_tokens": 300, "temperature": 0, "ignore_eos": True}
        with ThreadPoolExecutor(6) as pool:
            responses = list(pool.map(lambda _: httpx.post(s.url + "/v1/completions", json=body, timeout=120), range(6)))
        codes = sorted(r.status_code for r in responses)
        assert 200 in codes and 429 in codes, codes
        refused = next(r for r in responses if r.status_code == 429)
        assert refused.headers["retry-after"] == "1" and "wait list is full" in refused.json()["error"]["message"]
        s.wait_idle()
        assert httpx.post(s.url + "/v1/completions", json={"prompt": "again", "max_tokens": 3}, timeout=60).status_code == 200
    finally:
        assert s.stop() == 0


def test_sigterm_finishes_in_flight_requests_then_exits_0(tiny_folder):
    s = Server("--model", str(tiny_folder), "--shutdown-grace-s", "20", api_key=None)
    result = {}
    def stream():
        with httpx.stream("POST", s.url + "/v1/completions", timeout=60,
                          json={"prompt": "x", "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}) as r:
            result["lines"] = [l for l in r.iter_lines() if l]
    t = threading.Thread(target=stream); t.start()
    time.sleep(0.5)
    code = s.stop(signal.SIGTERM)
    t.join(30)
    assert code == 0
    assert result["lines"][-1] == "data: [DONE]"
    assert json.loads(result["lines"][-2][6:])["choices"][0]["finish_reason"] == "length"


def test_an_engine_failure_is_a_500_and_the_server_keeps_serving(smollm2_llm_factory, monkeypatch):
    from fastapi.testclient import TestClient
    from helios.server.app import ServerSettings, create_app
    llm = smollm2_llm_factory(max_batch_size=2)
    client = TestClient(create_app(llm, ServerSettings("smol")))
    real = llm.engine.runner.run
    monkeypatch.setattr(llm.engine.runner, "run", lambda plan, timer=None: (_ for _ in ()).throw(RuntimeError("simulated OOM")))
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert r.status_code == 500 and "simulated OOM" in r.json()["error"]["message"]
    monkeypatch.setattr(llm.engine.runner, "run", real)
    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}).status_code == 200
    assert llm.stats().num_used_pages == 0


@pytest.mark.slow
def test_default_model_end_to_end_chat():
    s = Server("--max-batch-size", "4", api_key=None)
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused")
        model = c.models.list().data[0].id
        assert model == "SmolLM2-135M-Instruct"
        chunks = list(c.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0, max_tokens=32, stream=True, stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert "Paris" in text and chunks[-1].usage.completion_tokens > 0
    finally:
        assert s.stop() == 0
