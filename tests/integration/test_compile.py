"""`compile=True` (chapter 11's compile_layers, chapter 17's flag): torch.compile of every layer's norms and MLP
changes the speed, never the tokens: the same greedy and seeded-sampling tokens as the eager model, on ticks of
one token, of several decode rows and of prompt chunks. Slow: inductor compiles each layer's parts at start-up."""

import pytest
import torch

from helios.config import EngineConfig, tiny_llama, tiny_qwen3
from helios.engine import Engine
from helios.model.qwen3 import CausalLM
from helios.sampling import SamplingParams
from helios.weights import layer_factory

pytestmark = pytest.mark.slow

PROMPTS = [list(range(10, 30)), list(range(40, 45)), list(range(50, 53)), [7]]


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_gguf):
    "SmolLM2's tokenizer: only detokenizes here (the text of tiny-model ids is noise)."
    from helios.tokenizer import load_tokenizer
    return load_tokenizer(smollm2_gguf)


def peaked(cfg):
    "A random model whose weights are scaled up, so that greedy picks are clear-cut."
    torch.manual_seed(0)
    model = CausalLM(cfg, layer_factory(cfg)).eval()
    for p in model.parameters(): p.data.mul_(20)
    return model


def serve(model, tokenizer, compile_: bool, params):
    config = EngineConfig(max_batch_size=4, prefill_chunk_size=16, page_size=8, compile=compile_)
    engine = Engine(model, tokenizer, frozenset(), config, num_pages=32)
    handles = [engine.submit(p, params) for p in PROMPTS]
    while engine.step(): pass
    return [[o.token_ids for o in h.result().outputs] for h in handles], engine


@pytest.mark.parametrize("make_cfg", [tiny_qwen3, tiny_llama], ids=["qwen3", "llama"])
def test_compiled_layers_give_the_eager_tokens(make_cfg, smollm2_tokenizer):
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=3, n=2, max_tokens=8, ignore_eos=True)
    eager = [serve(peaked(make_cfg()), smollm2_tokenizer, False, p)[0] for p in (greedy, sampled)]
    model = peaked(make_cfg())
    compiled = []
    for p in (greedy, sampled):
        tokens, engine = serve(model, smollm2_tokenizer, True, p)
        compiled.append(tokens)
        assert engine.compile_s is not None and engine.compile_s > 0   # compiled, and the time counted
    layer = model.model.layers[0]
    assert layer.mlp._compiled_call_impl is not None                    # the layer's parts really are compiled
    assert compiled == eager
