"""Helios: a small, readable LLM inference engine."""
__version__ = "0.1.0"

from helios.engine import CompletionOutput, RequestOutput
from helios.llm import LLM
from helios.sampling import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
