"""Files are input too: a truncated, corrupted or lying GGUF, safetensors file, config.json or tokenizer gets one
line that names the file and the problem (a `ModelFileError`, a ValueError), in bounded time and memory, and the
command line prints it as `helios: error: <file>: <problem>` without a traceback."""
import json
import shutil
import struct
import subprocess
import time
import tracemalloc

import pytest

from conftest import save_tiny
from gguf_writer import Raw, gguf_from_parts, tiny_llama_parts
from helios.formats.errors import ModelFileError
from helios.formats.gguf import GGUFFile
from helios.tokenizer import load_tokenizer, tokenizer_from_folder
from helios.weights import load_model

GiB, TiB = 2**30, 2**40


def refused(path, match: str, load=None, max_bytes: int = 2 << 20) -> str:
    "Loading `path` raises ModelFileError naming it and matching `match`, within a second and `max_bytes` beyond the file."
    load = load or (lambda p: load_model(p, dtype="float32", device="cpu", optimize=False))
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(ModelFileError, match=match) as info: load(path)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    message = str(info.value)
    assert message.startswith(f"{info.value.path}: ") and "\n" not in message, message
    assert str(path) in message or str(info.value.path).startswith(str(path)), message
    size = path.stat().st_size if path.exists() else 0
    assert time.perf_counter() - start < 5 and peak < size * 16 + max_bytes, peak
    return message


def write(tmp_path, parts, name="hostile.gguf"):
    path = tmp_path / name
    path.write_bytes(parts.data if hasattr(parts, "data") else parts)
    return path


def gguf(tmp_path, tensors_edit=None, **kwargs):
    "The tiny llama GGUF, its metadata changed by kwargs (fields=...) and its tensors by tensors_edit(list)."
    fields, tensors = tiny_llama_parts()
    fields.update(kwargs.pop("fields", {}))
    if tensors_edit: tensors = tensors_edit(tensors)
    return write(tmp_path, gguf_from_parts(fields, tensors, **kwargs))


# --- GGUF: truncated -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["header", "metadata", "tensor_infos", "data"])
def test_gguf_truncated(tmp_path, where):
    parts = gguf_from_parts(*tiny_llama_parts())
    cut = {"header": 13, "metadata": parts.infos_start // 2, "tensor_infos": (parts.infos_start + parts.data_start) // 2,
           "data": len(parts.data) - 7}[where]
    path = write(tmp_path, parts.data[:cut])
    refused(path, {"header": "shorter than a GGUF header", "data": "past the end of the file"}.get(where, "truncated"))


def test_gguf_empty_file(tmp_path):
    refused(write(tmp_path, b""), "0 bytes long")


# --- GGUF: counts and lengths that claim terabytes ------------------------------------------------------------------

def test_gguf_tensor_count_of_terabytes(tmp_path):
    refused(gguf(tmp_path, n_tensors=TiB), "1,099,511,627,776 tensor descriptions")


def test_gguf_metadata_count_of_terabytes(tmp_path):
    refused(gguf(tmp_path, n_fields=2**64 - 1), "metadata fields")


def test_gguf_array_length_of_terabytes(tmp_path):
    refused(gguf(tmp_path, fields={"tokenizer.ggml.scores": Raw(9, struct.pack("<IQ", 6, TiB))}), "array of 1,099,511,627,776")


def test_gguf_array_of_strings_claiming_terabytes(tmp_path):
    refused(gguf(tmp_path, fields={"tokenizer.ggml.tokens": Raw(9, struct.pack("<IQ", 8, 2**62))}), "array of")


def test_gguf_string_of_gigabytes(tmp_path):
    refused(gguf(tmp_path, fields={"general.name": Raw(8, struct.pack("<Q", 10 * GiB) + b"SmolLM")}),
            "'general.name' needs .* of 10,737,418,240 bytes")


def test_gguf_arrays_nested_too_deep(tmp_path):
    nested = struct.pack("<IQ", 9, 1) * 100 + struct.pack("<IQ", 4, 0)
    refused(gguf(tmp_path, fields={"general.nest": Raw(9, nested)}), "nests arrays deeper than 4")


