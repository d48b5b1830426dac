"""A checkpoint folder with random weights in a real model's shape, made offline with transformers: the size people run
on CPUs, for speed measurements where the weights' values do not matter (the Hugging Face hub is not reachable here).

    python scripts/random_checkpoint.py ~/.cache/helios-models/qwen3-1.7b-random            # Qwen3-1.7B's shape
    python scripts/random_checkpoint.py OUT --shape qwen3-0.6b --dtype float32

The folder holds bfloat16 (or --dtype) safetensors, transformers' config.json and SmolLM2's tokenizer (from the
embedded GGUF; its 49,152 ids lie inside every shape's vocabulary), so `LLM(OUT)`, `helios serve --model OUT` and vLLM
read it. The shapes are the released models' config fields; the weights are transformers' random initialisation
(seed 0), so two runs write the same bytes.
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
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": tok.chat_template_source, "eos_token": "<|im_end|>", "bos_token": "<|im_start|>"}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=SHAPES, default="qwen3-1.7b")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    args = parser.parse_args()
    path = write(args.out, args.shape, getattr(torch, args.dtype))
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    print(f"{path}: {args.shape}, {args.dtype}, {size / 1e9:.2f} GB of safetensors")


if __name__ == "__main__":
    main()
