"""One short check of Helios on a CUDA machine, run once and written down.

Random models in Qwen3-0.6B and Qwen3-4B shapes (built with transformers, saved as float32 safetensors, loaded by
Helios from that folder) are checked for:

- greedy parity with transformers in float32 (same tokens for prompts of 5, 37 and 300 tokens);
- last-position logits within a stated tolerance of transformers' in float16 and bfloat16;
- engine invariance in float32: each prompt's greedy tokens alone = in one batch = with chunked prefill = with a
  shared prefix read from the prefix cache = with decode ticks replayed from CUDA graphs;

and timed: a decode tick at batch 1, 8 and 32, eager against CUDA graphs, and a 2,048-token prefill.

Every part is recorded on its own (a failing part records its error; the rest still run); after `--budget-s`
seconds the parts not yet started are recorded as skipped. The JSON goes to benchmarks/results/gpu-<device>.json
(on a CPU, to a temporary folder unless `--out` says where). Exit status: 0 when every check that ran passed.

    python scripts/gpu_check.py                                   # on a CUDA machine
    python scripts/gpu_check.py --device cpu --shapes tiny --out /tmp/gpu-check.json   # smoke run, seconds
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

QWEN3 = dict(rope_theta=1e6, rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)
REAL_SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True,
                       max_position_embeddings=40960),
    "qwen3-4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True,
                     max_position_embeddings=40960),
}
TINY_SHAPES = {  # helios.config.tiny_qwen3's shape, and an untied one with more layers and GQA 3:1
    "tiny-qwen3-tied": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=32, intermediate_size=128, vocab_size=256, tie_word_embeddings=True,
                            max_position_embeddings=4096),
    "tiny-qwen3-untied": dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                              head_dim=16, intermediate_size=192, vocab_size=384, tie_word_embeddings=False,
                              max_position_embeddings=4096),
}
# Random weights drawn with std LOGIT_STD / sqrt(hidden) give logits of std ~LOGIT_STD: greedy picks are decided by
# the model, not by rounding (the default 0.02 makes the top two logits of 151,936 near-ties), and the residual
# stream stays far from float16's range.
LOGIT_STD = 3.0

PARITY_LENGTHS = (5, 37, 300)   # prompts of the parity and logits checks
PARITY_TOKENS = 16              # greedy tokens compared
INVARIANCE_TOKENS = 16
SMALL_CHUNK = 64                # the chunked-prefill check's prefill_chunk_size
PAGE = 256                      # Helios's default page size: the prefix-cache check shares two pages and a bit
DECODE_BATCHES = (1, 8, 32)
DECODE_CONTEXT = 128            # prompt tokens of each decoding row
PREFILL_TOKENS = 2048
KV_TOKENS = 16384               # every engine's KV pool holds this many tokens
# Stated tolerance of the low-precision logits check, on the last position's logits of each parity prompt, measured
# as a relative RMS difference ||a - b|| / ||b||: (1) Helios against transformers run in the same dtype from the same
# float32 weights is within LOGIT_TOLERANCE; (2) Helios is no further from float32 than FP32_RATIO times
# transformers' own distance from float32 (what the dtype alone costs), plus FP32_SLACK. Measured on a CPU at the
# 0.6B shape (vocabulary cut to 8,192): Helios vs transformers 0.5-0.7% in float16, 4.5-5.4% in bfloat16, and each
# about as far from float32 as the other (ratio 0.84-1.0).
LOGIT_TOLERANCE = {"float16": 0.03, "bfloat16": 0.15}
FP32_RATIO, FP32_SLACK = 1.5, 0.01


class Skip(Exception):
    "A part that cannot run here (not an error): not on this device, or an earlier part it needs did not run."


# ---- the record ----
@dataclass
class Recorder:
    "Runs parts one by one, each wrapped: status, seconds, result or error go into `parts`; the budget skips the rest."
    budget_s: float
    start: float = field(default_factory=time.monotonic)
    parts: list[dict] = field(default_factory=list)
    save: Callable[[], None] | None = None  # called after every record: a run cut short still leaves its JSON

    @property
    def elapsed(self) -> float: return time.monotonic() - self.start

    @property
    def out_of_time(self) -> bool: return self.elapsed > self.budget_s

    def add(self, name: str, status: str, seconds: float = 0.0, result: dict | None = None, error: str | None = None):
        "Record one part; status: pass, fail (a check), ok (a measurement), error (it raised) or skipped."
        entry = dict(name=name, status=status, seconds=round(seconds, 3))
        if result is not None: entry["result"] = result
        if error is not None: entry["error"] = error
        self.parts.append(entry)
        line = f"[{self.elapsed:7.1f} s] {status.upper():7} {name} ({seconds:.1f} s)"
        if error: line += f": {error.strip().splitlines()[-1][:200]}"
        print(line, flush=True)
        if self.save: self.save()

    def counts(self) -> dict[str, int]:
        return {k: sum(p["status"] == k for p in self.parts) for k in ("pass", "fail", "error", "ok", "skipped")}

    def run(self, name: str, fn: Callable[..., dict], *args) -> dict | None:
        "fn(*args) -> a result dict (with `passed` for a check); None when it was skipped or raised."
        if self.out_of_time:
            self.add(name, "skipped", error=f"the budget of {self.budget_s:.0f} s was spent")
            return None
        print(f"[{self.elapsed:7.1f} s] ...     {name}", flush=True)
        t0 = time.monotonic()
        try:
            result = fn(*args)
        except Skip as e:
            self.add(name, "skipped", time.monotonic() - t0, error=str(e))
            return None
        except Exception:
            self.add(name, "error", time.monotonic() - t0, error=traceback.format_exc(limit=6))
            return None
        finally:
            release_memory()  # the part's engines and KV pools
        status = "ok" if "passed" not in result else ("pass" if result["passed"] else "fail")
        self.add(name, status, time.monotonic() - t0, result)
        return result


@dataclass
class Shape:
    "One model shape's state, handed from part to part (each part says what it needs)."
    name: str
    spec: dict
    args: argparse.Namespace
    work_dir: Path
    folder: Path | None = None
    hf: Any = None              # transformers, float32, on the device
    fp32: Any = None            # Helios's float32 model
    tokenizer: Any = None       # Helios's tokenizer of the folder
    attention32: str = "auto"   # the attention Helios's float32 runs with here (torch if auto fails)
    ref_tokens: list | None = None   # transformers' float32 greedy tokens of parity_prompts
    ref_logits: list | None = None   # transformers' float32 last-position logits of parity_prompts
    alone: list | None = None        # Helios's float32 tokens of invariance_prompts, each prompt alone
    timing_model: Any = None    # Helios's model in --timing-dtype

    def need(self, *names: str):
        missing = [n for n in names if getattr(self, n) is None]
        if missing: raise Skip(f"needs {', '.join(missing)}, which an earlier part did not produce")

    @property
    def device(self) -> torch.device: return torch.device(self.args.device)

    @property
    def vocab(self) -> int: return self.spec["vocab_size"]

    def parity_prompts(self) -> list[list[int]]: return random_prompts(PARITY_LENGTHS, self.vocab, seed=1)

    def invariance_prompts(self) -> tuple[list[list[int]], int]:
        "Own prompts of several lengths, then three sharing a first 2 pages + 17 tokens; and how many are own."
        own = random_prompts((5, 37, 300, 601), self.vocab, seed=2)
        prefix = random_prompts((2 * PAGE + 17,), self.vocab, seed=3)[0]
        shared = [prefix + tail for tail in random_prompts((3, 20, 45), self.vocab, seed=4)]
        return own + shared, len(own)


# ---- small helpers ----
def random_prompts(lengths, vocab: int, seed: int) -> list[list[int]]:
    "Token-id prompts of the given lengths, the same for a seed."
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def slug(text: str) -> str: return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def sync(device: torch.device):
    if device.type == "cuda": torch.cuda.synchronize(device)


def release_memory():
    "Collect what is unreachable (engines hold reference cycles), then hand cached CUDA blocks back."
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized(): torch.cuda.empty_cache()


def greedy(max_tokens: int, **extra):
    from helios.sampling import SamplingParams
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **extra)


def kv_bytes(model, tokens: int = KV_TOKENS) -> int:
    "A KV budget of `tokens` tokens for this model in its dtype."
    element = model.model.embed_tokens.weight.element_size()
    return model.config.kv_bytes_per_token(element) * tokens


def make_engine(model, tokenizer, runner: str = "eager", attention: str = "auto", **config):
    "An engine over a loaded Helios model, driven by engine.step() on this thread (no background thread)."
    from helios.config import EngineConfig
    from helios.engine import Engine
    settings = dict(max_batch_size=8, prefill_chunk_size=2048, kv_cache_bytes=kv_bytes(model), kv_offload_bytes=0,
                    enable_prefix_caching=False, kv_watermark=0.0, runner=runner, attention=attention, compile=False)
    return Engine.create(model, tokenizer, frozenset(), EngineConfig(**{**settings, **config}))


def run_engine(engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    "Submit every prompt at once, tick until idle; each one's greedy tokens."
    handles = [engine.submit(p, greedy(max_tokens)) for p in prompts]
    while engine.step(): pass
    return [list(h.result().outputs[0].token_ids) for h in handles]


def describe_engine(engine) -> dict:
    from helios.llm import attention_summary, runner_summary
    return dict(attention=attention_summary(engine), runner=runner_summary(engine))


def token_report(got: list[list[int]], expected: list[list[int]]) -> dict:
    "passed, and for each mismatching prompt the first position where the tokens differ."
    mismatches = {}
    for i, (a, b) in enumerate(zip(got, expected)):
        if a != b: mismatches[i] = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return dict(passed=not mismatches and len(got) == len(expected), mismatching_prompts=mismatches)


def compare_logits(got: torch.Tensor, ref: torch.Tensor) -> dict:
    "How far one logit vector is from a reference."
    got, ref = got.double().cpu(), ref.double().cpu()
    diff = got - ref
    return dict(rel_rms=float(diff.norm() / ref.norm()), max_abs=float(diff.abs().max()),
                ref_std=float(ref.std()), same_argmax=bool(got.argmax() == ref.argmax()))


# ---- transformers, the reference ----
def hf_config(spec: dict):
    from transformers import Qwen3Config
    return Qwen3Config(**QWEN3, **spec, initializer_range=LOGIT_STD / math.sqrt(spec["hidden_size"]))


def build_hf(spec: dict, device: torch.device):
    "A random float32 transformers Qwen3, its weights drawn on the device (seeded)."
    from transformers import Qwen3ForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(hf_config(spec)).to(torch.float32)
    return model.eval()


def write_tokenizer(folder: Path, vocab: int):
    "A word-level tokenizer.json, every id a token `t<id>` (Helios reads the folder's tokenizer; none is downloaded)."
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))


def hf_greedy(model, prompt: list[int], steps: int) -> list[int]:
    "transformers' greedy generate, EOS off, an explicit all-ones mask."
    ids = torch.tensor([prompt], device=model.device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def hf_last_logits(model, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([prompt], device=model.device), logits_to_keep=1).logits[0, -1].float().cpu()


def hf_in_dtype(model, dtype: torch.dtype):
    """A copy of the float32 model with its parameters in dtype and its buffers (RoPE's inverse frequencies) kept in
    float32, as loading a checkpoint in that dtype leaves them; `.to(dtype)` would round the frequencies too."""
    lowp = copy.deepcopy(model)
    for p in lowp.parameters(): p.data = p.data.to(dtype)
    return lowp


def helios_last_logits(model, prompt: list[int]) -> torch.Tensor:
    "Helios's model forward on the whole prompt (no KV pool), the last position's logits."
    device = model.model.embed_tokens.weight.device
    ids = torch.tensor(prompt, device=device)
    with torch.inference_mode():
        logits = model(ids[None], torch.arange(len(prompt), device=device)[None],
                       logits_at=torch.tensor([len(prompt) - 1], device=device))
    return logits[0, -1].float().cpu()


# ---- the parts ----
def part_build(s: Shape) -> dict:
    "Build the random transformers model on the device and save it, with a tokenizer, where Helios reads it."
    t0 = time.perf_counter()
    s.hf = build_hf(s.spec, s.device)
    built = time.perf_counter() - t0
    s.folder = Path(tempfile.mkdtemp(prefix=f"{s.name}-", dir=s.work_dir))
    s.hf.save_pretrained(s.folder)
    write_tokenizer(s.folder, s.vocab)
    weights = s.hf.model.embed_tokens.weight
    return dict(parameters=sum(p.numel() for p in s.hf.parameters()), init_std=round(float(weights.detach().std()), 5),
                build_s=round(built, 2), save_s=round(time.perf_counter() - t0 - built, 2),
                checkpoint_bytes=sum(f.stat().st_size for f in s.folder.glob("*.safetensors")))


def part_greedy_parity(s: Shape, rec: Recorder) -> dict:
    """Helios float32 (eager, through LLM) against transformers float32: the same greedy tokens. If the asked-for
    attention fails in float32 here, that is recorded as a failed check of its own, and the same loaded model is
    checked again with `torch` attention (the float32 checks after this one use it)."""
    s.need("hf", "folder")
    prompts = s.parity_prompts()
    s.ref_tokens = [hf_greedy(s.hf, p, PARITY_TOKENS) for p in prompts]
    s.ref_logits = [hf_last_logits(s.hf, p) for p in prompts]
    llm = open_llm(s, "float32")
    s.fp32, s.tokenizer, engine_info, t0 = llm.model, llm.tokenizer, describe_engine(llm.engine), time.monotonic()
    try:
        got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, greedy(PARITY_TOKENS), use_tqdm=False)]
    except Exception:
        if s.args.attention != "auto": raise
        rec.add(f"{s.name}/float32-attention-auto", "fail", time.monotonic() - t0, dict(engine_info),
                error=traceback.format_exc(limit=4))
        s.attention32 = "torch"
        engine = make_engine(s.fp32, s.tokenizer, attention="torch")
        got, engine_info = run_engine(engine, prompts, PARITY_TOKENS), describe_engine(engine)
        engine.shutdown()
    finally:
        llm.close()
    report = dict(token_report(got, s.ref_tokens), **engine_info, attention_setting=s.attention32,
                  prompt_lengths=list(PARITY_LENGTHS), tokens=PARITY_TOKENS, load_s=round(llm.load_time_s, 2))
    logits = [compare_logits(helios_last_logits(s.fp32, p), r) for p, r in zip(prompts, s.ref_logits)]
    report["last_logits_max_abs_diff"] = max(c["max_abs"] for c in logits)  # for the record: float32 noise
    return report


def open_llm(s: Shape, dtype: str):
    "Helios's LLM over the shape's folder, eager, with a KV pool of KV_TOKENS tokens and no host tier."
    from helios.llm import LLM
    spec, element = s.spec, getattr(torch, dtype).itemsize
    kv = spec["num_hidden_layers"] * 2 * spec["num_key_value_heads"] * spec["head_dim"] * element * KV_TOKENS
    return LLM(s.folder, dtype=dtype, device=s.args.device, runner="eager", compile=False, attention=s.args.attention,
               max_batch_size=8, kv_cache_bytes=kv, kv_offload_bytes=0, quiet=True)


INVARIANCE_CASES = {  # engine settings of each case; every case runs the prompts of Shape.invariance_prompts
    "batch": {}, "chunked": dict(prefill_chunk_size=SMALL_CHUNK), "prefix-cache": dict(enable_prefix_caching=True),
    "cuda-graphs": dict(runner="cuda-graphs"),
}


@contextmanager
def open_engine(s: Shape, model, **config) -> Iterator:
    """make_engine, shut down when the block ends. A CUDA-graph runner off a GPU is refused (it raises): that is
    a Skip ("graphs: not on this device"), not an error."""
    try:
        engine = make_engine(model, s.tokenizer, **config)
    except Exception as e:
        if config.get("runner") == "cuda-graphs" and s.device.type != "cuda":
            raise Skip(f"graphs: not on this device ({type(e).__name__}: {e})") from None
        raise
    try: yield engine
    finally: engine.shutdown()


def part_invariance(s: Shape, case: str) -> dict:
    """Helios float32: each prompt's greedy tokens alone (the reference, made by the `batch` case), against: all in
    one batch; prefill in 64-token chunks; a shared prefix read from the prefix cache (the first prompt sharing it
    runs alone first); decode ticks replayed from CUDA graphs."""
    s.need("fp32", "tokenizer")
    if case != "batch": s.need("alone")
    prompts, num_own = s.invariance_prompts()
    with open_engine(s, s.fp32, attention=s.attention32, **INVARIANCE_CASES[case]) as engine:
        if case == "batch": s.alone = [run_engine(engine, [p], INVARIANCE_TOKENS)[0] for p in prompts]
        if case == "prefix-cache":
            first = run_engine(engine, [prompts[num_own]], INVARIANCE_TOKENS)  # its prefix pages are cached
            rest = run_engine(engine, prompts[:num_own] + prompts[num_own + 1:], INVARIANCE_TOKENS)
            got = rest[:num_own] + first + rest[num_own:]
        else:
            got = run_engine(engine, prompts, INVARIANCE_TOKENS)
        report = dict(token_report(got, s.alone), **describe_engine(engine), prompt_lengths=[len(p) for p in prompts],
                      settings=INVARIANCE_CASES[case])
        if case == "prefix-cache":  # two pages of the shared prefix, for each prompt after the first
            report.update(prefix_hit_tokens=engine.stats().prefix_hit_tokens,
                          expected_at_least=2 * PAGE * (len(prompts) - num_own - 1))
            report["passed"] &= report["prefix_hit_tokens"] >= report["expected_at_least"]
        if case == "cuda-graphs":
            report.update(graph_replays=engine.runner.num_replays, eager_ticks=engine.runner.num_eager)
            report["passed"] &= report["graph_replays"] > 0
    return report


def part_low_precision(s: Shape, dtype_name: str) -> dict:
    """Helios in float16/bfloat16 (loaded by LLM from the float32 checkpoint) against transformers in the same dtype:
    the last position's logits of each parity prompt within LOGIT_TOLERANCE (relative RMS). Also recorded: both
    against float32, and the engine's own first greedy token and top-5 logprobs (through its paged attention)."""
    s.need("hf", "folder", "ref_logits")
    dtype = getattr(torch, dtype_name)
    prompts = s.parity_prompts()
    lowp = hf_in_dtype(s.hf, dtype)
    hf_logits = [hf_last_logits(lowp, p) for p in prompts]
    del lowp
    release_memory()
    llm = open_llm(s, dtype_name)
    try:
        ours = [helios_last_logits(llm.model, p) for p in prompts]
        served = llm.generate(prompts, greedy(1, logprobs=5), use_tqdm=False)
        described = describe_engine(llm.engine)
    finally:
        llm.close()
    vs_hf = [compare_logits(o, h) for o, h in zip(ours, hf_logits)]
    ours_vs_fp32 = [compare_logits(o, r)["rel_rms"] for o, r in zip(ours, s.ref_logits)]
    hf_vs_fp32 = [compare_logits(h, r)["rel_rms"] for h, r in zip(hf_logits, s.ref_logits)]
    engine_steps = []  # the engine's first step, through its paged attention: informational
    for out, h in zip(served, hf_logits):
        step, ref = out.outputs[0].logprobs[0], torch.log_softmax(h.double(), -1)
        engine_steps.append(dict(first_token_is_hf_argmax=out.outputs[0].token_ids[0] == int(h.argmax()),
                                 top5_logprob_max_abs_diff=max(abs(lp - float(ref[t])) for t, lp in step.top)))
    worst = max(c["rel_rms"] for c in vs_hf)
    no_further = all(o <= FP32_RATIO * h + FP32_SLACK for o, h in zip(ours_vs_fp32, hf_vs_fp32))
    if dtype_name == s.args.timing_dtype: s.timing_model = llm.model
    return dict(passed=worst <= LOGIT_TOLERANCE[dtype_name] and no_further,
                tolerance_rel_rms=LOGIT_TOLERANCE[dtype_name], worst_rel_rms_vs_hf=worst,
                no_further_from_fp32_than_hf=no_further, per_prompt_vs_hf=vs_hf, helios_rel_rms_vs_fp32=ours_vs_fp32,
                hf_rel_rms_vs_fp32=hf_vs_fp32, engine_first_step=engine_steps, **described)


def ensure_timing_model(s: Shape):
    "The model in --timing-dtype (the one the logits check loaded, else loaded now), and the folder's tokenizer."
    from helios.tokenizer import load_tokenizer
    from helios.weights import load_model
    s.need("folder")
    if s.timing_model is None:
        s.timing_model = load_model(s.folder, dtype=s.args.timing_dtype, device=s.args.device).model
    if s.tokenizer is None: s.tokenizer = load_tokenizer(s.folder)


def tick_times(engine, device: torch.device, repeats: int) -> list[float]:
    "Seconds of each of `repeats` ticks, the device synchronized around each."
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        engine.step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def timing_summary(times: list[float], tokens: int) -> dict:
    median = statistics.median(times)
    return dict(ms_median=round(median * 1e3, 3), ms_min=round(min(times) * 1e3, 3), ms_max=round(max(times) * 1e3, 3),
                tokens_per_s=round(tokens / median, 1), repeats=len(times))


def part_decode_timing(s: Shape, runner: str, rec: Recorder, tokens_by_batch: dict) -> dict:
    """One decode tick of B rows (after every row's prefill, and warm-up ticks), timed `--repeats` times, at each
    batch size; the tokens of each batch are kept, so that graphs can be compared with eager."""
    ensure_timing_model(s)
    settings = dict(max_batch_size=max(DECODE_BATCHES), prefill_chunk_size=max(DECODE_BATCHES) * DECODE_CONTEXT,
                    attention=s.args.attention)
    with open_engine(s, s.timing_model, runner=runner, **settings) as engine:
        report = decode_times(s, engine, rec, tokens_by_batch)
    if runner == "cuda-graphs":  # informational: bfloat16 need not give bit-equal tokens, but at bucket sizes it should
        report["tokens_match_eager"] = {b: t.get("eager") == t.get(runner) if "eager" in t else None
                                        for b, t in tokens_by_batch.items() if runner in t}
    return report


def decode_times(s: Shape, engine, rec: Recorder, tokens_by_batch: dict) -> dict:
    "part_decode_timing's measurements on one engine."
    runner = engine.config.runner
    report = dict(describe_engine(engine), dtype=s.args.timing_dtype, context=DECODE_CONTEXT, batches={})
    capture = getattr(engine.runner, "capture_report", None)
    if capture:
        report["capture"] = dict(graphs=capture.num_graphs, seconds=round(capture.seconds, 2), bytes=capture.bytes)
    warmup, repeats = s.args.warmup, s.args.repeats
    for batch in DECODE_BATCHES:
        if rec.out_of_time:
            report["batches"][batch] = "skipped: the budget was spent"
            continue
        prompts = random_prompts([DECODE_CONTEXT] * batch, s.vocab, seed=100 + batch)
        handles = [engine.submit(p, greedy(2 + warmup + repeats)) for p in prompts]
        for _ in range(50):  # until every row has prefilled (one tick, with this chunk size)
            running = engine.scheduler.running
            if len(running) == batch and all(seq.output_ids for seq in running): break
            engine.step()
        else:
            raise RuntimeError(f"{batch} rows were not all decoding after 50 ticks")
        tick_times(engine, s.device, warmup)
        replays = getattr(engine.runner, "num_replays", 0)
        times = tick_times(engine, s.device, repeats)
        replays = getattr(engine.runner, "num_replays", 0) - replays  # of the timed ticks: all of them, with graphs
        while engine.step(): pass
        tokens_by_batch.setdefault(batch, {})[runner] = [list(h.result().outputs[0].token_ids) for h in handles]
        report["batches"][batch] = dict(timing_summary(times, batch), graph_replays=replays)
    return report


def part_prefill_timing(s: Shape) -> dict:
    "One tick that prefills a fresh 2,048-token prompt (and samples its first token), eager, timed `--repeats` times."
    ensure_timing_model(s)
    times, ticks = [], []
    with open_engine(s, s.timing_model, max_batch_size=1, prefill_chunk_size=PREFILL_TOKENS,
                     attention=s.args.attention) as engine:
        for i in range(s.args.warmup + s.args.repeats):
            handle = engine.submit(random_prompts([PREFILL_TOKENS], s.vocab, seed=200 + i)[0], greedy(1))
            times += tick_times(engine, s.device, 1)
            more = 0
            while engine.step(): more += 1  # none, when the one tick prefilled the whole prompt
            ticks.append(1 + more)
            handle.result()
        described = describe_engine(engine)
    return dict(timing_summary(times[s.args.warmup:], PREFILL_TOKENS), **described, dtype=s.args.timing_dtype,
                prompt_tokens=PREFILL_TOKENS, ticks_per_prompt=max(ticks))


def check_shape(rec: Recorder, s: Shape):
    "Every part for one shape, in order; the models are freed at the end."
    try:
        rec.run(f"{s.name}/build", part_build, s)
        rec.run(f"{s.name}/float32-greedy-parity", part_greedy_parity, s, rec)
        for case in ("batch", "chunked", "prefix-cache", "cuda-graphs"):
            rec.run(f"{s.name}/invariance-{case}", part_invariance, s, case)
        s.fp32 = None
        release_memory()
        for dtype in ("float16", "bfloat16"):
            rec.run(f"{s.name}/logits-{dtype}", part_low_precision, s, dtype)
        s.hf = None
        release_memory()
        tokens_by_batch: dict = {}
        for runner in ("eager", "cuda-graphs"):
            rec.run(f"{s.name}/decode-{runner}", part_decode_timing, s, runner, rec, tokens_by_batch)
        rec.run(f"{s.name}/prefill-{PREFILL_TOKENS}", part_prefill_timing, s)
    finally:
        s.hf = s.fp32 = s.timing_model = None
        if s.folder is not None and not s.args.keep_checkpoints: shutil.rmtree(s.folder, ignore_errors=True)
        release_memory()


# ---- the machine, the output ----
def git_commit() -> dict:
    def git(*a):
        r = subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None
    try:
        commit = git("rev-parse", "HEAD")
        return dict(commit=commit, dirty=bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None)
    except (OSError, subprocess.SubprocessError):
        return dict(commit=None, dirty=None)


def machine(device: torch.device) -> dict:
    import transformers
    import helios
    info = dict(device=str(device), torch=torch.__version__, cuda=torch.version.cuda,
                transformers=transformers.__version__, helios=helios.__version__, python=platform.python_version(),
                host_cpu=platform.processor() or platform.machine(),
                float32_matmul_precision=torch.get_float32_matmul_precision(),
                tf32_matmul=torch.backends.cuda.matmul.allow_tf32, **git_commit())
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=torch.cuda.get_device_name(device), capability=list(torch.cuda.get_device_capability(device)),
                    memory_bytes=props.total_memory)
    else:
        info.update(name="cpu", capability=None)
    return info


