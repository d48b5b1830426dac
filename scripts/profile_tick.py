"""Where the time of one decode tick goes: PyTorch's plain path ("before") and the CPU defaults ("after").

Loads the default model twice (unpacked float32 weights with whole-page SDPA attention, and the CPU defaults),
starts 16 requests of 128 prompt tokens each in an engine driven by hand, and profiles decode ticks with
`helios.profiler.profile_ticks` (chapter 15). The two A/B modes time blocks of ticks of two engines in turn, so that the machine's drift hits
both alike, and check that both engines produced the same tokens: `--compare-weights` loads the model
with exact float32 weights and with the CPU default (float16-stored weights); `--compare-attention`
runs the default model with PyTorch's attention (`BatchedAttention`), with the C attention kernel alone
(every token a row, PyTorch's layers), and with the C kernels for attention and the rest of the layer in ten calls
(`CKernels(..., one_call_layers=False)`); `--compare-layers` runs the ten calls against one C call per layer
(`CKernels`, the default; appendix 92).
Usage:

    python scripts/profile_tick.py [--threads 2] [--batch 16] [--prompt-tokens 128] [--ticks 10] [--only after]
    python scripts/profile_tick.py --compare-weights [--threads 2] [--batch 16] [--ticks 8] [--rounds 4]
    python scripts/profile_tick.py --compare-attention [--threads 2] [--batch 16] [--ticks 8] [--rounds 4]
    python scripts/profile_tick.py --compare-attention --prefill [--threads 2] [--batch 16] [--rounds 4]
    python scripts/profile_tick.py --compare-matmul [--prefill] [--threads 2] [--batch 16] [--ticks 8] [--rounds 4]
    python scripts/profile_tick.py --compare-layers [--prefill] [--threads 2] [--batch 16] [--ticks 8] [--rounds 4]

`--compare-matmul` loads the default model twice, with fbgemm's float16-weight matmul (`matmul="fbgemm"`) and with
the C one (`CHalfLinear`, the default), both running the C layer kernels.

With --prefill, each block is the prefill of args.batch fresh prompts (default chunk of 512 tokens per tick), so the
blocks time prefill ticks instead of decode ticks.
"""
import argparse
import os
import time

import torch

from helios.attention.base import AttentionBackend
from helios.attention.reference import BatchedAttention
from helios.bench.workloads import real_text
from helios.kernels.attention import CKernels, c_kernels
from helios.profiler import SdpaDecodeAttention, decoding_engine, profile_ticks
from helios.tokenizer import load_tokenizer
from helios.weights import LoadedModel, load_model

CPU = torch.device("cpu")


class AttentionOnly(AttentionBackend):
    "The C decode kernel alone: PyTorch's layers, their attention through the kernels' paged_decode_attention."
    name = "C decode kernel"
    def __init__(self, kernels: CKernels): self.kernels = kernels
    def __call__(self, q, k_pages, v_pages, batch): return self.kernels(q, k_pages, v_pages, batch)


def ten_calls(kernels: CKernels) -> CKernels:
    "The same library without the one-call layers: ten calls per layer."
    num_heads, num_kv_heads, head_dim = kernels.shape
    return CKernels(kernels.library, head_dim, num_heads, num_kv_heads, one_call_layers=False)


def decoding(loaded: LoadedModel, args, backend=None):
    "An engine over loaded.model whose args.batch requests of args.prompt_tokens tokens are all decoding."
    tok = load_tokenizer(loaded.path, loaded.gguf_reader)
    ids = tok.encode(real_text())
    n = args.prompt_tokens
    prompts = [ids[i * n:(i + 1) * n] for i in range(args.batch)]
    eos = tok.eos_token_ids | set(loaded.config.eos_token_ids)
    engine = decoding_engine(loaded.model, tok, eos, prompts, backend)
    engine.step()  # warm-up
    return engine


def before_and_after(args):
    for name in ("before", "after"):
        if args.only and name != args.only: continue
        loaded = load_model(optimize=name == "after")
        engine = decoding(loaded, args, SdpaDecodeAttention() if name == "before" else None)
        profile = profile_ticks(engine, ticks=args.ticks)
        print(f"\n## {name} (load average {os.getloadavg()[0]:.2f})\n{profile.table()}")


def compare_weights(args):
    compare({"float32 weights": decoding(load_model(dtype="float32"), args),
             "float16 weights (auto)": decoding(load_model(), args)}, args)


def compare_matmul(args):
    models = {"fbgemm matmuls": load_model(matmul="fbgemm"), "C matmuls": load_model()}
    backend = c_kernels(models["C matmuls"].config, torch.float32, CPU)
    if args.prefill:
        compare_prefill({name: prefilling(loaded, args, backend) for name, loaded in models.items()}, args)
    else:
        compare({name: decoding(loaded, args, backend) for name, loaded in models.items()}, args, check_tokens=True)


