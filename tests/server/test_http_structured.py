"""Structured output over HTTP: response_format json_object and json_schema, through the openai client, against a
real `helios serve` on a tiny random Qwen3 whose free text is noise. Whatever the model would say, every answer
parses and validates against its schema, because the grammar decides which tokens it may pick."""
import json
import threading

import httpx
import jsonschema
import openai
import pytest

from _server import Server

SCHEMAS = {
    "nested objects": {"type": "object", "additionalProperties": False, "required": ["user"], "properties": {
        "user": {"type": "object", "additionalProperties": False, "required": ["name", "age"], "properties": {
            "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}}}},
    "enums": {"type": "object", "additionalProperties": False, "required": ["color", "size"], "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "size": {"type": "string", "enum": ["S", "M", "L"]}}},
    "arrays with bounds": {"type": "object", "additionalProperties": False, "required": ["tags"], "properties": {
        "tags": {"type": "array", "minItems": 2, "maxItems": 4, "items": {"type": "string", "maxLength": 8}}}},
    "required and optional fields": {"type": "object", "additionalProperties": False, "required": ["ok", "count"],
                                     "properties": {"ok": {"type": "boolean"},
                                                    "note": {"type": ["string", "null"], "maxLength": 10},
                                                    "count": {"type": "integer", "minimum": -5, "maximum": 5}}},
}
MESSAGES = [{"role": "user", "content": "Describe a user as JSON."}]
MAX_TOKENS = 160   # far more than any of these schemas needs: the grammar ends each answer


@pytest.fixture(scope="module")
def server(tiny_folder):
    s = Server("--model", str(tiny_folder), "--served-model-name", "tiny", "--page-size", "64",
               "--kv-cache-bytes", str(4 << 20), "--max-batch-size", "16")
    yield s
    assert s.stop() == 0


def schema_format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name.replace(" ", "_"), "schema": SCHEMAS[name],
                                                   "strict": True}}


def assert_valid(text: str, schema: dict):
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_chat_answer_follows_its_schema(server, name):
    c = server.client()
    for seed in (1, 2):
        r = c.chat.completions.create(model="tiny", messages=MESSAGES, response_format=schema_format(name), n=3,
                                      temperature=1.0, seed=seed, max_tokens=MAX_TOKENS)
        for choice in r.choices:
            assert choice.finish_reason == "stop", choice
            assert_valid(choice.message.content, SCHEMAS[name])


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_completion_follows_its_schema(server, name):
    r = server.client().completions.create(model="tiny", prompt="JSON:", n=3, temperature=1.0, seed=5,
                                           max_tokens=MAX_TOKENS, extra_body={"response_format": schema_format(name)})
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice
        assert_valid(choice.text, SCHEMAS[name])


def test_json_object_is_an_object(server):
    r = server.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=MAX_TOKENS, n=4,
                                                temperature=1.0, seed=3, response_format={"type": "json_object"})
    finished = [ch for ch in r.choices if ch.finish_reason == "stop"]
    assert finished, r.choices
    for ch in finished: assert isinstance(json.loads(ch.message.content), dict)
    for ch in r.choices:   # one that ran out of tokens is still the start of an object
        assert ch.message.content.startswith("{"), ch.message.content


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_streaming_gives_the_same_answer(server, chat):
    c, fmt = server.client(), schema_format("nested objects")
    if chat:
        args = dict(model="tiny", messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS, response_format=fmt)
        whole = c.chat.completions.create(**args).choices[0]
        chunks = list(c.chat.completions.create(stream=True, **args))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert (text, chunks[-1].choices[0].finish_reason) == (whole.message.content, whole.finish_reason)
    else:
        args = dict(model="tiny", prompt="JSON:", temperature=0, max_tokens=MAX_TOKENS, extra_body={"response_format": fmt})
        whole = c.completions.create(**args).choices[0]
        chunks = list(c.completions.create(stream=True, **args))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        assert (text, chunks[-1].choices[0].finish_reason) == (whole.text, whole.finish_reason)
    assert_valid(text, SCHEMAS["nested objects"])


def test_a_constrained_and_a_free_request_share_ticks(server):
    c = server.client()
    free = dict(model="tiny", prompt="Once upon a time", temperature=0, max_tokens=48, extra_body={"ignore_eos": True})
    alone = c.completions.create(**free).choices[0].text
    rows_before = server.metric("helios:constrained_rows_total")
    results = {}
    def run(name, fn): results[name] = fn()
    threads = [threading.Thread(target=run, args=("free", lambda: c.completions.create(**free))),
               threading.Thread(target=run, args=("json", lambda: c.chat.completions.create(
                   model="tiny", messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS,
                   response_format=schema_format("arrays with bounds"))))]
    for t in threads: t.start()
    for t in threads: t.join(120)
    assert results["free"].choices[0].text == alone and results["free"].choices[0].finish_reason == "length"
    assert_valid(results["json"].choices[0].message.content, SCHEMAS["arrays with bounds"])
    assert server.metric("helios:constrained_rows_total") > rows_before
    assert server.metric("helios:grammar_mask_seconds_total") > 0
    server.wait_idle()


BAD_FORMATS = [
    ("a type the schema language lacks", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
     "response_format", []),
    ("a reference to nothing", {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}, "response_format", []),
    ("an unsupported response_format type", {"type": "grammar"}, "response_format.type", ["json_schema"]),
    ("json_schema without its schema", {"type": "json_schema", "json_schema": {"name": "x"}},
     "response_format.json_schema.schema", ["required"]),
    ("a schema name with a space", {"type": "json_schema", "json_schema": {"name": "my schema", "schema": {}}},
     "response_format.json_schema.name", ["pattern"]),
]


@pytest.mark.parametrize("name, fmt, param, words", BAD_FORMATS, ids=[b[0] for b in BAD_FORMATS])
def test_a_format_that_cannot_be_enforced_is_a_400(server, name, fmt, param, words):
    for path, body in [("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions", {"prompt": "hi"})]:
        r = httpx.post(server.url + path, headers=server.headers, json={**body, "response_format": fmt}, timeout=60)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", error
        for w in words: assert w in error["message"], error
    with pytest.raises(openai.BadRequestError):   # as the openai client sees it
        server.client().chat.completions.create(model="tiny", messages=MESSAGES, response_format=fmt)
