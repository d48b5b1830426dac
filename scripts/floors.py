"""How far batch-1 decode and a long prefill are from this machine's floor (chapter 15's floor cell, as a script),
in each variant of the C kernels this CPU runs (appendix 92's `cpu_isa`: avx512, avx2, generic).

Probes the machine (`helios.bench.metrics.probe_machine`: a large float32 matmul, a read of 256 MiB), then, for each
variant, loads the embedded default model with its kernels built in that variant ($HELIOS_CPU_ISA) and runs one
request alone through an engine driven by hand on this thread: 128 prompt tokens and 64 new ones (decode rate), then
a 2,048-token prompt and one new token (prefill rate). The decode floor is the weight bytes a step reads over the
measured bandwidth; the prefill floor is a matmul rate over 2 FLOPs per weight, both PyTorch's float32 rate (the
probe) and the variant's own (its C matmul on 512 rows of the model's MLP shape). Usage:

    python scripts/floors.py [--threads 2] [--repeat 3] [--variants avx512 avx2 generic]

writes benchmarks/results/floors/<cpu>.json and .md (the CPU's lscpu model name, its vector flags and the load).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

import torch

from helios import SamplingParams
from helios.bench.flops import matmul_weights
from helios.bench.metrics import floors, probe_machine
from helios.bench.workloads import real_text
from helios.config import EngineConfig
from helios.engine import Engine
from helios.kernels.build import ISA_FLAGS, KernelUnavailable, cpu_isa
from helios.kv.pages import pages_needed
from helios.llm import matmul_summary
from helios.tokenizer import load_tokenizer
from helios.weights import load_model

OUT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "floors"


def run_alone(loaded, tokenizer, prompt: list[int], params: SamplingParams):
    "One request through an engine driven by hand on this thread (the one that owns the OpenMP team)."
    eos = frozenset(tokenizer.eos_token_ids | set(loaded.config.eos_token_ids))
    config = EngineConfig(max_batch_size=1, enable_prefix_caching=False)
    engine = Engine(loaded.model, tokenizer, eos, config, pages_needed(len(prompt) + params.max_tokens, config.page_size))
    handle = engine.submit(prompt, params)
    while engine.step(): pass
    return handle.result()


def machine() -> dict:
    "lscpu's model name and the vector flags that decide CPU speed."
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    field = lambda key: next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith(key)), "")
    wanted = [f for f in field("Flags").split() if f in ("avx2", "fma", "f16c") or f.startswith(("avx512", "amx"))]
    return dict(cpu=field("Model name"), cpus=os.cpu_count(), flags=wanted, torch=torch.__version__)


def runnable_variants() -> list[str]:
    """The variants of the kernels this CPU runs, widest first; generic only where it is the one (it is the fallback
    of CPUs without AVX2, and some 50 times slower where there is: ask for it with --variants)."""
    def runs(isa):
        try: return cpu_isa(requested=isa) == isa
        except KernelUnavailable: return False
    return [isa for isa in ISA_FLAGS if runs(isa) and (isa != "generic" or cpu_isa() == "generic")]


def matmul_rate(model, rows: int = 512, repeats: int = 5) -> float:
    "FLOP/s of the first layer's gate/up product, as loaded (the model's largest but the head), on `rows` rows, best of repeats."
    linear = model.model.layers[0].mlp.gate_up_proj
    x, best = torch.randn(rows, linear.in_features), float("inf")
    with torch.inference_mode():
        for _ in range(repeats + 1):
            start = time.perf_counter()
            linear(x)
            best = min(best, time.perf_counter() - start)
    return 2 * rows * linear.in_features * linear.out_features / best


def measure_variant(isa: str, ids: list[int], repeat: int) -> dict:
    "Load the model with its kernels in variant isa and time batch-1 decode and a 2,048-token prefill `repeat` times."
    os.environ["HELIOS_CPU_ISA"] = isa
    loaded = load_model()
    tokenizer = load_tokenizer(loaded.path, loaded.gguf_reader)
    params, weight_bytes = matmul_weights(loaded.model)
    rounds = []
    for r in range(repeat):
        start = 128 * r  # fresh text each round
        out = run_alone(loaded, tokenizer, ids[start:start + 128], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
        decode = 63 / (out.metrics.finished_s - out.metrics.first_token_s)
        out = run_alone(loaded, tokenizer, ids[start:start + 2048], SamplingParams(temperature=0, max_tokens=1))
        rounds.append(dict(decode_tok_s=decode, prefill_tok_s=2048 / out.metrics.ttft_s, matmul_flop_s=matmul_rate(loaded.model)))
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    return dict(isa=isa, matmuls=matmul_summary(loaded), params=params, weight_bytes=weight_bytes, rounds=rounds, median=median)


def report(data: dict) -> str:
    m, probe = data["machine"], data["probe"]
    lines = ["# Batch-1 decode and a 2,048-token prefill against the floor, per kernel variant",
             "", f"{m['cpu']}, {m['cpus']} CPUs ({' '.join(m['flags'])}), torch {m['torch']}, {data['threads']} threads; "
             f"load average {data['load_before']} before, {data['load_after']} after. Probe: PyTorch float32 matmul "
             f"{probe['matmul_flop_s'] / 1e9:.0f} GFLOP/s, memory read {probe['memory_bytes_s'] / 1e9:.1f} GB/s. "
             f"Median of {data['repeat']} rounds (range); `python scripts/floors.py --threads {data['threads']} --repeat "
             f"{data['repeat']} --variants {' '.join(v['isa'] for v in data['variants'])}`.", "",
             "| variant | matmuls | decode tok/s | % of read floor | prefill tok/s | % of PyTorch-rate floor "
             "| variant's matmul GFLOP/s | % of variant-rate floor |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for v in data["variants"]:
        med, rounds = v["median"], v["rounds"]
        rng = lambda k, f="{:.1f}": f"{f.format(min(r[k] for r in rounds))}–{f.format(max(r[k] for r in rounds))}"
        probe_floor = floors(probe, v["weight_bytes"], v["params"], batch=1)
        read_floor, probe_floor = probe_floor["decode_tok_s"], probe_floor["prefill_tok_s"]
        own_floor = floors({**probe, "matmul_flop_s": med["matmul_flop_s"]}, v["weight_bytes"], v["params"], 1)["prefill_tok_s"]
        lines.append(f"| {v['isa']} | {v['matmuls']} | {med['decode_tok_s']:.1f} ({rng('decode_tok_s')}) | "
                     f"{med['decode_tok_s'] / read_floor:.0%} of {read_floor:.0f} | {med['prefill_tok_s']:.0f} "
                     f"({rng('prefill_tok_s', '{:.0f}')}) | {med['prefill_tok_s'] / probe_floor:.0%} of {probe_floor:.0f} | "
                     f"{med['matmul_flop_s'] / 1e9:.0f} | {med['prefill_tok_s'] / own_floor:.0%} of {own_floor:.0f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--variants", nargs="*", default=None, help="default: every variant this CPU runs")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    probe = probe_machine(seconds=1.0)
    ids = load_tokenizer(load_model().path).encode(real_text())
    variants = [measure_variant(isa, ids, args.repeat) for isa in (args.variants or runnable_variants())]
    data = dict(machine=machine(), threads=args.threads, repeat=args.repeat, load_before=load_before,
                load_after=" ".join(f"{x:.2f}" for x in os.getloadavg()), probe=probe, variants=variants)
    args.out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", data["machine"]["cpu"].lower()).strip("-")
    (args.out / f"{slug}.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / f"{slug}.md").write_text(report(data))
    print(report(data))


if __name__ == "__main__":
    main()
