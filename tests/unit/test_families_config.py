"""Reading the newer families' configs as transformers reads them: defaults for keys a config.json leaves out,
YaRN's original context, refusals that name what is wrong; and what loading keeps in float32."""
import pytest
import torch

from helios.config import YarnScaling
from helios.formats.gguf import _rope_scaling_from_gguf
from helios.weights import config_from_hf

V3 = dict(model_type="deepseek_v3", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
          num_attention_heads=4, max_position_embeddings=4096)


def test_keys_a_deepseek_v3_config_leaves_out_take_transformers_defaults():
    cfg = config_from_hf(V3)
    moe, mla = cfg.moe, cfg.mla
    assert moe.sparse_layers == (3,) and moe.num_experts == 256 and moe.top_k == 8 and moe.num_shared_experts == 1
    assert moe.norm_topk_prob and moe.routed_scaling_factor == 2.5 and (moe.num_groups, moe.topk_groups) == (8, 4)
    assert (mla.kv_lora_rank, mla.q_lora_rank, mla.qk_rope_head_dim, mla.rope_interleave) == (512, 1536, 64, True)
    assert cfg.head_dim == 64 and cfg.num_kv_heads == cfg.num_heads


def test_a_key_given_as_null_stays_null():
    assert config_from_hf({**V3, "q_lora_rank": None}).mla.q_lora_rank is None  # DeepSeek-V2-Lite has no q bottleneck


def test_yarn_reads_the_original_context_from_the_top_level_first():
    rope = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=1.0)
    inner = config_from_hf({**V3, "rope_scaling": rope})
    top = config_from_hf({**V3, "rope_scaling": rope, "original_max_position_embeddings": 2048})
    bare = config_from_hf({**V3, "rope_scaling": {k: v for k, v in rope.items() if k != "original_max_position_embeddings"}})
    assert inner.rope_scaling.original_max_position_embeddings == 4096
    assert top.rope_scaling.original_max_position_embeddings == 2048
    assert bare.rope_scaling.original_max_position_embeddings == 4096  # max_position_embeddings, as transformers does


def test_yarn_frequencies_match_transformers_even_for_a_backward_range():
    from transformers import DeepseekV3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from helios.model.attention import rope_inv_freq
    for theta, factor, original in ((10000.0, 40.0, 4096), (2.0, 8.0, 4096), (1e6, 4.0, 32768)):
        rope = dict(rope_type="yarn", rope_theta=theta, factor=factor, original_max_position_embeddings=original)
        hf = DeepseekV3Config(**{k: v for k, v in V3.items() if k != "model_type"}, rope_parameters=rope)
        expected, factor_hf = ROPE_INIT_FUNCTIONS["yarn"](hf)
        cfg = config_from_hf({**V3, "rope_parameters": rope})
        torch.testing.assert_close(rope_inv_freq(cfg.head_dim, theta, cfg.rope_scaling), expected)
        assert cfg.rope_scaling.cos_sin_factor == pytest.approx(factor_hf)


def test_refusals_name_what_is_wrong():
    with pytest.raises(ValueError, match="fp8"):
        config_from_hf({**V3, "quantization_config": {"quant_method": "fp8"}})
    with pytest.raises(ValueError, match="noaux_tc"):
        config_from_hf({**V3, "model_type": "deepseek_v2", "topk_method": "noaux_tc"})


def test_gguf_yarn_is_read_and_other_stretches_are_refused():
    meta = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32768}
    assert _rope_scaling_from_gguf(lambda k, d=None: meta.get(k, d)) == YarnScaling(4.0, 32768)
    assert _rope_scaling_from_gguf(lambda k, d=None: {"rope.scaling.type": "none"}.get(k, d)) is None
    linear = {"rope.scaling.type": "linear", "rope.scaling.factor": 2.0}
    with pytest.raises(ValueError, match="linear"):
        _rope_scaling_from_gguf(lambda k, d=None: linear.get(k, d))


def test_routers_stay_float32_in_a_bfloat16_model_and_extra_layers_are_dropped(tmp_path):
    from safetensors.torch import load_file, save_file
    from conftest import save_family
    from helios.weights import load_model
    folder = save_family("deepseek_v3", tmp_path / "v3")
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.3.eh_proj.weight"] = torch.zeros(4, 4)  # as DeepSeek-V3's multi-token-prediction layer
    save_file(tensors, folder / "model.safetensors")
    model = load_model(folder, dtype="bfloat16", device="cpu").model
    gate = model.model.layers[1].mlp.gate
    assert gate.weight.dtype == gate.e_score_correction_bias.dtype == torch.float32
    assert model.model.layers[1].mlp.experts.down_proj.dtype == torch.bfloat16
