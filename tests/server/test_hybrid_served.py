"""`helios serve --model FOLDER` on a Qwen3.5 hybrid checkpoint, through the openai client: greedy text as the model
gives it alone, a repeated prompt served from its cached prefix (usage.prompt_tokens_details.cached_tokens) with the
same text, and the state pool in /health and /metrics."""
import json

import httpx
import pytest

from _server import Server
from _hybrid_checkpoints import save_reference

PAGE = 16


@pytest.fixture(scope="module")
def served(tmp_path_factory, smollm2_gguf):
    from helios.tokenizer import load_tokenizer
    folder = tmp_path_factory.mktemp("qwen3_5")
    save_reference("interval4_gqa_conv4_untied", folder, vocab_size=49152)
    tok = load_tokenizer(smollm2_gguf)
    tok.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": tok.chat_template_source, "eos_token": "<|im_end|>", "bos_token": "<|im_start|>"}))
    server = Server("--model", str(folder), "--served-model-name", "tiny", "--kv-cache-bytes", str(8 << 20),
                    "--dtype", "float32", "--page-size", str(PAGE))
    yield folder, server
    assert server.stop() == 0


def test_a_hybrid_serves_its_text_and_reuses_a_cached_prefix(served):
    from helios.model.hybrid import generate_hybrid
    from helios.tokenizer import load_tokenizer
    from helios.weights import load_model
    folder, server = served
    client = server.client()
    prompt = "The old lighthouse keeper looked at the sea and counted the ships that passed his rock " * 3
    tokenizer, model = load_tokenizer(folder), load_model(folder, dtype="float32", device="cpu").model
    ids = tokenizer.encode(prompt)
    assert len(ids) > 3 * PAGE
    expected = tokenizer.decode(generate_hybrid(model, ids, 8))
    first, second = (client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0,
                                               extra_body={"ignore_eos": True}) for _ in range(2))
    assert first.choices[0].text == second.choices[0].text == expected
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == (len(ids) - 1) // PAGE * PAGE  # every full block but a last one that ends the prompt
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=4, temperature=0)
    assert chat.usage.completion_tokens >= 1
    health = httpx.get(server.url + "/health", headers=server.headers).json()
    assert health["sequence_states"]["held"] == 0 and health["sequence_states"]["snapshots"] >= 1
    metrics = httpx.get(server.url + "/metrics", headers=server.headers).text
    assert 'helios:state_snapshots{model_name="tiny"}' in metrics
