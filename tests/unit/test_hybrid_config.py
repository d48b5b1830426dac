"""Qwen3.5's config.json read into a HybridConfig (chapter 20): the layer pattern from layer_types or
full_attention_interval, the multimodal layout, partial RoPE, the checkpoint's names, and the errors."""
import pytest
import torch

from helios.model.hybrid import adapt_state_dict, checkpoint_name, config_from_hf, tiny_qwen3_5

TEXT = dict(model_type="qwen3_5_text", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=8,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=4)


def test_full_attention_interval_decides_the_layers():
    cfg = config_from_hf({**TEXT, "full_attention_interval": 2})
    assert cfg.full_attention_layers == (1, 3, 5, 7) and cfg.linear_layers == (0, 2, 4, 6)
    assert config_from_hf(TEXT).full_attention_layers == (3, 7)  # 4 when not given, as transformers assumes


def test_multimodal_config_reads_its_text_config():
    d = {"model_type": "qwen3_5", "tie_word_embeddings": True, "vision_config": {"depth": 2},
         "text_config": {**TEXT, "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
                                                     "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1]}}}
    cfg = config_from_hf(d)
    assert cfg.architecture == "qwen3_5" and cfg.tie_word_embeddings
    assert (cfg.head_dim, cfg.attention_head_dim, cfg.rope_theta) == (8, 16, 1e7)  # head_dim: the rotated part
    assert cfg.q_size == 64 and cfg.kv_layout.values_per_token == 2 * 2 * 16
    assert cfg.kv_bytes_per_token(2) == 2 * 2 * 2 * 16 * 2  # two full-attention layers of eight


def test_checkpoint_names_and_adapt_state_dict_rename_and_uncentre():
    cfg = tiny_qwen3_5()
    sd = {"model.language_model.layers.0.linear_attn.in_proj_z.weight": torch.ones(2),
          "model.language_model.layers.0.linear_attn.norm.weight": torch.ones(2),
          "model.language_model.layers.3.self_attn.q_norm.weight": torch.zeros(2),
          "model.language_model.layers.0.input_layernorm.weight": torch.zeros(2),
          "model.language_model.norm.weight": torch.full((2,), 0.5),
          "model.visual.blocks.0.attn.qkv.weight": torch.ones(2), "mtp.fc.weight": torch.ones(2)}
    text = {checkpoint_name(name): t for name, t in sd.items() if checkpoint_name(name) is not None}  # as the loader reads
    out = adapt_state_dict(cfg, text)
    assert sorted(out) == ["model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.in_proj_z.weight",
                           "model.layers.0.self_attn.norm.weight", "model.layers.3.self_attn.q_norm.weight",
                           "model.norm.weight"]
    assert out["model.layers.0.self_attn.norm.weight"].tolist() == [1.0, 1.0]    # the gated norm: as stored
    assert out["model.layers.3.self_attn.q_norm.weight"].tolist() == [1.0, 1.0]  # zero-centred: 1 + w
    assert out["model.norm.weight"].tolist() == [1.5, 1.5]


@pytest.mark.parametrize("change,words", [
    (dict(model_type="qwen3_next"), "qwen3_next"),
    (dict(layer_types=["linear_attention"] * 3), "layer_types"),
    (dict(layer_types=["linear_attention"] * 7 + ["sliding_attention"]), "layer_types"),
    (dict(linear_num_value_heads=3), "linear_num_value_heads=3"),
    (dict(num_key_value_heads=3), "num_kv_heads=3"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "rope_type 'yarn'"),
    (dict(quantization_config={"quant_method": "fp8"}), "weights are fp8"),
])
def test_errors_name_the_field(change, words):
    with pytest.raises(ValueError, match=words):
        config_from_hf({**TEXT, **change})


def test_moe_config_puts_experts_in_every_layer():
    cfg = config_from_hf({**TEXT, "model_type": "qwen3_5_moe_text", "num_experts": 8, "num_experts_per_tok": 2,
                          "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24})
    assert cfg.architecture == "qwen3_5_moe" and cfg.moe.sparse_layers == tuple(range(8))
    assert (cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.norm_topk_prob, cfg.moe.num_shared_experts) == (8, 2, True, 0)
    assert cfg.shared_expert_intermediate_size == 24 and cfg.attention_layers_only().moe is None


def test_describe_names_both_kinds_of_layer():
    assert tiny_qwen3_5().describe(4) == ("qwen3_5: 3 Gated DeltaNet layers (2/4 heads), 1 full attention (GQA 4/2 "
                                          "heads x 16); KV 256 B/token, state 7,488 B/sequence")
