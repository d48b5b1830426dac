"""Scheduler policy, tensor-free: FIFO, batch cap, decode first, chunked prefill, aging, head-of-queue, bounds."""
import pytest

from helios.config import PREFILL_AGING_S, EngineConfig
from helios.kv.manager import PageManager
from helios.kv.prefix_cache import PrefixCache
from helios.scheduler import QueueFull, RequestTooLarge, Scheduler, Sequence

_ids = iter(range(10**6))


def make(max_batch_size=4, prefill_chunk_size=8, num_pages=16, max_queue=8, max_model_len=1000, kv_reservation="on-demand",
         **settings):
    cfg = EngineConfig(max_batch_size=max_batch_size, prefill_chunk_size=prefill_chunk_size, page_size=4,
                       max_queue=max_queue, kv_reservation=kv_reservation, **settings)
    return Scheduler(cfg, PageManager(num_pages, 4, PrefixCache(60)), max_model_len)


def seq(n, max_tokens=4, t=0.0):
    return Sequence(next(_ids), "r", [7] * n, max_tokens, t, page_size=4)


def advance(s, plan, now):
    s.on_computed(plan, now)
    for c in plan.chunks:
        if c.samples: c.seq.output_ids.append(1)


def test_fifo_admission_and_batch_cap():
    s = make(max_batch_size=2)
    a, b, c = seq(2), seq(2), seq(2)
    s.add([a, b, c])
    s.schedule(0.0)
    assert s.running == [a, b] and list(s.waiting) == [c]
    s.finish(a)
    s.schedule(0.0)
    assert s.running == [b, c] and not s.waiting


def test_decode_first_then_prefill_oldest_first():
    s = make(prefill_chunk_size=6)
    a = seq(2)
    s.add([a]); advance(s, s.schedule(0.0), 0.0)           # a now decodes
    b, c = seq(10, t=1.0), seq(10, t=2.0)
    s.add([b, c])
    plan = s.schedule(0.01)
    assert [(x.seq, x.num_tokens) for x in plan.chunks] == [(a, 1), (b, 5)]
    advance(s, plan, 0.01)
    plan = s.schedule(0.02)
    assert [(x.seq, x.num_tokens) for x in plan.chunks] == [(a, 1), (b, 5)]


def test_aging_rule_moves_a_waiting_prompt_first():
    s = make(prefill_chunk_size=8, prefill_order="oldest-first")
    a, b = seq(40, t=0.0), seq(6, t=0.001)
    s.add([a, b])
    p = s.schedule(0.0); advance(s, p, 0.0)
    assert [x.seq for x in p.chunks] == [a]                # oldest first: a takes the whole budget
    p = s.schedule(0.05); advance(s, p, 0.05)
    assert [x.seq for x in p.chunks] == [a]                # b has waited 50 ms: not yet
    p = s.schedule(0.12)
    assert p.chunks[0].seq is b and p.chunks[0].num_tokens == 6   # b waited >= 100 ms: goes first
    assert 0.12 - 0.0 >= PREFILL_AGING_S


def test_aged_prompts_go_oldest_first_not_round_robin():
    s = make(prefill_chunk_size=8, num_pages=32)
    a, b = seq(24, t=0.0), seq(24, t=0.001)
    s.add([a, b])
    for now in (0.0, 0.5, 1.0):  # every tick longer than the aging threshold: both prompts are always aged
        p = s.schedule(now)
        assert [x.seq for x in p.chunks if not x.samples or x.start < x.seq.num_prompt_tokens] == [a]
        advance(s, p, now)
    assert not a.is_prefilling and b.num_computed_tokens == 0


def test_shortest_prompt_first_ties_to_the_oldest():
    s = make(prefill_chunk_size=8, num_pages=32)
    long, mid, short, twin = seq(20, t=0.0), seq(6, t=0.1), seq(3, t=0.2), seq(3, t=0.3)
    s.add([long, mid, short, twin])
    p = s.schedule(0.3)
    assert [(x.seq, x.num_tokens) for x in p.chunks] == [(short, 3), (twin, 3), (mid, 2)]
    advance(s, p, 0.3)
    p = s.schedule(0.4)  # two decodes, then mid's last 4 (fewer left than long's 20), then long
    assert [(x.seq, x.num_tokens) for x in p.chunks if not x.is_decode] == [(mid, 4), (long, 2)]


def test_oldest_first_order_is_fifo():
    s = make(prefill_chunk_size=8, num_pages=32, prefill_order="oldest-first")
    long, short = seq(20, t=0.0), seq(3, t=0.1)
    s.add([long, short])
    assert [(x.seq, x.num_tokens) for x in s.schedule(0.1).chunks] == [(long, 8)]


def first_chunk_of_a_long_prompt(overdue_s: float, ticks: int = 10) -> float | None:
    "Two 8-token prompts arrive every 0.5 s tick, each able to take the 8-token budget: when does a 24-token one start?"
    s = make(prefill_chunk_size=8, num_pages=128, max_batch_size=64, max_queue=64, prefill_overdue_s=overdue_s)
    long = seq(24, t=0.0)
    s.add([long])
    started = None
    for tick in range(ticks):
        now = 0.5 * tick
        s.add([seq(8, max_tokens=1, t=now), seq(8, max_tokens=1, t=now)])
        plan = s.schedule(now)
        if started is None and any(x.seq is long for x in plan.chunks): started = now
        advance(s, plan, now)
        for x in plan.chunks:
            if x.samples and x.seq is not long: s.finish(x.seq)
    return started


def test_overdue_prompt_goes_first_however_long():
    assert first_chunk_of_a_long_prompt(overdue_s=2.0) == 2.0   # shorter aged prompts first until it is overdue
    assert first_chunk_of_a_long_prompt(overdue_s=1e9) is None  # without the bound it would starve


def test_aged_prompt_moves_even_when_decodes_use_the_budget():
    s = make(prefill_chunk_size=2, max_batch_size=4)
    d1, d2 = seq(1), seq(1)
    s.add([d1, d2]); advance(s, s.schedule(0.0), 0.0)
    late = seq(9)
    s.add([late])
    assert [x.seq for x in s.schedule(0.01).chunks] == [d1, d2]
    assert late in [x.seq for x in s.schedule(0.2).chunks]


def test_head_of_queue_waits_for_pages():
    s = make(num_pages=5, kv_reservation="full")
    hog = seq(12, max_tokens=4)                              # 4 pages
    s.add([hog]); s.schedule(0.0)
    big, small = seq(6, max_tokens=2), seq(1, max_tokens=1)  # big needs 2 pages, 1 is free
    s.add([big, small])
    s.schedule(0.0)
    assert list(s.waiting) == [big, small] and s.running == [hog]   # small does not jump the queue
    s.finish(hog)
    s.schedule(0.0)
    assert s.running == [big, small]


def test_impossible_request_is_refused_with_numbers():
    s = make(num_pages=4, max_model_len=100)
    with pytest.raises(RequestTooLarge, match=r"17 tokens exceed the KV budget of 16 tokens \(4 pages\)"):
        s.add([seq(15, max_tokens=2)])
    with pytest.raises(RequestTooLarge, match="exceed the model's context of 100"):
        make(num_pages=100, max_model_len=100).add([seq(90, max_tokens=20)])
    assert not s.waiting


def test_queue_bound():
    s = make(max_queue=2)
    s.add([seq(1), seq(1)])
    with pytest.raises(QueueFull, match="wait list is full"):
        s.add([seq(1)])
    s.schedule(0.0)
    s.add([seq(1)])                                          # admitted ones left the queue: room again
