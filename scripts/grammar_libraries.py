"""Compare grammar libraries for constrained decoding on the default model's tokenizer.

For llguidance, xgrammar and outlines-core: the time to prepare the tokenizer, to compile each of a few
JSON schemas, and to compute the token mask at every step along a valid JSON text (median and p95),
plus what each one needs installed. Writes benchmarks/results/grammar_libraries-<cpu>.json and .md.

    python scripts/grammar_libraries.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import platform
import re
import statistics
import subprocess
import time
from pathlib import Path

import torch

from helios.tokenizer import Tokenizer, load_tokenizer
from helios.weights import default_model_path

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "fma")

SCHEMAS = {  # each with one valid instance: the text whose tokens the masks are timed along
    "nested objects": ({
        "type": "object", "additionalProperties": False, "required": ["name", "address", "tags"],
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"],
                        "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4}}},
        {"name": "Ada Lovelace", "address": {"city": "London", "zip": "12345"}, "tags": ["math", "engines"]}),
    "enums": ({
        "type": "object", "additionalProperties": False, "required": ["color", "size", "in_stock"],
        "properties": {"color": {"enum": ["red", "green", "blue", "ultraviolet"]},
                       "size": {"type": "string", "enum": ["S", "M", "L", "XL"]}, "in_stock": {"type": "boolean"}}},
        {"color": "ultraviolet", "size": "XL", "in_stock": True}),
    "bounded arrays": ({
        "type": "object", "additionalProperties": False, "required": ["scores", "matrix"],
        "properties": {"scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100},
                                  "minItems": 2, "maxItems": 5},
                       "matrix": {"type": "array", "maxItems": 3,
                                  "items": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}}}},
        {"scores": [97, 3, 55], "matrix": [[1.5, -2.0], [0.25, 8]]}),
    "order (wide)": ({
        "type": "object", "additionalProperties": False, "required": ["id", "customer", "items", "status"],
        "properties": {
            "id": {"type": "integer", "minimum": 1},
            "customer": {"type": "object", "additionalProperties": False, "required": ["name", "email"],
                         "properties": {"name": {"type": "string", "maxLength": 60}, "email": {"type": "string"},
                                        "vip": {"type": "boolean"}}},
            "items": {"type": "array", "minItems": 1, "maxItems": 8, "items": {
                "type": "object", "additionalProperties": False, "required": ["sku", "qty"],
                "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                               "qty": {"type": "integer", "minimum": 1, "maximum": 99}, "note": {"type": "string"}}}},
            "status": {"enum": ["new", "paid", "shipped", "cancelled"]}}},
        {"id": 4021, "customer": {"name": "Grace Hopper", "email": "grace@example.com", "vip": True},
         "items": [{"sku": "ABC-1234", "qty": 2}, {"sku": "XYZ-0001", "qty": 1, "note": "gift wrap"}],
         "status": "paid"}),
}


def compact(value) -> str: return json.dumps(value, separators=(",", ":"))


def timed(fn, *args):
    "(result, seconds) of fn(*args)."
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Llguidance:
    name, package = "llguidance", "llguidance"

    def prepare(self, tok: Tokenizer, vocab_size: int):
        import llguidance
        self.ll = llguidance
        self.tokenizer = llguidance.LLTokenizer(tok.backend.to_str(), n_vocab=vocab_size, eos_token=sorted(tok.eos_token_ids))

    def compile(self, schema: dict):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema, overrides={"whitespace_flexible": False})
        matcher = self.ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def steps(self, matcher, tokens: list[int], mask: torch.Tensor) -> list[float]:
        times = []
        for t in tokens:
            _, s = timed(matcher.unsafe_compute_mask_ptr, mask.data_ptr(), mask.numel() * 4)
            times.append(s)
            assert matcher.consume_token(t), matcher.get_error()
        return times


class Xgrammar:
    name, package = "xgrammar", "xgrammar"

    def prepare(self, tok: Tokenizer, vocab_size: int):
        import xgrammar
        from transformers import PreTrainedTokenizerFast
        self.xg = xgrammar
        hf = PreTrainedTokenizerFast(tokenizer_object=tok.backend, eos_token=tok.eos_token)
        info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=sorted(tok.eos_token_ids))
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)

    def compile(self, schema: dict):
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
        return self.xg.GrammarMatcher(compiled)

    def steps(self, matcher, tokens: list[int], mask: torch.Tensor) -> list[float]:
        times = []
        for t in tokens:
            _, s = timed(matcher.fill_next_token_bitmask, mask[None])
            times.append(s)
            assert matcher.accept_token(t)
        return times


class OutlinesCore:
    name, package = "outlines-core", "outlines_core"

    def prepare(self, tok: Tokenizer, vocab_size: int):
        import outlines_core
        self.oc = outlines_core
        byte_of = {c: b for b, c in _gpt2_bytes_to_chars().items()}  # byte-level BPE tokens spell bytes with chars
        eos = min(tok.eos_token_ids)
        vocab: dict[bytes, list[int]] = {}
        for text, i in tok.backend.get_vocab(with_added_tokens=False).items():
            if i == eos: continue
            vocab.setdefault(bytes(byte_of[c] for c in text) if all(c in byte_of for c in text) else text.encode(), []).append(i)
        self.vocabulary = outlines_core.Vocabulary(eos, vocab)

    def compile(self, schema: dict):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema), whitespace_pattern="")
        return self.oc.Guide(self.oc.Index(regex, self.vocabulary))

    def steps(self, guide, tokens: list[int], mask: torch.Tensor) -> list[float]:
        times = []
        for t in tokens:
            _, s = timed(guide.write_mask_into, mask.data_ptr(), mask.numel(), 4)
            times.append(s)
            guide.advance(t)
        return times


def _gpt2_bytes_to_chars() -> dict[int, str]:
    "GPT-2's byte-level alphabet: each byte as the printable character byte-level BPE spells it with."
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars: chars[b], extra = chr(256 + extra), extra + 1
    return chars


def footprint(package: str) -> dict:
    "What installing the package brings: its declared requirements and the on-disk size of it and them."
    def size_mb(dist) -> float:
        return sum((f.size or 0) for f in dist.files or []) / 2**20
    dist = metadata.distribution(package)
    requires = sorted({re.split(r"[ ;<>=!~\[]", r)[0] for r in (dist.requires or []) if "extra ==" not in r})
    seen, total = set(), 0.0
    todo = [package]
    while todo:  # the requirement closure, as installed here
        name = todo.pop()
        try: d = metadata.distribution(name)
        except metadata.PackageNotFoundError: continue
        key = d.metadata["Name"].lower().replace("_", "-")
        if key in seen: continue
        seen.add(key)
        total += size_mb(d)
        todo += [re.split(r"[ ;<>=!~\[]", r)[0] for r in (d.requires or []) if "extra ==" not in r]
    return dict(version=dist.version, requires=requires, own_mb=round(size_mb(dist), 1),
                with_dependencies_mb=round(total, 1), num_packages=len(seen))


def machine() -> dict:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    field = lambda key: next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith(key)), "")
    flags = field("Flags").split()
    return dict(cpu=field("Model name"), cores=torch.get_num_threads(), flags=[f for f in FLAGS_OF_INTEREST if f in flags],
                python=platform.python_version(), torch=torch.__version__)


def uptime() -> str: return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def measure(lib, tok: Tokenizer, vocab_size: int, repeats: int) -> dict:
    _, prepare_s = timed(lib.prepare, tok, vocab_size)
    mask = torch.full(((vocab_size + 31) // 32,), -1, dtype=torch.int32)
    schemas = {}
    for name, (schema, instance) in SCHEMAS.items():
        tokens = tok.encode(compact(instance), add_special_tokens=False)
        compiles, steps = [], []
        for _ in range(repeats):
            matcher, seconds = timed(lib.compile, schema)
            compiles.append(seconds)
            steps += lib.steps(matcher, tokens, mask)
        schemas[name] = dict(tokens=len(tokens), compile_ms=round(1e3 * min(compiles), 2),
                             mask_median_us=round(1e6 * statistics.median(steps), 1),
                             mask_p95_us=round(1e6 * percentile(steps, 0.95), 1))
    return dict(prepare_s=round(prepare_s, 3), schemas=schemas, install=footprint(lib.package))


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# Grammar libraries on {m['cpu']}", "",
             f"{m['cores']} torch threads, flags {', '.join(m['flags']) or 'none of interest'}; "
             f"load before: `{result['uptime_before']}`, after: `{result['uptime_after']}`.",
             f"Tokenizer: {result['tokenizer']} ({result['vocab_size']:,} tokens); best of {result['repeats']} compiles, "
             "masks over every step of all repeats.", "",
             "| library | version | tokenizer prep (s) | schema | tokens | compile (ms) | mask median (µs) | mask p95 (µs) |",
             "|---|---|---:|---|---:|---:|---:|---:|"]
    for name, lib in result["libraries"].items():
        for schema, s in lib["schemas"].items():
            lines.append(f"| {name} | {lib['install']['version']} | {lib['prepare_s']} | {schema} | {s['tokens']} | "
                         f"{s['compile_ms']} | {s['mask_median_us']} | {s['mask_p95_us']} |")
    lines += ["", "| library | requires | own size (MiB) | with dependencies (MiB) | packages |", "|---|---|---:|---:|---:|"]
    for name, lib in result["libraries"].items():
        i = lib["install"]
        lines.append(f"| {name} | {', '.join(i['requires']) or '(nothing)'} | {i['own_mb']} | {i['with_dependencies_mb']} | {i['num_packages']} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = default_model_path()
    tok = load_tokenizer(path)
    before = uptime()
    libraries = {lib.name: measure(lib, tok, tok.vocab_size, args.repeats) for lib in (Llguidance(), Xgrammar(), OutlinesCore())}
    result = dict(machine=machine(), uptime_before=before, uptime_after=uptime(), tokenizer=path.name,
                  vocab_size=tok.vocab_size, repeats=args.repeats, libraries=libraries)
    slug = re.sub(r"[^a-z0-9]+", "-", result["machine"]["cpu"].lower()).strip("-")[:40] or "cpu"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"grammar_libraries-{slug}.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / f"grammar_libraries-{slug}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
