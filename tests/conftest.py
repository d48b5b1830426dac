"""Shared fixtures: tiny random checkpoints written by `transformers` at test time."""
from pathlib import Path

import pytest
import torch

# Random weights drawn with a wide init range give peaked logits, so that greedy argmax is decided
# by the model and not by float rounding (with the default 0.02, the top two logits often tie).
PEAKED_INIT_RANGE = 0.5


def save_tiny(kind: str, folder: Path, **overrides) -> Path:
    "Write a tiny random transformers checkpoint of the given kind into folder."
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config
    common = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, initializer_range=PEAKED_INIT_RANGE,
                  max_position_embeddings=2048, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    presets = {
        # tied embeddings, head_dim (32) != hidden/heads (16)
        "qwen3_tied": (Qwen3Config, dict(head_dim=32, tie_word_embeddings=True, rope_theta=10000.0)),
        # untied, head_dim = hidden/heads, a large RoPE base as real Qwen3 uses
        "qwen3_untied": (Qwen3Config, dict(head_dim=16, tie_word_embeddings=False, rope_theta=1e6)),
        # Llama 3 with rope scaling, untied
        "llama": (LlamaConfig, dict(tie_word_embeddings=False, rope_theta=500000.0,
                                     rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                       high_freq_factor=4.0, original_max_position_embeddings=64))),
    }
    config_cls, extra = presets[kind]
    sharded = overrides.pop("sharded", False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config_cls(**{**common, **extra, **overrides}), dtype=torch.float32)
    model.save_pretrained(folder, **({"max_shard_size": "100KB"} if sharded else {}))
    return folder


# Newer families, tiny: experts, latent attention (DeepSeek), YaRN; save_family writes one with transformers.
FAMILY_COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_attention_heads=4,
              initializer_range=PEAKED_INIT_RANGE, max_position_embeddings=1024, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)
FAMILIES = {
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=16, num_experts=8,
                                         num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                                         mlp_only_layers=[1], rope_theta=1e6)),
    "deepseek_v2": ("DeepseekV2Config", dict(num_hidden_layers=3, num_key_value_heads=4, n_routed_experts=8,
                                             num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                                             first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=None,
                                             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                             topk_method="group_limited_greedy", n_group=4, topk_group=2)),
    "deepseek_v3": ("DeepseekV3Config", dict(num_hidden_layers=3, num_key_value_heads=4, n_routed_experts=8,
                                             num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                                             first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=48,
                                             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_group=4,
                                             topk_group=2, rope_scaling=dict(rope_type="yarn", factor=4.0,
                                             original_max_position_embeddings=256, mscale=1.0, mscale_all_dim=1.0))),
    # DSA: V3's attention and experts, and an indexer of 16 heads keeping 6 tokens per query (prompts run longer)
    "deepseek_v32": ("DeepseekV32Config", dict(num_hidden_layers=2, num_key_value_heads=4, n_routed_experts=8,
                                               num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                                               first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=48,
                                               qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_group=4,
                                               topk_group=2, index_n_heads=16, index_head_dim=16, index_topk=6)),
    # Gemma 3: local layers with a window of 4 tokens (every prompt crosses it many times), a global one at 2
    "gemma3_text": ("Gemma3TextConfig", dict(num_hidden_layers=4, num_key_value_heads=1, head_dim=16, sliding_window=4,
                                             layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                                          "sliding_attention"], query_pre_attn_scalar=16,
                                             rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=1e4),
                                                              "full_attention": dict(rope_type="default", rope_theta=1e6)})),
}


def save_family(name: str, folder: Path, **overrides) -> Path:
    "Write a tiny random checkpoint of one of FAMILIES with transformers (overrides: config fields)."
    import transformers
    config_cls, extra = FAMILIES[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**{**FAMILY_COMMON, **extra, **overrides})
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return folder


