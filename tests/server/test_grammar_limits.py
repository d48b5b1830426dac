"""Grammars the library cannot follow are refused at the door; one that still fails mid-request ends that request
alone, as the request's error; the wrong field of a tool call is named; the limits are written down (issue 45).

A real `helios serve` (tiny random Qwen3 with Qwen3-style tool tags on SmolLM2's tokenizer) on 127.0.0.1 for the
door; an in-process app over the same checkpoint for a grammar made to fail inside the engine."""
import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from _server import Server

HI = [{"role": "user", "content": "hi"}]
WIDE = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(10_000)}}
CYCLIC = {"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}},
          "$ref": "#/$defs/a"}
NEIGHBOUR = {"prompt": "A long and honest answer:", "max_tokens": 48, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_tools_folder):
    s = Server("--model", str(tiny_tools_folder), "--served-model-name", "tiny", "--page-size", "64",
               "--kv-cache-bytes", str(8 << 20))
    yield s
    assert s.stop() == 0


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


def tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=server.headers, timeout=120)


class Neighbour(threading.Thread):
    "A greedy streaming completion on its own thread: `.text` once joined, and whether it ended with [DONE]."
    def __init__(self, server: Server):
        super().__init__()
        self.server, self.started, self.lines = server, threading.Event(), []

    def run(self):
        with httpx.stream("POST", self.server.url + "/v1/completions", headers=self.server.headers, timeout=120,
                          json={**NEIGHBOUR, "stream": True}) as r:
            for line in r.iter_lines():
                if line: self.lines.append(line); self.started.set()
        self.started.set()

    @property
    def text(self) -> str:
        assert self.lines[-1] == "data: [DONE]", self.lines[-3:]
        chunks = [json.loads(line[6:]) for line in self.lines[:-1]]
        assert all("error" not in c for c in chunks), chunks[-1]
        return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


@pytest.fixture(scope="module")
def neighbour_alone(server) -> str:
    n = Neighbour(server); n.start(); n.join(120)
    return n.text


