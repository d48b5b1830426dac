"""Qwen3.5 and Qwen3.5-MoE (chapter 20) against transformers in float32: tiny random checkpoints in several shapes
(head counts, full-attention interval or an explicit layer_types list, conv kernel sizes, partial rotary factors,
experts per token, tied and untied heads), read through the family's pieces (config_from_hf, adapt_state_dict, hybrid_layer). Logits and greedy tokens
as transformers; a prompt in chunks that end mid convolution window as one prefill; decode token by token as one
full forward."""
import json
from contextlib import contextmanager

import pytest
import torch
from conftest import PEAKED_INIT_RANGE, transformers_greedy
from safetensors.torch import load_file

from helios.model.attention import KVStore
from helios.model.hybrid import (GatedAttention, GatedDeltaNet, HybridCache, LinearStateStore, SharedExpertMoE,
                                 adapt_state_dict, config_from_hf, generate_hybrid, hybrid_layer, prefill_chunk)
from helios.model.qwen3 import model_from_state_dict
from helios.reference import decode_one_token

LOGIT_ATOL = 1e-4   # ours against transformers, one forward (both run the chunked rule)
STEP_ATOL = 1e-3    # stepped against chunked: the same sums in another order, on logits of std ~10
COMMON = dict(vocab_size=256, hidden_size=64, initializer_range=PEAKED_INIT_RANGE, max_position_embeddings=1024,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)
DENSE = dict(intermediate_size=96)
SHAPES = {  # qwen3_5 (dense MLP) and qwen3_5_moe (experts and a gated shared expert in every layer)
    # Qwen3.5's pattern (3 linear, 1 full), GQA 4/2, 2 key heads serving 4 value heads, conv 4, untied
    "interval4_gqa_conv4_untied": dict(**DENSE, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                                       linear_value_head_dim=12, linear_conv_kernel_dim=4, full_attention_interval=4,
                                       tie_word_embeddings=False),
    # every second layer full, one KV head, as many value heads as key heads, conv 2, tied
    "interval2_mqa_conv2_tied": dict(**DENSE, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                                     linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
                                     linear_value_head_dim=8, linear_conv_kernel_dim=2, full_attention_interval=2,
                                     tie_word_embeddings=True),
    # full attention first, half of each head rotated, q/k/v/o biases, 3 value heads on 1 key head, conv 3, tied
    "types_full_first_conv3_bias": dict(**DENSE, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                        linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=8,
                                        linear_value_head_dim=8, linear_conv_kernel_dim=3, attention_bias=True,
                                        layer_types=["full_attention", "linear_attention", "linear_attention"],
                                        rope_parameters=dict(rope_type="default", rope_theta=1e6,
                                                             partial_rotary_factor=0.5),
                                        tie_word_embeddings=True),
    # MoE: 8 experts, 2 per token, a shared expert 24 wide; every second layer full; conv 3; untied
    "moe_e8_top2_interval2_untied": dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                                         linear_value_head_dim=12, linear_conv_kernel_dim=3, full_attention_interval=2,
                                         num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                                         shared_expert_intermediate_size=24, tie_word_embeddings=False),
    # MoE: 4 experts, 1 per token, Qwen3.5's 3-to-1 pattern, conv 4, tied
    "moe_e4_top1_interval4_tied": dict(num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                       linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16,
                                       linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4,
                                       num_experts_per_tok=1, moe_intermediate_size=16,
                                       shared_expert_intermediate_size=16, tie_word_embeddings=True),
}


VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
              spatial_merge_size=2, temporal_patch_size=1, in_channels=3)  # a tiny vision tower beside the text model


def save_reference(shape: str, folder, multimodal: bool = False):
    """transformers' random model of one shape, saved as a checkpoint folder (its norms and biases made nonzero):
    the text model alone, or (multimodal) as the released folders hold it, beside a tiny vision tower."""
    import transformers
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    family = "Qwen3_5Moe" if shape.startswith("moe") else "Qwen3_5"
    text = {**COMMON, **SHAPES[shape]}
    if multimodal:
        config = getattr(transformers, f"{family}Config")(text_config=text, vision_config=VISION,
                                                          tie_word_embeddings=text.pop("tie_word_embeddings"))
    else: config = getattr(transformers, f"{family}TextConfig")(**text)
    torch.manual_seed(0)
    reference = getattr(transformers, f"{family}{'ForConditionalGeneration' if multimodal else 'ForCausalLM'}")(config).eval()
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"): p.normal_(0, 0.3)  # zero at init
    reference.save_pretrained(folder)
    return reference


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


def test_llm_refuses_a_hybrid_in_one_line(tmp_path, smollm2_gguf, monkeypatch):
    "The engine has no state pool yet: LLM raises a ValueError saying so, and the CLI prints one line, no traceback."
    import subprocess

    from helios import LLM
    from helios.tokenizer import load_tokenizer
    save_reference("interval4_gqa_conv4_untied", tmp_path)
    load_tokenizer(smollm2_gguf).backend.save(str(tmp_path / "tokenizer.json"))  # any tokenizer: the model is refused first
    monkeypatch.setenv("HELIOS_KV_CACHE_BYTES", str(8 << 20))
    with pytest.raises(ValueError, match="does not serve linear-attention layers yet"):
        LLM(str(tmp_path))
    run = subprocess.run(["helios", "generate", "--model", str(tmp_path), "--kv-cache-bytes", str(8 << 20), "hi"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("helios: error:")]
    assert len(errors) == 1 and "does not serve linear-attention layers yet" in errors[0], run.stderr
