"""Write a tiny GGUF from a transformers checkpoint, one quantization type per tensor kind.

llama.cpp's own converter is not a dependency; this writes the same layout for the tensors our
tests need, with the `gguf` package's writer. K-quant blocks (which `gguf` cannot quantize) are
random bytes with small, finite scales: both loaders then dequantize the very same bytes.
"""
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q, GGUFWriter
from gguf.quants import quantize

# which quantization each tensor kind gets: every type the loader must support appears once
TYPES = {"token_embd": Q.Q8_0, "attn_q": Q.Q4_K, "attn_k": Q.Q6_K, "attn_v": Q.Q4_0,
         "attn_output": Q.Q4_1, "ffn_gate": Q.BF16, "ffn_up": Q.F16, "ffn_down": Q.Q8_0, "output": Q.Q6_K,
         # qwen3moe: each layer's experts as 3-D tensors [experts, rows, cols]; the router stays float32
         "ffn_gate_exps": Q.Q8_0, "ffn_up_exps": Q.Q4_0, "ffn_down_exps": Q.F16}
HF_TO_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
              "post_attention_layernorm": "ffn_norm", "self_attn.q_norm": "attn_q_norm",
              "self_attn.k_norm": "attn_k_norm"}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight": return "token_embd.weight"
    if hf == "model.norm.weight": return "output_norm.weight"
    if hf == "lm_head.weight": return "output.weight"
    if hf.endswith(".mlp.experts.down_proj"): return f"blk.{hf.split('.')[2]}.ffn_down_exps.weight"
    if hf.endswith(".mlp.gate.weight"): return f"blk.{hf.split('.')[2]}.ffn_gate_inp.weight"
    _, _, layer, *part, kind = hf.split(".")
    return f"blk.{layer}.{HF_TO_GGUF['.'.join(part)]}.{kind}"


def gguf_tensors(sd: dict, tied: bool) -> dict[str, np.ndarray]:
    "llama.cpp's names for a transformers state dict; the stacked [gate | up] experts split into two 3-D tensors."
    out = {}
    for name, tensor in sd.items():
        if name == "lm_head.weight" and tied: continue
        arr = tensor.numpy()
        if name.endswith(".mlp.experts.gate_up_proj"):  # [E, 2I, H] -> gate [E, I, H], up [E, I, H]
            layer, inter = name.split(".")[2], arr.shape[1] // 2
            out[f"blk.{layer}.ffn_gate_exps.weight"] = np.ascontiguousarray(arr[:, :inter])
            out[f"blk.{layer}.ffn_up_exps.weight"] = np.ascontiguousarray(arr[:, inter:])
        else:
            out[gguf_name(name)] = arr
    return out


def permute_for_llama_cpp(w: np.ndarray, n_heads: int) -> np.ndarray:
    "llama.cpp's q/k row order for the llama architecture (pairs interleaved per head)."
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_k_blocks(rows: int, cols: int, qtype: Q, rng) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = np.array([0.002], dtype=np.float16).view(np.uint8)
    if qtype == Q.Q4_K:  # d, dmin (f16) lead the block
        raw[..., 0:2] = scale; raw[..., 2:4] = scale
    else:                # Q6_K: d (f16) ends the block
        raw[..., size - 2:size] = np.array([0.0002], dtype=np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def encode(w: np.ndarray, qtype: Q, rng) -> np.ndarray:
    if qtype == Q.F16: return w.astype(np.float16)
    if qtype in (Q.Q4_K, Q.Q6_K): return random_k_blocks(*w.shape, qtype, rng)
    return quantize(w, qtype)


def write_gguf(hf_folder: Path, out: Path, arch: str) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(hf_folder)
    sd = AutoModelForCausalLM.from_pretrained(hf_folder, dtype=torch.float32).state_dict()
    w = GGUFWriter(out, arch)
    w.add_block_count(cfg.num_hidden_layers); w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size); w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads); w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim); w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"]); w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    if arch == "qwen3moe":
        w.add_expert_count(cfg.num_experts); w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size); w.add_expert_weights_norm(cfg.norm_topk_prob)
    rng = np.random.default_rng(0)
    for t, arr in gguf_tensors(sd, cfg.tie_word_embeddings).items():
        kind = t.split(".")[-2] if t.startswith("blk.") else t.split(".")[0]
        if arch == "llama" and kind in ("attn_q", "attn_k"):
            arr = permute_for_llama_cpp(arr, cfg.num_attention_heads if kind == "attn_q" else cfg.num_key_value_heads)
        qtype = TYPES.get(kind, Q.F32) if arr.ndim >= 2 else Q.F32
        data = encode(arr, qtype, rng) if qtype != Q.F32 else arr
        w.add_tensor(t, data, raw_shape=data.shape if qtype in (Q.F32, Q.F16) else None, raw_dtype=qtype)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return out
