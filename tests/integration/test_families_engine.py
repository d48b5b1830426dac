"""Qwen3-MoE and the DeepSeek family (latent attention, experts, V3.2's sparse attention) through the whole engine:
paged, batched, chunked, prefix-cached, preempted; every request gets the tokens it gets alone, and no page leaks."""
import pytest
import torch

from _engine_runs import GREEDY, PAGE, run_engine
from conftest import FAMILIES, save_family
from helios.config import EngineConfig
from helios.engine import Engine
from helios.reference import generate
from helios.tokenizer import load_tokenizer
from helios.weights import load_model



@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory, smollm2_gguf):
    folder = save_family(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, load_model(folder, dtype="float32", device="cpu").model, load_tokenizer(smollm2_gguf)


def prompts():
    "Eight prompts: four share a 2-page prefix, lengths cross page and chunk boundaries."
    shared = [(5 * j) % 200 + 3 for j in range(2 * PAGE)]
    own = [[(11 * i + 7 * j) % 200 + 1 for j in range(1 + 9 * i)] for i in range(8)]
    return [shared + own[i] if i < 4 else own[i] for i in range(8)]


def test_the_engine_gives_each_request_its_tokens_alone(family):
    name, model, tokenizer = family
    alone = [generate(model, p, GREEDY.max_tokens) for p in prompts()]
    outs, stats = run_engine(model, tokenizer, prompts(), num_pages=64)
    assert [o.token_ids for o in outs] == alone
    assert stats.prefix_hit_tokens >= 3 * 2 * PAGE  # the shared prefix was read from the cache, not recomputed


def test_a_pool_too_small_preempts_and_still_gives_the_same_tokens(family):
    name, model, tokenizer = family
    alone = [generate(model, p, GREEDY.max_tokens) for p in prompts()]
    host = 12 * PAGE * model.config.kv_bytes_per_token(4)
    outs, stats = run_engine(model, tokenizer, prompts(), num_pages=12, kv_offload_bytes=host)
    assert [o.token_ids for o in outs] == alone
    assert stats.num_preemptions > 0


def test_speculative_decoding_gives_the_same_tokens(family):
    "n-gram drafts verified in the packed forward, on a pool that also preempts: still each request's tokens alone."
    name, model, tokenizer = family
    alone = [generate(model, p, GREEDY.max_tokens) for p in prompts()]
    host = 12 * PAGE * model.config.kv_bytes_per_token(4)
    outs, stats = run_engine(model, tokenizer, prompts(), num_pages=12, kv_offload_bytes=host, speculative="ngram",
                      speculative_ngram_min=1)
    assert [o.token_ids for o in outs] == alone
    assert stats.num_draft_tokens > 0 and stats.num_preemptions > 0


def test_float16_pages_give_each_request_its_tokens_alone(family):
    "Keys, values and latents cached in float16 (kv_cache_dtype), read by PyTorch's attention: batched as alone."
    name, model, tokenizer = family
    outs, _ = run_engine(model, tokenizer, prompts(), num_pages=64, kv_cache_dtype="float16")
    for prompt, out in zip(prompts(), outs):
        engine = Engine(model, tokenizer, frozenset(), EngineConfig(page_size=PAGE, kv_cache_dtype="float16"), 16)
        assert engine.kv.k.dtype == torch.float16
        handle = engine.submit(prompt, GREEDY)
        while engine.step(): pass
        assert handle.result().outputs[0].token_ids == out.outputs[0].token_ids, name
