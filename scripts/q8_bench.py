"""One decode-shaped product with Q8_0, Q4_K, Q5_K, Q6_K and Q5_0 blocks and int8 per channel against the bfloat16 and float32 matmuls (appendix 92).

    flock /tmp/helios-cpu.lock python scripts/q8_bench.py            # prints a markdown table
    flock /tmp/helios-cpu.lock python scripts/q8_bench.py --out benchmarks/results/q8_0/xeon-amx.md
    flock /tmp/helios-cpu.lock python scripts/q8_bench.py --gemma --out benchmarks/results/packed/xeon-amx.md
    flock /tmp/helios-cpu.lock python scripts/q8_bench.py --shapes 2048x2048,2048x6144   # Qwen3-1.7B's o and down

Shapes (outputs x inputs): 6144 x 2048 (a Qwen3-1.7B gate/up product) and 1536 x 576 (SmolLM2's); rows: 1 and 16 (a
decode tick alone and batched); with --gemma, 6144 x 2048 and Gemma 3 270M's MLP products 2048 x 640 and 640 x 2048;
--shapes names others, --rows other row counts. Contenders (--only keeps some): `Int8Linear` (c-int8) and `Q8_0Linear` in every variant this CPU runs, `PackedLinear` on random Q4_K, Q5_K,
Q6_K and Q5_0 blocks (the types whose block fits the inputs) in every variant, `CBf16Linear` in every bfloat16 variant
it runs, the float16-weight `CHalfLinear`, and float32 (`torch.nn.functional.linear`, oneDNN). Each time is the
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
GEMMA_SHAPES = [(6144, 2048), (2048, 640), (640, 2048)]
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


def random_blocks(kind: str, n: int, k: int) -> torch.Tensor:
    "[n, k] weights in kind's blocks: random bytes with small float16 block scales (the time does not depend on them)."
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    size, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    b = torch.randint(0, 256, (n, k // size, nbytes), dtype=torch.uint8)
    small = torch.full((n, k // size, 1), 0.001, dtype=torch.float16).view(torch.uint8)
    for start in {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q5_0": (0,)}[kind]: b[..., start:start + 2] = small
    return b.reshape(n, -1)


def contenders(weight: torch.Tensor) -> dict[str, tuple[object, int]]:
    "name -> (a callable on x, the bytes of weights it reads)."
    from helios.kernels.build import KernelUnavailable, int8_variants, native_bf16, q8_variants
    from helios.kernels.matmul import (CBf16Linear, CHalfLinear, Int8Linear, PackedLinear, Q8_0Linear,
                                       matmul_bf16_kernel, matmul_int8_kernel, matmul_kernel, matmul_kquants_kernels,
                                       matmul_q8_0_kernel)
    found = {}
    for variant in int8_variants():
        try: linear = Int8Linear(weight, None, matmul_int8_kernel(variant=variant))
        except KernelUnavailable: continue
        found[f"int8 per channel, {linear.matmul.isa}"] = linear, linear.packed.numel()
    for variant in q8_variants():
        linear = Q8_0Linear(weight, None, matmul_q8_0_kernel(variant=variant))
        found[f"Q8_0 packed, {linear.matmul.isa}"] = linear, linear.packed.numel()
        kernels = matmul_kquants_kernels(variant=variant)
        for kind, size in (("Q4_K", 256), ("Q5_K", 256), ("Q6_K", 256), ("Q5_0", 32)):
            if weight.shape[1] % size: continue
            linear = PackedLinear([(kind, random_blocks(kind, *weight.shape))], weight.shape[1], None, kernels)
            found[f"{kind} packed, {kernels[kind].isa}"] = linear, linear.blocks0.numel()
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
    parser.add_argument("--gemma", action="store_true", help="Gemma 3 270M's MLP shapes beside 6144 x 2048")
    parser.add_argument("--shapes", help="products to time instead, as OUTxIN,OUTxIN (e.g. 2048x2048,2048x6144)")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="rows of activations to time, e.g. 1,16,256")
    parser.add_argument("--only", help="time only the contenders whose name holds one of these, split by semicolons, e.g. 'int8 per channel, AMX;bfloat16'")
    args = parser.parse_args()
    rows_timed = tuple(int(r) for r in args.rows.split(","))
    shapes = GEMMA_SHAPES if args.gemma else SHAPES
    if args.shapes: shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    torch.manual_seed(0)
    lines = [f"CPU: {cpu_line()}", "", "| product (out x in) | rows | matmul | weight MB | ms (best round) | "
             "ms (range) | GB/s of weights |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for n_out, n_in in shapes:
        weight = torch.randn(n_out, n_in) * 0.05
        found = contenders(weight)
        if args.only: found = {k: v for k, v in found.items() if any(part in k for part in args.only.split(";"))}
        inputs = {rows: torch.randn(rows, n_in) for rows in rows_timed}
        times = {(name, rows): [] for name in found for rows in rows_timed}
        for _ in range(ROUNDS):
            for name, (fn, _) in found.items():
                for rows in rows_timed: times[name, rows].append(median_ms(fn, inputs[rows]))
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
