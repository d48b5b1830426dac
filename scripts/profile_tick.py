"""Where the time of one decode tick goes: the engine of chapter 11 ("before") and today's ("after").

Loads the default model twice (plain, and fused + pre-packed), starts 16 requests of 128 prompt tokens
each in an engine driven by hand, and profiles decode ticks with `helios.perf.profile_ticks` (chapter
15). Usage:

    python scripts/profile_tick.py [--threads 2] [--batch 16] [--prompt-tokens 128] [--ticks 10] [--only after]
"""
import argparse
import os

import torch

from helios.bench import real_text
from helios.perf import decoding_engine, profile_ticks, sdpa_decode_attention
from helios.tokenizer import load_tokenizer
from helios.weights import load_model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--ticks", type=int, default=10)
    ap.add_argument("--only", choices=["before", "after"], default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads={args.threads}, load average at start {os.getloadavg()}")
    for name in ("before", "after"):
        if args.only and name != args.only: continue
        loaded = load_model(optimize=name == "after")
        tok = load_tokenizer(loaded.path, loaded.gguf_reader)
        ids = tok.encode(real_text())
        n = args.prompt_tokens
        prompts = [ids[i * n:(i + 1) * n] for i in range(args.batch)]
        eos = tok.eos_token_ids | set(loaded.config.eos_token_ids)
        engine = decoding_engine(loaded.model, tok, eos, prompts, sdpa_decode_attention if name == "before" else None)
        engine.step()  # warm-up
        profile = profile_ticks(engine, ticks=args.ticks)
        print(f"\n## {name} (load average {os.getloadavg()[0]:.2f})\n{profile.table()}")


if __name__ == "__main__":
    main()
