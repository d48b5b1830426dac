"""Qwen3-MoE against transformers (float32): tiny random checkpoints in several shapes, per-expert and stacked
folders; the routers of Qwen3-MoE, DeepSeek-V2 (greedy, group-limited) and DeepSeek-V3 against transformers'
own router classes; the grouped expert matmul against its loop."""
import pytest
import torch
from conftest import PEAKED_INIT_RANGE, transformers_greedy
from safetensors.torch import load_file, save_file

from helios.model.moe import (Experts, MoEConfig, Router, SparseMoE, expert_load, grouped_matmul, grouped_mm_runs, moe_layer,
                              stack_experts)
from helios.model.qwen3 import model_from_state_dict, stack_projections
from helios.reference import generate
from helios.weights import config_from_hf, load_hf_config, load_model

LOGIT_ATOL = 1e-4
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, initializer_range=PEAKED_INIT_RANGE, max_position_embeddings=1024, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)
SHAPES = {  # experts, top-k, norm_topk_prob, which layers are sparse, tied head
    "e4_top1_tied": dict(num_hidden_layers=2, num_experts=4, num_experts_per_tok=1, moe_intermediate_size=32,
                         norm_topk_prob=False, tie_word_embeddings=True),
    "e8_top2_mlp_only_untied": dict(num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                    norm_topk_prob=True, mlp_only_layers=[1], tie_word_embeddings=False),
    "e16_top4_step2_tied": dict(num_hidden_layers=4, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=16,
                                norm_topk_prob=True, decoder_sparse_step=2, tie_word_embeddings=True),
    "e12_top3_unnormed_untied": dict(num_hidden_layers=2, num_experts=12, num_experts_per_tok=3,
                                     moe_intermediate_size=24, norm_topk_prob=False, rope_theta=1e6,
                                     tie_word_embeddings=False),
}
FOLDERS = [*SHAPES, "e8_top2_mlp_only_untied-stacked"]


def transformers_model(shape: str):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**COMMON, **SHAPES[shape])).eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    """Each shape as save_pretrained writes it (every expert apart), and one folder in transformers' stacked
    layout (the model's own state_dict); name -> (folder, transformers model)."""
    made = {}
    for shape in SHAPES:
        model = transformers_model(shape)
        model.save_pretrained(folder := tmp_path_factory.mktemp(shape))
        made[shape] = (folder, model)
    model = made["e8_top2_mlp_only_untied"][1]
    folder = tmp_path_factory.mktemp("stacked")
    model.config.save_pretrained(folder)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    made["e8_top2_mlp_only_untied-stacked"] = (folder, model)
    return made


def load_ours(folder):
    "A checkpoint folder through chapter 04's loader (which stacks the experts with stack_experts)."
    return load_model(folder, dtype="float32", device="cpu").model


def test_loader_and_chapter_build_agree(checkpoints):
    "The loader's model and the one chapter 04a builds by hand compute the same logits."
    folder, _ = checkpoints["e8_top2_mlp_only_untied"]
    cfg = load_hf_config(folder)
    by_hand = model_from_state_dict(cfg, stack_experts(cfg, load_file(folder / "model.safetensors")), moe_layer)
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(load_ours(folder)(ids, torch.arange(12)[None]), by_hand(ids, torch.arange(12)[None]))


def test_formats_differ(checkpoints):
    "The two folder layouts really are different: 3 tensors per expert, or 2 per layer."
    per_expert = load_file(checkpoints["e8_top2_mlp_only_untied"][0] / "model.safetensors")
    stacked = load_file(checkpoints["e8_top2_mlp_only_untied-stacked"][0] / "model.safetensors")
    assert "model.layers.0.mlp.experts.7.up_proj.weight" in per_expert
    assert stacked["model.layers.0.mlp.experts.gate_up_proj"].shape == (8, 64, 64)


@pytest.mark.parametrize("name", FOLDERS)
def test_sparse_layers_as_transformers(checkpoints, name):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    folder, reference = checkpoints[name]
    ours = load_model(folder, dtype="float32", device="cpu", optimize=False).model  # linears as built
    assert [isinstance(layer.mlp, SparseMoE) for layer in ours.model.layers] == \
           [isinstance(layer.mlp, Qwen3MoeSparseMoeBlock) for layer in reference.model.layers]
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == reference.config.tie_word_embeddings


