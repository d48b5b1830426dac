"""GGUF loading: every supported quantization type, the llama, qwen3 and qwen3moe architectures, and the real
SmolLM2 file."""
import dataclasses

import numpy as np
import pytest
import torch

from conftest import save_tiny
from gguf_writer import TYPES, write_gguf
from helios.formats.gguf import GGUFFile, GGUFTensor, dequantize_tensor, unpermute_rope
from helios.reference import generate
from helios.weights import load_model


def hf_from_gguf(path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny_gguf(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"gguf_{request.param}")
    preset = "llama" if request.param == "llama" else "qwen3_untied"
    # 256-wide so that K-quant blocks (256 values) fit a row; no rope scaling (GGUF stores it differently).
    # transformers reads a Qwen3 GGUF with its default head_dim of 128 (≠ hidden/heads = 64: fine for us)
    head_dim = 64 if request.param == "llama" else 128
    hf = save_tiny(preset, d / "hf", hidden_size=256, intermediate_size=512, head_dim=head_dim,
                   rope_scaling=None, initializer_range=0.05)
    return request.param, write_gguf(hf, d / "tiny.gguf", request.param)


def test_every_quant_type_is_present(tiny_gguf):
    kinds = {t.ggml_type.name for t in GGUFFile(tiny_gguf[1]).tensors}
    assert {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q6_K", "Q4_K"} <= kinds
    assert set(q.name for q in TYPES.values()) <= kinds


@torch.no_grad()
def test_tiny_gguf_matches_transformers(tiny_gguf):
    arch, path = tiny_gguf
    ours = load_model(path, dtype="float32", device="cpu")
    ref = hf_from_gguf(path)
    ids = torch.randint(0, 512, (1, 30), generator=torch.Generator().manual_seed(0))
    expected = ref(ids).logits
    assert (ours.model(ids, torch.arange(30)[None]) - expected).abs().max() < 1e-3
    assert expected.std() > 0.5
    assert ours.config.architecture == arch and ours.config.qk_norm == (arch == "qwen3")


def assert_reader_matches_gguf_package(path, dequantized=None):
    """Our GGUF reader against the `gguf` package's GGUFReader: the same metadata keys and values, the same
    tensor names, shapes and types, and the same dequantized values (every tensor, or the names given)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    ours, theirs = GGUFFile(path), GGUFReader(path)
    fields = {key: f.contents() for key, f in theirs.fields.items() if not key.startswith("GGUF.")}  # GGUF.*: header
    assert list(ours.fields) == list(fields)
    for key, value in fields.items():
        assert ours.fields[key] == value and type(ours.fields[key]) is type(value), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.shape == tuple(reversed(b.shape.tolist())), a.name  # GGUF lists the innermost dimension first
        assert a.ggml_type == b.tensor_type, a.name
    checked = 0
    for a, b in zip(ours.tensors, theirs.tensors):
        if dequantized is not None and a.name not in dequantized: continue
        expected = dequantize(b.data, b.tensor_type).reshape(a.shape)
        got = dequantize_tensor(a)
        assert got.dtype == np.float32 and np.array_equal(got, expected), a.name
        # the comparison can fail: the same tensor read one row off (a wrong offset) does not pass
        if a.data.shape[0] > 1 and expected.std() > 0:
            shifted = GGUFTensor(a.name, a.shape, a.ggml_type, np.roll(a.data, 1, axis=0))
            assert not np.array_equal(dequantize_tensor(shifted), expected), a.name
        checked += 1
    assert checked == (len(ours.tensors) if dequantized is None else len(dequantized))
    return ours


def test_reader_matches_gguf_package_on_written_file(tiny_gguf):
    ours = assert_reader_matches_gguf_package(tiny_gguf[1])  # every tensor, one of each quantization type
    assert ours.fields["general.architecture"] == tiny_gguf[0]


def test_reader_matches_gguf_package_on_smollm2(smollm2_gguf):
    few = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_norm.weight", "blk.29.ffn_down.weight",
           "output_norm.weight"]  # Q8_0, Q4_1 and F32, first and last layers
    ours = assert_reader_matches_gguf_package(smollm2_gguf, few)
    assert len(ours.fields) == 33 and len(ours.tensors) == 272


def test_unpermute_inverts_llama_cpp_permutation():
    from gguf_writer import permute_for_llama_cpp
    w = np.random.default_rng(0).standard_normal((3 * 8, 5)).astype(np.float32)
    assert np.array_equal(unpermute_rope(permute_for_llama_cpp(w, 3), 3), w)
    assert not np.array_equal(permute_for_llama_cpp(w, 3), w)


CHATS = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "system", "content": "You are a terse assistant."},
          {"role": "user", "content": "Name three primary colors."}]]


@pytest.fixture(scope="module")
def smollm2(smollm2_llm_factory):
    return smollm2_llm_factory()


@pytest.fixture(scope="module")
def smollm2_reference(smollm2_gguf):
    return hf_from_gguf(smollm2_gguf)


def assert_chats_match_transformers(model, tokenizer, ref):
    "24 greedy tokens after each chat, ours against transformers in float32."
    for messages in CHATS:
        prompt = tokenizer.encode_chat(messages)
        ours = generate(model, prompt, 24)
        ids = torch.tensor([prompt])  # an explicit mask: the pad id (2) also ends each chat turn in the prompt
        theirs = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                              eos_token_id=None, pad_token_id=2)[0, len(prompt):].tolist()
        assert ours == theirs, (tokenizer.decode(ours), tokenizer.decode(theirs))


@pytest.mark.slow
@torch.no_grad()
def test_smollm2_greedy_matches_transformers(smollm2, smollm2_reference):
    assert_chats_match_transformers(smollm2.model, smollm2.tokenizer, smollm2_reference)


@torch.no_grad()
def test_smollm2_default_cpu_weights_match_transformers(smollm2, smollm2_gguf, smollm2_reference):
    """The default load (bfloat16 products with float32 sums where the CPU has them, else float16-stored weights with
    float32 arithmetic) gives transformers' float32 greedy tokens."""
    assert_chats_match_transformers(load_model(smollm2_gguf, device="cpu").model, smollm2.tokenizer, smollm2_reference)


def test_smollm2_answers_sensibly(smollm2):
    from helios import SamplingParams
    out = smollm2.chat(CHATS[0], SamplingParams(temperature=0, max_tokens=32))
    assert "Paris" in out.text and out.finish_reason == "stop"


def test_smollm2_tokenizer_matches_transformers(smollm2, smollm2_gguf):
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    # transformers rebuilds the 'smollm' pre-tokenizer without its digit split, so compare text without digits
    for text in ["Hello, world! How are you doing today?", "Grüße aus Köln 🌍 — naïve façades.",
                 "<|im_start|>user\nHi there<|im_end|>\n", "def f(x):\n    return x * x\n\n\n", "  spaced   out  "]:
        assert smollm2.tokenizer.encode(text) == ref.encode(text), text
    assert smollm2.tokenizer.encode("1234") == [smollm2.tokenizer.encode(d)[0] for d in "1234"]


@pytest.fixture(scope="module")
def tiny_moe_gguf(tmp_path_factory):
    "A tiny Qwen3-MoE written as llama.cpp's qwen3moe: every layer with 8 experts, each kind a 3-D quantized tensor."
    from conftest import save_family
    d = tmp_path_factory.mktemp("gguf_qwen3moe")
    hf = save_family("qwen3_moe", d / "hf", vocab_size=512, hidden_size=256, intermediate_size=512, head_dim=64,
                     moe_intermediate_size=256, mlp_only_layers=[], initializer_range=0.05)
    return hf, write_gguf(hf, d / "tiny.gguf", "qwen3moe")


@torch.no_grad()
def test_qwen3moe_gguf_round_trip(tiny_moe_gguf):
    """The file's config is the checkpoint's, its experts are 3-D tensors, and our model gives transformers' logits
    when transformers' Qwen3-MoE runs the very weights the file holds (dequantized)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from helios.weights import load_hf_config
    from helios.formats.gguf import config_from_gguf, load_gguf_tensors
    hf, path = tiny_moe_gguf
    reader = GGUFFile(path)
    assert {len(t.shape) for t in reader.tensors if "_exps" in t.name} == {3}
    cfg = config_from_gguf(reader)
    expected_cfg = load_hf_config(hf)  # experts, their width and normalisation, every layer sparse
    assert cfg.rms_norm_eps == pytest.approx(expected_cfg.rms_norm_eps)  # GGUF keeps it as a float32
    assert dataclasses.replace(cfg, rms_norm_eps=expected_cfg.rms_norm_eps) == expected_cfg
    ours = load_model(path, dtype="float32", device="cpu").model
    ref = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(hf), dtype=torch.float32).eval()
    ref.load_state_dict(load_gguf_tensors(reader, cfg, torch.float32, torch.device("cpu")), strict=True)
    ids = torch.randint(0, 512, (1, 30), generator=torch.Generator().manual_seed(0))
    expected = ref(ids).logits
    assert (ours(ids, torch.arange(30)[None]) - expected).abs().max() < 1e-3 and expected.std() > 0.5
    assert generate(ours, ids[0, :9].tolist(), 16) == ref.generate(
        ids[:, :9], attention_mask=torch.ones_like(ids[:, :9]), max_new_tokens=16, do_sample=False,
        eos_token_id=None, pad_token_id=0)[0, 9:].tolist()
