"""The server's request models: the ranges its OpenAPI spec documents are exactly the ranges SamplingParams enforces."""
import json
import math

import pytest
from pydantic import ValidationError

from helios.sampling import InvalidParam, SamplingParams
from helios.server.errors import APIError, validation_error
from helios.server.protocol import ChatCompletionRequest, CompletionRequest, parse_body

FIELDS = ["temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
          "seed", "n", "logprobs"]


def documented_range(field: str) -> dict:
    prop = CompletionRequest.model_json_schema()["properties"][field]
    members = prop.get("anyOf", [prop])
    return next(m for m in members if m.get("type") in ("number", "integer"))


def accepted(field: str, value) -> bool:
    try:
        SamplingParams(**{field: value})
        return True
    except InvalidParam as e:
        assert e.param == field
        return False


@pytest.mark.parametrize("field", FIELDS)
def test_the_documented_range_is_the_enforced_range(field):
    r = documented_range(field)
    step = 1 if r["type"] == "integer" else 1e-9
    if "minimum" in r: assert accepted(field, r["minimum"]) and not accepted(field, r["minimum"] - step)
    if "exclusiveMinimum" in r:
        assert not accepted(field, r["exclusiveMinimum"]) and accepted(field, r["exclusiveMinimum"] + step)
    if "maximum" in r: assert accepted(field, r["maximum"]) and not accepted(field, r["maximum"] + step)
    else: assert accepted(field, 10**30 if r["type"] == "integer" else 1e30)  # no upper bound documented: none enforced
    assert any(k in r for k in ("minimum", "exclusiveMinimum", "maximum"))


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens", ["greater than or equal to 1", "got 0"]),
    ({"prompt": "x", "n": True}, "n", ["valid integer, got True"]),
    ({"prompt": "x", "top_k": 2.5}, "top_k", ["valid integer, got 2.5"]),
    ({"prompt": "x", "temperature": math.inf}, "temperature", ["finite"]),
    ({"prompt": ["a", 5]}, "prompt[1]", ["valid string"]),
    ({"prompt": [[1, 2], [3, -4]]}, "prompt[1][1]", ["greater than or equal to 0"]),
    ({"prompt": "x", "stop": ["a"] * 17}, "stop", ["at most 16"]),
])
def test_a_refusal_names_the_field_as_a_user_writes_it(body, param, words):
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate(body)
    error = validation_error(info.value.errors())
    assert error.status == 400 and error.param == param, error.message
    for w in words: assert w in error.message, error.message


@pytest.mark.parametrize("value", [3.5, True, "3", float("inf"), float("nan")])
def test_integers_are_json_integers(value):
    "3 and 3.0 are the integer 3 (JSON Schema's rule, and what a client holding doubles sends); nothing else is."
    for three in (3, 3.0, 3e0):
        seed = CompletionRequest.model_validate_json(json.dumps({"prompt": "x", "seed": three})).seed
        assert seed == 3 and type(seed) is int
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate_json(json.dumps({"prompt": "x", "seed": value}))


def test_chat_content_is_text_only_and_developer_is_system():
    chat = ChatCompletionRequest.model_validate({"messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "Hello."}]})
    assert [m.for_template() for m in chat.messages] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello."}]
    for content in ([{"type": "image_url", "image_url": {"url": "x"}}], [{"type": "text"}], [{"type": "text", "text": 5}],
                    None, ["just a string in a list"]):
        with pytest.raises(ValidationError):
            ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": content}]})


@pytest.mark.parametrize("raw, words", [
    (rb'{"prompt": "caf\ud800"}', ["surrogate pair"]), (rb'{"prompt": ["a", "\udfff"]}', ["surrogate pair"]),
    (b'{"prompt": "\xff\xfe"}', ["UTF-8"]), (b"", ["body is empty"]),
    (b'{"prompt": ' + b"[" * 40_000 + b"]" * 40_000 + b"}", ["at most 32,768"]),
])
def test_what_the_parser_refuses_is_said_plainly(raw, words):
    with pytest.raises(APIError) as info:
        parse_body(CompletionRequest, raw)
    assert info.value.status == 400 and all(w in info.value.message for w in words), info.value.message


CHAT = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def refusal(model, body: dict):
    "The 400 a body gets at the boundary, as the server parses it."
    with pytest.raises(APIError) as info:
        parse_body(model, json.dumps(body).encode())
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize("fmt", [{"type": "text"}, {"type": "json_object"},
                                 {"type": "json_schema", "json_schema": {"name": "answer", "strict": True,
                                                                         "schema": {"type": "object"}}}])
def test_response_formats_on_chat_and_completions(fmt):
    chat = parse_body(ChatCompletionRequest, json.dumps({**CHAT, "response_format": fmt}).encode())
    completion = parse_body(CompletionRequest, json.dumps({"prompt": "x", "response_format": fmt}).encode())
    assert chat.response_format == completion.response_format and chat.response_format.type == fmt["type"]
    if fmt["type"] == "json_schema": assert chat.response_format.json_schema.json_schema == {"type": "object"}


@pytest.mark.parametrize("fmt, param, words", [
    ({"type": "grammar"}, "response_format.type", ["'text', 'json_object' or 'json_schema'", "got 'grammar'"]),
    ({"type": "json_schema"}, "response_format", ["needs a json_schema object"]),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema", ["required"]),
    ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}, "response_format.json_schema.name",
     ["pattern"]),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}, "response_format.json_schema.schema",
     ["an object"]),
])
def test_a_response_format_the_server_cannot_honour_is_refused(fmt, param, words):
    error = refusal(CompletionRequest, {"prompt": "x", "response_format": fmt})
    assert error.param == param and all(w in error.message for w in words), error.message


