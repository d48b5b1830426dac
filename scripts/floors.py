"""How far batch-1 decode and a long prefill are from this machine's floor (chapter 15's floor cell, as a script).

Probes the machine (`helios.bench.metrics.probe_machine`: a large float32 matmul, a read of 256 MiB), then runs one
request alone through an engine driven by hand on this thread: 128 prompt tokens and 64 new ones (decode
rate), then a 2,048-token prompt and one new token (prefill rate). The decode floor is the weight bytes a
step reads over the measured bandwidth; the prefill floor is the matmul rate over 2 FLOPs per weight.
Usage:

    python scripts/floors.py [--threads 2] [--repeat 2]
"""
import argparse
import os

import torch

from helios import SamplingParams
from helios.bench.flops import matmul_weights
from helios.bench.metrics import floors, probe_machine
from helios.bench.workloads import real_text
from helios.config import EngineConfig
from helios.engine import Engine
from helios.kv.pages import pages_needed
from helios.tokenizer import load_tokenizer
from helios.weights import load_model


def run_alone(loaded, tokenizer, prompt: list[int], params: SamplingParams):
    "One request through an engine driven by hand on this thread (the one that owns the OpenMP team)."
    eos = frozenset(tokenizer.eos_token_ids | set(loaded.config.eos_token_ids))
    config = EngineConfig(max_batch_size=1, enable_prefix_caching=False)
    engine = Engine(loaded.model, tokenizer, eos, config, pages_needed(len(prompt) + params.max_tokens, config.page_size))
    handle = engine.submit(prompt, params)
    while engine.step(): pass
    return handle.result()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model()
    tokenizer = load_tokenizer(loaded.path, loaded.gguf_reader)
    ids = tokenizer.encode(real_text())
    params, weight_bytes = matmul_weights(loaded.model)
    for _ in range(args.repeat):
        probe = probe_machine(seconds=1.0)
        floor, f32 = floors(probe, weight_bytes, params, batch=1), floors(probe, 4 * params, params, batch=1)
        out = run_alone(loaded, tokenizer, ids[:128], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
        decode = 63 / (out.metrics.finished_s - out.metrics.first_token_s)
        out = run_alone(loaded, tokenizer, ids[:2048], SamplingParams(temperature=0, max_tokens=1))
        prefill = 2048 / out.metrics.ttft_s
        print(f"probe {probe['matmul_flop_s'] / 1e9:.0f} GFLOP/s, {probe['memory_bytes_s'] / 1e9:.1f} GB/s "
              f"({args.threads} threads, load {os.getloadavg()[0]:.2f}); {weight_bytes / 2**20:.0f} MiB read per step")
        print(f"  batch-1 decode {decode:.1f} tok/s = {decode / floor['decode_tok_s']:.0%} of {floor['decode_tok_s']:.0f} "
              f"(float32 weights' floor {f32['decode_tok_s']:.0f}: {decode / f32['decode_tok_s']:.0%}); "
              f"2,048-token prefill {prefill:.0f} tok/s = {prefill / floor['prefill_tok_s']:.0%} of {floor['prefill_tok_s']:.0f}")


if __name__ == "__main__":
    main()
