"""The engine: KV cache, scheduling, sampling, and the public `load()` -> `Model` API.

Must not hold code: the package's public names, re-exported.
"""
from .api import Chunk, Completion, Model, Stream, load
from .kv_cache import KVCache
from .perplexity import LogitsComparison, PerplexityResult, compare_logits
from .sampling import SamplingParams
from .sequence import Sequence, StopConditions

__all__ = ["Chunk", "Completion", "KVCache", "LogitsComparison", "Model", "PerplexityResult", "SamplingParams",
           "Sequence", "StopConditions", "Stream", "compare_logits", "load"]
