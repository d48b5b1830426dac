"""Hostile input next to honest clients: every refusal in OpenAI's shape, nobody else affected.

A real `helios serve` process (tiny random Qwen3 with SmolLM2's tokenizer) on 127.0.0.1. Each hostile request
is sent while an honest stream is running; the honest stream must produce exactly the text it produces alone.
"""
import json
import signal
import statistics
import threading
import time

import httpx
import pytest

from _server import Server

HONEST = {"prompt": "A long and honest answer:", "max_tokens": 48, "temperature": 0, "ignore_eos": True}
ERROR_FIELDS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def server(tiny_folder):
    s = Server("--model", str(tiny_folder), "--served-model-name", "tiny", "--max-queue", "64")  # 1 MiB bodies at most
    yield s
    assert s.stop() == 0


def openai_error(r: httpx.Response) -> dict:
    "The error object of a refusal; fails unless the body is exactly OpenAI's shape."
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_FIELDS, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


class HonestStream(threading.Thread):
    "A streaming completion (greedy by default) on its own thread; `.text` once joined."
    def __init__(self, server: Server, body: dict = HONEST):
        super().__init__()
        self.server, self.body, self.started, self.lines = server, body, threading.Event(), []

    def run(self):
        with httpx.stream("POST", self.server.url + "/v1/completions", headers=self.server.headers, timeout=120,
                          json={**self.body, "stream": True}) as r:
            for line in r.iter_lines():
                if line: self.lines.append(line); self.started.set()
        self.started.set()

    @property
    def text(self) -> str:
        assert self.lines[-1] == "data: [DONE]", self.lines[-3:]
        chunks = [json.loads(line[6:]) for line in self.lines[:-1]]
        return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


@pytest.fixture(scope="module")
def honest_alone(server) -> str:
    s = HonestStream(server); s.start(); s.join(120)
    return s.text


def huge_nesting(depth: int) -> bytes:
    return b'{"prompt": "hi", "x": ' + b"[" * depth + b"]" * depth + b"}"


