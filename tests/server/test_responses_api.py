"""OpenAI's Responses API (chapter 13a) against a real `helios serve`, through clients no one here wrote: the official
`openai` SDK (`responses.create`, `.stream`, `.parse`, `.retrieve`, `.delete`) and the OpenAI Agents SDK running a
tool-calling agent. A tiny random Qwen3 with a Qwen3-shaped template (tools, <think>): its free text is noise; a
required call and a JSON format are enforced by a grammar, so they always parse and validate."""
import asyncio
import json
import subprocess
import threading
from typing import Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from _server import API_KEY, Server

WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city",
           "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"], "properties": {
               "city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}}}}
TIME = {"type": "function", "name": "get_time", "description": "The time in a time zone",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["zone"], "properties": {
            "zone": {"enum": ["UTC", "CET", "PST"]}}}}
TOOLS = [WEATHER, TIME]
PARAMETERS = {t["name"]: t["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_TOKENS = 200


@pytest.fixture(scope="module")
def server(tiny_tools_folder):
    s = Server("--model", str(tiny_tools_folder), "--served-model-name", "tiny", "--page-size", "16",
               "--kv-cache-bytes", str(4 << 20), "--max-batch-size", "16")
    yield s
    assert s.stop() == 0


def calls(response) -> list:
    return [item for item in response.output if item.type == "function_call"]


def without(value, keys=("id", "call_id", "parsed", "parsed_arguments")):
    "A dumped value without the keys that differ between two runs of one request (ids) or between SDK types (parsed)."
    if isinstance(value, dict): return {k: without(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list): return [without(v, keys) for v in value]
    return value


def same_output(a, b) -> bool:
    "Two responses' output items agree in everything but their ids (the calls' ids are fresh for each call)."
    return without(a.model_dump()["output"]) == without(b.model_dump()["output"])


def test_plain_text_is_a_chat_completion(server):
    "The same conversation as a chat completion: the same prompt tokens, the same greedy text."
    c = server.client()
    r = c.responses.create(model="tiny", instructions="Be brief.", input="Say hello.", max_output_tokens=8, temperature=0)
    chat = c.chat.completions.create(model="tiny", temperature=0, max_tokens=8, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}])
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "tiny"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in r.output] == ["message"] and r.output[0].content[0].annotations == []
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == 8
    assert r.usage.total_tokens == r.usage.input_tokens + 8 and r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.instructions == "Be brief." and r.max_output_tokens == 8 and r.temperature == 0 and r.store is True


def test_a_required_call_is_a_function_call_item(server):
    for seed_text in ("Paris", "Tokyo"):
        r = server.client().responses.create(model="tiny", input=f"What is the weather in {seed_text}?", tools=TOOLS,
                                             tool_choice="required", temperature=0, max_output_tokens=MAX_TOKENS)
        assert r.status == "completed" and calls(r), r.output
        assert not [item for item in r.output if item.type == "message"]   # nothing but the calls: no raw tags as text
        for call in calls(r):
            assert call.call_id.startswith("call_") and call.id.startswith("fc_") and call.status == "completed"
            jsonschema.validate(json.loads(call.arguments), PARAMETERS[call.name])
        assert r.tools[0].name == "get_weather" and r.tool_choice == "required"


@pytest.mark.parametrize("name", ["get_weather", "get_time"])
def test_a_named_function_and_no_parallel_calls(server, name):
    r = server.client().responses.create(model="tiny", input=ASK, tools=TOOLS, temperature=0, max_output_tokens=MAX_TOKENS,
                                         tool_choice={"type": "function", "name": name}, parallel_tool_calls=False)
    assert [call.name for call in calls(r)] == [name] and r.parallel_tool_calls is False


def test_a_tool_round_trip_resent_or_continued_by_id(server):
    "The call's output sent back with the whole conversation, or with previous_response_id: the same prompt."
    c = server.client()
    first = c.responses.create(model="tiny", input=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                               temperature=0, max_output_tokens=MAX_TOKENS)
    call = calls(first)[0]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"temperature": 18})}
    resent = c.responses.create(model="tiny", input=ASK + [item.model_dump(exclude_none=True) for item in first.output]
                                + [result], tools=TOOLS, temperature=0, max_output_tokens=12)
    continued = c.responses.create(model="tiny", previous_response_id=first.id, input=[result], tools=TOOLS,
                                   temperature=0, max_output_tokens=12)
    assert continued.previous_response_id == first.id
    assert resent.usage.input_tokens == continued.usage.input_tokens > first.usage.input_tokens
    assert same_output(resent, continued)
    assert continued.usage.input_tokens_details.cached_tokens > 0   # the same prompt, found in the prefix cache
    # the call and its output are in the prompt where the template puts them (chat's /tokenize renders the same)
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": result["output"]}]
    counted = httpx.post(server.url + "/tokenize", headers=server.headers, json={
        "messages": history, "tools": [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                                       for t in TOOLS]}).json()
    assert counted["count"] == continued.usage.input_tokens


