"""Generated requests against a real server: each is served, or refused with a 4xx in OpenAI's shape; never a 5xx, never a hang.

Two generators: hypothesis bodies built from the request models' fields, each filled with a legal value or with
junk (huge integers, NaN and Infinity, lone surrogates, wrong types); and schemathesis over `/openapi.json`.
Both are bounded (a few dozen examples per endpoint) so that the run takes a few minutes.
"""
import json
from collections import Counter

import httpx
import pytest
import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, given, settings, strategies as st
from schemathesis.checks import not_a_server_error

from _server import Server

ERROR_FIELDS = {"message", "type", "param", "code"}
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def server(tiny_tools_folder):
    # a template that renders tools, so generated tools reach the grammar; a KV budget of 512 tokens (1 KiB each):
    # a chat without max_tokens gets what is left of it, so examples stay short
    s = Server("--model", str(tiny_tools_folder), "--served-model-name", "tiny", "--max-queue", "64",
               "--kv-cache-bytes", str(512 * 1024), "--page-size", "64")
    yield s
    assert s.stop() == 0


def assert_well_formed(r: httpx.Response, stream: bool):
    "A 2xx with choices (or a stream ending in [DONE]), or a 4xx whose body is OpenAI's error object."
    assert r.status_code < 500, r.text[:500]
    if r.status_code >= 400:
        body = r.json()
        assert set(body) == {"error"} and set(body["error"]) == ERROR_FIELDS, body
        return
    if stream:
        lines = [line for line in r.text.splitlines() if line]
        assert lines[-1] == "data: [DONE]", lines[-3:]
        events = [json.loads(line[6:]) for line in lines[:-1]]
        assert not any("error" in e for e in events), events
    else:
        assert r.json()["choices"], r.text[:300]


surrogates = st.sampled_from(["\ud800", "caf\udfff", "a\udbff\udc00b\ud834"])
texts = st.one_of(st.text(max_size=30), surrogates)
ints = st.one_of(st.integers(-3, 40), st.sampled_from([2**31, 2**63, 2**64, 2**64 - 1, -2**63 - 1, -2**63, 10**30]))
floats = st.one_of(st.sampled_from([0.0, 1e-45, 1e-6, 0.3, 1.0, 2.0, -1.0, 1e30]),
                   st.floats(allow_nan=True, allow_infinity=True))
junk = st.one_of(st.none(), st.booleans(), ints, floats, texts, st.lists(ints, max_size=3),
                 st.dictionaries(texts, ints, max_size=2))
maybe = lambda good: st.one_of(good, good, junk)   # mostly legal-looking, often junk
small_max_tokens = st.one_of(st.sampled_from([1, 3, 6]), junk.filter(lambda v: v is not None))

SAMPLING = {
    "temperature": maybe(floats), "top_p": maybe(floats), "top_k": maybe(ints), "min_p": maybe(floats),
    "presence_penalty": maybe(floats), "frequency_penalty": maybe(floats), "repetition_penalty": maybe(floats),
    "seed": maybe(ints), "n": maybe(st.integers(1, 3)), "stop": maybe(st.one_of(texts, st.lists(texts, max_size=20))),
    "stop_token_ids": maybe(st.lists(ints, max_size=3)), "ignore_eos": maybe(st.booleans()),
    "logit_bias": maybe(st.dictionaries(st.one_of(st.integers(-2, 50000).map(str), texts), floats, max_size=3)),
    "stream": st.booleans(), "stream_options": maybe(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "user": maybe(texts), "model": st.sampled_from(["tiny", "gpt-4", None]),
}
schemas = st.sampled_from([{}, {"type": "object"}, {"type": "objekt"}, {"enum": ["a", "b"]}, {"type": "string", "maxLength": 3},
                           {"$ref": "#/nowhere"}, {"type": "array", "minItems": 3, "maxItems": 1}])
formats = st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema", "grammar"])}),
                    st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
                        {"name": st.sampled_from(["x", "a b", ""]), "schema": maybe(schemas)})}))
