"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through the official `anthropic` SDK, against a
real `helios serve` on a tiny random Qwen3 with a tools-and-thinking template (the one tests/server/test_http_tools.py
serves). The model's text is noise; a forced tool call is enforced by a grammar, so it always parses and validates."""
import json
import threading

import anthropic
import httpx
import jsonschema
import pytest

from _server import API_KEY, Server

WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "input_schema": {"type": "object", "additionalProperties": False, "required": ["city", "unit"], "properties": {
               "city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}}}}
TIME = {"name": "get_time", "description": "The time in a time zone",
        "input_schema": {"type": "object", "additionalProperties": False, "required": ["zone"], "properties": {
            "zone": {"enum": ["UTC", "CET", "PST"]}}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"extra_body": {"temperature": 0}}   # today's SDK has no temperature argument; the API takes the field
NO_THINKING = {"type": "disabled"}


@pytest.fixture(scope="module")
def server(tiny_tools_folder):
    s = Server("--model", str(tiny_tools_folder), "--served-model-name", "tiny", "--page-size", "64",
               "--kv-cache-bytes", str(4 << 20), "--max-batch-size", "16")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0)


def counted(claude, **kwargs) -> int:
    return claude.messages.count_tokens(model="tiny", **kwargs).input_tokens


def prompt_tokens(message) -> int:
    return message.usage.input_tokens + message.usage.cache_read_input_tokens


def without_ids(message) -> list[dict]:
    "The content blocks, less the tool_use ids (each call gets a new one)."
    return [{k: v for k, v in b.model_dump(exclude_none=True).items() if k != "id"} for b in message.content]


def test_a_plain_message(claude):
    r = claude.messages.create(model="tiny", max_tokens=8, messages=ASK, system="Be terse.", thinking=NO_THINKING,
                               metadata={"user_id": "u1"}, **GREEDY)
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant" and r.model == "tiny"
    assert [b.type for b in r.content] == ["text"] and r.content[0].text
    assert r.stop_reason in ("max_tokens", "end_turn") and r.stop_sequence is None and 0 < r.usage.output_tokens <= 8
    assert r.usage.cache_creation_input_tokens == 0
    assert prompt_tokens(r) == counted(claude, messages=ASK, system="Be terse.", thinking=NO_THINKING)


def test_the_same_prompt_and_text_as_chat_completions(server, claude):
    "One engine path: the Messages request renders to the chat completion's prompt and generates its greedy text."
    r = claude.messages.create(model="tiny", max_tokens=10, messages=ASK, system=[{"type": "text", "text": "Hi."}],
                               thinking=NO_THINKING, **GREEDY)
    chat = server.client().chat.completions.create(
        model="tiny", max_tokens=10, temperature=0, messages=[{"role": "system", "content": "Hi."}, *ASK],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert prompt_tokens(r) == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens
    assert r.content[0].text == chat.choices[0].message.content


def assert_valid_uses(message, names=tuple(SCHEMAS)) -> list:
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses and message.stop_reason == "tool_use", message
    for use in uses:
        assert use.id.startswith("toolu_") and use.name in names and isinstance(use.input, dict), use
        jsonschema.validate(use.input, SCHEMAS[use.name])
    return uses


def test_any_tool_then_a_tool_result_round_trip(claude):
    first = claude.messages.create(model="tiny", max_tokens=200, messages=ASK, tools=TOOLS,
                                   tool_choice={"type": "any", "disable_parallel_tool_use": True}, **GREEDY)
    [use] = assert_valid_uses(first)
    assert not [b for b in first.content if b.type == "text"]   # nothing but the call: no raw <tool_call> text
    result = lambda text: [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": text}]}]
    history = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]}]
    final = claude.messages.create(model="tiny", max_tokens=6, messages=history + result("18 C"), tools=TOOLS, **GREEDY)
    assert final.stop_reason in ("max_tokens", "end_turn", "tool_use")
    assert prompt_tokens(final) == counted(claude, messages=history + result("18 C"), tools=TOOLS)
    longer = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "is_error": True,
                                            "content": [{"type": "text", "text": "18 C and a long report"}]}]}]
    assert counted(claude, messages=history + longer, tools=TOOLS) > prompt_tokens(final)  # the result is rendered


