"""Multi-head latent attention (DeepSeek-V2/V3) against transformers on tiny random checkpoints (float32): logits,
greedy tokens, the absorbed and expanded forms, chapter 06's contiguous cache and chapter 08's paged pool."""
from pathlib import Path

import pytest
import torch

from conftest import PEAKED_INIT_RANGE, transformers_greedy
from helios.attention.base import PagedKV
from helios.attention.reference import BatchedAttention, ReferenceAttention
from helios.weights import load_hf_config
from helios.formats.hf import load_safetensors
from helios.kv.batch import build_paged_batch
from helios.kv.pool import KVPool
from helios.model.mla import FORMS, MLAttention, cheaper_form, deepseek_layer, mla_state_dict
from helios.model.moe import stack_experts
from helios.model.qwen3 import CausalLM, model_from_state_dict
from helios.reference import KVCache, decode_one_token, generate, prefill
from helios.weights import load_model

# Max abs logit difference to transformers in float32 (logits of these peaked models are O(10)). The expanded form
# multiplies in transformers' order; the absorbed one associates the up-projections the other way round, which
# moves the logits of these large random weights by up to ~2e-4 after a few layers. A wrong scale, rope order or
# split of kv_b_proj moves them by O(1).
LOGIT_ATOL = {"expanded": 2e-4, "absorbed": 5e-4}  # expanded: 1.05e-4 seen on an AVX-512 AMD EPYC (Zen 4)
STEPS = 32
PROMPT_LENS = (7, 12, 17)

YARN_V2 = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=256,
               beta_fast=32, beta_slow=1, mscale=0.707, mscale_all_dim=0.707)
YARN_V3 = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=256,
               beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=0.5)  # unequal: cos/sin scaled too
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=1024, initializer_range=PEAKED_INIT_RANGE,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)
SHAPES = {
    # V2: one query projection, YaRN, tied head; 4 experts, top-1, two shared; the first layer dense
    "v2_qproj_yarn_tied": ("DeepseekV2Config", dict(
        q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, rope_parameters=YARN_V2,
        tie_word_embeddings=True, n_routed_experts=4, num_experts_per_tok=1, n_shared_experts=2, first_k_dense_replace=1)),
    # V2: query bottleneck, attention biases, group-limited routing over 16 experts, top-3; every layer sparse
    "v2_lora_groups_bias": ("DeepseekV2Config", dict(
        q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=16, v_head_dim=24, attention_bias=True,
        topk_method="group_limited_greedy", n_group=4, topk_group=2, n_routed_experts=16, num_experts_per_tok=3,
        n_shared_experts=1, routed_scaling_factor=2.0, first_k_dense_replace=0)),
    # V2: three layers, two of them dense; a wide latent with a narrow rope key and narrow values
    "v2_dense_first": ("DeepseekV2Config", dict(
        num_hidden_layers=3, q_lora_rank=None, kv_lora_rank=48, qk_nope_head_dim=12, qk_rope_head_dim=4, v_head_dim=8,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=2)),
    # V3: interleaved rope with YaRN (unequal mscales), bottleneck, 8 experts in 4 groups, one shared
    "v3_interleave_yarn": ("DeepseekV3Config", dict(
        q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, rope_parameters=YARN_V3,
        n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1, first_k_dense_replace=1)),
    # V3: rope in halves (rope_interleave off), one query projection, tied; 16 experts top-4, no renormalising
    "v3_halves_tied": ("DeepseekV3Config", dict(
        rope_interleave=False, q_lora_rank=None, kv_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=16, v_head_dim=12,
        tie_word_embeddings=True, n_routed_experts=16, num_experts_per_tok=4, n_group=2, topk_group=1,
        norm_topk_prob=False, n_shared_experts=1, first_k_dense_replace=0)),
    # V3: interleaved, attention biases, three layers; 4 experts top-1 in one group, two shared
    "v3_bias_three_layers": ("DeepseekV3Config", dict(
        num_hidden_layers=3, q_lora_rank=16, kv_lora_rank=40, qk_nope_head_dim=4, qk_rope_head_dim=12, v_head_dim=20,
        attention_bias=True, n_routed_experts=4, num_experts_per_tok=1, n_group=1, topk_group=1, n_shared_experts=2,
        first_k_dense_replace=1)),
}


