"""The engine: KV cache, scheduling, sampling, and the public `load()` -> `Model` API.

Must not hold code: the package's public names, re-exported.
"""
from .api import Chunk, Completion, Model, Stream, load
from .config import MemoryConfig
from .kv_cache import BLOCK_SIZE, BlockTables, KVCache
from .perplexity import ChunkDone, LogitsComparison, PerplexityResult, compare_logits
from .sampling import SamplingParams
from .scheduler import MAX_STEP_TOKENS, EngineFull, Scheduler
from .sequence import Sequence, StopConditions

__all__ = ["BLOCK_SIZE", "BlockTables", "Chunk", "ChunkDone", "Completion", "EngineFull", "KVCache", "LogitsComparison",
           "MAX_STEP_TOKENS", "MemoryConfig", "Model", "PerplexityResult", "SamplingParams", "Scheduler", "Sequence",
           "StopConditions", "Stream", "compare_logits", "load"]
