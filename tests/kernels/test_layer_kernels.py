"""The C kernels for the rest of a decoder layer (appendix 92's `LayerOps` and `DecoderLayers`, in `CKernels`): each function equals the PyTorch
operators it replaces, a packed forward through them equals the PyTorch forward (logits and the K/V it writes), and
engines give the same greedy tokens on either path."""
import ctypes
import random
import shutil

import pytest
import torch
import torch.nn.functional as F

from conftest import TEST_KV_BYTES, save_tiny
from helios import LLM, SamplingParams
from helios.attention.base import PagedKV, choose_backend
from helios.attention.reference import BatchedAttention
from helios.config import ModelConfig, tiny_llama, tiny_qwen3
from helios.kernels import abi
from helios.kernels.abi import Tick, check_abi, check_layout
from helios.kernels.attention import CKernels, c_kernels
from helios.kernels.build import KernelUnavailable
from helios.kernels.matmul import CHalfLinear, matmul_kernel
from helios.kv.batch import build_paged_batch
from helios.kv.pool import KVPool
from helios.linears import HalfWeightLinear, half_weights_available
from helios.model.attention import Attention, apply_rope, rope_cos_sin, rope_inv_freq
from helios.model.layers import RMSNorm
from helios.model.qwen3 import CausalLM, DecoderLayer
from helios.profiler import decoding_engine, profile_ticks
from helios.tokenizer import load_tokenizer
from helios.weights import load_model, replace_linears
from kernel_support import builds, needs_kernels, skip_or_fail

CPU = torch.device("cpu")
CLOSE = dict(atol=2e-5, rtol=2e-5)


def kernels_for(cfg: ModelConfig) -> CKernels:
    return c_kernels(cfg, torch.float32, CPU)


def ten_calls_of(fused: CKernels) -> CKernels:
    "The same library without the one-call layers: the ten calls per layer (or PyTorch's layer)."
    num_heads, num_kv_heads, head_dim = fused.shape
    return CKernels(fused.library, head_dim, num_heads, num_kv_heads, one_call_layers=False)


def matmul_kind(model) -> type | None:
    "The class of the model's packed linears (CHalfLinear, HalfWeightLinear...), or None if they are nn.Linear."
    return next((type(m) for m in model.modules() if hasattr(m, "packed")), None)


def layer_config(qk_norm: bool, hidden: int, inter: int, num_heads: int = 4, num_kv_heads: int = 2,
                 head_dim: int = 16) -> ModelConfig:
    return ModelConfig(architecture="qwen3" if qk_norm else "llama", vocab_size=8, hidden_size=hidden, num_layers=2,
                       num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, intermediate_size=inter,
                       qk_norm=qk_norm)


needs_compiler = needs_kernels(builds(lambda: kernels_for(layer_config(False, 64, 128))))


@needs_compiler
@pytest.mark.parametrize("rows, dim, num_threads", [(1, 576, 1), (16, 576, 2), (3, 20, 2), (200, 576, 2), (130, 1000, 3)])
def test_rms_norm_with_and_without_the_residual(rows, dim, num_threads, threads):
    "Widths that are not multiples of 8 take the scalar tail; 200 x 576 floats take the threaded path."
    torch.set_num_threads(num_threads)
    gen = torch.Generator().manual_seed(rows)
    ops = kernels_for(layer_config(False, 64, 128)).ops
    norm = RMSNorm(dim, eps=1e-5)
    with torch.no_grad(): norm.weight.normal_(generator=gen)
    x, residual = torch.randn(1, rows, dim, generator=gen) * 3, torch.randn(1, rows, dim, generator=gen)
    normed, same = ops.rms_norm(x, norm)
    assert same is x
    torch.testing.assert_close(normed, norm(x), **CLOSE)
    normed, total = ops.rms_norm(x, norm, residual)
    torch.testing.assert_close(total, x + residual, **CLOSE)
    torch.testing.assert_close(normed, norm(x + residual), **CLOSE)


@needs_compiler
@pytest.mark.parametrize("rows, inter", [(1, 1536), (16, 1536), (5, 13), (64, 1536)])
def test_silu_mul_over_the_whole_float_range(rows, inter, threads):
    "Values from -100 to 100 (exp8 sees only -|g|), widths with a tail, and a threaded size."
    torch.set_num_threads(2)
    ops = kernels_for(layer_config(False, 64, 128)).ops
    values = torch.linspace(-100, 100, rows * 2 * inter)
    gate_up = values[torch.randperm(values.numel(), generator=torch.Generator().manual_seed(inter))].view(rows, 2 * inter)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(ops.silu_mul(gate_up), F.silu(gate) * up, **CLOSE)


