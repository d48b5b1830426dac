"""KV memory, without a model: on-demand pages, preemption (swap and recompute), the host tier of the prefix cache.

A stand-in forward writes each token's id and position into the pool through the page tables, and reads a sequence's
whole history back through them before it "samples": every page table, swap, copy back and restore is checked against
the tokens it must hold, so a wrong page anywhere fails here, not as a subtly different completion."""
import random

import pytest
import torch

from helios.config import EngineConfig, tiny_qwen3
from helios.kv.manager import PageManager
from helios.kv.offload import HostKVPool, KVPageCopier
from helios.kv.pool import KVPool
from helios.kv.prefix_cache import PrefixCache, prompt_block_hashes
from helios.scheduler import Scheduler, SeqStatus, Sequence

PAGE, VOCAB = 4, 50
CFG = tiny_qwen3(num_layers=1, num_kv_heads=1, head_dim=2)


class FlakyCopier(KVPageCopier):
    "A real copier that fails when told to, before copying or halfway (K copied, V not): what a driver error does."
    fail = None  # None, "before" or "halfway"

    def _pairs(self):
        pairs = super()._pairs()
        if self.fail == "before": raise RuntimeError("the copy failed")
        if self.fail == "halfway": return self._halfway(pairs)
        return pairs

    @staticmethod
    def _halfway(pairs):
        yield pairs[0]
        raise RuntimeError("the copy failed halfway")


def make(num_pages, num_host_pages=0, reservation="on-demand", max_batch_size=8, chunk=8, caching=True, watermark=0.0):
    kv = KVPool(CFG, num_pages, PAGE, torch.float32, "cpu")
    copier = FlakyCopier(kv, HostKVPool(CFG, num_host_pages, PAGE, torch.float32, pin=False)) if num_host_pages else None
    pages = PageManager(num_pages, PAGE, PrefixCache(60.0) if caching else None, num_host_pages, copier)
    cfg = EngineConfig(max_batch_size=max_batch_size, prefill_chunk_size=chunk, page_size=PAGE, max_queue=1000,
                       kv_reservation=reservation, kv_watermark=watermark)
    return Scheduler(cfg, pages, max_model_len=10_000), kv, copier


def next_token(history: list[int]) -> int:
    "What the stand-in model answers after a history: a function of every token, so a wrong page changes it."
    return (sum((i + 1) * t for i, t in enumerate(history)) * 7 + len(history)) % VOCAB


