"""Priority (vLLM's `priority`: an int, lower first, FIFO among equals) orders admission and picks who is preempted;
it never changes a request's tokens. And `max_model_len` caps the context the engine serves."""
import pytest
import torch

from helios import LLM, SamplingParams
from helios.config import EngineConfig, tiny_qwen3
from helios.engine import Engine
from helios.kv.manager import PageManager
from helios.model.qwen3 import CausalLM
from helios.reference import generate
from helios.sampling import InvalidParam
from helios.scheduler import MAX_PRIORITY, RequestTooLarge, Scheduler, Sequence
from helios.tokenizer import load_tokenizer
from helios.weights import default_model_path

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def scheduler(num_pages: int = 16, **settings) -> Scheduler:
    cfg = EngineConfig(**{"max_batch_size": 1, "prefill_chunk_size": 16, "page_size": 4, **settings})
    return Scheduler(cfg, PageManager(num_pages, 4), max_model_len=64)


def seq(i: int, t: float, priority: int = 0, n: int = 3, max_tokens: int = 4) -> Sequence:
    return Sequence(i, f"r{i}", list(range(10 * i, 10 * i + n)), max_tokens, t, page_size=4, priority=priority)


def test_the_wait_list_is_ordered_by_priority_then_arrival():
    s = scheduler(max_queue=16)
    seqs = [seq(0, 0.0), seq(1, 0.1, 2), seq(2, 0.2, -1), seq(3, 0.3), seq(4, 0.4, -1), seq(5, 0.5, 2)]
    for x in seqs: s.add([x])
    assert [x.seq_id for x in s.waiting] == [2, 4, 0, 3, 1, 5]   # lower first; equal priorities stay FIFO
    admitted = []
    while s.waiting:
        s.schedule(1.0)
        (running,) = s.running
        admitted.append(running.seq_id)
        s.finish(running, 1.0)
    assert admitted == [2, 4, 0, 3, 1, 5]


def test_all_equal_priorities_are_plain_fifo():
    s = scheduler(max_queue=16)
    for i in range(5): s.add([seq(i, 0.1 * i, priority=7)])
    assert [x.seq_id for x in s.waiting] == list(range(5))


def test_preemption_picks_the_worst_priority_then_the_newest():
    s = Scheduler(EngineConfig(max_batch_size=4, prefill_chunk_size=32, page_size=4), PageManager(6, 4), 64)
    old_low, new_high, newest_high = seq(0, 0.0, 1, n=5, max_tokens=8), seq(1, 0.1, 0, n=5, max_tokens=8), seq(2, 0.2, 0, n=1)
    s.add([old_low, new_high, newest_high])
    plan = s.schedule(0.0)
    for t in range(1, 5):
        s.on_computed(plan, t)
        for c in plan.chunks:
            if c.samples: c.seq.output_ids.append(7)
        plan = s.schedule(t)
        if plan.preempted: break
    assert plan.preempted == (old_low,)          # the oldest, but the worst priority
    assert newest_high in s.running and new_high in s.running


def test_a_better_priority_resumes_or_waits_ahead_by_priority_first():
    s = scheduler(max_queue=16)
    preempted, waiting = seq(0, 0.0, priority=1), seq(1, 0.1, priority=0)
    s.resuming.append(preempted); s.add([waiting])
    assert s._next_queue() is s.waiting              # a better priority goes before a preempted worse one
    waiting.priority = 1
    assert s._next_queue() is s.resuming             # a tie: the preempted one, which came first


@pytest.fixture(scope="module")
def tiny_engine_parts():
    torch.manual_seed(0)
    model = CausalLM(tiny_qwen3()).eval()
    for p in model.parameters(): p.data.mul_(20)  # peaked logits: greedy picks are clear-cut
    return model, load_tokenizer(default_model_path())


def engine(parts, num_pages=32, **settings) -> Engine:
    model, tok = parts
    config = EngineConfig(**{"page_size": 8, "prefill_chunk_size": 16, **settings})
    return Engine(model, tok, frozenset(), config, num_pages=num_pages)


