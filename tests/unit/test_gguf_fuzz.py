"""Fuzzing the GGUF reader: a tiny llama GGUF (metadata, tokenizer, one tensor per quantization kind), mutated
deterministically: bytes flipped in the header and metadata, count and length fields set to huge or off-by-one
values, truncation anywhere. Each case either loads or raises the one-line `ModelFileError` naming the file, in
bounded time and memory; never another exception, never a crash."""
import time
import tracemalloc

import numpy as np
import pytest

from gguf_writer import gguf_from_parts, tiny_llama_parts
from helios.formats.errors import ModelFileError
from helios.formats.gguf import GGUFFile, config_from_gguf, dequantize_tensor, gguf_tensor_shapes
from helios.tokenizer import tokenizer_from_gguf
from helios.weights import check_tensor_shapes, load_model

SEED = 45
CASES_PER_KIND = 150      # 4 kinds: 600 cases, a few seconds on a 2-core CPU
MAX_CASE_S = 2.0          # generous for a loaded CI machine: a case takes milliseconds
MAX_EXTRA_BYTES = 4 << 20  # Python objects made for the metadata, beyond the file's own size
FULL_LOAD_EVERY = 10      # every tenth case also builds the model (dequantize, stack, adopt)
HUGE = [2**64 - 1, 2**63, 2**63 - 1, 2**40, 2**32, 2**32 - 1, 2**31]


@pytest.fixture(scope="module")
def base():
    fields, tensors = tiny_llama_parts()
    return gguf_from_parts(fields, tensors)


def load_checks(path, full: bool):
    "What loading does before and around the model: parse, config, names, types, shapes, tokenizer, a few tensors."
    reader = GGUFFile(path)
    cfg = config_from_gguf(reader)
    check_tensor_shapes(cfg, {name: (path, shape) for name, shape in gguf_tensor_shapes(reader).items()}, path)
    tokenizer_from_gguf(reader).encode("abc ab")
    for t in reader.tensors[:4]: dequantize_tensor(t)
    if full: load_model(path, dtype="float32", device="cpu", optimize=False)


def mutations(base, kind: str, rng):
    "One mutated file's bytes and a description of the change."
    data = bytearray(base.data)
    if kind == "truncate":  # mostly inside the header and metadata, sometimes inside the tensor data
        cut = int(rng.integers(0, base.data_start)) if rng.random() < 0.8 else int(rng.integers(base.data_start, len(data)))
        return bytes(data[:cut]), f"truncated at {cut}"
    if kind == "flip":
        where = [int(rng.integers(0, base.data_start)) for _ in range(int(rng.integers(1, 5)))]
        for i in where: data[i] ^= int(rng.integers(1, 256))
        return bytes(data), f"bytes flipped at {where}"
    offset, size = base.counts[int(rng.integers(len(base.counts)))]
    old = int.from_bytes(data[offset:offset + size], "little")
    if kind == "huge": new = HUGE[int(rng.integers(len(HUGE)))] % (1 << 8 * size)
    else: new = (old + int(rng.choice([-2, -1, 1, 2, 3, 1000]))) % (1 << 8 * size)  # "off": counts off by a little
    data[offset:offset + size] = new.to_bytes(size, "little")
    return bytes(data), f"{size}-byte field at {offset}: {old} -> {new}"


def run_case(path, data: bytes, full: bool) -> str:
    "Write and load one case; the outcome's name, after checking time, memory and the error's shape."
    path.unlink(missing_ok=True)  # a fresh file: an earlier case's reader may still map the old one
    path.write_bytes(data)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        load_checks(path, full)
        outcome = "loaded"
    except ModelFileError as e:
        message = str(e)
        assert message.startswith(f"{path}: ") and "\n" not in message and len(message) < 600, message
        outcome = "refused"
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < MAX_CASE_S, f"took {elapsed:.2f} s"
    assert peak < len(data) * 16 + MAX_EXTRA_BYTES, f"peak {peak:,} bytes for a file of {len(data):,}"
    return outcome


@pytest.mark.parametrize("kind", ["truncate", "flip", "huge", "off"])
def test_mutated_gguf_loads_or_is_refused_in_one_line(base, kind, tmp_path):
    rng = np.random.default_rng([SEED, ["truncate", "flip", "huge", "off"].index(kind)])
    path, outcomes = tmp_path / "fuzzed.gguf", {"loaded": 0, "refused": 0}
    for case in range(CASES_PER_KIND):
        data, change = mutations(base, kind, rng)
        try:
            outcomes[run_case(path, data, full=case % FULL_LOAD_EVERY == 0)] += 1
        except Exception as e:  # anything but a ModelFileError (or a broken bound) fails, saying how to replay it
            raise AssertionError(f"case {case} of {kind!r} ({change}): {type(e).__name__}: {e}") from e
    assert outcomes["refused"] > 0  # the mutations do reach the checks
    if kind == "truncate": assert outcomes["loaded"] == 0  # a GGUF cut short is never taken for whole


def test_the_unmutated_file_loads(base, tmp_path):
    assert run_case(tmp_path / "tiny.gguf", base.data, full=True) == "loaded"
