"""The native executor of latent attention (DeepSeek-V2/V3, GGUF `deepseek2`): packed compute on
the CPU, float32, any number of tokens. Per call: the projections and each head's k_b / v_b
product from packed blocks (one native call over every head), the norms and RoPE as native calls
(the fused step's, so both give the same bytes), decode attention over the latent
rows in one native call, prefill attention through the torch reference's `latent_attend`; a decode
step fused (`decode_layer`): the attention half, the FFN's norm and the router in one native call
(`native.DecodeAttn` with its latent fields).
Must not: allocate the cache or read files.
"""
from __future__ import annotations

import torch

from strata import native

from ..batch import Batch
from ..kinds import implements
from ..layers import Weight
from ..mla import MLAttention
from ..spec import MLA
from .attention import f32


@implements(MLA, "native")
class NativeMLAttention(MLAttention):
    """Latent attention through the native calls. latent_split (the layer spec's): k_b and v_b
    are packed per-head matrices; an older converter's kv_b leaves them float (torch's products)."""

    def attend(self, query: torch.Tensor, batch: Batch, cache: torch.Tensor) -> torch.Tensor:
        if not batch.is_decode:
            return super().attend(query, batch, cache)
        # Latent rows [c | k_rope] serve as keys and values (one kv head of L+R features): the
        # weighted sum over whole rows carries c's in its first L features, the rest is dropped.
        T, H, L = query.shape[0], self.n_head, self.kv_lora
        full = torch.empty((T, H * (L + self.rope_dim)), dtype=torch.float32)
        native.attn_decode(query.float(), cache, cache, batch.block_table, batch.positions + 1, self.scale, full)
        return full.view(T, H, L + self.rope_dim)[..., :L]  # [T, H, L]

    def turn(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """RoPE in one native call (as the fused step turns them), on a packed copy of x [T, H, R]."""
        cos, sin = (t.float().contiguous() for t in cos_sin)
        return native.rope(torch.empty(x.shape, dtype=torch.float32).copy_(x), cos, sin, self.rope.rope_dim,
                           self.rope.neox)

    def heads(self, m: Weight, x: torch.Tensor, n_rows: int) -> torch.Tensor:
        """Packed m [H*n_rows, K] (a head's rows after another's): one native call over every head,
        in chunks of the compute's token budget."""
        if not self.latent_split:
            return super().heads(m, x, n_rows)
        T, H, K = x.shape
        x = x if x.dtype == torch.float32 and x.stride(2) == 1 else x.float().contiguous()
        y = torch.empty((T, H, n_rows), dtype=torch.float32)
        c = m.compute
        for t0 in range(0, T, c.max_tokens):
            t1 = t0 + c.max_tokens
            native.matmul_heads(c.pool, m.type, m._data_t, H, n_rows, K, x[t0:t1], y[t0:t1], c.scratch)
        return y

    def decode_layer(self, common: dict) -> native.DecodeAttn:
        """The layer's native decode step (`common`: the block's norms and router arguments)."""
        return native.DecodeAttn(**self.decode_args(common))

    def decode_args(self, common: dict) -> dict:
        """`native.DecodeAttn`'s arguments for this layer."""
        w = self.w
        wq = w.wq if w.wq is not None else w.wq_b
        return dict(
            **common, n_embd=w.wo.shape[0], n_head=self.n_head, rope_dim=self.rope.rope_dim, neox=self.rope.neox,
            o=(w.wo.type, w.wo._data_t), n_head_kv=1, head_dim=self.nope + self.rope_dim, attn_scale=self.scale,
            qkv=(wq.type, wq._data_t), mla=dict(
                kv_lora=self.kv_lora, q_lora=0 if w.wq_a is None else w.wq_a.shape[0], nope=self.nope,
                v_dim=self.v_dim, wkv_a=(w.wkv_a.type, w.wkv_a._data_t),
                wq_a=None if w.wq_a is None else (w.wq_a.type, w.wq_a._data_t),
                q_a_norm=None if w.q_a_norm is None else f32(w.q_a_norm.weight), kv_a_norm=f32(w.kv_a_norm.weight),
                k_b=(w.k_b.type, w.k_b._data_t), v_b=(w.v_b.type, w.v_b._data_t)))


__all__ = ["NativeMLAttention"]
