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


@pytest.mark.parametrize("value", [3.0, True, "3"])
def test_integers_are_json_integers(value):
    assert CompletionRequest.model_validate_json(json.dumps({"prompt": "x", "seed": 3})).seed == 3
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
