"""How the server shapes a chat answer (helios.server.chat): one call when parallel_tool_calls is false, streamed
or whole alike."""
from helios.server.chat import ChatDeltas, ChatShape

CALL = '<tool_call>\n{"name": "f", "arguments": {"x": %d}}\n</tool_call>'
TWO_CALLS = CALL % 1 + "\n" + CALL % 2


def streamed_calls(shape: ChatShape, text: str, step: int = 3) -> list[dict]:
    deltas = ChatDeltas(shape)
    parts = [deltas.feed(text[i:i + step]) for i in range(0, len(text), step)] + [deltas.finish()]
    return [call for d in parts for call in d.get("tool_calls", ())]


def test_parallel_calls_by_default():
    shape = ChatShape(reasoning=False, tools=True)
    message, called = shape.message(TWO_CALLS)
    assert called and [c["function"]["arguments"] for c in message["tool_calls"]] == ['{"x": 1}', '{"x": 2}']
    assert [(c["index"], c["function"]["arguments"]) for c in streamed_calls(shape, TWO_CALLS)] == [(0, '{"x": 1}'), (1, '{"x": 2}')]


def test_only_the_first_call_when_parallel_calls_are_off():
    shape = ChatShape(reasoning=False, tools=True, parallel_tool_calls=False)
    message, called = shape.message(TWO_CALLS)
    assert called and [c["function"]["arguments"] for c in message["tool_calls"]] == ['{"x": 1}']
    assert [(c["index"], c["function"]["arguments"]) for c in streamed_calls(shape, TWO_CALLS)] == [(0, '{"x": 1}')]
