"""`LLM.chat(..., enable_thinking=False)` reaches a Qwen3-shaped chat template (helios/templates/qwen3_style.jinja):
the prompt the engine runs is the template's, rendered with the keyword."""
from conftest import TEST_KV_BYTES

from helios import LLM, SamplingParams

ASK = [{"role": "user", "content": "Say hi."}]


def test_enable_thinking_false_closes_the_think_block_before_it_starts(tiny_tools_folder):
    with LLM(tiny_tools_folder, dtype="float32", device="cpu", kv_cache_bytes=TEST_KV_BYTES, quiet=True) as llm:
        params = SamplingParams(temperature=0, max_tokens=4)
        thinking, plain = llm.chat(ASK, params), llm.chat(ASK, params, enable_thinking=False)
        assert plain.prompt_token_ids == llm.tokenizer.encode_chat(ASK, enable_thinking=False)
        assert thinking.prompt_token_ids == llm.tokenizer.encode_chat(ASK)
        rendered = llm.tokenizer.decode(plain.prompt_token_ids, False)
        assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert "<think>" not in llm.tokenizer.decode(thinking.prompt_token_ids, False)
