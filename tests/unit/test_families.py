"""Model families are found by `model_type` through the `helios.family` entry points: a family registered only by a
package's metadata (here a fake distribution on sys.path) is loaded, built and refused by name like the built-in ones,
and the loader imports no family module by name."""
import inspect
import json
import textwrap

import pytest
import torch
from safetensors.torch import save_file

import helios.formats.gguf
import helios.weights
from helios.families import FAMILY_GROUP, Family, family_names, gguf_family, load_family
from helios.model.qwen3 import CausalLM
from helios.weights import config_from_hf, load_model

FAKE_MODULE = '''
from helios.config import ModelConfig, hf_config_fields
from helios.families import Family
from helios.model.qwen3 import DecoderLayer

def tiny_llama_like(d):
    return ModelConfig(**hf_config_fields(d))

FAKE = Family("fake_llama", tiny_llama_like, DecoderLayer)
WRONG = object()
'''


@pytest.fixture
def fake_family(tmp_path, monkeypatch):
    "A distribution `fakefam` whose metadata registers `fake_llama` (and a broken `fake_wrong`) in helios.family."
    (tmp_path / "fakefam_module.py").write_text(FAKE_MODULE)
    info = tmp_path / "fakefam-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakefam\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(f"""\
        [{FAMILY_GROUP}]
        fake_llama = fakefam_module:FAKE
        fake_wrong = fakefam_module:WRONG
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path


def test_the_loader_names_no_family_module():
    for module in (helios.weights, helios.formats.gguf):
        source = inspect.getsource(module)
        assert "helios.model.mla" not in source and "helios.model.moe" not in source
        assert ".model.mla" not in source and ".model.moe" not in source and "fakefam" not in source


def test_the_built_in_families_are_registered():
    assert {"qwen3", "llama", "qwen3_moe", "deepseek_v2", "deepseek_v3"} <= set(family_names())
    assert load_family("qwen3") is helios.weights.QWEN3
    assert gguf_family("qwen3moe").name == "qwen3_moe"
    with pytest.raises(ValueError, match=r"model_type 'gpt2' is not supported; Helios runs .*deepseek_v2.*qwen3_moe"):
        load_family("gpt2")
    with pytest.raises(ValueError, match=r"GGUF architecture 'gpt2' is not supported; Helios reads gemma3, llama, qwen3, qwen3moe"):
        gguf_family("gpt2")


def test_a_family_registered_only_by_an_entry_point_is_loaded_built_and_listed(fake_family):
    assert "fake_llama" in family_names()
    family = load_family("fake_llama")
    assert isinstance(family, Family) and family.name == "fake_llama"
    with pytest.raises(ValueError, match="fake_llama"):  # the registered names now include it
        load_family("gpt2")
    with pytest.raises(TypeError, match="must be the Family 'fake_wrong'"):
        load_family("fake_wrong")

    hf = dict(model_type="fake_llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
    cfg = config_from_hf(hf)
    assert cfg.architecture == "fake_llama" and cfg.head_dim == 8
    torch.manual_seed(0)
    original = CausalLM(cfg).eval()
    folder = fake_family / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf))
    save_file({k: v.contiguous() for k, v in original.state_dict().items()}, folder / "model.safetensors")
    loaded = load_model(folder, dtype="float32", device="cpu", optimize=False)
    ids, pos = torch.tensor([[1, 2, 3, 4]]), torch.arange(4)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids, pos), original(ids, pos))
    assert loaded.config == cfg
