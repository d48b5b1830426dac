"""Chapter 00's registry: names from the package metadata, `auto` by priority, and why each one was passed over."""
import sys
import types
from importlib.metadata import EntryPoint

import pytest

import helios.registry as registry
from helios.config import EngineConfig
from helios.registry import Implementation, NotApplicable, Unavailable, choose


def fail(error):
    def build(**context): raise error
    return build


@pytest.fixture
def plugins(monkeypatch):
    "Five made-up matmul implementations in a module of their own, registered as entry points (one opt-in)."
    module = types.ModuleType("fake_plugins")
    module.FAST = Implementation("matmul", "fast", fail(Unavailable("no compiler")), 30, "fast")
    module.GPU = Implementation("matmul", "gpu", fail(NotApplicable("not a GPU")), 20, "gpu")
    module.OK = Implementation("matmul", "ok", lambda **context: ("built", context), 10, "ok")
    module.SLOW = Implementation("matmul", "slow", lambda **context: "slow", 0, "slow")
    module.LOSSY = Implementation("matmul", "lossy", lambda **context: "lossy", None, "lossy")  # only when named
    monkeypatch.setitem(sys.modules, "fake_plugins", module)
    points = [EntryPoint(n, f"fake_plugins:{v}", "helios.matmul") for n, v in
              [("fast", "FAST"), ("gpu", "GPU"), ("ok", "OK"), ("slow", "SLOW"), ("lossy", "LOSSY"),
               ("broken", "MISSING")]]
    monkeypatch.setattr(registry, "entry_points", lambda group: [p for p in points if p.group == group])
    return module


def test_auto_takes_the_best_that_builds_and_says_why_it_passed_the_others(plugins):
    with pytest.warns(RuntimeWarning) as warned:
        choice = choose("matmul", device="cpu")
    assert choice.implementation is plugins.OK and choice.value == ("built", {"device": "cpu"})
    assert [r.split(":")[0] for r in choice.passed_over] == ["broken", "fast", "gpu"]
    assert "no compiler" in choice.passed_over[1] and "not a GPU" in choice.passed_over[2]
    assert sorted(str(w.message).split(":")[1].split()[0] for w in warned) == ["broken", "fast"]  # not gpu: silent


def test_auto_never_takes_an_opt_in_but_its_name_does(plugins, monkeypatch):
    for name in ("fast", "gpu", "ok", "slow"): monkeypatch.setattr(plugins, name.upper(), Implementation(
        "matmul", name, fail(NotApplicable("not here")), getattr(plugins, name.upper()).priority, name))
    with pytest.warns(RuntimeWarning), pytest.raises(Unavailable, match="no matmul implementation runs here") as e:
        choose("matmul")
    assert "lossy" not in str(e.value)
    assert choose("matmul", "lossy").value == "lossy"


def test_an_explicit_name_is_built_or_refused_with_the_reason(plugins):
    assert choose("matmul", "slow").value == "slow"
    with pytest.raises(Unavailable, match="no compiler"): choose("matmul", "fast")
    with pytest.raises(Unavailable, match="does not import"): choose("matmul", "broken")
    with pytest.raises(ValueError, match="matmul must be one of auto, broken, fast, gpu, lossy, ok, slow, got 'best'"):
        choose("matmul", "best")


def test_the_engine_settings_are_checked_against_the_registered_names():
    assert {"reference", "torch", "varlen", "c"} <= set(registry.implementation_names("attention"))
    assert {"torch", "onednn", "fbgemm", "c"} <= set(registry.implementation_names("matmul"))
    with pytest.raises(ValueError, match="attention must be one of auto, "): EngineConfig(attention="flash")
    with pytest.raises(ValueError, match="matmul must be one of auto, "): EngineConfig(matmul="cublas")
    with pytest.raises(ValueError, match="kind must be one of"): registry.implementation_names("sampler")


def test_every_registered_implementation_imports_and_is_what_its_entry_point_says():
    for kind in registry.KINDS:
        for name in registry.implementation_names(kind):
            impl = registry.load_implementation(kind, name)
            assert (impl.kind, impl.name) == (kind, name) and impl.summary


def test_auto_passes_over_what_the_caller_refuses_with_its_reason_and_a_name_ignores_it(plugins):
    refuse = lambda value: "too coarse" if value != "slow" else None
    with pytest.warns(RuntimeWarning):
        choice = choose("matmul", refuse=refuse)
    assert choice.implementation is plugins.SLOW and choice.passed_over[-1] == "ok: too coarse"
    assert choose("matmul", "ok", refuse=refuse).implementation is plugins.OK
