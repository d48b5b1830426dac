"""Write a tiny GGUF from a transformers checkpoint, one quantization type per tensor kind.

llama.cpp's own converter is not a dependency; this writes the same layout for the tensors our
tests need, with the `gguf` package's writer. K-quant blocks (which `gguf` cannot quantize) are
random bytes with small, finite scales: both loaders then dequantize the very same bytes.
"""
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q, GGUFWriter
from gguf.quants import quantize

# which quantization each tensor kind gets: every type the loader must support appears once
TYPES = {"token_embd": Q.Q8_0, "attn_q": Q.Q4_K, "attn_k": Q.Q6_K, "attn_v": Q.Q4_0,
         "attn_output": Q.Q4_1, "ffn_gate": Q.BF16, "ffn_up": Q.F16, "ffn_down": Q.Q8_0, "output": Q.Q6_K,
         # qwen3moe: each layer's experts as 3-D tensors [experts, rows, cols]; the router stays float32
         "ffn_gate_exps": Q.Q8_0, "ffn_up_exps": Q.Q4_0, "ffn_down_exps": Q.F16}
HF_TO_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
              "post_attention_layernorm": "ffn_norm", "self_attn.q_norm": "attn_q_norm",
              "self_attn.k_norm": "attn_k_norm"}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight": return "token_embd.weight"
    if hf == "model.norm.weight": return "output_norm.weight"
    if hf == "lm_head.weight": return "output.weight"
    if hf.endswith(".mlp.experts.down_proj"): return f"blk.{hf.split('.')[2]}.ffn_down_exps.weight"
    if hf.endswith(".mlp.gate.weight"): return f"blk.{hf.split('.')[2]}.ffn_gate_inp.weight"
    _, _, layer, *part, kind = hf.split(".")
    return f"blk.{layer}.{HF_TO_GGUF['.'.join(part)]}.{kind}"


def gguf_tensors(sd: dict, tied: bool) -> dict[str, np.ndarray]:
    "llama.cpp's names for a transformers state dict; the stacked [gate | up] experts split into two 3-D tensors."
    out = {}
    for name, tensor in sd.items():
        if name == "lm_head.weight" and tied: continue
        arr = tensor.numpy()
        if name.endswith(".mlp.experts.gate_up_proj"):  # [E, 2I, H] -> gate [E, I, H], up [E, I, H]
            layer, inter = name.split(".")[2], arr.shape[1] // 2
            out[f"blk.{layer}.ffn_gate_exps.weight"] = np.ascontiguousarray(arr[:, :inter])
            out[f"blk.{layer}.ffn_up_exps.weight"] = np.ascontiguousarray(arr[:, inter:])
        else:
            out[gguf_name(name)] = arr
    return out


def permute_for_llama_cpp(w: np.ndarray, n_heads: int) -> np.ndarray:
    "llama.cpp's q/k row order for the llama architecture (pairs interleaved per head)."
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_k_blocks(rows: int, cols: int, qtype: Q, rng) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = np.array([0.002], dtype=np.float16).view(np.uint8)
    if qtype == Q.Q4_K:  # d, dmin (f16) lead the block
        raw[..., 0:2] = scale; raw[..., 2:4] = scale
    else:                # Q6_K: d (f16) ends the block
        raw[..., size - 2:size] = np.array([0.0002], dtype=np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def encode(w: np.ndarray, qtype: Q, rng) -> np.ndarray:
    if qtype == Q.F16: return w.astype(np.float16)
    if qtype in (Q.Q4_K, Q.Q6_K): return random_k_blocks(*w.shape, qtype, rng)
    return quantize(w, qtype)


def write_gguf(hf_folder: Path, out: Path, arch: str) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(hf_folder)
    sd = AutoModelForCausalLM.from_pretrained(hf_folder, dtype=torch.float32).state_dict()
    w = GGUFWriter(out, arch)
    w.add_block_count(cfg.num_hidden_layers); w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size); w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads); w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim); w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"]); w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    if arch == "qwen3moe":
        w.add_expert_count(cfg.num_experts); w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size); w.add_expert_weights_norm(cfg.norm_topk_prob)
    rng = np.random.default_rng(0)
    for t, arr in gguf_tensors(sd, cfg.tie_word_embeddings).items():
        kind = t.split(".")[-2] if t.startswith("blk.") else t.split(".")[0]
        if arch == "llama" and kind in ("attn_q", "attn_k"):
            arr = permute_for_llama_cpp(arr, cfg.num_attention_heads if kind == "attn_q" else cfg.num_key_value_heads)
        qtype = TYPES.get(kind, Q.F32) if arr.ndim >= 2 else Q.F32
        data = encode(arr, qtype, rng) if qtype != Q.F32 else arr
        w.add_tensor(t, data, raw_shape=data.shape if qtype in (Q.F32, Q.F16) else None, raw_dtype=qtype)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return out


