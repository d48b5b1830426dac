"""The CPU fast path (`batched_attention`) equals the per-sequence reference on every kind of tick."""
import random

import pytest
import torch

from helios.attention.reference import batched_attention, reference_attention
from helios.kv.batch import build_paged_batch
from helios.kv.pages import pages_needed


@pytest.mark.parametrize("seed", range(6))
def test_batched_equals_reference_on_mixed_ticks(seed):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    page_size, num_pages, Hq, Hkv, D = 8, 64, 6, 2, 16
    k_pages = torch.randn(num_pages, page_size, Hkv, D, generator=gen)
    v_pages = torch.randn(num_pages, page_size, Hkv, D, generator=gen)
    num_seqs = rng.randint(2, 9)
    decode_only = seed % 2 == 0
    starts = [rng.randint(0, 40) for _ in range(num_seqs)]  # contexts of 1 to 6 pages: several groups
    lens = [1 if decode_only or rng.random() < 0.6 else rng.randint(2, 9) for _ in range(num_seqs)]
    free = list(range(num_pages)); rng.shuffle(free)         # pages scattered over the pool
    tables = torch.zeros(num_seqs, 8, dtype=torch.long)
    for i, (s, n) in enumerate(zip(starts, lens)):
        for j in range(pages_needed(s + n, page_size)): tables[i, j] = free.pop()
    batch = build_paged_batch(tables, starts, lens, page_size)
    groups = batch.decode_rows
    assert groups is None or sum(len(g.rows) for g in groups) == lens.count(1)
    q = torch.randn(1, sum(lens), Hq, D, generator=gen)
    torch.testing.assert_close(batched_attention(q, k_pages, v_pages, batch),
                               reference_attention(q, k_pages, v_pages, batch), atol=1e-5, rtol=1e-5)
