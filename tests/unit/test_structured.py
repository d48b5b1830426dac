"""Grammars, matchers and token masks (helios.structured) on SmolLM2's real tokenizer."""
import json
import threading

import pytest
import torch

from helios.sampling import InvalidParam, SamplingParams, draw_uniforms, make_generator, pick_tokens, unpack_token_masks
from helios.engine import allocate_token_masks
from helios.structured import (COMPACT_JSON, MAX_OPTIONAL_PROPERTIES, MAX_SCHEMA_PROPERTIES, GrammarMatcher,
                               GrammarViolation, MaskRow, TokenGrammars, apply_token_masks,
                               check_schema_limits, fill_token_masks, forbid_tokens, is_grammar_failure,
                               json_object_grammar, json_schema_grammar, lark_grammar, unending_ref)

V = 49_152
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 150}}}


@pytest.fixture(scope="module")
def tok(smollm2_gguf):
    from helios.tokenizer import load_tokenizer
    return load_tokenizer(smollm2_gguf)


@pytest.fixture(scope="module")
def grammars(tok):
    return TokenGrammars(tok, V)


def ids(tok, text: str) -> list[int]: return tok.encode(text, add_special_tokens=False)


def allowed_after(grammars, grammar: str, token_ids: list[int]) -> list[int]:
    "The tokens a fresh matcher allows after taking token_ids."
    matcher, masks = grammars.matcher(grammar), allocate_token_masks(1, grammars.vocab_size)
    for t in token_ids: matcher.accept(t)
    matcher.fill_mask(masks, 0)
    return unpack_token_masks(masks, grammars.vocab_size)[0].nonzero()[:, 0].tolist()


def test_json_schema_grammar_is_compact_whatever_the_schema_says():
    for schema in (PERSON, {**PERSON, "x-guidance": {"whitespace_flexible": True}}):
        inner = json.loads(json_schema_grammar(schema))["grammars"][0]["json_schema"]
        assert inner["x-guidance"] == COMPACT_JSON and inner["properties"] == PERSON["properties"]
    assert json.loads(json_object_grammar())["grammars"][0]["json_schema"]["type"] == "object"
    assert 'start: "x"' in lark_grammar('start: "x"')          # llguidance reads a Lark text as it is


@pytest.mark.parametrize("bad", ['{"type": "object"}', None, [1], 3])
def test_a_schema_that_is_not_an_object_is_refused(bad):
    with pytest.raises(InvalidParam, match="must be a JSON object") as e: json_schema_grammar(bad)
    assert e.value.param == "response_format"


def test_lark_grammar_wants_a_string():
    with pytest.raises(InvalidParam) as e: lark_grammar(None)
    assert e.value.param == "grammar"


def test_the_llguidance_tokenizer_is_built_once_on_first_use(tok):
    fresh = TokenGrammars(tok, V)
    assert fresh._ll_tokenizer is None
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(fresh.ll_tokenizer)) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert len({id(x) for x in seen}) == 1 and fresh.ll_tokenizer.vocab_size == V
    assert fresh.eos_token_ids == tok.eos_token_ids == {2}


@pytest.mark.parametrize("grammar, param, reason", [
    (json_schema_grammar({"type": "object", "properties": {"a": {"type": "frob"}}}), "response_format", "Invalid type: frob"),
    (json_schema_grammar({"properties": {"a": {"$ref": "#/$defs/x"}}}), "grammar", "does not exist"),
    (json_schema_grammar({"type": "string", "format": "weird"}), "grammar", "Unknown format: weird"),
    (lark_grammar("start: missing"), "grammar", 'unknown name: "missing"'),
    ("not a grammar at all", "grammar", "Expected token"),
    (42, "grammar", "must be a grammar string"),
])
def test_check_refuses_with_the_library_reason(grammars, grammar, param, reason):
    with pytest.raises(InvalidParam, match=reason) as e: grammars.check(grammar, param=param)
    assert e.value.param == param and param in str(e.value)


def test_check_accepts_a_valid_grammar(grammars):
    for grammar in (json_schema_grammar(PERSON), json_object_grammar(), lark_grammar('start: "yes" | "no"')):
        grammars.check(grammar)


def test_a_model_with_fewer_logits_than_tokens_cannot_be_constrained(tok):
    with pytest.raises(InvalidParam, match="more than the model's"): TokenGrammars(tok, 1000).check(json_object_grammar())


