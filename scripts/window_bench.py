"""Gemma 3 270M through the engine with its windows apart (chapter 21) and with every layer in pages (chapter 18):
the same requests, the engines interleaved, medians of the rounds; and what the requests held at their peak.

    flock /tmp/helios-cpu.lock python scripts/window_bench.py [--requests 16] [--prompt 1024] [--tokens 64] [--rounds 3]

Each round gives both engines the same fresh prompts (random words, EOS banned) all at once, and steps the engine on
this thread until they are done. Prints a markdown table, with the CPU and the load average.
"""
from __future__ import annotations

import argparse
import copy
from dataclasses import replace
import os
import platform
import random
import statistics
import subprocess
import time

import torch

from helios import SamplingParams
from helios.config import EngineConfig
from helios.engine import Engine
from helios.kv.pool import page_bytes
from helios.tokenizer import load_tokenizer
from helios.weights import find_checkpoint, load_model

WORDS = "river stone light window garden paper morning silver quiet forest number harbor letter".split()


def cpu_name() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                platform.processor())


def run(engine: Engine, prompts: list[list[int]], tokens: int) -> dict:
    "All prompts at once, stepped to the end: seconds, output tok/s, and the peak bytes the requests held."
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    cfg = engine.model.config
    start = time.perf_counter()
    handles = [engine.submit(p, params) for p in prompts]
    peak = 0
    while engine.step():
        held = engine.stats().num_used_pages * page_bytes(cfg, engine.config.page_size, engine.kv.k.dtype)
        if engine.states is not None: held += engine.states.state_bytes * engine.states.num_held
        peak = max(peak, held)
    seconds = time.perf_counter() - start
    assert all(len(h.result().outputs[0].token_ids) == tokens for h in handles)
    return dict(seconds=seconds, tok_s=len(prompts) * tokens / seconds, peak_mib=peak / 2**20)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=1024, help="prompt tokens per request")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = find_checkpoint("gemma3-270m")
    loaded, tokenizer = load_model(path), load_tokenizer(path)
    apart = loaded.model
    in_pages = copy.copy(apart)  # the same modules; the config of chapter 18, every layer in pages
    in_pages.config = replace(apart.config, windows_in_pages=True)
    config = EngineConfig(max_batch_size=max(32, args.requests), kv_cache_bytes=2 << 30)
    engines = {"windows apart (chapter 21)": Engine.create(apart, tokenizer, frozenset(), config),
               "every layer in pages (chapter 18)": Engine.create(in_pages, tokenizer, frozenset(), config)}
    rng = random.Random(0)
    results = {name: [] for name in engines}
    load_before = os.getloadavg()[0]
    for r in range(args.rounds):
        prompts = [tokenizer.encode(" ".join(rng.choice(WORDS) for _ in range(args.prompt)))[:args.prompt]
                   for _ in range(args.requests)]
        for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):  # interleaved, alternating first
            results[name].append(run(engines[name], prompts, args.tokens))
    print(f"CPU: {cpu_name()}, {args.threads} threads; load {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"{args.requests} requests x {args.prompt} prompt tokens, {args.tokens} output tokens, {args.rounds} rounds; "
          f"pool budget 2 GiB, {config.max_batch_size} rows")
    print("| engine | KV pool | seconds (median; rounds) | output tok/s | peak MiB held by the requests |")
    print("| --- | --- | --- | --- | --- |")
    for name, runs in results.items():
        e = engines[name]
        med, rounds = statistics.median(x["seconds"] for x in runs), ", ".join(f"{x['seconds']:.1f}" for x in runs)
        states = f" + {e.states.describe()}" if e.states else ""
        print(f"| {name} | {e.pages.num_pages} pages{states} | {med:.1f} ({rounds}) | "
              f"{statistics.median(x['tok_s'] for x in runs):.1f} | {max(x['peak_mib'] for x in runs):,.0f} |")


if __name__ == "__main__":
    main()