def test_a_better_priority_overtakes_a_queue_and_gets_its_own_tokens(tiny_engine_parts):
    model = tiny_engine_parts[0]
    e = engine(tiny_engine_parts, max_batch_size=1)
    prompts = [list(range(10 * i + 3, 10 * i + 12)) for i in range(5)]
    running = e.submit(prompts[0], GREEDY)
    e.step()                                           # admitted: it runs
    queued = [e.submit(p, GREEDY) for p in prompts[1:4]]
    e.step()                                           # the three wait
    urgent = e.submit(prompts[4], GREEDY, priority=-1)
    while e.step(): pass
    outs = {h.request_id: h.result() for h in [running, *queued, urgent]}
    first = {k: o.metrics.first_token_s for k, o in outs.items()}
    assert first[running.request_id] < first[urgent.request_id] < min(first[h.request_id] for h in queued)
    queued_firsts = [first[h.request_id] for h in queued]
    assert queued_firsts == sorted(queued_firsts)      # equal priorities: first in, first out
    for h, p in zip([running, *queued, urgent], prompts):
        assert outs[h.request_id].token_ids == generate(model, p, GREEDY.max_tokens)   # as alone, whatever the order


def test_the_worst_priority_is_preempted_and_still_gets_its_own_tokens(tiny_engine_parts):
    model = tiny_engine_parts[0]
    e = engine(tiny_engine_parts, num_pages=4, max_batch_size=4, prefill_chunk_size=32)   # 32 tokens for 2 x 22
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [list(range(20, 30)), list(range(40, 50))]
    low, high = e.submit(prompts[0], params, priority=5), e.submit(prompts[1], params)
    e.step()
    seqs = {s.request_id: s for s in e.scheduler.running}
    while e.step(): pass
    assert seqs[low.request_id].num_preemptions >= 1 and seqs[high.request_id].num_preemptions == 0
    for h, p in zip((low, high), prompts):
        assert h.result().token_ids == generate(model, p, params.max_tokens)


@pytest.mark.parametrize("bad", [MAX_PRIORITY + 1, -MAX_PRIORITY - 1, 1.5, True, "high", None])
def test_a_priority_outside_32_bits_or_not_an_int_is_refused_by_name(tiny_engine_parts, bad):
    e = engine(tiny_engine_parts)
    with pytest.raises(InvalidParam, match="priority must be an integer") as caught:
        e.submit([1, 2, 3], GREEDY, priority=bad)
    assert caught.value.param == "priority"
    e.submit([1, 2, 3], GREEDY, priority=MAX_PRIORITY)
    e.submit([1, 2, 3], GREEDY, priority=-MAX_PRIORITY)


def test_max_model_len_caps_the_engine_and_cannot_pass_the_model(tiny_engine_parts):
    capped = engine(tiny_engine_parts, max_model_len=64)
    assert capped.max_model_len == capped.scheduler.max_model_len == capped.scheduler.max_request_tokens == 64
    assert "longest request 64 tokens (model context 64)" in capped.budget_summary
    with pytest.raises(RequestTooLarge, match="exceed the model's context of 64"):
        capped.submit(list(range(1, 71)), GREEDY)
    with pytest.raises(ValueError, match=r"max_model_len=4,096 is above the model's context \(max_position_embeddings=2,048\)"):
        engine(tiny_engine_parts, max_model_len=4096)
    assert engine(tiny_engine_parts).max_model_len == 2048


def test_llm_takes_max_model_len_and_priority(tiny_folder):
    with pytest.raises(ValueError, match="max_model_len=100,000 is above the model's context"):
        LLM(tiny_folder, quiet=True, max_model_len=100_000)
    with LLM(tiny_folder, quiet=True, max_model_len=64, max_batch_size=1) as llm:
        assert llm.engine.max_model_len == 64
        with pytest.raises(RequestTooLarge, match="context of 64"):
            llm.generate([list(range(1, 71))], GREEDY, use_tqdm=False)
        prompts = [list(range(100, 110)), list(range(200, 210)), list(range(300, 310))]
        plain = llm.generate(prompts, GREEDY, use_tqdm=False)
        ordered = llm.generate(prompts, GREEDY, use_tqdm=False, priority=[3, 2, 1])
        assert [o.token_ids for o in ordered] == [o.token_ids for o in plain]
        assert ordered[2].metrics.first_token_s < ordered[1].metrics.first_token_s  # (the first may start at once)
        assert "".join(llm.stream(prompts[0], GREEDY, priority=-1)) == plain[0].text
        with pytest.raises(ValueError, match="priority has 2 values for 3 prompts"):
            llm.generate(prompts, GREEDY, use_tqdm=False, priority=[0, 1])
        with pytest.raises(InvalidParam, match="priority"):
            llm.generate(prompts, GREEDY, use_tqdm=False, priority=2**40)
