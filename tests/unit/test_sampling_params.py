"""SamplingParams refuses, with the field's name, every value the engine cannot use; what it accepts the sampler handles."""
import math

import pytest
import torch

from helios.sampling import (GREEDY_BELOW_TEMPERATURE, SEED_RANGE, InvalidParam, SamplingParams, draw_uniforms,
                             make_generator, pick_tokens, sample_batch, sample_seed)

INF, NAN = math.inf, math.nan

INVALID = [
    ("temperature", [-1, INF, -INF, NAN, True, "0.5", None, 10**400]),
    ("top_p", [0, 1.5, NAN, INF, False]),
    ("top_k", [-2, 1.5, True, "5", None]),
    ("min_p", [-0.1, 1.1, NAN]),
    ("presence_penalty", [2.5, -2.5, NAN, INF]),
    ("frequency_penalty", [3, NAN]),
    ("repetition_penalty", [0, -1, INF, NAN]),
    ("seed", [SEED_RANGE[0] - 1, SEED_RANGE[1] + 1, 2**100, 1.0, True, "7"]),
    ("max_tokens", [0, -1, 1.5, True, None, "16"]),
    ("n", [0, 17, True, 2.0]),
    ("logprobs", [-1, 21, True, 1.5]),
    ("stop", [[""], [1], "", 5, [None], {"a": 1}]),
    ("stop_token_ids", [[-1], [1.5], [True], 3, "12"]),
    ("ignore_eos", [1, "yes", None]),
    ("logit_bias", [{5: 101}, {5: -101}, {5: NAN}, {5: INF}, {-1: 1.0}, {"x": 1.0}, {"-3": 1.0}, {5: True},
                    {1.5: 1.0}, [(1, 2, 3)], 5, "5"]),
]


@pytest.mark.parametrize("param,value", [(p, v) for p, values in INVALID for v in values])
def test_invalid_values_name_their_field(param, value):
    with pytest.raises(InvalidParam) as caught:
        SamplingParams(**{param: value})
    assert caught.value.param == param
    message = str(caught.value)
    assert message.startswith(param) and "got" in message and len(message) < 300
    assert isinstance(caught.value, ValueError)  # old callers catching ValueError still do


def test_the_messages_say_what_is_allowed():
    with pytest.raises(InvalidParam, match=r"temperature must be a finite number in \[0, 100\] \(0 is greedy\), got inf"):
        SamplingParams(temperature=INF)
    with pytest.raises(InvalidParam, match=r"max_tokens must be an integer >= 1, got 0"):
        SamplingParams(max_tokens=0)
    with pytest.raises(InvalidParam, match=r"seed must be an integer in \[-2\*\*63, 2\*\*64 - 1\]"):
        SamplingParams(seed=2**64)
    with pytest.raises(InvalidParam, match=r"\.\.\.$"):  # a huge value is shown cut short
        SamplingParams(stop=["x" * 10_000, ""])


def test_valid_values_are_normalised():
    p = SamplingParams(temperature=1, top_k=0, stop="END", stop_token_ids=[3, 4], logit_bias={"7": 1, 2: -5})
    assert isinstance(p.temperature, float) and p.top_k == -1 and p.stop == ("END",)
    assert p.stop_token_ids == (3, 4) and p.logit_bias == ((2, -5.0), (7, 1.0))
    assert SamplingParams(stop=None, logit_bias=None).stop == () and hash(p)
    assert SamplingParams(top_k=2**63).top_k == 2**63  # any size: above the vocabulary means no limit


@pytest.mark.parametrize("seed", [SEED_RANGE[0], -1, 0, 2**63, SEED_RANGE[1]])
def test_boundary_seeds_build_generators_for_every_sample(seed):
    params = SamplingParams(seed=seed, n=4)
    seeds = [sample_seed(params.seed, i) for i in range(params.n)]
    assert all(SEED_RANGE[0] <= s <= SEED_RANGE[1] for s in seeds) and len(set(seeds)) == 4
    gens = [make_generator(s) for s in seeds]
    assert len({torch.rand(1, generator=g).item() for g in gens}) == 4