# --- GGUF: tensor descriptions that lie -----------------------------------------------------------------------------

def retype(name, kind=None, shape=None):
    "A tensors_edit that gives one tensor another ggml type or shape (its bytes unchanged)."
    return lambda ts: [(n, shape or s, kind if kind is not None else k, d) if n == name else (n, s, k, d) for n, s, k, d in ts]


def test_gguf_tensor_offset_past_the_end(tmp_path):
    parts = gguf_from_parts(*tiny_llama_parts())
    offset, size = parts.counts[-1]  # the last tensor's offset field
    data = parts.data[:offset] + struct.pack("<Q", 2**63 - 32) + parts.data[offset + size:]  # aligned, far past the end
    refused(write(tmp_path, data), "blk.0.ffn_down.weight.*past the end of the file")


def test_gguf_tensor_size_past_the_end(tmp_path):
    refused(gguf(tmp_path, retype("output_norm.weight", shape=(64 * 1024,))), "output_norm.weight.*past the end")


def test_gguf_dimensions_whose_product_overflows(tmp_path):
    refused(gguf(tmp_path, retype("token_embd.weight", shape=(2**40, 2**40, 2**32))), "token_embd.weight.*past the end")


def test_gguf_more_than_four_dimensions(tmp_path):
    refused(gguf(tmp_path, retype("output_norm.weight", shape=(1, 1, 1, 1, 64))), "5 dimensions; GGUF allows 1 to 4")


def test_gguf_zero_dimension(tmp_path):
    refused(gguf(tmp_path, retype("output_norm.weight", shape=(0, 64))), "each must be at least 1")


def test_gguf_unknown_tensor_type(tmp_path):
    refused(gguf(tmp_path, retype("output_norm.weight", kind=99)), "'output_norm.weight' has type 99, which is no ggml type")


def test_gguf_tensor_type_helios_cannot_dequantize(tmp_path):
    refused(gguf(tmp_path, retype("output_norm.weight", kind=26, shape=(64,))), "stored as I32, which Helios cannot dequantize")


