"""The prefill attention with bfloat16 products (appendix 92's `bf16_prefill`, the opt-in `c-blocked-bf16` attention):
near attention over the bfloat16-rounded inputs on GQA shapes, head sizes 32 to 256, cached prefixes and scattered
float32 and float16 pages; a row's bits never depend on the chunk it is in or the threads; shapes it does not take are
refused; `auto` never takes it; and through the engine, a prompt cut into other chunks, or after a cached prefix,
gives the same log-probabilities bit for bit."""
import pytest
import torch

from conftest import TEST_KV_BYTES
from helios import LLM, SamplingParams
from helios.attention.base import choose_backend
from helios.attention.reference import reference_attention
from helios.kernels.attention import (PREFILL_BLOCKED_MIN, PREFILL_MAX_HEAD, CKernels, bf16_prefill, blocked_prefill,
                                     c_kernels, prefill_bf16_kernel)
from helios.kernels.build import native_bf16
from helios.registry import NotApplicable
from kernel_support import builds, needs_kernels
from test_bf16_accuracy import MAX_GAP, MIN_TOP1
from test_blocked_prefill import attention_config, scattered_tick
from _scripts import load_script

CPU = torch.device("cpu")
HAS_BF16 = "avx512-bf16" in native_bf16()
on_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no AVX512-BF16")
needs_bf16 = needs_kernels(builds(prefill_bf16_kernel) if HAS_BF16 else None)


@pytest.fixture(scope="module")
def kernel():
    return prefill_bf16_kernel()


def rounded_reference(q, k_pages, v_pages, batch) -> torch.Tensor:
    "Attention over q, k and v rounded to bfloat16, in float64."
    return reference_attention(*(t.to(torch.bfloat16).double() for t in (q, k_pages, v_pages)), batch)


@on_bf16
@needs_bf16
@pytest.mark.parametrize("shape", [(9, 3, 64, 16), (16, 8, 128, 8), (4, 1, 256, 256), (2, 2, 32, 48), (6, 2, 96, 16)])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("start,n", [(0, 1), (0, 37), (13, 50), (100, 300), (5, 700)])
def test_bf16_prefill_is_attention_over_rounded_inputs(kernel, shape, kv_dtype, start, n):
    num_heads, num_kv_heads, head_dim, page_size = shape
    q, k_pages, v_pages, batch = scattered_tick(start + n, num_heads, num_kv_heads, head_dim, page_size, [start], [n],
                                                kv_dtype)
    got = bf16_prefill(kernel, q[0], k_pages, v_pages, batch.page_tables[0], start + n)
    assert got.dtype == torch.float32 and got.shape == (n, num_heads, head_dim)
    # P is rounded to bfloat16 too: 8 significant bits of weights that sum to 1, over values of about 1. Measured on
    # an AMD EPYC Zen 4 over these cases: at most 3.7e-3 from the rounded inputs' attention, 2.8e-4 on average; at
    # most 2.2e-2 from the exact inputs'
    difference = (got.double() - rounded_reference(q, k_pages, v_pages, batch)[0]).abs()
    assert difference.max() < 8e-3 and difference.mean() < 6e-4, (difference.max(), difference.mean())
    exact = reference_attention(q.double(), k_pages.double(), v_pages.double(), batch)[0]
    assert (got.double() - exact).abs().max() < 4e-2


@on_bf16
@needs_bf16
@pytest.mark.parametrize("cuts", [(300,), (1, 299), (17, 100, 183), (150, 150), (7, 8, 9, 276)])
@pytest.mark.parametrize("shape", [(9, 3, 64), (6, 2, 96), (4, 1, 256)])
def test_a_row_gets_the_same_bits_in_any_chunk_and_on_any_threads(kernel, threads, cuts, shape):
    "The prompt's 300 rows as chunks after their cached prefix, each chunk a call of its own, on 1 and 2 threads."
    q, k_pages, v_pages, batch = scattered_tick(3, *shape, 16, [20], [300])
    table, whole = batch.page_tables[0], None
    for threads in (2, 1):
        torch.set_num_threads(threads)
        parts, done = [], 20
        for n in cuts:
            parts.append(bf16_prefill(kernel, q[0, done - 20:done - 20 + n], k_pages, v_pages, table, done + n))
            done += n
        got = torch.cat(parts)
        whole = got if whole is None else whole
        assert torch.equal(got, whole), (cuts, threads)
    torch.set_num_threads(2)
    assert torch.equal(bf16_prefill(kernel, q[0], k_pages, v_pages, table, 320), whole)


