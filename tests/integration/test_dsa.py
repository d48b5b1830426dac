"""DeepSeek sparse attention (DeepSeek-V3.2) against transformers on tiny random checkpoints (float32), with
`index_topk` far below the prompt length so the indexer's selection decides what each query reads: logits, greedy
tokens, chunked prefill and decode through chapter 06's cache, the family, and the paged engine."""
from pathlib import Path

import pytest
import torch

from _engine_runs import GREEDY, PAGE, run_engine
from conftest import PEAKED_INIT_RANGE, transformers_greedy
from helios.families import load_family
from helios.model.dsa import DEEPSEEK_V32, DSAModelConfig, DSAttention
from helios.reference import KVCache, decode_one_token, generate, prefill
from helios.tokenizer import load_tokenizer
from helios.weights import load_model

# Max abs logit difference to transformers in float32 (logits of these peaked models are O(10)). The absorbed
# form associates MLA's up-projections the other way round (chapter 06a: up to ~5e-4 after a few layers); a
# wrong selection, scale or rope order moves them by O(1).
LOGIT_ATOL = 5e-4
TOPK = 6                 # tokens each query reads; the prompts are 24-31 tokens and grow to 47
PROMPT_LENS = (24, 27, 31)
STEPS = 16
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
              max_position_embeddings=1024, initializer_range=PEAKED_INIT_RANGE, bos_token_id=None,
              eos_token_id=None, pad_token_id=None, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
              qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
              n_shared_experts=1, index_topk=TOPK)
# 16 indexer heads: a score is an exact 0 (every head's ReLU 0) with odds 2^-16, so no two tokens tie at the
# top-k boundary and the selection is the same whichever way transformers' topk breaks ties
SHAPES = {
    "two_layers": dict(num_hidden_layers=2, first_k_dense_replace=1, index_n_heads=16, index_head_dim=16),
    "three_layers_yarn": dict(num_hidden_layers=3, first_k_dense_replace=0, index_n_heads=16, index_head_dim=24,
                              rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                   original_max_position_embeddings=256, beta_fast=32, beta_slow=1,
                                                   mscale=1.0, mscale_all_dim=0.5)),
}


def save_tiny_v32(folder: Path, shape: dict) -> Path:
    import transformers
    torch.manual_seed(0)
    config = transformers.DeepseekV32Config(**{**COMMON, **shape})
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return folder


class Tiny:
    "One checkpoint: transformers' model, ours as load_model builds it, prompts and transformers' greedy tokens."
    def __init__(self, folder: Path):
        from transformers import AutoModelForCausalLM
        self.folder = folder
        self.hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.ours = load_model(folder, dtype="float32", device="cpu").model
        self.prompts = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist()
                        for n in PROMPT_LENS]
        self.expected = [transformers_greedy(self.hf, p, STEPS) for p in self.prompts]


@pytest.fixture(scope="module", params=list(SHAPES))
def tiny(request, tmp_path_factory) -> Tiny:
    return Tiny(save_tiny_v32(tmp_path_factory.mktemp(request.param), SHAPES[request.param]))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_load_model_builds_it_through_the_family(tiny):
    assert load_family("deepseek_v32") is DEEPSEEK_V32
    cfg = tiny.ours.config
    assert isinstance(cfg, DSAModelConfig) and cfg.architecture == "deepseek_v32" and cfg.indexer.topk == TOPK
    assert cfg.kv_layout.k_dim == 32 + 8 + cfg.indexer.head_dim  # [latent | rope key | indexer key]
    assert all(isinstance(layer.self_attn, DSAttention) for layer in tiny.ours.model.layers)


@pytest.mark.parametrize("form", ["expanded", "absorbed"])
def test_logits_match_transformers(tiny, form):
    ids = torch.tensor([p[:PROMPT_LENS[0]] for p in tiny.prompts])                  # [3, 24]
    for layer in tiny.ours.model.layers: layer.self_attn.form = form
    try:
        with torch.inference_mode():
            ours = tiny.ours(ids, torch.arange(ids.shape[1]).expand_as(ids))
            theirs = tiny.hf(ids).logits
    finally:
        for layer in tiny.ours.model.layers: layer.self_attn.form = "auto"
    assert (ours - theirs).abs().max() < LOGIT_ATOL


def test_the_selection_matters(tiny):
    "The same model with indexers that keep every token gives other logits: the tests above test the selection."
    ids = torch.tensor([tiny.prompts[0]])
    positions = torch.arange(ids.shape[1])[None]
    with torch.inference_mode():
        sparse = tiny.ours(ids, positions)
        for layer in tiny.ours.model.layers: layer.self_attn.topk = 1024
        try: dense = tiny.ours(ids, positions)
        finally:
            for layer in tiny.ours.model.layers: layer.self_attn.topk = TOPK
    assert (dense - sparse).abs().max() > 1e-2


def test_greedy_tokens_match_transformers(tiny):
    assert [generate(tiny.ours, p, STEPS) for p in tiny.prompts] == tiny.expected


def test_chunked_prefill_and_decode_equal_one_forward(tiny):
    model, cfg = tiny.ours, tiny.ours.config
    ids = torch.tensor([tiny.prompts[-1]])                                           # [1, 31]
    T = ids.shape[1]
    positions = torch.arange(T)[None]
    with torch.inference_mode():
        whole = model(ids, positions)                                                # [1, T, vocab]
        for chunk in (1, 5, 13):
            cache, parts = KVCache(cfg, 1, 64), []
            for start in range(0, T, chunk):
                parts.append(model(ids[:, start:start + chunk], positions[:, start:start + chunk], kv=cache))
                cache.advance(parts[-1].shape[1])
            assert (torch.cat(parts, dim=1) - whole).abs().max() < 1e-4, chunk
        cache = KVCache(cfg, 1, 64)
        logits = [prefill(model, cache, ids[:, :10])]
        logits += [decode_one_token(model, cache, ids[:, t]) for t in range(10, T)]
        assert (torch.stack(logits, dim=1) - whole[:, 9:]).abs().max() < 1e-4


def engine_prompts() -> list[list[int]]:
    "Six prompts: three share a 2-page prefix; lengths cross page and chunk boundaries and TOPK many times."
    shared = [(5 * j) % 200 + 3 for j in range(2 * PAGE)]
    own = [[(11 * i + 7 * j) % 200 + 1 for j in range(3 + 7 * i)] for i in range(6)]
    return [shared + own[i] if i < 3 else own[i] for i in range(6)]


def test_the_engine_gives_each_request_its_tokens_alone(tiny, smollm2_gguf):
    alone = [generate(tiny.ours, p, GREEDY.max_tokens) for p in engine_prompts()]
    outs, stats = run_engine(tiny.ours, load_tokenizer(smollm2_gguf), engine_prompts(), num_pages=64)
    assert [o.token_ids for o in outs] == alone
    assert stats.prefix_hit_tokens >= 2 * 2 * PAGE  # the shared prefix was read from the cache, not recomputed


def test_a_pool_too_small_preempts_and_still_gives_the_same_tokens(tiny, smollm2_gguf):
    alone = [generate(tiny.ours, p, GREEDY.max_tokens) for p in engine_prompts()]
    host = 12 * PAGE * tiny.ours.config.kv_bytes_per_token(4)
    outs, stats = run_engine(tiny.ours, load_tokenizer(smollm2_gguf), engine_prompts(), num_pages=10,
                             kv_offload_bytes=host)
    assert [o.token_ids for o in outs] == alone
    assert stats.num_preemptions > 0
