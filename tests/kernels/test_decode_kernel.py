"""The C decode kernel (appendix 92, `helios.kernels.attention`): equal to the reference attention, the CPU default where it builds, and a clear
fallback or error where it does not."""
import random
import warnings

import pytest
import torch

from conftest import TEST_KV_BYTES
from helios import LLM, SamplingParams
from helios.attention.base import choose_backend
from helios.attention.reference import BatchedAttention, reference_attention
from helios.config import ModelConfig
from helios.kernels.attention import CKernels, c_kernels
from helios.kernels.build import LAYER_SOURCES, KernelUnavailable, build_kernels, c_compiler
from helios.kv.batch import build_paged_batch
from helios.kv.pages import pages_needed
from helios.registry import NotApplicable
from kernel_support import builds, needs_kernels

CPU = torch.device("cpu")

needs_compiler = needs_kernels(builds(lambda: build_kernels(64, 3, 3, sources=LAYER_SOURCES)))  # what the backend loads


def choose_attention_backend(cfg, kv_dtype, device, attention="auto"):
    "The backend the engine would get: chapter 08's choice through the registry."
    return choose_backend(cfg, kv_dtype, device, attention).value


def attention_config(num_heads, num_kv_heads, head_dim) -> ModelConfig:
    return ModelConfig(architecture="llama", vocab_size=8, hidden_size=num_heads * head_dim, intermediate_size=8,
                       num_layers=1, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim)


def random_tick(seed, num_heads, num_kv_heads, head_dim, page_size, decode_only, max_pages=10):
    "Random pages and a batch of sequences with scattered pages; some decoding, some prefilling."
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    num_pages = 12 * max_pages
    k_pages = torch.randn(num_pages, page_size, num_kv_heads, head_dim, generator=gen)
    v_pages = torch.randn(num_pages, page_size, num_kv_heads, head_dim, generator=gen)
    lens = [1 if decode_only or rng.random() < 0.6 else rng.randint(2, 9) for _ in range(rng.randint(1, 9))]
    starts = [rng.randint(0, max_pages * page_size - 10) for _ in lens]
    free = list(range(num_pages)); rng.shuffle(free)
    tables = torch.zeros(len(lens), max_pages + 1, dtype=torch.long)
    for i, (s, n) in enumerate(zip(starts, lens)):
        for j in range(pages_needed(s + n, page_size)): tables[i, j] = free.pop()
    q = torch.randn(1, sum(lens), num_heads, head_dim, generator=gen) * 2
    return q, k_pages, v_pages, build_paged_batch(tables, starts, lens, page_size)


@needs_compiler
@pytest.mark.parametrize("shape", [(9, 3, 64, 16), (16, 8, 128, 8), (8, 2, 64, 4), (4, 4, 8, 4), (8, 1, 32, 8),
                                   (12, 4, 16, 256), (6, 2, 80, 8), (4, 4, 40, 8), (16, 1, 64, 8)])
@pytest.mark.parametrize("seed", range(4))
def test_kernel_equals_reference(shape, seed, threads):
    num_heads, num_kv_heads, head_dim, page_size = shape
    backend = c_kernels(attention_config(num_heads, num_kv_heads, head_dim), torch.float32, CPU)
    torch.set_num_threads(1 + seed % 3)  # one thread, two, three: rows or slices of heads per thread
    q, k_pages, v_pages, batch = random_tick(seed, num_heads, num_kv_heads, head_dim, page_size, seed % 2 == 0)
    torch.testing.assert_close(backend(q, k_pages, v_pages, batch), reference_attention(q, k_pages, v_pages, batch),
                               atol=1e-5, rtol=1e-5)