def transformers_greedy(model, prompt: list[int], steps: int, pad_token_id: int = 0) -> list[int]:
    "The `steps` tokens transformers' greedy generate gives after prompt (no EOS; an explicit all-ones mask)."
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, do_sample=False,
                             eos_token_id=None, pad_token_id=pad_token_id)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="session", params=["qwen3_tied", "qwen3_untied", "llama"])
def tiny_checkpoint(request, tmp_path_factory) -> Path:
    return save_tiny(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture
def no_worker_processes(monkeypatch):
    "Starting a worker process fails the test: a refused setting must be refused before any process starts."
    def refuse(method): raise AssertionError("a worker process was about to start")
    monkeypatch.setattr("helios.distributed.launch.mp.get_context", refuse)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from helios.weights import default_model_path
    return default_model_path()


def real_text() -> str:
    from helios.bench.workloads import real_text as text
    return text()


# KV budget of the tests' engines: 11k tokens of SmolLM2, plenty for any test here. The default (2 GiB)
# times the dozen engines of a run pushed pytest past 20 GiB and CI's memory limit.
TEST_KV_BYTES = 512 * 2**20


@pytest.fixture(scope="module")
def smollm2_llm_factory(smollm2_gguf):
    "Build LLMs over the default model (float32, CPU); they are closed when the test module ends."
    from helios import LLM
    made = []

    def make(**kwargs):
        llm = LLM(smollm2_gguf, dtype="float32", device="cpu", quiet=True, **{"kv_cache_bytes": TEST_KV_BYTES, **kwargs})
        made.append(llm)
        return llm
    yield make
    for llm in made: llm.close()


def with_smollm2_tokenizer(folder: Path, smollm2_gguf: Path) -> Path:
    "Give a checkpoint folder SmolLM2's tokenizer and chat template (its vocabulary must hold SmolLM2's 49,152 tokens)."
    import json
    from helios.tokenizer import load_tokenizer
    tok = load_tokenizer(smollm2_gguf)
    tok.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": tok.chat_template_source, "eos_token": "<|im_end|>", "bos_token": "<|im_start|>"}))
    return folder


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory, smollm2_gguf):
    "A tiny random Qwen3 with SmolLM2's tokenizer and chat template (fast, meaningless text)."
    folder = save_tiny("qwen3_tied", tmp_path_factory.mktemp("served"), vocab_size=49152)
    return with_smollm2_tokenizer(folder, smollm2_gguf)


@pytest.fixture(scope="session")
def tiny_tools_folder(tmp_path_factory, smollm2_gguf):
    """A tiny random Qwen3 with SmolLM2's tokenizer plus Qwen3's tool and think tags (added, not special, tokens)
    and a chat template in the shape of Qwen3's (the one Helios ships: helios/templates/qwen3_style.jinja)."""
    import json
    from tokenizers import AddedToken
    from helios.tokenizer import load_tokenizer
    from helios.tools import packaged_chat_template
    tok = load_tokenizer(smollm2_gguf)
    tok.backend.add_tokens([AddedToken(t, special=False, normalized=False)
                            for t in ("<tool_call>", "</tool_call>", "<think>", "</think>")])
    folder = save_tiny("qwen3_tied", tmp_path_factory.mktemp("tools"), vocab_size=tok.vocab_size)
    tok.backend.save(str(folder / "tokenizer.json"))
    template = packaged_chat_template("qwen3_style")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "<|im_end|>"}))
    return folder


@pytest.fixture
def threads():
    "Restore torch's thread count after a test that changes it."
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def opens_think_folder(tiny_tools_folder, tmp_path_factory):
    "The tools checkpoint with a template whose generation prompt opens a think block (as thinking-only models do)."
    import json
    import shutil
    folder = tmp_path_factory.mktemp("opens-think")
    shutil.copytree(tiny_tools_folder, folder, dirs_exist_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = config["chat_template"].replace("{{- '<|im_start|>assistant\\n' -}}",
                                                              "{{- '<|im_start|>assistant\\n<think>\\n' -}}")
    assert "assistant\\n<think>" in config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder
