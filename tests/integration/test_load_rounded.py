"""Loading without the float32 pass: where the matmul keeps 16-bit weights (`LinearFactory.takes_rounded`), each
linear's weight is read in that dtype, and the model is the one the float32 read and the replacement made, bit for
bit, in every family; the matrices no Linear multiplies stay in the model's dtype; and no float32 or replaced matrix
outlives its replacement while the model is built."""
import dataclasses
import gc
import weakref

import pytest
import torch
from conftest import save_family, save_tiny

import helios.weights as weights
from helios.kernels.build import native_bf16
from helios.registry import NotApplicable
from helios.weights import check_linears_replaced, load_model, read_and_build, read_config, read_tensors

MATMULS = ["c-bf16", "c"]  # bfloat16 panels, float16 panels: both `takes_rounded`


def float32_first(cfg, path, reader, dtype, device, linear_dtype=None):
    "The build as it was: every tensor read in the model's dtype, the linears rounded only as they are replaced."
    return read_and_build(cfg, path, reader, dtype, device)


def checkpoint(kind: str, folder):
    if kind in ("qwen3_tied", "llama"): return save_tiny(kind, folder)
    if kind.startswith("qwen3_5"):
        from _hybrid_checkpoints import save_reference
        save_reference("moe_e8_top2_interval2_untied" if kind.endswith("moe") else "interval4_gqa_conv4_untied", folder)
        return folder
    return save_family(kind, folder)


@pytest.mark.parametrize("matmul", MATMULS)
@pytest.mark.parametrize("kind", ["qwen3_tied", "llama", "qwen3_moe", "deepseek_v2", "deepseek_v32", "gemma3_text",
                                  "qwen3_5", "qwen3_5_moe"])
@torch.no_grad()
def test_read_rounded_is_the_model_replaced_from_float32(kind, matmul, tmp_path):
    if matmul == "c-bf16" and not native_bf16(): pytest.skip("this CPU has no native bfloat16 products")
    folder = checkpoint(kind, tmp_path)
    asked = []  # the dtype load_model asks the build to read the linears' weights in

    def recording(cfg, path, reader, dtype, device, linear_dtype=None):
        asked.append(linear_dtype)
        return read_and_build(cfg, path, reader, dtype, device, linear_dtype)

    try: rounded = load_model(folder, matmul=matmul, build=recording)
    except NotApplicable as e: pytest.skip(str(e))
    assert rounded.matmul.value.takes_rounded and asked == [rounded.matmul.value.weight_dtype]
    assert asked[0] in (torch.bfloat16, torch.float16)
    before = load_model(folder, matmul=matmul, build=float32_first)
    ids, pos = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]]), torch.arange(8)[None]
    assert torch.equal(rounded.model(ids, pos), before.model(ids, pos))
    packed = lambda m: {n: b for n, b in m.named_buffers() if n.endswith("packed")}
    assert packed(rounded.model).keys() == packed(before.model).keys() and packed(rounded.model)
    assert all(torch.equal(b, packed(before.model)[n]) for n, b in packed(rounded.model).items())


@pytest.mark.parametrize("kind", ["qwen3_moe", "deepseek_v2"])
def test_only_the_linears_weights_are_read_rounded(kind, tmp_path):
    folder = save_family(kind, tmp_path)
    cfg, reader = read_config(folder)
    tensors = read_tensors(folder, cfg, reader, torch.float32, torch.device("cpu"), linear_dtype=torch.bfloat16)
    dtype = lambda ending: {tensors[n].dtype for n in tensors if n.endswith(ending)}
    assert dtype("self_attn.o_proj.weight") == dtype("mlp.down_proj.weight") == {torch.bfloat16}  # a dense layer's
    if kind == "deepseek_v2": assert dtype("shared_experts.down_proj.weight") == {torch.bfloat16}
    assert dtype("embed_tokens.weight") == dtype("layernorm.weight") == {torch.float32}
    assert dtype("mlp.gate.weight") == {torch.float32}                                   # the routers choose in float32
    assert {tensors[n].dtype for n in tensors if ".mlp.experts." in n} == {torch.float32}  # stacked, not a Linear's
    if kind == "deepseek_v2": assert dtype("kv_b_proj.weight") == {torch.float32}        # split per head


def test_a_matrix_no_linear_multiplies_is_named(tmp_path, monkeypatch):
    "A family that forgot a matrix in not_linear fails at load, naming it, rather than running it rounded."
    folder = save_family("deepseek_v2", tmp_path)
    family = weights.load_family("deepseek_v2")
    forgetful = dataclasses.replace(family, not_linear=())
    monkeypatch.setattr(weights, "load_family", lambda name: forgetful if name == "deepseek_v2" else family)
    with pytest.raises(RuntimeError, match=r"deepseek_v2: model\.layers\.\d+\.\S+ .*not_linear must name them"):
        load_model(folder, matmul="c")
    model = load_model(folder, dtype="float32").model
    model.model.embed_tokens.weight.data = model.model.embed_tokens.weight.data.half()
    with pytest.raises(RuntimeError, match="model.embed_tokens.weight were read as torch.float16"):
        check_linears_replaced(model, torch.float16, family)


def test_each_linear_is_freed_as_its_replacement_comes_in(tmp_path):
    "replace_linears holds no Linear: the weight handed to make before is gone when make is called again."
    folder = save_tiny("llama", tmp_path)
    model = load_model(folder, dtype="float32", optimize=False).model  # every Linear still PyTorch's
    seen, alive = [], []

    def make(weight, bias):
        gc.collect()
        alive.append(sum(ref() is not None for ref in seen))
        seen.append(weakref.ref(weight))
        return torch.nn.Identity()

    assert weights.replace_linears(model, make) == len(seen) > 4
    assert alive == [0] * len(seen)


@pytest.mark.parametrize("kind", ["qwen3_tied", "gemma3_text"])
def test_the_build_takes_the_parts_out_of_the_dict(kind, tmp_path):
    "q, k, v, gate and up are stacked as they are taken out of the dict the model is built from: none outlives the build."
    folder = checkpoint(kind, tmp_path)
    cfg, reader = read_config(folder)
    tensors = read_tensors(folder, cfg, reader, torch.float32, torch.device("cpu"))
    parts = [weakref.ref(t) for n, t in tensors.items() if n.endswith(("q_proj.weight", "up_proj.weight"))]
    model = weights.build_model(cfg, tensors)
    gc.collect()
    assert parts and all(ref() is None for ref in parts) and model is not None
