"""The lightning indexer of DeepSeek Sparse Attention (deepseek32, glm-dsa), read from GGUF metadata
(`{arch}.attention.indexer.*`) for strata.gguf.hparams. Must not read tensor data or import torch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gguf.constants import Keys

from strata import arch as archs

from .header import format_error

#: llama.cpp's LLM_KV_ATTENTION_INDEXER_TYPES (gguf-py 0.19's Keys lacks it).
INDEXER_TYPES = "{arch}.attention.indexer.types"


@dataclass(frozen=True)
class IndexerDims:
    """The lightning indexer of DeepSeek Sparse Attention, from `attention.indexer.*`: head_count,
    key_length (one key per position, a power of two >= 64: llama.cpp turns it with one Hadamard
    matrix), top_k (positions each query keeps); `full`, per layer: it runs its own indexer (False:
    it reuses the top-k of the full layer before it; `attention.indexer.types`, else all full)."""

    n_head: int
    head_dim: int
    top_k: int
    full: tuple[bool, ...]



def read_indexer(m, hp) -> IndexerDims:
    """The lightning indexer's sizes and which layers run it (`attention.indexer.types`: one bool
    or 0/1 per layer, else the architecture's `indexer_pattern` or every layer, as llama.cpp reads
    them), checked as llama.cpp needs them. m: hparams' typed metadata, hp: the hyperparameters so far."""
    I = Keys.Attention.Indexer
    dims = IndexerDims(m.get(I.HEAD_COUNT, int), m.get(I.KEY_LENGTH, int), m.get(I.TOP_K, int), ())
    key, pattern = INDEXER_TYPES.format(arch=m.arch), archs.get(m.arch).indexer_pattern
    default = [True] * hp.n_layers
    if pattern and hp.context_length >= pattern[0]:
        _, lead, period = pattern
        default = [i < lead or (i - lead) % period == 0 for i in range(hp.n_layers)]
    flags = m.metadata.get(key, default)
    if not isinstance(flags, list) or len(flags) < hp.n_layers or not all(isinstance(f, (bool, int)) for f in flags):
        raise format_error(m.path, f"metadata key {key!r}", f"an array of {hp.n_layers} bools", f"{flags!r:.80}")
    full = tuple(bool(f) for f in flags[:hp.n_layers])
    if not full[0]:
        raise format_error(m.path, f"metadata key {key!r}", "layer 0 running its own indexer (a shared layer reuses "
                           "the full layer before it)", f"{flags!r:.80}")
    d = dims.head_dim
    if d < 64 or d & (d - 1) or d < hp.rope_dim:
        raise format_error(m.path, f"metadata key {I.KEY_LENGTH.format(arch=m.arch)!r}", "a power of two >= 64 and >= "
                           f"rope.dimension_count={hp.rope_dim} (llama.cpp turns it with one Hadamard matrix)", str(d))
    for k, v in ((I.HEAD_COUNT, dims.n_head), (I.TOP_K, dims.top_k)):
        if v <= 0:
            raise format_error(m.path, f"metadata key {k.format(arch=m.arch)!r}", "> 0", str(v))
    return dataclasses.replace(dims, full=full)


#: llama.cpp's LLM_KV_ATTENTION_INDEXER_TYPES (gguf-py 0.19's Keys lacks it).
INDEXER_TYPES = "{arch}.attention.indexer.types"


__all__ = ["INDEXER_TYPES", "IndexerDims", "read_indexer"]
