"""The Q8_0 matmul (appendix 92's `Q8_0Linear`, the `c-q8_0` matmul): each variant this CPU runs equals the exact
product of the per-block quantized activations and the Q8_0 blocks to float32 rounding, and the float product of the
dequantized weights to the activations' rounding; a row's bits never depend on the rows beside it; the blocks are the
file's bytes; the variant comes from the CPU's flags; and a tiny Q8_0 GGUF gives the dequantized float model's tokens."""

import numpy as np
import pytest
import torch

from conftest import TEST_KV_BYTES
from gguf_writer import gguf_from_parts, tiny_llama_parts
from kernel_support import builds, needs_kernels
from helios.formats.gguf import GGUFFile
from helios.kernels.attention import CKernels
from helios.kernels.build import Q8_VARIANTS, KernelUnavailable, q8_variant, q8_variants
from helios.kernels.matmul import CHalfLinear, Q8_0Linear, matmul_q8_0_kernel, q8_0_blocks

CPU = torch.device("cpu")
SHOWN_AS = {"avx512-vnni": "AVX512-VNNI", "avx2": "AVX2", "generic": "generic"}
SUM_TOLERANCE = 2**-20    # float32 sums of exact integer partial sums, relative to the sum of the products' magnitudes
FLOAT_TOLERANCE = 0.01    # the activations' rounding, relative to the float product's magnitude sum (~0.3% measured)


def runs_here(variant: str) -> bool:
    try:
        matmul_q8_0_kernel(variant=variant)
        return True
    except KernelUnavailable:
        return False


VARIANTS = [v for v in Q8_VARIANTS if runs_here(v)]  # every variant this machine runs (portable C wherever C builds)
needs_q8 = needs_kernels(builds(matmul_q8_0_kernel))  # skipped where no kernel builds; failed under HELIOS_REQUIRE_KERNELS=1


def quantize_rows(x: torch.Tensor, nb: int) -> tuple[torch.Tensor, torch.Tensor]:
    "x [M, K] per block of 32: int8 values (as int64) [M, nb, 32] and float32 scales [M, nb], as the kernel makes them."
    m, k = x.shape
    xb = torch.zeros(m, nb * 32)
    xb[:, :k] = x
    xb = xb.view(m, nb, 32)
    dx = xb.abs().amax(-1) / 127
    v = xb * torch.where(dx == 0, 0, 1 / dx)[..., None]
    return (v.trunc() + v.sign() * ((v - v.trunc()).abs() >= 0.5)).to(torch.int64), dx  # ties away from zero