def test_after_a_key_only_tokens_that_open_the_string(tok, grammars):
    allowed = allowed_after(grammars, json_schema_grammar(PERSON), ids(tok, '{"name":'))
    assert allowed and all(tok.decode([t]).startswith('"') for t in allowed)
    assert ids(tok, '"')[0] in allowed and 2 not in allowed


def test_no_whitespace_is_ever_offered_outside_strings(tok, grammars):
    grammar = json_schema_grammar(PERSON)
    for prefix in ('{', '{"name":"Ada"', '{"name":"Ada",', '{"name":"Ada","age":'):
        allowed = allowed_after(grammars, grammar, ids(tok, prefix))
        assert not any(tok.decode([t])[:1].isspace() for t in allowed), prefix


def test_eos_is_allowed_exactly_when_the_object_is_complete(tok, grammars):
    text = '{"name":"Ada Lovelace","age":36}'
    matcher, masks = grammars.matcher(json_schema_grammar(PERSON)), allocate_token_masks(1, V)
    for t in ids(tok, text):
        matcher.fill_mask(masks, 0)
        allowed = unpack_token_masks(masks, V)[0]
        assert allowed[t] and not allowed[2] and not matcher.is_finished
        matcher.accept(t)
    matcher.fill_mask(masks, 0)
    assert unpack_token_masks(masks, V)[0].nonzero()[:, 0].tolist() == [2] and matcher.is_finished


def test_an_open_ended_grammar_allows_eos_and_more(tok, grammars):
    allowed = allowed_after(grammars, lark_grammar('start: "a"+'), ids(tok, "aa"))
    assert 2 in allowed and any(tok.decode([t]) == "a" for t in allowed)


def test_a_refused_token_raises_with_the_library_reason(tok, grammars):
    matcher = grammars.matcher(json_schema_grammar(PERSON))
    with pytest.raises(GrammarViolation, match="refused.*doesn't satisfy the grammar"): matcher.accept(ids(tok, "x")[0])
    with pytest.raises(GrammarViolation): matcher.fill_mask(allocate_token_masks(1, V), 0)  # it stays failed


def test_matcher_refuses_an_invalid_grammar(grammars):
    with pytest.raises(InvalidParam, match="Invalid type"):
        grammars.matcher(json_schema_grammar({"type": "frob"}))


def test_masks_shape_and_ids_past_the_tokenizer(tok):
    masks = allocate_token_masks(2, V + 33)
    assert masks.shape == (2, 1538) and masks.dtype == torch.int32 and (masks == -1).all()
    wide = TokenGrammars(tok, V + 33)
    inside_a_key = wide.matcher(json_object_grammar())
    for t in ids(tok, '{"'): inside_a_key.accept(t)          # inside a string: almost every token is allowed...
    inside_a_key.fill_mask(masks, 1)
    allowed = unpack_token_masks(masks, V + 33)[1]
    assert allowed[:V].sum() > 40_000
    assert not allowed[V:].any()                             # ...but never an id the tokenizer lacks


def test_matchers_compile_once_and_copy_for_the_other_completions(tok, grammars, monkeypatch):
    import llguidance
    grammar, compiled, real = json_schema_grammar(PERSON), [], llguidance.LLMatcher
    grammars.ll_tokenizer                                    # built before counting
    monkeypatch.setattr(llguidance, "LLMatcher", lambda *a, **kw: compiled.append(1) or real(*a, **kw))
    matchers = grammars.matchers(grammar, 3)
    monkeypatch.undo()
    assert len(compiled) == 1 and len({id(m) for m in matchers}) == len({id(m._matcher) for m in matchers}) == 3
    for t in ids(tok, '{"name":"Ada","age":36}'): matchers[0].accept(t)
    assert matchers[0].is_finished and not matchers[1].is_finished   # each its own state
    masks = allocate_token_masks(2, V)
    matchers[1].fill_mask(masks, 0)
    grammars.matcher(grammar).fill_mask(masks, 1)
    assert torch.equal(masks[0], masks[1])                   # a copy starts where a fresh matcher does
    matchers[2].accept(ids(tok, "{")[0])
    copied = matchers[2].copy()                              # a copy mid-text: the same state, then its own
    for t in ids(tok, '"name":"Ada","age":36}'): copied.accept(t)
    assert copied.is_finished and not matchers[2].is_finished and matchers[2].violation() is None


