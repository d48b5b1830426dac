"""Isolation: whatever one request carries fails that request alone; its neighbours, the engine thread
and the books (wait-list count, pages, page-table rows) come through unchanged. Shutdown ends what is left as "abort"."""
import time

import pytest
import torch

import helios.engine as engine_module
from helios import SamplingParams
from helios.config import EngineConfig, tiny_qwen3
from helios.engine import Engine, EngineError
from helios.model.qwen3 import CausalLM
from helios.sampling import Completion
from helios.tokenizer import load_tokenizer

BAD_SEED = 13  # marks the hostile request: every injected failure fires for it alone
PROMPT = list(range(10, 30))
HONEST = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
          SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)]  # seeded: its draws must not shift
TIMEOUT_S = 30


def hostile(n: int = 2) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=BAD_SEED, n=n, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def parts(smollm2_gguf):
    torch.manual_seed(0)
    model = CausalLM(tiny_qwen3()).eval()
    for p in model.parameters(): p.data.mul_(0.3)  # flatter logits: each seeded draw decides its token
    return model, load_tokenizer(smollm2_gguf)


def make_engine(parts, **config) -> Engine:
    model, tok = parts
    cfg = dict(max_batch_size=6, prefill_chunk_size=64, page_size=8, max_queue=16)
    return Engine(model, tok, frozenset(), EngineConfig(**{**cfg, **config}), num_pages=40)


def drain(engine: Engine):
    while engine.step(): pass


@pytest.fixture(scope="module")
def alone(parts) -> list[list[int]]:
    "The honest requests' tokens, each run alone."
    out = []
    for params in HONEST:
        engine = make_engine(parts)
        handle = engine.submit(PROMPT, params)
        drain(engine)
        out.append(handle.result().token_ids)
    assert out[0] != out[1], "the seeded request should sample, not repeat the greedy one"
    return out


def assert_idle(engine: Engine):
    "The books are back at their idle values."
    engine.pages.check_invariants()
    s = engine.stats()
    assert (s.num_waiting, s.num_running, s.num_used_pages) == (0, 0, 0)
    assert engine._num_queued() == 0 and not engine._requests and not engine._seq_owner
    assert sorted(engine.runner._free_rows) == list(range(engine.config.max_batch_size))


def poison_completion(monkeypatch, part: str, after: int):
    "The hostile request's Completions raise in `part` (detokenizer push, stop-string feed) from call `after` on."
    class Poisoned(Completion):
        def __post_init__(self):
            super().__post_init__()
            if self.params.seed != BAD_SEED: return
            owner, name = {"detokenize": (self._detok, "push"), "stop strings": (self._stops, "feed")}[part]
            real, calls = getattr(owner, name), []

            def failing(*args):
                calls.append(1)
                if len(calls) > after: raise RuntimeError(f"injected {part} failure")
                return real(*args)
            setattr(owner, name, failing)
    monkeypatch.setattr(engine_module, "Completion", Poisoned)


def fail(*_):
    raise RuntimeError("injected")


def inject(stage: str, monkeypatch, params: SamplingParams):
    "Make the hostile request fail at one stage of its life."
    if stage == "accept":
        real = engine_module.Completion
        monkeypatch.setattr(engine_module, "Completion", lambda p, *a: fail() if p.seed == BAD_SEED else real(p, *a))
    elif stage == "generator":
        real = engine_module.make_generator
        hostile_seeds = (BAD_SEED, BAD_SEED + 1)  # its samples' seeds
        monkeypatch.setattr(engine_module, "make_generator",
                            lambda seed, device: fail() if seed in hostile_seeds else real(seed, device))
    elif stage == "seed past validation":  # a seed torch cannot take, smuggled past SamplingParams
        object.__setattr__(params, "seed", 2**64 + BAD_SEED)
    elif stage == "draw":
        real = engine_module.draw_uniforms
        monkeypatch.setattr(engine_module, "draw_uniforms",
                            lambda ps, gs, device: fail() if ps[0].seed == BAD_SEED else real(ps, gs, device))
    elif stage == "sampling":  # the batched pick raises whenever the hostile row is in it
        real = engine_module.pick_tokens
        monkeypatch.setattr(engine_module, "pick_tokens", lambda logits, ps, *rest:
                            fail() if any(p.seed == BAD_SEED for p in ps) else real(logits, ps, *rest))
    elif stage == "logit bias past validation":  # a token id outside the vocabulary: indexing raises in the pick
        object.__setattr__(params, "logit_bias", ((10**6, 1.0),))
    elif stage in ("detokenize", "stop strings"):
        poison_completion(monkeypatch, stage, after=3)


STAGES = ["accept", "generator", "seed past validation", "draw", "sampling", "logit bias past validation",
          "detokenize", "stop strings"]
