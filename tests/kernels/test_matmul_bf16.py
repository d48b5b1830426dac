"""The bfloat16 matmul (appendix 92's `CBf16Linear`, the `c-bf16` matmul): each variant this CPU runs equals the
exact product of the bfloat16-rounded inputs to float32 rounding, a row's bits never depend on the rows beside it, the
engine gives each request the tokens it gets alone, the variant is chosen from the CPU's flags, and `auto` takes it
where the CPU multiplies bfloat16 natively."""
import pytest
import torch
import torch.nn.functional as F

from conftest import TEST_KV_BYTES
from helios import LLM, SamplingParams
from helios.kernels.attention import CKernels
from helios.kernels.build import BF16_VARIANTS, KernelUnavailable, bf16_variant
from helios.kernels.matmul import CBf16Linear, CHalfLinear, bf16_panels, matmul_bf16_kernel
from helios.registry import Unavailable, choose

CPU = torch.device("cpu")
SHOWN_AS = {"amx": "AMX", "avx512-bf16": "AVX512-BF16"}


def runs_here(variant: str) -> bool:
    try:
        matmul_bf16_kernel(variant=variant)
        return True
    except KernelUnavailable:
        return False


VARIANTS = [v for v in BF16_VARIANTS if runs_here(v)]  # every variant on every machine that runs it (none elsewhere)
needs_bf16 = pytest.mark.skipif(not VARIANTS, reason="this CPU has neither AMX nor AVX512-BF16")


def exact_bf16(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    "The float64 product of the bfloat16-rounded x and weight (plus bias), and the sum of its terms' magnitudes."
    xb, wb = x.bfloat16().double(), weight.bfloat16().double()
    return F.linear(xb, wb, None if bias is None else bias.double()), F.linear(xb.abs(), wb.abs())


def test_bf16_panels_pair_k_and_pad_with_zeros():
    weight = torch.arange(20 * 35, dtype=torch.float32).view(20, 35)  # two panels, the last of 4; K padded to 64
    panels = bf16_panels(weight)
    assert panels.shape == (2, 32, 16, 2) and panels.dtype == torch.bfloat16
    assert torch.equal(panels[1, 3, :4], weight[16:, 6:8].bfloat16())  # panel 1, pair 3: outputs 16..19, k = 6 and 7
    assert not panels[1, :, 4:].any() and not panels[:, 18:].any() and not panels[:, 17, :, 1].any()  # k >= 35: zeros


@needs_bf16
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n_out, n_in", [(40, 50), (17, 33), (576, 576), (3072, 576), (576, 1536)])
def test_each_variant_is_the_exact_bf16_product_and_no_row_depends_on_another(variant, n_out, n_in, threads):
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(n_out * n_in)
    weight, bias, x = (torch.randn(n_out, n_in, generator=gen), torch.randn(n_out, generator=gen),
                       torch.randn(70, n_in, generator=gen))
    linear = CBf16Linear(weight, bias, matmul_bf16_kernel(variant=variant))
    every = linear(x)
    exact, scale = exact_bf16(x, weight, bias)
    assert ((every.double() - exact).abs() <= 1e-6 * scale + 1e-6).all()  # float32 sums of exact products
    for m in range(1, 71):  # every tile height and remainder: a row alone has the bits it has among 70
        assert torch.equal(linear(x[:m]), every[:m]), m
    torch.set_num_threads(1)
    assert torch.equal(linear(x), every)  # and on one thread (the threads split the outputs, never a sum)


@needs_bf16
def test_non_contiguous_empty_and_batched_inputs():
    weight = torch.randn(48, 32)
    linear = CBf16Linear(weight, None, matmul_bf16_kernel())
    x = torch.randn(32, 10).t()  # [10, 32], not contiguous
    torch.testing.assert_close(linear(x), exact_bf16(x, weight, None)[0].float(), atol=1e-5, rtol=1e-5)
    assert linear(torch.randn(0, 32)).shape == (0, 48)
    assert linear(torch.randn(2, 5, 32)).shape == (2, 5, 48)


AMX_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c", "avx512_bf16", "amx_tile",
                       "amx_bf16"})


def test_the_variant_comes_from_the_cpu_flags(monkeypatch):
    monkeypatch.delenv("HELIOS_BF16_ISA", raising=False)
    assert bf16_variant(AMX_FLAGS) == "amx"
    assert bf16_variant(AMX_FLAGS - {"amx_bf16"}) == "avx512-bf16"
    assert bf16_variant(AMX_FLAGS, requested="avx512-bf16") == "avx512-bf16"
    with pytest.raises(KernelUnavailable, match="need AMX or AVX512-BF16, and this CPU lists neither"):
        bf16_variant(AMX_FLAGS - {"avx512_bf16"})
    with pytest.raises(KernelUnavailable, match="HELIOS_BF16_ISA=amx, but this CPU runs avx512-bf16"):
        bf16_variant(AMX_FLAGS - {"amx_tile"}, requested="amx")
    monkeypatch.setenv("HELIOS_BF16_ISA", "avx10")
    with pytest.raises(ValueError, match="HELIOS_BF16_ISA must be one of amx, avx512-bf16, got 'avx10'"):
        bf16_variant(AMX_FLAGS)


