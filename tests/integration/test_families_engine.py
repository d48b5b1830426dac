"""Qwen3-MoE and the DeepSeek-V2/V3 family (latent attention, experts) through the whole engine: paged, batched,
chunked, prefix-cached, preempted; every request gets the tokens it gets alone, and no page leaks."""
import pytest
import torch

from conftest import FAMILIES, save_family
from helios import SamplingParams
from helios.config import EngineConfig
from helios.engine import Engine
from helios.llm import engine_plugins
from helios.reference import generate
from helios.tokenizer import load_tokenizer
from helios.weights import load_model

PAGE = 8
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory, smollm2_gguf):
    folder = save_family(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, load_model(folder, dtype="float32", device="cpu").model, load_tokenizer(smollm2_gguf)


def prompts():
    "Eight prompts: four share a 2-page prefix, lengths cross page and chunk boundaries."
    shared = [(5 * j) % 200 + 3 for j in range(2 * PAGE)]
    own = [[(11 * i + 7 * j) % 200 + 1 for j in range(1 + 9 * i)] for i in range(8)]
    return [shared + own[i] if i < 4 else own[i] for i in range(8)]


def run(model, tokenizer, num_pages, **config):
    settings = dict(max_batch_size=4, prefill_chunk_size=16, page_size=PAGE, max_queue=64, kv_watermark=0.0)
    engine_config = EngineConfig(**{**settings, **config})
    engine = Engine(model, tokenizer, frozenset(), engine_config, num_pages, **engine_plugins(engine_config))
    first, *rest = prompts()
    handles = [engine.submit(first, GREEDY)]  # alone first: its prefix blocks are cached when the others arrive
    while engine.step(): engine.pages.check_invariants()
    handles += [engine.submit(p, GREEDY) for p in rest]
    while engine.step(): engine.pages.check_invariants()
    stats = engine.stats()
    assert stats.num_used_pages == 0 and stats.num_running == 0
    assert stats.num_free_pages + stats.num_cached_pages == stats.num_pages
    return [h.result() for h in handles], stats


def test_the_engine_gives_each_request_its_tokens_alone(family):
    name, model, tokenizer = family
    alone = [generate(model, p, GREEDY.max_tokens) for p in prompts()]
    outs, stats = run(model, tokenizer, num_pages=64)
    assert [o.token_ids for o in outs] == alone
    assert stats.prefix_hit_tokens >= 3 * 2 * PAGE  # the shared prefix was read from the cache, not recomputed


def test_a_pool_too_small_preempts_and_still_gives_the_same_tokens(family):
    name, model, tokenizer = family
    alone = [generate(model, p, GREEDY.max_tokens) for p in prompts()]
    host = 12 * PAGE * model.config.kv_bytes_per_token(4)
    outs, stats = run(model, tokenizer, num_pages=12, kv_offload_bytes=host)
    assert [o.token_ids for o in outs] == alone
    assert stats.num_preemptions > 0


def test_speculative_decoding_gives_the_same_tokens(family):
    "n-gram drafts verified in the packed forward, on a pool that also preempts: still each request's tokens alone."
    name, model, tokenizer = family
    alone = [generate(model, p, GREEDY.max_tokens) for p in prompts()]
    host = 12 * PAGE * model.config.kv_bytes_per_token(4)
    outs, stats = run(model, tokenizer, num_pages=12, kv_offload_bytes=host, speculative="ngram",
                      speculative_ngram_min=1)
    assert [o.token_ids for o in outs] == alone
    assert stats.num_draft_tokens > 0 and stats.num_preemptions > 0


def test_float16_pages_give_each_request_its_tokens_alone(family):
    "Keys, values and latents cached in float16 (kv_cache_dtype), read by PyTorch's attention: batched as alone."
    name, model, tokenizer = family
    outs, _ = run(model, tokenizer, num_pages=64, kv_cache_dtype="float16")
    for prompt, out in zip(prompts(), outs):
        engine = Engine(model, tokenizer, frozenset(), EngineConfig(page_size=PAGE, kv_cache_dtype="float16"), 16)
        assert engine.kv.k.dtype == torch.float16
        handle = engine.submit(prompt, GREEDY)
        while engine.step(): pass
        assert handle.result().outputs[0].token_ids == out.outputs[0].token_ids, name
