"""What loading a model costs in memory: the process's peak resident set while `load_model` runs, what stays resident
once it returns, and the model's own bytes (each storage once), each model loaded in a fresh process.

    python scripts/load_memory.py                                   # SmolLM2 (the embedded default), Gemma 3 270M
    python scripts/load_memory.py ~/.cache/helios-models/qwen3-1.7b-q4k.gguf --matmul auto --matmul c-bf16

A model is anything `LLM(model)` takes; make a Qwen3-1.7B-shaped file with `scripts/random_checkpoint.py OUT --gguf`.
The peak (VmHWM) counts the file's pages that are mapped and read; `after` splits the resident set into anonymous
memory (the tensors, and what the allocator kept) and the file's pages.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def status() -> dict[str, float]:
    "The process's memory lines of /proc/self/status that matter here, in MiB."
    keys = ("VmHWM", "VmRSS", "RssAnon", "RssFile")
    out = {}
    for line in open("/proc/self/status"):
        name, _, value = line.partition(":")
        if name in keys: out[name] = int(value.split()[0]) / 1024
    return out


def measure(model: str | None, matmul: str) -> dict:
    "Load once in this process: the memory before, at its peak and after, and the model's bytes."
    import torch
    from helios.weights import load_model
    torch.set_num_threads(2)
    before = status()
    loaded = load_model(model, matmul=matmul)
    after, seen, weights = status(), set(), 0
    for t in [*loaded.model.parameters(), *loaded.model.buffers()]:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen: seen.add(storage.data_ptr()); weights += storage.nbytes()
    weights += sum(getattr(m, "packed_bytes", 0) for m in loaded.model.modules())  # fbgemm's packs are not buffers
    return dict(model=loaded.path.name, file_mb=os.path.getsize(loaded.path) / 2**20 if loaded.path.is_file() else None,
                matmul=loaded.matmul.value.summary or loaded.matmul.implementation.summary, before_mb=before["VmRSS"],
                peak_mb=after["VmHWM"], after_anon_mb=after["RssAnon"], after_file_mb=after["RssFile"],
                weights_mb=weights / 2**20, load_s=loaded.load_time_s)


def cpu_line() -> str:
    name = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return f"{name}, load average {os.getloadavg()[0]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["", "gemma3-270m"], help="'' is the embedded default")
    parser.add_argument("--matmul", action="append", help="matmul implementations to load with (default: auto)")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "MATMUL"), help=argparse.SUPPRESS)  # the child's work
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0] or None, args.one[1])))
        return
    print(cpu_line())
    print("| model | file MiB | matmul | peak MiB | after: anonymous MiB | after: file pages MiB | model's bytes MiB | load s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for model in args.models:
        for matmul in args.matmul or ["auto"]:
            run = subprocess.run([sys.executable, __file__, "--one", model, matmul], capture_output=True, text=True)
            if run.returncode:
                print(f"| {model or 'default'} | | {matmul} | failed: {run.stderr.strip().splitlines()[-1]} |"); continue
            r = json.loads(run.stdout.strip().splitlines()[-1])
            file_mb = "" if r["file_mb"] is None else f"{r['file_mb']:.0f}"
            print(f"| {r['model']} | {file_mb} | {r['matmul']} | {r['peak_mb']:.0f} | {r['after_anon_mb']:.0f} | "
                  f"{r['after_file_mb']:.0f} | {r['weights_mb']:.0f} | {r['load_s']:.1f} |")
    print(cpu_line())


if __name__ == "__main__":
    main()