def test_gguf_misaligned_offset(tmp_path):
    fields, tensors = tiny_llama_parts()
    offsets, pos = [], 0
    for *_, d in tensors:
        offsets.append(pos)
        pos = -(-(pos + len(d)) // 32) * 32
    offsets[1] += 4
    refused(write(tmp_path, gguf_from_parts(fields, tensors, offsets=offsets)), "not a multiple of the alignment 32")


def test_gguf_overlapping_tensors(tmp_path):
    fields, tensors = tiny_llama_parts()
    offsets, pos = [], 0
    for *_, d in tensors:
        offsets.append(pos)
        pos = -(-(pos + len(d)) // 32) * 32
    offsets[3] = offsets[2]  # the two layer norms, 64 float32 each, on the same bytes
    refused(write(tmp_path, gguf_from_parts(fields, tensors, offsets=offsets)), "'blk.0.attn_norm.weight' and 'blk.0.ffn_norm.weight' overlap")


def test_gguf_bad_alignment(tmp_path):
    refused(gguf(tmp_path, fields={"general.alignment": 24}), "general.alignment is int 24; it must be a power of two")


def test_gguf_duplicate_tensor_names(tmp_path):
    refused(gguf(tmp_path, lambda ts: ts + [ts[1]]), "tensor 'output_norm.weight' appears twice")


def test_gguf_duplicate_metadata_key(tmp_path):
    fields, tensors = tiny_llama_parts()
    data = gguf_from_parts({**fields, "llama.vocab_sizf": 64}, tensors).data  # dict keys are unique: patch the bytes
    refused(write(tmp_path, data.replace(b"llama.vocab_sizf", b"llama.vocab_size")), "metadata key 'llama.vocab_size' appears twice")


def test_gguf_bad_magic(tmp_path):
    data = bytearray(gguf_from_parts(*tiny_llama_parts()).data)
    data[:4] = b"GGML"
    refused(write(tmp_path, bytes(data)), "is not a GGUF file \\(it starts with b'GGML'")


@pytest.mark.parametrize("version", [1, 4, 2**32 - 1])
def test_gguf_bad_version(tmp_path, version):
    refused(gguf(tmp_path, version=version), f"GGUF version {version}; versions 2 and 3 are supported")


def test_gguf_unknown_value_type(tmp_path):
    refused(gguf(tmp_path, fields={"general.odd": Raw(13, b"")}), "'general.odd' has value type 13")


# --- GGUF: metadata of the wrong type, values of no model, shapes the config does not imply -------------------------

def test_gguf_block_count_as_a_string(tmp_path):
    refused(gguf(tmp_path, fields={"llama.block_count": "1"}), "metadata llama.block_count is str '1'; it must be an integer")


def test_gguf_architecture_as_an_array(tmp_path):
    refused(gguf(tmp_path, fields={"general.architecture": ["llama"]}), "general.architecture is list")


@pytest.mark.parametrize("key, value, match", [
    ("llama.attention.head_count", 0, "llama.attention.head_count is int 0"),
    ("llama.block_count", 2**31, "block_count is 2,147,483,648, but the file holds 11 tensors"),
    ("llama.attention.head_count", 3, "head_count=3 does not divide llama.embedding_length=64"),
    ("llama.attention.head_count_kv", 3, "num_heads=4 is not a multiple of num_kv_heads=3")])
def test_gguf_nonsense_counts(tmp_path, key, value, match):
    refused(gguf(tmp_path, fields={key: value}), match)


def test_gguf_missing_required_metadata(tmp_path):
    fields, tensors = tiny_llama_parts()
    del fields["llama.embedding_length"]
    refused(write(tmp_path, gguf_from_parts(fields, tensors)), "has no metadata llama.embedding_length")


def test_gguf_tensor_shape_does_not_match_its_metadata(tmp_path):
    "The metadata says 64 wide; the tensors are 32 wide."
    fields, tensors = tiny_llama_parts(hidden=32)
    fields["llama.embedding_length"] = 64
    msg = refused(write(tmp_path, gguf_from_parts(fields, tensors)), "tensor model.embed_tokens.weight has shape")
    assert "[64, 32]" in msg and "implies [64, 64]" in msg


def test_gguf_missing_tensor(tmp_path):
    refused(gguf(tmp_path, lambda ts: [t for t in ts if t[0] != "blk.0.ffn_up.weight"]),
            "implies a tensor model.layers.0.mlp.up_proj.weight of shape \\[256, 64\\], which the checkpoint does not hold")


def test_gguf_unknown_tensor_name(tmp_path):
    refused(gguf(tmp_path, lambda ts: ts + [("blk.x.attn_q.weight", (64,), 0, bytes(256))]), "'blk.x.attn_q.weight' has no place")


# --- GGUF tokenizer -----------------------------------------------------------------------------------------------

def load_gguf_tokenizer(path): return load_tokenizer(path)


@pytest.mark.parametrize("key, value, match", [
    ("tokenizer.ggml.token_type", [1] * 10, "token_type has 10 entries for 64 tokens"),
    ("tokenizer.ggml.scores", [0.0] * 65, "scores has 65 entries for 64 tokens"),
    ("tokenizer.ggml.merges", ["a b", "abc"], "merges\\[1\\] is 'abc', not two tokens separated by a space"),
    ("tokenizer.ggml.merges", ["a b", "a zz"], "merges\\[1\\] \\('a zz'\\) needs 'zz', which is not in the vocabulary"),
    ("tokenizer.ggml.merges", ["h a"], "needs 'ha'"),
    ("tokenizer.ggml.merges", [1, 2], "merges\\[0\\] is 1"),
    ("tokenizer.ggml.tokens", [], "tokens is not a non-empty array of strings"),
    ("tokenizer.ggml.bos_token_id", 64, "bos_token_id is 64, outside the vocabulary of 64 tokens"),
    ("tokenizer.chat_template", "{% for m in messages %}", "chat template is not valid jinja2")])
def test_gguf_tokenizer_that_lies(tmp_path, key, value, match):
    refused(gguf(tmp_path, fields={key: value}), match, load=load_gguf_tokenizer)


# --- safetensors folders and config.json ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return save_tiny("qwen3_tied", tmp_path_factory.mktemp("tiny_hf"))


@pytest.fixture
def folder(tiny_hf, tmp_path):
    return shutil.copytree(tiny_hf, tmp_path / "model")


def rewrite_header(file, edit=None, raw: bytes | None = None, length: int | None = None):
    "Replace a safetensors file's JSON header (edit(header) -> header, or raw bytes), keeping its data."
    data = file.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = raw if raw is not None else json.dumps(edit(json.loads(data[8:8 + n]))).encode()
    file.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data[8 + n:])


def first_tensor(header): return next(k for k in header if k != "__metadata__")


def test_safetensors_header_length_larger_than_the_file(folder):
    file = folder / "model.safetensors"
    rewrite_header(file, lambda h: h, length=TiB)
    refused(folder, "model.safetensors: is not a valid safetensors file \\(.*header too large")


def test_safetensors_header_not_json(folder):
    rewrite_header(folder / "model.safetensors", raw=b"{this is not json}")
    refused(folder, "model.safetensors: is not a valid safetensors file \\(.*invalid JSON")


def test_safetensors_header_not_an_object(folder):
    rewrite_header(folder / "model.safetensors", raw=b"[1, 2, 3]")
    refused(folder, "model.safetensors: is not a valid safetensors file")


def test_safetensors_unknown_dtype(folder):
    rewrite_header(folder / "model.safetensors", lambda h: {**h, first_tensor(h): {**h[first_tensor(h)], "dtype": "Q9"}})
    refused(folder, "model.safetensors: .*unknown variant `Q9`")


def test_safetensors_data_offsets_past_the_end(folder):
    def edit(h):
        name = first_tensor(h)
        return {**h, name: {**h[name], "data_offsets": [0, 2**50]}}
    rewrite_header(folder / "model.safetensors", edit)
    refused(folder, "model.safetensors: is not a valid safetensors file")


def test_safetensors_offsets_inconsistent_with_shape(folder):
    def edit(h):
        name = first_tensor(h)
        return {**h, name: {**h[name], "shape": [s * 2 for s in h[name]["shape"]]}}
    rewrite_header(folder / "model.safetensors", edit)
    refused(folder, "model.safetensors: .*invalid shape, data type, or offset")


def test_safetensors_overlapping_tensors(folder):
    def edit(h):
        names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
        a, b = h[names[0]], h[names[1]]
        return {**h, names[1]: {**b, "data_offsets": [a["data_offsets"][0], a["data_offsets"][0] + b["data_offsets"][1] - b["data_offsets"][0]]}}
    rewrite_header(folder / "model.safetensors", edit)
    refused(folder, "model.safetensors: is not a valid safetensors file")


def test_safetensors_index_naming_a_file_outside_the_folder(folder):
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "../../etc/passwd"}}))
    refused(folder, "model.safetensors.index.json: names shard '../../etc/passwd'")


