"""The continuous-batching engine gives every request exactly what it would get alone."""
import random

import pytest
import torch

from conftest import TEST_KV_BYTES, real_text
from helios import SamplingParams
from helios.reference import generate

GREEDY32 = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
NEAR_TIE = 1e-3  # top-2 logprob gap under which float reordering may legitimately flip argmax


@pytest.fixture(scope="module")
def llm(smollm2_llm_factory):
    return smollm2_llm_factory(max_batch_size=8)


def mixed_prompts(tokenizer, lengths):
    ids = tokenizer.encode(real_text())
    assert len(ids) > 3000
    rng = random.Random(0)
    out = []
    for n in lengths:
        start = rng.randrange(0, len(ids) - n)
        out.append(ids[start:start + n])
    return out


def assert_same_or_near_tie(model, prompt, got, expected):
    "Equal tokens, or the first difference is a genuine near-tie in the solo run's distribution."
    if got == expected: return
    step = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
    with torch.no_grad():
        ids = torch.tensor([prompt + expected[:step]])
        logp = model(ids, torch.arange(ids.shape[1])[None], logits_at=torch.tensor([ids.shape[1] - 1]))[0, 0].log_softmax(-1)
    top2 = logp.topk(2).values
    assert (top2[0] - top2[1]).item() < NEAR_TIE, f"diverged at step {step} without a near-tie ({top2.tolist()})"
    assert logp[got[step]] >= top2[1] - 1e-6  # the engine picked one of the tied tokens


@pytest.mark.slow
def test_batch_invariance_16_mixed_prompts(llm):
    lengths = [1, 700, 13, 256, 257, 90, 511, 3, 640, 42, 300, 5, 128, 600, 77, 2]
    prompts = mixed_prompts(llm.tokenizer, lengths)
    outs = llm.generate(prompts, GREEDY32, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert len(out.token_ids) == 32 and out.finish_reason == "length"
        assert_same_or_near_tie(llm.model, prompt, out.token_ids, generate(llm.model, prompt, 32))
    stats = llm.stats()
    assert stats.num_used_pages == 0 and stats.num_running == 0


def run_engine(llm, prompts, params, **config):
    "Run prompts through a fresh Engine over llm's model with the given EngineConfig fields."
    from helios.config import EngineConfig
    from helios.engine import Engine
    engine = Engine.create(llm.model, llm.tokenizer, llm.tokenizer.eos_token_ids, EngineConfig(**{"kv_cache_bytes": TEST_KV_BYTES, **config}))
    handles = [engine.submit(p, params) for p in prompts]
    while engine.step(): pass
    stats = engine.stats()
    assert stats.num_used_pages == 0 and stats.num_free_pages + stats.num_cached_pages == stats.num_pages
    return [h.result() for h in handles]


@pytest.fixture(scope="module")
def chunk_case(llm):
    prompts = mixed_prompts(llm.tokenizer, [37, 90, 150])
    return prompts, [generate(llm.model, p, 6) for p in prompts]


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 7, 64, 256, 1_000_000])
def test_chunk_invariance(llm, chunk_case, chunk):
    prompts, expected = chunk_case
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = run_engine(llm, prompts, params, max_batch_size=3, prefill_chunk_size=chunk, enable_prefix_caching=False)
    for prompt, out, exp in zip(prompts, outs, expected):
        assert_same_or_near_tie(llm.model, prompt, out.token_ids, exp)


@pytest.mark.parametrize("order", ["shortest-first", "oldest-first"])
def test_prefill_order_invariance(llm, chunk_case, order):
    "Whichever prompt a tick's budget goes to first, each request gets the tokens it gets alone."
    prompts, expected = chunk_case
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = run_engine(llm, prompts[::-1], params, max_batch_size=3, prefill_chunk_size=64, prefill_order=order,
                      enable_prefix_caching=False)
    for prompt, out, exp in zip(prompts[::-1], outs, expected[::-1]):
        assert_same_or_near_tie(llm.model, prompt, out.token_ids, exp)


@pytest.mark.slow
def test_prefix_cache_invariance(smollm2_llm_factory):
    on = smollm2_llm_factory(max_batch_size=4)
    off = smollm2_llm_factory(max_batch_size=4, enable_prefix_caching=False)
    prefix = on.tokenizer.encode(real_text())[:600]
    prompts = [prefix + on.tokenizer.encode(f" Question {i}: what does this describe?") for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    first = on.generate(prompts[:1], params, use_tqdm=False)[0]
    rest = on.generate(prompts[1:], params, use_tqdm=False)
    uncached = off.generate(prompts, params, use_tqdm=False)
    assert first.cached_tokens == 0 and all(o.cached_tokens >= 512 for o in rest)
    assert all(o.cached_tokens == 0 for o in uncached)
    for cached, plain in zip([first, *rest], uncached):
        assert cached.token_ids == plain.token_ids
    s = on.stats()
    assert s.prefix_hit_tokens >= 1024 and s.num_cached_pages >= 2 and s.num_used_pages == 0
    assert s.num_free_pages + s.num_used_pages + s.num_cached_pages == s.num_pages
    on.close(); off.close()


def test_seeded_sampling_independent_of_batch(llm):
    seeded = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16, seed=1234, ignore_eos=True)
    prompt = "The old lighthouse keeper looked at the sea and"
    alone = llm.generate([prompt], seeded, use_tqdm=False)[0].token_ids
    crowd = [SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True), seeded,
             SamplingParams(temperature=0, max_tokens=5)]
    handles = [llm.submit(p, sp) for p, sp in zip(["Tell me a story about a cat.", prompt, "List three fruits:"], crowd)]
    together = handles[1].result().token_ids
    for h in handles: h.result()
    assert together == alone
    other_seed = llm.generate([prompt], SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16, seed=99,
                                                       ignore_eos=True), use_tqdm=False)[0].token_ids
    assert other_seed != alone


def test_stream_deltas_add_up_to_the_text(llm):
    handle = llm.submit("Write a haiku about the sea.", SamplingParams(temperature=0, max_tokens=30))
    deltas = [e.delta for e in handle.events(timeout=60) if e.index == 0]
    out = handle.result()
    assert "".join(deltas) == out.text and out.metrics.ttft_s <= out.metrics.e2e_s
    assert out.metrics.num_output_tokens == len(out.token_ids)


def test_logit_bias_forbids_and_forces_tokens(llm):
    prompt = "The capital of France is"
    first = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0].token_ids[0]
    banned = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1, logit_bias={first: -100}),
                          use_tqdm=False)[0].token_ids[0]
    forced = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=3, logit_bias={42: 100}),
                          use_tqdm=False)[0].token_ids
    assert banned != first and forced == [42, 42, 42]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate(prompt, SamplingParams(max_tokens=1, logit_bias={10**6: 1.0}), use_tqdm=False)
