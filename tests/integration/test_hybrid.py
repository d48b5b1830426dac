"""Qwen3.5 and Qwen3.5-MoE (chapter 20) against transformers in float32: tiny random checkpoints in several shapes
(head counts, full-attention interval or an explicit layer_types list, conv kernel sizes, partial rotary factors,
experts per token, tied and untied heads), read through the family's pieces (config_from_hf, adapt_state_dict, hybrid_layer). Logits and greedy tokens
as transformers; a prompt in chunks that end mid convolution window as one prefill; decode token by token as one
full forward."""
import json
from contextlib import contextmanager

import pytest
import torch
from _hybrid_checkpoints import SHAPES, save_reference
from conftest import transformers_greedy
from safetensors.torch import load_file

from helios.model.attention import KVStore
from helios.model.hybrid import (GatedAttention, GatedDeltaNet, HybridCache, LinearStateStore, SharedExpertMoE,
                                 adapt_state_dict, config_from_hf, generate_hybrid, hybrid_layer, prefill_chunk)
from helios.model.qwen3 import model_from_state_dict
from helios.reference import decode_one_token

LOGIT_ATOL = 1e-4   # ours against transformers, one forward (both run the chunked rule)
STEP_ATOL = 1e-3    # stepped against chunked: the same sums in another order, on logits of std ~10


@pytest.fixture(scope="module", params=list(SHAPES))
def pair(request, tmp_path_factory):
    "(transformers' model, ours read from its checkpoint folder, our config) for one shape."
    reference = save_reference(request.param, folder := tmp_path_factory.mktemp(request.param))
    cfg = config_from_hf(json.loads((folder / "config.json").read_text()))
    ours = model_from_state_dict(cfg, adapt_state_dict(cfg, load_file(folder / "model.safetensors")), hybrid_layer)
    return reference, ours, cfg


def test_layers_follow_layer_types(pair):
    reference, ours, cfg = pair
    kinds = ["linear_attention" if isinstance(layer.self_attn, GatedDeltaNet) else "full_attention"
             for layer in ours.model.layers]
    assert kinds == list(reference.config.layer_types) == list(cfg.layer_types)
    assert all(isinstance(layer.self_attn, (GatedDeltaNet, GatedAttention)) for layer in ours.model.layers)
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == reference.config.tie_word_embeddings
    sparse = [isinstance(layer.mlp, SharedExpertMoE) for layer in ours.model.layers]
    assert sparse == [cfg.architecture == "qwen3_5_moe"] * cfg.num_layers