def test_safetensors_tensor_the_model_has_no_place_for(folder):
    import torch
    from safetensors.torch import load_file, save_file
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.mystery.weight"] = torch.zeros(2)
    save_file(tensors, folder / "model.safetensors")
    refused(folder, "its tensors do not make a qwen3 model: .*Unexpected key.*model.layers.0.mystery.weight")


def edit_config(folder, **changes):
    file = folder / "config.json"
    config = {**json.loads(file.read_text()), **changes}
    file.write_text(json.dumps({k: v for k, v in config.items() if v is not ...}))


def test_config_shapes_do_not_match_the_tensors(folder):
    "config.json says 128 wide; the tensors are 64 wide: the tensor, the expected and the found shape."
    edit_config(folder, hidden_size=128)
    msg = refused(folder, "model.safetensors: tensor model.embed_tokens.weight has shape \\[512, 64\\], but config.json implies \\[512, 128\\]")
    assert str(folder / "model.safetensors") in msg


def test_config_missing_required_key(folder):
    edit_config(folder, num_attention_heads=...)
    refused(folder, "config.json: has no 'num_attention_heads', which a qwen3 config needs")


@pytest.mark.parametrize("changes, match", [
    (dict(num_hidden_layers=-2), "num_hidden_layers is int -2; it must be a whole number of at least 1"),
    (dict(num_hidden_layers=10**12), "num_hidden_layers is 1,000,000,000,000; Helios reads at most"),
    (dict(hidden_size="64"), "hidden_size is str '64'"),
    (dict(num_attention_heads=3, head_dim=...), "num_attention_heads=3 does not divide hidden_size=64, and no head_dim is given"),
    (dict(num_key_value_heads=3), "num_heads=4 is not a multiple of num_kv_heads=3"),
    (dict(head_dim=31), "head_dim=31 must be even for RoPE")])