# --- GGUF bytes from parts, for files that lie -------------------------------------------------------------------
# GGUFWriter refuses to write what the hostile-file tests need (counts that lie, unknown types, bad offsets), so
# these few lines write the format directly. Every count and length field's position is recorded for the fuzz test.
import struct as _struct  # noqa: E402


class Raw:
    "A metadata value written as given: its GGUF type number and its encoded bytes."
    def __init__(self, kind: int, payload: bytes): self.kind, self.payload = kind, payload


def _string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return _struct.pack("<Q", len(b)) + b


def _value(v) -> tuple[int, bytes]:
    "(GGUF type, bytes) of a Python value: bool, int (u32, or i64 when it does not fit), float (f32), str, list."
    if isinstance(v, Raw): return v.kind, v.payload
    if isinstance(v, bool): return 7, _struct.pack("<?", v)
    if isinstance(v, int): return (4, _struct.pack("<I", v)) if 0 <= v < 2**32 else (11, _struct.pack("<q", v))
    if isinstance(v, float): return 6, _struct.pack("<f", v)
    if isinstance(v, (str, bytes)): return 8, _string(v)
    kinds = [_value(x) for x in v]
    elem = kinds[0][0] if kinds else 4
    return 9, _struct.pack("<IQ", elem, len(v)) + b"".join(p for _, p in kinds)


class GGUFParts:
    """A GGUF as bytes, where its count and length fields are (offset, size in bytes) for tests that corrupt them,
    and where its tensor descriptions and its tensor data start."""
    def __init__(self, data: bytes, counts: list[tuple[int, int]], infos_start: int, data_start: int):
        self.data, self.counts, self.infos_start, self.data_start = data, counts, infos_start, data_start