REFUSED = [  # (name, path, body, param, words in the message)
    ("10,000 properties, chat", "/v1/chat/completions",
     {"messages": HI, "max_tokens": 8, "response_format": schema_format(WIDE)}, "response_format",
     ["response_format.json_schema.schema.properties has 10,000 optional properties", "at most 256"]),
    ("10,000 properties, completions", "/v1/completions",
     {"prompt": "hi", "max_tokens": 8, "response_format": schema_format(WIDE)}, "response_format",
     ["10,000 optional properties", "at most 256"]),
    ("cyclic $ref, chat", "/v1/chat/completions",
     {"messages": HI, "max_tokens": 8, "response_format": schema_format(CYCLIC)}, "response_format",
     ["response_format.json_schema.schema", "'#/$defs/a' can never end"]),
    ("cyclic $ref, completions", "/v1/completions",
     {"prompt": "hi", "max_tokens": 8, "response_format": schema_format(CYCLIC)}, "response_format", ["can never end"]),
    ("tool of 10,000 properties, required", "/v1/chat/completions",
     {"messages": HI, "max_tokens": 8, "tools": [tool(WIDE)], "tool_choice": "required"}, "tools",
     ["tools[0].function.parameters.properties has 10,000 optional properties", "at most 256"]),
    ("tool with a cyclic $ref, required", "/v1/chat/completions",
     {"messages": HI, "max_tokens": 8, "tools": [tool(CYCLIC)], "tool_choice": "required"}, "tools",
     ["tools[0].function.parameters", "can never end"]),
    ("tool arguments an object", "/v1/chat/completions",
     {"messages": [*HI, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
         "name": "f", "arguments": {"city": "Paris"}}}]}, {"role": "tool", "tool_call_id": "c", "content": "18 C"}]},
     "messages[1].tool_calls[0].function.arguments", ["must be a string of JSON"]),
    ("tool function a string", "/v1/chat/completions",
     {"messages": [*HI, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": "f"}]}]},
     "messages[1].tool_calls[0].function", ["must be an object"]),
]


@pytest.mark.parametrize("name, path, body, param, words", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_at_the_door_naming_the_part_while_a_neighbour_streams(server, neighbour_alone, name, path, body,
                                                                       param, words):
    neighbour = Neighbour(server); neighbour.start()
    assert neighbour.started.wait(60)
    started = time.perf_counter()
    r = post(server, path, body)
    assert time.perf_counter() - started < 5, "refused in a few seconds, before any compile of the whole"
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    for w in words: assert w in error["message"], (w, error["message"])
    assert "content is required" not in error["message"]
    neighbour.join(120)
    assert neighbour.text == neighbour_alone
    server.wait_idle()


def test_a_body_nested_too_deeply_is_refused_with_the_limit(server):
    from helios.server.errors import MAX_JSON_DEPTH
    levels = MAX_JSON_DEPTH + 1
    raw = b'{"prompt": "hi", "logit_bias": {"1": ' + b"[" * (levels - 1) + b"]" * (levels - 1) + b"}}"
    r = httpx.post(server.url + "/v1/completions", content=raw, timeout=60,
                   headers={**server.headers, "content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "nested deeper than this server accepts" in error["message"] and f"at most {MAX_JSON_DEPTH}" in error["message"]
    assert error["code"] == "body_too_deep"


def test_grammars_within_the_limits_are_still_served(server):
    within = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(256)}}
    listed = {"$defs": {"node": {"type": "object", "required": ["v"], "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 9}, "next": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"}
    for schema in (within, listed):
        r = post(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 8, "response_format": schema_format(schema)})
        assert r.status_code == 200, r.text[:300]
        assert r.json()["choices"][0]["message"]["content"].startswith("{")


# --- a grammar that fails inside the engine: its request ends alone, as the request's own error

@pytest.fixture(scope="module")
def tiny_llm(tiny_tools_folder):
    from helios import LLM
    with LLM(tiny_tools_folder, quiet=True, kv_cache_bytes=4 << 20, page_size=64) as llm:
        yield llm


class RaisingLibraryMatcher:
    "Stands for llguidance's matcher when its consume raises instead of refusing."
    def consume_token(self, token_id): raise RuntimeError("injected: the library raised")
    def is_error(self): return False


@pytest.fixture
def consume_raises(monkeypatch):
    """The matchers the engine compiles at submit take each token through a library whose consume raises (the
    door's check, which compiles its own, is untouched); free text is untouched too."""
    from helios.structured import GrammarMatcher, TokenGrammars
    real = TokenGrammars.matchers

    def matchers(self, grammar, n, param="grammar"):
        made = real(self, grammar, n, param)
        for m in made: m.accept = lambda token_id: GrammarMatcher(RaisingLibraryMatcher()).accept(token_id)
        return made
    monkeypatch.setattr(TokenGrammars, "matchers", matchers)


def test_in_the_engine_only_the_failing_request_ends_and_with_its_grammar(tiny_llm, consume_raises):
    from helios import SamplingParams
    from helios.engine import EngineError
    from helios.structured import is_grammar_failure, json_object_grammar
    ids = tiny_llm.tokenizer.encode("hi")
    free = tiny_llm.submit(ids, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    constrained = tiny_llm.submit(ids, SamplingParams(max_tokens=24, grammar=json_object_grammar()))
    with pytest.raises(EngineError): constrained.result()
    assert is_grammar_failure(constrained.error) and "injected" in constrained.error
    assert len(free.result().outputs[0].token_ids) == 24
    stats = tiny_llm.stats()
    assert stats.num_requests_failed >= 1 and stats.num_used_pages == 0


def test_over_http_it_is_a_400_grammar_failed_or_an_error_event_and_the_next_request_is_served(tiny_llm, consume_raises):
    from fastapi.testclient import TestClient
    from helios.server.app import ServerSettings, create_app
    client = TestClient(create_app(tiny_llm, ServerSettings("tiny")))
    body = {"messages": HI, "max_tokens": 16, "response_format": {"type": "json_object"}}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "grammar_failed", "response_format")
    assert "grammar library" in error["message"] and "injected" in error["message"]
    forced = client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 16, "tools": [tool({"type": "object"})],
                                                       "tool_choice": "required"})
    assert forced.status_code == 400 and forced.json()["error"]["param"] == "tools"
    lines = [line for line in client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 16, "stream": True,
                                                                   "response_format": {"type": "json_object"}}).iter_lines()
             if line]
    assert lines[-1] == "data: [DONE]"
    event = json.loads(lines[-2][6:])["error"]
    assert (event["type"], event["code"], event["param"]) == ("invalid_request_error", "grammar_failed", "response_format")
    free = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 5, "ignore_eos": True}).json()
    assert free["usage"]["completion_tokens"] == 5 and tiny_llm.stats().num_used_pages == 0


# --- the limits, written down once

def test_the_limits_table_in_chapter_13_is_the_generated_one():
    from helios.server.app import limits_table, server_limits
    nb = json.loads((Path(__file__).parents[2] / "nbs" / "13_server.ipynb").read_text())
    written = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert limits_table() in written, "regenerate chapter 13's table from limits_table()"
    for name in ("--max-request-bytes", "MAX_JSON_DEPTH", "MAX_TOOLS", "MAX_OPTIONAL_PROPERTIES", "MAX_SCHEMA_PROPERTIES",
                 "MAX_STOP_STRINGS", "MAX_N", "MAX_LOGPROBS", "prompt_chars_limit", "Engine.check_fits", "--max-queue",
                 "MAX_JSON_NODES", "PROBE_STEPS"):
        assert any(limit.name == name for limit in server_limits()), name


def test_serve_help_lists_every_limit():
    from helios.cli import build_parser
    from helios.server.app import server_limits
    serve = next(a for a in build_parser()._subparsers._group_actions[0].choices.values() if a.prog.endswith("serve"))
    text = re.sub(r"\s+", " ", serve.format_help())
    for limit in server_limits():
        assert f"{limit.what}: {limit.value} [{limit.name}]" in text, limit