def test_a_named_tool_is_the_one_called(claude):
    for seed_text in ("Paris", "Rome"):
        r = claude.messages.create(model="tiny", max_tokens=200, tools=TOOLS, tool_choice={"type": "tool", "name": "get_time"},
                                   messages=[{"role": "user", "content": f"Time in {seed_text}?"}])
        assert_valid_uses(r, names=("get_time",))


def test_tool_choice_none_renders_no_tools(claude):
    assert counted(claude, messages=ASK, tools=TOOLS, tool_choice={"type": "none"}) == counted(claude, messages=ASK)
    assert counted(claude, messages=ASK, tools=TOOLS) > counted(claude, messages=ASK)


def test_stop_sequences(claude):
    args = dict(model="tiny", max_tokens=16, messages=ASK, thinking=NO_THINKING, **GREEDY)
    text = claude.messages.create(**args).content[0].text
    at = next(i for i in range(3, len(text) - 3) if text[i:i + 3].strip() and text.find(text[i:i + 3]) == i)
    stop = text[at:at + 3]
    r = claude.messages.create(stop_sequences=["never written", stop], **args)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop and r.content[0].text == text[:at]
    with claude.messages.stream(stop_sequences=[stop], **args) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "stop_sequence" and streamed.stop_sequence == stop and without_ids(streamed) == without_ids(r)


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_a_stream_gives_the_message_of_a_whole_answer(claude, tools):
    args = dict(model="tiny", max_tokens=200 if tools else 12, messages=ASK, thinking=NO_THINKING, **GREEDY,
                **({"tools": tools, "tool_choice": {"type": "any"}} if tools else {}))
    whole = claude.messages.create(**args)
    with claude.messages.stream(**args) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert without_ids(streamed) == without_ids(whole) and streamed.stop_reason == whole.stop_reason
    assert streamed.usage.output_tokens == whole.usage.output_tokens and prompt_tokens(streamed) == prompt_tokens(whole)
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert ("input_json" in kinds) == bool(tools) and ("text" in kinds) != bool(tools)
    if tools: assert_valid_uses(streamed)


def sse_events(server, body: dict) -> list[tuple[str, dict]]:
    with httpx.stream("POST", server.url + "/v1/messages", json={**body, "stream": True}, timeout=60,
                      headers={"x-api-key": API_KEY}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    names, datas = lines[0::2], lines[1::2]
    assert all(n.startswith("event: ") for n in names) and all(d.startswith("data: ") for d in datas), lines
    return [(n[7:], json.loads(d[6:])) for n, d in zip(names, datas)]


def test_the_events_in_order(server):
    events = sse_events(server, {"model": "tiny", "max_tokens": 200, "messages": ASK, "tools": TOOLS, "temperature": 0,
                                 "tool_choice": {"type": "any"}})
    names = [n for n, _ in events]
    assert all(data["type"] == name for name, data in events)
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    blocks = names[2:-2]
    assert blocks and len(blocks) % 3 == 0 and blocks == ["content_block_start", "content_block_delta", "content_block_stop"] * (len(blocks) // 3)
    starts = [data for name, data in events if name == "content_block_start"]
    assert [s["index"] for s in starts] == list(range(len(starts)))
    assert all(s["content_block"]["type"] == "tool_use" and s["content_block"]["input"] == {} for s in starts)
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert all(d["type"] == "input_json_delta" and isinstance(json.loads(d["partial_json"]), dict) for d in deltas)
    start, end = events[0][1]["message"], events[-2][1]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    assert end["delta"]["stop_reason"] == "tool_use" and end["usage"]["output_tokens"] > 0


def test_count_tokens_is_the_rendered_prompt(server, claude):
    history = ASK + [{"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                                       {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                        "input": {"city": "Paris", "unit": "celsius"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}]}]
    as_chat = ASK + [{"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather",
                                                           "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"}]
    functions = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                   "parameters": t["input_schema"]}} for t in TOOLS]
    tokenized = httpx.post(server.url + "/tokenize", headers=server.headers,
                           json={"messages": as_chat, "tools": functions}).json()
    assert counted(claude, messages=history, tools=TOOLS) == tokenized["count"]
    # thinking reaches the template's enable_thinking: disabled renders an empty think block
    assert counted(claude, messages=ASK, thinking=NO_THINKING) > counted(claude, messages=ASK)
    assert counted(claude, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024}) == counted(claude, messages=ASK)