def save_tiny_deepseek(folder: Path, config_name: str, shape: dict) -> Path:
    "A tiny random DeepSeek checkpoint written by transformers' save_pretrained (per-expert tensors)."
    import transformers
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**{**COMMON, **shape})
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return folder


def helios_model(folder: Path) -> CausalLM:
    "Ours as the engine loads it (its matmuls may be replaced by packed ones)."
    return load_model(folder, dtype="float32", device="cpu").model


def plain_model(folder: Path) -> CausalLM:
    "Ours built step by step from the folder's tensors, every module as the chapters define it."
    cfg = load_hf_config(folder)
    tensors = load_safetensors(folder, torch.float32, torch.device("cpu"))
    return model_from_state_dict(cfg, stack_experts(cfg, mla_state_dict(cfg, tensors)), deepseek_layer)


class Tiny:
    "One tiny checkpoint: its folder, transformers' model and its greedy tokens, and ours (loaded, and plain)."
    def __init__(self, folder: Path):
        from transformers import AutoModelForCausalLM
        self.folder = folder
        self.hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.ours, self.plain = helios_model(folder), plain_model(folder)
        self.prompts = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist()
                        for n in PROMPT_LENS]
        self.expected = [transformers_greedy(self.hf, p, STEPS) for p in self.prompts]


@pytest.fixture(scope="module", params=list(SHAPES))
def tiny(request, tmp_path_factory) -> Tiny:
    return Tiny(save_tiny_deepseek(tmp_path_factory.mktemp(request.param), *SHAPES[request.param]))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    "Tiny models gain nothing from a second thread, and on a busy 2-core machine it mostly waits."
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def set_form(model: CausalLM, form: str):
    for layer in model.model.layers: layer.self_attn.form = form


@pytest.fixture
def forms_restored(tiny):
    yield
    set_form(tiny.ours, "auto")


@torch.no_grad()
@pytest.mark.parametrize("form", ["absorbed", "expanded"])
def test_same_logits_in_both_forms(tiny, form, forms_restored):
    ids = torch.randint(0, 256, (2, 30), generator=torch.Generator().manual_seed(1))
    expected = tiny.hf(ids).logits
    set_form(tiny.ours, form)
    got = tiny.ours(ids, torch.arange(30).expand(2, 30))
    assert (got - expected).abs().max().item() < LOGIT_ATOL[form]
    assert expected.std() > 1.0  # the weights really are peaked


def test_config_and_layers(tiny):
    cfg, layers = tiny.ours.config, tiny.ours.model.layers
    assert cfg.mla is not None and cfg.kv_layout.num_heads == 1 and cfg.kv_layout.v_in_k
    assert all(isinstance(layer.self_attn, MLAttention) for layer in layers)
    assert [type(layer.mlp).__name__ == "SparseMoE" for layer in layers] == [cfg.is_sparse(i) for i in range(len(layers))]
    assert cfg.tie_word_embeddings == tiny.hf.config.tie_word_embeddings
    if cfg.tie_word_embeddings: assert tiny.plain.lm_head.weight is tiny.plain.model.embed_tokens.weight


def test_greedy_tokens_through_the_contiguous_cache(tiny):
    "reference.generate: the prompt through kv.contexts (expanded), each decode step through kv.attend (absorbed)."
    for prompt, expected in zip(tiny.prompts, tiny.expected):
        assert generate(tiny.ours, prompt, STEPS) == expected


