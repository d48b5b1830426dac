"""The "Your turn" exercises: each check accepts its answer and the engine's own implementation, and rejects
a wrong one; scripts/exercises.py places the cells in a chapter once, where they belong."""
import json
from types import SimpleNamespace

import pytest
import torch

from _scripts import load_script

exercises = load_script("exercises")
BY_NAME = {ex.name: ex for ex in exercises.EXERCISES}


class FakeLLM:
    "Deterministic stand-in for helios.LLM: a prompt's 'completion' is its reverse, cut to max_tokens characters."
    def generate(self, prompts, params, use_tqdm=True):
        prompts = [prompts] if isinstance(prompts, str) else prompts
        return [SimpleNamespace(text=p[::-1][:params.max_tokens]) for p in prompts]


def run_check(name, fn):
    ex = BY_NAME[name]
    return ex.check(fn, FakeLLM()) if name == "answer_all" else ex.check(fn)


def engine_rms_norm(x, weight, eps):
    from helios.model.layers import RMSNorm
    norm = RMSNorm(x.shape[-1], eps)
    with torch.no_grad(): norm.weight.copy_(weight)
    return norm(x).detach()


def engine_dequantize_q8_0(raw):
    from gguf import GGMLQuantizationType
    from helios.formats.gguf import GGUFTensor, dequantize_tensor
    return dequantize_tensor(GGUFTensor("w", (raw.shape[0], raw.shape[1] // 34 * 32), GGMLQuantizationType.Q8_0, raw))


def engine_text_deltas(decode, ids):
    from helios.tokenizer import IncrementalDetokenizer
    detok = IncrementalDetokenizer(SimpleNamespace(decode=lambda ids, skip_special_tokens=True: decode(ids)))
    return [detok.push(i) for i in ids]


def engine_implementations():
    "The engine's own function for each exercise that has one."
    from helios.kv.pages import pages_needed, slot_mapping
    from helios.kv.prefix_cache import prompt_block_hashes
    from helios.model.attention import causal_mask
    from helios.model.qwen3 import CausalLM
    from helios.reference import generate
    return {
        "kv_bytes_per_token": lambda cfg, dtype_bytes: cfg.kv_bytes_per_token(dtype_bytes),
        "rms_norm": engine_rms_norm,
        "chunk_mask": causal_mask,
        "count_parameters": lambda cfg: sum(p.numel() for p in CausalLM(cfg).parameters()),
        "dequantize_q8_0": engine_dequantize_q8_0,
        "text_deltas": engine_text_deltas,
        "generate_with_cache": generate,
        "pages_for": lambda lens, page_size: sum(pages_needed(n, page_size) for n in lens),
        "slot_of": lambda table, position, page_size: int(slot_mapping(torch.tensor(table), torch.tensor([position]), page_size)[0]),
        "block_hashes": prompt_block_hashes,
        "tpot_s": lambda m: 1 / m.decode_tokens_per_s if m.decode_tokens_per_s else None,
    }


def wrong_implementations():
    "A plausible mistake for every exercise: its check must raise AssertionError."
    from helios.kv.prefix_cache import ROOT_HASH, hash_block
    from helios.reference import generate_without_cache
    a = {ex.name: ex.answer for ex in exercises.EXERCISES}

    def wrong_q8_0(raw):  # reads the integers as unsigned
        blocks = raw.reshape(raw.shape[0], -1, 34)
        scale = blocks[..., :2].copy().view("float16").astype("float32")
        return (scale * blocks[..., 2:].astype("float32")).reshape(raw.shape[0], -1)

    return {
        "kv_bytes_per_token": lambda cfg, b: cfg.num_layers * 2 * cfg.num_heads * cfg.head_dim * b,  # query heads
        "rms_norm": lambda x, w, eps: w * (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True),  # LayerNorm
        "chunk_mask": lambda t, s: torch.ones(t, s, dtype=torch.bool).tril(),  # ignores the cached tokens
        "count_parameters": lambda cfg: a["count_parameters"](cfg) - cfg.num_layers * 2 * cfg.head_dim * cfg.qk_norm,
        "dequantize_q8_0": wrong_q8_0,
        "text_deltas": lambda decode, ids: [decode([i]) for i in ids],  # splits characters
        "generate_with_cache": lambda model, prompt, n: generate_without_cache(model, prompt[-1:], n),  # drops the prompt
        "top_k_filter": lambda logits, k: logits.masked_fill(logits <= logits.topk(k).values[:, -1:], float("-inf")),
        "pages_for": lambda lens, page_size: sum(n // page_size + 1 for n in lens),  # a page too many when full
        "slot_of": lambda table, position, page_size: table[position // page_size] + position % page_size,
        "block_hashes": lambda ids, ps: [hash_block(ROOT_HASH, ids[i:i + ps]) for i in range(0, len(ids) - ps + 1, ps)],
        "tick_plans": lambda: [[("a", 8)], [("a", 2), ("b", 5)], [("a", 1), ("b", 1)]],  # oldest first
        "tpot_s": lambda m: m.decode_s / m.num_output_tokens if m.num_output_tokens > 1 else None,
        "answer_all": lambda llm, prompts, n: a["answer_all"](llm, prompts[::-1], n),  # out of order
        "sse_text": lambda lines: json.loads(lines[2][6:])["choices"][0]["delta"]["content"],  # the first delta only
    }


@pytest.mark.parametrize("name", list(BY_NAME))
def test_the_check_accepts_the_answer(name, capsys):
    run_check(name, BY_NAME[name].answer)
    assert capsys.readouterr().out.strip() == f"{name}: correct"


@pytest.mark.parametrize("name", list(engine_implementations()))
def test_the_check_accepts_the_engines_own_implementation(name):
    run_check(name, engine_implementations()[name])


@pytest.mark.parametrize("name", list(BY_NAME))
def test_the_check_rejects_a_wrong_implementation(name):
    with pytest.raises(AssertionError):
        run_check(name, wrong_implementations()[name])


@pytest.mark.parametrize("name", [n for n in BY_NAME if n != "answer_all"])
def test_the_inserted_cells_run_on_their_own(name):
    "What nbdev-test runs: the check's and the answer's cells, from their source, in a fresh namespace."
    ex = BY_NAME[name]
    cells = exercises.exercise_cells(ex, 0, True)
    namespace = {}
    for cell in (c for c in cells if c["cell_type"] == "code"):
        source = "".join(cell["source"])
        if not source.startswith("#| notest"): exec(source, namespace)
    stub = "".join(cells[2]["source"])
    assert stub.startswith("#| notest\n") and stub.endswith(f"{ex.check.__name__}({name})")


def test_every_core_chapter_has_an_exercise():
    assert sorted({ex.chapter for ex in exercises.EXERCISES}) == [f"{n:02d}" for n in range(14)]


def md(text, id_): return {"cell_type": "markdown", "id": id_, "metadata": {}, "source": text.splitlines(keepends=True)}


def write_chapter(folder, name, cells):
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (folder / name).write_text(json.dumps(nb, indent=1) + "\n")


def test_the_script_places_the_section_once(tmp_path):
    for n in range(14):  # a chapter with a closing section, the others without
        closing = [md("## Where this goes next\n\n- more", "c")] if n == 8 else []
        write_chapter(tmp_path, f"{n:02d}_x.ipynb", [md(f"# Chapter {n}", "a"), md("## What we measured", "b"), *closing])
    write_chapter(tmp_path, "08a_other.ipynb", [md("# A lettered chapter", "a")])
    assert exercises.main([str(tmp_path), "--check"]) == 1
    assert exercises.main([str(tmp_path)]) == 0
    first = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert exercises.main([str(tmp_path), "--check"]) == 0 and exercises.main([str(tmp_path)]) == 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == first  # a second run changes nothing

    cells = json.loads((tmp_path / "08_x.ipynb").read_text())["cells"]
    texts = ["".join(c["source"]) for c in cells]
    assert texts[0] == "# Chapter 8" and texts[1] == "## What we measured" and texts[-1].startswith("## Where this goes next")
    assert texts[2].startswith("## Your turn") and sum(t.startswith("## Your turn") for t in texts) == 1
    assert len(cells) == 3 + 2 * 5  # two exercises in chapter 08
    assert "".join(json.loads((tmp_path / "07_x.ipynb").read_text())["cells"][-1]["source"]).endswith("check_top_k_filter(top_k_filter)")
    assert json.loads((tmp_path / "08a_other.ipynb").read_text())["cells"] == [md("# A lettered chapter", "a")]

    nb = json.loads((tmp_path / "03_x.ipynb").read_text())  # a stale section is refreshed in place
    nb["cells"][3]["source"] = ["def check_count_parameters(fn): pass"]
    (tmp_path / "03_x.ipynb").write_text(json.dumps(nb))
    assert exercises.main([str(tmp_path), "--check"]) == 1 and exercises.main([str(tmp_path)]) == 0
    assert (tmp_path / "03_x.ipynb").read_text() == first["03_x.ipynb"]


def test_the_chapters_hold_the_current_exercises():
    "scripts/exercises.py nbs --check: every core chapter's 'Your turn' section is the one the script writes."
    from _scripts import ROOT
    assert exercises.main([str(ROOT / "nbs"), "--check"]) == 0, "run: python scripts/exercises.py nbs"
