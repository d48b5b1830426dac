"""The prefill order against the tick budget: time to first token and inter-token latency on helios-30.

Starts `helios serve` once per setting (prefill order x prefill chunk size), runs `helios bench --workload helios-30`
against it, and writes every run's overall metrics, the machine and the load to OUT/summary.json (chapter 15 plots it).

    python scripts/ttft_policy.py --out benchmarks/results/ttft-policy-amd-epyc --repeat 2 --threads 2
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from helios.bench.metrics import machine_info, probe_machine
from helios.kernels.build import cpu_flags, cpu_isa
from kv_memory_bench import HeliosServer  # a sibling script: `helios serve` on a free port, ready when it returns


def run_one(order: str, chunk: int, threads: int, seed: int, workload: str, logs: Path) -> dict:
    "Serve with one setting, bench once, stop; the run's overall metrics and the load around it."
    flags = ["--threads", str(threads), "--max-batch-size", "32", "--prefill-order", order, "--prefill-chunk-size", str(chunk)]
    server = HeliosServer(flags, logs / f"{order}.{chunk}.{seed}.server.log")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run.json"
            subprocess.run(["helios", "bench", "--base-url", server.url + "/v1", "--workload", workload, "--seed", str(seed),
                            "--engine", f"helios {order} {chunk}", "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
            run = json.loads(out.read_text())
    finally:
        server.stop()
    return {"order": order, "chunk": chunk, "seed": seed, "overall": run["metrics"]["overall"],
            "load_average": run["machine"]["load_average"][0], "load_average_after": run["machine"]["load_average_after"][0]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chunks", default="256,512,1024")
    p.add_argument("--orders", default="shortest-first,oldest-first")
    p.add_argument("--workload", default="helios-30")
    args = p.parse_args()
    out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="ttft-policy-"))  # the servers' logs, outside the results
    summary = {"command": " ".join(["python", "scripts/ttft_policy.py", *sys.argv[1:]]), "workload": args.workload,
               "probe": probe_machine(threads=args.threads, seconds=2.0), "machine": machine_info(),
               "cpu_flags": sorted(f for f in cpu_flags() or () if f.startswith(("avx", "amx", "fma", "f16c"))),
               "kernels": cpu_isa(), "runs": []}
    for round_ in range(args.repeat):  # fresh prompts each round (the seed), settings in a fixed order within it
        for chunk in map(int, args.chunks.split(",")):
            for order in args.orders.split(","):
                run = run_one(order, chunk, args.threads, seed=round_ + 1, workload=args.workload, logs=logs)
                summary["runs"].append(run)
                o = run["overall"]
                print(f"round {round_ + 1} {order:>14} chunk {chunk:>4}: TTFT p50 {o['ttft_p50_s']:.2f} s p95 "
                      f"{o['ttft_p95_s']:.2f} s, TPOT p50 {o['tpot_p50_s'] * 1e3:.0f} ms, ITL p95 {o['itl_p95_s'] * 1e3:.0f} ms, "
                      f"{o['output_tok_s']:.0f} out tok/s (load {run['load_average']:.1f})", flush=True)
                (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
