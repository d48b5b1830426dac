"""Does torch.compile of the layers' norms and MLPs (`compile=True`) pay on this machine? SmolLM2-135M (the embedded
GGUF) on the `torch` attention backend and PyTorch matmuls, eager and compiled, in one run: decode at batch 1 and 8
(64 tokens each after 8-token prompts), and one 512-token prefill; each measured `--repeats` times with fresh prompts,
after a warm-up. Start-up and compile seconds are recorded, and so are the machine (lscpu model name and vector flags)
and the load average before and after.

    python scripts/compile_bench.py [--repeats 3] [--threads 2]

writes benchmarks/results/compile/<cpu>.json and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

import torch

from helios.llm import LLM
from helios.sampling import SamplingParams

OUT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "compile"


def machine() -> dict:
    "lscpu's model name and the vector flags that decide CPU speed."
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    field = lambda key: next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith(key)), "")
    wanted = [f for f in field("Flags").split() if f in ("avx2", "fma") or f.startswith(("avx512", "amx"))]
    return dict(cpu=field("Model name"), cpus=os.cpu_count(), flags=wanted, torch=torch.__version__)


def load_average() -> str: return " ".join(f"{x:.2f}" for x in os.getloadavg())


def decode_tok_s(llm: LLM, batch: int, round_: int) -> float:
    "Output tokens per second of `batch` greedy requests of 64 tokens (prompts differ each round: no prefix hits)."
    prompts = [[1 + (round_ * 97 + i * 13 + j) % 4000 for j in range(8)] for i in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - start)


def prefill_s(llm: LLM, round_: int) -> float:
    "Seconds to the one output token of a fresh 512-token prompt."
    prompt = [1 + (round_ * 131 + j * 7) % 4000 for j in range(512)]
    start = time.perf_counter()
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), use_tqdm=False)
    return time.perf_counter() - start


def measure(compile_: bool, repeats: int) -> dict:
    start = time.perf_counter()
    llm = LLM(attention="torch", matmul="torch", max_batch_size=8, prefill_chunk_size=512, compile=compile_,
              enable_prefix_caching=False, quiet=True)
    startup_s = time.perf_counter() - start
    decode_tok_s(llm, 2, -1)  # warm-up
    runs = {"decode_1_tok_s": [], "decode_8_tok_s": [], "prefill_512_s": []}
    for r in range(repeats):
        runs["decode_1_tok_s"].append(decode_tok_s(llm, 1, r))
        runs["decode_8_tok_s"].append(decode_tok_s(llm, 8, r))
        runs["prefill_512_s"].append(prefill_s(llm, r))
    result = dict(compile=compile_, startup_s=startup_s, compile_s=llm.engine.compile_s, runs=runs,
                  median={k: statistics.median(v) for k, v in runs.items()})
    llm.close()
    return result


def report(data: dict) -> str:
    eager, compiled = data["eager"]["median"], data["compiled"]["median"]
    m = data["machine"]
    lines = ["# torch.compile of norms and MLPs: SmolLM2-135M, `torch` attention, PyTorch matmuls",
             "", f"{m['cpu']}, {m['cpus']} CPUs ({' '.join(m['flags'])}), torch {m['torch']}, {data['threads']} threads; "
             f"load average {data['load_before']} before, {data['load_after']} after; median of {data['repeats']} (range)",
             "", "| | eager | compiled | compiled / eager |", "| --- | --- | --- | --- |"]
    for key, label in [("decode_1_tok_s", "decode, batch 1 (tok/s)"), ("decode_8_tok_s", "decode, batch 8 (tok/s)"),
                       ("prefill_512_s", "prefill 512 tokens (s)")]:
        rng = lambda d: f"{min(d['runs'][key]):.2f}–{max(d['runs'][key]):.2f}"
        lines.append(f"| {label} | {eager[key]:.2f} ({rng(data['eager'])}) | {compiled[key]:.2f} ({rng(data['compiled'])}) "
                     f"| {compiled[key] / eager[key]:.2f}× |")
    lines.append(f"| start-up (s) | {data['eager']['startup_s']:.1f} | {data['compiled']['startup_s']:.1f} "
                 f"(compile {data['compiled']['compile_s']:.1f}) | |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    data = dict(machine=machine(), threads=args.threads, repeats=args.repeats, load_before=load_average())
    data["eager"] = measure(False, args.repeats)
    data["compiled"] = measure(True, args.repeats)
    data["load_after"] = load_average()
    OUT.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", data["machine"]["cpu"].lower()).strip("-")
    (OUT / f"{slug}.json").write_text(json.dumps(data, indent=1) + "\n")
    (OUT / f"{slug}.md").write_text(report(data))
    print(report(data))


if __name__ == "__main__":
    main()
