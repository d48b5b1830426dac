"""A checkpoint folder with random weights in a real model's shape, made offline with transformers: the size people run
on CPUs, for speed measurements where the weights' values do not matter (the Hugging Face hub is not reachable here).

    python scripts/random_checkpoint.py ~/.cache/helios-models/qwen3-1.7b-random            # Qwen3-1.7B's shape
    python scripts/random_checkpoint.py OUT --shape qwen3-0.6b --dtype float32
    python scripts/random_checkpoint.py OUT.gguf --gguf                                     # weights only, as Q4_K / Q6_K

The folder holds bfloat16 (or --dtype) safetensors, transformers' config.json and SmolLM2's tokenizer (from the
embedded GGUF; its 49,152 ids lie inside every shape's vocabulary), so `LLM(OUT)`, `helios serve --model OUT` and vLLM
read it. The shapes are the released models' config fields; the weights are transformers' random initialisation
(seed 0), so two runs write the same bytes.

With --gguf it writes one GGUF file instead: the same shape's metadata and tensors, the matrices as random K-quant
blocks with small scales (Q6_K for the embedding, attn_v and ffn_down, Q4_K for the rest, as a Q4_K_M file mixes
them; the norms float32), and no tokenizer: a file for measuring what loading costs (`scripts/load_memory.py`), not
for serving.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

SHAPES = {  # name -> Qwen3Config fields (the released models' config.json)
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
}
COMMON = dict(vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)


def write(out: Path, shape: str, dtype: torch.dtype) -> Path:
    from transformers import AutoModelForCausalLM, Qwen3Config
    from helios.tokenizer import load_tokenizer
    from helios.weights import default_model_path
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = Qwen3Config(**COMMON, **SHAPES[shape])
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(out)
    tok = load_tokenizer(default_model_path())
    tok.backend.save(str(out / "tokenizer.json"))
    # tokenizer_class: without it transformers reads the folder with the class of config.json's model_type (Qwen2's),
    # whose own pre-tokenizer splits text differently from SmolLM2's, and llama.cpp's converter then knows no such tokenizer
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": tok.chat_template_source, "eos_token": "<|im_end|>", "bos_token": "<|im_start|>",
         "tokenizer_class": "PreTrainedTokenizerFast"}))
    return out


def write_gguf(out: Path, shape: str) -> Path:
    "A GGUF of the shape's tensors as random K-quant blocks (no tokenizer), written one tensor at a time."
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q, GGUFWriter
    f = {**COMMON, **SHAPES[shape]}
    hidden, inter, heads, kv, d = (f["hidden_size"], f["intermediate_size"], f["num_attention_heads"],
                                   f["num_key_value_heads"], f["head_dim"])
    matrices = {"token_embd.weight": (f["vocab_size"], hidden)}
    for i in range(f["num_hidden_layers"]):
        matrices |= {f"blk.{i}.attn_q.weight": (heads * d, hidden), f"blk.{i}.attn_k.weight": (kv * d, hidden),
                     f"blk.{i}.attn_v.weight": (kv * d, hidden), f"blk.{i}.attn_output.weight": (hidden, heads * d),
                     f"blk.{i}.ffn_gate.weight": (inter, hidden), f"blk.{i}.ffn_up.weight": (inter, hidden),
                     f"blk.{i}.ffn_down.weight": (hidden, inter)}
    norms = {"output_norm.weight": hidden} | {f"blk.{i}.{n}.weight": (d if n.endswith("q_norm") or n.endswith("k_norm")
                                                                         else hidden)
                                              for i in range(f["num_hidden_layers"])
                                              for n in ("attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm")}
    w = GGUFWriter(out, "qwen3")
    w.add_block_count(f["num_hidden_layers"]); w.add_context_length(f["max_position_embeddings"])
    w.add_embedding_length(hidden); w.add_feed_forward_length(inter)
    w.add_head_count(heads); w.add_head_count_kv(kv); w.add_key_length(d); w.add_value_length(d)
    w.add_rope_freq_base(f["rope_theta"]); w.add_layer_norm_rms_eps(f["rms_norm_eps"]); w.add_vocab_size(f["vocab_size"])
    rng = np.random.default_rng(0)
    for name, (rows, cols) in matrices.items():
        qtype = Q.Q6_K if name.split(".")[-2] in ("token_embd", "attn_v", "ffn_down") else Q.Q4_K
        block, size = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
        if qtype == Q.Q4_K:  # d and dmin (float16) lead the block
            raw[..., 0:2] = raw[..., 2:4] = np.array([0.002], dtype=np.float16).view(np.uint8)
        else:                # Q6_K: d (float16) ends it
            raw[..., size - 2:] = np.array([0.0002], dtype=np.float16).view(np.uint8)
        w.add_tensor(name, raw.reshape(rows, -1), raw_dtype=qtype)
    for name, n in norms.items(): w.add_tensor(name, np.ones(n, dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(progress=True); w.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=SHAPES, default="qwen3-1.7b")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--gguf", action="store_true", help="write OUT as one GGUF of random K-quant blocks instead")
    args = parser.parse_args()
    if args.gguf:
        path = write_gguf(args.out, args.shape)
        print(f"{path}: {args.shape}, Q4_K and Q6_K blocks, {path.stat().st_size / 1e9:.2f} GB")
        return
    path = write(args.out, args.shape, getattr(torch, args.dtype))
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    print(f"{path}: {args.shape}, {args.dtype}, {size / 1e9:.2f} GB of safetensors")


if __name__ == "__main__":
    main()
