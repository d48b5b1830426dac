"""Batch-1 decode speed of the default model with and without the KV cache, per dtype (chapters 04 and 06).

    python scripts/kv_cache_speed.py [--threads 1]

Prints load time, prefill time of a 100-token prompt and decode tok/s (64 tokens) for float32 and
bfloat16 with the contiguous KV cache, and tok/s of recomputing the whole sequence (no cache).
"""
import argparse
import os
import time

import torch

from helios.reference import generate_without_cache, stream_tokens
from helios.weights import load_model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads={args.threads} load average {os.getloadavg()}")
    prompt = list(range(1000, 1100))
    for dtype in ("float32", "bfloat16"):
        loaded = load_model(dtype=dtype)
        list(stream_tokens(loaded.model, prompt, 4))  # warm-up
        start = time.perf_counter(); list(stream_tokens(loaded.model, prompt, 1)); prefill = time.perf_counter() - start
        start = time.perf_counter(); list(stream_tokens(loaded.model, prompt, 65)); total = time.perf_counter() - start
        print(f"{dtype}: load {loaded.load_time_s:.1f} s, prefill(100) {prefill:.2f} s, "
              f"decode {64 / (total - prefill):.1f} tok/s with the KV cache")
    model = load_model(dtype="float32").model
    start = time.perf_counter(); generate_without_cache(model, prompt, 32); elapsed = time.perf_counter() - start
    print(f"float32 without a KV cache: {32 / elapsed:.1f} tok/s (32 tokens after the same prompt)")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
