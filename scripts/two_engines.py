"""Decode speed of two engines in one process, each in turn: whether a second `LLM` slows the first (appendix 92,
"The backend": OpenMP teams and `CKernels.idle`).

    flock /tmp/helios-cpu.lock python scripts/two_engines.py [--model PATH] [--tokens 64] [--dtype float32]

Loads engine A and times a batch-1 greedy run alone; loads engine B beside it and times B, then A again, then B again.
Each line gives tok/s and the cores the process kept busy meanwhile (its CPU time over the wall time).
"""
from __future__ import annotations

import argparse
import os
import resource
import time

from q8_bench import cpu_line


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(llm, label: str, tokens: int) -> None:
    from helios import SamplingParams
    llm.generate(["Hello there"], SamplingParams(max_tokens=4), use_tqdm=False)  # the engine is warm
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    start, cpu = time.perf_counter(), cpu_seconds()
    llm.generate(["The history of the city"], params, use_tqdm=False)
    wall = time.perf_counter() - start
    print(f"| {label} | {tokens / wall:.1f} | {(cpu_seconds() - cpu) / wall:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model LLM() takes (default: the embedded SmolLM2-135M)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--dtype", default="auto", help="the engines' dtype (float32: exact weights, oneDNN's matmul)")
    args = parser.parse_args()
    from helios import LLM
    print(cpu_line(), "\n\n| run | tok/s | cores busy |\n| --- | --- | --- |")
    a = LLM(args.model, dtype=args.dtype, quiet=True)
    timed(a, "A alone", args.tokens)
    b = LLM(args.model, dtype=args.dtype, quiet=True)
    timed(b, "B beside A", args.tokens)
    timed(a, "A beside B", args.tokens)
    timed(b, "B again", args.tokens)
    print(f"\nAfter: load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
