"""The C float16-weight matmul (appendix 92's `CHalfLinear`, the `c` matmul): equal to the product of the float16-rounded weights and
to fbgemm's, the CPU default where it builds, and a clear fallback or error where it does not."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import TEST_KV_BYTES
from helios import LLM
from helios.kernels.build import ISA_FLAGS, MATMUL_SOURCES, KernelUnavailable, build_library, cpu_isa
from helios.kernels.matmul import CHalfLinear, matmul_kernel, weight_panels
from helios.linears import HalfWeightLinear, PackedLinear, half_weights_available
from helios.registry import choose
from helios.weights import load_model
from kernel_support import builds, needs_kernels

CPU = torch.device("cpu")

needs_compiler = needs_kernels(builds(matmul_kernel))


def runs_here(isa: str) -> bool:
    "True when this CPU can run the variant isa."
    try:
        return cpu_isa(requested=isa) == isa
    except KernelUnavailable:
        return False


VARIANTS = [isa for isa in ISA_FLAGS if runs_here(isa)]  # each variant tested on every machine that can run it
SHOWN_AS = {"avx512": "AVX-512", "avx2": "AVX2", "generic": "generic"}  # how the start-up line names each variant


def choose_matmul(name: str = "auto"):
    "What load_model gets for float32 CPU weights that need not stay exact: the registry's choice."
    return choose("matmul", name, device=CPU, exact=False)


def test_weight_panels_hold_16_outputs_per_step():
    weight = torch.arange(40 * 3, dtype=torch.float32).view(40, 3)  # 40 outputs: three panels, the last padded
    panels = weight_panels(weight)
    assert panels.shape == (3, 3, 16) and panels.dtype == torch.float16
    assert torch.equal(panels[1, 2], weight[16:32, 2].half())          # panel 1, step k = 2: outputs 16..31
    assert torch.equal(panels[2, 0, :8], weight[32:, 0].half()) and not panels[2, :, 8:].any()


@needs_compiler
@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 16, 24, 25, 36, 193, 400])  # every tile height; row blocks
@pytest.mark.parametrize("n_out, n_in", [(40, 24), (576, 576), (37, 101), (960, 576)])  # odd panels and steps
def test_c_matmul_equals_the_float16_weight_product(isa, rows, n_out, n_in, threads):
    torch.set_num_threads(1 + rows % 3)
    gen = torch.Generator().manual_seed(rows * n_out)
    weight, bias = torch.randn(n_out, n_in, generator=gen) * 0.05, torch.randn(n_out, generator=gen)
    x = torch.randn(rows, n_in, generator=gen)
    linear = CHalfLinear(weight, bias, matmul_kernel(isa=isa))
    exact = F.linear(x.double(), weight.half().double(), bias.double()).float()  # float16 weights, exact sums
    torch.testing.assert_close(linear(x), exact, atol=1e-4, rtol=1e-4)
    if half_weights_available():
        torch.testing.assert_close(linear(x), HalfWeightLinear(weight, bias)(x), atol=1e-4, rtol=1e-4)


@needs_compiler
def test_non_contiguous_and_empty_inputs_are_handled():
    weight = torch.randn(48, 32)
    linear = CHalfLinear(weight, None, matmul_kernel())
    x = torch.randn(32, 10).t()  # [10, 32], not contiguous
    torch.testing.assert_close(linear(x), F.linear(x, weight.half().float()), atol=1e-4, rtol=1e-4)
    assert linear(torch.randn(0, 32)).shape == (0, 48)  # no rows: nothing to do
    x = torch.randn(2, 5, 32)  # [B, T, in] -> [B, T, out]
    torch.testing.assert_close(linear(x), F.linear(x, weight.half().float()), atol=1e-4, rtol=1e-4)


@needs_compiler
def test_the_c_matmul_is_the_cpu_default_and_named_at_start_up(tiny_folder, monkeypatch, capsys):
    "Where the CPU has no native bfloat16 products (an AVX2 one, say), `auto` takes the float16-weight C matmul."
    monkeypatch.delenv("HELIOS_ATTENTION", raising=False)
    monkeypatch.delenv("HELIOS_MATMUL", raising=False)
    monkeypatch.setattr("helios.kernels.matmul.native_bf16", lambda: ())  # the `c-bf16` of an AMX CPU: not here
    with LLM(tiny_folder, device="cpu", kv_cache_bytes=TEST_KV_BYTES) as llm:
        linears = [m for m in llm.model.modules() if isinstance(m, (nn.Linear, HalfWeightLinear, CHalfLinear))]
        assert linears and all(isinstance(m, CHalfLinear) for m in linears)  # every layer's products and the head
    assert f"matmuls: C, float16 weights, {SHOWN_AS[cpu_isa()]}" in capsys.readouterr().err  # the variant, named
    monkeypatch.setenv("HELIOS_MATMUL", "fbgemm" if half_weights_available() else "onednn")  # PyTorch's kernels only
    with LLM(tiny_folder, device="cpu", quiet=True, kv_cache_bytes=TEST_KV_BYTES) as llm:
        kind = HalfWeightLinear if half_weights_available() else PackedLinear
        assert any(isinstance(m, kind) for m in llm.model.modules())
        assert not any(isinstance(m, CHalfLinear) for m in llm.model.modules())


AVX512_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c"})


def test_the_variant_is_the_widest_the_cpu_and_pytorch_both_allow(monkeypatch):
    monkeypatch.delenv("HELIOS_CPU_ISA", raising=False)
    assert cpu_isa("AVX512", AVX512_FLAGS) == "avx512"
    assert cpu_isa("AVX512", AVX512_FLAGS - {"avx512bw"}) == "avx2"  # a flag the variant needs is missing
    assert cpu_isa("AVX2", AVX512_FLAGS) == "avx2"                   # PyTorch found AVX2 only (or was told so)
    assert cpu_isa("AVX512", frozenset({"sse4_2"})) == "generic"
    assert cpu_isa("DEFAULT", AVX512_FLAGS) == "generic"
    assert cpu_isa("AVX2", None) == "avx2"                           # no /proc/cpuinfo: PyTorch's word alone


def test_helios_cpu_isa_picks_a_narrower_variant_and_refuses_a_wider_one(monkeypatch):
    monkeypatch.setenv("HELIOS_CPU_ISA", "avx2")
    assert cpu_isa("AVX512", AVX512_FLAGS) == "avx2"
    assert cpu_isa("AVX512", AVX512_FLAGS, requested="generic") == "generic"  # an explicit argument wins
    with pytest.raises(KernelUnavailable, match="HELIOS_CPU_ISA=avx2, but this CPU runs at most generic"):
        cpu_isa("DEFAULT", AVX512_FLAGS)
    monkeypatch.setenv("HELIOS_CPU_ISA", "avx1024")
    with pytest.raises(ValueError, match="HELIOS_CPU_ISA must be one of avx512, avx2, generic, got 'avx1024'"):
        cpu_isa("AVX512", AVX512_FLAGS)


@needs_compiler
def test_each_variant_says_what_it_was_built_as(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    for isa in VARIANTS:
        assert matmul_kernel(isa=isa).isa == SHOWN_AS[isa]
    assert len(list(tmp_path.rglob("*.so"))) == len(VARIANTS)  # one library per variant, side by side in the cache


def test_no_compiler_falls_back_to_fbgemm_or_fails_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    if half_weights_available():  # elsewhere "auto" keeps float32 weights and never tries the kernel
        with pytest.warns(RuntimeWarning, match=r"matmul: c is unavailable, falling back \(no C compiler"):
            assert choose_matmul("auto").implementation.name == "fbgemm"
    with pytest.raises(KernelUnavailable, match="no C compiler"):
        choose_matmul("c")
    assert choose_matmul("torch").value.make is None  # PyTorch's own nn.Linear
    with pytest.raises(ValueError, match="matmul must be one of auto, c, c-bf16, (c-int8, )?(c-packed, )?(c-q8_0, )?fbgemm, onednn, torch, got 'fast'"):
        choose_matmul("fast")


@needs_compiler
def test_a_broken_library_in_the_cache_is_built_again(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    path = build_library(MATMUL_SOURCES)
    path.write_bytes(b"not a shared library")
    linear = CHalfLinear(torch.randn(16, 8), None, matmul_kernel())
    assert path.read_bytes()[:4] == b"\x7fELF"
    x = torch.randn(3, 8)
    torch.testing.assert_close(linear(x), F.linear(x, linear.packed.float().transpose(1, 2).reshape(16, 8)))


def test_load_model_refuses_an_unknown_matmul_value(smollm2_gguf):
    with pytest.raises(ValueError, match="matmul must be one of"):
        load_model(smollm2_gguf, matmul="fast")


@needs_compiler
def test_a_compiler_without_openmp_gives_no_single_threaded_matmul(tmp_path, monkeypatch):
    "On one thread the kernel would be slower than PyTorch's matmuls: fall back (auto) or say why (c)."
    wrapper = tmp_path / "cc-without-openmp"
    wrapper.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && exit 1; done\nexec cc "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(KernelUnavailable, match="-fopenmp"):
        choose_matmul("c")
    if half_weights_available():
        with pytest.warns(RuntimeWarning, match="matmul: c is unavailable, falling back"):
            assert choose_matmul("auto").implementation.name == "fbgemm"
