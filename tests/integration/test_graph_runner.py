"""The CUDA-graph runner (chapter 17) against the eager one, on a CPU: `EagerGraph` has a CUDA graph's interface
(capture once, replay into the same output tensor), so buckets, static buffers, padding rows and the scratch page
are what a GPU runs. And the forward's freedom from host reads, on PyTorch's meta device."""

import pytest
import torch

from helios.attention.reference import BatchedAttention
from helios.config import EngineConfig, tiny_llama, tiny_qwen3
from helios.model.mla import MLAModelConfig, tiny_deepseek_v3
from helios.engine import Engine, ModelRunner
from helios.gpu.graphs import EagerGraph, GraphRunner, batch_buckets, bucket_for, page_buckets
from helios.kv.pool import KVPool
from helios.model.qwen3 import CausalLM
from helios.registry import NotApplicable, choose
from helios.sampling import SamplingParams
from helios.scheduler import ScheduledChunk, Sequence, TickPlan
from helios.weights import layer_factory

CONFIG = EngineConfig(max_batch_size=4, prefill_chunk_size=16, page_size=8)


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_gguf):
    "SmolLM2's tokenizer: only detokenizes here (the text of tiny-model ids is noise)."
    from helios.tokenizer import load_tokenizer
    return load_tokenizer(smollm2_gguf)


def peaked(cfg):
    "A random model whose weights are scaled up, so that greedy picks are clear-cut."
    torch.manual_seed(0)
    model = CausalLM(cfg, layer_factory(cfg)).eval()
    for p in model.parameters(): p.data.mul_(20 if not isinstance(cfg, MLAModelConfig) else 4)
    return model


def graph_runner(*args, **kwargs) -> GraphRunner:
    runner = GraphRunner(*args, make_graph=EagerGraph, page_counts=(1, 2, 4), **kwargs)
    runner.capture()
    return runner


def serve(model, tok, prompts, params, make_runner=None, config=CONFIG):
    engine = Engine(model, tok, frozenset(), config, num_pages=32, make_runner=make_runner)
    handles = [engine.submit(p, params) for p in prompts]
    while engine.step(): pass
    return [[o.token_ids for o in h.result().outputs] for h in handles], engine.runner


PROMPTS = [list(range(10, 30)), list(range(40, 45)), list(range(50, 53)), list(range(60, 62)), list(range(70, 90))]


@pytest.mark.parametrize("cfg", [tiny_qwen3(), tiny_llama()], ids=["qwen3", "llama"])
def test_graphs_give_the_eager_tokens_greedy_and_sampled(cfg, smollm2_tokenizer):
    model = peaked(cfg)
    for params in (SamplingParams(temperature=0, max_tokens=14, ignore_eos=True),
                   SamplingParams(temperature=0.8, top_p=0.9, seed=3, n=2, max_tokens=10, ignore_eos=True)):
        eager, _ = serve(model, smollm2_tokenizer, PROMPTS, params)
        graphs, runner = serve(model, smollm2_tokenizer, PROMPTS, params, graph_runner)
        assert graphs == eager
        assert runner.num_replays > 0 and runner.num_eager > 0  # decode ticks replayed; prompts and long rows eager


def test_graph_logits_match_the_eager_logits_row_by_row(smollm2_tokenizer):
    """Padding rows (the 3-row tick runs in the 4-row bucket) change nothing in the real rows' logits. In float64:
    PyTorch's float32 CPU matmul may add a row's products in another order when the batch has more rows (it does on
    an AMD EPYC: 1e-3 apart at 3 and 4 rows), which would hide nothing but make the check a test of the BLAS."""
    model = peaked(tiny_qwen3()).double()
    pool = KVPool(model.config, 8, 8, torch.float64, "cpu", scratch_page=True)
    eager = ModelRunner(model, pool, 4, 4, BatchedAttention())
    graphs = GraphRunner(model, pool, 4, 4, BatchedAttention(), make_graph=EagerGraph, page_counts=(1, 2, 4))
    graphs.capture()
    torch.manual_seed(1)
    pool.k.normal_(); pool.v.normal_()  # whatever the pages hold: both runners read the same
    seqs = [Sequence(i, f"r{i}", [1] * n, 8, 0.0, 8) for i, n in enumerate((12, 3, 7))]
    for seq, pages in zip(seqs, ([5, 2], [0], [3])): seq.page_table = pages
    plan = TickPlan([ScheduledChunk(s, n, [7 + i], True, True) for i, (s, n) in enumerate(zip(seqs, (12, 3, 7)))])
    assert graphs.bucket(plan) == (4, 2)
    scratch_before = pool.k[:, pool.scratch_page].clone()
    expected = eager.run(plan).clone()
    got = graphs.run(plan)
    assert graphs.num_replays == 1 and got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
    assert not torch.equal(pool.k[:, pool.scratch_page], scratch_before)  # the padding row wrote there, and only there


