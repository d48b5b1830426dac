"""A small, readable, fast LLM inference engine: Qwen3 and Llama, paged KV cache, continuous batching, an OpenAI-style server.

Modules:

- `helios.model.gemma3`: A second family on real weights: Google's Gemma 3 270M read from a Q4_K_M GGUF, its SentencePiece tokenizer rebuilt from the file's metadata, and a decoder whose local layers attend to a window of 512 tokens."""

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
