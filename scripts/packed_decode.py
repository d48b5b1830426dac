"""Gemma 3 270M's Q4_K_M file: decode tok/s and the model's resident weight bytes with the `c-packed` matmul against the
default (appendix 92); --matmul names other matmuls, --model other models.

    flock /tmp/helios-cpu.lock python scripts/packed_decode.py [--model gemma3-270m] [--tokens 64] [--rounds 3]
    flock /tmp/helios-cpu.lock python scripts/packed_decode.py --model FOLDER --matmul c-int8 --matmul c-bf16

Batch-1 and 16-at-once greedy decode of fresh prompts (EOS ignored), the modes taking turns over the rounds, each loaded
alone for its turn; the table shows each mode's best round. Resident weight bytes are the model's parameters and buffers (each storage once): the
packed blocks where a linear is packed, float32 elsewhere (the embedding, the norms, any fallback linear). The CPU and
its load are printed with the numbers.
"""
from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from importlib.metadata import EntryPoint

import torch

from q8_bench import cpu_line

MODES = {"default (auto)": {}, "c-packed": {"matmul": "c-packed"}}


def register_packed() -> None:
    "c-packed among the matmuls even where the installed package metadata predates it (a worktree's checkout)."
    import helios.registry
    real = helios.registry.entry_points
    ours = EntryPoint("c-packed", "helios.kernels.matmul:C_PACKED_MATMUL", "helios.matmul")
    helios.registry.entry_points = lambda group: (real(group=group) if group != "helios.matmul"
                                                  or "c-packed" in real(group=group).names else [*real(group=group), ours])


def resident_bytes(model: torch.nn.Module) -> int:
    "The bytes of the model's parameters and buffers, each storage counted once."
    seen = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def decode_tok_s(llm, batch: int, tokens: int, seed: int) -> float:
    from helios import SamplingParams
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1000, 20000, (16,), generator=g).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    out = llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in out) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--matmul", action="append", help="time this matmul beside the default (repeatable) instead "
                        "of c-packed")
    args = parser.parse_args()
    register_packed()
    from helios import LLM
    modes = {"default (auto)": {}, **{m: {"matmul": m} for m in args.matmul}} if args.matmul else MODES
    # One engine at a time: two engines in one process each keep a team of OpenMP threads, and the idle team's
    # spinning slows the other (measured on SmolLM2: c-int8's batch-1 decode made 43.8 tok/s beside a second engine, 128.7 alone).
    best = {(name, b): 0.0 for name in modes for b in (1, 16)}
    kinds, resident = {}, {}
    for r in range(args.rounds):
        for name, kw in modes.items():
            with LLM(args.model, quiet=True, kv_cache_bytes=1 << 30, **kw) as llm:
                decode_tok_s(llm, 1, 4, seed=-1)  # warm-up
                for b in (1, 16): best[name, b] = max(best[name, b], decode_tok_s(llm, b, args.tokens, r))
                kinds[name] = Counter(type(m).__name__ for m in llm.model.modules() if hasattr(m, "out_features"))
                resident[name] = resident_bytes(llm.model)
    print(f"CPU: {cpu_line()}\n")
    print("| mode | linears | resident weight MB | batch-1 decode tok/s | 16 at once, tok/s |\n| --- | --- | --- | --- | --- |")
    for name in modes:
        print(f"| {name} | {', '.join(f'{n} {k}' for k, n in kinds[name].items())} | "
              f"{resident[name] / 1e6:.0f} | {best[name, 1]:.1f} | {best[name, 16]:.1f} |")
    print(f"\nAfter: load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