JSON = {"content-type": "application/json"}
HI = [{"role": "user", "content": "hi"}]
F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
# (name, path, json body or raw bytes, extra headers, expected status, words the message contains, expected param)
HOSTILE = [
    ("seed above 2**64-1", "/v1/completions", {"prompt": "hi", "seed": 2**64, "temperature": 1}, {}, 400, ["seed"], "seed"),
    ("seed below -2**63", "/v1/completions", {"prompt": "hi", "seed": -2**63 - 1}, {}, 400, ["seed"], "seed"),
    ("seed true", "/v1/completions", {"prompt": "hi", "seed": True}, {}, 400, ["integer"], "seed"),
    ("temperature Infinity", "/v1/completions", b'{"prompt": "hi", "temperature": Infinity}', JSON, 400, ["finite"], "temperature"),
    ("temperature NaN", "/v1/completions", b'{"prompt": "hi", "temperature": NaN}', JSON, 400, ["finite"], "temperature"),
    ("top_p 0", "/v1/completions", {"prompt": "hi", "top_p": 0}, {}, 400, ["top_p"], "top_p"),
    ("max_tokens 0", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, {}, 400, ["max_tokens", "1"], "max_tokens"),
    ("max_completion_tokens 0", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}, {}, 400, ["greater than"], "max_completion_tokens"),
    ("n 17", "/v1/completions", {"prompt": "hi", "n": 17}, {}, 400, ["n must be"], "n"),
    ("logprobs 21", "/v1/completions", {"prompt": "hi", "logprobs": 21}, {}, 400, ["logprobs"], "logprobs"),
    ("logit_bias key not an id", "/v1/completions", {"prompt": "hi", "logit_bias": {"abc": 1}}, {}, 400, ["token ids"], "logit_bias"),
    ("17 stop strings", "/v1/completions", {"prompt": "hi", "stop": [f"s{i}" for i in range(17)]}, {}, 400, ["16"], "stop"),
    ("stream_options without stream", "/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, {},
     400, ["stream: true"], None),
    ("lone surrogate in a prompt", "/v1/completions", b'{"prompt": "caf\\ud800"}', JSON, 400, ["surrogate"], None),
    ("lone surrogate in a stop string", "/v1/completions", b'{"prompt": "hi", "stop": ["\\udfff"]}', JSON, 400, ["surrogate"], None),
    ("temperature 1e30", "/v1/completions", {"prompt": "hi", "temperature": 1e30}, {}, 400, ["[0, 100]"], "temperature"),
    ("repetition_penalty 1e30", "/v1/completions", {"prompt": "hi", "repetition_penalty": 1e30}, {}, 400, ["[0.01, 100]"],
     "repetition_penalty"),
    ("repetition_penalty 1e-39", "/v1/completions", {"prompt": "hi", "repetition_penalty": 1e-39}, {}, 400, ["[0.01, 100]"],
     "repetition_penalty"),
    ("logit_bias key a superscript digit", "/v1/completions", {"prompt": "hi", "logit_bias": {"²": 1}}, {}, 400,
     ["token ids"], "logit_bias"),
    ("logit_bias key of 5,000 digits", "/v1/completions", {"prompt": "hi", "logit_bias": {"9" * 5000: 1}}, {}, 400,
     ["token ids"], "logit_bias"),
    ("logit_bias key with a space", "/v1/completions", {"prompt": "hi", "logit_bias": {" 5": 1}}, {}, 400,
     ["token ids"], "logit_bias"),
    ("300,000 token ids then a bad one", "/v1/completions", {"prompt": [0] * 300_000 + [-1]}, {}, 400,
     ["greater than or equal to 0"], "prompt[300000]"),
    ("more prompts than a request may hold", "/v1/completions", {"prompt": ["a"] * 1025}, {}, 400, ["at most 1024"], "prompt"),
    ("more messages than a request may hold", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "a"}] * 4097}, {}, 400, ["at most 4096"], "messages"),
    ("an empty content list", "/v1/chat/completions", {"messages": [{"role": "user", "content": []}]}, {}, 400,
     ["empty list"], "messages[0].content"),
    ("tools on a template without tool support", "/v1/chat/completions", {"messages": HI, "tools": [F]}, {}, 400,
     ["does not render tools"], "tools"),
    ("a tool without a name", "/v1/chat/completions", {"messages": HI, "tools": [{"type": "function", "function": {}}]}, {},
     400, ["required"], "tools[0].function.name"),
    ("tool_choice naming an unknown function", "/v1/chat/completions",
     {"messages": HI, "tools": [F], "tool_choice": {"type": "function", "function": {"name": "g"}}}, {}, 400,
     ["'g'", "not among the tools"], "tool_choice"),
    ("tool_choice required without tools", "/v1/chat/completions", {"messages": HI, "tool_choice": "required"}, {}, 400,
     ["needs tools"], "tool_choice"),
    ("response_format of an unsupported type", "/v1/completions", {"prompt": "hi", "response_format": {"type": "regex"}},
     {}, 400, ["json_schema"], "response_format.type"),
    ("a malformed JSON schema", "/v1/chat/completions", {"messages": HI, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}}, {}, 400, [], "response_format"),
    ("chat_template_kwargs setting messages", "/v1/chat/completions", {"messages": HI, "chat_template_kwargs": {
        "messages": []}}, {}, 400, ["may not set"], "chat_template_kwargs"),
    ("a tool message without tool_call_id", "/v1/chat/completions", {"messages": [{"role": "tool", "content": "1"}]}, {},
     400, ["tool_call_id"], "messages[0]"),
    ("an empty body", "/v1/completions", b"", JSON, 400, ["body is empty"], None),
    ("260,000 one-item lists", "/v1/completions", {"prompt": [[1]] * 260_000}, {}, 400, ["JSON arrays, objects"], None),
    ("logit_bias with 90,000 keys", "/v1/completions", {"prompt": "hi", "logit_bias": {str(i): "" for i in range(90_000)}},
     {}, 400, ["JSON arrays, objects"], None),
    ("34,000 messages", "/v1/chat/completions", {"messages": [{"role": "user", "content": [1]}] * 34_000}, {}, 400,
     ["JSON arrays, objects"], None),
    ("temperature true", "/v1/completions", {"prompt": "hi", "temperature": True}, {}, 400, ["valid number"], "temperature"),
    ("temperature as a string", "/v1/completions", {"prompt": "hi", "temperature": "0.5"}, {}, 400, ["valid number"],
     "temperature"),
    ("stream as a string", "/v1/completions", {"prompt": "hi", "stream": "yes"}, {}, 400, ["valid boolean"], "stream"),
    ("prompt token id out of the vocabulary", "/v1/completions", {"prompt": [1, 10**12]}, {}, 400, ["vocabulary"], None),
    ("prompt token id 1.5", "/v1/completions", {"prompt": [1, 1.5]}, {}, 400, ["valid integer"], "prompt[1]"),
    ("n as a string", "/v1/completions", {"prompt": "hi", "n": "2"}, {}, 400, ["valid integer"], "n"),
    ("max_tokens true", "/v1/completions", {"prompt": "hi", "max_tokens": True}, {}, 400, ["valid integer"], "max_tokens"),
    ("prompt token id negative", "/v1/completions", {"prompt": [1, -1]}, {}, 400, ["greater than or equal to 0"], "prompt[1]"),
    ("more sequences than the wait list", "/v1/completions", {"prompt": ["a"] * 40, "n": 2}, {}, 400, ["wait list"], "n"),
    ("a text longer than any context", "/v1/completions", {"prompt": "x" * 700_000}, {}, 400, ["characters"], "prompt"),
    ("content part text is a number", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, {}, 400, ["must be a string"], "messages[0].content"),
    ("content part text is null", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}, {}, 400, ["must be a string"], "messages[0].content"),
    ("only an image", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/cat.png"}}]}]}, {},
     400, ["image_url", "text only"], "messages[0].content"),
    ("unknown role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, {}, 400, ["wizard"], "messages[0].role"),
    ("message without content", "/v1/chat/completions", {"messages": [{"role": "user"}]}, {}, 400, ["required"],
     "messages[0].content"),
    ("message with null content", "/v1/chat/completions", {"messages": [{"role": "assistant", "content": None}]}, {},
     400, ["content is required"], "messages[0].content"),
    ("no messages", "/v1/chat/completions", {"messages": []}, {}, 400, ["messages is empty"], "messages"),
    ("top_logprobs without logprobs", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, {}, 400, ["logprobs: true"], None),
    ("body not UTF-8", "/v1/completions", b'{"prompt": "\xff\xfe"}', JSON, 400, ["UTF-8"], None),
    ("body not JSON", "/v1/completions", b'{"prompt": "hi",', JSON, 400, ["not valid JSON"], None),
    ("body nested 100,000 deep", "/v1/completions", huge_nesting(100_000), JSON, 400, ["JSON arrays, objects"], None),
    ("body is a list", "/v1/completions", [1, 2], {}, 400, ["object"], None),
    ("body text/plain", "/v1/completions", b'{"prompt": "hi"}', {"content-type": "text/plain"}, 415, ["application/json"], None),
    ("body over the size limit", "/v1/completions", b'{"prompt": "' + b"a" * (2 * 2**20) + b'"}', JSON, 413,
     ["--max-request-bytes"], None),
    ("unknown model", "/v1/completions", {"prompt": "hi", "model": "gpt-4"}, {}, 404, ["gpt-4"], "model"),
]
ACCEPTED = [  # odd but legal: accepted and completed
    ("seed 2**64-1 with n=4", {"prompt": "hi", "seed": 2**64 - 1, "n": 4, "temperature": 1, "max_tokens": 4}),
    ("seed -2**63", {"prompt": "hi", "seed": -2**63, "temperature": 1, "max_tokens": 4}),
    ("top_k 2**63 at temperature 1", {"prompt": "hi", "top_k": 2**63, "temperature": 1, "max_tokens": 4}),
    ("top_k 2**200", {"prompt": "hi", "top_k": 2**200, "temperature": 0.7, "max_tokens": 4}),
    ("temperature 1e-45", {"prompt": "hi", "temperature": 1e-45, "max_tokens": 8}),
    ("temperature 100", {"prompt": "hi", "temperature": 100, "max_tokens": 4}),
    ("null for every field that has a default", {"prompt": "hi", "max_tokens": 4, "temperature": None, "top_p": None,
                                                 "top_k": None, "min_p": None, "n": None, "stream": None, "echo": None,
                                                 "seed": None, "stop": None, "logprobs": None, "ignore_eos": None,
                                                 "presence_penalty": None, "repetition_penalty": None, "user": None}),
    ("repetition_penalty 0.01", {"prompt": "hi", "repetition_penalty": 0.01, "temperature": 0.5, "max_tokens": 4}),
    ("stop token id 2**40", {"prompt": "hi", "stop_token_ids": [2**40], "max_tokens": 4}),
    ("integers written with a fraction of zero (JSON Schema's integers)", {"prompt": [1, 2.0], "n": 2.0, "max_tokens": 4.0,
                                                                           "top_k": 5.0, "seed": 7.0, "temperature": 1}),
    ("response_format json_object", {"prompt": "hi", "response_format": {"type": "json_object"}, "max_tokens": 4}),
    ("a JSON schema of 2,000 required properties", {"prompt": "hi", "max_tokens": 4, "response_format": {
        "type": "json_schema", "json_schema": {"name": "wide", "schema": {
            "type": "object", "required": [f"p{i}" for i in range(2000)],
            "properties": {f"p{i}": {"type": "string", "maxLength": 20} for i in range(2000)}}}}}),
]


