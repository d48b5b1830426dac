"""Tiny random Qwen3.5 and Qwen3.5-MoE checkpoints in several shapes, written by transformers (the reference), for the
hybrid tests of the model (test_hybrid), the engine (test_hybrid_engine) and the server (test_hybrid_served)."""
import torch
from conftest import PEAKED_INIT_RANGE

COMMON = dict(vocab_size=256, hidden_size=64, initializer_range=PEAKED_INIT_RANGE, max_position_embeddings=1024,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)
DENSE = dict(intermediate_size=96)
SHAPES = {  # qwen3_5 (dense MLP) and qwen3_5_moe (experts and a gated shared expert in every layer)
    # Qwen3.5's pattern (3 linear, 1 full), GQA 4/2, 2 key heads serving 4 value heads, conv 4, untied
    "interval4_gqa_conv4_untied": dict(**DENSE, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                                       linear_value_head_dim=12, linear_conv_kernel_dim=4, full_attention_interval=4,
                                       tie_word_embeddings=False),
    # every second layer full, one KV head, as many value heads as key heads, conv 2, tied
    "interval2_mqa_conv2_tied": dict(**DENSE, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                                     linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
                                     linear_value_head_dim=8, linear_conv_kernel_dim=2, full_attention_interval=2,
                                     tie_word_embeddings=True),
    # full attention first, half of each head rotated, q/k/v/o biases, 3 value heads on 1 key head, conv 3, tied
    "types_full_first_conv3_bias": dict(**DENSE, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                        linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=8,
                                        linear_value_head_dim=8, linear_conv_kernel_dim=3, attention_bias=True,
                                        layer_types=["full_attention", "linear_attention", "linear_attention"],
                                        rope_parameters=dict(rope_type="default", rope_theta=1e6,
                                                             partial_rotary_factor=0.5),
                                        tie_word_embeddings=True),
    # MoE: 8 experts, 2 per token, a shared expert 24 wide; every second layer full; conv 3; untied
    "moe_e8_top2_interval2_untied": dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                                         linear_value_head_dim=12, linear_conv_kernel_dim=3, full_attention_interval=2,
                                         num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                                         shared_expert_intermediate_size=24, tie_word_embeddings=False),
    # MoE: 4 experts, 1 per token, Qwen3.5's 3-to-1 pattern, conv 4, tied
    "moe_e4_top1_interval4_tied": dict(num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                       linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16,
                                       linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4,
                                       num_experts_per_tok=1, moe_intermediate_size=16,
                                       shared_expert_intermediate_size=16, tie_word_embeddings=True),
}


VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
              spatial_merge_size=2, temporal_patch_size=1, in_channels=3)  # a tiny vision tower beside the text model


def save_reference(shape: str, folder, multimodal: bool = False, **overrides):
    """transformers' random model of one shape, saved as a checkpoint folder (its norms and biases made nonzero):
    the text model alone, or (multimodal) as the released folders hold it, beside a tiny vision tower.
    overrides: text config fields (a vocabulary as large as a real tokenizer's, say)."""
    import transformers
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    family = "Qwen3_5Moe" if shape.startswith("moe") else "Qwen3_5"
    text = {**COMMON, **SHAPES[shape], **overrides}
    if multimodal:
        config = getattr(transformers, f"{family}Config")(text_config=text, vision_config=VISION,
                                                          tie_word_embeddings=text.pop("tie_word_embeddings"))
    else: config = getattr(transformers, f"{family}TextConfig")(**text)
    torch.manual_seed(0)
    reference = getattr(transformers, f"{family}{'ForConditionalGeneration' if multimodal else 'ForCausalLM'}")(config).eval()
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"): p.normal_(0, 0.3)  # zero at init
    reference.save_pretrained(folder)
    return reference
