"""The native executor of the attention kinds GQA (sliding windows, sinks), gated (qwen3next's
full-attention layers) and chunked (Llama 4): packed compute on the CPU, float32, any number of
tokens.

Per call (prefill chunks, and decode where the plan runs no fused step): the projections from the
packed blocks, rope, norms, cache writes and decode attention as native glue calls; prefill
attention through the torch reference's own functions. A decode step fused (`decode_layer`): the
layer's attention half, the FFN's norm and the router in one native call (`native.DecodeAttn`),
the same native functions in the same order, so both give the same bytes.
Must not: allocate the cache or read files.
"""
from __future__ import annotations

import torch

from strata import native

from .. import chunked
from ..attention import Attention, attend_sinks
from ..batch import Batch
from ..chunked import ChunkedAttention, query_temperature
from ..deltanet import GatedAttention
from ..kinds import implements
from ..layers import linear
from ..spec import CHUNKED, GATED, GQA


def f32(t: torch.Tensor | None) -> torch.Tensor | None:
    """A contiguous float32 copy for a native call (None stays None)."""
    return None if t is None else t.detach().float().contiguous()


def _stacked_bias(att: Attention) -> torch.Tensor | None:
    """q, k and v biases as one vector over the stacked product (zeros where one has none)."""
    w = att.w
    if w.bq is None and w.bk is None and w.bv is None:
        return None
    hq, hkv, hv = att.n_head * att.head_dim, att.n_head_kv * att.head_dim, att.n_head_kv * att.head_dim_v
    return torch.cat([b if b is not None else torch.zeros(n)
                      for b, n in ((w.bq, hq), (w.bk, hkv), (w.bv, hv))]).float().contiguous()


def _decode_attn(att: Attention, common: dict, **extra) -> native.DecodeAttn:
    """The native decode step of a (stacked, packed) GQA-family layer; `common`: the block's norms
    and router arguments, `extra`: what the kind adds."""
    w = att.w
    return native.DecodeAttn(
        **common, n_embd=w.wo.shape[0], n_head=att.n_head, neox=att.rope.neox, o=(w.wo.type, w.wo._data_t),
        n_head_kv=att.n_head_kv, head_dim=att.head_dim, attn_scale=att.head_dim ** -0.5,
        qkv=(w.wqkv.type, w.wqkv._data_t), bqkv=_stacked_bias(att), v=None if w.wv is None else (w.wv.type, w.wv._data_t),
        q_norm=None if w.q_norm is None else w.q_norm.weight, k_norm=None if w.k_norm is None else w.k_norm.weight,
        qk_norm_per_head=w.qk_norm_per_head, sinks=f32(w.sinks), window=att.window, bo=f32(w.bo), **extra)


def _rope_in_place(att: Attention, q: torch.Tensor, k: torch.Tensor, cos_sin) -> None:
    native.rope(q, *cos_sin, att.rope.rope_dim, att.rope.neox)
    native.rope(k, *cos_sin, att.rope.rope_dim, att.rope.neox)