def send(server: Server, path: str, body, headers: dict) -> httpx.Response:
    h = {**server.headers, **headers}
    if isinstance(body, bytes): return httpx.post(server.url + path, content=body, headers=h, timeout=60)
    return httpx.post(server.url + path, json=body, headers=h, timeout=60)


@pytest.mark.parametrize("name, path, body, headers, status, words, param", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_request_is_refused_and_the_honest_stream_next_to_it_is_unchanged(
        server, honest_alone, name, path, body, headers, status, words, param):
    honest = HonestStream(server); honest.start()
    assert honest.started.wait(60)
    r = send(server, path, body, headers)
    assert r.status_code == status, r.text[:300]
    err = openai_error(r)
    for w in words: assert w in err["message"], (w, err["message"])
    if param is not None: assert err["param"] == param, err
    honest.join(120)
    assert honest.text == honest_alone
    server.wait_idle()
    health = httpx.get(server.url + "/health").json()
    assert health["running"] == 0 and health["waiting"] == 0 and health["free_pages"] == health["pages"]


@pytest.mark.parametrize("name, body", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_odd_but_legal_values_are_served_next_to_an_honest_stream(server, honest_alone, name, body):
    honest = HonestStream(server); honest.start()
    assert honest.started.wait(60)
    r = send(server, "/v1/completions", body, {})
    assert r.status_code == 200, r.text[:300]
    choices = r.json()["choices"]
    assert len(choices) == (body.get("n") or 1) and all(c["finish_reason"] in ("length", "stop") for c in choices)
    honest.join(120)
    assert honest.text == honest_alone


def test_a_vanishing_temperature_is_greedy(server):
    greedy = send(server, "/v1/completions", {"prompt": "hi", "temperature": 0, "max_tokens": 16, "ignore_eos": True}, {})
    tiny = send(server, "/v1/completions", {"prompt": "hi", "temperature": 1e-45, "max_tokens": 16, "ignore_eos": True,
                                            "seed": 1}, {})
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


def test_max_tokens_omitted_is_the_default(server):
    r = send(server, "/v1/completions", {"prompt": "hi", "temperature": 0, "ignore_eos": True}, {})
    assert r.json()["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize("method, path, status", [("GET", "/v1/completions", 405), ("DELETE", "/v1/models", 405),
                                                  ("GET", "/v1/nope", 404), ("POST", "/health", 405)])
def test_unknown_paths_and_wrong_methods_answer_in_openai_shape(server, method, path, status):
    r = httpx.request(method, server.url + path, headers=server.headers)
    assert r.status_code == status
    err = openai_error(r)
    assert path in err["message"]


def test_the_key_is_checked_before_anything_else(server):
    no_key = {"content-type": "application/json"}
    for path in ("/openapi.json", "/docs", "/redoc", "/v1/models", "/metrics"):
        r = httpx.get(server.url + path)
        assert r.status_code == 401, path
        assert openai_error(r)["code"] == "invalid_api_key"
    for path in ("/openapi.json", "/v1/models", "/metrics"):
        assert httpx.get(server.url + path, headers=server.headers).status_code == 200, path
    for path in ("/docs", "/redoc"):  # with a key the docs pages are off: a browser page could not send the key
        assert httpx.get(server.url + path, headers=server.headers).status_code == 404, path
    for body in (b"{broken", b'{"prompt": "hi", "temperature": -5}', b"\xff"):  # 401, not 400
        r = httpx.post(server.url + "/v1/completions", content=body, headers={**no_key, "authorization": "Bearer wrong"})
        assert r.status_code == 401
    r = httpx.post(server.url + "/v1/completions", content=b"a" * (2 * 2**20), headers=no_key)
    assert r.status_code == 401  # even a body past the limit: the key comes first
    assert httpx.get(server.url + "/health").status_code == 200  # /health stays open


def test_a_chunked_body_past_the_limit_is_refused_as_it_arrives(server):
    def chunks():  # no Content-Length: the edge counts what arrives
        for _ in range(3): yield b"a" * 2**19
    r = httpx.post(server.url + "/v1/completions", content=chunks(), headers={**server.headers, **JSON}, timeout=60)
    assert r.status_code == 413 and "--max-request-bytes" in openai_error(r)["message"]


def test_head_and_get_on_health_answer_without_a_key(server):
    assert httpx.head(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


@pytest.fixture(scope="module")
def tiny_llm(tiny_folder):
    from helios import LLM  # float32 pages: the 1 MiB pool holds 1,024 tokens, which the limits below are written for
    with LLM(tiny_folder, quiet=True, kv_cache_bytes=2**20, page_size=64, kv_cache_dtype="float32") as llm:
        yield llm


def in_process(llm, **settings):
    from fastapi.testclient import TestClient
    from helios.server.app import ServerSettings, create_app
    return TestClient(create_app(llm, ServerSettings("tiny", **settings)))


def test_a_stream_that_fails_ends_with_an_error_event_and_done(tiny_llm, monkeypatch):
    from helios.sampling import Completion
    real = Completion.append
    monkeypatch.setattr(Completion, "append", lambda self, t: (_ for _ in ()).throw(RuntimeError("injected"))
                        if self.params.seed == 13 else real(self, t))
    client = in_process(tiny_llm)
    lines = [line for line in client.post("/v1/completions", json={"prompt": "hi", "stream": True, "seed": 13,
                                                                   "temperature": 1}).iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and "injected" in json.loads(lines[-2][6:])["error"]["message"]
    ok = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}).json()  # the next request is served
    assert ok["usage"]["completion_tokens"] == 3 and tiny_llm.stats().num_used_pages == 0


def test_a_request_during_shutdown_is_a_503(tiny_folder):
    from helios import LLM
    with LLM(tiny_folder, quiet=True, kv_cache_bytes=2**20, page_size=64) as llm:
        client = in_process(llm)
        llm.engine.shutdown(0)
        r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert r.status_code == 503 and openai_error(r)["code"] == "server_shutting_down"


@pytest.mark.parametrize("key", ["kéy", "key ", ""])
def test_a_key_that_cannot_travel_in_a_header_is_refused_at_start(tiny_llm, key):
    from helios.server.app import ServerSettings, create_app
    with pytest.raises(ValueError, match="printable ASCII"):
        create_app(tiny_llm, ServerSettings("tiny", api_key=key))


def test_the_cheap_checks_come_before_tokenizing(tiny_llm, monkeypatch):
    "A request that fails a cheap check is refused without its (long) prompt ever reaching the tokenizer."
    client = in_process(tiny_llm)
    monkeypatch.setattr(tiny_llm.tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized"))
    monkeypatch.setattr(tiny_llm.tokenizer, "encode_chat", lambda *a, **k: pytest.fail("tokenized"))
    long = WORDS * 10_000
    for body, status in [({"model": "gpt-4"}, 404), ({"n": 17}, 400), ({"temperature": -1}, 400), ({"n": 65}, 400)]:
        assert client.post("/v1/completions", json={"prompt": long, **body}).status_code == status, body
        chat = {"messages": [{"role": "user", "content": long}], **body}
        assert client.post("/v1/chat/completions", json=chat).status_code == status, body


def test_a_conversation_too_long_without_max_tokens_says_so(tiny_llm):
    r = in_process(tiny_llm).post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a " * 1100}]})
    assert r.status_code == 400 and "conversation has" in openai_error(r)["message"] and "max_tokens" not in r.text


def test_the_server_binds_127_0_0_1_by_default(monkeypatch):
    from helios.cli import build_parser
    monkeypatch.delenv("HELIOS_HOST", raising=False)
    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"


def test_public_metrics_opens_metrics_only(tiny_folder):
    from fastapi.testclient import TestClient
    from helios import LLM
    from helios.server.app import ServerSettings, create_app
    with LLM(tiny_folder, quiet=True, kv_cache_bytes=2**20, page_size=64) as llm:
        client = TestClient(create_app(llm, ServerSettings("tiny", api_key="k", public_metrics=True)))
        assert client.get("/metrics").status_code == 200
        assert client.get("/v1/models").status_code == 401 and client.get("/openapi.json").status_code == 401


WORDS = "the quick brown fox jumps over a lazy dog and keeps running "
PROMPT_CHARS_LIMIT = 2048 * 81 * 4   # context x longest SmolLM2 token x slack (helios.server.app.prompt_chars_limit)
HEAVY = [  # (what, path, body, words of the expected 400, the slowest /health allowed in seconds)
    ("the longest text it tokenizes", "/v1/completions",
     {"prompt": (WORDS * (PROMPT_CHARS_LIMIT // len(WORDS) + 1))[:PROMPT_CHARS_LIMIT - 10]}, "exceed the model's context", 0.1),
    ("a chat as long", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": WORDS * 1000}] * 10}, "conversation has", 0.1),
    # the densest body there is: parsing it holds the GIL (~45 ms per MiB here; chapter 13, "The edge")
    ("half a million token ids, the last one bad", "/v1/completions", {"prompt": [7] * 520_000 + [-1]}, "greater than", 0.25),
]


@pytest.mark.parametrize("what, path, body, words, slowest", HEAVY, ids=[h[0] for h in HEAVY])
def test_health_answers_quickly_while_a_heavy_request_is_parsed_and_tokenized(server, what, path, body, words, slowest):
    "A request that costs the server seconds of work, sent while /health is polled every 10 ms."
    done, latencies = threading.Event(), []
    raw = json.dumps(body, separators=(",", ":")).encode()   # as dense as JSON gets: 2 bytes a token id
    assert len(raw) <= 2**20
    answer = {}
    def big():
        try:
            answer["r"] = httpx.post(server.url + path, headers={**server.headers, **JSON}, timeout=120, content=raw)
        finally:
            done.set()
    t = threading.Thread(target=big); t.start()
    with httpx.Client(base_url=server.url) as client:
        while not done.is_set():
            start = time.perf_counter()
            assert client.get("/health").status_code == 200
            latencies.append(time.perf_counter() - start)
            time.sleep(0.01)
    t.join()
    assert answer["r"].status_code == 400 and words in answer["r"].json()["error"]["message"], answer["r"].text[:200]
    print(f"/health during {what}: {len(latencies)} polls, median {1000 * statistics.median(latencies):.1f} ms, "
          f"max {1000 * max(latencies):.1f} ms")
    assert latencies and max(latencies) < slowest


def test_shutdown_ends_every_stream_with_abort_and_done(tiny_folder):
    s = Server("--model", str(tiny_folder), "--shutdown-grace-s", "0.5", "--max-batch-size", "8", api_key=None)
    long = {"prompt": "x", "max_tokens": 1800, "temperature": 0, "ignore_eos": True}
    streams, plain = [HonestStream(s, long) for _ in range(3)], {}
    def non_streaming(): plain["r"] = httpx.post(s.url + "/v1/completions", json=long, timeout=60)
    threads = [*streams, threading.Thread(target=non_streaming)]
    for t in threads: t.start()
    for st in streams: assert st.started.wait(60)
    s.proc.send_signal(signal.SIGTERM)
    for t in threads: t.join(60)
    assert s.proc.wait(60) == 0
    log = s.proc.stdout.read()
    for st in streams:
        assert st.lines[-1] == "data: [DONE]"
        assert json.loads(st.lines[-2][6:])["choices"][0]["finish_reason"] == "abort"
    assert plain["r"].status_code == 503 and openai_error(plain["r"])["code"] == "server_shutting_down"
    assert "Traceback" not in log and "Event loop is closed" not in log, log