def test_logits_as_transformers(pair):
    "Two prompts of 70 tokens (more than one 64-token chunk of the rule): every position's logits."
    reference, ours, _ = pair
    ids = torch.randint(0, 256, (2, 70), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs, mine = reference(ids).logits, ours(ids, torch.arange(70).expand(2, 70))
    torch.testing.assert_close(mine, theirs, atol=LOGIT_ATOL, rtol=LOGIT_ATOL)


@pytest.mark.parametrize("prompt_len,chunk", [(5, None), (13, 4), (30, 7)])
def test_greedy_tokens_as_transformers(pair, prompt_len, chunk):
    "Our cache (prompt in chunks, then the stepped rule) against transformers' generate with its own cache."
    reference, ours, _ = pair
    prompt = torch.randint(0, 256, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
    assert generate_hybrid(ours, prompt, 20, prefill_chunk_size=chunk) == transformers_greedy(reference, prompt, 20)


@pytest.mark.parametrize("sizes", [[1, 1, 1, 1, 1, 19], [1, 2, 3, 4, 14], [3, 5, 16]])
def test_prefill_in_chunks_is_one_prefill(pair, sizes):
    "Chunks shorter than the conv window and ending inside it: each chunk's last logits, and the final state."
    _, ours, cfg = pair
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(2))
    one = HybridCache(cfg, 2, 24)
    whole = prefill_chunk(ours, one, ids)
    with torch.no_grad():
        full = ours(ids, torch.arange(24).expand(2, 24))
    torch.testing.assert_close(whole, full[:, -1], atol=STEP_ATOL, rtol=LOGIT_ATOL)
    chunked, start = HybridCache(cfg, 2, 24), 0
    for size in sizes:
        last = prefill_chunk(ours, chunked, ids[:, start:start + size])
        start += size
        torch.testing.assert_close(last, full[:, start - 1], atol=STEP_ATOL, rtol=LOGIT_ATOL)
    assert chunked.length == one.length == 24
    for mine, theirs in ((chunked.conv, one.conv), (chunked.recurrent, one.recurrent), (chunked.kv.k, one.kv.k)):
        torch.testing.assert_close(mine, theirs, atol=STEP_ATOL, rtol=LOGIT_ATOL)


def test_decode_step_by_step_is_one_forward(pair):
    "Every token through decode_one_token from an empty cache: the logits of one full forward at each position."
    _, ours, cfg = pair
    ids = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = ours(ids, torch.arange(20).expand(2, 20))
    cache = HybridCache(cfg, 2, 20)
    assert isinstance(cache, KVStore) and isinstance(cache, LinearStateStore)
    by_step = torch.stack([decode_one_token(ours, cache, ids[:, t]) for t in range(20)], dim=1)
    torch.testing.assert_close(by_step, full, atol=STEP_ATOL, rtol=LOGIT_ATOL)


def test_cache_holds_kv_only_for_full_attention_layers(pair):
    _, _, cfg = pair
    cache = HybridCache(cfg, 3, 10)
    assert cache.kv.k.shape == (len(cfg.full_attention_layers), 3, 10, cfg.num_kv_heads, cfg.attention_head_dim)
    assert cache.conv.shape == (len(cfg.linear_layers), 3, cfg.conv_dim, cfg.conv_kernel_size - 1)
    state_bytes = (cache.conv[:, 0].numel() * 4 + cache.recurrent[:, 0].numel() * 4)
    assert cfg.linear_state_bytes(4) == state_bytes


def test_a_kv_store_without_linear_state_is_a_clear_error(pair):
    "A KV store that keeps only keys and values (chapter 06's cache) cannot run a linear layer: a TypeError says so."
    from helios.reference import KVCache
    _, ours, cfg = pair
    with pytest.raises(TypeError, match="KVCache keeps no linear-attention state"):
        ours(torch.tensor([[1, 2]]), torch.arange(2)[None], kv=KVCache(cfg, 1, 4))


@pytest.mark.parametrize("shape", ["interval4_gqa_conv4_untied", "types_full_first_conv3_bias", "moe_e8_top2_interval2_untied"])
def test_load_model_builds_the_registered_family(shape, tmp_path):
    "Chapter 04's load_model on the checkpoint folder (model_type qwen3_5_text or qwen3_5_moe_text): transformers' logits."
    from helios.weights import load_model
    reference = save_reference(shape, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"].endswith("_text")
    loaded = load_model(tmp_path, dtype="float32", optimize=False)
    assert all(isinstance(layer.self_attn, (GatedDeltaNet, GatedAttention)) for layer in loaded.model.model.layers)
    ids = torch.randint(0, 256, (2, 70), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs, mine = reference(ids).logits, loaded.model(ids, torch.arange(70).expand(2, 70))
    torch.testing.assert_close(mine, theirs, atol=LOGIT_ATOL, rtol=LOGIT_ATOL)


@pytest.mark.parametrize("shape", ["interval4_gqa_conv4_untied", "moe_e4_top1_interval4_tied"])
def test_a_multimodal_folder_loads_its_text_model(shape, tmp_path, monkeypatch):
    """The released Qwen3.5 folders are multimodal (model_type qwen3_5 / qwen3_5_moe): the text model under
    model.language_model., a vision tower beside it. The loader reads the text model only (no visual tensor is read)
    and its logits on text are transformers' multimodal model's."""
    from helios.formats import hf
    from helios.weights import load_model
    reference = save_reference(shape, tmp_path, multimodal=True)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] in ("qwen3_5", "qwen3_5_moe")
    read = []
    real_open = hf.open_safetensors

    class Recording:  # the tensors a loader reads (get_slice reads a header only: shapes are checked first)
        def __init__(self, f): self.f = f
        def keys(self): return self.f.keys()
        def get_tensor(self, name): read.append(name); return self.f.get_tensor(name)
        def get_slice(self, name): return self.f.get_slice(name)

    @contextmanager
    def recording(file):
        with real_open(file) as f: yield Recording(f)
    monkeypatch.setattr(hf, "open_safetensors", recording)
    loaded = load_model(tmp_path, dtype="float32", optimize=False)
    assert read and not [name for name in read if "visual" in name]
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs, mine = reference(input_ids=ids).logits, loaded.model(ids, torch.arange(40).expand(2, 40))
    torch.testing.assert_close(mine, theirs, atol=LOGIT_ATOL, rtol=LOGIT_ATOL)


def test_every_qwen3_5_model_type_is_registered():
    from helios.families import family_names, load_family
    for model_type in ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"):
        assert model_type in family_names() and load_family(model_type).layer is hybrid_layer


def test_llm_serves_a_hybrid_with_transformers_tokens(tmp_path, smollm2_gguf, monkeypatch):
    """LLM runs a hybrid checkpoint folder through the paged engine (chapter 20's state pool): transformers' greedy
    tokens, with the default matmuls of float32. A setting the state cannot run with: the CLI prints one line."""
    import subprocess

    from helios import LLM, SamplingParams
    from helios.tokenizer import load_tokenizer
    reference = save_reference("interval4_gqa_conv4_untied", tmp_path)
    load_tokenizer(smollm2_gguf).backend.save(str(tmp_path / "tokenizer.json"))
    monkeypatch.setenv("HELIOS_KV_CACHE_BYTES", str(8 << 20))
    prompts = [[(7 * j + i) % 250 + 1 for j in range(5 + 23 * i)] for i in range(4)]
    with LLM(str(tmp_path), dtype="float32", page_size=16) as llm:
        outputs = llm.generate(prompts, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    for prompt, output in zip(prompts, outputs):
        assert list(output.outputs[0].token_ids) == transformers_greedy(reference, prompt, 10)
    run = subprocess.run(["helios", "generate", "--model", str(tmp_path), "--kv-cache-bytes", str(8 << 20),
                          "--speculative", "ngram", "hi"], capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("helios: error:")]
    assert len(errors) == 1 and "speculative decoding cannot run a linear-attention model" in errors[0], run.stderr
