"""The engine's seams: grammar masks and drafts plug in from their own chapters (11a, 11b) through declared
interfaces, so the engine and the scheduler import neither, and a stand-in of each is obeyed."""
import ast
from pathlib import Path

import pytest
import torch

from helios import SamplingParams
from helios.config import EngineConfig, tiny_qwen3
from helios.engine import ConstraintViolation, Engine, EngineError, TickMasks
from helios.model.qwen3 import CausalLM
from helios.sampling import InvalidParam
from helios.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
CAPABILITIES = {"structured", "speculative"}
PROMPT = list(range(10, 30))


def imported_modules(path: Path) -> set[str]:
    "Every module a file's import statements name, relative ones as written after their dots."
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import): names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
            names |= {f"{node.module}.{alias.name}" if node.module else alias.name for alias in node.names}
    return names


@pytest.mark.parametrize("module", ["engine", "scheduler"])
def test_engine_and_scheduler_import_no_capability_chapter(module):
    names = imported_modules(ROOT / "helios" / f"{module}.py")
    named = {n for n in names for part in [n.split(".")] if CAPABILITIES & set(part)}
    assert not named, f"helios/{module}.py imports {sorted(named)}"


class EvenIds:
    "A stand-in TokenConstraint and its TokenConstraints: only even token ids, complete after `length` tokens."
    def __init__(self, length: int = 10**9, refuse_at: int | None = None):
        self.length, self.refuse_at, self.taken = length, refuse_at, []

    def accept(self, token_id: int):
        if token_id % 2 or len(self.taken) == self.refuse_at:
            raise ConstraintViolation(f"token {token_id} refused")
        self.taken.append(token_id)

    @property
    def is_finished(self) -> bool: return len(self.taken) >= self.length

    def constraints(self, params: SamplingParams) -> list["EvenIds"]:
        if params.grammar is None: return []
        return [EvenIds(int(params.grammar), self.refuse_at) for _ in range(params.n)]

    def fill_masks(self, masks: torch.Tensor, rows: list) -> TickMasks:
        for row, _ in rows: masks[row] = 0x55555555  # bits 0, 2, 4, ...: the even ids of each 32-token word
        return TickMasks(masks, [row for row, _ in rows], {}, 0.0)


class ConstantDrafter:
    "A stand-in Drafter: always guesses k copies of one token (the model mostly disagrees)."
    def propose(self, prompt_ids, output_ids, k): return [7] * k


@pytest.fixture(scope="module")
def parts(smollm2_gguf):
    torch.manual_seed(0)
    model = CausalLM(tiny_qwen3()).eval()
    for p in model.parameters(): p.data.mul_(0.3)  # flat logits: a free row samples odd ids too
    return model, load_tokenizer(smollm2_gguf)


def make_engine(parts, **plugins) -> Engine:
    model, tok = parts
    config = EngineConfig(**{**dict(max_batch_size=4, prefill_chunk_size=64, page_size=8), **plugins.pop("config", {})})
    return Engine(model, tok, frozenset(), config, num_pages=32, **plugins)


def drain(engine: Engine, requests):
    handles = [engine.submit(PROMPT, params) for params in requests]
    while engine.step(): pass
    return handles


def test_a_stand_in_constraint_is_obeyed(parts):
    engine = make_engine(parts, constraints=lambda tokenizer, vocab_size, eos: EvenIds())
    sampled = dict(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True)
    even, free, done = drain(engine, [SamplingParams(grammar="100", **sampled), SamplingParams(**sampled),
                                      SamplingParams(grammar="5", **sampled)])
    assert all(t % 2 == 0 for t in even.result().token_ids) and len(even.result().token_ids) == 12
    assert any(t % 2 for t in free.result().token_ids)           # unconstrained rows are untouched
    assert (len(done.result().token_ids), done.result().finish_reason) == (5, "stop")  # complete: ended "stop"
    s = engine.stats()
    assert s.num_constrained_rows == 12 + 5 and s.num_used_pages == 0


def test_a_stand_in_violation_fails_its_request_alone(parts):
    engine = make_engine(parts, constraints=lambda tokenizer, vocab_size, eos: EvenIds(refuse_at=2))
    bad, good = drain(engine, [SamplingParams(grammar="100", temperature=0, max_tokens=8, ignore_eos=True),
                               SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)])
    with pytest.raises(EngineError): bad.result()
    assert "following its grammar: ConstraintViolation: token" in bad.error
    assert len(good.result().token_ids) == 8 and engine.stats().num_requests_failed == 1


def test_no_constraints_refuses_a_grammar_and_speculation_needs_a_drafter(parts):
    engine = make_engine(parts)
    with pytest.raises(InvalidParam, match="enforces no grammar") as caught: engine.submit(PROMPT, SamplingParams(grammar="1"))
    assert caught.value.param == "grammar"
    with pytest.raises(ValueError, match="drafter_factory"): make_engine(parts, config=dict(speculative="ngram"))


def test_a_stand_in_drafter_drafts_and_changes_no_token(parts):
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    (plain,) = drain(make_engine(parts), [greedy])
    engine = make_engine(parts, config=dict(speculative="ngram"), drafter_factory=ConstantDrafter)
    (drafted,) = drain(engine, [greedy])
    assert drafted.result().token_ids == plain.result().token_ids
    assert engine.stats().num_draft_tokens > 0
