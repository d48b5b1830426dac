#!/usr/bin/env python3
"""Tensor and pipeline parallelism on this machine (CPU, gloo): chapter 16's measured section.

Two measurements, recorded, not asserted:

- `all_reduce`: the median time of one gloo all-reduce of a float32 [tokens, hidden] tensor between two processes
  of one thread each: what every attention block and every MLP costs in communication under tensor parallelism.
- `engine`: one random Qwen3-shaped checkpoint (float32) served by `LLM` three ways on the same cores: one
  process with all the threads (tp=1), two processes of one thread each splitting every layer (tp=2), and two
  stages of one thread each (pp=2). A decode workload (16 requests x 64 tokens after 16-token prompts) and a
  prefill workload (4 prompts of 512 tokens, one output token each); each layout repeated `--repeats` times, the
  median and the range reported. Each decode tick's communication is estimated from the all-reduce medians
  (two all-reduces per layer at the tick's token count) and set against the measured tick time.

The machine (lscpu model name and vector flags) and the load average before and after are recorded.

    python scripts/parallel_bench.py           # writes benchmarks/results/parallel/<cpu>.json and .md
    python scripts/parallel_bench.py --smoke   # a tiny model, one repeat, written to a temporary folder
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from helios import LLM, SamplingParams
from helios.bench.metrics import machine_info
from helios.distributed.groups import measure_all_reduce
from helios.tokenizer import load_tokenizer
from helios.weights import default_model_path

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "parallel"
SHAPE = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16,
             num_key_value_heads=8, head_dim=64)
SMOKE_SHAPE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32)
ALL_REDUCE_TOKENS = (1, 4, 16, 64, 256, 1024)
LAYOUTS = {"tp=1, 2 threads": dict(), "tp=2, 1 thread each": dict(tensor_parallel_size=2),
           "pp=2, 1 thread each": dict(pipeline_parallel_size=2)}


def flags() -> list[str]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    line = next((l for l in lscpu.splitlines() if l.startswith("Flags")), "")
    return [f for f in line.split() if f in ("avx2", "fma") or f.startswith(("avx512", "amx"))]


def write_checkpoint(folder: Path, shape: dict) -> Path:
    "A random Qwen3 checkpoint (tied embeddings, SmolLM2's tokenizer) with Hugging Face names."
    torch.manual_seed(0)
    vocab, h, inter, layers = 49152, shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    q, kv = shape["num_attention_heads"] * shape["head_dim"], shape["num_key_value_heads"] * shape["head_dim"]
    rand = lambda *s: torch.randn(*s) * 0.02
    tensors = {"model.embed_tokens.weight": rand(vocab, h), "model.norm.weight": torch.ones(h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
                    p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
                    p + "self_attn.q_norm.weight": torch.ones(shape["head_dim"]),
                    p + "self_attn.k_norm.weight": torch.ones(shape["head_dim"]),
                    p + "mlp.gate_proj.weight": rand(inter, h), p + "mlp.up_proj.weight": rand(inter, h),
                    p + "mlp.down_proj.weight": rand(h, inter),
                    p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h)}
    save_file(tensors, folder / "model.safetensors")
    config = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=vocab, rms_norm_eps=1e-6,
                  rope_theta=1e6, max_position_embeddings=4096, tie_word_embeddings=True, **shape)
    (folder / "config.json").write_text(json.dumps(config))
    tok = load_tokenizer(default_model_path())
    tok.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return folder


def run_layout(folder: Path, layout: dict, repeats: int, decode: tuple[int, int], prefill: tuple[int, int]) -> dict:
    "Output tok/s of the decode workload and prompt tok/s of the prefill one, each repeat with fresh prompts."
    torch.set_num_threads(2)
    settings = dict(dtype="float32", device="cpu", max_batch_size=16, prefill_chunk_size=512, kv_cache_bytes=2**28,
                    quiet=True, **layout)
    decode_rates, prefill_rates, tick_ms, comm_shares = [], [], [], []
    with LLM(folder, **settings) as llm:
        llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
        for r in range(repeats):
            n, out = decode
            prompts = [[(101 * r + 13 * i + j) % 40000 + 10 for j in range(16)] for i in range(n)]
            before, waited = llm.stats().num_ticks, collective_seconds(llm)
            start = time.perf_counter()
            llm.generate(prompts, SamplingParams(temperature=0, max_tokens=out, ignore_eos=True), use_tqdm=False)
            seconds = time.perf_counter() - start
            decode_rates.append(n * out / seconds)
            tick_ms.append(1000 * seconds / (llm.stats().num_ticks - before))
            comm_shares.append((collective_seconds(llm) - waited) / seconds)
            n, length = prefill
            prompts = [[(7 * r + 3 * i + j) % 40000 + 10 for j in range(length)] for i in range(n)]
            start = time.perf_counter()
            llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
            prefill_rates.append(n * length / (time.perf_counter() - start))
    summary = lambda xs: dict(median=statistics.median(xs), low=min(xs), high=max(xs), runs=xs)
    return dict(decode_tok_s=summary(decode_rates), decode_tick_ms=summary(tick_ms), prefill_tok_s=summary(prefill_rates),
                decode_collective_share=summary(comm_shares))


def collective_seconds(llm: LLM) -> float:
    "Seconds rank 0 has spent in blocking collectives (waiting for the other ranks included); 0 for one process."
    groups = getattr(llm.engine.runner, "groups", None)
    return 0.0 if groups is None else groups.world.seconds + groups.tp.seconds


def report_md(result: dict) -> str:
    m, shape = result["machine"], result["shape"]
    lines = [f"# Parallelism on {m['cpu']} ({m['cpus']} CPUs; {' '.join(m['flags'])})", "",
             f"torch {m['torch']}; load average before {result['load_before']}, after {result['load_after']}. "
             f"Command: `python scripts/parallel_bench.py`.", "",
             "## One gloo all-reduce of float32 [tokens, hidden], two processes of one thread", "",
             "| tokens | " + " | ".join(f"hidden {h}" for h in result["all_reduce"]) + " |",
             "| --- |" + " --- |" * len(result["all_reduce"])]
    for i, t in enumerate(result["all_reduce_tokens"]):
        lines.append(f"| {t} | " + " | ".join(f"{1e6 * v[i]:.0f} µs" for v in result["all_reduce"].values()) + " |")
    lines += ["", f"## LLM on a random Qwen3 ({shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
              f"{shape['num_attention_heads']}/{shape['num_key_value_heads']} heads, MLP {shape['intermediate_size']}; float32)", "",
              f"Decode: {result['decode'][0]} requests x {result['decode'][1]} tokens; prefill: {result['prefill'][0]} prompts "
              f"x {result['prefill'][1]} tokens. Median of {result['repeats']} (range).", "",
              "Collectives: the share of the decode run rank 0 spent in blocking collectives (the wait for the other "
              "ranks included); all-reduce alone: the table above's time at the tick's token count, two per layer.", "",
              "| layout | decode out tok/s | decode tick | rank 0 in collectives | all-reduce alone (est.) | prefill tok/s |",
              "| --- | --- | --- | --- | --- | --- |"]
    fmt = lambda s, f: f"{f.format(s['median'])} ({f.format(s['low'])}–{f.format(s['high'])})"
    for name, r in result["engine"].items():
        share = f"{100 * r['comm_share']:.0f}%" if r.get("comm_share") is not None else "—"
        waited = r["decode_collective_share"]
        waited = f"{100 * waited['median']:.0f}%" if waited["median"] else "—"
        lines.append(f"| {name} | {fmt(r['decode_tok_s'], '{:.1f}')} | {fmt(r['decode_tick_ms'], '{:.1f}')} ms | {waited} | {share} | "
                     f"{fmt(r['prefill_tok_s'], '{:.0f}')} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shape = SMOKE_SHAPE if args.smoke else SHAPE
    repeats = 1 if args.smoke else args.repeats
    decode, prefill = ((4, 8), (2, 64)) if args.smoke else ((16, 64), (4, 512))
    load_before = os.getloadavg()
    hiddens = (shape["hidden_size"],) if args.smoke else (576, shape["hidden_size"])
    tokens = ALL_REDUCE_TOKENS[:3] if args.smoke else ALL_REDUCE_TOKENS
    all_reduce = {h: measure_all_reduce([(t, h) for t in tokens], repeats=10 if args.smoke else 100) for h in hiddens}
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_checkpoint(Path(tmp), shape)
        engine = {name: run_layout(folder, layout, repeats, decode, prefill) for name, layout in LAYOUTS.items()}
    per_token = dict(zip(tokens, all_reduce[shape["hidden_size"]]))
    tick_tokens = decode[0]
    nearest = min(per_token, key=lambda t: abs(t - tick_tokens))
    comm_ms = 2 * shape["num_hidden_layers"] * per_token[nearest] * 1000  # two all-reduces a layer
    tp2 = engine["tp=2, 1 thread each"]
    tp2["comm_share"] = min(1.0, comm_ms / tp2["decode_tick_ms"]["median"])
    tp2["comm_ms_estimate"] = comm_ms
    info = machine_info()
    result = dict(machine=dict(cpu=info["cpu"], cpus=info["cpus"], flags=flags(), torch=torch.__version__),
                  load_before=[round(x, 2) for x in load_before], load_after=[round(x, 2) for x in os.getloadavg()],
                  shape=shape, repeats=repeats, decode=decode, prefill=prefill, all_reduce_tokens=list(tokens),
                  all_reduce={str(h): v for h, v in all_reduce.items()}, engine=engine)
    out = Path(tempfile.mkdtemp()) if args.smoke else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^a-z0-9]+", "-", info["cpu"].lower()).strip("-")
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    (out / f"{name}.md").write_text(report_md(result))
    print(report_md(result))
    print(f"written to {out / name}.json and .md", file=sys.stderr)


if __name__ == "__main__":
    main()
