"""Speculative decoding (n-gram drafts) leaves every request's tokens exactly as they are without it: greedy and
seeded sampling, with penalties, logprobs, stop strings, EOS, n > 1, chunked prefill beside drafting decodes,
full reservation and a pool so small that it preempts. Drafts that the model confirms are counted, and they are
what makes fewer ticks."""
import pytest

from conftest import TEST_KV_BYTES, real_text
from helios import SamplingParams
from helios.config import EngineConfig
from helios.engine import Engine
from helios.llm import engine_plugins
from helios.structured import json_schema_grammar

COPY = ("The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
        "How vexingly quick daft zebras jump. The five boxing wizards jump quickly. ")


@pytest.fixture(scope="module")
def llm(smollm2_llm_factory):
    return smollm2_llm_factory(max_batch_size=8)


@pytest.fixture(scope="module")
def prompts(llm):
    "Prompts whose continuations repeat their text (drafts hold), and pieces of real text (drafts mostly fail)."
    encode = llm.tokenizer.encode
    text = encode(real_text())
    return [encode(f"Repeat the following text exactly, word for word:\n\n{COPY * 2}\n\nRepeated text:\n"),
            encode("Count in words: one, two, three, four, five,"),
            encode("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"),
            text[100:400], text[900:937]]


def run(llm, prompts, params, **config):
    "Each prompt's output through a fresh engine over llm's model, and the engine's final stats."
    settings = {"kv_cache_bytes": TEST_KV_BYTES, "max_batch_size": 8, **config}
    config = EngineConfig(**settings)
    engine = Engine.create(llm.model, llm.tokenizer, llm.tokenizer.eos_token_ids, config, **engine_plugins(config))
    handles = [engine.submit(p, params) for p in prompts]
    while engine.step(): engine.pages.check_invariants()
    stats = engine.stats()
    assert stats.num_used_pages == 0 and stats.num_free_pages + stats.num_cached_pages == stats.num_pages
    return [h.result() for h in handles], stats


def outputs(results):
    return [[(c.token_ids, c.text, c.finish_reason, c.logprobs) for c in r.outputs] for r in results]


GREEDY = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, top_k=40, seed=11, max_tokens=40, repetition_penalty=1.05,
                         presence_penalty=0.2, logprobs=2, n=2, ignore_eos=True)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "seeded-sampling"])
def test_drafts_change_no_token(llm, prompts, params):
    "The same tokens, text and logprobs; drafts were confirmed, and each confirmed one saved a tick."
    plain, plain_stats = run(llm, prompts, params, prefill_chunk_size=128)
    drafted, stats = run(llm, prompts, params, prefill_chunk_size=128, speculative="ngram")
    assert outputs(drafted) == outputs(plain)
    assert plain_stats.num_draft_tokens == 0 and stats.num_accepted_tokens > 20
    assert stats.num_accepted_tokens <= stats.num_draft_tokens
    assert stats.num_ticks < plain_stats.num_ticks and stats.num_generated_tokens == plain_stats.num_generated_tokens


def test_stop_strings_eos_and_max_tokens_cut_inside_an_accepted_draft(llm, prompts):
    "A stop string, EOS or max_tokens reached in the middle of a draft ends the completion exactly there."
    copy = prompts[:1]
    cases = [SamplingParams(temperature=0, max_tokens=60, stop=["lazy dog. Pack"]),
             SamplingParams(temperature=0, max_tokens=13),
             SamplingParams(temperature=0, max_tokens=60, stop_token_ids=[llm.tokenizer.encode(" jugs")[0]])]
    for params in cases:
        plain, _ = run(llm, copy, params)
        drafted, stats = run(llm, copy, params, speculative="ngram", speculative_tokens=6)
        assert outputs(drafted) == outputs(plain) and stats.num_accepted_tokens > 0
        assert len(drafted[0].outputs[0].token_ids) <= params.max_tokens


@pytest.mark.parametrize("config", [dict(kv_reservation="full"),
                                    dict(kv_cache_bytes=None, page_size=16, prefill_chunk_size=32)],
                         ids=["full-reservation", "small-pages-and-chunks"])
def test_drafts_under_other_page_policies(llm, prompts, config):
    "Reserved pages up front, or drafts that cross page boundaries beside chunked prefill: still the same tokens."
    plain, _ = run(llm, prompts, GREEDY, **config)
    drafted, stats = run(llm, prompts, GREEDY, speculative="ngram", **config)
    assert outputs(drafted) == outputs(plain) and stats.num_accepted_tokens > 0


def test_a_pool_too_small_preempts_drafting_sequences_and_changes_nothing(llm, prompts):
    "Eight copies on 12 pages of 16 tokens: sequences are preempted (and recomputed) mid-draft, tokens unchanged."
    tight = dict(page_size=16, prefill_chunk_size=64, kv_cache_bytes=12 * 16 * llm.model.config.kv_bytes_per_token(4))
    many = [prompts[0]] * 4 + [prompts[2]] * 4
    plain, plain_stats = run(llm, many, GREEDY, **tight)
    drafted, stats = run(llm, many, GREEDY, speculative="ngram", **tight)
    assert outputs(drafted) == outputs(plain)
    assert stats.num_preemptions > 0 and stats.num_accepted_tokens > 0


def test_a_request_with_a_grammar_never_drafts(llm, prompts):
    "Its mask at a drafted position would need the grammar to have taken the tokens before it: it decodes one by one."
    grammar = json_schema_grammar({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
    params = SamplingParams(temperature=0, max_tokens=24, grammar=grammar)
    plain, _ = run(llm, prompts[:1], params)
    drafted, stats = run(llm, prompts[:1], params, speculative="ngram")
    assert outputs(drafted) == outputs(plain) and stats.num_draft_tokens == 0
