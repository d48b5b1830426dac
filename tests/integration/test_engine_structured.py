"""Constrained decoding in the engine: every output follows its grammar, beside free requests, with nothing leaked."""
import json

import jsonschema
import pytest

from conftest import TEST_KV_BYTES
from helios import LLM, SamplingParams
from helios.config import EngineConfig
from helios.engine import Engine, EngineError, SubmitRequest
from helios.sampling import InvalidParam, unpack_token_masks
from helios.structured import GrammarViolation, TokenGrammars, json_schema_grammar, lark_grammar

# Bounded schemas: every string has a maxLength, every integer a range, every array maxItems and no object takes
# extra properties, so any text they allow is short and a completion always closes its JSON within MAX_TOKENS
# (a string of 8 characters is at most 48 tokens even if each one is a \uXXXX escape).
NESTED = {"type": "object", "additionalProperties": False, "required": ["name", "address"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"],
                                     "properties": {"city": {"type": "string", "maxLength": 8},
                                                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}}
ENUMS = {"type": "object", "additionalProperties": False, "required": ["color", "size", "ok"],
         "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"type": "string", "enum": ["S", "M", "L"]},
                        "ok": {"type": "boolean"}}}
ARRAYS = {"type": "object", "additionalProperties": False, "required": ["scores", "tags"],
          "properties": {"scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                                    "minItems": 2, "maxItems": 4},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2}}}
OPTIONAL = {"type": "object", "additionalProperties": False, "required": ["id"],
            "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9999},
                           "note": {"type": "string", "maxLength": 6}, "urgent": {"type": "boolean"}}}
SCHEMAS = {"nested": NESTED, "enums": ENUMS, "arrays": ARRAYS, "optional": OPTIONAL}
MAX_TOKENS = 400
MODES = {"greedy": dict(temperature=0), "seeded": dict(temperature=1.0, seed=7)}


def constrained(schema: dict, **kw) -> SamplingParams:
    return SamplingParams(grammar=json_schema_grammar(schema), max_tokens=MAX_TOKENS, **kw)


def assert_valid(output, schema: dict):
    "Every completion ended because its JSON was complete, and it parses and validates."
    for completion in output.outputs:
        assert completion.finish_reason == "stop", (completion.finish_reason, completion.text)
        jsonschema.validate(json.loads(completion.text), schema)


def assert_pool_idle(llm_or_engine):
    s = llm_or_engine.stats()
    assert (s.num_running, s.num_waiting, s.num_used_pages) == (0, 0, 0)
    assert s.num_free_pages + s.num_cached_pages == s.num_pages


@pytest.fixture(scope="module")
def tiny(tiny_folder):
    llm = LLM(tiny_folder, dtype="float32", device="cpu", quiet=True, kv_cache_bytes=TEST_KV_BYTES, max_batch_size=8)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def smollm2(smollm2_llm_factory):
    return smollm2_llm_factory(max_batch_size=8)


def test_every_output_validates_tiny_model(tiny):
    "All schemas, greedy and seeded, n=2, submitted together so that they share ticks: each output is valid."
    before = tiny.stats()
    jobs = [(schema, tiny.submit(f"Describe {name}:", constrained(schema, n=2, **mode)))
            for name, schema in SCHEMAS.items() for mode in MODES.values()]
    outputs = [(schema, handle.result(timeout=300)) for schema, handle in jobs]
    for schema, output in outputs: assert_valid(output, schema)
    after = tiny.stats()
    tokens = sum(len(c.token_ids) for _, out in outputs for c in out.outputs)
    assert after.num_constrained_rows - before.num_constrained_rows == tokens  # every sampled row was masked
    assert after.grammar_mask_s > before.grammar_mask_s
    assert_pool_idle(tiny)


def test_greedy_constrained_is_deterministic_and_n_samples_differ(tiny):
    greedy = [tiny.generate("A", constrained(NESTED, temperature=0), use_tqdm=False)[0].text for _ in range(2)]
    assert greedy[0] == greedy[1]
    sampled = tiny.generate("A", constrained(ARRAYS, temperature=1.0, seed=3, n=2), use_tqdm=False)[0]
    assert_valid(sampled, ARRAYS)
    again = tiny.generate("A", constrained(ARRAYS, temperature=1.0, seed=3, n=2), use_tqdm=False)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in sampled.outputs]  # seeded: reproducible


def step_engine(tiny, config=None) -> Engine:
    return Engine(tiny.model, tiny.tokenizer, tiny.tokenizer.eos_token_ids,
                  config or EngineConfig(max_batch_size=4, prefill_chunk_size=64, page_size=16), num_pages=256,
                  constraints=TokenGrammars)


def run(engine: Engine, requests: list[tuple[list[int], SamplingParams]]):
    handles = [engine.submit(ids, params) for ids, params in requests]
    while engine.step(): pass
    return [h.result() for h in handles]


