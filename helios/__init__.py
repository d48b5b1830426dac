"""Helios: a small, readable LLM inference engine."""
__version__ = "0.1.0"

from helios.llm import LLM, CompletionOutput, RequestOutput
from helios.sampling import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