token_ids = st.lists(st.one_of(st.integers(0, 49151), ints), min_size=0, max_size=6)
completion_bodies = st.fixed_dictionaries(
    {"prompt": st.one_of(texts, st.lists(texts, max_size=3), token_ids, st.lists(token_ids, max_size=2), junk),
     "max_tokens": small_max_tokens},
    optional={**SAMPLING, "echo": maybe(st.booleans()), "logprobs": maybe(st.integers(0, 25)),
              "response_format": maybe(formats), "timings": maybe(st.booleans())})
parts = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "input_audio"]),
                                        "text": maybe(texts)}), max_size=3)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant", "tool",
                                                                     "wizard"]),
                                           "content": st.one_of(texts, parts, junk)}), max_size=3)
functions = st.fixed_dictionaries({"type": st.sampled_from(["function", "retrieval"]), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["f", "get_weather", "bad name", ""])}, optional={"parameters": maybe(schemas)})})
tool_choices = st.one_of(st.sampled_from(["none", "auto", "required", "any"]),
                         st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
                             {"name": st.sampled_from(["f", "g"])})}))
chat_bodies = st.fixed_dictionaries(
    {"messages": st.one_of(messages, junk), "max_tokens": small_max_tokens},
    optional={**SAMPLING, "logprobs": maybe(st.booleans()), "top_logprobs": maybe(st.integers(0, 25)),
              "max_completion_tokens": small_max_tokens, "response_format": maybe(formats),
              "tools": maybe(st.lists(functions, max_size=2)), "tool_choice": maybe(tool_choices),
              "parallel_tool_calls": maybe(st.booleans()), "timings": maybe(st.booleans()),
              "chat_template_kwargs": maybe(st.dictionaries(st.sampled_from(["enable_thinking", "messages", "1x"]), junk,
                                                            max_size=2))})


def post(server: Server, path: str, body: dict) -> httpx.Response:
    raw = json.dumps(body).encode()   # NaN/Infinity as Python writes them, surrogates as \\ud800 escapes
    return httpx.post(server.url + path, content=raw, timeout=60,
                      headers={**server.headers, "content-type": "application/json"})


@FUZZ
@given(body=completion_bodies)
def test_generated_completion_bodies(server, body):
    assert_well_formed(post(server, "/v1/completions", body), stream=body.get("stream") is True)


@FUZZ
@given(body=chat_bodies)
def test_generated_chat_bodies(server, body):
    assert_well_formed(post(server, "/v1/chat/completions", body), stream=body.get("stream") is True)


def test_the_server_is_idle_after_the_fuzzing(server):
    server.wait_idle()
    health = httpx.get(server.url + "/health").json()
    assert health["running"] == 0 and health["waiting"] == 0 and health["free_pages"] == health["pages"]


def schema_cases(server: Server):
    "(operation label, hypothesis strategy of its cases) for every operation, valid and invalid data alike."
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json", headers=server.headers)
    for result in schema.get_all_operations():
        operation = result.ok()
        invalid = (GenerationMode.NEGATIVE,) if operation.method.upper() == "POST" else ()  # a GET has nothing to break
        for mode in (GenerationMode.POSITIVE, *invalid):
            yield f"{operation.label} ({mode.value})", operation.as_strategy(generation_mode=mode)


def test_schemathesis_finds_no_server_error(server):
    statuses: dict[str, Counter] = {}
    for label, cases in schema_cases(server):
        seen = statuses.setdefault(label, Counter())
        @settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
        @given(case=cases)
        def run(case):
            response = case.call(headers=server.headers, timeout=60)
            seen[response.status_code] += 1
            case.validate_response(response, checks=[not_a_server_error])
            if response.status_code >= 400:
                body = response.json()
                assert set(body) == {"error"} and set(body["error"]) == ERROR_FIELDS, (label, body)
        run()
    print("schemathesis:", {label: dict(c) for label, c in statuses.items()})
    posts = {label: c for label, c in statuses.items() if label.startswith("POST")}
    assert len(posts) == 10 and all(sum(n for status, n in c.items() if status >= 400) for c in posts.values()), statuses
    assert all(c[200] for label, c in posts.items() if "positive" in label), statuses  # valid data is served
