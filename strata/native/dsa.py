"""Sparse latent attention in native code (native/executor/dsa.c): the lightning indexer of decode
tokens and latent attention over the positions it keeps, for the per-call decode path of
strata.models.executor.dsa (whose fused step, `DecodeDSA`, runs the same two functions).

    ix = native.DsaIndexer(n_embd=D, q_lora=Q, n_head=Hi, head_dim=Di, top_k=K, rope_dim=R, neox=True,
                           norm_eps=eps, q_b=(type, bytes), k=(type, bytes), k_norm=w, k_norm_b=b, proj=p)
    keep, n_keep = ix.select(pool, xa, qa, positions, cos, sin, index_cache, block_table)
    native.dsa_attend(pool, query, cache, block_table, keep, n_keep, scale, out)

Tensors are contiguous CPU tensors (float32, int64 indices); C checks every size.
"""
from __future__ import annotations

from typing import Any

from strata.quant import ggml_type

from ._lib import check, ffi, impl_code, lib
from .glue import kv_cache_type
from .step import _index, f32_ptr, void_ptr


def _f32(t: Any, what: str, n: int) -> Any:
    return f32_ptr(t, f"sparse attention: {what}", n)


def i64_ptr(t: Any) -> Any:
    """The address of a contiguous CPU int64 tensor, for a struct's `int64_t *` field."""
    return ffi.cast("int64_t *", t.data_ptr())


class DsaIndexer:
    """A layer's lightning indexer (strata_dsa_indexer, native/executor/dsa.h): q_b [Hi Di, Q] and
    k [Di, D] packed (type, bytes), k_norm and k_norm_b [Di], proj [Hi, D] float32. The tensors
    are kept alive by this object."""

    def __init__(self, *, n_embd: int, q_lora: int, n_head: int, head_dim: int, top_k: int, rope_dim: int, neox: bool,
                 norm_eps: float, q_b: tuple[Any, Any], k: tuple[Any, Any], k_norm: Any, k_norm_b: Any, proj: Any):
        self.fields = {
            "n_embd": n_embd, "q_lora": q_lora, "n_head": n_head, "head_dim": head_dim, "top_k": top_k,
            "rope_dim": rope_dim, "neox": 1 if neox else 0, "norm_eps": norm_eps,
            "q_b_type": int(ggml_type(q_b[0])), "k_type": int(ggml_type(k[0])), "q_b": void_ptr(q_b[1]),
            "k": void_ptr(k[1]), "q_b_bytes": q_b[1].numel(), "k_bytes": k[1].numel(),
            "k_norm": _f32(k_norm, "indexer k_norm", head_dim), "k_norm_b": _f32(k_norm_b, "indexer k_norm bias", head_dim),
            "proj": _f32(proj, "indexer proj", n_head * n_embd)}
        self._keep = (q_b[1], k[1], k_norm, k_norm_b, proj)
        self.c = ffi.new("strata_dsa_indexer *", self.fields)
        self.top_k, self.rope_dim = top_k, rope_dim

    def scratch_bytes(self, n_seq: int) -> int:
        out = ffi.new("int64_t *")
        check(lib.strata_dsa_select_scratch_bytes(self.c, n_seq, out), f"indexer scratch for {n_seq} tokens")
        return int(out[0])

    def select(self, pool: Any, xa: Any, qa: Any, positions: Any, cos: Any, sin: Any, index_cache: Any,
               block_table: Any, impl: str = "auto") -> tuple[Any, Any]:
        """The indexer of B decode tokens (xa [B, D], qa [B, Q], positions [B], rope cos/sin
        [B, R/2]): writes their keys into index_cache [N, 1, P, Di] and returns (keep [B, K],
        n_keep [B]), each token's kept positions, ascending."""
        import torch

        B = xa.shape[0]
        c = self.c
        keep = torch.empty((B, self.top_k), dtype=torch.int64)
        n_keep = torch.empty(B, dtype=torch.int64)
        scratch = torch.empty(self.scratch_bytes(B), dtype=torch.uint8)
        half = B * (self.rope_dim // 2)
        status = lib.strata_dsa_select(
            pool.ptr, c, B, _f32(xa, "xa", B * c.n_embd), _f32(qa, "qa", B * c.q_lora), _index(positions, "positions", B),
            f32_ptr(cos, "rope cos", half) if self.rope_dim else ffi.NULL,
            f32_ptr(sin, "rope sin", half) if self.rope_dim else ffi.NULL, kv_cache_type(index_cache),
            void_ptr(index_cache), index_cache.shape[0], index_cache.shape[2],
            _index(block_table, "block_table", B, rows=True), block_table.shape[1], i64_ptr(keep), i64_ptr(n_keep),
            void_ptr(scratch), scratch.numel(), impl_code(impl))
        check(status, f"sparse attention's indexer of {B} tokens (index cache {tuple(index_cache.shape)}, "
                      f"block table {tuple(block_table.shape)})")
        return keep, n_keep


def dsa_attend(pool: Any, query: Any, cache: Any, block_table: Any, keep: Any, n_keep: Any, scale: float, out: Any,
               impl: str = "auto") -> Any:
    """Latent attention of query [B, H, L+R] (contiguous float32) over the rows of cache [N, 1, P, L+R]
    at the kept positions keep [B, K] (the first n_keep[b] of row b): out [B, H, L+R]. Returns out."""
    import torch

    B, H, row = query.shape
    K = keep.shape[1]
    need = ffi.new("int64_t *")
    check(lib.strata_dsa_attend_scratch_bytes(B, K, row, need), f"sparse attention scratch for {B} tokens")
    scratch = torch.empty(int(need[0]), dtype=torch.uint8)
    status = lib.strata_dsa_attend(
        pool.ptr, kv_cache_type(cache), _f32(query, "query", B * H * row), B, H, row, void_ptr(cache), cache.shape[0],
        cache.shape[2], _index(block_table, "block_table", B, rows=True), block_table.shape[1],
        _index(keep, "keep", B, rows=True), _index(n_keep, "n_keep", B), K, scale, _f32(out, "out", B * H * row),
        void_ptr(scratch), scratch.numel(), impl_code(impl))
    check(status, f"sparse attention of {B} tokens over cache {tuple(cache.shape)} (keep {tuple(keep.shape)})")
    return out


__all__ = ["DsaIndexer", "dsa_attend", "i64_ptr"]