@pytest.mark.parametrize("grammar, param, reason", [
    (json_schema_grammar({"type": "object", "properties": {"a": {"type": "frob"}}}), "grammar", "Invalid type: frob"),
    (lark_grammar("start: foo"), "tools", 'unknown name: "foo"'),
    ({"type": "object"}, "response_format", "must be a grammar string"),
])
def test_matchers_refuse_what_check_refuses_under_the_callers_param(grammars, grammar, param, reason):
    with pytest.raises(InvalidParam, match=reason) as e: grammars.matchers(grammar, 2, param=param)
    assert e.value.param == param
    with pytest.raises(InvalidParam, match=reason): grammars.check(grammar, param=param)


def test_matchers_refuse_a_vocabulary_wider_than_the_model(tok):
    with pytest.raises(InvalidParam, match="more than the model's") as e: TokenGrammars(tok, 1000).matchers(json_object_grammar(), 1)
    assert e.value.param == "grammar"


def test_the_end_of_a_mask_is_the_eos_set_given(tok, grammars):
    assert grammars.eos_token_ids == tok.eos_token_ids == {2}            # by default the tokenizer's
    engines = TokenGrammars(tok, V, frozenset({0, 2}))                  # the engine's: tokenizer and model config
    assert engines.eos_token_ids == {0, 2}
    allowed = allowed_after(engines, lark_grammar('start: "a"+'), ids(tok, "a"))
    assert 0 in allowed and 2 in allowed
    assert 0 not in allowed_after(grammars, lark_grammar('start: "a"+'), ids(tok, "a"))
    past_the_logits = TokenGrammars(tok, V, frozenset({2, V + 7}))      # a config id the logits cannot reach
    assert past_the_logits.eos_token_ids == {2} and past_the_logits.matchers(json_object_grammar(), 1)


def test_ignore_eos_keeps_eos_when_it_is_all_the_grammar_allows(tok, grammars):
    complete = grammars.matcher(json_schema_grammar(PERSON))
    for t in ids(tok, '{"name":"Ada","age":36}'): complete.accept(t)
    jobs = [MaskRow(0, grammars.matcher(lark_grammar('start: ""')), (2,)), MaskRow(1, complete, (2,)),
            MaskRow(2, grammars.matcher(lark_grammar('start: "a"+')), (2,))]
    masks = allocate_token_masks(3, V)
    jobs[2].matcher.accept(ids(tok, "a")[0])
    filled = fill_token_masks(masks, jobs, grammars.executor)
    allowed = unpack_token_masks(masks, V)
    assert filled.rows == [0, 1, 2]
    assert allowed[0].nonzero()[:, 0].tolist() == [2] and allowed[1].nonzero()[:, 0].tolist() == [2]
    assert not allowed[2, 2] and allowed[2].any()           # where the grammar may go on, EOS is taken out


def test_a_grammar_complete_at_max_tokens_ends_stop(tok, grammars):
    from helios.sampling import Completion, SampledToken
    from helios.engine import append_token
    (a,) = ids(tok, "a")
    at_limit = Completion(SamplingParams(max_tokens=1), tok, tok.eos_token_ids)
    assert append_token(at_limit, SampledToken(a, None), grammars.matcher(lark_grammar('start: "a"'))) == "a"
    assert at_limit.finish_reason == "stop" and at_limit.text == "a"
    open_ended = Completion(SamplingParams(max_tokens=1), tok, tok.eos_token_ids)
    append_token(open_ended, SampledToken(a, None), grammars.matcher(lark_grammar('start: "a"+')))
    assert open_ended.finish_reason == "length"             # the grammar could go on: the limit ended it


def test_forbid_tokens_clears_exactly_those_bits_sign_bit_included():
    masks = allocate_token_masks(2, 100)
    forbid_tokens(masks, 1, [0, 31, 32, 99])
    allowed = unpack_token_masks(masks, 100)
    assert allowed[0].all() and (~allowed[1]).nonzero()[:, 0].tolist() == [0, 31, 32, 99]


