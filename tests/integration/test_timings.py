"""Per-request timings and cache inspection through LLM, on a tiny random Qwen3 (pages of 256 tokens)."""
import random
import threading

import pytest

from helios import LLM, SamplingParams
from helios.kv.prefix_cache import HASH_PREFIX_CHARS, prompt_block_hashes

PAGE = 256
KV_BYTES = 16 * 2**20  # the tiny model's KV is 1 KiB a token: 64 pages of 256


@pytest.fixture(scope="module")
def llm(tiny_folder):
    with LLM(tiny_folder, dtype="float32", device="cpu", quiet=True, kv_cache_bytes=KV_BYTES, page_size=PAGE,
             max_batch_size=4) as llm:
        yield llm


def random_prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 40000) for _ in range(n)]


def greedy(max_tokens: int, n: int = 1) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, n=n)


def assert_consistent(m):
    "The stamps are ordered and the intervals add up."
    assert m.arrival_s <= m.first_scheduled_s <= m.first_token_s <= m.finished_s
    assert m.queue_time_s >= 0 and m.prefill_s > 0 and m.decode_s >= 0 and m.prefix_lookup_s > 0
    assert m.ttft_s == pytest.approx(m.queue_time_s + m.prefill_s, abs=1e-9)
    assert m.e2e_s == pytest.approx(m.ttft_s + m.decode_s, abs=1e-9)


def test_a_requests_timings_are_ordered_and_add_up(llm):
    out = llm.generate(random_prompt(40, seed=1), greedy(8), use_tqdm=False)[0]
    m = out.metrics
    assert_consistent(m)
    assert (m.num_prompt_tokens, m.num_output_tokens, m.num_completions) == (40, 8, 1)
    assert m.decode_tokens_per_s == pytest.approx(7 / m.decode_s) and m.decode_tokens_per_s > 0


def test_n_completions_decode_rate_and_summed_admission(llm):
    m = llm.generate(random_prompt(30, seed=2), greedy(6, n=2), use_tqdm=False)[0].metrics
    assert_consistent(m)
    assert m.num_completions == 2 and m.decode_tokens_per_s == pytest.approx((12 - 2) / m.decode_s)


def test_one_token_has_no_decode_rate(llm):
    m = llm.generate(random_prompt(20, seed=3), greedy(1), use_tqdm=False)[0].metrics
    assert_consistent(m)
    assert m.num_output_tokens == 1 and m.decode_tokens_per_s is None


def test_a_repeated_long_prompt_is_cached_and_the_report_shows_its_blocks(llm):
    prompt = random_prompt(3 * PAGE + 10, seed=4)    # three full pages and 10 tokens
    first = llm.generate(prompt, greedy(4), use_tqdm=False)[0]
    second = llm.generate(prompt, greedy(4), use_tqdm=False)[0]
    assert first.metrics.num_cached_tokens == 0 and second.metrics.num_cached_tokens == 3 * PAGE
    assert_consistent(second.metrics)
    report = llm.inspect_cache()
    ours = {h.hex()[:HASH_PREFIX_CHARS]: depth for depth, h in enumerate(prompt_block_hashes(prompt, PAGE), 1)}
    blocks = [b for b in report.blocks if b.hash in ours]
    assert [b.depth for b in blocks] == [1, 2, 3] and [ours[b.hash] for b in blocks] == [1, 2, 3]
    assert all(b.hits >= 1 and b.num_tokens == PAGE and b.idle_s is not None and b.idle_s >= 0 for b in blocks)
    assert blocks[0].parent is None and [b.parent for b in blocks[1:]] == [b.hash for b in blocks[:2]]
    assert report.page_size == PAGE and report.num_used_pages == 0
    assert report.num_free_pages + report.num_cached_pages == report.num_pages
    assert report.totals.hit_tokens >= 3 * PAGE and report.totals.queried_tokens >= 6 * PAGE


def test_inspect_cache_while_the_engine_thread_runs(llm):
    prompt = random_prompt(2 * PAGE + 5, seed=5)
    llm.generate(prompt, greedy(2), use_tqdm=False)  # leaves its two blocks cached
    handle = llm.submit(prompt, greedy(400))
    next(handle.events(timeout=60))                  # the first token: the request holds its pages now
    reports, errors = [], []

    def ask():
        try: reports.extend(llm.inspect_cache(timeout=30) for _ in range(10))
        except Exception as e: errors.append(e)
    askers = [threading.Thread(target=ask) for _ in range(4)]
    for t in askers: t.start()
    for t in askers: t.join()
    llm.cancel(handle.request_id)
    handle.result(timeout=60)
    assert not errors and len(reports) == 40
    ours = {h.hex()[:HASH_PREFIX_CHARS] for h in prompt_block_hashes(prompt, PAGE)}
    for report in reports:
        assert report.num_free_pages + report.num_used_pages + report.num_cached_pages == report.num_pages
    running = [r for r in reports if r.num_used_pages > 0]
    assert running, "some report was taken while the request ran"
    held = [b for b in running[0].blocks if b.hash in ours]
    assert [(b.depth, b.hits, b.idle_s) for b in held] == [(1, 1, None), (2, 1, None)]
