"""Grouped-query attention over a preallocated KV cache, for a batch of sequences.

H query heads share Hkv key/value heads (H % Hkv == 0). Sliding windows and attention sinks (gpt-oss) take
`attend_sinks`, in torch on every device. Laguna multiplies the output, before its projection, by
softplus of a gate projection of the layer's input, per head or per feature. QK-norm, when the model has it, is an
RMSNorm of queries and keys before RoPE, either per head over hd features (Qwen3) or over all
heads' features at once (OLMoE). New keys and values are written to the paged cache first
(Batch.write: each token's block and offset); each sequence then attends causally over its cached
prefix plus its new tokens, read through its block table (Batch.read).
Must not: allocate the cache or read files; it reads and writes the KV tensors it is given.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gguf.constants import MODEL_TENSOR as MT

from strata.errors import StrataFormatError

from .batch import Batch
from .kinds import implements, reader
from .layers import RMSNorm, Weight, linear
from .packed import PackedMatrix
from .rope import Rope
from .spec import GQA


@dataclass
class AttentionWeights:
    wq: Weight | None  # [H*hd, D]
    wk: Weight | None  # [Hkv*hd, D]
    wv: Weight | None  # [Hkv*hd, D]
    wo: Weight  # [D, H*hd]
    bq: torch.Tensor | None = None  # [H*hd]
    bk: torch.Tensor | None = None  # [Hkv*hd]
    bv: torch.Tensor | None = None  # [Hkv*hd]
    q_norm: RMSNorm | None = None  # over hd (per head) or H*hd (full width)
    k_norm: RMSNorm | None = None  # over hd (per head) or Hkv*hd (full width)
    qk_norm_per_head: bool = True
    wqkv: Weight | None = None  # [(H + 2 Hkv)*hd, D]: wq, wk, wv stacked (one product), when set;
    # [(H + Hkv)*hd, D], wq and wk only, when wv is set too (a v of another type: llama.cpp's mixes)
    bo: torch.Tensor | None = None  # [D] output projection bias (gpt-oss)
    sinks: torch.Tensor | None = None  # [H] sink logits: one more softmax column per head, then dropped (gpt-oss)
    wg: Weight | None = None  # [G, D] Laguna's output gate: G = H (one value per head) or H*hd (per feature)


@implements(GQA, "torch")
class Attention(nn.Module):
    def __init__(self, w: AttentionWeights, n_head: int, n_head_kv: int, head_dim: int, rope: Rope, layer: int,
                 window: int = 0, head_dim_v: int = 0, v_scale: float = 1.0):
        super().__init__()
        self.w, self.rope, self.layer = w, rope, layer
        self.n_head, self.n_head_kv, self.head_dim = n_head, n_head_kv, head_dim
        self.window = window  # > 0: a query at position i sees keys at positions > i - window only
        # mimo2: value heads narrower than key heads (cached padded to head_dim), values scaled
        self.head_dim_v, self.v_scale = head_dim_v or head_dim, v_scale

    @property
    def plain(self) -> bool:
        """Causal attention over every position without sinks: torch's scaled_dot_product_attention
        (else `attend_sinks`)."""
        return self.window == 0 and self.w.sinks is None

    def forward(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q, k, v = self.project(x)  # [T, H, hd], [T, Hkv, hd], [T, Hkv, hd_v]
        q, k = self.rope.apply(q, *cos_sin), self.rope.apply(k, *cos_sin)
        k_cache, v_cache = kv  # [N, Hkv, P, hd]: blocks of P positions
        batch.write(k_cache, k)
        batch.write(v_cache, self.cache_values(v))
        if not self.plain:
            out = attend_sinks(q, batch, k_cache, v_cache, self.w.sinks, self.window, self.head_dim ** -0.5)
        else:
            attend = self.attend_decode if batch.is_decode else self.attend_each
            out = attend(q, batch, k_cache, v_cache)  # [T, H*hd]
        if self.w.wg is not None:
            out = self.gate(x, out)
        return linear(self.values_out(out), self.w.wo, self.w.bo)  # [T, D]

    def cache_values(self, v: torch.Tensor) -> torch.Tensor:
        """v [T, Hkv, hd_v] as the cache holds it: padded with zeros to hd (mimo2's narrower values)."""
        return v if self.head_dim_v == self.head_dim else F.pad(v, (0, self.head_dim - self.head_dim_v))

    def values_out(self, out: torch.Tensor) -> torch.Tensor:
        """The attention's output [T, H*hd] over padded values as the output projection takes it:
        each head's first hd_v features [T, H*hd_v], times the value scale."""
        if self.head_dim_v != self.head_dim:
            out = out.view(out.shape[0], self.n_head, self.head_dim)[..., :self.head_dim_v].reshape(out.shape[0], -1)
        return out if self.v_scale == 1.0 else out * self.v_scale

    def gate(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out [T, H*hd] times softplus(x @ wg^T) [T, G] (Laguna), each gate value over H*hd/G features."""
        g = F.softplus(linear(x, self.w.wg).float()).to(out.dtype)  # [T, G]
        return (out.reshape(g.shape[0], g.shape[1], -1) * g[..., None]).flatten(1)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        w, T = self.w, x.shape[0]
        if w.wqkv is not None:  # q, k (and v, unless it has a type of its own) stacked
            hq, hkv = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
            if w.wv is None:
                hv = self.n_head_kv * self.head_dim_v
                q, k, v = linear(x, w.wqkv).split([hq, hkv, hv], dim=-1)  # [T, H*hd], [T, Hkv*hd], [T, Hkv*hd_v]
                v = _bias(v, w.bv)
            else:
                q, k = linear(x, w.wqkv).split([hq, hkv], dim=-1)
                v = linear(x, w.wv, w.bv)
            q, k = _bias(q, w.bq), _bias(k, w.bk)
        else:
            q, k, v = linear(x, w.wq, w.bq), linear(x, w.wk, w.bk), linear(x, w.wv, w.bv)  # [T, H*hd], ...
        q, k, v = q.view(T, self.n_head, -1), k.view(T, self.n_head_kv, -1), v.view(T, self.n_head_kv, -1)
        if w.q_norm is not None:
            q = w.q_norm(q) if w.qk_norm_per_head else w.q_norm(q.flatten(1)).view_as(q)
        if w.k_norm is not None:
            k = w.k_norm(k) if w.qk_norm_per_head else w.k_norm(k.flatten(1)).view_as(k)
        return q, k, v

    def attend_decode(self, q: torch.Tensor, batch: Batch, k_cache: torch.Tensor,
                      v_cache: torch.Tensor) -> torch.Tensor:
        """One new token per sequence: one batched call over the longest prefix, shorter ones masked."""
        n_ctx = max(batch.starts) + 1
        k, v = batch.read_all(k_cache, n_ctx, q.dtype), batch.read_all(v_cache, n_ctx, q.dtype)  # [B, Hkv, L, hd]
        mask = torch.arange(n_ctx, device=q.device)[None, :] <= batch.positions[:, None]  # [B, L]
        out = F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask[:, None, None, :],
                                             enable_gqa=True)  # [B, H, 1, hd]
        return out.flatten(1)  # [B, H*hd]

    def attend_each(self, q: torch.Tensor, batch: Batch, k_cache: torch.Tensor,
                    v_cache: torch.Tensor) -> torch.Tensor:
        """Sequences one at a time: queries at positions start..start+n-1 see keys 0..own position."""
        outs = []
        for b, (start, n, off) in enumerate(zip(batch.starts, batch.lengths, batch.offsets)):
            k, v = batch.read(k_cache, b, q.dtype), batch.read(v_cache, b, q.dtype)  # [Hkv, L, hd]
            q_seq = q[off:off + n].transpose(0, 1)  # [H, n, hd]
            mask = None if start == 0 else causal_mask(start, n, q.device)
            out = F.scaled_dot_product_attention(q_seq[None], k[None], v[None], attn_mask=mask,
                                                 is_causal=start == 0, enable_gqa=True)  # [1, H, n, hd]
            outs.append(out[0].transpose(0, 1).flatten(1))  # [n, H*hd]
        return torch.cat(outs) if len(outs) > 1 else outs[0]  # [T, H*hd]


def attend_sinks(q: torch.Tensor, batch: Batch, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 sinks: torch.Tensor | None, window: int, scale: float) -> torch.Tensor:
    """Causal attention, each sequence over its cache, optionally within a sliding window and with a
    sink logit per head joining the softmax (gpt-oss): softmax over [scores | sink], sink dropped."""
    outs, H = [], q.shape[1]
    for b, (start, n, off) in enumerate(zip(batch.starts, batch.lengths, batch.offsets)):
        k, v = batch.read(k_cache, b, q.dtype), batch.read(v_cache, b, q.dtype)  # [Hkv, L, hd]
        k, v = k.repeat_interleave(H // k.shape[0], dim=0), v.repeat_interleave(H // v.shape[0], dim=0)  # [H, L, hd]
        for i, j in query_pieces(start, n, H):  # queries start+i .. start+j-1 see keys 0 .. start+j-1
            L = start + j
            scores = (q[off + i:off + j].transpose(0, 1).float() @ k[:, :L].float().transpose(1, 2)) * scale
            rows = torch.arange(start + i, L, device=q.device)[:, None]  # [m, 1]
            cols = torch.arange(L, device=q.device)[None, :]  # [1, L]
            keep = (cols <= rows) & ((cols > rows - window) if window > 0 else True)  # [m, L]
            scores = scores.masked_fill(~keep, float("-inf"))  # [H, m, L]
            if sinks is not None:
                scores = torch.cat((scores, sinks.float()[:, None, None].expand(H, j - i, 1)), dim=-1)  # [H, m, L+1]
            probs = scores.softmax(dim=-1)[..., :L]  # [H, m, L]
            outs.append((probs.to(v.dtype) @ v[:, :L]).transpose(0, 1).flatten(1))  # [m, H*hd]
    return torch.cat(outs) if len(outs) > 1 else outs[0]  # [T, H*hd]


#: Score elements (heads x queries x keys) one prefill attention call that forms its scores
#: (`attend_sinks`, latent attention's unequal key and value widths) holds at once: 64 Mi floats,
#: 256 MB. A longer step's queries go in pieces; each query's softmax is its own, so the pieces'
#: outputs stack to the whole's.
SCORE_ELEMENTS = 1 << 26


def read_gqa_weights(w, arch, hp, spec) -> AttentionWeights:
    """A grouped-query layer's weights (`w`: strata.models.loader.WeightReader): q, k, v, o, the
    biases and q/k norms the architecture has, o's bias and sinks (gpt-oss; mimo2: where the layer
    has them), the output gate (Laguna), q, k and v stacked. Query and kv heads and the value width
    are the layer's (its spec)."""
    a = spec.attention
    D, H, Hkv, hd, i = hp.n_embd, a.n_head or hp.n_head, a.n_head_kv or hp.n_head_kv, hp.head_dim, spec.index
    hv = a.head_dim_v or hd
    if hv > hd:  # the cache pads narrower values to hd; wider ones would need wider key rows
        raise StrataFormatError(f"{w.mf.path}: attention.value_length {hv} is wider than key_length {hd} "
                                f"(grouped-query attention with wider values is not supported)")
    get = w.get if arch.attn_bias else w.opt  # biases are required where the architecture has them
    weights = AttentionWeights(
        wq=w.matrix(MT.ATTN_Q, i, (H * hd, D)), wk=w.matrix(MT.ATTN_K, i, (Hkv * hd, D)),
        wv=w.matrix(MT.ATTN_V, i, (Hkv * hv, D)), wo=w.matrix(MT.ATTN_OUT, i, (D, H * hv)),
        bq=get(MT.ATTN_Q, i, (H * hd,), "bias"), bk=get(MT.ATTN_K, i, (Hkv * hd,), "bias"),
        bv=get(MT.ATTN_V, i, (Hkv * hv,), "bias"))
    if arch.qk_norm and (not arch.qk_norm_optional or w.has(MT.ATTN_Q_NORM, i)):
        per_head = arch.qk_norm == "head"
        weights.q_norm = w.norm(MT.ATTN_Q_NORM, i, (hd,) if per_head else (H * hd,))
        weights.k_norm = w.norm(MT.ATTN_K_NORM, i, (hd,) if per_head else (Hkv * hd,))
        weights.qk_norm_per_head = per_head
    stack_qkv(w, spec, weights)
    if arch.attn_out_bias:
        weights.bo = w.get(MT.ATTN_OUT, i, (D,), "bias")
    if a.sinks:
        weights.sinks = w.get(MT.ATTN_SINKS, i, (H,))
    if a.out_gate:
        weights.wg = w.matrix(MT.ATTN_GATE, i, (H if a.out_gate == "head" else H * hd, D))
    return weights


@reader(GQA)
def read_gqa(cls, w, arch, hp, spec, rope: Rope) -> Attention:
    """Layer spec.index's grouped-query attention (sliding window, sinks) as `cls`."""
    weights, a = read_gqa_weights(w, arch, hp, spec), spec.attention
    return cls(weights, a.n_head, a.n_head_kv, hp.head_dim, rope, spec.index, a.window, a.head_dim_v, a.v_scale)


def stack_qkv(w, spec, weights: AttentionWeights) -> None:
    """Packed q, k and v stacked by rows into one product (wqkv) where q and k share a type (the
    spec's `stacked`); where v has a type of its own (llama.cpp's Q4_K_M, IQ4_XS, ... mixes give
    attn_v more bits), q and k alone, v kept apart."""
    q, k, v = weights.wq, weights.wk, weights.wv
    if w.compute is None or not spec.attention.stacked:
        return
    if v.type == q.type:
        weights.wqkv, weights.wq, weights.wk, weights.wv = PackedMatrix.concat([q, k, v]), None, None, None
    else:
        weights.wqkv, weights.wq, weights.wk = PackedMatrix.concat([q, k]), None, None


def query_pieces(start: int, n: int, heads: int, budget: int | None = None) -> list[tuple[int, int]]:
    """Ranges [i, j) of a sequence's n new queries (positions start + i ...) whose scores over
    the keys they see (start + j of them) stay within `budget` elements, one row at least."""
    rows = max(1, (budget or SCORE_ELEMENTS) // (heads * (start + n)))
    return [(i, min(i + rows, n)) for i in range(0, n, rows)]


def _bias(y: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return y if b is None else y + b


def causal_mask(start: int, n: int, device: torch.device) -> torch.Tensor:
    rows = torch.arange(start, start + n, device=device)[:, None]  # [n, 1]
    return torch.arange(start + n, device=device)[None, :] <= rows  # [n, L]


__all__ = ["Attention", "AttentionWeights", "SCORE_ELEMENTS", "attend_sinks", "causal_mask", "query_pieces", "read_gqa",
           "read_gqa_weights", "stack_qkv"]
