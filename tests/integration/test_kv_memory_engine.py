"""A pool many times too small: every request completes with its tokens alone, under every KV policy, and nothing leaks."""
import pytest
import torch

from helios import SamplingParams
from helios.config import EngineConfig, tiny_qwen3
from helios.engine import Engine
from helios.model.qwen3 import CausalLM
from helios.reference import generate
from helios.tokenizer import load_tokenizer

PAGE = 8
MODES = {"full": dict(kv_reservation="full"), "on-demand": dict(kv_reservation="on-demand"),
         "on-demand + offload": dict(kv_reservation="on-demand", kv_offload_bytes=1)}  # bytes set per test below


@pytest.fixture(scope="module")
def parts(smollm2_gguf):
    torch.manual_seed(0)
    return CausalLM(tiny_qwen3()).eval(), load_tokenizer(smollm2_gguf)


def page_bytes(model) -> int:
    cfg = model.config
    return PAGE * cfg.kv_bytes_per_token(4)


def make_engine(parts, num_pages, mode="on-demand", host_pages=0, **config):
    model, tok = parts
    settings = dict(MODES[mode], max_batch_size=6, prefill_chunk_size=16, page_size=PAGE, max_queue=64, kv_watermark=0.0)
    if "kv_offload_bytes" in settings or host_pages: settings["kv_offload_bytes"] = host_pages * page_bytes(model)
    return Engine(model, tok, frozenset(), EngineConfig(**{**settings, **config}), num_pages)


def prompts_for(n, length=11):
    return [[(7 * i + 3 * j) % 200 + 1 for j in range(length + i % 5)] for i in range(n)]


def drain(engine):
    while engine.step(): engine.pages.check_invariants()


def run(engine, prompts, params):
    handles = [engine.submit(p, params) for p in prompts]
    drain(engine)
    return [h.result() for h in handles]


def assert_idle(engine):
    engine.pages.check_invariants()
    s = engine.stats()
    assert s.num_used_pages == 0 and s.num_running == 0 and s.num_waiting == 0
    assert s.num_host_swapped_pages == 0 and s.num_host_free_pages + s.num_host_cached_pages == s.num_host_pages
    assert sorted(engine.runner._free_rows) == list(range(engine.config.max_batch_size))


def _fails(handle) -> bool:
    try: handle.result(timeout=0)
    except Exception: return True
    return False


GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_pool_too_small_gives_every_request_its_tokens_alone(parts, mode):
    model, _ = parts
    prompts = prompts_for(8)
    engine = make_engine(parts, num_pages=6, mode=mode, host_pages=8 if "offload" in mode else 0)
    assert sum(len(p) + GREEDY.max_tokens for p in prompts) > 4 * 6 * PAGE  # the work is many times the pool
    outs = run(engine, prompts, GREEDY)
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == generate(model, prompt, GREEDY.max_tokens), prompt
    s = engine.stats()
    if mode == "full": assert s.num_preemptions == 0
    else: assert s.num_preemptions > 0
    if "offload" in mode: assert s.num_swapped > 0 and s.kv_bytes_to_host > 0 and s.kv_bytes_to_device > 0
    assert_idle(engine)


def test_seeded_sampling_survives_preemption(parts):
    "The sampler's state (its generator, penalties over the tokens so far) travels with the request."
    params = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=20, seed=11, ignore_eos=True, frequency_penalty=0.3)
    prompts = prompts_for(8)
    alone = [run(make_engine(parts, num_pages=64), [p], params)[0].token_ids for p in prompts]
    for mode, host in (("on-demand", 0), ("on-demand + offload", 8)):
        engine = make_engine(parts, num_pages=6, mode=mode, host_pages=host)
        outs = run(engine, prompts, params)
        assert engine.stats().num_preemptions > 0
        assert [o.token_ids for o in outs] == alone, mode


def test_on_demand_runs_more_requests_at_once_than_full(parts):
    "Same pool, short answers, large max_tokens: full reservation holds pages nobody uses."
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    peak = {}
    for mode in ("full", "on-demand"):
        engine = make_engine(parts, num_pages=16, mode=mode)
        for p in prompts_for(6): engine.submit(p, params)
        engine.step(); engine.step()
        peak[mode] = engine.stats().num_running
    assert peak["full"] == 1 and peak["on-demand"] == 6


def test_a_prefix_evicted_from_the_device_comes_back_from_the_host(parts):
    model, _ = parts
    shared = list(range(1, 33))                                   # four full pages
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine = make_engine(parts, num_pages=6, host_pages=8)
    first = run(engine, [shared + [40]], params)[0]
    run(engine, [list(range(100, 140))], params)                   # 44 tokens: every device page
    assert engine.stats().num_host_cached_pages >= 4
    again = run(engine, [shared + [41, 42]], params)[0]
    assert again.cached_tokens == 32 and again.metrics.num_cached_tokens == 32
    assert again.token_ids == generate(model, shared + [41, 42], 4) and first.token_ids == generate(model, shared + [40], 4)
    s = engine.stats()
    assert s.prefix_host_hit_tokens == 32 and s.kv_bytes_to_device >= 4 * page_bytes(model)
    report = engine.inspect_cache()
    assert report.num_host_pages == 8 and report.totals.host_hit_tokens == 32
    assert_idle(engine)


def test_cancels_mid_swap_and_errors_leak_nothing(parts):
    engine = make_engine(parts, num_pages=6, host_pages=6)
    handles = [engine.submit(p, GREEDY) for p in prompts_for(8)]
    swapped = None
    for _ in range(400):
        if not engine.step(): break
        engine.pages.check_invariants()
        waiting = [s for s in engine.scheduler.resuming if s.swapped_pages]
        if waiting and swapped is None:  # a request preempted to the host tier: its client goes away
            swapped = waiting[0]
            engine.cancel(swapped.request_id)
    assert swapped is not None, "the workload swapped a request out"
    results = [h.result() for h in handles]
    assert [r.finish_reason for r in results].count("cancelled") == 1
    assert_idle(engine)
    boom = make_engine(parts, num_pages=6, host_pages=6)
    handles = [boom.submit(p, GREEDY) for p in prompts_for(8)]
    calls = 0
    real_run = boom.runner.run

    def failing_run(plan, timer=None):
        nonlocal calls
        calls += 1
        if calls in (9, 15): raise RuntimeError("the forward failed")
        return real_run(plan, timer)
    boom.runner.run = failing_run
    drain(boom)
    failed = [h for h in handles if _fails(h)]
    assert failed and len(failed) < len(handles)                   # the ticks that raised failed their requests only
    assert boom.stats().num_requests_failed == len(failed) and boom.stats().num_preemptions > 0
    assert_idle(boom)
