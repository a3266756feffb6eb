"""The native executor of sparse latent attention (DeepSeek-V3.2 `deepseek32`, GLM-5 `glm-dsa`):
packed compute on the CPU, float32, any number of tokens. Latent attention's native calls
(strata.models.executor.mla: the projections, each head's k_b / v_b product) with the indexer's
products packed too. Per call: prefill's indexer, its top-k and its attention over the kept
positions through the torch reference's functions; a decode batch's indexer (scores and top-k,
`native.DsaIndexer`) and its attention over the kept rows (`native.dsa_attend`) as native calls.
A decode step fused (`decode_layer`): the attention half, the FFN's norm and the router in one
native call (`DecodeDSA`, this kind's binding of native/executor/dsa.c), the same functions, so
both give the same bytes. GLM-5's shared layers read the choice of the full layer before them:
per call through `Batch.scratch`, fused through the full layer's buffers (`Kept`).
Must not: allocate the cache or read files.
"""
from __future__ import annotations

import functools
import weakref

import torch

from strata import native

from ..batch import Batch
from ..dsa import KEPT, DSAttention
from ..kinds import implements
from ..spec import DSA
from .attention import f32
from .mla import NativeMLAttention


@implements(DSA, "native")
class NativeDSAttention(DSAttention, NativeMLAttention):
    """Sparse latent attention through native calls (see the module docstring)."""

    #: the full layer whose decode step was built last: a shared layer's step, built after it in
    #: the same model (steps are built in layer order), reads its choice (`kept`)
    _last_full: weakref.ref | None = None

    @functools.cached_property
    def kept(self) -> Kept:
        """Where a full layer's decode steps leave their choice for the shared layers' steps."""
        return Kept(self.top_k)

    @functools.cached_property
    def indexer(self) -> native.DsaIndexer | None:
        """The layer's indexer as the native calls take it (None on a shared layer)."""
        idx = self.idx
        if idx is None:
            return None
        return native.DsaIndexer(
            n_embd=idx.k.shape[1], q_lora=idx.q_b.shape[1], n_head=self.n_index_head, head_dim=idx.k_norm.shape[0],
            top_k=self.top_k, rope_dim=self.index_rope.rope_dim, neox=self.index_rope.neox, norm_eps=self.norm_eps,
            q_b=(idx.q_b.type, idx.q_b._data_t), k=(idx.k.type, idx.k._data_t), k_norm=f32(idx.k_norm),
            k_norm_b=f32(idx.k_norm_b), proj=f32(idx.proj))

    def forward(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if not batch.is_decode:
            return super().forward(x, batch, cos_sin, kv)
        q_low = self.query_latent(x)  # [B, Q]
        if self.idx is not None:  # (keep [B, K], n_keep [B]): the kept positions of each token
            cos, sin = (t.float().contiguous() for t in cos_sin)
            batch.scratch[KEPT] = self.indexer.select(self.w.wo.compute.pool, f32(x), f32(q_low), batch.positions, cos,
                                                      sin, kv[1], batch.block_table)
        elif KEPT not in batch.scratch:
            raise RuntimeError(f"layer {self.layer}: a shared indexer layer ran before any full one in this pass")
        return self.latent(x, q_low, batch, cos_sin, kv[0], batch.scratch[KEPT])  # [B, D]

    def attend_kept(self, query: torch.Tensor, batch: Batch, cache: torch.Tensor, keep) -> torch.Tensor:
        if not batch.is_decode:
            return super().attend_kept(query, batch, cache, keep)
        T, H, row = query.shape
        out = torch.empty((T, H, row), dtype=torch.float32)
        native.dsa_attend(self.w.wo.compute.pool, f32(query), cache, batch.block_table, *keep, self.scale, out)
        return out[..., :self.kv_lora]  # [T, H, L]

    def decode_layer(self, common: dict) -> DecodeDSA:
        """The layer's native decode step (`common`: the block's norms and router arguments)."""
        full = self
        if self.idx is None:
            full = NativeDSAttention._last_full() if NativeDSAttention._last_full is not None else None
            if full is None or full.layer >= self.layer or full.w.wo.compute is not self.w.wo.compute:
                raise ValueError(f"layer {self.layer}: a shared indexer layer's decode step is built after its full "
                                 f"layer's, in the same model")
        else:
            NativeDSAttention._last_full = weakref.ref(self)
        return DecodeDSA(self, common, full.kept)


class Kept:
    """The positions a full layer's decode step keeps, keep [rows, K] and n_keep [rows] (int64),
    pointed at by its step's struct and by those of the shared layers that read them; grown (and
    pointed at again) by `grow`."""

    def __init__(self, top_k: int):
        self.top_k, self.rows, self.structs = top_k, 0, []
        self.grow(1)

    def attach(self, whole) -> None:
        self.structs.append(whole)
        self._point(whole)

    def grow(self, rows: int) -> None:
        if rows <= self.rows:
            return
        self.keep = torch.zeros((rows, self.top_k), dtype=torch.int64)
        self.n_keep = torch.zeros(rows, dtype=torch.int64)
        self.rows = rows
        for whole in self.structs:
            self._point(whole)

    def _point(self, whole) -> None:
        whole.keep, whole.n_keep = native.i64_ptr(self.keep), native.i64_ptr(self.n_keep)
        whole.keep_rows = self.rows


class DecodeDSA(native.DecodeAttn):
    """A sparse latent attention layer's decode half (and its router), described once
    (strata_dsa_layer, native/executor/dsa.h): latent attention's fields (`DecodeAttn`'s, in
    `c`), the layer's indexer (`whole.idx`; a shared layer's holds top_k alone) and the buffers of
    the choice (`kept`: a full layer's own, which its shared layers' steps read). The cache: the
    latent rows and the indexer's keys (the layer's value slot)."""

    STRUCT, STEP, NEST = "strata_dsa_layer", "strata_decode_dsa", "attn"
    what = "sparse attention decode step"

    def __init__(self, layer: NativeDSAttention, common: dict, kept: Kept):
        super().__init__(**layer.decode_args(common))
        ix = layer.indexer
        self.index_dim = None if ix is None else int(ix.c.head_dim)  # a shared layer reads no keys
        if ix is not None:
            self.whole.idx, self._indexer = ix.c[0], ix
        else:
            self.whole.idx.top_k = layer.top_k
        self.kept = kept
        kept.attach(self.whole)

    def scratch_bytes(self, n_seq: int) -> int:
        self.kept.grow(n_seq)  # the decode program and the fused step size their buffers here
        return super().scratch_bytes(n_seq)

    def bind_cache(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        """Point at the layer's latent rows k_cache [N, 1, P, L+R] and the indexer's keys v_cache
        [N, 1, P, Di] (the same type)."""
        if (k_cache.data_ptr(), v_cache.data_ptr()) == self._bound:
            return
        super().bind_cache(k_cache, k_cache)
        row = v_cache.shape[-1] if self.index_dim is None else (
            native.kv_row_bytes(native.kv_cache_type(v_cache), self.index_dim) // v_cache.element_size())
        want = (k_cache.shape[0], 1, k_cache.shape[2], row)
        if tuple(v_cache.shape) != want or v_cache.dtype != k_cache.dtype or not v_cache.is_contiguous():
            raise ValueError(f"{self.what}: the indexer's key cache {tuple(v_cache.shape)} ({v_cache.dtype}) must be "
                             f"a contiguous {k_cache.dtype} tensor {list(want)}")
        self.c.v_cache = native.void_ptr(v_cache)
        self._keep_cache, self._bound = (k_cache, v_cache), (k_cache.data_ptr(), v_cache.data_ptr())

    bind = bind_cache


__all__ = ["DecodeDSA", "Kept", "NativeDSAttention"]