def test_the_top_seed_wraps_around():
    assert [sample_seed(2**64 - 1, i) for i in range(3)] == [2**64 - 1, 0, 1]
    assert sample_seed(None, 3) is None and sample_seed(-2**63, 2) == -2**63 + 2
    with pytest.raises(InvalidParam) as caught: make_generator(2**64)
    assert caught.value.param == "seed"


def test_tiny_temperatures_are_greedy():
    torch.manual_seed(0)
    logits = torch.randn(4, 300) * 20
    for t in (GREEDY_BELOW_TEMPERATURE / 2, 1e-30, 1e-46, 5e-324):
        params = SamplingParams(temperature=t)
        assert params.greedy
        out = sample_batch(logits, [params] * 4, [make_generator(1)] * 4, [[]] * 4, [[]] * 4)
        assert [s.token_id for s in out] == logits.argmax(-1).tolist()
    assert not SamplingParams(temperature=GREEDY_BELOW_TEMPERATURE).greedy


def test_the_smallest_sampling_temperature_is_stable():
    "Just above the threshold, the division cannot overflow: each row's best logit is subtracted first."
    logits = torch.tensor([[3e4, 0.0, -3e4], [1.0, 1.0 - 1e-3, -5.0]])
    params = [SamplingParams(temperature=GREEDY_BELOW_TEMPERATURE, seed=0)] * 2
    out = sample_batch(logits, params, [make_generator(0), make_generator(1)], [[]] * 2, [[]] * 2)
    assert [s.token_id for s in out] == [0, 0]


@pytest.mark.parametrize("top_k", [300, 2**31, 2**63, 2**64 - 1, 10**30])
def test_huge_top_k_means_no_limit(top_k):
    torch.manual_seed(0)
    logits = torch.randn(2, 300)
    huge = sample_batch(logits, [SamplingParams(top_k=top_k, seed=5)] * 2, [make_generator(5), make_generator(6)],
                        [[]] * 2, [[]] * 2)
    unlimited = sample_batch(logits, [SamplingParams(seed=5)] * 2, [make_generator(5), make_generator(6)],
                             [[]] * 2, [[]] * 2)
    assert huge == unlimited
    with_top_p = sample_batch(logits, [SamplingParams(top_k=top_k, top_p=0.5)], [make_generator(5)], [[]], [[]])
    assert len(with_top_p) == 1


def test_logprobs_on_a_vocabulary_smaller_than_asked():
    out = sample_batch(torch.randn(1, 5), [SamplingParams(temperature=0, logprobs=20)], [make_generator(0)], [[]], [[]])
    assert len(out[0].logprobs.top) == 5


def test_picking_is_a_function_of_the_draws():
    "What lets the engine retry a row alone: the same draws give the same tokens, batched or one by one."
    torch.manual_seed(0)
    logits = torch.randn(3, 300)
    params = [SamplingParams(seed=1), SamplingParams(temperature=0), SamplingParams(top_p=0.8, top_k=40, seed=2)]
    draws = draw_uniforms(params, [make_generator(1), make_generator(9), make_generator(2)])
    assert draws[1] is None
    batched = pick_tokens(logits, params, draws, [[]] * 3, [[]] * 3)
    assert batched == [pick_tokens(logits[i:i + 1], params[i:i + 1], draws[i:i + 1], [[]], [[]])[0] for i in range(3)]
    assert batched == sample_batch(logits, params, [make_generator(1), make_generator(9), make_generator(2)],
                                   [[]] * 3, [[]] * 3)


def test_a_seeded_row_ignores_a_filtering_neighbour():
    "Filtered rows run in probability order, the rest in vocabulary order: a neighbour's filters cannot move a token."
    torch.manual_seed(0)
    logits = torch.randn(2, 300)
    seeded = SamplingParams(seed=11)
    alone = sample_batch(logits[:1], [seeded], [make_generator(11)], [[]], [[]])
    for neighbour in (SamplingParams(top_p=0.5), SamplingParams(top_k=3), SamplingParams(min_p=0.2, top_k=1000)):
        together = sample_batch(logits, [seeded, neighbour], [make_generator(11), make_generator(0)], [[]] * 2, [[]] * 2)
        assert together[0] == alone[0]