def test_apply_token_masks_touches_only_listed_rows():
    torch.manual_seed(0)
    logits = torch.randn(3, 70)
    masks = allocate_token_masks(3, 70)
    masks.zero_()
    for t in (1, 40, 69): masks[0, t // 32] |= 1 << (t % 32)
    masks[2, :] = 0                                          # would forbid everything, but row 2 is not listed
    out = apply_token_masks(logits.clone(), masks, [0])
    assert out[0].isfinite().nonzero()[:, 0].tolist() == [1, 40, 69] and torch.equal(out[0, [1, 40, 69]], logits[0, [1, 40, 69]])
    assert torch.equal(out[1:], logits[1:])
    assert torch.equal(apply_token_masks(logits.clone(), masks, []), logits)


def test_fill_token_masks_isolates_a_failing_matcher(tok, grammars):
    good, broken = grammars.matcher(json_object_grammar()), grammars.matcher(json_object_grammar())
    assert not broken._matcher.consume_token(ids(tok, "x")[0])
    masks = allocate_token_masks(4, V)
    jobs = [MaskRow(0, good), MaskRow(2, broken), MaskRow(3, grammars.matcher(json_object_grammar()), (2,))]
    filled = fill_token_masks(masks, jobs, grammars.executor)
    assert filled.rows == [0, 3] and list(filled.failures) == [2] and isinstance(filled.failures[2], GrammarViolation)
    assert filled.seconds > 0 and filled.masks is masks
    assert torch.equal(masks[0], masks[3])                  # EOS is not allowed at an object's start anyway


def test_pick_tokens_picks_only_allowed_tokens_greedy_and_sampled(tok, grammars):
    torch.manual_seed(1)
    logits = torch.randn(4, V) * 3                                              # [B, V]
    masks = allocate_token_masks(4, V)
    for row in (0, 2): grammars.matcher(json_schema_grammar(PERSON)).fill_mask(masks, row)
    allowed = unpack_token_masks(masks, V)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0),
              SamplingParams(seed=3, top_p=0.9, logit_bias={5: 100}, repetition_penalty=1.3, logprobs=1), SamplingParams(seed=4)]
    for trial in range(20):
        draws = draw_uniforms(params, [None, None, make_generator(trial), make_generator(trial + 100)])
        picked = pick_tokens(logits, params, draws, [[5]] * 4, [[]] * 4, masks, [0, 2])
        free = pick_tokens(logits, params, draws, [[5]] * 4, [[]] * 4)
        assert allowed[0, picked[0].token_id] and allowed[2, picked[2].token_id]
        assert picked[0].token_id == int(logits[0].masked_fill(~allowed[0], float("-inf")).argmax())
        assert picked[1] == free[1] and picked[3] == free[3]                        # unlisted rows: as if no masks
        raw = logits[2].log_softmax(-1)[picked[2].token_id].item()
        assert picked[2].logprobs.logprob == pytest.approx(raw, abs=1e-5)         # logprobs: the raw model's


# --- stated limits on a schema, the probe at the door, and a library that raises (issue 45)
CYCLIC = {"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}},
          "$ref": "#/$defs/a"}


def wide(n: int, required: int = 0) -> dict:
    names = [f"p{i}" for i in range(n)]
    return {"type": "object", "properties": {p: {"type": "integer"} for p in names}, "required": names[:required]}


def unchecked(schema: dict) -> str:
    "The grammar of a schema, past the stated limits: what the library alone would take."
    import llguidance
    return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=COMPACT_JSON)


def test_optional_properties_past_the_limit_are_refused_naming_the_object():
    with pytest.raises(InvalidParam) as e: json_schema_grammar({"type": "object", "properties": {"a": wide(10_000)}})
    assert e.value.param == "response_format"
    assert str(e.value).startswith("response_format.json_schema.schema.properties.a.properties has 10,000 optional")
    assert f"at most {MAX_OPTIONAL_PROPERTIES}" in str(e.value)
    json_schema_grammar(wide(MAX_OPTIONAL_PROPERTIES))                         # at the limit: fine
    json_schema_grammar(wide(2_000, required=2_000 - MAX_OPTIONAL_PROPERTIES))  # required ones are cheap


