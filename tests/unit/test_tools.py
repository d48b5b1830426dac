"""Tools: checking them, the Qwen3-shaped template, the tool-call grammar under random sampling, and the streaming
tool-call parser."""
import json
import random

import jsonschema
import pytest
import torch
from hypothesis import given, settings, strategies as st

from helios.sampling import InvalidParam
from helios.engine import allocate_token_masks
from helios.structured import GrammarViolation, TokenGrammars
from helios.tokenizer import ChatTemplateError, IncrementalDetokenizer, Tokenizer, load_tokenizer
from helios.tools import (ChatDelta, ToolCallParser, check_tool_choice, lark_tag, merge_deltas, parse_tool_call,
                          tool_call_grammar, tool_call_lark, tool_functions)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "maxLength": 12},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}},
        "required": ["query"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def tools_tok(tiny_tools_folder):
    return load_tokenizer(tiny_tools_folder)


@pytest.fixture(scope="module")
def grammars(tools_tok):
    return TokenGrammars(tools_tok, tools_tok.vocab_size)


def refusal(fn, *args) -> InvalidParam:
    with pytest.raises(InvalidParam) as caught: fn(*args)
    return caught.value


# ---- checking tools ----

def test_tool_functions_reads_openai_tools():
    weather, clock = tool_functions([WEATHER, CLOCK])
    assert weather.name == "get_weather" and weather.description == "The weather in a city."
    assert weather.parameters == WEATHER["function"]["parameters"] and not weather.strict
    assert clock.parameters == {} and clock.description is None
    assert tool_functions([{"type": "function", "function": {"name": "f", "strict": True}}])[0].strict


@pytest.mark.parametrize("tools, says", [
    ([WEATHER, WEATHER], "second function named 'get_weather'"),
    ([{"type": "function", "function": {}}], "tools[0].function.name must be"),
    ([CLOCK, {"type": "function", "function": {"name": "has space"}}], "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "x" * 65}}], "1 to 64"),
    ([{"type": "retrieval"}], "tools[0] must be"),
    ([{"type": "function", "function": {"name": "f", "description": 3}}], "description must be a string"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], "JSON schema of an object"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "integr"}}}}}], "Invalid type: integr"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"$ref": "#/nowhere"}}}}}], "nowhere"),
    ([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "minProperties": 3, "maxProperties": 1}}}], "minProperties"),
    ("get_weather", "must be a list"),
])
def test_tool_functions_refuses_with_the_reason(tools, says):
    e = refusal(tool_functions, tools)
    assert e.param == "tools" and says in str(e)


def test_check_tool_choice():
    functions = tool_functions([WEATHER, CLOCK])
    assert [check_tool_choice(c, functions) for c in (None, "none", "auto", "required")] == [None, None, None, "required"]
    assert check_tool_choice({"type": "function", "function": {"name": "get_time"}}, functions) == "get_time"
    unknown = refusal(check_tool_choice, {"type": "function", "function": {"name": "get_stock"}}, functions)
    assert unknown.param == "tool_choice" and "'get_stock'" in str(unknown) and "'get_weather'" in str(unknown)
    assert "no tools" in str(refusal(check_tool_choice, "required", []))
    assert refusal(check_tool_choice, "sometimes", functions).param == "tool_choice"
    assert refusal(check_tool_choice, {"type": "function"}, functions).param == "tool_choice"


# ---- the Qwen3-shaped template ----

def test_tiny_tools_tokenizer_knows_tools_and_thinking(tools_tok, smollm2_gguf):
    assert tools_tok.supports_tools and tools_tok.supports_thinking and tools_tok.eos_token_ids == {2}
    for tag in ("<tool_call>", "</tool_call>", "<think>", "</think>"):
        assert len(tools_tok.encode(tag, add_special_tokens=False)) == 1
        assert tools_tok.decode(tools_tok.encode(tag)) == tag  # not special: kept in the text
    smol = load_tokenizer(smollm2_gguf)
    assert not smol.supports_tools and not smol.supports_thinking
    with pytest.raises(ValueError, match="no tool support"):
        smol.apply_chat_template([{"role": "user", "content": "hi"}], tools=[WEATHER])


