"""Offline throughput of LLM.generate on the default model: 32 prompts, 128 tokens in, 128 out, greedy.

Runs the engine at several max_batch_size values and the contiguous-cache `generate` of chapter 06 one
prompt at a time, all in one process, and prints one table. Usage:

    python scripts/throughput.py [--threads 2] [--batches 1 8 32] [--prompts 32] [--tokens 128]
"""
import argparse
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import real_text  # noqa: E402  (the same real-text source the tests use)

from helios import LLM, SamplingParams  # noqa: E402
from helios.reference import generate  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--skip-contiguous", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads={args.threads} load average at start: {os.getloadavg()}")
    rows = []
    llm = None
    for batch in args.batches:
        llm = LLM(max_batch_size=batch, dtype="float32", quiet=True)
        ids = llm.tokenizer.encode(real_text())
        rng = random.Random(0)
        prompts = [ids[s:s + args.tokens] for s in (rng.randrange(len(ids) - args.tokens) for _ in range(args.prompts))]
        params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
        llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        out_tokens = sum(len(o.token_ids) for o in outs)
        rows.append((f"engine, max_batch_size={batch}", elapsed, out_tokens))
        print(f"{rows[-1][0]}: {out_tokens / elapsed:.1f} output tok/s ({elapsed:.1f} s), load {os.getloadavg()[0]:.2f}", flush=True)
        if batch != args.batches[-1] or args.skip_contiguous: llm.close()
    if not args.skip_contiguous:
        start = time.perf_counter()
        n = sum(len(generate(llm.model, p, args.tokens)) for p in prompts)
        elapsed = time.perf_counter() - start
        rows.append(("contiguous generate, one at a time", elapsed, n))
        print(f"{rows[-1][0]}: {n / elapsed:.1f} output tok/s ({elapsed:.1f} s)", flush=True)
        llm.close()
    print("\n| run | output tok/s | wall s |\n|---|---|---|")
    for name, elapsed, n in rows:
        print(f"| {name} | {n / elapsed:.1f} | {elapsed:.1f} |")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