def test_config_nonsense_values(folder, changes, match):
    edit_config(folder, **changes)
    refused(folder, "config.json: " + match)


def test_config_not_json(folder):
    (folder / "config.json").write_text('{"model_type": "qwen3",')
    refused(folder, "config.json: is not valid JSON")


def test_config_not_an_object(folder):
    (folder / "config.json").write_text('["qwen3"]')
    refused(folder, "config.json: holds a JSON list, not an object")


# --- tokenizer.json ------------------------------------------------------------------------------------------------

def bpe_tokenizer_json(merges) -> str:
    return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
                       "pre_tokenizer": None, "post_processor": None, "decoder": None,
                       "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                                 "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                                 "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": merges}})


@pytest.mark.parametrize("text, match", [
    (bpe_tokenizer_json([["a", "b"]]), None),
    (bpe_tokenizer_json([["a", "b", "c"]]), "tokenizer.json: is not a tokenizer the tokenizers library can read"),
    (bpe_tokenizer_json(["ab"]), "Merges text file invalid"),
    (bpe_tokenizer_json([["a", "z"]]), "Token `z` out of vocabulary"),
    ("{not json", "tokenizer.json: is not a tokenizer"),
    ("", "tokenizer.json: is not a tokenizer")])
def test_tokenizer_json_with_malformed_merges(tmp_path, text, match):
    (tmp_path / "tokenizer.json").write_text(text)
    if match is None: assert tokenizer_from_folder(tmp_path).encode("ab") == [2]
    else: refused(tmp_path / "tokenizer.json", match, load=lambda p: tokenizer_from_folder(p.parent))


def test_tokenizer_json_missing(tmp_path):
    refused(tmp_path / "tokenizer.json", "tokenizer.json: does not exist", load=lambda p: tokenizer_from_folder(p.parent))


def test_tokenizer_config_not_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text(bpe_tokenizer_json([["a", "b"]]))
    (tmp_path / "tokenizer_config.json").write_text("{")
    refused(tmp_path / "tokenizer_config.json", "tokenizer_config.json: is not valid JSON", load=lambda p: tokenizer_from_folder(p.parent))


def test_chat_template_that_does_not_compile_names_its_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text(bpe_tokenizer_json([["a", "b"]]))
    (tmp_path / "chat_template.jinja").write_text("{% if messages %}")
    refused(tmp_path / "chat_template.jinja", "chat_template.jinja: its chat template is not valid jinja2",
            load=lambda p: tokenizer_from_folder(p.parent))


def test_gguf_reader_is_lazy_about_tensor_bytes(tmp_path):
    "Parsing a GGUF copies no tensor: the tensors stay views of the memory-mapped file."
    path = gguf(tmp_path)
    reader = GGUFFile(path)
    assert all(not t.data.flags.owndata for t in reader.tensors)


# --- the command line ----------------------------------------------------------------------------------------------

def run_generate(model) -> subprocess.CompletedProcess:
    return subprocess.run(["helios", "generate", "hi", "--model", str(model), "--max-tokens", "2", "--device", "cpu"],
                          capture_output=True, text=True, timeout=300)


def test_cli_prints_one_line_for_a_hostile_gguf(tmp_path):
    path = gguf(tmp_path, n_tensors=TiB)
    result = run_generate(path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert lines[-1].startswith(f"helios: error: {path}: is truncated or corrupt") and len(lines) == 1, result.stderr


def test_cli_prints_one_line_for_a_config_that_does_not_match(folder):
    edit_config(folder, hidden_size=128)
    result = run_generate(folder)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"helios: error: {folder / 'model.safetensors'}: tensor "
                                                             "model.embed_tokens.weight has shape [512, 64]")