@needs_compiler
@pytest.mark.parametrize("shape", [(9, 3, 64, 16), (8, 2, 32, 8), (4, 4, 16, 256)])
def test_prefill_chunks_are_rows_of_the_kernel(shape, threads):
    "Long chunks over scattered pages, one after earlier context, next to decode rows: token i sees positions[i] + 1 keys."
    num_heads, num_kv_heads, head_dim, page_size = shape
    backend = c_kernels(attention_config(num_heads, num_kv_heads, head_dim), torch.float32, CPU)
    gen = torch.Generator().manual_seed(0)
    k_pages, v_pages = (torch.randn(60, page_size, num_kv_heads, head_dim, generator=gen) for _ in "kv")
    starts, lens = [0, 30, 99, 7], [70, 45, 1, 1]  # a prompt's first chunk, a later chunk, two decode rows
    tables = torch.randperm(60, generator=gen)[:4 * 15].view(4, 15)
    batch = build_paged_batch(tables, starts, lens, page_size)
    q = torch.randn(1, sum(lens), num_heads, head_dim, generator=gen) * 2
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        torch.testing.assert_close(backend(q, k_pages, v_pages, batch), reference_attention(q, k_pages, v_pages, batch),
                                   atol=1e-5, rtol=1e-5)
    tables_per_token, seen = backend.attention.token_rows(batch)
    assert seen.tolist() == [p + 1 for s, n in zip(starts, lens) for p in range(s, s + n)]
    assert torch.equal(tables_per_token, tables.repeat_interleave(torch.tensor(lens), dim=0))


@needs_compiler
def test_kernel_on_a_long_context_and_extreme_scores(threads):
    "One row of 5,000 tokens over 20 scattered pages, with scores far apart (exp of very negative numbers is 0)."
    backend = c_kernels(attention_config(4, 2, 64), torch.float32, CPU)
    gen = torch.Generator().manual_seed(0)
    k_pages, v_pages = torch.randn(40, 256, 2, 64, generator=gen), torch.randn(40, 256, 2, 64, generator=gen)
    batch = build_paged_batch(torch.randperm(40, generator=gen)[:20][None], [4999], [1], 256)
    for scale, n in ((1.0, 1), (30.0, 2)):
        torch.set_num_threads(n)
        q = torch.randn(1, 1, 4, 64, generator=gen) * scale
        torch.testing.assert_close(backend(q, k_pages, v_pages, batch), reference_attention(q, k_pages, v_pages, batch),
                                   atol=1e-5, rtol=1e-5)


@needs_compiler
@pytest.mark.parametrize("n", [1, 7, 8, 9, 17, 23])
def test_the_largest_score_is_found_in_the_vectors_and_in_the_tail(n, threads):
    "One key far above the others, at every position of contexts that are and are not multiples of 8: a maximum that missed it would overflow exp."
    backend = c_kernels(attention_config(2, 1, 8), torch.float32, CPU)
    gen = torch.Generator().manual_seed(n)
    batch = build_paged_batch(torch.tensor([[0]]), [n - 1], [1], 32)
    q = torch.ones(1, 1, 2, 8)
    for where in range(n):
        k_pages, v_pages = torch.randn(1, 32, 1, 8, generator=gen) * 0.01, torch.randn(1, 32, 1, 8, generator=gen)
        k_pages[0, where] = 100.0  # score 283 there, ~0 elsewhere
        out = backend(q, k_pages, v_pages, batch)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, reference_attention(q, k_pages, v_pages, batch), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out[0, 0, 0], v_pages[0, where, 0], atol=1e-5, rtol=1e-5)

@needs_compiler
@pytest.mark.parametrize("page_size", [8, 16, 48, 256])
def test_a_row_gives_the_same_bits_in_a_chunk_as_alone(page_size, threads):
    """Every row of a prompt chunk must come out bit for bit as it does alone (a decode row): a row's attention may
    not depend on how its prompt was chunked, however a kernel shares work among a chunk's rows (the Benchmarks
    page's prediction log, row 18, tried blocks of rows). The second sequence starts where the first ends, one token of
    context more, on other pages: a kernel that grouped consecutive rows must not group these."""
    backend = c_kernels(attention_config(9, 3, 64), torch.float32, CPU)
    gen = torch.Generator().manual_seed(page_size)
    num_pages = 2 * pages_needed(180, page_size) + 2
    k_pages, v_pages = (torch.randn(num_pages, page_size, 3, 64, generator=gen) for _ in "kv")
    tables = torch.randperm(num_pages, generator=gen).view(2, -1)
    starts, lens = [100, 140], [40, 37]  # rows 100..139 of one sequence, then 140..176 of another: two tiles
    batch = build_paged_batch(tables, starts, lens, page_size)
    q = torch.randn(1, sum(lens), 9, 64, generator=gen)
    for n in (1, 2):
        torch.set_num_threads(n)
        together = backend(q, k_pages, v_pages, batch)
        torch.testing.assert_close(together, reference_attention(q, k_pages, v_pages, batch), atol=1e-5, rtol=1e-5)
        row = 0
        for seq, (start, length) in enumerate(zip(starts, lens)):
            for position in range(start, start + length):
                alone = backend(q[:, row:row + 1], k_pages, v_pages, build_paged_batch(tables[seq:seq + 1], [position], [1], page_size))
                assert torch.equal(alone[0, 0], together[0, row]), (seq, position)
                row += 1