def gguf_from_parts(fields: dict, tensors: list[tuple[str, tuple[int, ...], int, bytes]], *, version: int = 3,
                    n_tensors: int | None = None, n_fields: int | None = None, alignment: int = 32,
                    offsets: list[int] | None = None) -> GGUFParts:
    """GGUF bytes: metadata `fields` (Python values or `Raw`), `tensors` as (name, PyTorch shape, ggml type, bytes),
    laid out aligned unless `offsets` says where; `n_tensors`/`n_fields` may lie."""
    out, counts = bytearray(b"GGUF" + _struct.pack("<I", version)), []
    counts.append((len(out), 8)); out += _struct.pack("<Q", len(tensors) if n_tensors is None else n_tensors)
    counts.append((len(out), 8)); out += _struct.pack("<Q", len(fields) if n_fields is None else n_fields)
    for key, v in fields.items():
        counts.append((len(out), 8)); out += _string(key)
        kind, payload = _value(v)
        counts.append((len(out), 4)); out += _struct.pack("<I", kind)
        if kind == 8: counts.append((len(out), 8))
        if kind == 9: counts += [(len(out), 4), (len(out) + 4, 8)]
        out += payload
    pos, placed = 0, []
    for i, (_, _, _, data) in enumerate(tensors):
        placed.append(offsets[i] if offsets is not None else pos)
        pos = -(-(placed[-1] + len(data)) // alignment) * alignment
    infos_start = len(out)
    for (name, shape, kind, _), offset in zip(tensors, placed):
        counts.append((len(out), 8)); out += _string(name)
        counts.append((len(out), 4)); out += _struct.pack("<I", len(shape))
        for d in reversed(shape):
            counts.append((len(out), 8)); out += _struct.pack("<Q", d)
        counts.append((len(out), 4)); out += _struct.pack("<I", kind)
        counts.append((len(out), 8)); out += _struct.pack("<Q", offset)
    data_start = -(-len(out) // alignment) * alignment
    out += bytes(data_start - len(out))
    end = max([o + len(d) for o, (*_, d) in zip(placed, tensors)], default=0)
    body = bytearray(end)
    for offset, (*_, data) in zip(placed, tensors): body[offset:offset + len(data)] = data
    return GGUFParts(bytes(out + body), counts, infos_start, data_start)


def tiny_llama_parts(vocab: int = 64, hidden: int = 64, layers: int = 1, heads: int = 4, kv_heads: int = 2,
                     ffn: int = 256, **overrides) -> tuple[dict, list]:
    """The metadata (with a small byte-level BPE tokenizer and a chat template) and tensors of a tiny llama GGUF,
    one tensor per quantization kind the loader meets; `overrides` replace metadata values."""
    rng = np.random.default_rng(0)
    letters = [chr(c) for c in range(ord("a"), ord("a") + 26)]
    tokens = (letters + [a + b for a in "abc" for b in "abcdefgh"] + ["<s>", "</s>"] + [f"x{i}" for i in range(vocab)])[:vocab]
    merges = [f"{a} {b}" for a in "abc" for b in "abcdefgh"]
    fields = {"general.architecture": "llama", "general.alignment": 32, "llama.block_count": layers,
              "llama.context_length": 256, "llama.embedding_length": hidden, "llama.feed_forward_length": ffn,
              "llama.attention.head_count": heads, "llama.attention.head_count_kv": kv_heads,
              "llama.rope.freq_base": 10000.0, "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.vocab_size": vocab,
              "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
              "tokenizer.ggml.scores": [0.0] * vocab, "tokenizer.ggml.token_type": [1] * (vocab - 2) + [3, 3],
              "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": vocab - 2, "tokenizer.ggml.eos_token_id": vocab - 1,
              "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}
    fields.update(overrides)

    def tensor(name, shape, qtype):
        w = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        data = encode(w, qtype, rng) if qtype != Q.F32 else w
        return name, shape, int(qtype), np.ascontiguousarray(data).tobytes()
    q, kv = heads * (hidden // heads), kv_heads * (hidden // heads)
    tensors = [tensor("token_embd.weight", (vocab, hidden), Q.Q8_0), tensor("output_norm.weight", (hidden,), Q.F32)]
    for i in range(layers):
        tensors += [tensor(f"blk.{i}.attn_norm.weight", (hidden,), Q.F32), tensor(f"blk.{i}.ffn_norm.weight", (hidden,), Q.F32),
                    tensor(f"blk.{i}.attn_q.weight", (q, hidden), Q.Q4_0), tensor(f"blk.{i}.attn_k.weight", (kv, hidden), Q.Q4_1),
                    tensor(f"blk.{i}.attn_v.weight", (kv, hidden), Q.F16), tensor(f"blk.{i}.attn_output.weight", (hidden, q), Q.Q8_0),
                    tensor(f"blk.{i}.ffn_gate.weight", (ffn, hidden), Q.Q8_0), tensor(f"blk.{i}.ffn_up.weight", (ffn, hidden), Q.Q4_0),
                    tensor(f"blk.{i}.ffn_down.weight", (hidden, ffn), Q.Q6_K)]
    return fields, tensors