def write(kv, seq, start, token_ids):
    "Store (token id, position) as the k of each position, through the sequence's page table."
    for pos, t in enumerate(token_ids, start):
        kv.k[0, seq.page_table[pos // PAGE], pos % PAGE, 0] = torch.tensor([t, pos], dtype=torch.float32)


def read(kv, seq, n) -> list[int]:
    "The first n tokens of a sequence as its pages hold them (checking each position too)."
    out = []
    for pos in range(n):
        t, p = kv.k[0, seq.page_table[pos // PAGE], pos % PAGE, 0].tolist()
        assert p == pos, f"position {pos} of sequence {seq.seq_id} holds position {p}"
        out.append(int(t))
    return out


def tick(s, kv, now):
    "One tick of the stand-in engine; returns the plan."
    plan = s.schedule(now)
    for c in plan.chunks:
        write(kv, c.seq, c.start, c.token_ids)
    s.on_computed(plan, now)
    for c in plan.chunks:
        if not c.samples: continue
        history = c.seq.prompt_ids + c.seq.output_ids
        assert read(kv, c.seq, len(history)) == history  # what attention would read is exactly the sequence
        c.seq.output_ids.append(next_token(history))
        if len(c.seq.output_ids) >= c.seq.max_tokens: s.finish(c.seq, now)
    s.pages.check_invariants()
    return plan


def alone(prompt, max_tokens) -> list[int]:
    out = []
    for _ in range(max_tokens): out.append(next_token(prompt + out))
    return out


_ids = iter(range(10**9))


def seq(prompt, max_tokens, t=0.0):
    return Sequence(next(_ids), f"r{len(prompt)}", prompt, max_tokens, t, PAGE)


def run(s, kv, seqs, max_ticks=2000):
    s.add(seqs)
    for t in range(max_ticks):
        if not s.has_work: return t
        tick(s, kv, t * 0.01)
    raise AssertionError("did not finish")


def test_on_demand_admits_on_the_prompt_and_grows_a_page_at_a_time():
    s, kv, _ = make(num_pages=8)
    a = seq(list(range(5)), max_tokens=12)             # full reservation would take 5 pages
    s.add([a]); tick(s, kv, 0.0)
    assert len(a.page_table) == 2 and len(a.output_ids) == 1   # its 5-token prompt: 2 pages
    while len(a.output_ids) < 4: tick(s, kv, 0.0)
    assert len(a.page_table) == 2                       # 8 tokens: still 2 pages
    tick(s, kv, 0.0)
    assert len(a.page_table) == 3                       # the 9th needed a third
    full, kv2, _ = make(num_pages=8, reservation="full")
    b = seq(list(range(5)), max_tokens=12)
    full.add([b]); tick(full, kv2, 0.0)
    assert len(b.page_table) == 5


def test_the_newest_request_is_preempted_and_resumes_first_with_the_same_tokens():
    s, kv, _ = make(num_pages=4)                        # 16 tokens of KV
    old, new = seq(list(range(6)), 8, t=0.0), seq(list(range(20, 26)), 8, t=1.0)
    later = seq(list(range(40, 42)), 2, t=2.0)
    s.add([old, new])
    preempted = []
    for t in range(100):
        if t == 3: s.add([later])
        plan = tick(s, kv, t * 0.01)
        preempted += plan.preempted
        if new in plan.preempted: assert s.resuming[0] is new   # it resumes before `later`, which only waits
        if not s.has_work: break
    assert preempted and preempted[0] is new and old not in preempted
    assert new.swapped_pages is None and s.num_recompute_tokens > 0   # no host tier: recomputed
    for x in (old, new, later): assert x.output_ids == alone(x.prompt_ids, x.max_tokens)


def test_a_preempted_sequence_swaps_to_the_host_tier_when_it_has_room():
    s, kv, _ = make(num_pages=4, num_host_pages=8, caching=False)
    a, b = seq(list(range(6)), 8, t=0.0), seq(list(range(20, 26)), 8, t=1.0)
    run(s, kv, [a, b])
    assert s.num_preemptions >= 1 and s.num_swapped == s.num_preemptions and s.num_recompute_tokens == 0
    for x in (a, b): assert x.output_ids == alone(x.prompt_ids, x.max_tokens)
    assert s.pages.num_host_free_pages == 8 and s.pages.num_swapped_pages == 0


def test_a_prefix_evicted_from_the_device_is_served_from_the_host_tier():
    s, kv, copier = make(num_pages=4, num_host_pages=4)
    shared = list(range(100, 108))                       # two full blocks
    first = seq(shared + [1], 2)
    run(s, kv, [first])
    cache = s.pages.prefix_cache
    assert s.pages.num_cached_pages == 2
    run(s, kv, [seq(list(range(200, 215)), 1)])          # needs every device page: the two blocks go to the host
    assert s.pages.num_host_cached_pages == 2             # (the device now caches the new prompt's three blocks)
    again = seq(shared + [2, 3], 3)
    run(s, kv, [again])
    assert again.num_cached_tokens == 8 and cache.host_hit_tokens == 8 and copier.bytes_to_device > 0
    assert again.output_ids == alone(again.prompt_ids, 3)
    tiers = {b.hash: b.tier for b in cache.blocks(0.0, PAGE)}
    assert [tiers[h.hex()[:16]] for h in prompt_block_hashes(shared, PAGE)] == ["device", "device"]  # moved back


def test_parents_leave_a_tier_after_their_children():
    s, kv, _ = make(num_pages=4, num_host_pages=2)
    first = list(range(100, 113))
    run(s, kv, [seq(first, 1)])                          # three cached blocks: depth 1, 2, 3
    run(s, kv, [seq(list(range(300, 315)), 1)])          # takes all 4 device pages: the three leave the device
    short = [h.hex()[:16] for h in prompt_block_hashes(first, PAGE)]
    on_host = {b.hash: b for b in s.pages.prefix_cache.blocks(0.0, PAGE) if b.tier == "host"}
    assert sorted(on_host) == sorted(short[:2])          # 2 host pages: the deepest block was the one dropped
    assert on_host[short[1]].parent == short[0]
    match = s.pages.match_prefix(prompt_block_hashes(first, PAGE), len(first))
    assert (match.pages, len(match.host_blocks), match.num_cached_tokens) == ([], 2, 8)
    s.pages.check_invariants()


def test_ttl_applies_to_both_tiers():
    s, kv, _ = make(num_pages=4, num_host_pages=4)
    run(s, kv, [seq(list(range(100, 109)), 1)])
    run(s, kv, [seq(list(range(200, 215)), 1)])
    assert s.pages.num_host_cached_pages == 2
    s.pages.expire(now=10_000.0)
    assert s.pages.num_host_cached_pages == 0 and s.pages.num_cached_pages == 0
    assert s.pages.num_host_free_pages == 4 and s.pages.num_free_pages == 4
    s.pages.check_invariants()


def test_the_watermark_keeps_pages_for_running_decodes_but_never_blocks_a_lone_request():
    s, kv, _ = make(num_pages=100, watermark=0.02, chunk=400)       # 2 pages kept free while anything runs
    whole = seq(list(range(399)), 1)                                # 100 pages: the whole pool
    s.add([whole]); tick(s, kv, 0.0)
    assert whole.status is SeqStatus.FINISHED                       # admitted alone, watermark or not
    first, second = seq(list(range(4 * 90)), 2), seq(list(range(500, 500 + 4 * 9)), 2)   # 90 pages, then 9
    s.add([first, second]); s.schedule(0.1)
    assert s.running == [first] and list(s.waiting) == [second]     # 9 would leave 1 page free, fewer than 2
    s.finish(first, 0.2); s.schedule(0.2)
    assert s.running == [second]


def test_full_reservation_never_preempts():
    s, kv, _ = make(num_pages=4, reservation="full")
    seqs = [seq(list(range(10 * i, 10 * i + 5)), 6, t=i) for i in range(4)]
    run(s, kv, seqs)
    assert s.num_preemptions == 0
    for x in seqs: assert x.output_ids == alone(x.prompt_ids, x.max_tokens)


@pytest.mark.parametrize("seed", range(6))
def test_random_workloads_keep_every_token_and_leak_no_page(seed):
    "Many requests over a pool several times too small, shared prefixes, cancels of running, waiting and swapped ones, failing copies."
    rng = random.Random(seed)
    num_host = [0, 3, 8][seed % 3]
    s, kv, copier = make(num_pages=6, num_host_pages=num_host, max_batch_size=rng.choice([2, 4, 8]), chunk=rng.choice([3, 8]))
    systems = [[rng.randrange(VOCAB) for _ in range(8)] for _ in range(2)]
    seqs, cancelled = [], set()
    for t in range(600):
        if len(seqs) < 24 and rng.random() < 0.3:
            prompt = (rng.choice(systems) if rng.random() < 0.6 else []) + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))]
            x = seq(prompt, rng.randint(1, 24 - len(prompt)), t=t)
            s.add([x]); seqs.append(x)
        if copier is not None: copier.fail = rng.choice(["before", "halfway"]) if rng.random() < 0.15 else None
        if rng.random() < 0.05:  # a client goes away: its sequence may be running, waiting, or preempted and swapped
            live = [x for x in seqs if x.status is not SeqStatus.FINISHED]
            if live:
                victim = rng.choice(live)
                s.finish(victim, t * 0.01); cancelled.add(victim.seq_id)
                s.pages.check_invariants()
        tick(s, kv, t * 0.01)
        if len(seqs) == 24 and not s.has_work: break
    assert not s.has_work, "every accepted request ends"
    assert s.num_preemptions > 0 and (num_host == 0 or s.num_swapped > 0)  # the pressure this test is about
    total = sum(x.max_tokens for x in seqs)
    assert total > 3 * 6 * PAGE                        # the work was many times the pool
    for x in seqs:
        if x.seq_id not in cancelled: assert x.output_ids == alone(x.prompt_ids, x.max_tokens), x
    pages = s.pages
    assert pages.num_used_pages == 0 and pages.num_swapped_pages == 0
    pages.expire(now=10**9)
    assert pages.num_free_pages == pages.num_pages and pages.num_host_free_pages == pages.num_host_pages
    pages.check_invariants()


def test_preemptions_happen_in_the_random_workloads():
    "The property test above is only as good as its pressure: the same shape preempts, by swap and by recompute."
    s, kv, _ = make(num_pages=6, num_host_pages=3, max_batch_size=8)
    rng = random.Random(1)
    seqs = [seq([rng.randrange(VOCAB) for _ in range(5)], 16, t=i) for i in range(10)]
    run(s, kv, seqs)
    assert s.num_preemptions > 0 and 0 < s.num_swapped < s.num_preemptions
    for x in seqs: assert x.output_ids == alone(x.prompt_ids, x.max_tokens)


def test_register_stops_at_a_block_another_page_holds():
    "Two requests prefill the same prompt at once: the second caches nothing past the first's blocks."
    mgr = PageManager(8, PAGE, PrefixCache(60.0))
    prompt = list(range(13))
    hashes = prompt_block_hashes(prompt, PAGE)
    a = mgr.allocate(13, mgr.match_prefix(hashes, 13))
    b = mgr.allocate(13, mgr.match_prefix(hashes, 13))
    mgr.register(hashes[:2], a[:2])
    mgr.register(hashes, b)                                 # its first block is a's: it stops there
    assert all(b.page in a for b in mgr.prefix_cache.blocks(0.0, PAGE))
    mgr.prefix_cache.check()