def test_the_key_as_x_api_key_or_bearer(server, claude):
    body = {"model": "tiny", "max_tokens": 1, "messages": ASK}
    for headers in ({"x-api-key": API_KEY}, {"Authorization": f"Bearer {API_KEY}"}):
        assert httpx.post(server.url + "/v1/messages", json=body, headers=headers, timeout=60).status_code == 200
    assert httpx.get(server.url + "/v1/models", headers={"x-api-key": API_KEY}).status_code == 200
    wrong = anthropic.Anthropic(base_url=server.url, api_key="wrong-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.create(model="tiny", max_tokens=1, messages=ASK)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "authentication_error"
    assert "x-api-key" in e.value.body["error"]["message"]
    openai_shape = httpx.get(server.url + "/v1/models", headers={"x-api-key": "wrong-key"}).json()
    assert openai_shape["error"]["code"] == "invalid_api_key"   # OpenAI's paths keep OpenAI's shape


BAD = [  # (what the SDK call adds, what the message names)
    ({"extra_body": {"max_token": 8}}, "max_token"),
    ({"extra_body": {"stop_sequence": ["x"]}}, "stop_sequence"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}]},
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "18 C"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "1"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "colour": "red"}]}]},
     "messages[0].content[0].colour"),
    ({"messages": [{"role": "system", "content": "hi"}]}, "messages[0].role"),
    ({"messages": ASK + [{"role": "assistant", "content": "The weather is"}]}, "last message"),
    ({"messages": []}, "messages"),
    ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_tide"}}, "get_tide"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tools": [{"name": "f", "input_schema": {"type": "objekt"}}]}, "tools"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"stop_sequences": [""]}, "stop_sequences[0]"),
    ({"thinking": {"type": "enabled"}}, "budget_tokens"),
    ({"extra_body": {"temperature": -1}}, "temperature"),
    ({"extra_body": {"top_k": "5"}}, "top_k"),
]


@pytest.mark.parametrize("extra,named", BAD, ids=[named for _, named in BAD])
def test_bad_input_is_a_400_in_anthropic_shape_naming_the_field(claude, extra, named):
    args = {"model": "tiny", "max_tokens": 8, "messages": ASK, **extra}
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(**args)
    body = e.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert named in body["error"]["message"], body


def test_missing_max_tokens_and_wrong_model(server, claude):
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": API_KEY}, json={"model": "tiny", "messages": ASK})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("max_tokens: Field required")
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=ASK)
    assert e.value.body["error"]["type"] == "not_found_error" and "'tiny'" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.count_tokens(model="tiny", messages=ASK, extra_body={"max_tokens": 8})
    assert "max_tokens" in e.value.body["error"]["message"]


def test_the_edge_refuses_in_anthropic_shape(server):
    url, key = server.url + "/v1/messages", {"x-api-key": API_KEY}
    cases = [(httpx.post(url, headers=key, content=b"{not json"), 400, "invalid_request_error"),
             (httpx.post(url, headers={**key, "content-type": "text/plain"}, content=b"{}"), 415, "invalid_request_error"),
             (httpx.post(url, headers=key, content=b"{" + b" " * (2 << 20) + b"}"), 413, "request_too_large"),
             (httpx.post(url, content=b"{}"), 401, "authentication_error"),
             (httpx.get(url, headers=key), 405, "invalid_request_error"),
             (httpx.post(url + "/nothing", headers=key, json={}), 404, "not_found_error")]
    for r, status, kind in cases:
        assert r.status_code == status and r.json()["type"] == "error" and r.json()["error"]["type"] == kind, r.text