def test_tools_and_a_named_tool_choice():
    chat = parse_body(ChatCompletionRequest, json.dumps({**CHAT, "tools": [WEATHER], "parallel_tool_calls": False,
                                                         "tool_choice": {"type": "function",
                                                                         "function": {"name": "get_weather"}}}).encode())
    assert chat.forces_tool_call and chat.tool_choice.function.name == "get_weather"
    assert chat.rendered_tools == [WEATHER]
    for choice, forced in [("none", False), ("auto", False), ("required", True)]:
        body = ChatCompletionRequest.model_validate({**CHAT, "tools": [WEATHER], "tool_choice": choice})
        assert body.forces_tool_call == forced
        assert body.rendered_tools == (None if choice == "none" else [WEATHER])   # "none": the model never sees them


@pytest.mark.parametrize("extra, param, words", [
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name", ["required"]),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name", ["pattern"]),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type", ["'function'"]),
    ({"tools": [WEATHER, WEATHER]}, "tools", ["'get_weather' appears more than once"]),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice",
     ["'get_time'", "not among the tools", "'get_weather'"]),
    ({"tool_choice": "required"}, "tool_choice", ["needs tools"]),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", ["'none', 'auto' or 'required'"]),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, None, ["send one"]),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", ["may not set 'messages'"]),
    ({"chat_template_kwargs": {"enable-thinking": False}}, "chat_template_kwargs", ["not a template variable name"]),
    ({"chat_template_kwargs": {f"k{i}": i for i in range(33)}}, "chat_template_kwargs", ["at most 32"]),
    ({"parallel_tool_calls": 1}, "parallel_tool_calls", ["valid boolean"]),
    ({"timings": "yes"}, "timings", ["valid boolean"]),
])
def test_tool_and_template_fields_are_checked(extra, param, words):
    error = refusal(ChatCompletionRequest, {**CHAT, **extra})
    assert error.param == param and all(w in error.message for w in words), error.message