@pytest.mark.parametrize("name", FOLDERS)
@torch.no_grad()
def test_same_logits(checkpoints, name):
    folder, reference = checkpoints[name]
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    expected = reference(ids).logits
    got = load_ours(folder)(ids, torch.arange(40).expand(2, 40))
    assert (got - expected).abs().max().item() < LOGIT_ATOL
    assert expected.std() > 1.0  # peaked: greedy is decided by the model, not by rounding


@pytest.mark.parametrize("name", FOLDERS)
@torch.no_grad()
def test_same_greedy_tokens(checkpoints, name):
    "32 greedy tokens after 3 prompts: ours with the KV cache of chapter 06 (decode ticks of one token)."
    folder, reference = checkpoints[name]
    ours = load_ours(folder)
    for seed in range(3):
        prompt = torch.randint(0, 256, (5 + 6 * seed,), generator=torch.Generator().manual_seed(seed)).tolist()
        assert generate(ours, prompt, 32) == transformers_greedy(reference, prompt, 32)


def test_experts_already_gate_up_stacked(checkpoints):
    "Per-expert tensors whose gate and up were stacked first (chapter 03's stack_projections) load the same."
    folder, _ = checkpoints["e4_top1_tied"]
    cfg, sd = load_hf_config(folder), load_file(folder / "model.safetensors")
    pre_stacked = stack_projections(dict(sd))  # it takes the parts out of the dict it is given
    assert "model.layers.0.mlp.experts.2.gate_up_proj.weight" in pre_stacked
    a, b = stack_experts(cfg, sd), stack_experts(cfg, pre_stacked)
    for key in ("model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
        assert torch.equal(a[key], b[key])


def test_missing_expert_is_named(checkpoints):
    folder, _ = checkpoints["e16_top4_step2_tied"]
    cfg, sd = load_hf_config(folder), load_file(folder / "model.safetensors")
    assert cfg.moe.sparse_layers == (1, 3)
    del sd["model.layers.3.mlp.experts.11.down_proj.weight"]
    with pytest.raises(RuntimeError, match=r"model\.layers\.3\.mlp\.experts\.11\.down_proj\.weight"):
        stack_experts(cfg, sd)


# --- routers against transformers' router classes ---

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
             num_attention_heads=4)
MLA = dict(kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)


def router_cases():
    from transformers import DeepseekV2Config, DeepseekV3Config, Qwen3MoeConfig
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter
    v2 = lambda **kw: DeepseekV2Config(**SMALL, **MLA, **kw)
    v3 = lambda **kw: DeepseekV3Config(**SMALL, **MLA, first_k_dense_replace=1, **kw)
    return {
        "qwen3-top4-norm": (Qwen3MoeTopKRouter, Qwen3MoeConfig(**SMALL, num_experts=16, num_experts_per_tok=4,
                                                               norm_topk_prob=True)),
        "qwen3-top2": (Qwen3MoeTopKRouter, Qwen3MoeConfig(**SMALL, num_experts=8, num_experts_per_tok=2)),
        "v2-greedy": (DeepseekV2TopkRouter, v2(n_routed_experts=16, num_experts_per_tok=3, routed_scaling_factor=1.5)),
        "v2-group-limited": (DeepseekV2TopkRouter, v2(n_routed_experts=16, num_experts_per_tok=3, n_group=4,
                                                      topk_group=2, topk_method="group_limited_greedy",
                                                      routed_scaling_factor=16.0)),
        "v2-group-limited-1-group": (DeepseekV2TopkRouter, v2(n_routed_experts=12, num_experts_per_tok=2, n_group=6,
                                                              topk_group=1, topk_method="group_limited_greedy")),
        "v3-norm": (DeepseekV3TopkRouter, v3(n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                                             norm_topk_prob=True, routed_scaling_factor=2.5)),
        "v3-unnormed": (DeepseekV3TopkRouter, v3(n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                                                 norm_topk_prob=False, routed_scaling_factor=1.0)),
        "v3-one-group": (DeepseekV3TopkRouter, v3(n_routed_experts=8, num_experts_per_tok=3, n_group=1, topk_group=1,
                                                  norm_topk_prob=True, routed_scaling_factor=2.5)),
    }