WHERE = {"accept": "accepting", "generator": "accepting", "seed past validation": "accepting", "draw": "sampling",
         "sampling": "sampling", "logit bias past validation": "sampling", "detokenize": "into text",
         "stop strings": "into text"}


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("stage", STAGES)
def test_a_failing_request_ends_alone(parts, alone, monkeypatch, stage, n):
    engine = make_engine(parts)
    bad_params = hostile(n)
    first = engine.submit(PROMPT, HONEST[0])
    bad = engine.submit(list(range(40, 50)), bad_params)
    second = engine.submit(PROMPT, HONEST[1])
    inject(stage, monkeypatch, bad_params)  # after submit: the engine thread is the one that meets it
    engine.start()
    try:
        with pytest.raises(EngineError, match=f"failed while .*{WHERE[stage]}"):
            bad.result(timeout=TIMEOUT_S)
        assert [first.result(timeout=TIMEOUT_S).token_ids, second.result(timeout=TIMEOUT_S).token_ids] == alone
        assert engine._thread.is_alive()
        assert_idle(engine)
        s = engine.stats()
        assert s.num_requests_failed == 1 and s.num_requests_finished == 3
        after = engine.submit(PROMPT, HONEST[1])  # and it keeps serving
        assert after.result(timeout=TIMEOUT_S).token_ids == alone[1]
    finally:
        engine.shutdown()
    assert_idle(engine)


def test_a_raising_notify_callback_stays_with_its_request(parts, alone):
    engine = make_engine(parts)
    calls = []

    def broken_notify():
        calls.append(1)
        raise RuntimeError("Event loop is closed")
    bad = engine.submit(PROMPT, HONEST[0], notify=broken_notify)
    good = engine.submit(PROMPT, HONEST[1])
    engine.start()
    try:
        assert bad.result(timeout=TIMEOUT_S).token_ids == alone[0]  # its events still arrive
        assert good.result(timeout=TIMEOUT_S).token_ids == alone[1]
        assert len(calls) == 13 and engine._thread.is_alive()     # 12 tokens and the final event
        assert_idle(engine)
    finally:
        engine.shutdown()


def test_queue_bound_holds_after_failures(parts, monkeypatch):
    "Requests refused while being accepted give their wait-list places back: max_queue of them, twice over."
    engine = make_engine(parts, max_queue=4)
    inject("generator", monkeypatch, None)
    for _ in range(2 * engine.config.max_queue):
        handle = engine.submit(PROMPT, hostile(1))
        drain(engine)
        with pytest.raises(EngineError, match="accepting"): handle.result()
    assert_idle(engine)
    handles = [engine.submit(PROMPT, HONEST[0]) for _ in range(engine.config.max_queue)]  # the whole bound is free
    drain(engine)
    assert all(len(h.result().token_ids) == 12 for h in handles)


def test_shutdown_ends_what_outlasts_the_grace_as_abort(parts, monkeypatch):
    engine = make_engine(parts, max_batch_size=1)
    real_run = engine.runner.run
    monkeypatch.setattr(engine.runner, "run", lambda *a: (time.sleep(0.005), real_run(*a))[1])  # >= 1.4 s of work
    long = SamplingParams(temperature=0, max_tokens=280, ignore_eos=True)
    running = engine.submit(PROMPT, long)
    waiting = engine.submit(PROMPT, long)    # never admitted: max_batch_size is 1
    engine.start()
    streamed = []
    for event in running.events(timeout=TIMEOUT_S):
        streamed.append(event)
        if len(streamed) == 3: break
    t0 = time.monotonic()
    engine.shutdown(grace_s=0.2)
    assert time.monotonic() - t0 < 10 and engine._thread is None
    with pytest.raises(EngineError, match="shutting down"):
        engine.submit(PROMPT, long)
    out, queued = running.result(timeout=TIMEOUT_S), waiting.result(timeout=TIMEOUT_S)
    assert out.finish_reason == "abort" and running.error is None and 3 <= len(out.token_ids) < 280
    assert queued.finish_reason == "abort" and queued.token_ids == []
    s = engine.stats()
    assert s.num_requests_aborted == 2 and s.num_requests_cancelled == 0
    assert_idle(engine)


def test_shutdown_within_the_grace_lets_requests_finish(parts, alone):
    engine = make_engine(parts).start()
    handle = engine.submit(PROMPT, HONEST[0])
    engine.shutdown(grace_s=TIMEOUT_S)
    out = handle.result(timeout=TIMEOUT_S)
    assert out.finish_reason == "length" and out.token_ids == alone[0]
    assert engine.stats().num_requests_aborted == 0


def test_shutdown_of_an_engine_driven_by_step(parts):
    engine = make_engine(parts)
    handle = engine.submit(PROMPT, HONEST[0])
    engine.step()
    engine.shutdown()
    assert handle.result(timeout=1).finish_reason == "abort"
    assert_idle(engine)
