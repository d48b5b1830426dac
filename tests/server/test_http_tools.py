"""Tool calls and reasoning over HTTP, through the openai client, against a real `helios serve` on a tiny random
Qwen3 with a template in the shape of Qwen3's (tools in the system turn, Hermes <tool_call> blocks, <think>).
The model's free text is noise; a required or named call is enforced by a grammar, so it always parses and its
arguments always validate against the function's parameters."""
import json

import httpx
import jsonschema
import pytest

from _server import Server

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"], "properties": {
        "city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["zone"], "properties": {
        "zone": {"enum": ["UTC", "CET", "PST"]}}}}}
TOOLS = [WEATHER, TIME]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_TOKENS = 200


@pytest.fixture(scope="module")
def server(tiny_tools_folder):
    s = Server("--model", str(tiny_tools_folder), "--served-model-name", "tiny", "--page-size", "64",
               "--kv-cache-bytes", str(4 << 20), "--max-batch-size", "16")
    yield s
    assert s.stop() == 0


def assert_valid_calls(message, names=PARAMETERS):
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in names, call
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


def test_a_required_call_always_parses_and_validates(server):
    c = server.client()
    for seed in (1, 2, 3):
        r = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", n=3,
                                      temperature=1.0, seed=seed, max_tokens=MAX_TOKENS)
        for choice in r.choices:
            assert choice.finish_reason == "tool_calls", choice
            assert choice.message.content is None, choice.message   # nothing but the calls: no raw <tool_call> text
            assert_valid_calls(choice.message)


def test_one_call_unless_parallel_calls_are_allowed(server):
    r = server.client().chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                                parallel_tool_calls=False, n=4, temperature=1.0, seed=4,
                                                max_tokens=MAX_TOKENS)
    for choice in r.choices:
        assert len(choice.message.tool_calls) == 1 and choice.finish_reason == "tool_calls"
        assert_valid_calls(choice.message)


@pytest.mark.parametrize("name", ["get_weather", "get_time"])
def test_a_named_function_is_the_one_called(server, name):
    r = server.client().chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, n=3, temperature=1.0,
                                                seed=7, max_tokens=MAX_TOKENS,
                                                tool_choice={"type": "function", "function": {"name": name}})
    for choice in r.choices:
        assert_valid_calls(choice.message, names={name})


def calls_of(message) -> list[tuple[str, str]]:
    return [(call.function.name, call.function.arguments) for call in message.tool_calls or ()]


def test_streaming_gives_the_same_calls(server):
    c = server.client()
    args = dict(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=MAX_TOKENS)
    whole = c.chat.completions.create(**args).choices[0]
    chunks = list(c.chat.completions.create(stream=True, **args))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    streamed = [(t.function.name, t.function.arguments) for d in deltas for t in d.tool_calls or ()]
    indexes = [t.index for d in deltas for t in d.tool_calls or ()]
    assert streamed == calls_of(whole.message) and indexes == list(range(len(streamed)))
    assert not "".join(d.content or "" for d in deltas)   # no raw <tool_call> text leaks into content
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason == "tool_calls"


def test_a_tool_call_round_trip(server):
    "Request with tools, the model calls one, the client runs it and sends the result back, the model answers."
    c = server.client()
    first = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                      parallel_tool_calls=False, temperature=0, max_tokens=MAX_TOKENS)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18})}]
    final = c.chat.completions.create(model="tiny", messages=history, tools=TOOLS, temperature=0, max_tokens=12,
                                      extra_body={"ignore_eos": True})
    assert final.choices[0].finish_reason in ("length", "tool_calls") and final.usage.completion_tokens == 12
    counted = httpx.post(server.url + "/tokenize", headers=server.headers,
                         json={"messages": history, "tools": TOOLS}).json()
    assert counted["count"] == final.usage.prompt_tokens   # the tool message and the call are in the prompt
    rendered = httpx.post(server.url + "/detokenize", headers=server.headers, json={"tokens": counted["tokens"]}).json()
    assert "<tool_response>" in rendered["prompt"] and call.function.arguments in rendered["prompt"]


