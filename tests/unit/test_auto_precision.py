"""What `auto` keeps for a family (chapter 04's `Family.auto_precision`): a matmul storing weights the family does not
keep is passed over with the family's reason, the one taken pairs with the family's KV pages; a named matmul and a
named kv_cache_dtype are taken as given; a family that declares nothing gets the fastest choice, as before."""
import sys
import types
from importlib.metadata import EntryPoint

import pytest
import torch

import helios.registry as registry
from helios.config import EngineConfig
from helios.families import AutoPrecision, Family, load_family
from helios.llm import paired_kv_pages
from helios.model.qwen3 import DecoderLayer
from helios.weights import LinearFactory, LoadedModel, choose_matmul

CPU = torch.device("cpu")
KEEP_HALF = AutoPrecision((torch.float16, torch.float32), torch.float32, "a check")


def family(precision: AutoPrecision | None) -> Family:
    return Family("fam", lambda d: None, DecoderLayer, auto_precision=precision)


@pytest.fixture
def matmuls(monkeypatch):
    "Three made-up matmuls, as chapter 92 and 15 rank theirs: bfloat16 weights beside float16 pages, float16, float32."
    module = types.ModuleType("fake_matmuls")
    module.BF16 = registry.Implementation("matmul", "bf16", lambda **c: LinearFactory(None, torch.bfloat16, None, torch.float16),
                                          40, "bf16")
    module.HALF = registry.Implementation("matmul", "half", lambda **c: LinearFactory(None, torch.float16), 30, "half")
    module.EXACT = registry.Implementation("matmul", "exact", lambda **c: LinearFactory(None, torch.float32), 10, "exact")
    monkeypatch.setitem(sys.modules, "fake_matmuls", module)
    points = [EntryPoint(n, f"fake_matmuls:{n.upper()}", "helios.matmul") for n in ("bf16", "half", "exact")]
    monkeypatch.setattr(registry, "entry_points", lambda group: [p for p in points if p.group == group])
    return module


def loaded_with(choice) -> LoadedModel:
    return LoadedModel(None, None, None, None, torch.float32, choice.value.weight_dtype, CPU, 0.0, choice)


def test_a_family_that_declares_nothing_gets_the_fastest_choice(matmuls):
    for fam in (None, family(None)):
        choice = choose_matmul("auto", CPU, torch.float32, exact=False, family=fam)
        assert choice.implementation is matmuls.BF16 and choice.value.kv_dtype == torch.float16
        assert paired_kv_pages(EngineConfig(), loaded_with(choice)).kv_cache_dtype == "float16"


def test_auto_keeps_the_family_s_weights_and_pages_and_says_why(matmuls):
    choice = choose_matmul("auto", CPU, torch.float32, exact=False, family=family(KEEP_HALF))
    assert choice.implementation is matmuls.HALF and choice.value.weight_dtype == torch.float16
    assert choice.passed_over == ("bf16: fam keeps float16 or float32 weights and float32 pages under auto: a check",)
    assert paired_kv_pages(EngineConfig(), loaded_with(choice)).kv_cache_dtype == "float32"
    strict = family(AutoPrecision((torch.float32,), torch.float32, "exact only"))
    assert choose_matmul("auto", CPU, torch.float32, exact=False, family=strict).implementation is matmuls.EXACT


def test_a_named_matmul_or_kv_cache_dtype_wins_over_the_family(matmuls):
    named = choose_matmul("bf16", CPU, torch.float32, exact=False, family=family(KEEP_HALF))
    assert named.implementation is matmuls.BF16 and named.value.kv_dtype == torch.float16 and named.passed_over == ()
    assert paired_kv_pages(EngineConfig(matmul="auto"), loaded_with(named)).kv_cache_dtype == "float16"
    kept = choose_matmul("auto", CPU, torch.float32, exact=False, family=family(KEEP_HALF))
    assert paired_kv_pages(EngineConfig(kv_cache_dtype="float16"), loaded_with(kept)).kv_cache_dtype == "float16"


def test_off_the_cpu_float32_path_the_family_changes_nothing(matmuls):
    choice = choose_matmul("auto", CPU, torch.bfloat16, exact=False, family=family(KEEP_HALF))
    assert choice.implementation.name == "torch" and choice.value.kv_dtype is None


def test_gemma3_keeps_float16_weights_and_float32_pages_the_others_declare_nothing():
    pytest.importorskip("tokenizers")
    gemma3 = load_family("gemma3_text").auto_precision
    assert torch.bfloat16 not in gemma3.weight_dtypes and torch.float16 in gemma3.weight_dtypes
    assert gemma3.kv_dtype == torch.float32 and "tolerance" in gemma3.reason
    assert load_family("qwen3").auto_precision is None and load_family("llama").auto_precision is None
