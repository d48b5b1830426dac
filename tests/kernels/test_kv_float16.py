"""float16 KV pages (`kv_cache_dtype="float16"`): the C kernels built for them read and write float16 pages and equal
the reference attention over the same pages; an engine with them keeps each request's tokens the same batched as
alone, stays near float32 pages, and holds twice the tokens in a budget; the PyTorch backends read them too."""
import pytest
import torch

from conftest import TEST_KV_BYTES, real_text
from helios import LLM, SamplingParams
from helios.attention.reference import BatchedAttention, reference_attention
from helios.config import EngineConfig
from helios.kernels.attention import CKernels, c_kernels
from helios.kernels.build import LAYER_SOURCES, build_kernels
from helios.registry import NotApplicable
from kernel_support import builds, needs_kernels
from test_decode_kernel import attention_config, random_tick

CPU = torch.device("cpu")
needs_compiler = needs_kernels(builds(lambda: build_kernels(64, 3, 3, sources=LAYER_SOURCES, kv_half=True)))


def test_the_setting_is_checked():
    assert EngineConfig(kv_cache_dtype="float16").kv_cache_dtype == "float16"
    assert EngineConfig.from_env({"HELIOS_KV_CACHE_DTYPE": "bfloat16"}).kv_cache_dtype == "bfloat16"
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, float32, float16, bfloat16, got 'int8'"):
        EngineConfig(kv_cache_dtype="int8")


@needs_compiler
@pytest.mark.parametrize("shape", [(9, 3, 64, 16), (8, 2, 32, 8), (4, 4, 16, 256), (16, 1, 64, 8)])
@pytest.mark.parametrize("seed", range(3))
def test_the_kernel_over_float16_pages_equals_the_reference(shape, seed, threads):
    "Decode rows and prefill chunks over scattered float16 pages: the reference reads the same pages (upcast exactly)."
    num_heads, num_kv_heads, head_dim, page_size = shape
    backend = c_kernels(attention_config(num_heads, num_kv_heads, head_dim), torch.float16, CPU)
    assert backend.kv_dtype == torch.float16
    torch.set_num_threads(1 + seed % 3)
    q, k_pages, v_pages, batch = random_tick(seed, num_heads, num_kv_heads, head_dim, page_size, seed % 2 == 0)
    k_half, v_half = k_pages.half(), v_pages.half()
    got = backend(q, k_half, v_half, batch)
    torch.testing.assert_close(got, reference_attention(q, k_half, v_half, batch), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, reference_attention(q, k_half.float(), v_half.float(), batch), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="float16 pages, got torch.float32 queries and torch.float32 pages"):
        backend(q, k_pages, v_pages, batch)  # a library built for float16 pages refuses float32 ones


def test_other_page_dtypes_are_refused_by_the_c_kernels():
    with pytest.raises(NotApplicable, match="float32 or float16 K/V pages, not torch.bfloat16"):
        c_kernels(attention_config(4, 2, 16), torch.bfloat16, CPU)


@pytest.mark.parametrize("decode_only", [True, False], ids=["decode-rows", "prefill-chunks"])
def test_the_pytorch_backend_reads_float16_pages_with_float32_queries(decode_only):
    q, k_pages, v_pages, batch = random_tick(1, 8, 2, 32, 8, decode_only)
    want = reference_attention(q, k_pages.half().float(), v_pages.half().float(), batch)
    torch.testing.assert_close(BatchedAttention()(q, k_pages.half(), v_pages.half(), batch), want, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def half_llm(smollm2_gguf):
    with LLM(smollm2_gguf, kv_cache_dtype="float16", matmul="c", quiet=True, kv_cache_bytes=TEST_KV_BYTES,
             max_batch_size=8, prefill_chunk_size=96) as llm:
        yield llm


@needs_compiler
def test_an_engine_with_float16_pages_runs_its_layers_in_c_and_holds_twice_the_tokens(half_llm, smollm2_gguf):
    assert half_llm.engine.kv.k.dtype == torch.float16
    backend = half_llm.engine.runner.backend
    assert isinstance(backend, CKernels) and backend.kv_dtype == torch.float16
    assert backend.layers.layer_weights(half_llm.model.model.layers[0]) is not None  # one C call per layer
    with LLM(smollm2_gguf, quiet=True, kv_cache_bytes=TEST_KV_BYTES, kv_cache_dtype="float32", matmul="c") as full:
        assert half_llm.stats().num_pages in (2 * full.stats().num_pages, 2 * full.stats().num_pages + 1)  # (rounding down)


@needs_compiler
def test_each_request_gets_its_tokens_alone_and_stays_near_float32_pages(half_llm, smollm2_gguf):
    ids = half_llm.tokenizer.encode(real_text())
    prompts = [ids[:300], ids[:300] + ids[900:920], ids[2000:2013], ids[3000:3150], ids[:1]]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = [half_llm.generate([p], greedy)[0].outputs[0].token_ids for p in prompts]
    assert [o.outputs[0].token_ids for o in half_llm.generate(prompts, greedy)] == alone  # batched, chunked, cached
    assert half_llm.stats().prefix_hit_tokens > 0
    one = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
    with LLM(smollm2_gguf, quiet=True, kv_cache_bytes=TEST_KV_BYTES, kv_cache_dtype="float32", matmul="c") as full:
        reference = [o.outputs[0].logprobs[0] for o in full.generate(prompts, one)]
    for got, want in zip((o.outputs[0].logprobs[0] for o in half_llm.generate(prompts, one)), reference):
        assert got.top[0][0] == want.top[0][0] and abs(got.logprob - want.logprob) < 0.02


def test_a_float16_model_is_not_given_the_c_kernels():
    "float16 pages under float16 queries (a float16 model on a CPU): the kernels compute in float32, so PyTorch's backend."
    from helios.attention.base import choose_backend
    assert isinstance(choose_backend(attention_config(4, 2, 16), torch.float16, CPU).value, BatchedAttention)
    with pytest.raises(NotApplicable, match="compute in float32, not torch.float16"):
        c_kernels(attention_config(4, 2, 16), torch.float16, CPU, dtype=torch.float16)