def default_out(device: torch.device, name: str) -> Path:
    "benchmarks/results/gpu-<device>.json on a GPU; on a CPU a temporary folder (a smoke run writes nothing here)."
    if device.type == "cuda": return RESULTS / f"gpu-{slug(name)}.json"
    return Path(tempfile.gettempdir()) / "gpu-cpu-smoke.json"


def summary_table(parts: list[dict]) -> str:
    width = max([len(p["name"]) for p in parts] + [4])
    lines = [f"{'part':<{width}}  {'status':<7}  {'s':>6}  note", "-" * (width + 40)]
    for p in parts:
        lines.append(f"{p['name']:<{width}}  {p['status']:<7}  {p['seconds']:6.1f}  {note(p)}")
    return "\n".join(lines)


def note(part: dict) -> str:
    "The one number or reason worth a glance."
    r, error = part.get("result") or {}, part.get("error")
    if error: return error.strip().splitlines()[-1][:90]
    if "worst_rel_rms_vs_hf" in r: return f"rel RMS {r['worst_rel_rms_vs_hf']:.2e} (tolerance {r['tolerance_rel_rms']})"
    if "batches" in r:
        return ", ".join(f"B={b}: {v['ms_median']:.2f} ms" if isinstance(v, dict) else f"B={b}: skipped"
                         for b, v in r["batches"].items())
    if "ms_median" in r: return f"{r['ms_median']:.2f} ms, {r['tokens_per_s']:,.0f} tok/s"
    if r.get("mismatching_prompts"): return f"first differing token by prompt: {r['mismatching_prompts']}"
    if "prefix_hit_tokens" in r: return f"same tokens; prefix hit tokens {r['prefix_hit_tokens']}"
    if "graph_replays" in r: return f"same tokens; {r['graph_replays']} graph replays"
    if "mismatching_prompts" in r: return f"same tokens, {len(r['prompt_lengths'])} prompts"
    if "parameters" in r: return f"{r['parameters']:,} parameters"
    return ""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shapes", choices=("real", "tiny"), default="real",
                   help="Qwen3-0.6B and -4B, or two tiny Qwen3s (a smoke run)")
    p.add_argument("--only", nargs="*", help="shape names to run (default: all of --shapes)")
    p.add_argument("--budget-s", type=float, default=420.0, help="parts not started by then are skipped")
    p.add_argument("--out", type=Path, help="the JSON file (default: benchmarks/results/gpu-<device>.json on a GPU)")
    p.add_argument("--attention", default="auto", help="Helios's attention backend (auto, or a registered name)")
    p.add_argument("--timing-dtype", default="bfloat16", choices=("float16", "bfloat16", "float32"))
    p.add_argument("--repeats", type=int, help="timed ticks per measurement (default 10 on a GPU, 3 on a CPU)")
    p.add_argument("--warmup", type=int, help="untimed ticks first (default 3 on a GPU, 1 on a CPU)")
    p.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()), help="where checkpoints are written")
    p.add_argument("--keep-checkpoints", action="store_true")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (a CPU smoke run on a busy machine: 1)")
    args = p.parse_args(argv)
    cuda = torch.device(args.device).type == "cuda"
    args.repeats = args.repeats or (10 if cuda else 3)
    args.warmup = args.warmup if args.warmup is not None else (3 if cuda else 1)
    return args


