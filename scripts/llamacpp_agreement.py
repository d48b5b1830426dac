#!/usr/bin/env python3
"""Gemma 3 270M: how often Helios's next token agrees with llama.cpp's on the same GGUF (a second opinion).

llama-server (llama.cpp built from llama-cpp-python's vendored sources by `benchmarks/peers.sh`, in
$PEERS_DIR/bin) serves the Q4_K_M GGUF of the installed `gemma3-270m` packages. For each of a set of plain-text
prompts, Helios's tokenizer gives the token ids (BOS first); llama-server receives those ids, not the text, and
continues them greedily with `n_probs`, so every generated position carries llama.cpp's top-1 token. Helios then
reads prompt + continuation in one forward pass (teacher forcing) and, at every generated position, its argmax is
compared with llama.cpp's top-1. Where they differ, the gap between the two tokens' logits in Helios (and
llama.cpp's own margin between its first and second choice) says whether the disagreement is a near-tie, as the
two engines' different arithmetic on Q4 weights produces. Helios runs twice: float32 with PyTorch matmuls (the
reference the real-weight tests use) and as `LLM` serves it on this CPU (dtype and matmul 'auto').

    python scripts/llamacpp_agreement.py                 # benchmarks/results/gemma3_llamacpp_agreement-<cpu>.{json,md}
    python scripts/llamacpp_agreement.py --max-tokens 8  # shorter continuations (fewer positions)

Needs llama-server built first (`ENGINES=llama bash benchmarks/peers.sh` builds it, or its `build_llama_server`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

import torch

from helios.tokenizer import load_tokenizer
from helios.weights import LoadedModel, find_checkpoint, load_model

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PEERS = Path(os.environ.get("PEERS_DIR", Path.home() / ".cache" / "helios-peers"))
FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "fma")
MIN_POSITIONS = 100  # the issue's floor for the agreement to be reported
N_PROBS = 2          # llama.cpp's top-2 per position: its choice and its runner-up (for its own margin)
SERVER_START_S = 300

PROMPTS = [  # plain text (no chat template), varied: prose, facts, lists, code, other languages, numbers, markup
    "The capital of France is",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "Photosynthesis is the process by which plants",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Ingredients for a simple pancake recipe:\n1.",
    "La tour Eiffel a été construite en",
    "1, 1, 2, 3, 5, 8, 13, 21,",
    "<html>\n  <head>\n    <title>",
    "The three laws of thermodynamics state that",
    "Q: What is the boiling point of water at sea level?\nA:",
    "import numpy as np\n\nx = np.linspace(0, 1, 100)\ny =",
    "In 1969, the Apollo 11 mission",
]


class Position(NamedTuple):
    "One generated position: llama.cpp's top-1 and runner-up, Helios's argmax, and the logit gaps."
    prompt: int
    index: int              # position in the continuation (0: the first generated token)
    llama_token: int
    llama_margin: float     # llama.cpp's logprob of its top-1 minus its runner-up's (nats)
    helios_token: int
    helios_gap: float       # Helios: logit of its argmax minus logit of llama.cpp's top-1 (0 where they agree)
    helios_margin: float    # Helios: its top-1 logit minus its runner-up's


def free_port() -> int:
    "A TCP port on 127.0.0.1 that nothing listens on now."
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout_s: float = 600) -> dict:
    "POST a JSON body; the JSON answer."
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r: return json.load(r)


def start_llama_server(binary: Path, gguf: Path, port: int, threads: int, log: Path) -> subprocess.Popen:
    "llama-server on 127.0.0.1:port, one slot; returns once /health answers."
    cmd = [str(binary), "-m", str(gguf), "-t", str(threads), "-np", "1", "-c", "4096",
           "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    env = {**os.environ, "LD_LIBRARY_PATH": str(binary.parent)}
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None: raise RuntimeError(f"llama-server exited with {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200: return proc
        except OSError: pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError(f"llama-server did not answer /health within {SERVER_START_S} s; see {log}")


def llama_continue(port: int, ids: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    "llama.cpp's greedy continuation of the token ids, and its top-1-minus-runner-up logprob at each position."
    body = dict(prompt=ids, n_predict=max_tokens, temperature=0.0, n_probs=N_PROBS, cache_prompt=False)
    out = post(f"http://127.0.0.1:{port}/completion", body)
    if out["timings"]["prompt_n"] != len(ids):  # it evaluated exactly our ids: no BOS added, none dropped
        raise RuntimeError(f"llama-server read {out['timings']['prompt_n']} prompt tokens, sent {len(ids)}")
    tokens, margins = [], []
    for p in out["completion_probabilities"]:
        top = p["top_logprobs"]
        if top[0]["id"] != p["id"]: raise RuntimeError(f"greedy sampled {p['id']}, not its top-1 {top[0]['id']}")
        tokens.append(top[0]["id"])
        margins.append(top[0]["logprob"] - top[1]["logprob"])
    return tokens, margins


def helios_logits(model, ids: list[int]) -> torch.Tensor:
    "One teacher-forced forward pass; logits: [T, vocab] in float32."
    x = torch.tensor([ids])
    with torch.inference_mode(): return model(x, torch.arange(len(ids))[None])[0].float()


def compare(model, prompt_idx: int, prompt: list[int], cont: list[int], margins: list[float]) -> list[Position]:
    "Helios's argmax at each generated position against llama.cpp's top-1 (cont)."
    logits = helios_logits(model, prompt + cont[:-1])[len(prompt) - 1:]  # row i predicts cont[i]
    rows = []
    for i, (want, row) in enumerate(zip(cont, logits)):
        top2 = row.topk(2)
        got = int(top2.indices[0])
        rows.append(Position(prompt_idx, i, want, margins[i], got, float(row[got] - row[want]),
                             float(top2.values[0] - top2.values[1])))
    return rows


def describe(loaded: LoadedModel) -> str:
    "How the loaded model computes: activations, matmul weights and implementation."
    matmul = loaded.matmul.implementation.name if loaded.matmul else "torch"
    return f"{str(loaded.dtype).removeprefix('torch.')} activations, " \
           f"{str(loaded.weight_dtype).removeprefix('torch.')} weights, matmul {matmul}"


def summary(rows: list[Position], how: str) -> dict:
    "Agreement over the positions, and every position where the two differ."
    differ = [r for r in rows if r.helios_token != r.llama_token]
    matches = len(rows) - len(differ)
    return dict(how=how, positions=len(rows), matches=matches, agreement=matches / len(rows),
                median_margin=statistics.median(r.helios_margin for r in rows),
                max_gap_where_differ=max((r.helios_gap for r in differ), default=0.0),
                disagreements=[r._asdict() for r in differ])


def machine() -> dict:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    field = lambda key: next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith(key)), "")
    flags = field("Flags").split()
    return dict(cpu=field("Model name"), cpus=os.cpu_count(), flags=[f for f in FLAGS_OF_INTEREST if f in flags],
                load_average=list(os.getloadavg()), torch_threads=torch.get_num_threads())


def llama_version(binary: Path) -> dict:
    "llama-server's own version line and the llama-cpp-python sdist its sources came from."
    run = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                         env={**os.environ, "LD_LIBRARY_PATH": str(binary.parent)})
    line = next((l for l in (run.stdout + run.stderr).splitlines() if l.startswith("version")), "unknown")
    sdists = sorted((PEERS / "llama-src").glob("llama_cpp_python-*.tar.gz"))
    sdist = sdists[-1].name.removesuffix(".tar.gz").removeprefix("llama_cpp_python-") if sdists else "unknown"
    cache = PEERS / "llama-src" / "build" / "CMakeCache.txt"  # the CPU features it was built for (LLAMA_CMAKE_FLAGS)
    text = cache.read_text() if cache.exists() else ""
    on = re.findall(r"^(GGML_(?:NATIVE|AVX|AMX|FMA|F16C|BMI)\w*):BOOL=ON$", text, re.M)
    return dict(server_version=line, llama_cpp_python_sdist=sdist, ggml_cpu_features_on=on)


def markdown_piece(text: str) -> str:
    "A token's text, safe inside a markdown table's code span."
    return text.replace("\n", "\\n").replace("|", "\\|").replace("`", "'")


def markdown(result: dict) -> str:
    m, lv = result["machine"], result["llama_cpp"]
    load = ", ".join(f"{x:.2f}" for x in m["load_average"])
    lines = [f"# Gemma 3 270M: Helios against llama.cpp on {m['cpu']}", "",
             f"{m['cpus']} CPUs, flags {', '.join(m['flags'])}; load average {load} before, "
             f"{', '.join(f'{x:.2f}' for x in result['load_average_after'])} after.",
             f"llama.cpp: llama-server from llama-cpp-python {lv['llama_cpp_python_sdist']}'s vendored sources "
             f"(`{lv['server_version']}`; built with {', '.join(lv['ggml_cpu_features_on']) or 'unknown flags'}), "
             f"{result['threads']} threads, greedy, `n_probs` {N_PROBS}.",
             f"Model: `{result['gguf']}` (Q4_K_M). {len(result['prompts'])} plain-text prompts as token ids "
             f"(Helios's tokenizer, BOS first), up to {result['max_tokens']} tokens each; every generated position "
             "teacher-forced through Helios in one forward pass.", "",
             "| Helios | computes with | positions | agree | agreement | largest logit gap where they differ "
             "| median top-1 margin (all positions) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, s in result["helios"].items():
        lines.append(f"| {name} | {s['how']} | {s['positions']} | {s['matches']} | {s['agreement']:.1%} "
                     f"| {s['max_gap_where_differ']:.3f} | {s['median_margin']:.3f} |")
    piece = lambda t: f"{t} `{result['pieces'][str(t)]}`"
    for name, s in result["helios"].items():
        if not s["disagreements"]: continue
        lines += ["", f"Where {name} differs (gap: Helios's logit of its token minus that of llama.cpp's; margins: "
                  "each engine's top-1 minus runner-up, llama.cpp's in logprob nats):", "",
                  "| prompt | position | llama.cpp | Helios | Helios gap | Helios margin | llama.cpp margin |",
                  "|---:|---:|---|---|---:|---:|---:|"]
        for d in s["disagreements"]:
            lines.append(f"| {d['prompt']} | {d['index']} | {piece(d['llama_token'])} | {piece(d['helios_token'])} "
                         f"| {d['helios_gap']:.3f} | {d['helios_margin']:.3f} | {d['llama_margin']:.3f} |")
    lines += ["", "Prompts and llama.cpp's continuations:", "",
              "| prompt | text | llama.cpp continues |", "|---:|---|---|"]
    lines += [f"| {i} | `{markdown_piece(p)}` | `{markdown_piece(c)}` |"
              for i, (p, c) in enumerate(zip(result["prompts"], result["continuations"]))]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma3-270m", help="a GGUF path or short name (default: gemma3-270m)")
    ap.add_argument("--max-tokens", type=int, default=24, help="greedy tokens asked of llama.cpp per prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--server", type=Path, default=PEERS / "bin" / "llama-server")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    before = machine()
    gguf = find_checkpoint(args.model)
    tokenizer = load_tokenizer(gguf)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    port = free_port()
    log = Path(f"/tmp/llamacpp_agreement.{port}.log")
    proc = start_llama_server(args.server, gguf, port, args.threads, log)
    try: continued = [llama_continue(port, ids, args.max_tokens) for ids in prompts]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    positions = sum(len(cont) for cont, _ in continued)
    if positions < MIN_POSITIONS: raise SystemExit(f"only {positions} positions; ask for more --max-tokens")
    configs = {"float32 reference": dict(dtype="float32", optimize=False), "as LLM loads it": dict()}
    helios = {}
    for name, kwargs in configs.items():
        loaded = load_model(gguf, **kwargs)
        rows = [r for i, (p, (cont, margins)) in enumerate(zip(prompts, continued))
                for r in compare(loaded.model, i, p, cont, margins)]
        helios[name] = summary(rows, describe(loaded))
        print(f"{name}: {helios[name]['matches']}/{helios[name]['positions']} = {helios[name]['agreement']:.1%}")
    shown = {d[k] for s in helios.values() for d in s["disagreements"] for k in ("llama_token", "helios_token")}
    result = dict(gguf=gguf.name, threads=args.threads, max_tokens=args.max_tokens, prompts=PROMPTS,
                  continuations=[tokenizer.decode(c) for c, _ in continued],
                  machine=before, load_average_after=list(os.getloadavg()),
                  llama_cpp=llama_version(args.server), helios=helios,
                  pieces={str(t): markdown_piece(tokenizer.decode([t], skip_special_tokens=False)) for t in shown})
    slug = re.sub(r"[^a-z0-9]+", "-", result["machine"]["cpu"].lower()).strip("-")[:40] or "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"gemma3_llamacpp_agreement-{slug}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
