"""The blocked prefill attention (appendix 92, `blocked_prefill` and the opt-in `c-blocked` backend): equal to the
reference attention on GQA shapes, chunks that are not a multiple of the tile, cached prefixes and scattered pages of
float32 and float16; `auto` keeps the `c` kernels, whose rows are bit for bit a decode row's."""
import random

import pytest
import torch

from conftest import TEST_KV_BYTES
from helios import LLM, SamplingParams
from helios.attention.base import choose_backend
from helios.attention.reference import reference_attention
from helios.config import ModelConfig
from helios.kernels.attention import PREFILL_BLOCKED_MIN, QUERY_TILE, CKernels, blocked_prefill, c_kernels
from helios.kernels.build import LAYER_SOURCES, build_kernels
from helios.kv.batch import build_paged_batch
from helios.kv.pages import pages_needed
from kernel_support import builds, needs_kernels

CPU = torch.device("cpu")
needs_compiler = needs_kernels(builds(lambda: build_kernels(64, 3, 3, sources=LAYER_SOURCES)))


def attention_config(num_heads, num_kv_heads, head_dim) -> ModelConfig:
    return ModelConfig(architecture="llama", vocab_size=8, hidden_size=num_heads * head_dim, intermediate_size=8,
                       num_layers=1, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim)


def scattered_tick(seed, num_heads, num_kv_heads, head_dim, page_size, starts, lens, kv_dtype=torch.float32):
    "Random pages in shuffled order, one sequence per (start, len): a chunk of len new tokens after start cached ones."
    gen = torch.Generator().manual_seed(seed)
    max_pages = max(pages_needed(s + n, page_size) for s, n in zip(starts, lens))
    num_pages = len(lens) * max_pages + 2
    k_pages, v_pages = (torch.randn(num_pages, page_size, num_kv_heads, head_dim, generator=gen).to(kv_dtype)
                        for _ in "kv")
    tables = torch.randperm(num_pages, generator=gen)[:len(lens) * max_pages].view(len(lens), max_pages)
    q = torch.randn(1, sum(lens), num_heads, head_dim, generator=gen) * 2
    return q, k_pages, v_pages, build_paged_batch(tables, starts, lens, page_size)


@pytest.mark.parametrize("shape", [(9, 3, 64, 16), (8, 2, 32, 8), (4, 4, 16, 256), (16, 1, 64, 8), (6, 2, 80, 48)])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("start,n", [(0, 1), (0, 37), (13, 50), (100, QUERY_TILE + 77), (5, 2 * QUERY_TILE + 3)])
def test_blocked_prefill_equals_the_reference(shape, kv_dtype, start, n):
    num_heads, num_kv_heads, head_dim, page_size = shape
    q, k_pages, v_pages, batch = scattered_tick(start + n, num_heads, num_kv_heads, head_dim, page_size, [start], [n],
                                                kv_dtype)
    got = blocked_prefill(q[0], k_pages, v_pages, batch.page_tables[0], start + n)
    torch.testing.assert_close(got, reference_attention(q, k_pages, v_pages, batch)[0], atol=1e-5, rtol=1e-5)


@needs_compiler
@pytest.mark.parametrize("shape", [(9, 3, 64, 16), (8, 2, 32, 8), (4, 4, 16, 256)])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_c_blocked_mixes_chunks_and_decode_rows(shape, kv_dtype):
    "Long chunks (one after a cached prefix, one crossing pages), a short chunk and decode rows in one tick."
    num_heads, num_kv_heads, head_dim, page_size = shape
    backend = c_kernels(attention_config(num_heads, num_kv_heads, head_dim), kv_dtype, CPU,
                        prefill_min=PREFILL_BLOCKED_MIN)
    starts, lens = [0, 30, 99, 7, 40], [70, 45, 1, PREFILL_BLOCKED_MIN - 1, 1]
    q, k_pages, v_pages, batch = scattered_tick(1, num_heads, num_kv_heads, head_dim, page_size, starts, lens, kv_dtype)
    assert backend.prefill_seqs(batch) == [0, 1]
    for threads in (1, 2):
        torch.set_num_threads(threads)
        torch.testing.assert_close(backend(q, k_pages, v_pages, batch), reference_attention(q, k_pages, v_pages, batch),
                                   atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="pages, got"):  # pages of another dtype are refused, as by the rows
        backend(q, k_pages.to(torch.bfloat16), v_pages.to(torch.bfloat16), batch)


@needs_compiler
def test_auto_keeps_the_rows_and_c_blocked_is_opt_in():
    cfg = attention_config(9, 3, 64)
    assert choose_backend(cfg, torch.float32, CPU).value.prefill_min is None
    chosen = choose_backend(cfg, torch.float32, CPU, "c-blocked").value
    assert isinstance(chosen, CKernels) and chosen.prefill_min == PREFILL_BLOCKED_MIN


@needs_compiler
def test_engine_tokens_with_c_blocked_match_the_torch_backend(tiny_folder):
    "Greedy tokens of a mixed batch (prefills next to decodes, a shared prefix, chunks over pages) through both."
    rng = random.Random(0)
    shared = [rng.randrange(500) for _ in range(40)]
    prompts = [shared + [rng.randrange(500) for _ in range(n)] for n in (1, 5, 30, 90, 7, 60)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outputs = {}
    for attention in ("c-blocked", "torch"):
        with LLM(tiny_folder, dtype="float32", device="cpu", quiet=True, kv_cache_bytes=TEST_KV_BYTES,
                 max_batch_size=4, prefill_chunk_size=48, page_size=16, attention=attention) as llm:
            outputs[attention] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outputs["c-blocked"] == outputs["torch"]
