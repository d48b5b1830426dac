"""Time one long prompt's prefill (max_tokens=1) on the default model, and attention's share of it.

    python scripts/prefill_bench.py [--tokens 8184] [--threads 2] [--attention auto] [--matmul auto] [--rounds 2]

Prints the machine, its load, the attention backend, the wall time of each round and the seconds the backend timed
in attention and matmuls (the C decoder layer's clocks, chapter 92), so before and after runs compare like with like.
"""
import argparse
import os
import platform
import time

import torch

from helios.bench.workloads import real_text
from helios.llm import LLM
from helios.sampling import SamplingParams


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8184)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attention", default="auto")
    ap.add_argument("--matmul", default="auto")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM(attention=args.attention, matmul=args.matmul, max_model_len=args.tokens + 8)
    ids = llm.tokenizer.encode(real_text() * 8)
    backend = getattr(llm.engine.runner, "backend", None)
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    print(f"cpu: {model}; load {os.getloadavg()[0]:.2f}; threads {args.threads}; attention {args.attention}; "
          f"matmul {args.matmul}")
    for r in range(args.rounds):
        prompt = ids[r * 7: r * 7 + args.tokens]  # fresh tokens each round: no prefix-cache hit
        before = dict(backend.measured_s()) if backend else {}
        start = time.perf_counter()
        llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)
        wall = time.perf_counter() - start
        after = backend.measured_s() if backend else {}
        parts = ", ".join(f"{k} {after[k] - before.get(k, 0):.1f} s" for k in after)
        print(f"round {r}: {len(prompt)} tokens in {wall:.2f} s ({len(prompt) / wall:.0f} tok/s); {parts}")


if __name__ == "__main__":
    main()