def test_properties_in_all_past_the_limit_are_refused():
    schema = {"type": "object", "properties": {f"o{k}": wide(200, 200) for k in range(MAX_SCHEMA_PROPERTIES // 200 + 1)}}
    with pytest.raises(InvalidParam, match=f"properties in all; a schema may have at most {MAX_SCHEMA_PROPERTIES:,}"):
        json_schema_grammar(schema)


def test_the_caller_names_where_the_schema_is():
    with pytest.raises(InvalidParam) as e: check_schema_limits(CYCLIC, "tools", "tools[2].function.parameters")
    assert e.value.param == "tools" and str(e.value).startswith("tools[2].function.parameters: the $ref '#/$defs/a'")


@pytest.mark.parametrize("schema, ref", [
    (CYCLIC, "#/$defs/a"),
    ({"type": "array", "items": {"$ref": "#"}, "minItems": 1}, "#"),
    ({"type": "object", "required": ["x"], "properties": {"x": {"allOf": [{"$ref": "#"}]}}}, "#"),
    ({"$defs": {"a": {"type": "object", "required": ["b"], "properties": {"b": {"$ref": "#/$defs/b"}}},
                "b": {"type": "array", "minItems": 2, "items": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"}, "#/$defs/a"),
    ({"anyOf": [{"type": "null"}, {"$ref": "#/$defs/a"}], "$defs": CYCLIC["$defs"]}, "#/$defs/a"),  # a path that can't end
])
def test_refs_that_can_never_end_are_found(schema, ref):
    assert unending_ref(schema) == ref
    with pytest.raises(InvalidParam, match="can never end"): json_schema_grammar(schema)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"next": {"$ref": "#"}}},                             # optional
    {"type": "object", "required": ["kids"], "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}},
    {"type": ["object", "null"], "required": ["x"], "properties": {"x": {"$ref": "#"}}},  # null ends it
    {"properties": {"x": {"$ref": "#"}}, "required": ["x"]},                                # no type: any value
    {"$defs": {"a": {"anyOf": [{"type": "string"}, {"type": "object", "required": ["x"],
                                                     "properties": {"x": {"$ref": "#/$defs/a"}}}]}}, "$ref": "#/$defs/a"},
    {"type": "object", "required": ["x"], "properties": {"x": {"$ref": "#/$defs/nowhere"}}},  # the library's to refuse
    {"type": "object", "required": ["x"], "properties": {"x": {"enum": [1], "$ref": "#/$defs/a"}},
     "$defs": {"a": {"type": "integer"}}},
])
def test_recursive_schemas_that_can_end_pass(schema):
    assert unending_ref(schema) is None


def test_the_probe_refuses_what_the_library_compiles_but_cannot_follow(grammars):
    import time
    for schema in (wide(1_000), CYCLIC):
        started = time.perf_counter()
        with pytest.raises(InvalidParam, match="cannot be followed by the grammar library") as e:
            grammars.check(unchecked(schema), param="tools")
        assert e.value.param == "tools" and time.perf_counter() - started < 5
    assert "max is 2000" in str(refusal_of(grammars, unchecked(wide(1_000))))
    for fine in (json_object_grammar(), json_schema_grammar(PERSON), lark_grammar('start: "a"+'), lark_grammar('start: ""')):
        grammars.check(fine)


def refusal_of(grammars, grammar) -> InvalidParam:
    with pytest.raises(InvalidParam) as e: grammars.check(grammar)
    return e.value


class RaisingLibraryMatcher:
    "Stands for llguidance's matcher when it raises instead of entering its error state."
    def consume_token(self, token_id): raise RuntimeError("injected")
    def is_error(self): return False


def test_a_library_that_raises_is_a_grammar_violation():
    with pytest.raises(GrammarViolation, match="token 7: the grammar library failed: RuntimeError: injected"):
        GrammarMatcher(RaisingLibraryMatcher()).accept(7)
    with pytest.raises(GrammarViolation, match="the grammar library failed"):
        GrammarMatcher(RaisingLibraryMatcher()).fill_mask(allocate_token_masks(1, V), 0)
    assert is_grammar_failure("the engine failed while following its grammar: GrammarViolation: token 7 refused")
    assert not is_grammar_failure("the engine failed while running this request: RuntimeError: boom")


def test_fill_token_masks_fails_only_the_rows_whose_matcher_raises(grammars):
    good = grammars.matcher(json_object_grammar())
    masks = allocate_token_masks(2, V)
    filled = fill_token_masks(masks, [MaskRow(0, good), MaskRow(1, GrammarMatcher(RaisingLibraryMatcher()))],
                              grammars.executor)
    assert filled.rows == [0] and isinstance(filled.failures[1], GrammarViolation)
    reference = allocate_token_masks(1, V)
    grammars.matcher(json_object_grammar()).fill_mask(reference, 0)
    assert torch.equal(masks[0], reference[0])