def test_bad_requests_never_fail_a_neighbour(server, claude):
    "A stream runs while malformed bodies arrive on the same path; it ends with its message_stop."
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("events", sse_events(
        server, {"model": "tiny", "max_tokens": 48, "messages": ASK, "temperature": 0})))
    thread.start()
    for body in (b"[]", b'{"model": "tiny"}', b"\xff\xfe", json.dumps({"model": "tiny", "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]}).encode()):
        r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": API_KEY}, content=body)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    thread.join(60)
    assert result["events"][-1][0] == "message_stop"
    server.wait_idle()


@pytest.fixture(scope="module")
def thinking_server(opens_think_folder):
    "The tools checkpoint with a template whose generation prompt opens a think block: the answer starts as thinking."
    s = Server("--model", str(opens_think_folder), "--served-model-name", "tiny", "--kv-cache-bytes", str(4 << 20))
    yield s
    assert s.stop() == 0


def test_thinking_blocks_whole_and_streamed(thinking_server):
    claude = anthropic.Anthropic(base_url=thinking_server.url, api_key=API_KEY, max_retries=0)
    args = dict(model="tiny", max_tokens=12, messages=ASK, **GREEDY)
    whole = claude.messages.create(**args)
    assert whole.content[0].type == "thinking" and whole.content[0].thinking and whole.content[0].signature == ""
    with claude.messages.stream(**args) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert "thinking" in kinds and without_ids(streamed) == without_ids(whole)
    # a thinking block sent back with the conversation is accepted, and not rendered
    back = ASK + [{"role": "assistant", "content": [whole.content[0].model_dump(), {"type": "text", "text": "Sunny."}]},
                  {"role": "user", "content": "Thanks"}]
    plain = ASK + [{"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks"}]
    assert claude.messages.count_tokens(model="tiny", messages=back).input_tokens == \
        claude.messages.count_tokens(model="tiny", messages=plain).input_tokens


def test_pydantic_ai_extracts_a_typed_object(server):
    "A framework on the Anthropic SDK, unchanged: pydantic-ai's tool output forces a call, which the grammar makes valid."
    from typing import Literal

    from pydantic import BaseModel, Field
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    class Weather(BaseModel):
        city: str = Field(max_length=16)
        unit: Literal["celsius", "fahrenheit"]
        degrees: int

    model = AnthropicModel("tiny", provider=AnthropicProvider(base_url=server.url, api_key=API_KEY))
    agent = Agent(model, output_type=Weather, instructions="Report the weather.")
    result = agent.run_sync("It is 18 degrees Celsius in Paris.", model_settings={"max_tokens": 200})
    print(result.output, result.usage)
    assert isinstance(result.output, Weather) and len(result.output.city) <= 16


def test_structured_output_through_messages_parse(claude):
    "output_config.format (the SDK's messages.parse) is enforced by the same grammar as chat's response_format."
    from typing import Literal

    from pydantic import BaseModel

    class Weather(BaseModel):   # bounded fields: the SDK moves a string's maxLength into its description
        unit: Literal["celsius", "fahrenheit"]
        sunny: bool

    r = claude.messages.parse(model="tiny", max_tokens=200, messages=ASK, output_format=Weather, thinking=NO_THINKING)
    assert isinstance(r.parsed_output, Weather) and r.stop_reason == "end_turn", r
    with pytest.raises(anthropic.BadRequestError) as e:   # a forced call and a format both fix the answer's form
        claude.messages.create(model="tiny", max_tokens=8, messages=ASK, tools=TOOLS, tool_choice={"type": "any"},
                               output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}})
    assert e.value.body["error"]["type"] == "invalid_request_error"
