"""Gemma 3 270M's Q4_K_M file: decode tok/s and the model's resident weight bytes with the `c-packed` matmul against the
default (appendix 92).

    flock /tmp/helios-cpu.lock python scripts/packed_decode.py [--model gemma3-270m] [--tokens 64] [--rounds 3]

Batch-1 and 16-at-once greedy decode of fresh prompts (EOS ignored), the modes taking turns over the rounds; the table
shows each mode's best round. Resident weight bytes are the model's parameters and buffers (each storage once): the
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
    args = parser.parse_args()
    register_packed()
    from helios import LLM
    llms = {name: LLM(args.model, quiet=True, kv_cache_bytes=1 << 30, **kw) for name, kw in MODES.items()}
    best = {(name, b): 0.0 for name in llms for b in (1, 16)}
    for r in range(args.rounds):
        for name, llm in llms.items():
            for b in (1, 16): best[name, b] = max(best[name, b], decode_tok_s(llm, b, args.tokens, r))
    print(f"CPU: {cpu_line()}\n")
    print("| mode | linears | resident weight MB | batch-1 decode tok/s | 16 at once, tok/s |\n| --- | --- | --- | --- | --- |")
    for name, llm in llms.items():
        kinds = Counter(type(m).__name__ for m in llm.model.modules() if hasattr(m, "out_features"))
        print(f"| {name} | {', '.join(f'{n} {k}' for k, n in kinds.items())} | "
              f"{resident_bytes(llm.model) / 1e6:.0f} | {best[name, 1]:.1f} | {best[name, 16]:.1f} |")
    print(f"\nAfter: load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
