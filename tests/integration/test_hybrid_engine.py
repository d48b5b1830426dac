"""Qwen3.5 hybrids through the paged engine (chapter 20's StatePool beside the KV pages), float32, on tiny random
checkpoints written by transformers: batched, chunked (chunks that end mid-block and mid-convolution window), prefix
hits from state snapshots at several depths, preempted by swapping and by recomputing, cancelled mid-prefill. Each
request gets the tokens generate_hybrid gives it alone; the pool's and the states' invariants hold after every tick;
no page, row or snapshot slot is left held."""
import pytest
import torch

from _engine_runs import GREEDY, PAGE, check_invariants, check_profile_tick, prompts, run_engine
from _hybrid_checkpoints import save_reference
from helios.config import EngineConfig
from helios.engine import Engine
from helios.kv.pool import page_bytes
from helios.model.hybrid import StatePool, generate_hybrid, hybrid_states
from helios.tokenizer import load_tokenizer
from helios.weights import load_model

ENGINE_SHAPES = ["interval4_gqa_conv4_untied", "types_full_first_conv3_bias", "moe_e8_top2_interval2_untied"]


@pytest.fixture(scope="module", params=ENGINE_SHAPES)
def hybrid(request, tmp_path_factory, smollm2_gguf):
    "(our model read from the shape's checkpoint folder, a tokenizer that decodes its ids)."
    folder = tmp_path_factory.mktemp(request.param)
    save_reference(request.param, folder)
    return load_model(folder, dtype="float32", device="cpu").model, load_tokenizer(smollm2_gguf)


def alone(model, prompt_list: list[list[int]]) -> list[list[int]]:
    return [generate_hybrid(model, p, GREEDY.max_tokens) for p in prompt_list]


def test_batched_chunked_and_prefix_cached_as_alone(hybrid):
    model, tokenizer = hybrid
    outs, stats = run_engine(model, tokenizer, prompts(), num_pages=64)
    assert [o.outputs[0].token_ids for o in outs] == alone(model, prompts())
    assert stats.prefix_hit_tokens >= 3 * 2 * PAGE  # the shared prefix started from its snapshot, not recomputed
    assert stats.num_state_snapshots > 0 and stats.state_bytes > 0


def test_chunks_that_end_anywhere_give_the_same_tokens(hybrid):
    "Chunk sizes 1, 3, 5 and 13 tokens: every chunk boundary lands mid-block, mid-window or on a block end."
    model, tokenizer = hybrid
    expected = alone(model, prompts())
    for chunk in (3, 5, 13):  # (1 would leave no room for decodes beside it: the engine needs >= max_batch_size)
        outs, _ = run_engine(model, tokenizer, prompts(), num_pages=64, prefill_chunk_size=chunk, max_batch_size=2)
        assert [o.outputs[0].token_ids for o in outs] == expected, chunk


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_a_prefix_hit_starts_from_the_snapshot_at_its_depth(hybrid, depth):
    "A prompt sharing `depth` full pages (and a few tokens more) with an earlier one: exactly those pages are reused."
    model, tokenizer = hybrid
    first = [(3 * j) % 250 + 1 for j in range(4 * PAGE + 2)]
    second = first[:depth * PAGE + 3] + [(7 * j) % 250 + 2 for j in range(6)]
    engine = Engine(model, tokenizer, frozenset(), EngineConfig(page_size=PAGE, max_batch_size=4), num_pages=32)
    outs = []
    for prompt in (first, second):
        handle = engine.submit(prompt, GREEDY)
        while engine.step(): check_invariants(engine)
        outs.append(handle.result())
    assert outs[1].cached_tokens == depth * PAGE
    assert [o.outputs[0].token_ids for o in outs] == alone(model, [first, second])


@pytest.mark.parametrize("host_tier", [True, False], ids=["swap", "recompute"])
def test_preemption_gives_the_same_tokens(hybrid, host_tier):
    "A pool too small for all eight: running sequences are preempted, swapped out (state and pages) or recomputed."
    model, tokenizer = hybrid
    host = 24 * PAGE * model.config.kv_bytes_per_token(4) if host_tier else 0
    outs, stats = run_engine(model, tokenizer, prompts(), num_pages=12, kv_offload_bytes=host)
    assert [o.outputs[0].token_ids for o in outs] == alone(model, prompts())
    assert stats.num_preemptions > 0
    assert (stats.num_swapped > 0) == host_tier


def test_a_request_cancelled_mid_prefill_leaves_nothing_held(hybrid):
    model, tokenizer = hybrid
    engine = Engine(model, tokenizer, frozenset(), EngineConfig(page_size=PAGE, prefill_chunk_size=5), num_pages=32)
    long_prompt = [(13 * j) % 250 + 1 for j in range(5 * PAGE)]
    handle = engine.submit(long_prompt, GREEDY)
    engine.step()
    engine.step()  # two chunks of five in: mid-block, mid-prompt
    assert engine.stats().num_sequence_states == 1
    engine.cancel(handle.request_id)
    while engine.step(): check_invariants(engine)
    assert handle.result().outputs[0].finish_reason == "cancelled"
    stats = engine.stats()
    assert stats.num_sequence_states == 0 and stats.num_used_pages == 0
    after = engine.submit(prompts()[5], GREEDY)  # the row it held serves the next request from zeros
    while engine.step(): check_invariants(engine)
    assert after.result().outputs[0].token_ids == alone(model, [prompts()[5]])[0]


