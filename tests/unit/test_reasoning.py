"""Reasoning: the streaming <think> split, the chained chat output parser, and streaming == parsing the whole text."""
import pytest
from hypothesis import given, settings, strategies as st

from helios.reasoning import ChatDelta, ChatOutputParser, ReasoningParser, prompt_opens_reasoning
from helios.tokenizer import IncrementalDetokenizer, load_tokenizer
from helios.tools import merge_deltas

CALL = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'


def split(text: str, starts_in_reasoning: bool = False) -> ChatDelta:
    parser = ReasoningParser(starts_in_reasoning)
    return merge_deltas([parser.feed(text), parser.finish()])


@pytest.mark.parametrize("text, starts, content, reasoning", [
    ("<think>\nA, then B.\n</think>\n\nB.", False, "B.", "A, then B."),
    ("\n <think>x</think>y", False, "y", "x"),
    ("<think></think>Answer.\n", False, "Answer.\n", ""),
    ("  Plain answer, <think> later is text.", False, "  Plain answer, <think> later is text.", ""),
    ("<thinking> is not a tag", False, "<thinking> is not a tag", ""),
    ("<thi", False, "<thi", ""),
    ("   ", False, "   ", ""),
    ("<think>\nnever closed  \n", False, "", "never closed"),
    ("\nopened by the prompt\n</think>\n\nDone.", True, "Done.", "opened by the prompt"),
    ("cut mid-tag </thi", True, "", "cut mid-tag </thi"),
    ("a</think>b</think>c", True, "b</think>c", "a"),
])
def test_reasoning_split(text, starts, content, reasoning):
    assert split(text, starts) == ChatDelta(content, reasoning)


def test_partial_tags_are_held_back_and_released():
    parser = ReasoningParser(starts_in_reasoning=True)
    assert parser.feed("step one \n</th") == ChatDelta(reasoning="step one")
    assert parser.feed("ere") == ChatDelta(reasoning=" \n</there")  # not the tag after all
    assert parser.feed("</think>\n") == ChatDelta()
    assert parser.feed("\nAnswer") == ChatDelta("Answer")


def test_no_delta_holds_part_of_a_tag():
    text = "<think>\nShort thought.\n</think>\n\nShort answer."
    parser = ReasoningParser()
    deltas = [parser.feed(ch) for ch in text] + [parser.finish()]
    assert not any("<" in d.content or "<" in d.reasoning or ">" in d.content for d in deltas)
    assert merge_deltas(deltas) == ChatDelta("Short answer.", "Short thought.")


def test_prompt_opens_reasoning():
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>user\nWhat is <think>?<|im_end|>\n<|im_start|>assistant\n")


def test_chat_output_parser_chains_reasoning_then_calls():
    text = "<think>\nI could write " + CALL + " here.\n</think>\n\nChecking.\n" + CALL
    message = ChatOutputParser(reasoning=True, tools=True).parse(text)
    assert message.reasoning == "I could write " + CALL + " here." and message.content == "Checking."
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("get_time", '{"zone": "UTC"}')]
    only_reasoning = ChatOutputParser(reasoning=True, tools=False).parse(text)
    assert only_reasoning.content == "Checking.\n" + CALL and only_reasoning.tool_calls == ()
    only_tools = ChatOutputParser(reasoning=False, tools=True).parse(text)
    assert only_tools.reasoning == "" and only_tools.content.startswith("<think>") and len(only_tools.tool_calls) == 2
    assert ChatOutputParser(reasoning=False, tools=False).parse(text) == ChatDelta(text)
    assert ChatOutputParser(True, True, starts_in_reasoning=True).parse("hmm</think>" + CALL).reasoning == "hmm"


def test_reasoning_split_of_template_and_tokens(tiny_tools_folder):
    "The tiny Qwen3-shaped checkpoint: its template turns thinking off with a closed block, and its tags are tokens."
    tok = load_tokenizer(tiny_tools_folder)
    conversation = [{"role": "user", "content": "2 + 2?"}]
    thinking = tok.apply_chat_template(conversation)
    direct = tok.apply_chat_template(conversation, enable_thinking=False)
    assert direct == thinking + "<think>\n\n</think>\n\n"
    assert not prompt_opens_reasoning(thinking) and not prompt_opens_reasoning(direct)
    output = "<think>\n2 and 2 make 4.\n</think>\n\nIt is 4."
    ids = tok.encode(output, add_special_tokens=False)
    assert ids[0] == tok.backend.token_to_id("<think>") and tok.backend.token_to_id("</think>") in ids
    detok, parser = IncrementalDetokenizer(tok), ChatOutputParser(reasoning=True, tools=True)
    deltas = [parser.feed(detok.push(i)) for i in ids] + [parser.feed(detok.flush()), parser.finish()]
    assert merge_deltas(deltas) == ChatDelta("It is 4.", "2 and 2 make 4.")
    assert sum(bool(d.reasoning) for d in deltas) > 1  # the reasoning streamed, token by token


PIECES = ["<think>", "</think>", "<think", "</th", "ink>", "<tool_call>", "</tool_call>", "<tool", "<", "\n", " ",
          "\n\n", "abc", "é🍕", CALL, '{"name": "f", "arguments": {}}', "}"]


def streamed(parser, text: str, cuts: list[int]) -> ChatDelta:
    bounds = [0, *sorted(cuts), len(text)]
    return merge_deltas([parser.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])] + [parser.finish()])


def without_ids(delta: ChatDelta) -> tuple:
    return delta.content, delta.reasoning, [(c.name, c.arguments) for c in delta.tool_calls]


texts = st.lists(st.sampled_from(PIECES) | st.text(max_size=3), max_size=12).map("".join)


@settings(max_examples=300, deadline=None)
@given(texts, st.booleans(), st.data())
def test_streamed_reasoning_equals_the_whole_text(text, starts, data):
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    assert streamed(ReasoningParser(starts), text, cuts) == split(text, starts)


@settings(max_examples=300, deadline=None)
@given(texts, st.booleans(), st.booleans(), st.booleans(), st.data())
def test_streamed_chat_output_equals_parse(text, reasoning, tools, starts, data):
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    whole = ChatOutputParser(reasoning, tools, starts).parse(text)
    assert without_ids(streamed(ChatOutputParser(reasoning, tools, starts), text, cuts)) == without_ids(whole)
    if not reasoning and not tools: assert whole == ChatDelta(text)


@settings(max_examples=200, deadline=None)
@given(texts)
def test_text_without_think_tags_is_all_content(text):
    if "<think>" in text.lstrip()[:7]: return
    assert split(text) == ChatDelta(text)