def test_constrained_and_free_rows_share_a_tick_and_match_alone(tiny):
    prompt_a, prompt_b = tiny.tokenizer.encode("The answer:"), tiny.tokenizer.encode("Once upon a time")
    json_greedy, free = constrained(ENUMS, temperature=0), SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    json_seeded, free_seeded = constrained(ARRAYS, temperature=0.8, seed=11), SamplingParams(seed=5, max_tokens=24)
    alone = [run(step_engine(tiny), [(p, params)])[0] for p, params in
             [(prompt_a, json_greedy), (prompt_b, free), (prompt_a, json_seeded), (prompt_b, free_seeded)]]
    engine = step_engine(tiny)
    handles = [engine.submit(p, params) for p, params in
               [(prompt_a, json_greedy), (prompt_b, free), (prompt_a, json_seeded), (prompt_b, free_seeded)]]
    engine.step()  # all four prompts fit one tick's budget: each samples its first token in the same forward
    s = engine.stats()
    assert s.num_generated_tokens == 4 and s.num_constrained_rows == 2
    while engine.step(): pass
    together = [h.result() for h in handles]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert_valid(together[0], ENUMS)
    assert_valid(together[2], ARRAYS)
    assert together[1].finish_reason == "length" and len(together[1].token_ids) == 24
    assert_pool_idle(engine)


def test_grammar_with_ignore_eos(tiny):
    engine = step_engine(tiny)
    eos = min(tiny.tokenizer.eos_token_ids)
    a_run = SamplingParams(grammar=lark_grammar('start: "a"+'), temperature=1.0, seed=0, max_tokens=20, ignore_eos=True)
    json_out = constrained(OPTIONAL, temperature=1.0, seed=1, ignore_eos=True)
    run_out, obj = run(engine, [(tiny.tokenizer.encode("x"), a_run), (tiny.tokenizer.encode("y"), json_out)])
    # "a"+ may always go on and EOS is never allowed: it runs to max_tokens, all a's
    assert run_out.finish_reason == "length" and len(run_out.token_ids) == 20 and set(run_out.text) == {"a"}
    assert eos not in run_out.token_ids
    assert_valid(obj, OPTIONAL)                                   # a complete object ends "stop", with no EOS sampled
    assert eos not in obj.token_ids
    assert_pool_idle(engine)


def test_grammars_compile_once_in_submit_on_the_callers_thread(tiny, monkeypatch):
    "n=2: one compile, on the submitting thread; the engine thread builds no matcher (a large schema stalls nothing)."
    import threading
    import llguidance
    grammar, compiled, real = json_schema_grammar(ARRAYS), [], llguidance.LLMatcher
    tiny.engine.constraints.ll_tokenizer                         # built before counting
    monkeypatch.setattr(llguidance, "LLMatcher", lambda *a, **kw: compiled.append(threading.current_thread()) or real(*a, **kw))
    out = tiny.generate("A", SamplingParams(grammar=grammar, max_tokens=MAX_TOKENS, n=2, temperature=1.0, seed=4),
                        use_tqdm=False)[0]
    monkeypatch.undo()
    assert compiled == [threading.current_thread()]
    assert_valid(out, ARRAYS)
    assert out.outputs[0].token_ids != out.outputs[1].token_ids  # two matchers, each its own text


def test_submit_carries_the_matchers_and_admission_builds_none(tiny):
    engine = step_engine(tiny)
    handle = engine.submit(tiny.tokenizer.encode("a"), constrained(ENUMS, temperature=0, n=2))
    (message,) = list(engine._inbox.queue)
    req = message.request
    assert isinstance(message, SubmitRequest) and len(req.constraints) == 2 and req.constraints[0] is not req.constraints[1]
    def no_compiling(*args, **kw): raise AssertionError("a matcher built on the engine thread")
    engine.constraints.matchers = engine.constraints.matcher = no_compiling
    while engine.step(): pass
    assert_valid(handle.result(), ENUMS)


def test_a_grammar_complete_at_max_tokens_ends_stop(tiny):
    engine = step_engine(tiny)
    exact, open_ended = [SamplingParams(grammar=lark_grammar(g), temperature=0, max_tokens=1) for g in ('start: "a"', 'start: "a"+')]
    done, cut = run(engine, [(tiny.tokenizer.encode("x"), exact), (tiny.tokenizer.encode("y"), open_ended)])
    assert (done.finish_reason, done.text) == ("stop", "a")   # the limit and the grammar's end at one token: "stop"
    assert cut.finish_reason == "length" and set(cut.text) == {"a"}  # the grammar could go on: the limit ended it
    assert_pool_idle(engine)