def compare_attention(args):
    loaded = load_model()
    kernels = c_kernels(loaded.config, torch.float32, CPU)
    compare_backends(loaded, {"batched_attention": BatchedAttention(), "C decode kernel": AttentionOnly(kernels),
                              "C kernels (ten calls)": ten_calls(kernels)}, args)  # one library


def compare_layers(args):
    loaded = load_model()
    kernels = c_kernels(loaded.config, torch.float32, CPU)
    compare_backends(loaded, {"ten calls per layer": ten_calls(kernels), "one call per layer": kernels}, args)


def compare_backends(loaded: LoadedModel, backends: dict, args):
    "Engines over one model, one per attention backend, compared on prefill (args.prefill) or decode ticks."
    if args.prefill:
        compare_prefill({name: prefilling(loaded, args, b) for name, b in backends.items()}, args)
    else:
        compare({name: decoding(loaded, args, b) for name, b in backends.items()}, args, check_tokens=True)


def prefilling(loaded: LoadedModel, args, backend):
    "A function that prefills args.batch fresh prompts of args.prompt_tokens tokens in a new engine, tick by tick."
    from helios.config import EngineConfig
    from helios.engine import Engine
    from helios.kv.pages import pages_needed
    from helios.sampling import SamplingParams
    tok = load_tokenizer(loaded.path, loaded.gguf_reader)
    ids, n = tok.encode(real_text()), args.prompt_tokens
    eos = frozenset(tok.eos_token_ids | set(loaded.config.eos_token_ids))
    config = EngineConfig(max_batch_size=args.batch, enable_prefix_caching=False)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)  # a request ends with its prefill

    def run() -> int:
        engine = Engine(loaded.model, tok, eos, config, args.batch * pages_needed(n + 1, config.page_size), backend)
        for i in range(args.batch): engine.submit(ids[i * n:(i + 1) * n], params)
        ticks = 0
        while engine.step(): ticks += 1  # step() is False once there is nothing left to do
        return ticks
    return run


def compare_prefill(engines: dict, args):
    "Alternate whole prefills between the engines; print seconds per prefill tick."
    seconds = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, run in engines.items():
            start = time.perf_counter()
            ticks = run()
            seconds[name].append((time.perf_counter() - start) / ticks)
    print(f"{args.batch} prompts of {args.prompt_tokens} tokens, {ticks} ticks each, load average {os.getloadavg()[0]:.2f}; "
          f"seconds per prefill tick, {args.rounds} prefills:")
    for name, values in seconds.items(): print(f"  {name:24s} " + "  ".join(f"{v:6.3f}" for v in values))


def compare(engines: dict, args, check_tokens: bool = False):
    "Alternate blocks of args.ticks ticks between the engines; print ms per tick (and, with check_tokens, whether their greedy tokens agree)."
    ms = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            start = time.perf_counter()
            for _ in range(args.ticks): engine.step()
            ms[name].append((time.perf_counter() - start) / args.ticks * 1e3)
    print(f"batch {args.batch}, load average {os.getloadavg()[0]:.2f}; ms per decode tick, {args.rounds} blocks of {args.ticks}:")
    for name, values in ms.items(): print(f"  {name:24s} " + "  ".join(f"{v:6.1f}" for v in values))
    if check_tokens:
        tokens = [[list(s.output_ids) for s in e.scheduler.running] for e in engines.values()]
        print(f"same greedy tokens in every row: {all(t == tokens[0] for t in tokens)} "
              f"({sum(map(len, tokens[0]))} tokens each)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--ticks", type=int, default=None, help="ticks per profile (10) or per block (8)")
    ap.add_argument("--only", choices=["before", "after"], default=None)
    ap.add_argument("--compare-weights", action="store_true")
    ap.add_argument("--compare-attention", action="store_true")
    ap.add_argument("--compare-matmul", action="store_true")
    ap.add_argument("--compare-layers", action="store_true")
    ap.add_argument("--prefill", action="store_true", help="with a --compare-* mode but weights: prefill ticks")
    ap.add_argument("--rounds", type=int, default=4, help="blocks of ticks per engine with --compare-weights")
    args = ap.parse_args()
    comparing = args.compare_weights or args.compare_attention or args.compare_matmul or args.compare_layers
    args.ticks = args.ticks or (8 if comparing else 10)
    torch.set_num_threads(args.threads)
    print(f"threads={args.threads}, load average at start {os.getloadavg()}")
    if args.compare_weights: compare_weights(args)
    elif args.compare_attention: compare_attention(args)
    elif args.compare_matmul: compare_matmul(args)
    elif args.compare_layers: compare_layers(args)
    else: before_and_after(args)


if __name__ == "__main__":
    main()