def test_auto_takes_it_where_the_cpu_multiplies_bf16_and_never_for_exact_weights(monkeypatch):
    "auto: c-bf16 on a CPU with AMX or AVX512-BF16 (with float16 KV pages), the float16-weight `c` on an AVX2 one."
    chosen = choose("matmul", device=CPU, exact=False)
    assert (chosen.implementation.name == "c-bf16") == bool(VARIANTS)
    if VARIANTS: assert chosen.value.kv_dtype == torch.float16 and chosen.value.weight_dtype == torch.bfloat16
    with pytest.raises(Unavailable, match="must stay as loaded"):
        choose("matmul", "c-bf16", device=CPU, exact=True)
    assert choose("matmul", device=CPU, exact=True).implementation.name != "c-bf16"  # --dtype float32: exact
    monkeypatch.setattr("helios.kernels.build.cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))
    with pytest.raises(Unavailable, match="no native bfloat16 products"):  # an AVX2-only CPU: refused, with the reason
        choose("matmul", "c-bf16", device=CPU, exact=False)
    chosen = choose("matmul", device=CPU, exact=False)  # and passed over without a warning, the reason kept
    assert chosen.implementation.name != "c-bf16" and any("no native bfloat16" in r for r in chosen.passed_over)


@needs_bf16
def test_the_default_llm_runs_it_with_float16_pages_and_says_so(smollm2_gguf, monkeypatch, capsys):
    for name in ("HELIOS_MATMUL", "HELIOS_KV_CACHE_DTYPE", "HELIOS_BF16_ISA"): monkeypatch.delenv(name, raising=False)
    with LLM(smollm2_gguf, kv_cache_bytes=TEST_KV_BYTES) as llm:
        assert llm.engine.kv.k.dtype == torch.float16 and isinstance(llm.model.lm_head, CBf16Linear)
    line = capsys.readouterr().err
    assert f"{SHOWN_AS[VARIANTS[0]]} on this CPU (matmul c-bf16; --dtype float32 for exact float32 weights)" in line
    with LLM(smollm2_gguf, kv_cache_bytes=TEST_KV_BYTES, kv_cache_dtype="float32", quiet=True) as llm:
        assert llm.engine.kv.k.dtype == torch.float32  # an explicit kv_cache_dtype wins
    with LLM(smollm2_gguf, dtype="float32", kv_cache_bytes=TEST_KV_BYTES, quiet=True) as llm:
        assert llm.engine.kv.k.dtype == torch.float32 and not any(isinstance(m, CHalfLinear) for m in llm.model.modules())


@pytest.fixture(scope="module")
def bf16_llm(smollm2_gguf):
    if not VARIANTS: pytest.skip("this CPU has neither AMX nor AVX512-BF16")
    with LLM(smollm2_gguf, matmul="c-bf16", quiet=True, kv_cache_bytes=TEST_KV_BYTES, max_batch_size=8,
             prefill_chunk_size=96) as llm:
        yield llm


def test_the_engine_gives_each_request_its_tokens_alone(bf16_llm):
    "Batched, chunked (96-token chunks) and prefix-cached with c-bf16: the tokens each prompt gets alone."
    from helios.bench.workloads import real_text
    ids = bf16_llm.tokenizer.encode(real_text())
    prompts = [ids[:300], ids[:300] + ids[900:920], ids[2000:2013], ids[3000:3150], ids[:1]]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = [bf16_llm.generate([p], greedy)[0].outputs[0].token_ids for p in prompts]
    together = [o.outputs[0].token_ids for o in bf16_llm.generate(prompts, greedy)]
    assert together == alone
    assert bf16_llm.stats().prefix_hit_tokens > 0


def test_its_layers_run_as_one_c_call_with_bf16_panels(bf16_llm):
    linears = [m for m in bf16_llm.model.modules() if isinstance(m, CHalfLinear)]
    assert linears and all(isinstance(m, CBf16Linear) and m.packed.dtype == torch.bfloat16 for m in linears)
    backend = bf16_llm.engine.runner.backend
    assert isinstance(backend, CKernels)
    layer = bf16_llm.model.model.layers[0]
    assert backend.layers.layer_weights(layer) is not None  # decoder_layer is handed matmul_bf16


def test_its_logits_stay_near_the_float32_model(bf16_llm, smollm2_gguf):
    "The stated tolerance: next-token log-probabilities within 0.15 of exact float32 weights (0.075 at most measured over 64 prompts) the same top token."
    from helios.bench.workloads import real_text
    ids = bf16_llm.tokenizer.encode(real_text())
    prompts = [ids[i:i + 64] for i in range(0, 3200, 400)]
    one = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
    with LLM(smollm2_gguf, dtype="float32", quiet=True, kv_cache_bytes=TEST_KV_BYTES) as exact:
        reference = [o.outputs[0].logprobs[0] for o in exact.generate(prompts, one)]
    for got, want in zip((o.outputs[0].logprobs[0] for o in bf16_llm.generate(prompts, one)), reference):
        assert got.top[0][0] == want.top[0][0]
        assert abs(got.logprob - want.logprob) < 0.15