def test_tool_choice_none_renders_no_tools(server):
    c = server.client()
    with_tools = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=4, temperature=0)
    without = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=4,
                                        temperature=0)
    plain = c.chat.completions.create(model="tiny", messages=ASK, max_tokens=4, temperature=0)
    assert without.usage.prompt_tokens == plain.usage.prompt_tokens < with_tools.usage.prompt_tokens
    assert without.choices[0].message.tool_calls is None


def test_tokenize_renders_no_tools_under_tool_choice_none(server):
    counted = httpx.post(server.url + "/tokenize", headers=server.headers,
                         json={"messages": ASK, "tools": TOOLS, "tool_choice": "none"}).json()
    chat = server.client().chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="none",
                                                   max_tokens=1, temperature=0)
    assert counted["count"] == chat.usage.prompt_tokens


def test_enable_thinking_false_through_chat_template_kwargs(server):
    "As vLLM takes it: `chat_template_kwargs` in the body (extra_body for the openai client) reaches the template."
    c = server.client()
    ask = lambda **extra: c.chat.completions.create(model="tiny", messages=ASK, max_tokens=1, temperature=0, **extra)
    think, no_think = ask(), ask(extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    counted = httpx.post(server.url + "/tokenize", headers=server.headers,
                         json={"messages": ASK, "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert no_think.usage.prompt_tokens == counted["count"] > think.usage.prompt_tokens  # + the empty think block
    rendered = httpx.post(server.url + "/detokenize", headers=server.headers, json={"tokens": counted["tokens"]}).json()
    assert rendered["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.fixture(scope="module")
def thinking_server(opens_think_folder):
    "The tools checkpoint with a template whose generation prompt opens a think block (as thinking-only models do)."
    s = Server("--model", str(opens_think_folder), "--served-model-name", "tiny", "--kv-cache-bytes", str(4 << 20))
    yield s
    assert s.stop() == 0


def test_a_grammar_answer_is_content_after_a_prompt_that_opens_a_think_block(thinking_server):
    "The grammar fixes the answer from its first token: nothing of it is reasoning, though the prompt opened <think>."
    c = thinking_server.client()
    schema = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"],
              "additionalProperties": False}
    r = c.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=MAX_TOKENS,
                                  response_format={"type": "json_schema", "json_schema": {"name": "u", "schema": schema}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    assert getattr(r.choices[0].message, "reasoning_content", None) is None
    r = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0,
                                  max_tokens=MAX_TOKENS)
    assert r.choices[0].finish_reason == "tool_calls"
    assert_valid_calls(r.choices[0].message)


def test_auto_is_free_text_parsed(server):
    "With tool_choice auto the noise the tiny model writes is content (it never happens to write a call)."
    r = server.client().chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, temperature=0, max_tokens=16,
                                                extra_body={"ignore_eos": True})
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and message.tool_calls is None and message.content
    assert "<tool_call>" not in message.content


def raw_and_chat(server, messages, seed: int, bias: dict, max_tokens: int = 24, **extra):
    "The raw completion of a chat's prompt (from /tokenize) and the chat completion itself, sampled alike."
    ids = httpx.post(server.url + "/tokenize", headers=server.headers, json={"messages": messages, **extra}).json()["tokens"]
    sampling = dict(temperature=1.0, seed=seed, max_tokens=max_tokens, logit_bias=bias)
    raw = server.client().completions.create(model="tiny", prompt=ids, **sampling).choices[0].text
    body = {"messages": messages, **sampling, **extra}
    chat = httpx.post(server.url + "/v1/chat/completions", headers=server.headers, json=body, timeout=60).json()
    stream = httpx.post(server.url + "/v1/chat/completions", headers=server.headers, json={**body, "stream": True},
                        timeout=60).text
    return raw, chat["choices"][0]["message"], stream


def test_reasoning_is_split_from_the_answer(server):
    """The tags made likely by logit_bias (the model's logits are peaked: it takes a large bias), then a seed whose
    raw text opens a think block, closes it, and has text on both sides; the chat splits it there."""
    ids = httpx.post(server.url + "/tokenize", headers=server.headers, json={"prompt": "<think></think>",
                                                                              "add_special_tokens": False}).json()["tokens"]
    assert len(ids) == 2   # both tags are single tokens of this vocabulary
    bias = {str(ids[0]): 14.0, str(ids[1]): 12.0}
    for seed in range(40):
        raw, message, stream = raw_and_chat(server, ASK, seed, bias, max_tokens=16)
        before, tag, after = raw.partition("</think>")
        thought = before.removeprefix("<think>")
        if tag and before.startswith("<think>") and thought.strip() and after.strip(): break
    else:
        pytest.fail("no seed gave a think block with text after it")
    print(f"seed {seed}: {raw!r}")
    assert message["reasoning_content"].strip() == thought.strip() and message["content"].strip() == after.strip()
    events = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content", "") for d in deltas) == message["content"]


def test_no_reasoning_field_for_a_template_without_thinking(tiny_folder):
    s = Server("--model", str(tiny_folder), "--served-model-name", "tiny", "--kv-cache-bytes", str(1 << 20),
               "--page-size", "64")
    try:
        r = httpx.post(s.url + "/v1/chat/completions", headers=s.headers, timeout=60,
                       json={"messages": ASK, "max_tokens": 4}).json()
        assert "reasoning_content" not in r["choices"][0]["message"]
        refused = httpx.post(s.url + "/v1/chat/completions", headers=s.headers, timeout=60,
                             json={"messages": ASK, "tools": TOOLS})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools"
        assert "does not render tools" in refused.json()["error"]["message"]
    finally:
        assert s.stop() == 0


def test_auto_on_the_default_model_is_recorded(smollm2_llm_factory, capsys):
    """SmolLM2-135M-Instruct's own template has no tools, so its tokenizer is given the Qwen3-shaped one: what the
    model does with `auto` is printed, not asserted (a 135M model may or may not call the tool)."""
    from fastapi.testclient import TestClient
    from helios.server.app import ServerSettings, create_app
    from helios.tokenizer import Tokenizer
    from helios.tools import packaged_chat_template
    llm = smollm2_llm_factory()
    template = packaged_chat_template("qwen3_style")
    tok = llm.tokenizer
    llm.tokenizer = Tokenizer(tok.backend, template, tok.eos_token_ids, tok.bos_token, tok.eos_token)
    client = TestClient(create_app(llm, ServerSettings("smollm2")))
    body = {"messages": [{"role": "user", "content": "What is the weather like in Paris right now?"}], "tools": TOOLS,
            "tool_choice": "auto", "temperature": 0, "max_tokens": 64}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    with capsys.disabled():
        print("\nauto tool choice on SmolLM2-135M-Instruct:", json.dumps(choice, indent=1))
    if choice["message"].get("tool_calls"):   # a call it did make is well-formed
        assert choice["finish_reason"] == "tool_calls"
        for call in choice["message"]["tool_calls"]: json.loads(call["function"]["arguments"])


def test_replayed_arguments_that_do_not_parse_are_rendered_as_written(server):
    "A model may write arguments that are not JSON; the client replays them, and the template gets them as written."
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{oops"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    counted = httpx.post(server.url + "/tokenize", headers=server.headers, json={"messages": history, "tools": TOOLS}).json()
    rendered = httpx.post(server.url + "/detokenize", headers=server.headers, json={"tokens": counted["tokens"]}).json()
    assert "{oops" in rendered["prompt"]
    r = server.client().chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens == counted["count"]
