"""Decode ticks with exact float32 weights against float16-stored weights (the CPU default), alternating in one process.

Loads the default model twice (`dtype="float32"` and `dtype="auto"`), starts the same requests of 128 prompt
tokens in two engines driven by hand on this thread, and times blocks of decode ticks of each in turn, so
that the machine's drift hits both alike (chapter 15, prediction log). Usage:

    python scripts/weights_ab.py [--threads 2] [--batch 16] [--ticks 8] [--rounds 4]
"""
import argparse
import os
import time

import torch

from helios.bench import real_text
from helios.perf import decoding_engine
from helios.tokenizer import load_tokenizer
from helios.weights import load_model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ticks", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = {"float32 weights": load_model(dtype="float32"), "float16 weights (auto)": load_model()}
    first = next(iter(models.values()))
    tok = load_tokenizer(first.path, first.gguf_reader)
    ids = tok.encode(real_text())
    prompts = [ids[i * 128:(i + 1) * 128] for i in range(args.batch)]
    eos = tok.eos_token_ids | set(first.config.eos_token_ids)
    engines = {name: decoding_engine(m.model, tok, eos, prompts) for name, m in models.items()}
    for engine in engines.values(): engine.step()  # warm-up
    ms = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            start = time.perf_counter()
            for _ in range(args.ticks): engine.step()
            ms[name].append((time.perf_counter() - start) / args.ticks * 1e3)
    print(f"batch {args.batch}, {args.threads} threads, load average {os.getloadavg()[0]:.2f}; ms per decode tick:")
    for name, values in ms.items(): print(f"  {name:24s} " + "  ".join(f"{v:6.1f}" for v in values))


if __name__ == "__main__":
    main()
