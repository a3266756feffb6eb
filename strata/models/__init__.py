"""Model maths in torch: shared building blocks, assembled per architecture from its
`strata.arch` record.

`load_model(model_file, memory, device=, dtype=)` builds a `Transformer` from a GGUF file alone;
its forward pass takes a `Batch` (which new tokens of which sequences) and a KV store, and
reaches routed experts only through the `strata.memory.ExpertMemory` it was given.
"""
from .batch import Batch, KVStore
from .loader import architecture, cache_dims, cache_states, check_types, load_model
from .transformer import Transformer

__all__ = ["Batch", "KVStore", "Transformer", "architecture", "cache_dims", "cache_states", "check_types", "load_model"]