def exact_q8(x: torch.Tensor, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    "The exact product (float64) of x quantized per block and the Q8_0 blocks, and the sum of its products' magnitudes."
    nb = blocks.shape[1] // 34
    qx, dx = quantize_rows(x, nb)
    w = blocks.view(-1, nb, 34)
    dw = w[..., :2].contiguous().view(torch.float16)[..., 0].double()  # [N, nb]
    qw = w[..., 2:].contiguous().view(torch.int8).to(torch.int64)      # [N, nb, 32]
    dots = torch.einsum("mbj,nbj->mnb", qx, qw).double()               # integer dot products, exact in int64
    magnitudes = torch.einsum("mbj,nbj->mnb", qx.abs(), qw.abs()).double()
    scales = dx.double()[:, None, :] * dw[None]                         # [M, N, nb]
    return (scales * dots).sum(-1), (scales.abs() * magnitudes).sum(-1)


def dequantized(blocks: torch.Tensor, k: int) -> torch.Tensor:
    w = blocks.view(blocks.shape[0], -1, 34)
    return (w[..., :2].contiguous().view(torch.float16).float() * w[..., 2:].contiguous().view(torch.int8).float()).flatten(1)[:, :k]


def test_blocks_are_the_gguf_bytes_and_dequantize_back():
    "q8_0_blocks is gguf's (llama.cpp's) quantizer; re-quantizing a Q8_0 tensor's dequantized weights gives its bytes."
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize
    w = np.random.default_rng(0).standard_normal((48, 96)).astype(np.float32)
    file_bytes = quantize(w, Q.Q8_0)
    assert file_bytes.shape == (48, 3 * 34)  # 34 bytes per 32 weights
    blocks = q8_0_blocks(torch.from_numpy(dequantize(file_bytes, Q.Q8_0)))
    assert np.array_equal(blocks.numpy(), file_bytes)
    padded = q8_0_blocks(torch.ones(2, 40))  # K padded to 64 with zeros
    assert padded.shape == (2, 68) and torch.equal(dequantized(padded, 64)[:, 40:], torch.zeros(2, 24))


@needs_q8
@pytest.mark.parametrize("variant", VARIANTS)
def test_activations_are_quantized_as_the_reference_does(variant):
    fn = matmul_q8_0_kernel(variant=variant)
    x = torch.randn(5, 70) * 3
    x[1, :32] = 0  # a block of zeros: scale 0, values 0
    x[2, 0] = 127 * 2.5 / 127  # a value on a tie
    x[3, :64] = (torch.randint(-127, 127, (64,)) + 0.5).float()  # two whole blocks of ties: with each block's largest
    x[3, 0], x[3, 32] = 127.0, -127.0                            # |x| 127 the step is 1, so n + 1/2 rounds away from 0
    nb = 3
    xq, xd = torch.empty(5, nb * 32, dtype=torch.int8), torch.empty(5, nb)
    fn.quantize_rows(x.data_ptr(), 5, 70, xq.data_ptr(), xd.data_ptr(), 1)
    qx, dx = quantize_rows(x, nb)
    assert torch.equal(xq.view(5, nb, 32).to(torch.int64), qx) and torch.equal(xd, dx)


@needs_q8
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n_out, n_in", [(40, 64), (17, 50), (9, 96), (576, 1536), (1536, 576), (6144, 2048)])
def test_each_variant_is_the_exact_q8_product_and_no_row_depends_on_another(variant, n_out, n_in, threads):
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(n_out + n_in)
    weight, bias, x = (torch.randn(n_out, n_in, generator=gen) * 0.05, torch.randn(n_out, generator=gen),
                       torch.randn(33, n_in, generator=gen))
    linear = Q8_0Linear(weight, None, matmul_q8_0_kernel(variant=variant))
    assert linear.packed.dtype == torch.uint8 and linear.packed.numel() == n_out * -(-n_in // 32) * 34
    every = linear(x)
    exact, scale = exact_q8(x, linear.packed)
    assert ((every.double() - exact).abs() <= SUM_TOLERANCE * scale).all()
    w = dequantized(linear.packed, n_in)  # against float activations times the dequantized weights
    assert ((every - x @ w.T).abs() <= FLOAT_TOLERANCE * (x.abs() @ w.abs().T)).all()
    assert torch.equal(Q8_0Linear(weight, bias, linear.matmul)(x), every + bias)
    for m in (1, 2, 3, 7, 16, 33):  # a row alone, or among a few, has the bits it has among 33
        assert torch.equal(linear(x[:m]), every[:m]), m
        assert torch.equal(linear(x[33 - m:]), every[33 - m:]), m
    torch.set_num_threads(1)
    assert torch.equal(linear(x), every)  # and on one thread (the threads split the outputs, never a sum)


@needs_q8
def test_non_contiguous_empty_and_batched_inputs():
    linear = Q8_0Linear(torch.randn(48, 64), None, matmul_q8_0_kernel())
    x = torch.randn(64, 10).t()  # [10, 64], not contiguous
    torch.testing.assert_close(linear(x), exact_q8(x, linear.packed)[0].float(), atol=1e-4, rtol=1e-5)
    assert linear(torch.randn(0, 64)).shape == (0, 48)
    assert linear(torch.randn(2, 5, 64)).shape == (2, 5, 48)


VNNI_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c", "avx512_vnni"})


def test_the_variant_comes_from_the_cpu_flags(monkeypatch):
    monkeypatch.delenv("HELIOS_Q8_ISA", raising=False)
    assert q8_variants(VNNI_FLAGS) == ("avx512-vnni", "avx2", "generic")
    assert q8_variant(VNNI_FLAGS - {"avx512_vnni"}) == "avx2"
    assert q8_variant(frozenset({"sse2"})) == "generic"
    assert q8_variant(VNNI_FLAGS, requested="generic") == "generic"
    with pytest.raises(KernelUnavailable, match="HELIOS_Q8_ISA=avx512-vnni, but this CPU runs avx2, generic"):
        q8_variant(VNNI_FLAGS - {"avx512_vnni"}, requested="avx512-vnni")
    monkeypatch.setenv("HELIOS_Q8_ISA", "amx")
    with pytest.raises(ValueError, match="HELIOS_Q8_ISA must be one of avx512-vnni, avx2, generic, got 'amx'"):
        q8_variant(VNNI_FLAGS)


def test_it_is_opt_in_and_never_for_exact_weights():
    from helios.registry import Unavailable, choose
    assert choose("matmul", device=CPU, exact=False).implementation.name != "c-q8_0"  # auto never takes it
    with pytest.raises(Unavailable, match="must stay as loaded"):
        choose("matmul", "c-q8_0", device=CPU, exact=True)


def q8_0_gguf(folder) -> str:
    "A tiny llama GGUF whose every linear (and the embedding) is Q8_0."
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize
    fields, tensors = tiny_llama_parts(layers=2)
    rng = np.random.default_rng(1)
    q8 = [(name, shape, int(Q.Q8_0), quantize((rng.standard_normal(shape) * 0.1).astype(np.float32), Q.Q8_0).tobytes())
          if len(shape) == 2 else (name, shape, kind, data) for name, shape, kind, data in tensors]
    path = folder / "tiny-q8_0.gguf"
    path.write_bytes(gguf_from_parts(fields, q8).data)
    return str(path)


@needs_q8
def test_a_q8_0_gguf_stays_near_the_dequantized_model_and_batched_is_alone(tmp_path):
    """Next-token log-probabilities on 64 prompts of a tiny Q8_0 GGUF against the dequantized float32 model: the same
    top token on at least 62 (64 measured) and |Δ log p| of the float model's top token at most 0.01 (0.0018 measured;
    the activations' rounding). The modules hold the file's own blocks, a layer is one C call, and greedy tokens
    batched are the tokens alone, bit for bit."""
    import random

    from helios import LLM, SamplingParams
    path = q8_0_gguf(tmp_path)
    rng = random.Random(0)
    prompts = [[rng.randrange(62) for _ in range(rng.randrange(1, 40))] for _ in range(64)]
    one = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
    with LLM(path, dtype="float32", quiet=True, kv_cache_bytes=TEST_KV_BYTES) as exact:
        want = [o.outputs[0].logprobs[0] for o in exact.generate(prompts, one)]
    with LLM(path, matmul="c-q8_0", quiet=True, kv_cache_bytes=TEST_KV_BYTES) as packed:
        linears = [m for m in packed.model.modules() if isinstance(m, CHalfLinear)]
        assert linears and all(isinstance(m, Q8_0Linear) for m in linears)
        reader = GGUFFile(path)  # the blocks it holds are the file's bytes, 34 per 32 weights (the head is tied)
        for name, module in [("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj"), ("token_embd.weight", "lm_head")]:
            file_bytes = next(t.data for t in reader.tensors if t.name == name)
            assert np.array_equal(packed.model.get_submodule(module).packed.numpy(), file_bytes)
        backend = packed.engine.runner.backend
        if isinstance(backend, CKernels):  # decoder_layer is handed matmul_q8_0: a layer is still one C call
            assert backend.layers.layer_weights(packed.model.model.layers[0]) is not None
        got = [o.outputs[0].logprobs[0] for o in packed.generate(prompts, one)]
        greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        together = [o.outputs[0].token_ids for o in packed.generate(prompts[:6], greedy)]
        alone = [packed.generate([p], greedy)[0].outputs[0].token_ids for p in prompts[:6]]
    assert sum(g.top[0][0] == w.top[0][0] for g, w in zip(got, want)) >= 62
    assert all(abs(dict(g.top).get(w.top[0][0], -99.0) - w.logprob) <= 0.01 for g, w in zip(got, want))
    assert together == alone
