"""One decode-shaped product with Q8_0 blocks against the bfloat16 and float32 matmuls (appendix 92).

    flock /tmp/helios-cpu.lock python scripts/q8_bench.py            # prints a markdown table
    flock /tmp/helios-cpu.lock python scripts/q8_bench.py --out benchmarks/results/q8_0/xeon-amx.md

Shapes (outputs x inputs): 6144 x 2048 (a Qwen3-1.7B gate/up product) and 1536 x 576 (SmolLM2's); rows: 1 and 16 (a
decode tick alone and batched). Contenders: `Q8_0Linear` in every variant this CPU runs, `CBf16Linear` in every bfloat16
variant it runs, the float16-weight `CHalfLinear`, and float32 (`torch.nn.functional.linear`, oneDNN). Each time is the
median of REPEATS calls after a warm-up; the contenders take turns over ROUNDS rounds (interleaved, so that a change
of load hits them all), and the table shows the best round's median (the least disturbed by other work on the machine), the
range of the rounds' medians, and the read rate of the weight's bytes at the best. The CPU (lscpu's model
name and the flags that matter here), the threads and the load average are printed with the numbers.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

SHAPES = [(6144, 2048), (1536, 576)]  # [out, in]
ROWS = (1, 16)
REPEATS = 100
ROUNDS = 5
FLAGS = ("avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16", "avx2")


def cpu_line() -> str:
    "lscpu's model name, the flags that matter here, the threads and the load average."
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    model = fields.get("Model name", "?").strip()
    flags = [f for f in FLAGS if f in fields.get("Flags", "").split()]
    return (f"{model}; flags: {', '.join(flags)}; {torch.get_num_threads()} threads; "
            f"load average {os.getloadavg()[0]:.2f}")


def median_ms(fn, x: torch.Tensor) -> float:
    for _ in range(10): fn(x)
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def contenders(weight: torch.Tensor) -> dict[str, tuple[object, int]]:
    "name -> (a callable on x, the bytes of weights it reads)."
    from helios.kernels.build import KernelUnavailable, native_bf16, q8_variants
    from helios.kernels.matmul import (CBf16Linear, CHalfLinear, Q8_0Linear, matmul_bf16_kernel, matmul_kernel,
                                       matmul_q8_0_kernel)
    found = {}
    for variant in q8_variants():
        linear = Q8_0Linear(weight, None, matmul_q8_0_kernel(variant=variant))
        found[f"Q8_0 packed, {linear.matmul.isa}"] = linear, linear.packed.numel()
    for variant in native_bf16():
        try: linear = CBf16Linear(weight, None, matmul_bf16_kernel(variant=variant))
        except KernelUnavailable: continue
        found[f"bfloat16, {linear.matmul.isa}"] = linear, weight.numel() * 2
    try:
        linear = CHalfLinear(weight, None, matmul_kernel())
        found[f"float16 weights, {linear.matmul.isa}"] = linear, weight.numel() * 2
    except KernelUnavailable:
        pass
    found["float32, F.linear"] = (lambda x: F.linear(x, weight)), weight.numel() * 4
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args()
    torch.manual_seed(0)
    lines = [f"CPU: {cpu_line()}", "", "| product (out x in) | rows | matmul | weight MB | ms (best round) | "
             "ms (range) | GB/s of weights |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for n_out, n_in in SHAPES:
        weight = torch.randn(n_out, n_in) * 0.05
        found = contenders(weight)
        inputs = {rows: torch.randn(rows, n_in) for rows in ROWS}
        times = {(name, rows): [] for name in found for rows in ROWS}
        for _ in range(ROUNDS):
            for name, (fn, _) in found.items():
                for rows in ROWS: times[name, rows].append(median_ms(fn, inputs[rows]))
        for (name, rows), ms in times.items():
            nbytes, mid = found[name][1], min(ms)
            lines.append(f"| {n_out} x {n_in} | {rows} | {name} | {nbytes / 1e6:.2f} | {mid:.3f} | "
                         f"{min(ms):.3f}–{max(ms):.3f} | {nbytes / mid / 1e6:.1f} |")
            print(lines[-1], flush=True)
    lines.append(f"\nAfter: load average {os.getloadavg()[0]:.2f}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f: f.write(text)


if __name__ == "__main__":
    main()