def test_a_json_schema_format_gives_valid_json(server):
    schema = {"type": "object", "additionalProperties": False, "required": ["city", "unit"], "properties": {
        "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}}}
    c = server.client()
    for fmt in ({"type": "json_schema", "name": "weather", "schema": schema, "strict": True}, {"type": "json_object"}):
        r = c.responses.create(model="tiny", input=ASK, text={"format": fmt}, temperature=0, max_output_tokens=MAX_TOKENS)
        value = json.loads(r.output_text)
        if fmt["type"] == "json_schema": jsonschema.validate(value, schema)
        assert isinstance(value, dict) and r.status == "completed" and r.text.format.type == fmt["type"]


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=12)
    unit: Literal["celsius", "fahrenheit"]


def test_parse_with_a_pydantic_model(server):
    r = server.client().responses.parse(model="tiny", input=ASK, text_format=Weather, temperature=0,
                                        max_output_tokens=MAX_TOKENS)
    assert isinstance(r.output_parsed, Weather) and len(r.output_parsed.city) <= 12


def events_of(server, **body) -> list[tuple[str, dict]]:
    "The raw SSE stream: (event line, data) pairs."
    with httpx.stream("POST", server.url + "/v1/responses", headers=server.headers, timeout=60,
                      json={"model": "tiny", "stream": True, **body}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


@pytest.mark.parametrize("extra", [dict(input="Say hello.", max_output_tokens=12),
                                   dict(input=ASK, tools=TOOLS, tool_choice="required", max_output_tokens=MAX_TOKENS)])
def test_a_stream_is_typed_events_that_make_the_whole_response(server, extra):
    events = events_of(server, temperature=0, **extra)
    kinds = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete") and "[DONE]" not in json.dumps(events)
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") >= 1
    final = events[-1][1]["response"]
    deltas = "".join(d["delta"] for name, d in events if name == "response.output_text.delta")
    assert deltas == "".join(p["text"] for item in final["output"] if item["type"] == "message" for p in item["content"])
    if "tools" in extra:
        assert "response.function_call_arguments.delta" in kinds and "response.output_text.delta" not in kinds
    # the SDK assembles the same response, and it equals the response of the same request made whole
    c = server.client()
    with c.responses.stream(model="tiny", temperature=0, **extra) as stream:
        sdk_events = list(stream)
        if sdk_events[-1].type == "response.completed": assert stream.get_final_response() == sdk_events[-1].response
    sdk_kinds, streamed = [event.type for event in sdk_events], sdk_events[-1].response
    whole = c.responses.create(model="tiny", temperature=0, **extra)
    assert streamed.status == whole.status == final["status"]
    assert sdk_kinds == kinds and same_output(streamed, whole) and streamed.usage == whole.usage
    assert streamed.output_text == whole.output_text


def test_get_and_delete(server):
    c = server.client()
    r = c.responses.create(model="tiny", input="hi", max_output_tokens=3, metadata={"run": "7"})
    got = c.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump() and got.metadata == {"run": "7"}
    c.responses.delete(r.id)
    for gone in (r.id, c.responses.create(model="tiny", input="hi", store=False, max_output_tokens=3).id, "resp_nope"):
        with pytest.raises(openai.NotFoundError) as e:
            c.responses.retrieve(gone)
        assert e.value.body["param"] == "response_id" and "store: false" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        c.responses.delete(r.id)
    with pytest.raises(openai.BadRequestError) as e:   # nor can it be continued
        c.responses.create(model="tiny", input="hi", previous_response_id=r.id)
    assert e.value.body["param"] == "previous_response_id"


BAD = [
    ({"input": "hi", "temprature": 0.5}, "temprature"),
    ({"input": "hi", "max_output_token": 5}, "max_output_token"),
    ({"input": [{"type": "computer_call", "id": "x"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x"}]}]}, "input[0].content"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": [{"type": "function_call_output", "output": "18"}]}, "input[0].call_id"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    ({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"type": "array"}}]}, "tools"),
    ({"input": "hi", "tools": [WEATHER, WEATHER]}, "tools"),
    ({"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "minProperties": "a"}}}},
     "text.format"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "max_output_tokens": 10**9}, "max_output_tokens"),
    ({"input": "hi", "temperature": -1}, "temperature"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "truncation": "auto"}, "truncation"),
    ({"input": "hi", "conversation": "conv_1"}, "conversation"),
    ({"input": "hi", "metadata": {"k": "v" * 600}}, "metadata.k"),
    ({"input": "hi", "previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"input": []}, "input"),
    ({}, None),
    ({"input": "hi", "model": "gpt-9"}, "model"),
]


@pytest.mark.parametrize("body,param", BAD)
def test_bad_input_is_a_4xx_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/responses", headers=server.headers, json=body, timeout=60)
    error = r.json()["error"]
    assert r.status_code == (404 if param == "model" else 400), (r.status_code, error)
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param, error
    if param is None: assert "input" in error["message"], error


def test_bad_requests_do_not_touch_a_neighbour(server):
    "Every bad body above, sent while an honest stream runs: the stream's text is what it is alone."
    c = server.client()
    alone = c.responses.create(model="tiny", input="Tell me a story.", temperature=0, max_output_tokens=48)
    result = {}

    def honest():
        with c.responses.stream(model="tiny", input="Tell me a story.", temperature=0, max_output_tokens=48) as s:
            result["response"] = list(s)[-1].response   # response.incomplete: cut at 48 tokens
    thread = threading.Thread(target=honest)
    thread.start()
    for body, _ in BAD * 2:
        assert httpx.post(server.url + "/v1/responses", headers=server.headers, json=body, timeout=60).status_code < 500
    thread.join(60)
    assert result["response"].output_text == alone.output_text
    server.wait_idle()


@pytest.fixture(scope="module")
def thinking_server(opens_think_folder):
    "The tools checkpoint with a template whose generation prompt opens a think block; a store of two responses."
    s = Server("--model", str(opens_think_folder), "--served-model-name", "tiny", "--kv-cache-bytes", str(4 << 20),
               "--responses-store-size", "2", "--responses-ttl-s", "600")
    yield s
    assert s.stop() == 0


def test_thinking_is_a_reasoning_item(thinking_server):
    c = thinking_server.client()
    r = c.responses.create(model="tiny", input=ASK, temperature=0, max_output_tokens=12, reasoning={"effort": "high"})
    reasoning = [item for item in r.output if item.type == "reasoning"]
    assert len(reasoning) == 1 and reasoning[0].content[0].type == "reasoning_text" and reasoning[0].content[0].text
    assert 0 < r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens == 12
    assert r.reasoning.effort == "high"
    # the reasoning item sent back is accepted, and the template (which drops past thinking) renders the same prompt
    chained = c.responses.create(model="tiny", previous_response_id=r.id, input="And tomorrow?", temperature=0,
                                 max_output_tokens=2, store=False)
    again = c.responses.create(model="tiny", input=ASK + [item.model_dump(exclude_none=True) for item in r.output]
                               + [{"role": "user", "content": "And tomorrow?"}], temperature=0, max_output_tokens=2,
                               store=False)
    events = events_of(thinking_server, input=ASK, temperature=0, max_output_tokens=12, store=False)
    streamed = "".join(d["delta"] for name, d in events if name == "response.reasoning_text.delta")
    assert streamed == reasoning[0].content[0].text
    assert again.usage.input_tokens == chained.usage.input_tokens
    # effort "none" turns the template's thinking off: the prompt closes an empty think block, no reasoning comes out
    off = c.responses.create(model="tiny", input=ASK, temperature=0, max_output_tokens=4, reasoning={"effort": "none"},
                             store=False)
    assert off.usage.input_tokens > r.usage.input_tokens


def test_the_store_keeps_the_newest_it_is_told_to(thinking_server):
    c = thinking_server.client()
    ids = [c.responses.create(model="tiny", input="hi", max_output_tokens=1).id for _ in range(3)]
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.retrieve(ids[0])
    assert "newest 2 responses" in e.value.body["message"] and "600 s" in e.value.body["message"]
    assert [c.responses.retrieve(i).id for i in ids[1:]] == ids[1:]


def test_help_shows_the_store_limits():
    out = subprocess.run(["helios", "serve", "--help"], capture_output=True, text=True, check=True).stdout
    flat = " ".join(out.split())
    assert "--responses-store-size" in flat and "(default: 1024)" in flat
    assert "--responses-ttl-s" in flat and "(default: 3600.0)" in flat


def test_the_store_flags_reach_the_route_adder():
    from helios.cli import build_parser, served_apis
    from helios.server.responses_api import add_responses_routes
    args = build_parser().parse_args(["serve", "--responses-store-size", "5", "--responses-ttl-s", "60"])
    (adder,) = [a for a in served_apis(args) if getattr(a, "func", None) is add_responses_routes]
    assert adder.keywords == {"store_size": 5, "ttl_s": 60.0}
    for flag, value in (("--responses-store-size", "-1"), ("--responses-ttl-s", "0")):
        r = subprocess.run(["helios", "serve", flag, value, "--model", "/no/such/model"], capture_output=True, text=True)
        assert r.returncode != 0 and flag in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_an_openai_agents_sdk_agent_loop(server):
    "The OpenAI Agents SDK on /v1/responses: a forced tool call, the tool run by the SDK, then a final answer."
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    ran = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Tokyo"]) -> str:
        "The current weather in a city."
        ran.append(city)
        return f"18 degrees in {city}"

    class Forecast(pydantic.BaseModel):   # the final answer, typed: text.format json_schema, held by the grammar
        sky: Literal["sunny", "cloudy", "rainy"]

    async def run():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY)
        model = agents.OpenAIResponsesModel(model="tiny", openai_client=client)
        # the first turn must call (the SDK sets tool_choice back to auto after a call); the second answers
        agent = agents.Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather], model=model,
                             output_type=Forecast,
                             model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=64))
        return await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=4)
    result = asyncio.run(run())
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"], kinds
    assert len(ran) == 1 and ran[0] in ("Paris", "Tokyo") and isinstance(result.final_output, Forecast)
    assert len(result.raw_responses) == 2 and all(r.response_id.startswith("resp_") for r in result.raw_responses)


