"""Helios: a small, readable LLM inference engine."""
__version__ = "0.1.0"

import importlib

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
# imported on first use (PEP 562), so that `helios --help` and the light modules do not load torch and the engine
_LAZY = {"LLM": "helios.llm", "SamplingParams": "helios.sampling", "RequestOutput": "helios.engine",
         "CompletionOutput": "helios.engine"}


def __getattr__(name: str):
    if name not in _LAZY: raise AttributeError(f"module 'helios' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__(): return sorted([*globals(), *__all__])
