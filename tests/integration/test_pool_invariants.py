"""Pages never leak: after runs, cancels mid-prefill and mid-decode, errors, and a random stress."""
import random

import pytest
import torch

from helios import SamplingParams
from helios.config import EngineConfig, tiny_qwen3
from helios.engine import Engine, EngineError
from helios.model.qwen3 import CausalLM
from helios.kv.manager import PageManager
from helios.kv.prefix_cache import PrefixCache, prompt_block_hashes
from helios.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def parts(smollm2_gguf):
    torch.manual_seed(0)
    return CausalLM(tiny_qwen3()).eval(), load_tokenizer(smollm2_gguf)


def make_engine(parts, num_pages=24, **config):
    model, tok = parts
    cfg = dict(max_batch_size=4, prefill_chunk_size=16, page_size=8, max_queue=64)
    return Engine(model, tok, frozenset(), EngineConfig(**{**cfg, **config}), num_pages)


def assert_idle_invariants(engine):
    engine.pages.check_invariants()
    s = engine.stats()
    assert s.num_used_pages == 0 and s.num_running == 0 and s.num_waiting == 0
    assert s.num_free_pages + s.num_cached_pages == s.num_pages
    assert sorted(engine.runner._free_rows) == list(range(engine.config.max_batch_size))


def drain(engine):
    while engine.step(): pass


def test_cancel_mid_prefill_and_mid_decode(parts):
    engine = make_engine(parts)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    long_prompt = engine.submit(list(range(1, 100)), params)     # 99 tokens: 7 ticks of prefill
    decoding = engine.submit(list(range(3, 9)), params)
    engine.step()                                                 # long_prompt is mid-prefill
    assert any(s.is_prefilling for s in engine.scheduler.running)
    engine.cancel(long_prompt.request_id)
    for _ in range(3): engine.step()                              # decoding is mid-decode
    engine.cancel(decoding.request_id)
    drain(engine)
    assert long_prompt.result().finish_reason == "cancelled" and decoding.result().finish_reason == "cancelled"
    assert 0 < len(decoding.result().token_ids) < 20
    assert_idle_invariants(engine)


def test_cancel_while_waiting_and_unknown_ids(parts):
    engine = make_engine(parts, max_batch_size=1)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    a, b = engine.submit([1, 2, 3], params), engine.submit([4, 5, 6], params)
    engine.step()
    engine.cancel(b.request_id); engine.cancel("no-such-request")
    drain(engine)
    assert a.result().finish_reason == "length" and b.result().finish_reason == "cancelled"
    assert b.result().token_ids == []
    assert_idle_invariants(engine)


def test_a_failing_forward_fails_its_requests_and_the_engine_keeps_serving(parts, monkeypatch):
    engine = make_engine(parts)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    real_run = engine.runner.run
    monkeypatch.setattr(engine.runner, "run", lambda plan, timer=None: (_ for _ in ()).throw(RuntimeError("simulated kernel failure")))
    doomed = engine.submit([1, 2, 3], params)
    engine.step()
    with pytest.raises(EngineError, match="simulated kernel failure"):
        doomed.result()
    assert_idle_invariants(engine)
    monkeypatch.setattr(engine.runner, "run", real_run)
    fine = engine.submit([1, 2, 3], params)
    drain(engine)
    assert len(fine.result().token_ids) == 4


@pytest.mark.parametrize("seed", range(6))
def test_random_submits_and_cancels_never_leak(parts, seed):
    "A property test: any interleaving of submits, cancels and ticks leaves a consistent, empty pool."
    rng = random.Random(seed)
    engine = make_engine(parts, num_pages=rng.choice([6, 12, 40]), max_batch_size=rng.choice([1, 3, 8]),
                         prefill_chunk_size=rng.choice([1, 5, 32]), enable_prefix_caching=rng.random() < 0.7)
    shared = [rng.randrange(256) for _ in range(24)]
    handles = []
    for _ in range(60):
        action = rng.random()
        if action < 0.4:
            prompt = (shared[: rng.randrange(0, 24)] + [rng.randrange(256) for _ in range(rng.randrange(1, 20))])
            params = SamplingParams(temperature=rng.choice([0, 1.0]), max_tokens=rng.randrange(1, 12),
                                    n=rng.choice([1, 1, 2]), seed=rng.randrange(100), ignore_eos=True)
            try:
                handles.append(engine.submit(prompt, params))
            except ValueError:
                pass  # larger than this small pool can ever hold: refused up front, nothing allocated
        elif action < 0.55 and handles:
            engine.cancel(rng.choice(handles).request_id)
        else:
            engine.step()
        engine.pages.check_invariants()
        for p in range(engine.pages.num_pages): assert engine.pages.pool.refcount(p) >= 0
    drain(engine)
    for h in handles:
        out = h.result()
        assert all(o.finish_reason in ("length", "cancelled") for o in out.outputs)
    assert_idle_invariants(engine)


def test_prefix_pages_survive_until_needed_then_are_evicted(parts):
    engine = make_engine(parts, num_pages=6)
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    prompt = list(range(1, 25))                                    # 3 full pages of 8
    engine.submit(prompt, params); drain(engine)
    assert engine.stats().num_cached_pages == 3                    # all three full prompt pages stay
    again = engine.submit(prompt, params); drain(engine)
    assert again.result().cached_tokens == 16                      # the last prompt token is always recomputed
    big = engine.submit(list(range(100, 140)), params); drain(engine)  # needs all 6 pages: evicts the cache
    assert len(big.result().token_ids) == 2
    third = engine.submit(prompt, params); drain(engine)
    assert third.result().cached_tokens == 0                       # the first prompt's pages were evicted
    assert_idle_invariants(engine)


def test_ttl_expiry_returns_cached_pages():
    mgr = PageManager(4, 4, PrefixCache(ttl_s=1.0))
    hashes = prompt_block_hashes(list(range(8)), 4)
    table = mgr.allocate(9, mgr.match_prefix(hashes, 9))
    mgr.register(hashes, table); mgr.release(table, now=100.0)
    assert mgr.num_cached_pages == 2
    mgr.expire(now=100.5); assert mgr.num_cached_pages == 2
    hit = mgr.allocate(9, mgr.match_prefix(hashes, 9))            # a hit at t=100.5 ...
    mgr.release(hit, now=100.9)                                    # ... slides the TTL
    mgr.expire(now=101.5); assert mgr.num_cached_pages == 2
    mgr.expire(now=102.0); assert mgr.num_cached_pages == 0 and mgr.num_free_pages == 4
    mgr.check_invariants()