@on_bf16
@needs_bf16
def test_shapes_it_does_not_take_are_refused(kernel):
    q, k_pages, v_pages, batch = scattered_tick(0, 4, 2, 48, 16, [0], [20])
    with pytest.raises(ValueError, match=r"does not take a head of 48 dims \(it takes 32, 64, \.\.\. 256\)"):
        bf16_prefill(kernel, q[0], k_pages, v_pages, batch.page_tables[0], 20)
    q, k_pages, v_pages, batch = scattered_tick(0, 3, 2, 32, 16, [0], [20])
    with pytest.raises(ValueError, match="3 query heads over 2 KV heads"):
        bf16_prefill(kernel, q[0], k_pages, v_pages, batch.page_tables[0], 20)
    with pytest.raises(ValueError, match=r"keys \(16, 2, 32\) and values \(16, 2, 32\) of 20 tokens"):
        bf16_prefill(kernel, q[0], k_pages, v_pages, batch.page_tables[0][:1], 20)  # a table one page short
    # the C function's own guards, which keep its buffers (PREFILL_MAX_HEAD dims a row) from overflowing
    for n, context, head_dim in [(0, 5, 64), (6, 5, 64), (4, 5, PREFILL_MAX_HEAD + 32), (4, 5, 48)]:
        q, k = torch.zeros(max(n, 1), 2, head_dim), torch.zeros(context, 1, head_dim)
        out = torch.zeros_like(q)
        assert kernel(q.data_ptr(), n, 2, k.data_ptr(), k.data_ptr(), context, 1, head_dim, 1.0, out.data_ptr(),
                      1) == -1
    for head_dim in (48, 288):
        refused = rf"does not take a head of {head_dim} dims \(it takes 32, 64, \.\.\. 256\)"
        with pytest.raises(NotApplicable, match=refused):
            c_kernels(attention_config(4, 2, head_dim), torch.float32, CPU, prefill_min=PREFILL_BLOCKED_MIN, bf16=True)


@on_bf16
@needs_bf16
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_c_blocked_bf16_mixes_chunks_and_decode_rows(kv_dtype):
    "Long chunks through the bfloat16 kernel; the short chunk and the decode rows stay the rows' float32 kernel."
    backend = c_kernels(attention_config(9, 3, 64), kv_dtype, CPU, prefill_min=PREFILL_BLOCKED_MIN, bf16=True)
    starts, lens = [0, 30, 99, 7, 40], [70, 45, 1, PREFILL_BLOCKED_MIN - 1, 1]
    q, k_pages, v_pages, batch = scattered_tick(1, 9, 3, 64, 16, starts, lens, kv_dtype)
    assert backend.prefill_seqs(batch) == [0, 1]
    got = backend(q, k_pages, v_pages, batch)
    rows = slice(115, None)  # the tokens after the two long chunks: rows, as exact as the `c` kernels
    torch.testing.assert_close(got[:, rows], reference_attention(q, k_pages, v_pages, batch)[:, rows], atol=1e-5,
                               rtol=1e-5)
    torch.testing.assert_close(got[:, :115].double(), rounded_reference(q, k_pages, v_pages, batch)[:, :115], atol=1e-2,
                               rtol=0)


@on_bf16
@needs_bf16
def test_auto_keeps_the_rows_and_c_blocked_bf16_is_opt_in():
    cfg = attention_config(9, 3, 64)
    auto = choose_backend(cfg, torch.float32, CPU).value
    assert auto.prefill_min is None and auto.prefill is blocked_prefill
    chosen = choose_backend(cfg, torch.float32, CPU, "c-blocked-bf16").value
    assert isinstance(chosen, CKernels) and chosen.prefill_min == PREFILL_BLOCKED_MIN
    assert chosen.prefill.func is bf16_prefill
    assert chosen.name == "C kernels, chunks of 8+ tokens blocked, AVX512-BF16 products"  # the start-up line's


@on_bf16
@needs_bf16
def test_engine_gives_the_same_bits_however_the_prompt_is_cut(smollm2_gguf):
    """SmolLM2 under c-blocked-bf16: a prompt in chunks of 32 or of 48, or after a cached prefix of 64 tokens, gives
    the same log-probabilities bit for bit (every chunk has at least PREFILL_BLOCKED_MIN tokens); the first token's
    log-probability is near the float32 rows'."""
    from conftest import real_text
    settings = dict(dtype="float32", device="cpu", quiet=True, kv_cache_bytes=TEST_KV_BYTES, page_size=16)
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=5, ignore_eos=True)

    def run(llm, prompts):
        return [[(t.top) for t in o.outputs[0].logprobs] for o in llm.generate(prompts, params, use_tqdm=False)]

    with LLM(smollm2_gguf, attention="c-blocked-bf16", prefill_chunk_size=48, **settings) as llm:
        ids = llm.tokenizer.encode(real_text())[:200]
        shared, prompt = ids[:64], ids[:96]
        alone = run(llm, [prompt])[0]
    with LLM(smollm2_gguf, attention="c-blocked-bf16", prefill_chunk_size=32, **settings) as llm:
        assert run(llm, [prompt])[0] == alone
        run(llm, [shared + ids[150:180]])        # caches the 64 shared tokens (4 pages of 16)
        assert run(llm, [prompt])[0] == alone     # only the last 32 tokens are computed
    with LLM(smollm2_gguf, attention="c", prefill_chunk_size=48, **settings) as llm:
        rows = run(llm, [prompt])[0]
    assert rows[0] != alone[0]  # the chunks went through the bfloat16 kernel: not the rows' bits
    assert rows[0][0][0] == alone[0][0][0] and abs(rows[0][0][1] - alone[0][0][1]) < 0.05


@on_bf16
@needs_bf16
@pytest.mark.slow  # about a minute on two cores: 512 prompts through the float32 model and through the opt-in
def test_c_blocked_bf16_stays_within_autos_tolerance_of_float32():
    "SmolLM2's real weights, 512 windows of real text (each one blocked chunk), auto's matmul: auto's tolerance."
    results, _ = load_script("bf16_accuracy").measure({"bf16": dict(attention="c-blocked-bf16")}, positions=512)
    a = results["bf16"]
    assert a.positions == 512 and a.top1 >= MIN_TOP1 * a.positions and a.max_gap <= MAX_GAP, a
