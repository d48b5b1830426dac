"""The least arithmetic of a workload (chapter 14's `tokens_flops`), checked against PyTorch's own FLOP counter, and
the report that turns it into the matmul rate each target against vLLM asks for."""
import re
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from helios.config import tiny_llama, tiny_qwen3
from helios.model.qwen3 import CausalLM
from helios.bench.flops import least_ttft_flops, request_flops, tokens_flops
from helios.bench.report import work_floor_report

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"


def counted_flops(model, tokens: int, logits_at=None) -> tuple[int, int]:
    """(matmul FLOPs, attention FLOPs) PyTorch's FlopCounterMode counts in one forward of `tokens` tokens. SDPA runs
    its math backend, two batched matmuls the counter sees (it does not count the CPU's fused kernel); the
    projections and the LM head are `mm` and `addmm`."""
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(ids, torch.arange(tokens)[None], logits_at=logits_at)
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    attention = counts.pop("aten.bmm", 0)
    assert set(counts) <= {"aten.mm", "aten.addmm"}, counts
    return sum(counts.values()), attention


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen3])
def test_the_count_of_a_forward_agrees_with_pytorchs_flop_counter(make):
    cfg, tokens = make(), 7
    model = CausalLM(cfg).eval()
    matmuls, attention = counted_flops(model, tokens)  # every layer on every token, logits at every token
    ours = tokens_flops(cfg, 0, tokens, tokens)
    ours_attention = 2 * 2 * cfg.q_size * cfg.num_layers * tokens * (tokens + 1) // 2
    assert ours - ours_attention == matmuls
    # PyTorch counts causal SDPA's full tokens x tokens products; the mask keeps tokens (tokens + 1) / 2 of them
    assert ours_attention * 2 * tokens == attention * (tokens + 1)


def test_a_token_that_is_not_sampled_needs_only_k_and_v_in_the_last_layer():
    cfg, tokens = tiny_llama(), 6
    matmuls, _ = counted_flops(CausalLM(cfg).eval(), tokens, logits_at=torch.tensor([tokens - 1]))
    ours = tokens_flops(cfg, 0, tokens, 1)
    ours_attention = 2 * 2 * cfg.q_size * (cfg.num_layers * tokens * (tokens + 1) // 2 - tokens * (tokens - 1) // 2)
    # PyTorch's layer runs q and the output projection of the last layer on every token, the MLP on the sampled one
    q_and_o = 2 * 2 * cfg.hidden_size * cfg.q_size
    assert matmuls - (ours - ours_attention) == q_and_o * (tokens - 1)


def test_a_request_is_its_prefill_and_its_decode_steps():
    cfg = tiny_qwen3()
    assert request_flops(cfg, 5, 1) == tokens_flops(cfg, 0, 5, 1)  # one output token: prefill only
    for n in (2, 3, 9):  # one more output token: one more decode step, at position 5 + n - 2
        assert request_flops(cfg, 5, n) - request_flops(cfg, 5, n - 1) == tokens_flops(cfg, 5 + n - 2, 1, 1)
    assert tokens_flops(cfg, 3, 0, 0) == 0 and tokens_flops(cfg, 9, 2, 2) > tokens_flops(cfg, 3, 2, 2)  # longer context


def test_counts_that_make_no_sense_are_errors():
    cfg = tiny_llama()
    for start, count, sampled in ((0, 3, 4), (0, 3, -1), (-1, 3, 1)):
        with pytest.raises(ValueError, match="want 0 <= sampled <= count and start >= 0"):
            tokens_flops(cfg, start, count, sampled)
    for prompt, output in ((0, 5), (5, 0)):
        with pytest.raises(ValueError, match="a request has at least one of each"):
            request_flops(cfg, prompt, output)


def test_the_least_work_behind_a_ttft_percentile():
    cfg = tiny_llama()
    cost = {n: tokens_flops(cfg, 0, n, 1) for n in (10, 20, 30)}
    prompts = [30, 10, 20]
    assert least_ttft_flops(cfg, prompts, 0) == cost[10]                       # the first token: the shortest prompt
    assert least_ttft_flops(cfg, prompts, 0, in_order=True) == cost[30]         # in arrival order: the first prompt
    for in_order in (False, True):
        assert least_ttft_flops(cfg, prompts, 100, in_order) == sum(cost.values())  # the last: all of them
    assert least_ttft_flops(cfg, prompts, 50) == cost[10] + cost[20]
    assert least_ttft_flops(cfg, prompts, 50, in_order=True) == cost[30] + cost[10]


def test_the_work_floor_report_of_the_committed_run():
    from helios.weights import load_model
    report = work_floor_report(RESULTS, load_model().config)
    rows = [line.split(" | ") for line in report.splitlines() if re.match(r"\| (helios-30|decode-16) \|", line)]
    assert [(r[0], r[1]) for r in rows] == [(f"| {w}", t) for w in ("helios-30", "decode-16")
                                            for t in ("output tok/s ≥ 2×", "TTFT p50 ≤ 0.5×", "TTFT p95 ≤ 0.5×")]
    number = lambda cell: float(cell.strip(" |").replace(",", ""))
    for r in rows:
        vllm, flops, needed, fifo_flops, fifo_needed = map(number, (r[2], r[4], r[5], r[6], r[7]))
        assert 0 < flops <= fifo_flops and 0 < needed <= fifo_needed
        if r[1].startswith("TTFT"):  # the rate needed is the least work over half of vLLM's time
            assert needed == pytest.approx(flops / (0.5 * vllm), rel=0.02, abs=1)
    decode = [r for r in rows if r[0] == "| decode-16"]
    assert all(r[4] == r[6] for r in decode)  # prompts of one length: any order is arrival order