@needs_compiler
def test_each_row_reads_through_its_own_page_table(threads):
    """Rows of one sequence whose tables differ past the pages a row needs: here the first row's table holds only
    the page it needs, then a wrong page. Every row must read through its own table (a kernel that grouped the rows
    and read through the first one's would read the wrong page)."""
    backend = c_kernels(attention_config(9, 3, 64), torch.float32, CPU)
    gen = torch.Generator().manual_seed(0)
    k_pages, v_pages = (torch.randn(3, 8, 3, 64, generator=gen) for _ in "kv")
    lens = torch.arange(5, 13)                                  # one sequence's tokens at positions 4..11
    tables = torch.tensor([[0, 1]] * len(lens))
    tables[0, 1] = 2                                            # row 0 sees 5 tokens: page 0 only
    q = torch.randn(len(lens), 9, 64, generator=gen)
    for n in (1, 2):
        torch.set_num_threads(n)
        together = backend.decode(q, k_pages, v_pages, tables, lens)
        for r in range(len(lens)):
            alone = backend.decode(q[r:r + 1], k_pages, v_pages, tables[r:r + 1], lens[r:r + 1])
            assert torch.equal(alone[0], together[r]), r


@needs_compiler
def test_kernel_refuses_a_shape_it_was_not_built_for():
    backend = c_kernels(attention_config(4, 2, 16), torch.float32, CPU)
    q, k_pages, v_pages, batch = random_tick(0, 4, 1, 16, 8, decode_only=True)
    with pytest.raises(ValueError, match="built for 4 query and 2 KV heads of 16"):
        backend(q, k_pages, v_pages, batch)


@needs_compiler
def test_built_kernel_is_reused_from_the_cache(tmp_path):
    path = build_kernels(64, 3, 3, cache_dir=tmp_path)
    built = path.stat().st_mtime_ns
    assert build_kernels(64, 3, 3, cache_dir=tmp_path) == path and path.stat().st_mtime_ns == built
    assert build_kernels(64, 2, 3, cache_dir=tmp_path) != path  # another shape, another library
    assert not list(tmp_path.glob("*.partial"))


def test_no_compiler_falls_back_with_a_warning_or_fails_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    cfg = attention_config(4, 2, 16)
    with pytest.warns(RuntimeWarning, match=r"c is unavailable, falling back \(no C compiler"):
        assert isinstance(choose_attention_backend(cfg, torch.float32, CPU, "auto"), BatchedAttention)
    with pytest.raises(KernelUnavailable, match="no C compiler"):
        choose_attention_backend(cfg, torch.float32, CPU, "c")


