"""Tensor, pipeline and expert parallelism over worker processes (gloo): every layout gives each request the greedy
tokens one process gives, with batching, chunked prefill, prefix caching and preemption on."""
import pytest

from conftest import save_family, save_tiny, with_smollm2_tokenizer
from helios import LLM, SamplingParams
from helios.registry import NotApplicable

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
SETTINGS = dict(dtype="float32", device="cpu", max_batch_size=4, prefill_chunk_size=32, page_size=16, quiet=True)
VOCAB = 49153  # SmolLM2's tokenizer plus one: a vocabulary no world size divides

# name -> (checkpoint writer, layouts (tp, pp) to check); together they cover: KV heads fewer than ranks (llama: 1),
# layers the stages do not divide (llama and qwen3_moe: 3 layers), experts split across ranks (qwen3_moe, deepseek_v3),
# DSA's indexer held whole by every rank while its heads split (deepseek_v32: each query keeps 6 of up to 130 tokens),
# Gemma 3's sliding windows and norms stored as w (its family's tensors adapted on every rank as in one process)
MODELS = {
    "qwen3": (lambda folder: save_tiny("qwen3_untied", folder, vocab_size=VOCAB), [(2, 1), (1, 2), (2, 2)]),
    "llama": (lambda folder: save_tiny("llama", folder, vocab_size=VOCAB, num_key_value_heads=1, num_hidden_layers=3),
              [(2, 1), (1, 2), (2, 2)]),
    "qwen3_moe": (lambda folder: save_family("qwen3_moe", folder, vocab_size=VOCAB), [(2, 1), (1, 2), (2, 2)]),
    "deepseek_v3": (lambda folder: save_family("deepseek_v3", folder, vocab_size=VOCAB), [(2, 1)]),
    "deepseek_v32": (lambda folder: save_family("deepseek_v32", folder, vocab_size=VOCAB), [(2, 1)]),  # indexer whole
    "gemma3_text": (lambda folder: save_family("gemma3_text", folder, vocab_size=VOCAB), [(2, 1), (1, 2)]),
}


def prompts() -> list[list[int]]:
    "Six prompts: three share a two-page prefix; lengths cross page and chunk boundaries."
    shared = [(5 * j) % 400 + 3 for j in range(32)]
    own = [[(11 * i + 7 * j) % 400 + 1 for j in range(3 + 17 * i)] for i in range(6)]
    return [shared + own[i] if i < 3 else own[i] for i in range(6)]


def generate(llm: LLM) -> list[list[int]]:
    first, *rest = prompts()
    outs = llm.generate([first], GREEDY, use_tqdm=False)  # alone first: its prefix pages are cached for the others
    return [o.token_ids for o in outs + llm.generate(rest, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, tmp_path_factory, smollm2_gguf):
    write, layouts = MODELS[request.param]
    folder = with_smollm2_tokenizer(write(tmp_path_factory.mktemp(request.param)), smollm2_gguf)
    with LLM(folder, **SETTINGS) as one:
        return folder, layouts, generate(one)


def test_every_layout_gives_the_tokens_of_one_process(model):
    folder, layouts, alone = model
    for tp, pp in layouts:
        with LLM(folder, tensor_parallel_size=tp, pipeline_parallel_size=pp, **SETTINGS) as llm:
            assert generate(llm) == alone, f"tp={tp} pp={pp}"
            stats = llm.stats()
            assert stats.prefix_hit_tokens >= 2 * 32  # two requests read the shared prefix from the cache
            assert stats.num_used_pages == 0 and stats.num_free_pages + stats.num_cached_pages == stats.num_pages


def test_a_small_pool_preempts_and_keeps_the_tokens(tmp_path, smollm2_gguf):
    folder = with_smollm2_tokenizer(save_tiny("qwen3_untied", tmp_path, vocab_size=VOCAB), smollm2_gguf)
    longer = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    small = dict(SETTINGS, kv_cache_bytes=10 * 16 * 512)  # 10 pages of 16 tokens, 512 B each (2 layers x 2 x 2 heads x 16)
    with LLM(folder, **small) as one: alone = [o.token_ids for o in one.generate(prompts(), longer, use_tqdm=False)]
    with LLM(folder, tensor_parallel_size=2, **dict(small, kv_cache_bytes=small["kv_cache_bytes"] // 2)) as llm:
        assert [o.token_ids for o in llm.generate(prompts(), longer, use_tqdm=False)] == alone
        assert llm.stats().num_pages == 10 and llm.stats().num_preemptions > 0


def test_drafting_decodes_verify_across_ranks(tmp_path, smollm2_gguf):
    "Speculative decoding over two stages of two ranks: each drafting decode's logits at every token come back."
    folder = with_smollm2_tokenizer(save_tiny("qwen3_untied", tmp_path, vocab_size=VOCAB), smollm2_gguf)
    with LLM(folder, **SETTINGS) as one: alone = generate(one)
    with LLM(folder, tensor_parallel_size=2, pipeline_parallel_size=2, speculative="ngram", speculative_ngram_min=1,
             **SETTINGS) as llm:
        assert generate(llm) == alone
        assert llm.stats().num_draft_tokens > 0


def test_sizes_that_do_not_divide_fail_before_any_process_starts(tmp_path, smollm2_gguf, no_worker_processes):
    folder = with_smollm2_tokenizer(save_tiny("qwen3_untied", tmp_path, vocab_size=VOCAB), smollm2_gguf)
    with pytest.raises(ValueError, match="tensor_parallel_size=3 must divide the 4 attention heads"):
        LLM(folder, tensor_parallel_size=3, **SETTINGS)
    with pytest.raises(ValueError, match="pipeline_parallel_size=3 is more than the model's 2 layers"):
        LLM(folder, pipeline_parallel_size=3, **SETTINGS)
    with pytest.raises(ValueError, match="host KV tier"):
        LLM(folder, tensor_parallel_size=2, kv_offload_bytes=10**6, **SETTINGS)


def test_the_default_gguf_model_over_three_ranks_and_over_two_stages(smollm2_gguf):
    "SmolLM2's Q4_1 GGUF (9 heads, 3 KV heads, 30 layers): each rank dequantizes one tensor at a time and keeps its part."
    chat = ["What is the capital of France?", "Name a prime number.", "Say hello."]
    settings = dict(SETTINGS, kv_cache_bytes=2**26)
    with LLM(smollm2_gguf, **settings) as one: alone = [o.token_ids for o in one.generate(chat, GREEDY, use_tqdm=False)]
    for layout in (dict(tensor_parallel_size=3), dict(pipeline_parallel_size=2)):
        with LLM(smollm2_gguf, **settings, **layout) as llm:
            assert [o.token_ids for o in llm.generate(chat, GREEDY, use_tqdm=False)] == alone, layout


def test_the_default_dtype_keeps_each_ranks_untied_head_in_float32(tmp_path, smollm2_gguf):
    "Under auto the ranks read the layers' matrices in the matmul's dtype; a rank's own head (no Linear) stays float32."
    folder = with_smollm2_tokenizer(save_tiny("qwen3_untied", tmp_path, vocab_size=VOCAB), smollm2_gguf)
    settings = dict(SETTINGS, dtype="auto", matmul="c")
    try:
        with LLM(folder, **settings) as one: alone = generate(one)
    except NotApplicable as e: pytest.skip(str(e))
    for tp, pp in ((2, 1), (1, 2)):
        with LLM(folder, tensor_parallel_size=tp, pipeline_parallel_size=pp, **settings) as llm:
            assert generate(llm) == alone, f"tp={tp} pp={pp}"
