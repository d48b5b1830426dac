"""The engine run the family tests share: the first prompt alone (its prefix pages are then cached), the rest
batched after it, the pool's invariants (and the per-sequence states', where the model keeps some) checked after
every step, and no page or state leaked at the end."""
from helios import SamplingParams
from helios.config import EngineConfig
from helios.engine import Engine
from helios.llm import engine_plugins

PAGE = 8
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def prompts() -> list[list[int]]:
    "Eight prompts: four share a 2-page prefix; lengths cross pages (8 tokens) and chunks (16) at many places."
    shared = [(5 * j) % 200 + 3 for j in range(2 * PAGE)]
    own = [[(11 * i + 7 * j) % 200 + 1 for j in range(1 + 9 * i)] for i in range(8)]
    return [shared + own[i] if i < 4 else own[i] for i in range(8)]


def run_engine(model, tokenizer, prompts: list[list[int]], num_pages: int, **config):
    "Each request's output and the engine's stats; small pages and chunks, so every prompt crosses both."
    settings = dict(max_batch_size=4, prefill_chunk_size=16, page_size=PAGE, max_queue=64, kv_watermark=0.0)
    engine_config = EngineConfig(**{**settings, **config})
    engine = Engine(model, tokenizer, frozenset(), engine_config, num_pages, **engine_plugins(engine_config))
    first, *rest = prompts
    handles = [engine.submit(first, GREEDY)]  # alone first: its prefix blocks are cached when the others arrive
    while engine.step(): check_invariants(engine)
    handles += [engine.submit(p, GREEDY) for p in rest]
    while engine.step(): check_invariants(engine)
    stats = engine.stats()
    assert stats.num_used_pages == 0 and stats.num_running == 0
    assert stats.num_free_pages + stats.num_cached_pages == stats.num_pages  # no page leaked
    assert stats.num_sequence_states == 0  # no state left in a row or on the host
    return [h.result() for h in handles], stats


def check_invariants(engine: Engine):
    "The pool's invariants, and the per-sequence states' where the model keeps some."
    engine.pages.check_invariants()
    if engine.states is not None: engine.states.check_invariants(engine.scheduler.running)


def check_profile_tick(model, states, config: EngineConfig):
    "Engine.create's GPU memory profile tick, run here: in rows of the states, every one given back, no snapshot kept."
    import torch
    from helios.attention.base import choose_backend
    from helios.kv.budget import run_largest_tick
    backend = choose_backend(model.config, torch.float32, "cpu").value
    assert run_largest_tick(model, backend, config, states) > 0
    assert states.num_held == 0 and not states.snapshots
    states.check_invariants([])