@torch.no_grad()
def test_rows_of_a_batch_through_the_contiguous_cache(tiny, forms_restored):
    "Two prompts side by side in one KVCache (rows 0 and 1), each form: the logits of a full recompute per row."
    ids = torch.tensor([p[:7] for p in tiny.prompts[1:]])                                   # [2, 7]
    for form in ("absorbed", "expanded"):
        set_form(tiny.ours, form)
        cache = KVCache(tiny.ours.config, 2, 16)
        steps = [prefill(tiny.ours, cache, ids)]
        nxt = steps[0].argmax(-1)
        for _ in range(3):
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            steps.append(decode_one_token(tiny.ours, cache, nxt))
            nxt = steps[-1].argmax(-1)
        set_form(tiny.ours, "expanded")
        full = tiny.ours(ids, torch.arange(ids.shape[1]).expand(2, -1))[:, -len(steps):]  # [2, 4, vocab]
        assert (torch.stack(steps, dim=1) - full).abs().max() < LOGIT_ATOL["absorbed"]


class CountingKV(PagedKV):
    "A PagedKV that records which of its two calls each layer made."
    def __init__(self, *args):
        super().__init__(*args)
        self.calls = []

    def attend(self, *args, **kwargs):
        self.calls.append("attend")
        return super().attend(*args, **kwargs)

    def contexts(self, *args, **kwargs):
        self.calls.append("contexts")
        return super().contexts(*args, **kwargs)

    def attend_stored(self, *args, **kwargs):
        self.calls.append("attend_stored")
        return super().attend_stored(*args, **kwargs)


@torch.no_grad()
def test_a_decode_tick_is_one_attend_call_per_layer(tiny):
    "auto: prompts go per sequence through contexts; a tick of decodes through one batched attend."
    model, num_layers, page_size = tiny.ours, tiny.ours.config.num_layers, 4
    pool = KVPool(model.config, 16, page_size, torch.float32, "cpu")
    tables = torch.arange(16).view(2, 8)
    prompts = torch.tensor([p[:7] for p in tiny.prompts[1:]])
    ticks = [(prompts.flatten(), [0, 0], [7, 7]), (prompts[:, -1], [7, 7], [1, 1])]  # prefill, then a decode
    for (ids, starts, lens), expected in zip(ticks, ["contexts", "attend"]):
        batch = build_paged_batch(tables, starts, lens, page_size)
        assert all((cheaper_form(model.config, n, c) == "absorbed") == (expected == "attend")
                   for n, c in zip(batch.query_lens, batch.context_lens))
        kv = CountingKV(pool, batch, BatchedAttention())
        model(ids[None], batch.positions[None], kv=kv, logits_at=batch.logits_indices)
        assert kv.calls == [expected] * num_layers


@torch.no_grad()
def test_a_mixed_tick_batches_its_absorbed_sequences(tiny, forms_restored):
    """A tick that packs a decode with a prefill chunk: the decode goes absorbed through one attend_stored call, the
    chunk expanded through contexts; each sequence's logits are those of a full recompute."""
    model, page_size = tiny.ours, 4
    set_form(model, "auto")
    pool = KVPool(model.config, 16, page_size, torch.float32, "cpu")
    tables = torch.arange(16).view(2, 8)
    a, b = tiny.prompts[1][:7], tiny.prompts[2][:7]
    first = build_paged_batch(tables[:1], [0], [6], page_size)  # a's first 6 tokens
    model(torch.tensor(a[:6])[None], first.positions[None], kv=PagedKV(pool, first, BatchedAttention()))
    mixed = build_paged_batch(tables, [6, 0], [1, 7], page_size)  # a decodes its 7th token, b's prompt arrives
    forms = [cheaper_form(model.config, n, c) for n, c in zip(mixed.query_lens, mixed.context_lens)]
    assert forms == ["absorbed", "expanded"]
    kv = CountingKV(pool, mixed, BatchedAttention())
    got = model(torch.tensor(a[6:] + b)[None], mixed.positions[None], kv=kv, logits_at=mixed.logits_indices)[0]
    assert kv.calls == ["attend_stored", "contexts"] * model.config.num_layers
    set_form(model, "expanded")
    for row, tokens in enumerate((a, b)):
        full = model(torch.tensor(tokens)[None], torch.arange(len(tokens))[None])[0, -1]
        assert (got[row] - full).abs().max() < LOGIT_ATOL["absorbed"]