@implements(GQA, "native")
class NativeAttention(Attention):
    """GQA: rope in place, cache writes, decode attention (sinks and a window too) and the output
    gate (Laguna) each one native call; prefill attends through torch."""

    def forward(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q, k, v = self.project(x)  # [T, H, hd], [T, Hkv, hd], [T, Hkv, hd_v]: views of one product
        _rope_in_place(self, q, k, cos_sin)
        k_cache, v_cache = kv  # [N, Hkv, P, hd]: a block is a "slot" of P positions to kv_write
        native.kv_write(k, self.cache_values(v), k_cache, v_cache, batch.token_blocks, batch.token_offsets)
        if batch.is_decode:
            out = torch.empty((q.shape[0], self.n_head * self.head_dim), dtype=torch.float32)  # [B, H*hd]
            native.attn_decode(q, k_cache, v_cache, batch.block_table, batch.positions + 1, self.head_dim ** -0.5, out,
                               sinks=self.w.sinks, window=self.window)
        elif self.plain:
            out = self.attend_each(q, batch, k_cache, v_cache)  # [T, H*hd]
        else:
            out = attend_sinks(q, batch, k_cache, v_cache, self.w.sinks, self.window, self.head_dim ** -0.5)
        if self.w.wg is not None:  # Laguna's output gate
            out = native.gate_softplus(out.contiguous(), linear(x, self.w.wg))
        return linear(self.values_out(out), self.w.wo, self.w.bo)  # [T, D]

    def decode_layer(self, common: dict) -> native.DecodeAttn:
        wg, narrow = self.w.wg, self.head_dim_v if self.head_dim_v != self.head_dim else 0
        return _decode_attn(self, common, rope_dim=self.rope.rope_dim, head_dim_v=narrow, v_scale=self.v_scale,
                            out_gate=None if wg is None else (wg.type, wg._data_t, wg.shape[0]))


@implements(GATED, "native")
class NativeGatedAttention(GatedAttention):
    """Gated attention: rope, cache writes, decode attention and the output gate in native calls."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, batch: Batch, cos_sin,
               kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        T, H, hd = q.shape[0], self.n_head, self.head_dim
        k = k.contiguous()
        _rope_in_place(self, q, k, cos_sin)
        k_cache, v_cache = kv
        native.kv_write(k, v, k_cache, v_cache, batch.token_blocks, batch.token_offsets)
        if batch.is_decode:
            out = native.attn_decode(q, k_cache, v_cache, batch.block_table, batch.positions + 1, hd ** -0.5,
                                     torch.empty((T, H * hd), dtype=torch.float32))
        else:
            out = self.attend_each(q, batch, k_cache, v_cache)  # [T, H*hd]
        return native.attn_gate(out, gate.reshape(T, H * hd).contiguous())  # [T, H*hd]

    def decode_layer(self, common: dict) -> native.DecodeAttn:
        return _decode_attn(self, common, rope_dim=self.rope.rope_dim, q_gate=True)


@implements(CHUNKED, "native")
class NativeChunkedAttention(ChunkedAttention):
    """Llama 4's attention: rope and the L2 norm (local layers) or the query temperature (global
    ones) in place, cache writes and decode attention in native calls."""

    def forward(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q, k, v = self.project(x)  # [T, H, hd], [T, Hkv, hd], [T, Hkv, hd]: views of one product
        k_cache, v_cache = kv
        if not self.nope:
            _rope_in_place(self, q, k, cos_sin)
            if self.l2_eps is not None:
                native.rmsnorm(q, None, self.l2_eps, q)
                native.rmsnorm(k, None, self.l2_eps, k)
        elif self.temperature is not None:
            q.mul_(query_temperature(batch.positions, *self.temperature)[:, None, None])
        native.kv_write(k, v, k_cache, v_cache, batch.token_blocks, batch.token_offsets)
        if batch.is_decode:  # a global layer over every position, a local one within its own chunk
            out = native.attn_decode(q.float(), k_cache, v_cache, batch.block_table, batch.positions + 1,
                                     self.head_dim ** -0.5, torch.empty((q.shape[0], self.n_head * self.head_dim)),
                                     chunk=self.chunk)
        else:
            out = chunked.attend_chunked(q, batch, k_cache, v_cache, self.chunk)
        return linear(out, self.w.wo, self.w.bo)  # [T, D]

    def decode_layer(self, common: dict) -> native.DecodeAttn:
        return _decode_attn(self, common, rope_dim=0 if self.nope else self.rope.rope_dim, chunk=self.chunk,
                            qk_l2_eps=None if self.nope else self.l2_eps, temperature=self.temperature)


__all__ = ["NativeAttention", "NativeChunkedAttention", "NativeGatedAttention", "f32"]