@pytest.mark.parametrize("case", list(router_cases()))
@torch.no_grad()
def test_router_as_transformers(case):
    router_class, hf_config = router_cases()[case]
    torch.manual_seed(0)
    theirs = router_class(hf_config)
    torch.nn.init.normal_(theirs.weight)
    if hasattr(theirs, "e_score_correction_bias"): theirs.e_score_correction_bias.normal_(0, 0.3)
    ours = Router(config_from_hf(hf_config.to_dict()).moe, hf_config.hidden_size)
    ours.load_state_dict(theirs.state_dict())  # the same names: weight (and e_score_correction_bias)
    x = torch.randn(200, hf_config.hidden_size)
    logits, weights, experts = theirs(x)
    routing = ours(x)
    assert routing.weights.dtype == routing.logits.dtype == torch.float32 and routing.experts.dtype == torch.int64
    assert torch.equal(routing.logits, logits)
    e1, o1 = experts.sort(-1)
    e2, o2 = routing.experts.sort(-1)
    assert torch.equal(e1, e2)
    torch.testing.assert_close(routing.weights.gather(1, o2), weights.gather(1, o1), atol=1e-6, rtol=1e-6)


def test_router_logits_in_float32_for_bfloat16():
    moe = MoEConfig(8, 2, 16, (0,), scoring="sigmoid", topk_method="noaux_tc", num_groups=4, topk_groups=2)
    router = Router(moe, 32).to(torch.bfloat16)
    routing = router(torch.randn(5, 32, dtype=torch.bfloat16))
    assert routing.logits.dtype == routing.weights.dtype == torch.float32


# --- the grouped matmul ---

@torch.no_grad()
def test_grouped_matmul_equals_loop_and_handles_empty_experts():
    torch.manual_seed(0)
    w = torch.randn(6, 24, 32)                                    # [E, N, K]
    counts = torch.tensor([3, 0, 5, 0, 0, 4])                     # experts 1, 3, 4 get no tokens
    x = torch.randn(12, 32)
    expected = torch.cat([x[:3] @ w[0].T, x[3:8] @ w[2].T, x[8:] @ w[5].T])
    assert grouped_mm_runs(x, w)
    torch.testing.assert_close(grouped_matmul(x, w, counts, grouped=True), expected)
    torch.testing.assert_close(grouped_matmul(x, w, counts, grouped=False), expected)
    assert grouped_matmul(x[:0], w, torch.zeros(6, dtype=torch.int64)).shape == (0, 24)


@torch.no_grad()
def test_experts_in_bfloat16_close_to_float32():
    torch.manual_seed(0)
    experts, router = Experts(8, 64, 32), Router(MoEConfig(8, 2, 32, (0,), norm_topk_prob=True), 64)
    x = torch.randn(10, 64)
    routing = router(x)
    assert expert_load(routing, 8).sum() == 20
    full = experts(x, routing)
    half = experts.to(torch.bfloat16)(x.bfloat16(), routing)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), full, atol=0.05, rtol=0.05)


@torch.no_grad()
def test_sparse_moe_keeps_the_shape():
    from helios.model.mla import tiny_deepseek_v3
    from helios.model.moe import tiny_qwen3_moe
    torch.manual_seed(0)
    for cfg in (tiny_qwen3_moe(), tiny_deepseek_v3()):
        moe = SparseMoE(cfg)
        x = torch.randn(2, 5, cfg.hidden_size)
        y = moe(x)
        assert y.shape == x.shape
        torch.testing.assert_close(moe(x.reshape(1, 10, -1)).reshape(2, 5, -1), y)  # packed or batched: the same
        assert (moe.shared_experts is not None) == bool(cfg.moe.num_shared_experts)
        names = set(dict(moe.named_parameters()))  # as a checkpoint names them under mlp.
        assert {"gate.weight", "experts.gate_up_proj", "experts.down_proj"} <= names
        assert ("gate.e_score_correction_bias" in names) == (cfg.moe.topk_method == "noaux_tc")


def test_bench_script_smoke(tmp_path, monkeypatch, threads):
    "scripts/moe_bench.py end to end on tiny shapes: both experiments, the JSON and the table."
    import json
    from _scripts import load_script
    bench = load_script("moe_bench")
    monkeypatch.setattr("sys.argv", ["moe_bench.py", "--smoke", "--out", str(tmp_path)])
    assert bench.main() == 0
    [written] = tmp_path.glob("*.json")
    result = json.loads(written.read_text())
    assert {p["tokens"] for p in result["grouped"]} == {1, 16} and len(result["layer"]["points"]) == 2
    assert "grouped/dense" in written.with_suffix(".md").read_text()