def write_report(out: Path, rec: Recorder, info: dict, args: argparse.Namespace, shapes: dict):
    "The JSON of everything so far."
    device = torch.device(args.device)
    if device.type == "cuda": info["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    report = dict(script="scripts/gpu_check.py", machine=info, shapes=shapes,
                  args={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                  settings=dict(logit_std=LOGIT_STD, logit_tolerance_rel_rms=LOGIT_TOLERANCE, fp32_ratio=FP32_RATIO,
                                fp32_slack=FP32_SLACK, parity_lengths=PARITY_LENGTHS, parity_tokens=PARITY_TOKENS,
                                invariance_tokens=INVARIANCE_TOKENS, small_chunk=SMALL_CHUNK, page_size=PAGE,
                                decode_batches=DECODE_BATCHES, decode_context=DECODE_CONTEXT,
                                prefill_tokens=PREFILL_TOKENS, kv_tokens=KV_TOKENS),
                  parts=rec.parts, counts=rec.counts(), total_s=round(rec.elapsed, 2))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but CUDA is not available")
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if args.threads: torch.set_num_threads(args.threads)
    rec, info = Recorder(args.budget_s), machine(device)
    shapes = TINY_SHAPES if args.shapes == "tiny" else REAL_SHAPES
    shapes = {k: v for k, v in shapes.items() if not args.only or k in args.only}
    out = args.out or default_out(device, info["name"])
    rec.save = lambda: write_report(out, rec, info, args, shapes)
    print(f"gpu_check: {info['name']} ({info['device']}), torch {info['torch']}, transformers {info['transformers']}, "
          f"budget {args.budget_s:.0f} s, writing {out}", flush=True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    for name, spec in shapes.items():
        try:
            check_shape(rec, Shape(name, spec, args, args.work_dir))
        except Exception:  # outside any part (freeing memory, say): recorded, and the next shape still runs
            rec.add(f"{name}/cleanup", "error", error=traceback.format_exc(limit=6))
    rec.save()
    counts = rec.counts()
    print("\n" + summary_table(rec.parts))
    print(f"\n{counts['pass']} passed, {counts['fail']} failed, {counts['error']} errors, {counts['ok']} measured, "
          f"{counts['skipped']} skipped in {rec.elapsed:.1f} s; wrote {out}", flush=True)
    return 1 if counts["fail"] or counts["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