def test_a_compiler_that_fails_says_what_it_ran(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    with pytest.raises(KernelUnavailable, match="did not compile") as e:
        choose_attention_backend(attention_config(4, 2, 16), torch.float32, CPU, "c")
    assert "-fopenmp" in str(e.value) and "-DHEAD_DIM=16" in str(e.value)
    assert not list(tmp_path.rglob("*.so")) and not list(tmp_path.rglob("*.partial"))


def test_shapes_and_dtypes_the_kernel_does_not_cover_use_pytorch():
    with pytest.warns(RuntimeWarning, match="head_dim 12 is not a multiple of 8"):
        assert isinstance(choose_attention_backend(attention_config(4, 2, 12), torch.float32, CPU), BatchedAttention)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a bfloat16 engine never had the kernel: no warning
        assert isinstance(choose_attention_backend(attention_config(4, 2, 16), torch.bfloat16, CPU), BatchedAttention)
        assert isinstance(choose_attention_backend(attention_config(4, 2, 16), torch.float32, CPU, "torch"), BatchedAttention)
    with pytest.raises(NotApplicable, match="not torch.bfloat16"):
        choose_attention_backend(attention_config(4, 2, 16), torch.bfloat16, CPU, "c")


@needs_compiler
def test_engine_tokens_are_the_same_with_either_backend(tiny_folder):
    "Greedy tokens of a mixed batch (prefills next to decodes, several pages, a shared prefix) through both backends."
    rng = random.Random(0)
    shared = [rng.randrange(500) for _ in range(40)]
    prompts = [shared + [rng.randrange(500) for _ in range(n)] for n in (1, 5, 30, 90, 7, 60)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs = {}
    for attention in ("c", "torch"):
        with LLM(tiny_folder, dtype="float32", device="cpu", quiet=True, kv_cache_bytes=TEST_KV_BYTES,
                 max_batch_size=4, prefill_chunk_size=48, page_size=16, attention=attention) as llm:
            backend = llm.engine.runner.backend
            assert isinstance(backend, CKernels) if attention == "c" else isinstance(backend, BatchedAttention)
            outputs[attention] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outputs["c"] == outputs["torch"]


@needs_compiler
def test_the_kernel_is_the_cpu_default_and_named_at_start_up(tiny_folder, monkeypatch, capsys):
    monkeypatch.delenv("HELIOS_ATTENTION", raising=False)
    with LLM(tiny_folder, dtype="float32", device="cpu", kv_cache_bytes=TEST_KV_BYTES) as llm:
        assert llm.engine.runner.backend.name == "C kernels"
    assert "attention: C kernels" in capsys.readouterr().err
    monkeypatch.setenv("HELIOS_ATTENTION", "torch")
    with LLM(tiny_folder, dtype="float32", device="cpu", quiet=True, kv_cache_bytes=TEST_KV_BYTES) as llm:
        assert isinstance(llm.engine.runner.backend, BatchedAttention)


@needs_compiler
def test_an_unwritable_cache_falls_back(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(blocker))  # kernels would go to file/kernels: impossible
    with pytest.raises(KernelUnavailable, match="set HELIOS_CACHE_DIR to a writable folder"):
        choose_attention_backend(attention_config(4, 2, 16), torch.float32, CPU, "c")
    with pytest.warns(RuntimeWarning, match="falling back"):
        assert isinstance(choose_attention_backend(attention_config(4, 2, 16), torch.float32, CPU), BatchedAttention)


@needs_compiler
def test_cc_may_carry_arguments(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "cc -Wall")  # as in CC="ccache gcc"
    assert c_compiler()[1:] == ["-Wall"]
    assert build_kernels(16, 2, 2, cache_dir=tmp_path).exists()
    monkeypatch.setenv("CC", "")  # empty: the default
    assert c_compiler() is not None


@needs_compiler
def test_a_broken_library_in_the_cache_is_built_again(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    cfg = attention_config(4, 2, 16)
    path = build_kernels(16, 2, 2, sources=LAYER_SOURCES)  # what the backend loads: attention and layer kernels
    path.write_bytes(b"not a shared library")
    backend = c_kernels(cfg, torch.float32, CPU)
    assert backend.library == path and path.read_bytes()[:4] == b"\x7fELF"
    q, k_pages, v_pages, batch = random_tick(1, 4, 2, 16, 8, decode_only=True)
    torch.testing.assert_close(backend(q, k_pages, v_pages, batch), reference_attention(q, k_pages, v_pages, batch),
                               atol=1e-5, rtol=1e-5)


@needs_compiler
def test_no_home_folder_falls_back(monkeypatch):
    "A container user with no HOME and no passwd entry: Path.home() raises RuntimeError, the engine still starts."
    monkeypatch.delenv("HELIOS_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    def no_home(): raise RuntimeError("Could not determine home directory.")
    monkeypatch.setattr("pathlib.Path.home", staticmethod(no_home))
    with pytest.warns(RuntimeWarning, match="set HELIOS_CACHE_DIR"):
        assert isinstance(choose_attention_backend(attention_config(4, 2, 16), torch.float32, CPU), BatchedAttention)


@needs_compiler
def test_decode_refuses_tables_it_would_misread():
    backend = c_kernels(attention_config(4, 2, 16), torch.float32, CPU)
    q, k_pages, v_pages = torch.randn(2, 4, 16), torch.randn(8, 8, 2, 16), torch.randn(8, 8, 2, 16)
    tables, lens = torch.tensor([[0, 1], [2, 3]]), torch.tensor([9, 12])
    assert backend.decode(q, k_pages, v_pages, tables, lens).shape == (2, 4, 16)
    for bad_tables, bad_lens in ((tables.int(), lens), (tables.t(), lens), (tables, lens[:1])):
        with pytest.raises(ValueError, match="int64 page table"):
            backend.decode(q, k_pages, v_pages, bad_tables, bad_lens)
