#!/usr/bin/env python3
"""A Qwen3.5 hybrid against a dense Qwen3 of about the same size, through the paged engine on this CPU: chapter 20's
measured section.

Both models have random weights (float32, PyTorch's matmuls, so that the comparison is of the layers, not of a
kernel one of them has), the same hidden size, vocabulary and MLP, and about the same parameters:

- the dense model: every layer GQA attention (12/4 heads of 64);
- the hybrid: three of every four layers Gated DeltaNet (8 key / 16 value heads of 64), every fourth gated full
  attention (12/4 heads of 64, a quarter of each rotated).

Three measurements, each the median of `--rounds` runs:

- prefill: time to the first token of one prompt of `--prefill` tokens (chunks of `prefill_chunk_size`);
- decode: output tokens per second of `--batch` requests generating `--decode` tokens each at once;
- a repeated prefix: the time to first token of a prompt whose first `--prefix` tokens an earlier request ran, with
  prefix caching (the hybrid starts from the state snapshot at the last cached block) and without (it prefills all).

    python scripts/hybrid_bench.py            # writes benchmarks/results/hybrid/<cpu>.md
    python scripts/hybrid_bench.py --smoke    # tiny sizes, printed only
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch

from helios.config import EngineConfig, ModelConfig
from helios.engine import Engine
from helios.model.hybrid import HybridConfig, hybrid_layer
from helios.model.qwen3 import CausalLM, DecoderLayer
from helios.sampling import SamplingParams
from helios.tokenizer import load_tokenizer
from helios.weights import default_model_path

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "hybrid"


def machine() -> str:
    "lscpu's model name, the vector flags that decide CPU speed, and the load."
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    field = lambda key: next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith(key)), "")
    flags = [f for f in field("Flags").split() if f.startswith(("avx512_bf16", "amx", "avx2"))]
    return f"{field('Model name')} ({', '.join(flags)}), {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"


def models(hidden: int, layers: int, vocab: int) -> dict[str, CausalLM]:
    "The dense model and the hybrid, random weights, float32."
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden * 2 // 3, num_layers=layers,
                  num_heads=12, num_kv_heads=4, rms_norm_eps=1e-6, max_position_embeddings=16384,
                  tie_word_embeddings=True)
    dense = ModelConfig(architecture="qwen3", head_dim=64, qk_norm=True, **common)
    hybrid = HybridConfig(architecture="qwen3_5", head_dim=16, attention_head_dim=64, qk_norm=True,
                          layer_types=tuple("full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)),
                          linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=64,
                          linear_value_head_dim=64, conv_kernel_size=4, **common)
    torch.manual_seed(0)
    out = {"dense qwen3": CausalLM(dense, DecoderLayer), "hybrid qwen3_5": CausalLM(hybrid, hybrid_layer)}
    for model in out.values():
        with torch.no_grad():
            for p in model.parameters(): p.normal_(0, 0.02)
        model.eval()
    return out


def engine(model: CausalLM, tokenizer, prefix_caching: bool = True) -> Engine:
    config = EngineConfig(max_batch_size=16, kv_cache_bytes=1 << 30, enable_prefix_caching=prefix_caching)
    return Engine.create(model, tokenizer, [], config)


def ttft(eng: Engine, prompt: list[int]) -> float:
    "Seconds from submit to the first token of one request run alone."
    start = time.perf_counter()
    handle = eng.submit(prompt, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    while eng.step(): pass
    handle.result()
    return time.perf_counter() - start


def decode_rate(eng: Engine, batch: int, tokens: int, vocab: int) -> float:
    "Output tokens per second of `batch` short requests generating `tokens` each at once."
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    handles = [eng.submit([(31 * i + j) % vocab for j in range(16)], params) for i in range(batch)]
    while eng.step():
        if eng.scheduler.running and not any(s.is_prefilling for s in eng.scheduler.running): break  # all decoding
    start, before = time.perf_counter(), eng.stats().num_generated_tokens
    while eng.step(): pass
    for h in handles: h.result()
    return (eng.stats().num_generated_tokens - before) / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--prefix", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke: args.hidden, args.layers, args.prefill, args.prefix, args.decode, args.rounds = 96, 4, 300, 600, 4, 1
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(default_model_path())
    vocab = tokenizer.vocab_size
    rows, before = [], machine()
    for name, model in models(args.hidden, args.layers, vocab).items():
        params = sum(p.numel() for p in model.parameters()) / 1e6
        gen = torch.Generator().manual_seed(1)
        prompt = lambda n: torch.randint(0, vocab, (n,), generator=gen).tolist()
        prefill = statistics.median(ttft(engine(model, tokenizer), prompt(args.prefill)) for _ in range(args.rounds))
        decode = statistics.median(decode_rate(engine(model, tokenizer), args.batch, args.decode, vocab)
                                   for _ in range(args.rounds))
        repeated = {}
        for caching in (True, False):
            times = []
            for _ in range(args.rounds):
                eng, shared = engine(model, tokenizer, caching), prompt(args.prefix)
                ttft(eng, shared + prompt(8))  # an earlier request with the same first `prefix` tokens
                times.append(ttft(eng, shared + prompt(8)))
            repeated[caching] = statistics.median(times)
        rows.append((name, params, args.prefill / prefill, prefill, decode, repeated[True], repeated[False]))
        print(rows[-1], flush=True)
    lines = [f"# A hybrid against a dense model of about its size, through the engine ({args.threads} threads, float32)",
             "", f"Machine: {before} before; load {os.getloadavg()[0]:.2f} after.", "",
             f"`python scripts/hybrid_bench.py` (hidden {args.hidden}, {args.layers} layers, medians of {args.rounds})", "",
             f"| model | parameters | prefill of {args.prefill:,} tokens: tok/s (TTFT s) | decode, {args.batch} at once: "
             f"tok/s | TTFT after a repeated {args.prefix:,}-token prefix: cached / not cached (s) |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {n} | {p:,.0f} M | {r:,.0f} ({t:.2f}) | {d:,.1f} | {c:.3f} / {u:.3f} |" for n, p, r, t, d, c, u in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.smoke:
        RESULTS.mkdir(parents=True, exist_ok=True)
        cpu = before.split(" (")[0].lower().replace("(r)", "").replace(" ", "-")
        (RESULTS / f"{cpu}.md").write_text(text)


if __name__ == "__main__":
    main()