@needs_compiler
@pytest.mark.parametrize("qk_norm, num_heads, num_kv_heads, head_dim, tokens",
                         [(True, 4, 2, 32, 7), (False, 9, 3, 64, 16), (True, 16, 8, 128, 300), (False, 6, 2, 40, 1)])
def test_rope_store_rotates_q_and_writes_k_and_v_to_their_slots(qk_norm, num_heads, num_kv_heads, head_dim, tokens,
                                                                 threads):
    torch.set_num_threads(2)
    cfg = layer_config(qk_norm, num_heads * head_dim, 64, num_heads, num_kv_heads, head_dim)
    backend, gen = kernels_for(cfg), torch.Generator().manual_seed(tokens)
    ops = backend.ops
    attn = Attention(cfg, layer_idx=1)
    if qk_norm:
        with torch.no_grad(): attn.q_norm.weight.normal_(generator=gen); attn.k_norm.weight.normal_(generator=gen)
    pool = KVPool(cfg, num_pages=24, page_size=16, dtype=torch.float32, device="cpu")
    tables = torch.randperm(24, generator=gen)[:20].view(1, 20)
    batch = build_paged_batch(tables, [13], [tokens], 16)  # positions 13 .. 13 + tokens - 1, scattered pages
    cos, sin = rope_cos_sin(batch.positions[None], rope_inv_freq(head_dim, 1e6))
    qkv = torch.randn(1, tokens, cfg.q_size + 2 * cfg.kv_size, generator=gen)
    q = ops.rope_store(qkv, cos, sin, DecoderLayer(cfg, 1, attention=attn).fused_weights(), PagedKV(pool, batch, backend))
    q_ref, k_ref, v_ref = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
    q_ref, k_ref = q_ref.view(1, tokens, num_heads, head_dim), k_ref.view(1, tokens, num_kv_heads, head_dim)
    if qk_norm: q_ref, k_ref = attn.q_norm(q_ref), attn.k_norm(k_ref)
    torch.testing.assert_close(q, apply_rope(q_ref, cos, sin), **CLOSE)
    expected = KVPool(cfg, num_pages=24, page_size=16, dtype=torch.float32, device="cpu")
    expected.write(1, batch.slot_mapping, apply_rope(k_ref, cos, sin)[0], v_ref[0].view(tokens, num_kv_heads, head_dim))
    torch.testing.assert_close(pool.k, expected.k, **CLOSE)  # every other slot and layer untouched (still zero)
    torch.testing.assert_close(pool.v, expected.v, **CLOSE)


def packed_forward(model, backend, pool: KVPool, chunks: list[list[int]], starts: list[int],
                   tables: torch.Tensor | None = None, logits_at: list[int] | None = None) -> torch.Tensor:
    """One packed forward of chunks, sequence i's tokens from position starts[i], eight pages each -> logits [N, vocab],
    or [len(logits_at), vocab] at those token indices."""
    tables = torch.arange(len(chunks) * 8).view(len(chunks), 8) if tables is None else tables
    batch = build_paged_batch(tables, starts, [len(c) for c in chunks], pool.page_size)
    ids = torch.tensor([t for c in chunks for t in c])
    at = None if logits_at is None else torch.tensor(logits_at, dtype=torch.long)
    with torch.no_grad():
        return model(ids[None], batch.positions[None], PagedKV(pool, batch, backend), at, run_layer=backend.run_layer)[0]


@needs_compiler
@pytest.mark.parametrize("kind", ["qwen3_tied", "llama"])
def test_a_packed_forward_through_the_c_layers_equals_pytorch(kind, tmp_path, threads):
    "Two ticks (prefill, then prefill chunks next to a decode row): logits and the K/V written, on either path."
    torch.set_num_threads(2)
    model = load_model(save_tiny(kind, tmp_path), dtype="float32", device="cpu").model
    kernels = kernels_for(model.config)
    ran = []
    count_run_layer(kernels, ran)
    rng = random.Random(0)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (40, 21, 70)]
    starts = [20, 20, 30]
    logits, pools = {}, {}
    for name, backend in (("c", kernels), ("torch", BatchedAttention())):
        pools[name] = KVPool(model.config, num_pages=24, page_size=16, dtype=torch.float32, device="cpu")
        first = packed_forward(model, backend, pools[name], [p[:s] for p, s in zip(prompts, starts)], [0, 0, 0])
        second = packed_forward(model, backend, pools[name], [p[s:] for p, s in zip(prompts, starts)], starts)
        logits[name] = torch.cat([first, second])  # chunks of 20 and 40 tokens, and one decode row
    assert len(ran) == 2 * model.config.num_layers and all(r is not None for r in ran)  # the C path ran every layer
    torch.testing.assert_close(logits["c"], logits["torch"], atol=1e-4, rtol=1e-4)
    # K/V of layers after the first depend on attention, summed in another order by the kernel than by SDPA
    torch.testing.assert_close(pools["c"].k, pools["torch"].k, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pools["c"].v, pools["torch"].v, atol=1e-4, rtol=1e-4)


