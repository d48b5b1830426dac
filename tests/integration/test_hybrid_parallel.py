"""Qwen3.5 hybrids over two tensor-parallel ranks (worker processes, gloo): each rank keeps the linear layers' states of
its own heads, as rank 0 decides each tick. Batched, chunked, prefix-cached (from state snapshots) and preempted runs
give every request the greedy tokens one process gives it."""
import pytest
import torch

from _hybrid_checkpoints import save_reference
from conftest import with_smollm2_tokenizer
from helios import LLM, SamplingParams
from helios.kv.pool import page_bytes
from helios.weights import read_config

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
SETTINGS = dict(dtype="float32", device="cpu", max_batch_size=4, prefill_chunk_size=32, page_size=16, quiet=True)
VOCAB = 49153  # SmolLM2's tokenizer plus one: a vocabulary two ranks do not divide
# GQA with 2 key heads serving 4 value heads; one KV head held by both ranks, tied; experts and a shared expert split
SHAPES = ["interval4_gqa_conv4_untied", "interval2_mqa_conv2_tied", "moe_e8_top2_interval2_untied"]


def prompts() -> list[list[int]]:
    "Six prompts: three share a two-page prefix; lengths cross page and chunk boundaries."
    shared = [(5 * j) % 400 + 3 for j in range(32)]
    own = [[(11 * i + 7 * j) % 400 + 1 for j in range(3 + 17 * i)] for i in range(6)]
    return [shared + own[i] if i < 3 else own[i] for i in range(6)]


def generate(llm: LLM, params: SamplingParams = GREEDY) -> list[list[int]]:
    first, *rest = prompts()
    outs = llm.generate([first], params, use_tqdm=False)  # alone first: its blocks' snapshots serve the others
    return [o.token_ids for o in outs + llm.generate(rest, params, use_tqdm=False)]


@pytest.fixture(scope="module", params=SHAPES)
def folder(request, tmp_path_factory, smollm2_gguf):
    path = tmp_path_factory.mktemp(request.param)
    save_reference(request.param, path, vocab_size=VOCAB)
    return with_smollm2_tokenizer(path, smollm2_gguf)


def test_two_ranks_give_the_tokens_of_one_process(folder):
    with LLM(folder, **SETTINGS) as one:
        alone, one_stats = generate(one), one.stats()
    with LLM(folder, tensor_parallel_size=2, **SETTINGS) as llm:
        assert generate(llm) == alone
        stats = llm.stats()
    assert stats.prefix_hit_tokens >= 2 * 32  # two requests started from the snapshot after the shared prefix
    assert stats.state_bytes * 2 == one_stats.state_bytes  # rank 0 holds the states of half the heads
    assert stats.num_sequence_states == 0 and stats.num_state_snapshots > 0
    assert stats.num_used_pages == 0 and stats.num_free_pages + stats.num_cached_pages == stats.num_pages


def test_a_small_pool_preempts_across_ranks_and_keeps_the_tokens(tmp_path, smollm2_gguf):
    "Ten pages for six: sequences are preempted (recomputed: the host tier does not run with ranks) and resume."
    path = tmp_path / "hybrid"
    save_reference("interval4_gqa_conv4_untied", path, vocab_size=VOCAB)
    folder = with_smollm2_tokenizer(path, smollm2_gguf)
    longer = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    with LLM(folder, **SETTINGS) as one: alone, states = generate(one, longer), one.stats().state_bytes
    page = page_bytes(read_config(folder)[0], 16, torch.float32)
    rank_budget = states // 2 + 10 * page // 2  # each rank: half the heads' states, ten pages of its KV heads
    with LLM(folder, tensor_parallel_size=2, **dict(SETTINGS, kv_cache_bytes=rank_budget)) as llm:
        assert generate(llm, longer) == alone
        stats = llm.stats()
    assert stats.num_pages == 10 and stats.num_preemptions > 0 and stats.num_sequence_states == 0


def test_sizes_a_hybrid_cannot_split_fail_before_any_process_starts(tmp_path, smollm2_gguf, no_worker_processes):
    path = tmp_path / "hybrid"
    save_reference("interval4_gqa_conv4_untied", path, vocab_size=VOCAB)  # 4 heads, 2 KV heads, 2 key heads
    folder = with_smollm2_tokenizer(path, smollm2_gguf)
    with pytest.raises(ValueError, match="tensor_parallel_size=4 must divide the 2 linear-attention key heads"):
        LLM(folder, tensor_parallel_size=4, **SETTINGS)
    with pytest.raises(ValueError, match="not pipeline stages; use pipeline_parallel_size=1"):
        LLM(folder, pipeline_parallel_size=2, **SETTINGS)
