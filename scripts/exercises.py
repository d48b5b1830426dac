"""Insert a "Your turn" section of exercises into each core chapter (00 to 13 without a letter).

    python scripts/exercises.py nbs           # insert or refresh the sections (a second run changes nothing)
    python scripts/exercises.py nbs --check   # change nothing; exit 1 where a chapter's section is missing or stale

Each exercise is five cells: the task (markdown), its check function (code, run by nbdev-test), the
reader's cell (a stub flagged `#| notest`, so nbdev-test and the docs build skip it, that ends by calling
the check), "One answer" (markdown), and one answer followed by the same check (code, run by
nbdev-test, so CI proves that the check passes a correct answer). The section goes just before the
chapter's `## Where this goes next` cell, or at the end when it has none. The check functions and the
answers are the functions below, copied into the notebooks as source; tests/unit/test_exercises.py runs
each check on its answer, on the engine's own implementation, and on a wrong one that it must reject.
Checks and answers use only the package's public API, so they hold however a chapter's cells move.
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import sys
import textwrap
from pathlib import Path
from typing import Callable, NamedTuple

HEADING = "## Your turn"
WHERE_NEXT = "## Where this goes next"
INTRO = ("Small tasks on this chapter's idea. Each has a check: fill in the cell marked `#| notest` (nbdev-test "
         "skips it, so the stub cannot fail CI) and run it; the check says what is wrong. One answer follows, "
         "checked the same way.")


class Exercise(NamedTuple):
    chapter: str                  # the core chapter's number: "07"
    title: str
    task: str                     # markdown
    stub: str                     # the reader's cell, without its `#| notest` line and the call of the check
    check: Callable               # copied into the notebook as source; raises AssertionError on a wrong answer
    answer: Callable              # one answer, copied likewise

    @property
    def name(self) -> str:
        "The name the reader defines (the answer's)."
        return self.answer.__name__


# ---- 00 config ----

def check_kv_bytes_per_token(fn):
    "fn(cfg, dtype_bytes) against ModelConfig.kv_bytes_per_token, with and without grouped KV heads."
    from helios.config import tiny_llama, tiny_qwen3
    for cfg in (tiny_qwen3(), tiny_llama(), tiny_qwen3(num_kv_heads=1), tiny_qwen3(num_layers=5, head_dim=16)):
        for dtype_bytes in (2, 4):
            got, want = fn(cfg, dtype_bytes), cfg.kv_bytes_per_token(dtype_bytes)
            assert got == want, (f"{cfg.num_layers} layers, {cfg.num_kv_heads} KV heads of {cfg.head_dim}, "
                                 f"{dtype_bytes} bytes each: got {got}, expected {want}")
    print("kv_bytes_per_token: correct")


def kv_bytes_per_token(cfg, dtype_bytes):
    return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * dtype_bytes  # a key and a value per KV head


# ---- 01 layers ----

def check_rms_norm(fn):
    "fn(x, weight, eps) against helios's RMSNorm module, on random rows and on a row of zeros."
    import torch
    from helios.model.layers import RMSNorm
    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-6)
    with torch.no_grad(): norm.weight.copy_(torch.randn(16))
    x = torch.cat([torch.randn(3, 16) * 5, torch.zeros(1, 16)])  # [4, 16]
    got = fn(x, norm.weight.detach(), 1e-6)
    assert got.shape == x.shape, f"shape {tuple(got.shape)}, expected {tuple(x.shape)}"
    torch.testing.assert_close(got, norm(x).detach())
    print("rms_norm: correct")


def rms_norm(x, weight, eps):
    # x: [..., dim]; divide by the root mean square of the last dimension, then scale
    return weight * x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt()


# ---- 02 attention ----

def check_chunk_mask(fn):
    "fn(num_queries, num_keys) against helios's causal_mask, for chunks that start at and after position 0."
    from helios.model.attention import causal_mask
    for num_queries, num_keys in ((1, 1), (3, 3), (1, 6), (3, 7), (4, 9)):
        got, want = fn(num_queries, num_keys), causal_mask(num_queries, num_keys)
        assert got.dtype == want.dtype and got.shape == want.shape, f"{got.dtype} {tuple(got.shape)}: expected bool [T, S]"
        assert bool((got == want).all()), f"{num_queries} queries over {num_keys} keys:\n{got.int()}\nexpected\n{want.int()}"
    print("chunk_mask: correct")


def chunk_mask(num_queries, num_keys):
    import torch
    q_pos = torch.arange(num_queries)[:, None] + (num_keys - num_queries)  # [T, 1] positions of the queries
    return torch.arange(num_keys)[None, :] <= q_pos                         # [T, S]


# ---- 03 model ----

def check_count_parameters(fn):
    "fn(cfg) against the parameters a CausalLM built from cfg holds (a tied LM head counted once)."
    from helios.config import tiny_llama, tiny_qwen3
    from helios.model.qwen3 import CausalLM
    for cfg in (tiny_qwen3(), tiny_qwen3(tie_word_embeddings=False), tiny_llama(), tiny_llama(num_layers=3)):
        got, want = fn(cfg), sum(p.numel() for p in CausalLM(cfg).parameters())
        assert got == want, (f"{cfg.architecture}, {cfg.num_layers} layers, tied={cfg.tie_word_embeddings}, "
                             f"qk_norm={cfg.qk_norm}: got {got:,}, expected {want:,}")
    print("count_parameters: correct")


def count_parameters(cfg):
    H, V = cfg.hidden_size, cfg.vocab_size
    attention = H * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * H   # q, k, v and o projections
    attention += 2 * cfg.head_dim if cfg.qk_norm else 0                # RMSNorm of each q and k head
    mlp = 3 * H * cfg.intermediate_size                                # gate, up, down
    layer = attention + mlp + 2 * H                                    # and its two RMSNorms
    head = 0 if cfg.tie_word_embeddings else V * H
    return V * H + cfg.num_layers * layer + H + head                   # embedding, layers, final norm, LM head


# ---- 04 weights ----

def check_dequantize_q8_0(fn):
    "fn(raw) against helios's dequantize_tensor, on a matrix quantized to Q8_0 by the gguf package."
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize
    from helios.formats.gguf import GGUFTensor, dequantize_tensor
    x = np.random.default_rng(0).standard_normal((4, 96)).astype(np.float32)
    raw = quantize(x, GGMLQuantizationType.Q8_0)  # [4, 3 blocks * 34 bytes], uint8
    want = dequantize_tensor(GGUFTensor("w", x.shape, GGMLQuantizationType.Q8_0, raw))
    got = fn(raw)
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    assert np.allclose(got, want), f"largest difference {np.abs(got - want).max():.4f}"
    print("dequantize_q8_0: correct")


def dequantize_q8_0(raw):
    import numpy as np
    blocks = raw.reshape(raw.shape[0], -1, 34)                          # [rows, blocks, 2 + 32] bytes
    scale = blocks[..., :2].copy().view(np.float16).astype(np.float32)  # [rows, blocks, 1]
    values = blocks[..., 2:].view(np.int8).astype(np.float32)           # [rows, blocks, 32]
    return (scale * values).reshape(raw.shape[0], -1)                   # [rows, cols]


# ---- 05 tokenizer ----

def check_text_deltas(fn):
    "fn(decode, ids) against helios's IncrementalDetokenizer, on byte tokens that split characters."
    from helios.tokenizer import IncrementalDetokenizer

    class Bytes:  # one token per UTF-8 byte: é, 🌍 and 日 take two, four and three tokens
        def decode(self, ids, skip_special_tokens=True): return bytes(ids).decode("utf-8", errors="replace")

    for text in ("hello", "héllo wörld", "naïve 🌍!", "日本語"):
        ids = list(text.encode())
        detok = IncrementalDetokenizer(Bytes())
        want = [detok.push(i) for i in ids]
        got = fn(Bytes().decode, ids)
        assert got == want, f"{text!r}: got {got}, expected {want}"
    print("text_deltas: correct")


def text_deltas(decode, ids):
    deltas, shown = [], ""
    for n in range(1, len(ids) + 1):
        text = decode(ids[:n])
        if text.endswith("\ufffd"):  # an incomplete character: hold it back
            deltas.append("")
            continue
        deltas.append(text[len(shown):])
        shown = text
    return deltas


# ---- 06 KV cache ----

def check_generate_with_cache(fn):
    "fn(model, prompt_ids, max_new_tokens) against generation that recomputes everything, on a tiny Qwen3."
    import torch
    from helios.config import tiny_qwen3
    from helios.model.qwen3 import CausalLM
    from helios.reference import generate_without_cache
    torch.manual_seed(0)
    model = CausalLM(tiny_qwen3(tie_word_embeddings=False)).eval()  # random and tied, it only repeats its input
    for prompt in ([1, 2, 3], [5], list(range(10, 30))):
        got, want = fn(model, prompt, 8), generate_without_cache(model, prompt, 8)
        assert got == want, f"prompt {prompt}: got {got}, expected {want}"
    print("generate_with_cache: correct")


def generate_with_cache(model, prompt_ids, max_new_tokens):
    import torch
    from helios.reference import KVCache, decode_one_token, prefill
    cache = KVCache(model.config, 1, len(prompt_ids) + max_new_tokens)
    out = []
    with torch.inference_mode():
        logits = prefill(model, cache, torch.tensor([prompt_ids]))  # [1, vocab]
        while True:
            out.append(int(logits[0].argmax()))
            if len(out) == max_new_tokens: return out
            logits = decode_one_token(model, cache, torch.tensor(out[-1:]))


# ---- 07 sampling ----

def check_top_k_filter(fn):
    "fn(logits, k) keeps each row's k largest logits as they are and sets the others to -inf."
    import torch
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3  # [rows, vocab]
    for k in (1, 5, 50):
        got = fn(logits.clone(), k)
        assert got.shape == logits.shape, f"shape {tuple(got.shape)}, expected {tuple(logits.shape)}"
        kept = torch.isfinite(got)
        assert (kept.sum(-1) == k).all(), f"k={k}: kept {kept.sum(-1).tolist()} tokens per row"
        top = torch.zeros_like(kept).scatter_(-1, logits.topk(k).indices, True)
        assert bool((kept == top).all()), f"k={k}: kept tokens that are not among the k most likely"
        assert bool((got[kept] == logits[kept]).all()) and bool((got[~kept] == float("-inf")).all()), \
            "kept logits must stay as they were, the others become -inf"
    print("top_k_filter: correct")


def top_k_filter(logits, k):
    kth = logits.topk(k, dim=-1).values[:, -1:]  # [rows, 1]: each row's k-th largest
    return logits.masked_fill(logits < kth, float("-inf"))


# ---- 08 paged pool ----

def check_pages_for(fn):
    "fn(seq_lens, page_size) against the sum of helios's pages_needed."
    from helios.kv.pages import pages_needed
    for lens, page_size in (([1], 16), ([16], 16), ([17], 16), ([0, 1, 15, 16, 17, 33], 16), ([769, 256], 256)):
        got, want = fn(lens, page_size), sum(pages_needed(n, page_size) for n in lens)
        assert got == want, f"sequences of {lens} tokens in pages of {page_size}: got {got}, expected {want}"
    print("pages_for: correct")


def pages_for(seq_lens, page_size):
    return sum(-(-n // page_size) for n in seq_lens)  # each sequence rounds up to whole pages


def check_slot_of(fn):
    "fn(page_table, position, page_size) against helios's slot_mapping."
    import torch
    from helios.kv.pages import slot_mapping
    page_table = [5, 2, 9]
    for position in range(12):
        want = int(slot_mapping(torch.tensor(page_table), torch.tensor([position]), 4)[0])
        got = fn(page_table, position, 4)
        assert got == want, f"position {position} with page table {page_table}, pages of 4: got {got}, expected {want}"
    print("slot_of: correct")


def slot_of(page_table, position, page_size):
    return page_table[position // page_size] * page_size + position % page_size


# ---- 09 prefix cache ----

def check_block_hashes(fn):
    "fn(token_ids, page_size) against helios's prompt_block_hashes."
    from helios.kv.prefix_cache import prompt_block_hashes
    for ids, page_size in ((list(range(8)), 4), ([1, 2, 3, 4] * 3 + [5], 4), ([7, 7], 4), (list(range(40)), 16)):
        got, want = fn(ids, page_size), prompt_block_hashes(ids, page_size)
        assert len(got) == len(want), f"{len(ids)} tokens in pages of {page_size}: {len(got)} hashes, expected {len(want)}"
        assert got == want, f"{len(ids)} tokens in pages of {page_size}: the hashes differ from block {[g == w for g, w in zip(got, want)].index(False)}"
    print("block_hashes: correct")


def block_hashes(token_ids, page_size):
    from helios.kv.prefix_cache import ROOT_HASH, hash_block
    hashes, parent = [], ROOT_HASH
    for start in range(0, len(token_ids) - page_size + 1, page_size):  # full pages only
        parent = hash_block(parent, token_ids[start:start + page_size])  # chained: a hash names its whole prefix
        hashes.append(parent)
    return hashes


# ---- 10 scheduler ----

def check_tick_plans(fn):
    "fn() is three ticks' plans, each [(request, tokens), ...] in plan order; compared with the Scheduler's own."
    from helios.config import EngineConfig
    from helios.kv.manager import PageManager
    from helios.scheduler import Scheduler, Sequence
    cfg = EngineConfig(max_batch_size=2, prefill_chunk_size=8, page_size=4, max_queue=4)
    s = Scheduler(cfg, PageManager(16, 4, None), max_model_len=64)
    seqs = {name: Sequence(i, name, list(range(n)), 4, 0.0, page_size=4) for i, (name, n) in enumerate((("a", 10), ("b", 5), ("c", 3)))}
    s.add(list(seqs.values()))
    names, want = {id(q): name for name, q in seqs.items()}, []
    for tick in range(3):
        plan = s.schedule(0.001 * tick)
        want.append([(names[id(c.seq)], c.num_tokens) for c in plan.chunks])
        s.on_computed(plan, 0.001 * tick)
        for c in plan.chunks:
            if c.samples: c.seq.output_ids.append(7)
    got = [list(map(tuple, tick)) for tick in fn()]
    for tick, (g, w) in enumerate(zip(got + [None] * 3, want), 1):
        assert g == w, f"tick {tick}: you planned {g}, the scheduler plans {w}"
    print("tick_plans: correct")


def tick_plans():
    return [
        [("b", 5), ("a", 3)],  # a and b admitted (two at most); b has fewer tokens left, a gets the rest of 8
        [("b", 1), ("a", 7)],  # b decodes first; a's last 7 prompt tokens fill the budget
        [("a", 1), ("b", 1)],  # both decode, in the order they run; c still waits for a free place
    ]


# ---- 11 engine ----

def check_tpot_s(fn):
    "fn(metrics) against RequestMetrics.decode_tokens_per_s: the mean seconds per output token after the first."
    from helios.outputs import RequestMetrics
    cases = [RequestMetrics(0.0, 5, 0.1, 0.3, 1.3, num_output_tokens=11),                    # 10 tokens in 1 s
             RequestMetrics(0.0, 5, 0.1, 0.5, 2.5, num_output_tokens=9, num_completions=2),  # 7 in 2 s
             RequestMetrics(0.0, 5, 0.1, 0.3, 0.3, num_output_tokens=1)]                     # nothing decoded
    for m in cases:
        want = None if m.decode_tokens_per_s is None else 1 / m.decode_tokens_per_s
        got = fn(m)
        assert (got is None) == (want is None) and (want is None or abs(got - want) < 1e-9), \
            f"{m.num_output_tokens} tokens, {m.num_completions} completion(s), decode {m.decode_s:.1f} s: got {got}, expected {want}"
    print("tpot_s: correct")


def tpot_s(metrics):
    decoded = metrics.num_output_tokens - metrics.num_completions  # each completion's first token is not decoded
    return metrics.decode_s / decoded if decoded > 0 else None


# ---- 12 LLM ----

def check_answer_all(fn, llm=None):
    "fn(llm, prompts, max_tokens) gives the greedy text of each prompt, as llm.generate gives it for the prompt alone."
    from helios import LLM, SamplingParams
    if llm is None:  # the default model, on an engine of its own
        with LLM(quiet=True) as own: return check_answer_all(fn, own)
    prompts, max_tokens = ["The capital of France is", "1, 2, 3,", "def fib(n):"], 6
    want = [llm.generate(p, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)[0].text for p in prompts]
    got = fn(llm, prompts, max_tokens)
    assert got == want, f"got {got}, expected {want}"
    print("answer_all: correct")


def answer_all(llm, prompts, max_tokens):
    from helios import SamplingParams
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    return [o.text for o in outputs]  # one output per prompt, in order


# ---- 13 server ----

def check_sse_text(fn):
    "fn(lines) joins the content deltas of a chat completion's SSE stream, as OpenAI's server sends it."
    import json

    def event(delta, finish=None):
        chunk = {"id": "c1", "object": "chat.completion.chunk", "model": "m",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(chunk)}"

    usage = json.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": [], "usage": {"total_tokens": 9}})
    lines = [event({"role": "assistant", "content": ""}), "", event({"content": "Hel"}), "", ": a comment", "",
             event({"content": "lo, "}), "", event({"content": "world"}), "", event({}, "stop"), "",
             f"data: {usage}", "", "data: [DONE]", ""]
    got = fn(lines)
    assert got == "Hello, world", f"got {got!r}, expected 'Hello, world'"
    print("sse_text: correct")


def sse_text(lines):
    import json
    text = ""
    for line in lines:
        if not line.startswith("data: "): continue  # blank lines end events; ':' lines are comments
        data = line[len("data: "):]
        if data == "[DONE]": break
        for choice in json.loads(data)["choices"]:  # the last chunk, with the usage, has none
            text += choice["delta"].get("content") or ""
    return text


EXERCISES = (
    Exercise("00", "KV bytes per token",
             "How much memory does one token cost? Write `kv_bytes_per_token(cfg, dtype_bytes)`: the bytes the KV cache "
             "keeps for one token across all layers of a model with grouped-query attention (every layer stores a key "
             "and a value vector for each KV head).",
             "def kv_bytes_per_token(cfg, dtype_bytes):\n    raise NotImplementedError  # your code here",
             check_kv_bytes_per_token, kv_bytes_per_token),
    Exercise("01", "RMSNorm by hand",
             "Write `rms_norm(x, weight, eps)` for `x: [..., dim]`, without the module: divide each vector by the root "
             "mean square of its entries (with `eps` inside the root), then multiply by `weight`.",
             "def rms_norm(x, weight, eps):\n    raise NotImplementedError  # your code here",
             check_rms_norm, rms_norm),
    Exercise("02", "The mask of a chunk",
             "A chunk of `num_queries` tokens comes after `num_keys - num_queries` tokens already in the cache. Write "
             "`chunk_mask(num_queries, num_keys)`: a `[num_queries, num_keys]` bool tensor, True where a query may "
             "attend a key (the key's position is not after the query's).",
             "def chunk_mask(num_queries, num_keys):\n    raise NotImplementedError  # your code here",
             check_chunk_mask, chunk_mask),
    Exercise("03", "Counting the parameters",
             "Write `count_parameters(cfg)` from the config alone: the embedding, each layer's attention projections "
             "(and its q/k norms when `cfg.qk_norm`), its MLP and its two norms, the final norm, and an LM head "
             "unless it is tied to the embedding.",
             "def count_parameters(cfg):\n    raise NotImplementedError  # your code here",
             check_count_parameters, count_parameters),
    Exercise("04", "Reading Q8_0 blocks",
             "A GGUF tensor in `Q8_0` stores each row as blocks of 34 bytes: a float16 scale, then 32 signed 8-bit "
             "integers; a weight is its integer times its block's scale. Write `dequantize_q8_0(raw)`: from the "
             "`[rows, row_bytes]` uint8 array to the `[rows, cols]` float32 weights (NumPy's `.view` helps).",
             "def dequantize_q8_0(raw):\n    raise NotImplementedError  # your code here",
             check_dequantize_q8_0, dequantize_q8_0),
    Exercise("05", "Text deltas",
             "One character may take several tokens. Write `text_deltas(decode, ids)`: for each id in turn, the new "
             "text it completes, or `\"\"` while the decoded text ends in an incomplete character (U+FFFD). "
             "`decode(ids)` turns a list of ids into text.",
             "def text_deltas(decode, ids):\n    raise NotImplementedError  # your code here",
             check_text_deltas, text_deltas),
    Exercise("06", "Generation with the cache",
             "Write `generate_with_cache(model, prompt_ids, max_new_tokens)`, greedy, with `KVCache`, `prefill` and "
             "`decode_one_token` from `helios.reference`: it must give the same tokens as recomputing the whole "
             "sequence at every step.",
             "def generate_with_cache(model, prompt_ids, max_new_tokens):\n    raise NotImplementedError  # your code here",
             check_generate_with_cache, generate_with_cache),
    Exercise("07", "Top-k filtering",
             "Write `top_k_filter(logits, k)` for `logits: [rows, vocab]`: keep each row's k largest logits as they "
             "are and set every other one to `-inf`, so softmax gives them no probability.",
             "def top_k_filter(logits, k):\n    raise NotImplementedError  # your code here",
             check_top_k_filter, top_k_filter),
    Exercise("08", "Pages for a batch",
             "Write `pages_for(seq_lens, page_size)`: how many pages sequences of these lengths (in tokens) hold "
             "together, when no two sequences share a page.",
             "def pages_for(seq_lens, page_size):\n    raise NotImplementedError  # your code here",
             check_pages_for, pages_for),
    Exercise("08", "A token's slot",
             "Write `slot_of(page_table, position, page_size)`: the slot of the pool (page number times page size, "
             "plus the offset in the page) where the token at `position` of a sequence lives.",
             "def slot_of(page_table, position, page_size):\n    raise NotImplementedError  # your code here",
             check_slot_of, slot_of),
    Exercise("09", "Chained block hashes",
             "Write `block_hashes(token_ids, page_size)` with `hash_block` and `ROOT_HASH` from "
             "`helios.kv.prefix_cache`: one hash per full page, each chained on the hash of the page before it (the "
             "first on `ROOT_HASH`); a partial last page has none.",
             "def block_hashes(token_ids, page_size):\n    raise NotImplementedError  # your code here",
             check_block_hashes, block_hashes),
    Exercise("10", "A tick's plan, by hand",
             "Plan three ticks on paper before running anything. Settings: a budget of 8 tokens per tick, at most 2 "
             "running requests, pages of 4 tokens and plenty of them, prompts with the fewest tokens left first "
             "(the default). Requests `a` (10 prompt tokens), `b` (5) and `c` (3) arrive together, in that order, "
             "each asking for 4 new tokens. Write `tick_plans()`: for each tick, the list of `(request, tokens)` "
             "the scheduler runs, in the order of its plan (decodes first, in the order the requests run).",
             "def tick_plans():\n    return [\n        [],  # tick 1: your plan here, e.g. [(\"a\", 8)]\n"
             "        [],  # tick 2\n        [],  # tick 3\n    ]",
             check_tick_plans, tick_plans),
    Exercise("11", "Time per output token",
             "Write `tpot_s(metrics)` from a `RequestMetrics`: the mean seconds between output tokens after each "
             "completion's first (its decode time over the tokens decoded), or `None` when nothing was decoded.",
             "def tpot_s(metrics):\n    raise NotImplementedError  # your code here",
             check_tpot_s, tpot_s),
    Exercise("12", "Many prompts, one call",
             "Write `answer_all(llm, prompts, max_tokens)`: the greedy completion text of every prompt, in order, "
             "from a single `generate` call (the engine batches them). The check compares them with each prompt "
             "run alone, on an `LLM` of the default model that it starts and closes.",
             "def answer_all(llm, prompts, max_tokens):\n    raise NotImplementedError  # your code here",
             check_answer_all, answer_all),
    Exercise("13", "Reading a stream",
             "A streaming chat completion arrives as server-sent events: `data: {json}` lines, blank lines between "
             "events, `:` comment lines, and `data: [DONE]` at the end. Write `sse_text(lines)`: the text of the "
             "answer, joined from each chunk's `choices[0].delta.content` (some chunks have none).",
             "def sse_text(lines):\n    raise NotImplementedError  # your code here",
             check_sse_text, sse_text),
)


# ---- the cells ----

def cell_id(chapter: str, index: int, part: int) -> str:
    "A stable id for an inserted cell, so a second run finds and replaces its own cells."
    return "e" + hashlib.sha1(f"your-turn/{chapter}/{index}/{part}".encode()).hexdigest()[:7]


def lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def markdown(id_: str, text: str) -> dict:
    return {"cell_type": "markdown", "id": id_, "metadata": {}, "source": lines(text)}


def code(id_: str, text: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "id": id_, "metadata": {}, "outputs": [], "source": lines(text)}


def source_of(fn: Callable) -> str:
    return textwrap.dedent(inspect.getsource(fn)).strip("\n")


def exercise_cells(ex: Exercise, index: int, first: bool) -> list[dict]:
    call = f"{ex.check.__name__}({ex.name})"
    ids = [cell_id(ex.chapter, index, part) for part in range(5)]
    head = f"{HEADING}\n\n{INTRO}\n\n" if first else ""
    return [markdown(ids[0], f"{head}**{ex.title}.** {ex.task}"),
            code(ids[1], source_of(ex.check)),
            code(ids[2], f"#| notest\n{ex.stub}\n\n{call}"),
            markdown(ids[3], "One answer (try your own first):"),
            code(ids[4], f"{source_of(ex.answer)}\n\n{call}")]


def section(chapter: str) -> list[dict]:
    mine = [ex for ex in EXERCISES if ex.chapter == chapter]
    return [c for i, ex in enumerate(mine) for c in exercise_cells(ex, i, i == 0)]


def with_exercises(nb: dict, chapter: str) -> dict:
    "nb with its Your turn section (re)placed before `## Where this goes next`, or at its end."
    new = section(chapter)
    ours = {cell_id(chapter, i, part) for i in range(10) for part in range(5)}
    cells = [c for c in nb["cells"] if c.get("id") not in ours]
    where = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                  and "".join(c["source"]).startswith(WHERE_NEXT)), len(cells))
    return {**nb, "cells": cells[:where] + new + cells[where:]}


def core_chapter(nbs: Path, chapter: str) -> Path:
    found = sorted(nbs.glob(f"{chapter}_*.ipynb"))
    if len(found) != 1: raise SystemExit(f"expected one notebook {chapter}_*.ipynb in {nbs}, found {len(found)}")
    return found[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("nbs", type=Path, help="the notebooks' folder (nbs)")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 where a section is missing or stale")
    args = ap.parse_args(argv)
    stale = []
    for chapter in sorted({ex.chapter for ex in EXERCISES}):
        path = core_chapter(args.nbs, chapter)
        nb = json.loads(path.read_text())
        new = with_exercises(nb, chapter)
        if new == nb: continue
        stale.append(path.name)
        if not args.check: path.write_text(json.dumps(new, indent=1, ensure_ascii=False) + "\n")
    verb = "stale or missing exercises" if args.check else "wrote exercises into"
    print(f"{verb}: {', '.join(stale)}" if stale else "every core chapter's exercises are up to date")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