def c_matmul_model(cfg: ModelConfig) -> CausalLM:
    "A random model with fused projections, all of them CHalfLinear (the CPU default's layout)."
    try: matmul = matmul_kernel()
    except KernelUnavailable as e: skip_or_fail(f"the C matmul does not build here: {e}")
    torch.manual_seed(0)
    model = CausalLM(cfg).eval()  # projections fused at construction
    replace_linears(model, lambda weight, bias=None: CHalfLinear(weight, bias, matmul))
    return model


def two_ticks(model, backend, page_size: int = 16) -> tuple[torch.Tensor, KVPool]:
    "A prefill tick, then chunks of 20 and 50 tokens next to a decode row, over scattered pages: (logits, the pool)."
    rng = random.Random(0)
    prompts = [[rng.randrange(model.config.vocab_size) for _ in range(n)] for n in (40, 21, 70)]
    num_pages = 3 * -(-72 // page_size)
    pool = KVPool(model.config, num_pages=num_pages, page_size=page_size, dtype=torch.float32, device="cpu")
    tables = torch.randperm(num_pages, generator=torch.Generator().manual_seed(1)).view(3, -1)
    first = packed_forward(model, backend, pool, [p[:20] for p in prompts], [0, 0, 0], tables)
    second = packed_forward(model, backend, pool, [p[20:] for p in prompts], [20, 20, 20], tables)
    return torch.cat([first, second]), pool


def count_calls(backend: CKernels) -> list:
    "Record every decoder_layer call of backend."
    calls, call = [], backend.layers._decoder_layer
    backend.layers._decoder_layer = lambda *args: calls.append(args) or call(*args)
    return calls


@needs_compiler
@pytest.mark.parametrize("cfg, page_size", [
    (tiny_qwen3(), 16),                                              # hidden 64 < heads x head_dim 128
    (tiny_llama(), 8),
    (tiny_qwen3(attention_bias=True, tie_word_embeddings=False), 16),
    (tiny_llama(hidden_size=128, intermediate_size=96), 16),         # hidden 128 > heads x head_dim 64
    (tiny_qwen3(head_dim=128, num_kv_heads=1), 32)], ids=["qwen3", "llama", "qwen3-qkv-bias", "llama-wide", "qwen3-d128"])
def test_one_call_per_layer_equals_the_ten_calls_bit_for_bit(cfg, page_size, threads):
    torch.set_num_threads(2)
    model = c_matmul_model(cfg)
    fused = kernels_for(cfg)
    assert isinstance(fused, CKernels) and fused.layers is not None
    ten_calls = ten_calls_of(fused)
    calls = count_calls(fused)
    logits, pool = two_ticks(model, fused, page_size)
    assert len(calls) == 2 * cfg.num_layers  # every layer of both ticks was one call
    measured = fused.measured_s()
    assert set(measured) == {"matmul", "attention"} and all(s > 0 for s in measured.values())  # both were timed
    ten_logits, ten_pool = two_ticks(model, ten_calls, page_size)
    assert torch.equal(logits, ten_logits) and torch.equal(pool.k, ten_pool.k) and torch.equal(pool.v, ten_pool.v)


def packed_logits_at(model, backend, page_size: int, rows: list[int]) -> tuple[torch.Tensor, KVPool]:
    "two_ticks' prefill tick with logits at rows only (the last layer runs on those): (logits [len(rows), vocab], pool)."
    rng = random.Random(0)
    prompts = [[rng.randrange(model.config.vocab_size) for _ in range(n)] for n in (40, 21, 70)]
    pool = KVPool(model.config, num_pages=3 * -(-40 // page_size), page_size=page_size, dtype=torch.float32, device="cpu")
    tables = torch.randperm(pool.k.shape[1], generator=torch.Generator().manual_seed(1)).view(3, -1)
    chunks = [prompts[0][:40], prompts[1], prompts[2][:40]]
    return packed_forward(model, backend, pool, chunks, [0, 0, 0], tables, logits_at=rows), pool


@needs_compiler
@pytest.mark.parametrize("cfg", [tiny_qwen3(), tiny_llama(), tiny_qwen3(attention_bias=True, tie_word_embeddings=False),
                                 tiny_llama(hidden_size=128, intermediate_size=48)],  # hidden > 2 x intermediate
                         ids=["qwen3", "llama", "qwen3-qkv-bias", "llama-wide"])
def test_the_last_layer_runs_only_on_the_rows_whose_logits_are_taken(cfg, threads):
    "One call or ten: logits at some rows equal the full forward's at those rows bit for bit, the same K/V written."
    torch.set_num_threads(2)
    model = c_matmul_model(cfg)
    fused = kernels_for(cfg)
    ten_calls = ten_calls_of(fused)
    rows = [39, 60, 5, 100]  # the chunks' last tokens, out of order, and one inside the first chunk
    for backend in (fused, ten_calls):
        calls = count_calls(fused)
        full, full_pool = packed_logits_at(model, backend, 16, list(range(101)))
        some, pool = packed_logits_at(model, backend, 16, rows)
        assert torch.equal(some, full[rows]) and torch.equal(pool.k, full_pool.k) and torch.equal(pool.v, full_pool.v)
        if backend is fused:  # the last layer's call returned 4 rows: its last argument
            assert [c[-1] for c in calls] == [101] * cfg.num_layers + [101] * (cfg.num_layers - 1) + [4]
    with pytest.raises(IndexError, match="not all indices of the tick's 101 tokens"):
        packed_logits_at(model, fused, 16, [3, 101])
    with pytest.raises(IndexError, match="102 rows asked of a tick of 101 tokens"):
        packed_logits_at(model, fused, 16, [0] * 102)
    assert torch.equal(packed_logits_at(model, fused, 16, [-1, -62])[0], full[[100, 39]])  # as x[:, rows] counts
    torch.testing.assert_close(packed_logits_at(model, BatchedAttention(), 16, rows)[0], full[rows], atol=1e-4, rtol=1e-4)


@needs_compiler
def test_a_tick_that_samples_no_row_still_writes_every_k_and_v(threads):
    "Prompt chunks that end no prompt: no logits, and on every path the pool holds what a full forward writes."
    torch.set_num_threads(2)
    cfg = tiny_qwen3()
    model = c_matmul_model(cfg)
    fused = kernels_for(cfg)
    ten_calls = ten_calls_of(fused)
    for backend in (fused, ten_calls, BatchedAttention()):
        _, full_pool = packed_logits_at(model, backend, 16, list(range(101)))
        none, pool = packed_logits_at(model, backend, 16, [])
        assert none.shape == (0, cfg.vocab_size)
        assert torch.equal(pool.k, full_pool.k) and torch.equal(pool.v, full_pool.v) and pool.k.abs().sum() > 0


def four_decoding_rows(folder):
    "An engine on the tiny model as the CPU default loads it (C matmuls), four requests all decoding; else skip."
    loaded = load_model(folder, device="cpu")
    if loaded.matmul is None or loaded.matmul.implementation.name != "c": pytest.skip("the C matmul is not the default here")
    tok = load_tokenizer(folder)
    return decoding_engine(loaded.model, tok, tok.eos_token_ids, [[5 + i] * 20 for i in range(4)])


@needs_compiler
def test_a_decode_tick_asks_for_every_row_so_nothing_is_gathered(tiny_folder):
    "Every row of a decode-only tick samples: the engine passes no rows, and the last layer runs as the others do."
    engine = four_decoding_rows(tiny_folder)
    calls = count_calls(engine.runner.backend)
    engine.step()
    num_layers = engine.runner.model.config.num_layers
    assert [(c[4], c[5]) for c in calls] == [(None, 4)] * num_layers  # rows NULL, m = all 4 rows, in every layer

@needs_compiler
def test_layers_that_cannot_be_one_call_take_the_ten_calls():
    "float32 (oneDNN) projections, or a bias where decoder_layer has none: the ten calls, same logits as PyTorch."
    cfg = tiny_llama()
    model = c_matmul_model(cfg)
    down = model.model.layers[1].mlp.down_proj
    model.model.layers[1].mlp.down_proj = CHalfLinear(torch.randn(down.out_features, down.in_features) * 0.05,
                                                      torch.randn(down.out_features), down.matmul)
    model.model.layers[0].post_attention_layernorm.eps *= 2  # decoder_layer takes one eps for both norms
    fused = kernels_for(cfg)
    calls = count_calls(fused)
    logits, _ = two_ticks(model, fused)
    assert fused.layers.layer_weights(model.model.layers[0]) is None and fused.layers.layer_weights(model.model.layers[1]) is None
    assert not calls
    torch.testing.assert_close(logits, two_ticks(model, BatchedAttention())[0], atol=1e-4, rtol=1e-4)
    plain = CausalLM(cfg).eval()  # nn.Linear projections
    fused = kernels_for(cfg)
    assert fused.layers.layer_weights(plain.model.layers[0]) is None
    torch.testing.assert_close(two_ticks(plain, fused)[0], two_ticks(plain, BatchedAttention())[0], atol=1e-4, rtol=1e-4)


@needs_compiler
def test_a_tick_the_fused_layer_cannot_read_takes_the_ten_calls():
    "A pool of another head size, or bfloat16 pages: no decoder_layer call, and the ten calls decline too (PyTorch)."
    cfg = tiny_llama()
    model = c_matmul_model(cfg)
    fused = kernels_for(cfg)
    calls = count_calls(fused)
    batch = build_paged_batch(torch.arange(8).view(1, 8), [0], [5], 16)
    x, (cos, sin) = torch.randn(1, 5, cfg.hidden_size), rope_cos_sin(batch.positions[None], model.inv_freq)
    layer = model.model.layers[0]
    for pool in (KVPool(tiny_llama(head_dim=8), num_pages=8, page_size=16, dtype=torch.float32, device="cpu"),
                 KVPool(cfg, num_pages=8, page_size=16, dtype=torch.bfloat16, device="cpu")):
        kv = PagedKV(pool, batch, fused)
        assert fused.layers.tick(fused.layers.layer_weights(layer), x, cos, sin, kv) is None
        assert fused.layers.run(layer, x, cos, sin, kv) is None and fused.ops.run(layer, x, cos, sin, kv) is None
    assert not calls


@needs_compiler
def test_the_profile_splits_a_fused_tick(tiny_folder):
    "profile_ticks on the CPU default: the fused layers' clocks give the matmul and attention parts."
    engine = four_decoding_rows(tiny_folder)
    assert isinstance(engine.runner.backend, CKernels) and engine.runner.backend.layers is not None
    profile = profile_ticks(engine, ticks=3)
    assert profile.parts_ms["matmul"] > 0 and profile.parts_ms["attention"] > 0
    assert sum(profile.parts_ms.values()) == pytest.approx(profile.tick_ms, rel=1e-6)


@needs_compiler
def test_unfused_layers_and_other_dtypes_take_the_pytorch_path():
    cfg = layer_config(True, 64, 128)
    kernels = kernels_for(cfg)
    layer = DecoderLayer(cfg, 0)  # fused at construction
    pool = KVPool(cfg, num_pages=4, page_size=16, dtype=torch.float32, device="cpu")
    batch = build_paged_batch(torch.arange(4).view(1, 4), [0], [3], 16)
    cos, sin = rope_cos_sin(batch.positions[None], rope_inv_freq(cfg.head_dim, 1e6))
    kv = PagedKV(pool, batch, kernels)
    x = torch.randn(1, 3, 64)
    unfused = DecoderLayer(cfg, 0)
    unfused.self_attn = torch.nn.Identity()  # not chapter 02's attention: no fused_weights(), nothing the C functions read
    assert kernels.ops.run(unfused, x, cos, sin, kv) is None
    assert kernels.ops.run(layer, x.bfloat16(), cos, sin, kv) is None
    assert kernels.ops.run(layer, x, cos, sin, kv) is not None


@needs_compiler
@pytest.mark.parametrize("kind", ["qwen3_tied", "llama"])
def test_engines_give_the_same_greedy_tokens_on_either_path(kind, tiny_folder, tmp_path):
    "A mixed batch: prefill chunks next to decode rows, several pages, a shared prefix, on both paths."
    folder = save_tiny(kind, tmp_path, vocab_size=49152)
    for name in ("tokenizer.json", "tokenizer_config.json"): shutil.copy(tiny_folder / name, folder / name)
    rng = random.Random(1)
    shared = [rng.randrange(512) for _ in range(40)]
    prompts = [shared + [rng.randrange(512) for _ in range(n)] for n in (1, 5, 30, 90, 7, 60)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs, ran = {}, []
    for attention in ("c", "torch"):
        with LLM(folder, dtype="float32", device="cpu", quiet=True, kv_cache_bytes=TEST_KV_BYTES, max_batch_size=4,
                 prefill_chunk_size=48, page_size=16, attention=attention) as llm:
            backend = llm.engine.runner.backend
            assert isinstance(backend, CKernels) == (attention == "c")
            if attention == "c": count_run_layer(backend, ran)
            outputs[attention] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outputs["c"] == outputs["torch"]
    assert ran and all(r is not None for r in ran)  # the C path ran every layer of every tick


def count_run_layer(backend: CKernels, ran: list):
    "Record, for every layer backend.run_layer runs, what its C path (one call, else ten) returned: None where both declined."
    outputs = []
    for path in [p for p in (backend.layers, backend.ops) if p is not None]:
        path.run = lambda *args, _run=path.run: outputs.append(out := _run(*args)) or out
    run_layer = backend.run_layer
    def recorded(*args):
        outputs.clear()
        out = run_layer(*args)
        ran.append(next((o for o in outputs if o is not None), None))
        return out
    backend.run_layer = recorded


@needs_compiler
def test_the_cpu_default_c_everywhere_gives_the_tokens_of_pytorch_on_the_same_weights(tiny_folder):
    """dtype='auto': float16 weights through the C matmul and the C layers, against the same weights through fbgemm and
    PyTorch's layers (attention='torch'). How far float16 weights are from float32 ones: tests/integration/test_parity.py."""
    if not half_weights_available(): pytest.skip("this PyTorch build has no fbgemm float16-weight linear to compare with")
    rng = random.Random(2)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (3, 17, 64, 130)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outputs, ran = {}, []
    for attention in ("auto", "torch"):
        with LLM(tiny_folder, device="cpu", quiet=True, kv_cache_bytes=TEST_KV_BYTES, max_batch_size=4,
                 prefill_chunk_size=64, page_size=16, attention=attention,
                 matmul="c" if attention == "auto" else "fbgemm") as llm:
            assert matmul_kind(llm.model) is (CHalfLinear if attention == "auto" else HalfWeightLinear)
            if attention == "auto":
                backend = llm.engine.runner.backend
                assert isinstance(backend, CKernels) and backend.layers is not None
                count_run_layer(backend, ran)
            outputs[attention] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
            if attention == "auto":  # every layer ran as one C call
                assert all(backend.layers.layer_weights(layer) is not None for layer in llm.model.model.layers)
    assert outputs["auto"] == outputs["torch"]
    assert ran and all(r is not None for r in ran)


def without(structure: type[ctypes.Structure], field: str) -> type[ctypes.Structure]:
    "A Structure like structure with one field dropped: what Python would send if kernels.h gained a field."
    return type(f"{structure.__name__}Without_{field}", (ctypes.Structure,),
                {"_fields_": [f for f in structure._fields_ if f[0] != field]})


@needs_compiler
def test_the_abi_check_catches_a_structure_that_is_not_the_c_struct():
    "A field dropped at the end changes the size; one dropped in the middle may not, but the offsets change."
    library = ctypes.CDLL(str(kernels_for(layer_config(False, 64, 128)).library))
    assert check_abi(library) is library  # the Structures as written agree with kernels.h
    short = without(Tick, "clocks")
    with pytest.raises(KernelUnavailable, match=f"struct tick is {ctypes.sizeof(Tick)} bytes in C but "
                                                f"{short.__name__} is {ctypes.sizeof(short)} bytes in Python"):
        check_layout(library, "tick", short)
    middle = without(Tick, "threads")
    assert ctypes.sizeof(middle) == ctypes.sizeof(Tick)  # padding hides it from the size
    with pytest.raises(KernelUnavailable, match="has fields at offsets .* in C but"):
        check_layout(library, "tick", middle)


@needs_compiler
def test_a_library_whose_structs_disagree_is_refused_and_auto_falls_back(monkeypatch):
    monkeypatch.setitem(abi.STRUCTS, "layer_weights", without(abi.LayerWeights, "qk_eps"))
    cfg = layer_config(False, 64, 128)
    with pytest.raises(KernelUnavailable, match="struct layer_weights .* in C but"):
        kernels_for(cfg)
    with pytest.warns(RuntimeWarning, match="c is unavailable, falling back"):
        assert isinstance(choose_backend(cfg, torch.float32, CPU).value, BatchedAttention)
