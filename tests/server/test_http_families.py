"""`helios serve --model FOLDER` for each newer family (Qwen3-MoE, DeepSeek-V2, DeepSeek-V3), through the openai
client: the server starts and answers greedily with the text the model gives alone."""
import json

import pytest

from _server import Server
from conftest import FAMILIES, save_family


@pytest.fixture(scope="module", params=list(FAMILIES))
def served(request, tmp_path_factory, smollm2_gguf):
    from helios.tokenizer import load_tokenizer
    folder = save_family(request.param, tmp_path_factory.mktemp(request.param), vocab_size=49152)
    tok = load_tokenizer(smollm2_gguf)
    tok.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": tok.chat_template_source, "eos_token": "<|im_end|>", "bos_token": "<|im_start|>"}))
    server = Server("--model", str(folder), "--served-model-name", "tiny", "--kv-cache-bytes", str(8 << 20),
                    "--dtype", "float32")  # the tests compare with the float32 reference
    yield folder, server
    assert server.stop() == 0


def test_a_newer_family_serves_the_text_it_gives_alone(served):
    from helios.reference import generate
    from helios.tokenizer import load_tokenizer
    from helios.weights import load_model
    folder, server = served
    prompt = "The old lighthouse keeper looked at the sea and"
    out = server.client().completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0,
                                             extra_body={"ignore_eos": True})
    tokenizer, model = load_tokenizer(folder), load_model(folder, dtype="float32", device="cpu").model
    assert out.choices[0].text == tokenizer.decode(generate(model, tokenizer.encode(prompt), 8))
    chat = server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                                   max_tokens=4, temperature=0)
    assert chat.usage.completion_tokens >= 1
