#!/usr/bin/env python3
"""KV memory on this machine's CPU: on-demand pages against full reservation, and the prefix cache's host tier.

Two experiments, each a pair of `helios serve` configurations at the same small KV budget (the embedded
default model, `--threads 2`), run as `helios bench` runs against a fresh server per run:

- `chat-short` with `--kv-reservation full` and `--kv-reservation on-demand` on pools of 20 and 8 pages:
  output tok/s, and the requests running at once, sampled from /health during the run;
- `prefix-spill` (eight 1,100-token prefixes asked in turn, two requests in flight) on a pool of 16 pages,
  without a host tier (`--kv-offload-bytes 0`) and with one of 1 GB: TTFT (median, p90), cached tokens,
  and the tokens served from the host tier (/metrics).

Every configuration runs `--repeat` times, the pair interleaved (A B A B ...), repetition r of both with
seed r, so the two see the same requests. The machine (lscpu model name and vector flags) and `uptime`
before and after are recorded.

    python scripts/kv_memory_bench.py             # the measurement: writes benchmarks/results/kv_memory/
    python scripts/kv_memory_bench.py --smoke     # a tiny end-to-end check, written to a temporary folder

Output: <name>.<config>.json per configuration (a `helios bench` run: the median repetition with each
overall metric's median, `metrics["server"]` the server's side), runs/ with every repetition,
summary.json and summary.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from helios.bench.client import run_benchmark
from helios.bench.metrics import median_run, pct
from helios.bench.report import load_run, save_run
from helios.bench.workloads import WORKLOADS

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "kv_memory"
# one 256-token page of SmolLM2-135M's KV in float32 (the CPU's KV dtype): K and V x 30 layers x 3 heads x 64
PAGE_SIZE, PAGE_BYTES = 256, 256 * 2 * 30 * 3 * 64 * 4   # 11.25 MiB
HOST_TIER_BYTES = "1e9"

EXPERIMENTS = {
    "chat-short": dict(
        workload="chat-short", pages=20, max_concurrency=None, kwargs={}, smoke_kwargs=dict(num_requests=4),
        smoke_pages=20, configs={"full": ["--kv-reservation", "full"], "on-demand": ["--kv-reservation", "on-demand"]}),
    "chat-short-8": dict(
        workload="chat-short", pages=8, max_concurrency=None, kwargs={}, smoke_kwargs=dict(num_requests=4),
        smoke_pages=8, configs={"full": ["--kv-reservation", "full"], "on-demand": ["--kv-reservation", "on-demand"]}),
    "prefix-spill": dict(
        workload="prefix-spill", pages=16, max_concurrency=2, kwargs={},
        # smoke: 3 prefixes of 600 tokens (6 shared pages) twice, one at a time, on a pool of 4 pages
        smoke_kwargs=dict(num_prefixes=3, rounds=2, prefix_tokens=600), smoke_pages=4, smoke_max_concurrency=1,
        configs={"device-only": ["--kv-reservation", "on-demand"],   # no host tier: the default on a CPU
                 "host-tier": ["--kv-reservation", "on-demand", "--kv-offload-bytes", HOST_TIER_BYTES]}),
}


def machine() -> dict:
    "lscpu's model name and the vector flags that decide CPU speed."
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    field = lambda key: next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith(key)), "")
    flags = field("Flags").split()
    wanted = [f for f in flags if f in ("avx2", "fma") or f.startswith(("avx512", "amx"))]
    return dict(cpu=field("Model name"), cpus=os.cpu_count(), flags=wanted, python=sys.version.split()[0])


def uptime() -> str: return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def git_version() -> str:
    out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent)
    return out.stdout.strip() or "unknown"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HeliosServer:
    "`helios serve` in a subprocess on a free port, its output in a log file."
    def __init__(self, flags: list[str], log: Path, timeout_s: float = 300):
        self.url = f"http://127.0.0.1:{free_port()}"
        self.cmd = ["helios", "serve", "--port", self.url.rsplit(":", 1)[1], *flags]
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.startswith("HELIOS_")}  # the flags say it all
        self.proc = subprocess.Popen(self.cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True, env=env)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None: raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200: break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            self.stop()
            raise TimeoutError("server did not start")
        self.model = httpx.get(self.url + "/v1/models", timeout=5).json()["data"][0]["id"]

    def startup_line(self) -> str:
        return next((l for l in self.log.read_text().splitlines() if l.startswith("helios:")), "")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try: self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired: self.proc.kill(); self.proc.wait()


class HealthSampler(threading.Thread):
    "Polls /health every `interval_s` seconds: (time.perf_counter(), its JSON) pairs."
    def __init__(self, url: str, interval_s: float = 0.1):
        super().__init__(daemon=True)
        self.url, self.interval_s, self.samples, self.done = url, interval_s, [], threading.Event()

    def run(self):
        with httpx.Client(timeout=5) as client:
            while not self.done.is_set():
                try: self.samples.append((time.perf_counter(), client.get(self.url + "/health").json()))
                except (httpx.HTTPError, ValueError): pass
                self.done.wait(self.interval_s)


METRIC_LINE = re.compile(r"^(helios:[A-Za-z0-9_:]+)(?:\{([^}]*)\})? (\S+)$")


def parse_metrics(text: str) -> dict[str, float]:
    "Prometheus text without histogram buckets, keyed by name and labels other than model_name."
    out = {}
    for line in text.splitlines():
        m = METRIC_LINE.match(line)
        if not m or m[1].endswith("_bucket") or m[1].endswith("_created"): continue
        labels = [kv for kv in (m[2] or "").split(",") if kv and not kv.startswith("model_name=")]
        key = m[1] + ("{" + ",".join(labels) + "}" if labels else "")
        out[key] = out.get(key, 0.0) + float(m[3])
    return out


def scrape(url: str) -> dict[str, float]: return parse_metrics(httpx.get(url + "/metrics", timeout=10).text)


def metric(prom: dict, name: str, **labels) -> float | None:
    "The sum of a scraped metric's series whose labels include `labels` (None: the server has no such metric)."
    want = [f'{k}="{v}"' for k, v in labels.items()]
    hits = [v for k, v in prom.items() if (k == name or k.startswith(name + "{")) and all(w in k for w in want)]
    return sum(hits) if hits else None


def server_side(samples: list, start_s: float, end_s: float, prom: dict, pages: int) -> dict:
    "What the server saw during a run: requests running and waiting (from /health), preemptions and tier traffic."
    inside = [h for t, h in samples if start_s <= t <= end_s]
    running = [h.get("running", 0) for h in inside]
    waiting = [h.get("waiting", 0) for h in inside]
    return {
        "pages": pages, "health_samples": len(inside),
        "running_peak": max(running, default=None), "running_mean": float(np.mean(running)) if running else None,
        "waiting_peak": max(waiting, default=None),
        "host_cached_pages_peak": max((((h.get("kv_pages") or {}).get("host") or {}).get("cached", 0) for h in inside),
                                      default=None),
        "preemptions": metric(prom, "helios:num_preemptions_total"),
        "preemptions_swapped": metric(prom, "helios:num_preemptions_swapped_total"),
        "recompute_tokens": metric(prom, "helios:recompute_tokens_total"),
        "prefix_hit_tokens": metric(prom, "helios:prefix_cache_hits_total"),
        "prefix_host_hit_tokens": metric(prom, "helios:prefix_cache_host_hits_total"),
        "kv_bytes_to_host": metric(prom, "helios:kv_offload_bytes_total", direction="to_host"),
        "kv_bytes_to_device": metric(prom, "helios:kv_offload_bytes_total", direction="to_device"),
        "kv_offload_s": metric(prom, "helios:kv_offload_seconds_total"),
        "prometheus": prom,
    }


def ttft_stats(run, skip: int = 0) -> dict:
    "TTFT median and p90 of a run's completed requests, from the skip-th on (records are in workload order)."
    ttft = [r.first_token_s - r.send_s for r in run.records[skip:] if r.ok]
    return {"p50": pct(ttft, 50), "p90": pct(ttft, 90), "n": len(ttft)}


def one_run(exp: dict, name: str, label: str, rep: int, args, tokenizer, work: Path):
    "Start a server for one configuration, run the workload (seed rep) while sampling /health, stop it."
    pages = exp["smoke_pages"] if args.smoke else exp["pages"]
    flags = ["--threads", str(args.threads), "--kv-cache-bytes", str(pages * PAGE_BYTES), *exp["configs"][label]]
    kwargs = exp["smoke_kwargs"] if args.smoke else exp["kwargs"]
    specs = WORKLOADS[exp["workload"]](tokenizer, rep, **kwargs)
    if args.requests: specs = specs[:args.requests]
    concurrency = exp.get("smoke_max_concurrency", exp["max_concurrency"]) if args.smoke else exp["max_concurrency"]
    server = HeliosServer(flags, work / f"{name}.{label}.rep{rep}.server.log")
    try:
        health = httpx.get(server.url + "/health", timeout=5).json()
        if health.get("pages") != pages:
            raise RuntimeError(f"asked for {pages} pages of {PAGE_BYTES:,} bytes, the server has {health.get('pages')}: "
                               f"the page size or KV dtype differs from this script's; {server.startup_line()}")
        host_pages = ((health.get("kv_pages") or {}).get("host") or {}).get("total", 0)
        if (host_pages > 0) != ("--kv-offload-bytes" in flags):
            raise RuntimeError(f"the host tier has {host_pages} pages with flags {flags}: {server.startup_line()}")
        sampler = HealthSampler(server.url, args.health_interval_s)
        sampler.start()
        run = asyncio.run(run_benchmark(server.url + "/v1", server.model, specs, engine=f"helios {label}",
                                        workload=exp["workload"], max_concurrency=concurrency, seed=rep,
                                        warmup=args.warmup, config={"engine_flags": " ".join(flags),
                                                                    "workload_kwargs": kwargs,
                                                                    "startup": server.startup_line()}))
        sampler.done.set(); sampler.join()
        run.metrics["server"] = server_side(sampler.samples, run.start_s, run.end_s, scrape(server.url), pages)
        run.metrics["server"]["host_pages"] = host_pages
        run.metrics["server"]["ttft"] = ttft_stats(run)
        if exp["workload"] == "prefix-spill":   # the requests after the first round: every one a repeat
            run.metrics["server"]["ttft_repeats"] = ttft_stats(run, kwargs.get("num_prefixes", 8))
    finally:
        server.stop()
    return run


def _median(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return float(np.median(values)) if values else None


def merged(runs: list):
    "One run per configuration: bench's median repetition, and each server-side number's median."
    run = median_run(runs)
    per_rep = [r.metrics["server"] for r in runs]
    server = {k: _median([s.get(k) for s in per_rep]) for k in per_rep[0] if k not in ("prometheus", "ttft", "ttft_repeats")}
    for key in ("ttft", "ttft_repeats"):
        if key in per_rep[0]: server[key] = {q: _median([s[key][q] for s in per_rep]) for q in ("p50", "p90", "n")}
    server["per_repetition"] = [{k: v for k, v in s.items() if k != "prometheus"} for s in per_rep]
    run.metrics = {**run.metrics, "server": server}
    return run


def fmt(v, digits: int = 3) -> str:
    if v is None: return "–"
    if isinstance(v, float) and not v.is_integer(): return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"
    return f"{int(v):,}"


def summarize(results: dict) -> dict:
    "The numbers the issue asks for, per configuration, and the ratios between each pair."
    out = {}
    for name, runs in results.items():
        rows = {}
        for label, run in runs.items():
            o, s = run.metrics["overall"], run.metrics["server"]
            rows[label] = {"output_tok_s": o["output_tok_s"],
                           "output_tok_s_per_rep": [r["output_tok_s"] for r in run.repetitions] or [o["output_tok_s"]],
                           "running_peak": s["running_peak"], "running_mean": s["running_mean"],
                           "waiting_peak": s["waiting_peak"], "preemptions": s["preemptions"],
                           "ttft_p50_s": s["ttft"]["p50"], "ttft_p90_s": s["ttft"]["p90"],
                           "ttft_repeats_p50_s": (s.get("ttft_repeats") or {}).get("p50"),
                           "ttft_repeats_p90_s": (s.get("ttft_repeats") or {}).get("p90"),
                           "e2e_p50_s": o["e2e_p50_s"], "output_tokens": o["output_tokens"],
                           "max_token_hit_rate": o["max_token_hit_rate"], "cached_tokens": o["restored_tokens"],
                           "cache_hit_rate": o["cache_hit_rate"], "host_hit_tokens": s["prefix_host_hit_tokens"],
                           "kv_bytes_to_host": s["kv_bytes_to_host"], "kv_bytes_to_device": s["kv_bytes_to_device"],
                           "errors": o["errors"], "pages": s["pages"], "engine_flags": run.config["engine_flags"]}
        a, b = list(rows)
        ratio = lambda k: (rows[b][k] / rows[a][k]) if rows[a].get(k) and rows[b].get(k) is not None else None
        out[name] = {"configs": rows, f"{b} / {a}": {k: ratio(k) for k in
                                                       ("output_tok_s", "running_mean", "ttft_p50_s", "ttft_p90_s")}}
    return out


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# KV memory: on-demand pages and the prefix cache's host tier{' (SMOKE RUN: not a result)' if result['smoke'] else ''}",
             "",
             f"{m['cpu']} ({m['cpus']} CPUs; flags {', '.join(m['flags']) or 'none of interest'}), `helios serve "
             f"--threads {result['threads']}`, the embedded SmolLM2-135M-Instruct, helios {result['version']}; "
             f"{result['repeat']} repetition{'s' * (result['repeat'] != 1)} per configuration, interleaved; medians. "
             f"Load before: `{result['uptime_before']}`, after: `{result['uptime_after']}`.",
             "", f"`{result['command']}`", ""]
    for chat in [v for k, v in result["summary"].items() if k.startswith("chat-short")]:
        pages = int(next(iter(chat["configs"].values()))["pages"])
        lines += [f"## chat-short: full reservation against on-demand pages ({pages} pages of {PAGE_SIZE} tokens, "
                  f"{pages * PAGE_BYTES / 2 ** 20:,.0f} MiB)", "",
                  "| reservation | output tok/s | per repetition | running peak | running mean | waiting peak | "
                  "preemptions | TTFT p50 (s) | E2E p50 (s) | output tokens | max-token hit rate | errors |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for label, r in chat["configs"].items():
            lines.append(f"| {label} | {fmt(r['output_tok_s'])} | {', '.join(fmt(x) for x in r['output_tok_s_per_rep'])} | "
                         f"{fmt(r['running_peak'])} | {fmt(r['running_mean'])} | {fmt(r['waiting_peak'])} | "
                         f"{fmt(r['preemptions'])} | {fmt(r['ttft_p50_s'])} | {fmt(r['e2e_p50_s'])} | "
                         f"{fmt(r['output_tokens'])} | {fmt(r['max_token_hit_rate'])} | {fmt(r['errors'])} |")
        (k, v), = [(k, v) for k, v in chat.items() if k != "configs"]
        lines += ["", f"{k}: output tok/s ×{fmt(v['output_tok_s'])}, mean running requests ×{fmt(v['running_mean'])}.", ""]
    spill = result["summary"].get("prefix-spill")
    if spill:
        pages = int(next(iter(spill["configs"].values()))["pages"])
        lines += [f"## prefix-spill: without and with a host tier of {float(HOST_TIER_BYTES) / 1e9:g} GB "
                  f"({pages} device pages of {PAGE_SIZE} tokens)", "",
                  "| host tier | TTFT p50 (s) | TTFT p90 (s) | repeats' TTFT p50 (s) | repeats' TTFT p90 (s) | "
                  "cached tokens | cache hit rate | host-tier hit tokens | to host (MiB) | to device (MiB) | errors |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        mib = lambda v: None if v is None else v / 2 ** 20
        for label, r in spill["configs"].items():
            lines.append(f"| {label} | {fmt(r['ttft_p50_s'])} | {fmt(r['ttft_p90_s'])} | {fmt(r['ttft_repeats_p50_s'])} | "
                         f"{fmt(r['ttft_repeats_p90_s'])} | {fmt(r['cached_tokens'])} | {fmt(r['cache_hit_rate'])} | "
                         f"{fmt(r['host_hit_tokens'])} | {fmt(mib(r['kv_bytes_to_host']))} | "
                         f"{fmt(mib(r['kv_bytes_to_device']))} | {fmt(r['errors'])} |")
        (k, v), = [(k, v) for k, v in spill.items() if k != "configs"]
        lines += ["", f"{k}: TTFT p50 ×{fmt(v['ttft_p50_s'])}, p90 ×{fmt(v['ttft_p90_s'])}.", ""]
    for name, runs in result["configs"].items():
        for label, flags in runs.items(): lines.append(f"- {name} / {label}: `helios serve {flags}`")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="repetitions of each configuration (interleaved)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the server")
    p.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS), choices=list(EXPERIMENTS))
    p.add_argument("--requests", type=int, default=None, help="send only the first N requests of each workload")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--health-interval-s", type=float, default=0.1)
    p.add_argument("--smoke", action="store_true",
                   help="tiny workloads, one repetition, written to a temporary folder unless --out-dir is given")
    p.add_argument("--out-dir", type=Path, default=None, help=f"default: {RESULTS} (a temporary folder with --smoke)")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rebuild the per-configuration JSON and the summary from --out-dir's runs/")
    args = p.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    if args.smoke and "--repeat" not in given: args.repeat = 1
    out = args.out_dir or (Path(tempfile.mkdtemp(prefix="kv_memory_smoke.")) if args.smoke else RESULTS)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    command = " ".join(["python scripts/kv_memory_bench.py", *given])
    results = {name: {label: [] for label in EXPERIMENTS[name]["configs"]} for name in args.experiments}
    if args.report_only:
        previous = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
        for name, by_label in results.items():
            for label, runs in by_label.items():
                runs += [load_run(f) for f in sorted((out / "runs").glob(f"{name}.{label}.rep*.json"))]
        results = {name: by_label for name, by_label in results.items() if all(by_label.values())}
        if not results: raise SystemExit(f"no complete pair of runs in {out / 'runs'}")
        reps = min(len(runs) for by_label in results.values() for runs in by_label.values())
        smoke = any(r.config.get("workload_kwargs") == EXPERIMENTS[name]["smoke_kwargs"]
                    for name, by_label in results.items() for runs in by_label.values() for r in runs)
        return report(out, results, args, previous.get("uptime_before", "unknown"), previous.get("wall_s"),
                      previous.get("command", command), reps, smoke,
                      previous.get("uptime_after"))

    from helios.tokenizer import load_tokenizer
    from helios.weights import default_model_path
    tokenizer = load_tokenizer(default_model_path())
    before, started = uptime(), time.time()
    print(f"kv_memory_bench: {machine()['cpu']}; load {before.split('load average:')[-1].strip()}; writing {out}",
          flush=True)
    for rep in range(args.repeat):
        for name in args.experiments:
            for label in EXPERIMENTS[name]["configs"]:   # A B, A B, ...: the pair shares the machine's drift
                run = one_run(EXPERIMENTS[name], name, label, rep, args, tokenizer, out / "runs")
                save_run(run, out / "runs" / f"{name}.{label}.rep{rep}.json")
                o, s = run.metrics["overall"], run.metrics["server"]
                print(f"  {name:12} {label:11} rep {rep}: {o['completed']}/{o['requests']} done, "
                      f"{o['output_tokens']} output tokens, {fmt(o['output_tok_s'])} output tok/s, "
                      f"TTFT p50 {fmt(s['ttft']['p50'])} s, running peak {fmt(s['running_peak'])} "
                      f"mean {fmt(s['running_mean'])}, preemptions {fmt(s['preemptions'])}, "
                      f"cached {o['restored_tokens']} (host {fmt(s['prefix_host_hit_tokens'])}), "
                      f"errors {o['errors']}", flush=True)
                results[name][label].append(run)
    return report(out, results, args, before, time.time() - started, command, args.repeat, args.smoke)


def report(out: Path, results: dict, args, before: str, wall_s, command: str, repeat: int, smoke: bool,
           after: str | None = None) -> int:
    "Merge each configuration's repetitions, write them and the summary (JSON and markdown), print the markdown."
    merged_runs = {name: {label: merged(runs) for label, runs in by_label.items()} for name, by_label in results.items()}
    for name, by_label in merged_runs.items():
        for label, run in by_label.items(): save_run(run, out / f"{name}.{label}.json")
    result = dict(smoke=smoke, machine=machine(), threads=args.threads, repeat=repeat, version=git_version(),
                  uptime_before=before, uptime_after=after or uptime(), wall_s=wall_s, command=command,
                  page_bytes=PAGE_BYTES, host_tier_bytes=float(HOST_TIER_BYTES),
                  configs={name: {label: run.config["engine_flags"] for label, run in by_label.items()}
                           for name, by_label in merged_runs.items()},
                  summary=summarize(merged_runs))
    (out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "summary.md").write_text(markdown(result))
    print("\n" + markdown(result))
    errors = sum(r.metrics["overall"]["errors"] for by_label in results.values() for runs in by_label.values() for r in runs)
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