junk = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**64), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=12), st.sampled_from(["\ud800", "caf\udfff"]), st.lists(st.integers(), max_size=2),
                 st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
maybe = lambda good: st.one_of(good, good, junk)   # mostly legal-looking, often junk
parts = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "input_image", "text"]),
                                        "text": maybe(st.text(max_size=20))}), max_size=2)
items = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer", "assistant", "tool"]),
                           "content": st.one_of(st.text(max_size=20), parts, junk)}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": maybe(st.just("call_1")),
                           "name": st.sampled_from(["get_weather", "bad name"]), "arguments": maybe(st.just("{}"))}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": st.just("call_1"),
                           "output": st.one_of(st.text(max_size=10), parts, junk)}),
    st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "web_search_call", "item_reference"]),
                           "summary": maybe(st.just([]))}), junk), max_size=4)
responses_bodies = st.fixed_dictionaries(
    {"input": st.one_of(st.text(max_size=20), items, junk), "max_output_tokens": maybe(st.sampled_from([1, 3, 6]))},
    optional={"instructions": maybe(st.text(max_size=10)), "temperature": maybe(st.floats(0, 2)),
              "top_p": maybe(st.floats(0, 1)), "stream": st.booleans(), "store": maybe(st.booleans()),
              "tools": maybe(st.lists(st.fixed_dictionaries({"type": st.sampled_from(["function", "file_search"]),
                                                             "name": st.sampled_from(["get_weather", "f", ""])},
                                                            optional={"parameters": maybe(st.just({"type": "object"}))}),
                                      max_size=2)),
              "tool_choice": maybe(st.one_of(st.sampled_from(["auto", "none", "required", "any"]),
                                             st.fixed_dictionaries({"type": st.just("function"),
                                                                    "name": st.sampled_from(["get_weather", "g"])}))),
              "text": maybe(st.fixed_dictionaries({"format": maybe(st.fixed_dictionaries(
                  {"type": st.sampled_from(["text", "json_object", "json_schema"])},
                  optional={"name": st.just("x"), "schema": maybe(st.just({"type": "object"}))}))})),
              "previous_response_id": maybe(st.just("resp_x")), "reasoning": maybe(st.just({"effort": "low"})),
              "metadata": maybe(st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2))})


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=responses_bodies)
def test_generated_bodies_are_served_or_refused_in_openais_shape(server, body):
    r = httpx.post(server.url + "/v1/responses", content=json.dumps(body).encode(), timeout=60,
                   headers={**server.headers, "content-type": "application/json"})
    assert r.status_code < 500, r.text[:500]
    if r.status_code >= 400:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    elif body.get("stream") is True:
        assert r.text.rstrip().split("\n\n")[-1].startswith("event: response.")
    else:
        assert r.json()["status"] in ("completed", "incomplete")


def test_the_server_is_idle_afterwards(server):
    server.wait_idle()