def test_template_renders_tools_calls_and_results(tools_tok):
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris and Köln?"},
               {"role": "assistant", "content": "<think>\nTwo cities.\n</think>\n\nChecking.", "tool_calls": [
                   {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                   {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Köln"}'}}]},
               {"role": "tool", "tool_call_id": "call_a", "content": "18"},
               {"role": "tool", "tool_call_id": "call_b", "content": "12"}]
    prompt = tools_tok.apply_chat_template(history, tools=[WEATHER, CLOCK])
    system, rest = prompt.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools") and "<tools>\n" + json.dumps(WEATHER) in system
    assert rest == ('<|im_start|>user\nParis and Köln?<|im_end|>\n<|im_start|>assistant\nChecking.\n'
                    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
                    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Köln"}}\n</tool_call><|im_end|>\n'
                    '<|im_start|>user\n<tool_response>\n18\n</tool_response>\n<tool_response>\n12\n</tool_response>'
                    '<|im_end|>\n<|im_start|>assistant\n')
    plain = tools_tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert plain == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tools_tok.apply_chat_template([{"role": "user", "content": "hi"}], enable_thinking=False) == \
        plain + "<think>\n\n</think>\n\n"
    assert tools_tok.apply_chat_template([{"role": "user", "content": "hi"}], enable_thinking=True) == plain


def test_template_messages_are_checked(tools_tok):
    user = {"role": "user", "content": "hi"}
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert "<tool_call>" in tools_tok.apply_chat_template([user, call])
    for bad, says in [({**call, "tool_calls": [{"function": {"name": "f"}}]}, r"messages\[1\].tool_calls\[0\] must be"),
                      ({**call, "tool_calls": [{"function": {"name": "f", "arguments": ["x"]}}]}, r"tool_calls\[0\] must be"),
                      ({**call, "tool_calls": "f()"}, "must be a list"),
                      ({**call, "role": "user"}, "only assistant messages"),
                      ({"role": "tool", "content": None}, r"messages\[1\] must be a dict")]:
        with pytest.raises(ValueError, match=says): tools_tok.apply_chat_template([user, bad])
    with pytest.raises(ChatTemplateError, match="system message"):
        tools_tok.apply_chat_template([user, {"role": "system", "content": "late"}])


def test_replayed_arguments_that_are_not_an_object_reach_the_template_as_text(tools_tok):
    "A client replays a model's call as it came: arguments that are not a JSON object's text are rendered, not refused."
    user = {"role": "user", "content": "hi"}
    replay = lambda arguments: tools_tok.apply_chat_template([user, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]}])
    assert '"arguments": {"a": 1}}' in replay('{"a": 1}') and replay('{"a": 1}') == replay({"a": 1})
    for text in ("{oops", "[1]", "", "[" * 100_000, "NaN"):
        assert f'"arguments": {json.dumps(text)}}}' in replay(text)   # this template writes any value with tojson
    qwen3_branch = Tokenizer(tools_tok.backend, chat_template=(
        "{% for m in messages %}{% for c in m.tool_calls or [] %}{% if c.function.arguments is string %}"
        "{{ c.function.arguments }}{% else %}{{ c.function.arguments | tojson }}{% endif %}{% endfor %}{% endfor %}"))
    for arguments, rendered in [("[1]", "[1]"), ("{oops", "{oops"), ('{"a":1}', '{"a": 1}')]:
        assert qwen3_branch.apply_chat_template([user, {"role": "assistant", "content": None, "tool_calls": [
            {"function": {"name": "f", "arguments": arguments}}]}], add_generation_prompt=False) == rendered


# ---- the grammar, under a random "model" ----

def allowed(mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    "Which tokens a bitmask row allows: int32 [W] -> bool [V]."
    bits = (mask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1  # [W, 32]
    return bits.flatten()[:vocab_size].bool()


@pytest.fixture(scope="module")
def one_character(tools_tok) -> torch.Tensor:
    "bool [V]: tokens of a single character (the shortest way through a string), EOS too."
    short = [len(tools_tok.decode([i], skip_special_tokens=False)) == 1 for i in range(tools_tok.vocab_size)]
    short = torch.tensor(short)
    short[list(tools_tok.eos_token_ids)] = True
    return short


def sample_under(grammars: TokenGrammars, grammar: str, short: torch.Tensor, rng: random.Random,
                 max_tokens: int = 300) -> list[int] | None:
    """Tokens a weak "model" draws among those the grammar allows (any of them, or half the time one of a single
    character, so that strings end), until the grammar is finished; None if max_tokens run out."""
    matcher, masks, ids = grammars.matcher(grammar), allocate_token_masks(1, grammars.vocab_size), []
    for _ in range(max_tokens):
        matcher.fill_mask(masks, 0)
        ok = allowed(masks[0], grammars.vocab_size)
        pool = ok & short if rng.random() < 0.5 and (ok & short).any() else ok
        candidates = pool.nonzero().flatten()
        token = candidates[rng.randrange(len(candidates))].item()
        if token in grammars.eos_token_ids: return ids
        matcher.accept(token)
        ids.append(token)
        if matcher.is_finished: return ids
    return None


@pytest.mark.parametrize("choice, parallel", [("required", False), ("get_weather", False), ("required", True)])
def test_calls_sampled_under_the_grammar_parse_and_validate(tools_tok, grammars, one_character, choice, parallel):
    functions = tool_functions([WEATHER, SEARCH, CLOCK])
    grammar = tool_call_grammar(functions, choice, parallel, tokenizer=tools_tok)
    grammars.check(grammar, "tool_choice")
    schemas = {f.name: {"type": "object", **f.parameters} for f in functions}  # as the client gave them
    rng, finished, names = random.Random(0), 0, set()
    for _ in range(20):
        ids = sample_under(grammars, grammar, one_character, rng)
        if ids is None: continue
        finished += 1
        parser, detok = ToolCallParser(), IncrementalDetokenizer(tools_tok)
        deltas = [parser.feed(detok.push(t)) for t in ids] + [parser.feed(detok.flush()), parser.finish()]
        message = merge_deltas(deltas)
        assert message.content == "" and message.tool_calls, tools_tok.decode(ids)
        assert parallel or len(message.tool_calls) == 1
        for call in message.tool_calls:
            assert choice == "required" or call.name == choice
            jsonschema.validate(arguments := json.loads(call.arguments), schemas[call.name])
            assert "properties" not in schemas[call.name] or set(arguments) <= set(schemas[call.name]["properties"])
            names.add(call.name)
    assert finished >= 15
    assert choice != "required" or len(names) >= 2  # the choice among functions is the sampler's


def test_declared_parameters_are_the_only_keys_unless_the_schema_allows_more(grammars, tools_tok):
    def admits(tool, arguments):
        matcher = grammars.matcher(tool_call_grammar(tool_functions([tool]), "required", False, tokenizer=tools_tok))
        text = f'<tool_call>\n{{"name": "{tool["function"]["name"]}", "arguments": {arguments}}}\n</tool_call>'
        try:
            for token in tools_tok.encode(text, add_special_tokens=False): matcher.accept(token)
        except GrammarViolation: return False
        return matcher.is_finished
    assert admits(WEATHER, '{"city": "Paris", "days": 1}') and not admits(WEATHER, '{"city": "Paris", "days": 1, "x": 1}')
    open_weather = {"type": "function", "function": {**WEATHER["function"], "parameters": {
        **WEATHER["function"]["parameters"], "additionalProperties": True}}}
    assert admits(open_weather, '{"city": "Paris", "days": 1, "x": 1}')
    assert admits(CLOCK, '{"anything": [1, {"goes": null}]}')  # no declared parameters: any object


def test_tags_are_the_vocabularys_own_tokens_or_text(tools_tok, grammars, smollm2_gguf):
    "Tags that are tokens of their own are asked for as those tokens; a vocabulary without them spells them."
    text = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    functions = tool_functions([CLOCK])
    assert "call_0: <tool_call> " in tool_call_lark(functions, "get_time", False, tokenizer=tools_tok)
    for tok, token_grammars in [(tools_tok, grammars), (load_tokenizer(smollm2_gguf), None)]:
        token_grammars = token_grammars or TokenGrammars(tok, tok.vocab_size)
        grammar = tool_call_grammar(functions, "get_time", parallel=False, tokenizer=tok)
        matcher = token_grammars.matcher(grammar)
        for token in tok.encode(text, add_special_tokens=False): matcher.accept(token)
        assert matcher.is_finished
        with pytest.raises(GrammarViolation):
            token_grammars.matcher(grammar).accept(tok.encode("Sure", add_special_tokens=False)[0])
    assert '"<tool_call>"' in tool_call_lark(functions, "get_time", False, tokenizer=load_tokenizer(smollm2_gguf))


def test_a_special_tag_token_is_spelled_as_text(smollm2_gguf):
    "A tag the tokenizer marks special is dropped by the detokenizer: the grammar spells it, so the parser sees it."
    from tokenizers import AddedToken
    tok = load_tokenizer(smollm2_gguf)
    tok.backend.add_tokens([AddedToken(t, special=True, normalized=False) for t in ("<tool_call>", "</tool_call>")])
    special_id = tok.backend.token_to_id("<tool_call>")
    assert tok.decode([special_id]) == ""                                  # what the streamed text would show
    assert lark_tag("<tool_call>", tok) == '"<tool_call>"' and lark_tag("</tool_call>", tok) == '"</tool_call>"'
    grammar = tool_call_grammar(tool_functions([CLOCK]), "get_time", False, tokenizer=tok)
    token_grammars = TokenGrammars(tok, tok.vocab_size)
    with pytest.raises(GrammarViolation): token_grammars.matcher(grammar).accept(special_id)
    text = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    spelled = [t for piece in ("<", "tool", "_", "call", ">") for t in tok.encode(piece, add_special_tokens=False)]
    rest = tok.encode(text[len("<tool_call>"):-len("</tool_call>")], add_special_tokens=False)
    closing = [t for piece in ("</", "tool", "_", "call", ">") for t in tok.encode(piece, add_special_tokens=False)]
    matcher = token_grammars.matcher(grammar)
    for t in spelled + rest + closing: matcher.accept(t)
    assert matcher.is_finished
    (call,) = parse(tok.decode(spelled + rest + closing)).tool_calls
    assert (call.name, call.arguments) == ("get_time", "{}")


# ---- the streaming parser ----

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'


def parse(text: str) -> ChatDelta:
    parser = ToolCallParser()
    return merge_deltas([parser.feed(text), parser.finish()])


def without_ids(delta: ChatDelta) -> tuple:
    return delta.content, delta.reasoning, [(c.name, c.arguments) for c in delta.tool_calls]


@pytest.mark.parametrize("text, content, calls", [
    ("Hello, <b>world</b>!\n", "Hello, <b>world</b>!\n", 0),
    (CALL, "", 1),
    ("Let me check.\n" + CALL + "\n" + CALL + "\n", "Let me check.", 2),
    (CALL + "\n\nIt is sunny.", "It is sunny.", 1),
    ("A <tool_call>not json</tool_call> B", "A <tool_call>not json</tool_call> B", 0),
    ("x\n<tool_call>\n[1, 2]\n</tool_call>", "x\n<tool_call>\n[1, 2]\n</tool_call>", 0),
    ('<tool_call>\n{"name": "get_time"}\n</tool_call>', "", 1),
    ('<tool_call>\n{"name": "get_time", "arguments": {}}', "", 1),  # stopped before the closing tag
    ("<tool_call>\n{\"name\": ", "", 0),   # cut inside a call (max_tokens): neither content nor a call
    ("Checking.\n<tool_call>\n{\"name\": ", "Checking.", 0),
    ('<tool_call>{"name": "f", "arguments": {"x": "\\ud800"}}</tool_call>',   # a lone surrogate: not UTF-8
     '<tool_call>{"name": "f", "arguments": {"x": "\\ud800"}}</tool_call>', 0),
    ("ends with <tool_ca", "ends with <tool_ca", 0),
])
def test_parser_splits_content_and_calls(text, content, calls):
    result = parse(text)
    assert result.content == content and len(result.tool_calls) == calls
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in result.tool_calls)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"])
def test_a_block_with_numbers_json_cannot_write_is_content(number):
    block = f'<tool_call>\n{{"name": "get_weather", "arguments": {{"days": {number}}}}}\n</tool_call>'
    assert parse(block) == ChatDelta(block)
    assert parse_tool_call(f'{{"name": "f", "arguments": {{"x": [1, {{"y": {number}}}]}}}}') is None


def test_large_finite_numbers_are_still_calls():
    call = parse_tool_call('{"name": "f", "arguments": {"x": 1e308, "n": 123456789012345678901234567890}}')
    assert json.loads(call.arguments) == {"x": 1e308, "n": 123456789012345678901234567890}


def test_arguments_come_back_as_json_text():
    (call,) = parse(CALL).tool_calls
    assert call.name == "get_weather" and call.arguments == '{"city": "Paris", "days": 2}'
    assert parse(CALL.replace("Paris", "Zürich")).tool_calls[0].arguments == '{"city": "Zürich", "days": 2}'


def test_no_delta_holds_part_of_a_tag():
    text = "Sure.\n" + CALL + "\n" + CALL
    parser = ToolCallParser()
    deltas = [parser.feed(ch) for ch in text] + [parser.finish()]
    assert [d.content for d in deltas if d.content] == ["S", "u", "r", "e", "."]
    assert [len(d.tool_calls) for d in deltas if d.tool_calls] == [1, 1]


PIECES = ["<tool_call>", "</tool_call>", "<tool", "_call>", "</", "<", "\n", " ", "abc", "é🍕", CALL,
          '{"name": "f", "arguments": {"a": [1]}}', '{"name": ', "}"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES) | st.text(max_size=4), max_size=12), st.data())
def test_streaming_equals_parsing_the_whole_text(pieces, data):
    text = "".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    parser = ToolCallParser()
    deltas = [parser.feed(text[a:b]) for a, b in zip([0, *cuts], [*cuts, len(text)])] + [parser.finish()]
    assert without_ids(merge_deltas(deltas)) == without_ids(parse(text))


def test_parameters_past_the_schema_limits_are_refused_naming_the_tool():
    from helios.structured import MAX_OPTIONAL_PROPERTIES
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(10_000)}}
    cyclic = {"type": "object", "required": ["x"], "properties": {"x": {"$ref": "#"}}}
    e = refusal(tool_functions, [CLOCK, {"type": "function", "function": {"name": "f", "parameters": wide}}])
    assert e.param == "tools" and str(e).startswith("tools[1].function.parameters.properties has 10,000 optional")
    assert f"at most {MAX_OPTIONAL_PROPERTIES}" in str(e)
    e = refusal(tool_functions, [{"type": "function", "function": {"name": "f", "parameters": cyclic}}])
    assert e.param == "tools" and "tools[0].function.parameters: the $ref '#' can never end" in str(e)