def test_a_full_snapshot_pool_gives_up_the_least_recently_used(hybrid):
    "One row, so one snapshot slot: each new prompt's block end replaces the last; hits only on the newest."
    model, tokenizer = hybrid
    config = EngineConfig(page_size=PAGE, max_batch_size=1, prefill_chunk_size=64)
    engine = Engine(model, tokenizer, frozenset(), config, num_pages=32)
    a, b = [[(k * j) % 250 + 1 for j in range(PAGE + 3)] for k in (3, 7)]
    cached = []
    for prompt in (a, b, a, a):
        handle = engine.submit(prompt, GREEDY)
        while engine.step(): check_invariants(engine)
        cached.append(handle.result().cached_tokens)
    assert engine.states.num_snapshot_slots == 1
    assert cached == [0, 0, 0, PAGE]  # b's snapshot replaced a's; a's own came back, then hit


def test_the_states_come_out_of_the_budget(hybrid):
    "Engine.create counts the state pool's bytes in the KV budget before it counts pages; too little budget: one line."
    model, tokenizer = hybrid
    budget = 1 << 20
    config = EngineConfig(page_size=PAGE, max_batch_size=4, kv_cache_bytes=budget)
    engine = Engine.create(model, tokenizer, [], config)
    assert isinstance(engine.states, StatePool)
    assert engine.kv.k.shape[0] == model.config.num_kv_layers  # no K/V for the linear layers
    page = page_bytes(model.config, PAGE, torch.float32)
    assert engine.pages.num_pages == (budget - engine.states.nbytes) // page
    assert "linear-attention states" in engine.budget_summary
    tiny_budget = EngineConfig(page_size=PAGE, max_batch_size=4, kv_cache_bytes=engine.states.nbytes)
    with pytest.raises(ValueError, match="fill the KV budget"):
        Engine.create(model, tokenizer, [], tiny_budget)


def test_speculative_decoding_is_refused_in_one_line(hybrid):
    model, tokenizer = hybrid
    with pytest.raises(ValueError, match="speculative decoding cannot run"):
        Engine.create(model, tokenizer, [], EngineConfig(page_size=PAGE, kv_cache_bytes=1 << 20, speculative="ngram"))


@pytest.mark.parametrize("caching", [True, False], ids=["prefix-caching", "no-prefix-caching"])
def test_a_warm_up_leaves_no_state_and_changes_no_token(hybrid, caching):
    "The start-up warm-up (a cold chunk, a prefix-hit chunk where the cache is on, decodes) on a hybrid."
    from helios.engine import warm_up_forwards
    model, tokenizer = hybrid
    config = EngineConfig(page_size=PAGE, max_batch_size=4, prefill_chunk_size=16, enable_prefix_caching=caching)
    engine = Engine(model, tokenizer, frozenset(), config, num_pages=16)
    ran = warm_up_forwards(engine)
    assert any(start > 0 for forward in ran.forwards for start, _ in forward) == caching
    assert engine.stats().num_sequence_states == 0
    handle = engine.submit(prompts()[3], GREEDY)
    while engine.step(): check_invariants(engine)
    assert handle.result().outputs[0].token_ids == alone(model, [prompts()[3]])[0]


def test_auto_passes_over_cuda_graphs_for_a_hybrid(hybrid):
    "A CUDA graph replays no per-sequence state: the graph runner is not applicable, so `auto` takes the eager one."
    from helios.gpu.graphs import build_graph_runner
    from helios.registry import NotApplicable
    model, tokenizer = hybrid
    engine = Engine(model, tokenizer, frozenset(), EngineConfig(page_size=PAGE), num_pages=8)
    assert engine.runner.states is engine.states
    with pytest.raises(NotApplicable, match="per-sequence state"):
        build_graph_runner(model, engine.kv, 4, 4, engine.runner.backend, states=engine.states)


def test_a_sequence_swapped_before_it_ran_keeps_its_snapshot(hybrid):
    """Admitted from a snapshot, then preempted by swapping before its first chunk ran: the snapshot stays held for
    it (no new one may take its slot), so that it resumes from it; once it ends, the snapshot can go."""
    from helios.scheduler import Sequence
    model, tokenizer = hybrid
    engine = Engine(model, tokenizer, frozenset(), EngineConfig(page_size=PAGE, max_batch_size=1), num_pages=16)
    prompt = [(3 * j) % 250 + 1 for j in range(2 * PAGE + 3)]
    handle = engine.submit(prompt, GREEDY)  # its block ends leave one snapshot (the one slot): after 2 blocks
    while engine.step(): pass
    handle.result()
    states = engine.states
    later = Sequence(99, "later", prompt + [5], 4, 0.0, PAGE)
    assert states.usable_blocks(later, 2) == 2
    later.swapped_pages = [0]           # as the scheduler leaves a sequence it swapped out
    states.release(later, None)         # it never held a row
    assert states.take_snapshot_slot() is None and later.block_hashes[1] in states.snapshots
    later.swapped_pages = None          # it ended while swapped out
    states.release(later, None)
    assert states.take_snapshot_slot() is not None


def test_a_gpus_memory_profile_runs_its_tick_in_the_states_rows(hybrid):
    "Engine.create's profile on a GPU runs one largest tick: the linear layers in rows of the states, given back."
    model, _ = hybrid
    config = EngineConfig(page_size=PAGE, max_batch_size=4, prefill_chunk_size=32)
    states = hybrid_states(model.config, config, config.max_batch_size, torch.float32, "cpu")
    check_profile_tick(model, states, config)