def paged_greedy(model: CausalLM, prompts: list[list[int]], backend, chunk: int = 5, page_size: int = 4) -> list[list[int]]:
    """Every prompt at once through a KVPool: prompts in chunks of `chunk` tokens, packed with the decode steps of
    the sequences already generating; pages of different sequences interleaved, so no sequence's are consecutive."""
    cfg, B = model.config, len(prompts)
    pages_each = -(-(max(map(len, prompts)) + STEPS) // page_size)
    pool = KVPool(cfg, B * pages_each, page_size, torch.float32, "cpu")
    tables = torch.arange(B * pages_each).view(pages_each, B).T.contiguous()  # sequence i: pages i, i + B, ...
    tokens, done, out = [list(p) for p in prompts], [0] * B, [[] for _ in prompts]
    with torch.no_grad():
        while any(len(o) < STEPS for o in out):
            active = [i for i in range(B) if len(out[i]) < STEPS]
            lens = [min(chunk, len(tokens[i]) - done[i]) for i in active]
            batch = build_paged_batch(tables[active], [done[i] for i in active], lens, page_size)
            ids = torch.tensor([t for i, n in zip(active, lens) for t in tokens[i][done[i]:done[i] + n]])[None]
            logits = model(ids, batch.positions[None], kv=PagedKV(pool, batch, backend), logits_at=batch.logits_indices)
            for row, (i, n) in enumerate(zip(active, lens)):
                done[i] += n
                if done[i] == len(tokens[i]):  # the sequence's last known token: its logits give the next one
                    out[i].append(int(logits[0, row].argmax()))
                    tokens[i].append(out[i][-1])
    return out


@pytest.mark.parametrize("form", FORMS)
def test_greedy_tokens_through_the_paged_pool(tiny, form, forms_restored):
    "Chunked prefill packed with decodes, over scattered pages; each form forced, and auto (mixed per tick)."
    set_form(tiny.ours, form)
    assert paged_greedy(tiny.ours, tiny.prompts, BatchedAttention()) == tiny.expected


def test_reference_backend_through_the_paged_pool(tiny):
    assert paged_greedy(tiny.ours, tiny.prompts, ReferenceAttention(), chunk=64) == tiny.expected


@torch.no_grad()
def test_own_state_dict_passes_through(tiny):
    "A model's own state_dict has the layer's names already: mla_state_dict leaves it (no second permutation)."
    cfg, own = tiny.plain.config, dict(tiny.plain.state_dict())
    names = set(own)  # mla_state_dict changes the dict it is given: compare with the names before
    assert set(mla_state_dict(cfg, own)) == names
    rebuilt = model_from_state_dict(cfg, mla_state_dict(cfg, own), deepseek_layer)
    ids = torch.arange(1, 11)[None]
    expected = tiny.hf(ids).logits
    assert torch.equal(rebuilt(ids, torch.arange(10)[None]), tiny.plain(ids, torch.arange(10)[None]))
    assert (rebuilt(ids, torch.arange(10)[None]) - expected).abs().max() < LOGIT_ATOL["expanded"]


def test_cheaper_form_and_the_override():
    from helios.model.mla import tiny_deepseek_v3
    cfg = tiny_deepseek_v3()
    assert cheaper_form(cfg, 1, 2048) == "absorbed"        # decode over a long context
    assert cheaper_form(cfg, 512, 512) == "expanded"       # a prompt attending over itself
    assert MLAttention(cfg, 0, form="expanded").form == "expanded"
    with pytest.raises(ValueError, match="form must be one of"):
        MLAttention(cfg, 0, form="latent")


@torch.no_grad()
def test_without_shared_experts(tmp_path):
    folder = save_tiny_deepseek(tmp_path, "DeepseekV3Config", dict(
        q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=0, first_k_dense_replace=1))
    from transformers import AutoModelForCausalLM
    ids = torch.arange(1, 21)[None]
    expected = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(ids).logits
    assert (helios_model(folder)(ids, torch.arange(20)[None]) - expected).abs().max() < LOGIT_ATOL["expanded"]