def test_static_inputs_pad_to_the_bucket_and_write_padding_to_the_scratch_page():
    model = CausalLM(tiny_qwen3()).eval()
    pool = KVPool(model.config, 8, 8, torch.float32, "cpu", scratch_page=True)
    runner = GraphRunner(model, pool, 4, 4, BatchedAttention(), make_graph=EagerGraph, page_counts=(1, 2, 4))
    seqs = [Sequence(i, f"r{i}", [1] * n, 8, 0.0, 8) for i, n in enumerate((12, 3, 7))]
    for seq, pages in zip(seqs, ([5, 2], [0], [3])): seq.page_table = pages
    plan = TickPlan([ScheduledChunk(s, n, [7 + i], True, True) for i, (s, n) in enumerate(zip(seqs, (12, 3, 7)))])
    ids, positions, slots, contexts, tables = runner._views(4, 2, runner.static_inputs(plan, 4, 2))
    assert ids.tolist() == [7, 8, 9, 0] and positions.tolist() == [12, 3, 7, 0] and contexts.tolist() == [13, 4, 8, 1]
    assert slots.tolist() == [2 * 8 + 4, 3, 3 * 8 + 7, 8 * 8]
    assert tables.tolist() == [[5, 2], [0, 0], [3, 0], [8, 0]]
    assert runner.bucket(TickPlan([ScheduledChunk(seqs[0], 10, [1, 1], True)])) is None  # prompt tokens: eager
    long = Sequence(9, "long", [1] * 40, 8, 0.0, 8)
    long.page_table = [0, 1, 2, 3, 4, 5]
    assert runner.bucket(TickPlan([ScheduledChunk(long, 40, [1], True, True)])) is None  # 6 pages: past every bucket


def test_buckets():
    assert batch_buckets(32) == (1, 2, 4, 8, 16, 24, 32) and batch_buckets(3) == (1, 2, 3)
    assert page_buckets(160) == (1, 2, 4, 8, 16, 32, 64, 128, 160)
    assert bucket_for(5, batch_buckets(32)) == 8 and bucket_for(33, batch_buckets(32)) is None


def test_a_graph_runner_needs_the_scratch_page():
    model = CausalLM(tiny_qwen3()).eval()
    with pytest.raises(ValueError, match="scratch page"):
        GraphRunner(model, KVPool(model.config, 8, 8, torch.float32, "cpu"), 4, 4, BatchedAttention())


def test_the_runner_setting_on_a_cpu():
    "auto passes over CUDA graphs with the reason; naming them on a CPU is an error that says why."
    model = CausalLM(tiny_qwen3()).eval()
    pool = KVPool(model.config, 8, 8, torch.float32, "cpu", scratch_page=True)
    context = dict(model=model, kv=pool, max_rows=4, max_pages_per_seq=4, backend=BatchedAttention(), config=CONFIG)
    auto = choose("runner", "auto", **context)
    assert auto.implementation.name == "eager" and type(auto.value) is ModelRunner
    assert any("CUDA graphs run on CUDA devices, not cpu" in r for r in auto.passed_over)
    with pytest.raises(NotApplicable, match="not cpu"):
        choose("runner", "cuda-graphs", **context)
    with pytest.raises(ValueError, match="runner must be one of auto, cuda-graphs, eager"):
        EngineConfig(runner="graphs")


@pytest.mark.parametrize("cfg", [tiny_qwen3(), tiny_deepseek_v3(moe=None)], ids=["qwen3", "mla"])
def test_no_tick_reads_a_device_value(cfg, smollm2_tokenizer):
    """Every plan an engine runs on the CPU (prefill chunks, mixed ticks, decode ticks), replayed through a runner
    whose model and pool are on meta: any read of a device value there raises."""
    plans = []
    engine = Engine(peaked(cfg), smollm2_tokenizer, frozenset(), CONFIG, num_pages=16)
    run = engine.runner.run
    engine.runner.run = lambda plan, timer=None: plans.append(plan) or run(plan, timer)
    for n in (20, 5, 9): engine.submit(list(range(1, n + 1)), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    while engine.step(): pass
    with torch.device("meta"): model = CausalLM(cfg, layer_factory(cfg)).eval()
    runner = ModelRunner(model, KVPool(cfg, 16, 8, torch.float32, "meta"), 4, 8, BatchedAttention())
    assert any(p.is_decode_only for p in plans) and any(not p.is_decode_only for p in plans)
    for plan in plans:
        logits = runner.run(plan)
        assert logits.device.type == "meta" and logits.shape == (sum(c.samples for c in plan.chunks), cfg.vocab_size)


def test_reading_a_meta_value_does_raise():
    "What the test above relies on."
    with pytest.raises((RuntimeError, NotImplementedError)): int(torch.zeros(2, device="meta")[0])
    with pytest.raises((RuntimeError, NotImplementedError)): torch.zeros(2, device="meta").tolist()