def test_a_conversation_with_tool_calls_and_their_results():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    chat = ChatCompletionRequest.model_validate({"tools": [WEATHER], "messages": [
        CHAT["messages"][0], {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]})
    assert [m.for_template() for m in chat.messages][1:] == [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1"}]


@pytest.mark.parametrize("message, param, words", [
    ({"role": "tool", "content": "18 C"}, "messages[0]", ["tool_call_id"]),
    ({"role": "assistant"}, "messages[0].content", ["content is required"]),
    ({"role": "user", "content": "hi", "tool_calls": [{"id": "c", "type": "function",
                                                        "function": {"name": "f", "arguments": "{}"}}]},
     "messages[0]", ["only assistant messages"]),
])
def test_tool_messages_are_checked(message, param, words):
    error = refusal(ChatCompletionRequest, {"messages": [message]})
    assert error.param == param and all(w in error.message for w in words), error.message


def test_tokenize_takes_a_prompt_or_messages_and_detokenize_token_ids():
    from helios.server.protocol import DetokenizeRequest, TokenizeRequest
    assert parse_body(TokenizeRequest, b'{"prompt": "hi"}').prompt == "hi"
    chat = parse_body(TokenizeRequest, json.dumps({**CHAT, "tools": [WEATHER],
                                                   "chat_template_kwargs": {"enable_thinking": False}}).encode())
    assert chat.messages[0].content == CHAT["messages"][0]["content"]
    for body, words in [({}, ["either prompt"]), ({"prompt": "hi", **CHAT}, ["not both"]),
                        ({"prompt": "hi", "tools": [WEATHER]}, ["go with messages"]), ({"messages": []}, ["empty"])]:
        assert all(w in refusal(TokenizeRequest, body).message for w in words)
    assert parse_body(DetokenizeRequest, b'{"tokens": [1, 2]}').tokens == [1, 2]
    assert refusal(DetokenizeRequest, {"tokens": [1, -2]}).param == "tokens[1]"


def test_the_new_request_models_are_in_the_openapi_spec():
    schema = ChatCompletionRequest.model_json_schema()
    assert {"response_format", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
            "timings"} <= set(schema["properties"])
    assert "schema" in schema["$defs"]["JSONSchemaFormat"]["properties"]   # the alias, as clients spell it
    assert schema["$defs"]["FunctionDefinition"]["properties"]["name"]["pattern"] == "^[a-zA-Z0-9_-]{1,64}$"


def test_chat_output_is_the_same_whole_and_streamed():
    from helios.server.chat import ChatDeltas, ChatShape, finish_reason
    answer = ('<think>\nweather, so get_weather\n</think>\n\nLooking it up.\n<tool_call>\n'
              '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
              '{"name": "get_time", "arguments": {}}\n</tool_call>')
    shape = ChatShape(reasoning=True, tools=True)
    message, called = shape.message(answer)
    assert message["reasoning_content"] == "weather, so get_weather" and message["content"].strip() == "Looking it up."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]
    for size in (1, 3, 7):
        stream = ChatDeltas(shape)
        deltas = [stream.feed(answer[i:i + size]) for i in range(0, len(answer), size)] + [stream.finish()]
        assert "".join(d.get("content", "") for d in deltas) == message["content"]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
        calls = [c for d in deltas for c in d.get("tool_calls", ())]
        assert [c["index"] for c in calls] == [0, 1] and [c["function"] for c in calls] == [
            c["function"] for c in message["tool_calls"]]
    assert finish_reason("stop", called) == "tool_calls" and finish_reason("length", True) == "length"
    plain, called = ChatShape(reasoning=False, tools=False).message(answer)    # a template without either: text as is
    assert plain == {"role": "assistant", "content": answer} and not called


def test_timings_and_reports_as_json():
    from typing import NamedTuple
    from helios.engine import RequestMetrics
    from helios.server.chat import as_json, timings_json
    m = RequestMetrics(arrival_s=10.0, num_prompt_tokens=5, first_scheduled_s=10.5, first_token_s=11.0, finished_s=13.0,
                       num_cached_tokens=2, num_output_tokens=5)
    t = timings_json(m)
    assert (t["queue_s"], t["prefill_s"], t["ttft_s"], t["decode_s"], t["e2e_s"]) == (0.5, 0.5, 1.0, 2.0, 3.0)
    assert t["decode_tokens_per_s"] == 2.0 and (t["cached_tokens"], t["prompt_tokens"], t["completion_tokens"]) == (2, 5, 5)

    class Block(NamedTuple):
        hash: str
        hits: int
    assert as_json({"blocks": [Block("ab", 1)], "pair": (1, 2)}) == {"blocks": [{"hash": "ab", "hits": 1}], "pair": [1, 2]}


@pytest.mark.parametrize("arguments", ["[1]", "", "not json", "[" * 100_000])
def test_replayed_arguments_need_not_be_a_json_object(arguments):
    "Models sometimes write arguments that do not parse; clients replay them, and OpenAI takes them back as they are."
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "assistant", "tool_calls": [call]}]})
    assert body.messages[0].tool_calls[0].function.arguments == arguments


@pytest.mark.parametrize("function, param, words", [
    ({"name": "get_weather", "arguments": {"city": "Paris"}}, "messages[1].tool_calls[0].function.arguments",
     ["must be a string of JSON", "'city'"]),
    ("get_weather", "messages[1].tool_calls[0].function", ["must be an object", "'get_weather'"]),
])
def test_a_tool_call_in_the_history_names_its_wrong_field(function, param, words):
    call = {"id": "call_1", "type": "function", "function": function}
    for content in (None, "calling"):
        error = refusal(ChatCompletionRequest, {"messages": [CHAT["messages"][0], {
            "role": "assistant", "content": content, "tool_calls": [call]}]})
        assert error.param == param and error.message.startswith(f"{param}: "), error.message
        assert all(w in error.message for w in words) and "content" not in error.message, error.message


def test_a_body_nested_too_deeply_says_so_with_the_limit():
    from helios.server.errors import MAX_JSON_DEPTH
    def nested(levels):   # arrays and objects inside the top-level object: chat_template_kwargs, then arrays
        return json.dumps(CHAT)[:-1].encode() + b', "chat_template_kwargs": {"k": ' + b"[" * (levels - 1) + b"]" * (levels - 1) + b"}}"
    parse_body(ChatCompletionRequest, nested(MAX_JSON_DEPTH))
    with pytest.raises(APIError) as e: parse_body(ChatCompletionRequest, nested(MAX_JSON_DEPTH + 1))
    assert e.value.status == 400 and e.value.code == "body_too_deep"
    assert "nested deeper than this server accepts" in e.value.message and f"at most {MAX_JSON_DEPTH}" in e.value.message
    assert "not valid JSON" not in e.value.message
