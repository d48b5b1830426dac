"""The prefix cache's report, model-free: blocks, parents and depth, hits counted once per admission, idle ages."""
from helios.config import EngineConfig
from helios.engine import CacheTotals, cache_report
from helios.kv.manager import PageManager
from helios.kv.prefix_cache import HASH_PREFIX_CHARS, PrefixCache, PrefixMatch, prompt_block_hashes
from helios.scheduler import Scheduler, Sequence

PAGE = 4


def manager(num_pages=8, ttl_s=60.0) -> PageManager:
    return PageManager(num_pages, PAGE, PrefixCache(ttl_s))


def admit(mgr: PageManager, prompt: list[int], extra_tokens: int = 2) -> list[int]:
    "Allocate a page table for the prompt, reusing its cached prefix, and register its full blocks."
    hashes = prompt_block_hashes(prompt, PAGE)
    table = mgr.allocate(len(prompt) + extra_tokens, mgr.match_prefix(hashes, len(prompt)))
    mgr.register(hashes, table)
    return table


def summary(mgr: PageManager, now: float) -> list[tuple]:
    return [(b.depth, b.hits, b.idle_s) for b in mgr.prefix_cache.blocks(now, PAGE)]


def test_blocks_chain_parents_and_depth():
    mgr = manager()
    prompt = list(range(13))                          # three full blocks and one token
    table = admit(mgr, prompt)
    hashes = prompt_block_hashes(prompt, PAGE)
    blocks = mgr.prefix_cache.blocks(0.0, PAGE)
    assert [b.hash for b in blocks] == [h.hex()[:HASH_PREFIX_CHARS] for h in hashes]
    assert [b.parent for b in blocks] == [None, blocks[0].hash, blocks[1].hash]
    assert [b.depth for b in blocks] == [1, 2, 3]
    assert [b.page for b in blocks] == table[:3]
    assert all(b.num_tokens == PAGE and b.tier == "device" and b.idle_s is None and b.hits == 0 for b in blocks)


def test_a_fork_shares_the_parent_and_starts_its_own_branch():
    mgr = manager(num_pages=12)
    admit(mgr, list(range(9)))
    admit(mgr, list(range(4)) + [50, 51, 52, 53, 54])  # the same first block, then its own
    blocks = mgr.prefix_cache.blocks(0.0, PAGE)
    first = [b for b in blocks if b.depth == 1]
    second = [b for b in blocks if b.depth == 2]
    assert len(first) == 1 and first[0].hits == 1    # reused by the second prompt
    assert len(second) == 2 and {b.parent for b in second} == {first[0].hash} and {b.hits for b in second} == {0}


def test_hits_and_idle_age_across_release_reuse_and_expiry():
    mgr = manager(ttl_s=60.0)
    table_a = admit(mgr, list(range(9)))
    mgr.release(table_a, now=10.0)
    assert summary(mgr, now=12.5) == [(1, 0, 2.5), (2, 0, 2.5)]
    table_b = admit(mgr, list(range(9)))              # reuses both blocks
    assert summary(mgr, now=13.0) == [(1, 1, None), (2, 1, None)]
    table_c = admit(mgr, list(range(5)))              # reuses the first block only (a 5-token prompt)
    mgr.release(table_b, now=20.0)
    assert summary(mgr, now=21.0) == [(1, 2, None), (2, 1, 1.0)]  # c still holds the first block
    mgr.release(table_c, now=30.0)
    assert summary(mgr, now=31.0) == [(1, 2, 1.0), (2, 1, 11.0)]
    mgr.expire(now=85.0)                              # the second block idle since 20 s: 65 s > the TTL
    assert summary(mgr, now=85.0) == [(1, 2, 55.0)]
    mgr.expire(now=100.0)
    assert mgr.prefix_cache.blocks(100.0, PAGE) == [] and mgr.num_free_pages == mgr.num_pages
    mgr.check_invariants()


def test_eviction_removes_blocks_deepest_first():
    mgr = manager(num_pages=4)
    mgr.release(admit(mgr, list(range(9))), now=0.0)  # two cached idle pages, two free
    table = mgr.allocate(3 * PAGE, PrefixMatch(0, []))  # needs one of the idle pages
    blocks = mgr.prefix_cache.blocks(1.0, PAGE)
    assert [b.depth for b in blocks] == [1] and blocks[0].page not in table
    mgr.release(table, now=1.0)
    mgr.check_invariants()


def test_a_lookup_counts_when_its_sequence_is_admitted_not_while_it_waits():
    cfg = EngineConfig(max_batch_size=4, prefill_chunk_size=16, page_size=PAGE, max_queue=8, kv_reservation="full")
    sched = Scheduler(cfg, manager(num_pages=4), max_model_len=64)
    cache = sched.pages.prefix_cache
    prompt = list(range(9))

    def seq(i: int, ids: list[int], max_tokens: int) -> Sequence:
        return Sequence(i, f"r{i}", ids, max_tokens, 0.0, PAGE)

    first = seq(0, prompt, 3)
    sched.add([first])
    plan = sched.schedule(0.0)
    sched.on_computed(plan, 0.0)
    sched.finish(first, now=0.0)                      # leaves two cached blocks
    blocker = seq(1, [100, 101, 102, 103], 4)         # the two free pages
    sched.add([blocker]); sched.schedule(0.0)
    again = seq(2, prompt, 7)                         # needs the two cached pages and two more
    sched.add([again])
    for t in (0.1, 0.2, 0.3, 0.4): sched.schedule(t)
    assert sched.waiting[0] is again and cache.lookups == 2 and summary(sched.pages, 0.4) == [(1, 0, 0.4), (2, 0, 0.4)]
    sched.finish(blocker, now=0.4); sched.schedule(0.5)
    assert again in sched.running and again.num_cached_tokens == 8 and again.prefix_lookup_s > 0
    assert cache.lookups == 3 and summary(sched.pages, 0.5) == [(1, 1, None), (2, 1, None)]


def test_cache_report_counts_pages_and_totals():
    mgr = manager(num_pages=8)
    held = admit(mgr, list(range(9)))                 # 3 pages held, 2 of them cached blocks
    mgr.release(admit(mgr, list(range(20, 29))), now=0.0)  # 2 cached idle pages
    report = cache_report(mgr, now=1.0)
    assert (report.num_pages, report.num_used_pages, report.num_cached_pages, report.num_free_pages) == (8, 3, 2, 3)
    assert report.page_size == PAGE and len(report.blocks) == 4
    assert report.totals == CacheTotals(lookups=2, queried_tokens=16, hit_tokens=0)
    admit(mgr, list(range(9)))
    assert cache_report(mgr, now=1.0).totals == CacheTotals(3, 24, 8)
    mgr.release(held)


def test_cache_report_without_a_prefix_cache():
    mgr = PageManager(8, PAGE, None)
    table = mgr.allocate(9, mgr.match_prefix(prompt_block_hashes(list(range(9)), PAGE), 9))
    report = cache_report(mgr, now=0.0)
    assert report.blocks == [] and report.totals == CacheTotals(0, 0, 0) and report.num_used_pages == len(table)