def test_ignore_eos_under_a_grammar_that_can_only_end(tiny):
    engine = step_engine(tiny)
    eos = min(tiny.tokenizer.eos_token_ids)
    params = SamplingParams(grammar=lark_grammar('start: ""'), temperature=1.0, seed=0, max_tokens=5, ignore_eos=True)
    (out,) = run(engine, [(tiny.tokenizer.encode("x"), params)])
    assert (out.finish_reason, out.token_ids, out.text) == ("stop", [eos], "")  # EOS was all it allowed: kept
    assert engine.stats().num_requests_failed == 0
    assert_pool_idle(engine)


def test_the_engines_eos_set_is_the_grammars_end(tiny):
    "The model config may add EOS ids to the tokenizer's: the masks allow them where the grammar may end, ignore_eos forbids them."
    eos = tiny.tokenizer.eos_token_ids | {0}
    engine = Engine(tiny.model, tiny.tokenizer, eos, EngineConfig(max_batch_size=4, prefill_chunk_size=64, page_size=16),
                    num_pages=256, constraints=TokenGrammars)
    assert engine.constraints.eos_token_ids == eos == engine.eos_token_ids
    a_run = lambda ignore: SamplingParams(grammar=lark_grammar('start: "a"+'), temperature=0, max_tokens=3, ignore_eos=ignore)
    handles = [engine.submit(tiny.tokenizer.encode(p), a_run(ignore)) for p, ignore in (("x", False), ("y", True))]
    engine.step(), engine.step()                             # prefill and "a"; then a mask after "a", where the grammar may end
    allowed = unpack_token_masks(engine._token_masks[:2], tiny.config.vocab_size)
    assert {tuple(bool(allowed[r, t]) for t in sorted(eos)) for r in (0, 1)} == {(True, True), (False, False)}
    while engine.step(): pass
    for h in handles: h.result()
    assert_pool_idle(engine)


def test_a_failing_matcher_fails_its_request_alone(tiny):
    engine = step_engine(tiny)
    good = engine.submit(tiny.tokenizer.encode("a"), constrained(ENUMS, temperature=0))
    bad = engine.submit(tiny.tokenizer.encode("b"), constrained(ENUMS, temperature=0, n=2))
    refused = engine.submit(tiny.tokenizer.encode("c"), constrained(NESTED, temperature=0))
    engine._drain_inbox()

    broken = engine._requests[bad.request_id].constraints[1]._matcher  # llguidance's matcher: failed, it stays failed
    assert not broken.consume_token(tiny.tokenizer.encode("x", add_special_tokens=False)[0])

    def refuse(token_id): raise GrammarViolation(f"token {token_id} refused")
    engine._requests[refused.request_id].constraints[0].accept = refuse
    while engine.step(): pass
    assert_valid(good.result(), ENUMS)
    for handle in (bad, refused):
        with pytest.raises(EngineError): handle.result()
    assert "sampling its next token" in bad.error and "doesn't satisfy the grammar" in bad.error
    assert "following its grammar" in refused.error and "refused" in refused.error
    s = engine.stats()
    assert s.num_requests_failed == 2
    assert_pool_idle(engine)


def test_a_bad_grammar_is_refused_at_submit(tiny):
    before = tiny.stats()
    for bad, reason in [({"type": "object", "properties": {"a": {"type": "frob"}}}, "Invalid type: frob"),
                        ({"$ref": "#/$defs/nowhere"}, "does not exist")]:
        with pytest.raises(ValueError, match=reason) as caught:
            tiny.submit("hi", SamplingParams(grammar=json_schema_grammar(bad)))
        assert isinstance(caught.value, InvalidParam) and caught.value.param == "grammar"
    with pytest.raises(ValueError, match="unknown name"):
        tiny.submit("hi", SamplingParams(grammar=lark_grammar("start: nothing_defined")))
    with pytest.raises(ValueError, match="grammar must be"):
        SamplingParams(grammar={"type": "object"})
    assert tiny.stats().num_requests_finished == before.num_requests_finished  # nothing was queued


@pytest.mark.slow
def test_default_model_follows_schemas(smollm2):
    "SmolLM2 through its chat template: greedy and seeded n=2 outputs, batched, all valid."
    prompt = smollm2.tokenizer.encode_chat([{"role": "user", "content": "Describe a person who lives in a city, as JSON."}])
    jobs = [(schema, smollm2.submit(prompt, constrained(schema, n=2, **mode)))
            for schema in (NESTED, ARRAYS) for mode in MODES.values()]
    free = smollm2.submit(prompt, SamplingParams(temperature=0, max_tokens=16))
    for schema, handle in jobs: assert_valid(handle.result(timeout=600), schema)
    assert free.result(timeout=600).outputs[0].finish_reason in ("stop", "length")
    assert_pool_idle(smollm2)
