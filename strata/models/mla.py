"""Multi-head latent attention (DeepSeek-V2/V3, GGUF `deepseek2`) in its latent ("absorbed") form.

Per token: a query per head q = [q_nope | q_rope] (from x, or through the query LoRA
q_b(norm(q_a x))), and one compressed latent c = norm(kv_a x)[:kv_lora] plus one shared rope key
k_rope = rope(kv_a x)[kv_lora:]. The cache keeps only [c | k_rope] per position (kv_lora + rope
values, one "head"), never per-head keys and values. Attention runs in the latent space, as
llama.cpp's deepseek2 graph does:

    q_lat[h] = k_b[h] @ q_nope[h]                       # [kv_lora]; k_b [H, kv_lora, nope]
    score[h, t] = ([q_lat[h] | q_rope[h]] . [c_t | k_rope_t]) * scale
    o_lat[h] = softmax(score[h]) @ c                    # [kv_lora]
    out = wo @ concat_h(v_b[h] @ o_lat[h])              # v_b [H, v, kv_lora]

which is the same function as expanding keys and values with kv_b (transformers' form).
scale = 1/sqrt(nope + rope), times mscale^2 under YaRN (mscale = 1 + yarn_log_multiplier * ln factor).
Dimension letters: T tokens, H heads, L latent rank (kv_lora), R rope dims, N nope dims, V value dims.
Must not: allocate the cache or read files.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from gguf.constants import MODEL_TENSOR as MT

from .attention import causal_mask, query_pieces
from .batch import Batch
from .kinds import implements, reader
from .layers import RMSNorm, Weight, linear
from .rope import Rope
from .spec import MLA


@dataclass
class MLAWeights:
    wq: Weight | None  # [H*(N+R), D] without query LoRA
    wq_a: Weight | None  # [Q, D] query LoRA down-projection
    q_a_norm: RMSNorm | None  # over Q
    wq_b: Weight | None  # [H*(N+R), Q]
    wkv_a: Weight  # [L+R, D]
    kv_a_norm: RMSNorm  # over L
    k_b: Weight | None  # [H, L, N]; packed compute: PackedMatrix [H*L, N], a head's rows after another's
    v_b: Weight | None  # [H, V, L]; packed compute: PackedMatrix [H*V, L]
    wo: Weight  # [D, H*V]


def mla_scale(key_dim: int, hp) -> float:
    """The attention scale of llama.cpp's deepseek2 graph: 1/sqrt(N+R), times mscale^2 with YaRN and
    DeepSeek's mscale_all_dim (yarn_log_multiplier = 0.1 * it): mscale = attn_factor *
    (1 + yarn_log_multiplier * ln factor), transformers' yarn_get_mscale(factor, mscale_all_dim)."""
    scale = key_dim ** -0.5
    s = hp.rope_scaling
    if s.type == "yarn" and s.factor > 1.0 and s.yarn_log_multiplier:
        attn_factor = s.attn_factor if s.attn_factor is not None else 1.0
        mscale = attn_factor * (1.0 + s.yarn_log_multiplier * math.log(s.factor))
        scale *= mscale * mscale
    return scale


def temperature(scale: float, length: int, positions: torch.Tensor) -> torch.Tensor:
    """Per-token query temperature [T] of deepseek2 files that declare one (Mistral-Large-3; llama.cpp's
    attention.temperature_scale / _length): 1 + scale * ln(floor(pos / length) + 1)."""
    steps = torch.floor(positions.double() / length) + 1.0
    return (torch.log(steps) * scale + 1.0).float()


@implements(MLA, "torch")
class MLAttention(nn.Module):
    """Latent attention (see the module docstring), the torch reference (the native executor:
    strata.models.executor.mla)."""

    def __init__(self, w: MLAWeights, n_head: int, nope: int, rope_dim: int, v_dim: int, rope: Rope, scale: float,
                 layer: int, temperature: tuple[float, int] | None = None, latent_split: bool = True):
        super().__init__()
        self.latent_split = latent_split  # k_b and v_b from the file (the spec's), not from an older kv_b
        self.w, self.rope, self.layer, self.scale = w, rope, layer, scale
        self.temperature = temperature  # (scale, length) of a per-position query temperature, or None
        self.n_head, self.nope, self.rope_dim, self.v_dim = n_head, nope, rope_dim, v_dim
        self.kv_lora = w.kv_a_norm.weight.shape[0]

    def forward(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.latent(x, self.query_latent(x), batch, cos_sin, kv[0])  # [T, D]

    def query_latent(self, x: torch.Tensor) -> torch.Tensor | None:
        """The query LoRA's normed latent norm(q_a x) [T, Q], None without a query LoRA."""
        w = self.w
        return None if w.wq is not None else w.q_a_norm(linear(x, w.wq_a))

    def latent(self, x: torch.Tensor, q_low: torch.Tensor | None, batch: Batch,
               cos_sin: tuple[torch.Tensor, torch.Tensor], cache: torch.Tensor,
               keep: torch.Tensor | None = None) -> torch.Tensor:
        """The attention of x [T, D] (q_low: `query_latent(x)`) over `cache` [N, 1, P, L+R], which it
        writes; keep [T, K]: the positions each token attends to (sparse attention), None: all."""
        w, T, H, L = self.w, x.shape[0], self.n_head, self.kv_lora
        q = linear(x, w.wq) if q_low is None else linear(q_low, w.wq_b)
        q = q.view(T, H, self.nope + self.rope_dim)
        q_nope, q_rope = q[..., :self.nope], self.turn(q[..., self.nope:], cos_sin)  # [T, H, N], [T, H, R]
        ckv = linear(x, w.wkv_a)  # [T, L+R]
        c = w.kv_a_norm(ckv[:, :L])  # [T, L]
        k_rope = self.turn(ckv[:, None, L:], cos_sin)[:, 0]  # [T, R]
        # cache [N, 1, P, L+R]: the latent and the rope key of every position, in blocks of P
        batch.write(cache, torch.cat((c, k_rope), dim=-1)[:, None])
        q_lat = self.heads(w.k_b, q_nope, L)  # [T, H, L]
        query = torch.cat((q_lat, q_rope), dim=-1)  # [T, H, L+R]
        if self.temperature is not None:
            query = query * temperature(*self.temperature, batch.positions).to(query)[:, None, None]
        o_lat = self.attend(query, batch, cache) if keep is None else self.attend_kept(query, batch, cache, keep)
        out = self.heads(w.v_b, o_lat, self.v_dim)  # [T, H, V]
        return linear(out.flatten(1), w.wo)  # [T, D]

    def turn(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [T, H, R] (rope features) turned by RoPE."""
        return self.rope.apply(x, *cos_sin)

    def attend(self, query: torch.Tensor, batch: Batch, cache: torch.Tensor) -> torch.Tensor:
        """The latent attention of query [T, H, L+R] over the cache: [T, H, L]."""
        return latent_attend(query, batch, cache, self.kv_lora, self.scale)

    def attend_kept(self, query: torch.Tensor, batch: Batch, cache: torch.Tensor, keep) -> torch.Tensor:
        """The latent attention of query [T, H, L+R] over the positions `keep` [T, K]: [T, H, L]."""
        return latent_attend(query, batch, cache, self.kv_lora, self.scale, keep)

    def heads(self, m: Weight, x: torch.Tensor, n_rows: int) -> torch.Tensor:
        """[T, H, n_rows]: head h's matrix m[h] [n_rows, K] times x[:, h] for every head of x [T, H, K]."""
        return torch.bmm(m, x.permute(1, 2, 0)).permute(2, 0, 1)  # [H, n_rows, T] -> [T, H, n_rows]


def latent_attend(query: torch.Tensor, batch: Batch, cache: torch.Tensor, L: int, scale: float,
                  keep: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of query [T, H, L+R] over each sequence's cached [c | k_rope], values c;
    keep [T, K] (sparse attention): each token attends only to those of its sequence's positions.

    One latent row serves every head as key and value, so a piece of queries is two matrix
    products: every head's query of every token against the keys at once ([m H, L+R] @ [L+R, Lk]),
    and the probabilities against c. (torch's scaled_dot_product_attention with one kv head for 16
    took its math path for the unequal key and value widths and expanded the keys to every head
    first: the DeepSeek-shaped file's 64-token prefill spent 0.99 ms per token in attention with it,
    0.88 with this; `benchmarks/RESULTS.md`.)"""
    outs, H = [], query.shape[1]
    for b, (start, n, off) in enumerate(zip(batch.starts, batch.lengths, batch.offsets)):
        keys = batch.read(cache, b, query.dtype)[0]  # [Lk, L+R]
        # long steps go in pieces of queries (the scores of a piece stay within SCORE_ELEMENTS)
        for i, j in query_pieces(start, n, H):
            m, seen = j - i, start + j
            k = keys[:seen].float()  # [seen, L+R]
            q = query[off + i:off + j].float().reshape(m * H, -1)  # [m H, L+R]: token-major, heads inside
            scores = (q @ k.T).mul_(scale).view(m, H, seen)
            mask = causal_mask(start + i, m, q.device)  # [m, seen]
            if keep is not None:
                mask &= torch.zeros_like(mask).scatter_(1, keep[off + i:off + j], True)
            scores = scores.masked_fill_(~mask[:, None, :], float("-inf"))
            probs = scores.softmax(dim=-1).view(m * H, seen)
            outs.append((probs @ k[:, :L]).view(m, H, L).to(query.dtype))  # [m, H, L]
    return torch.cat(outs) if len(outs) > 1 else outs[0]



def read_mla_weights(w, hp, spec) -> tuple[MLAWeights, tuple]:
    """Layer spec.index's latent attention weights: the query (with or without its LoRA), the
    latent's projection and norm, k_b and v_b (split from an older converter's kv_b), o; and the
    class's arguments after them (n_head, nope, rope_dim, v_dim)."""
    D, H, L, R, i = hp.n_embd, hp.n_head, hp.kv_lora_rank, hp.rope_dim, spec.index
    key_dim = hp.head_dim_mla or hp.head_dim  # nope + rope (older files: key_length itself)
    N, V = key_dim - R, hp.head_dim_v_mla or hp.head_dim_v
    Q = hp.q_lora_rank
    weights = MLAWeights(
        wq=None if Q else w.matrix(MT.ATTN_Q, i, (H * key_dim, D)),
        wq_a=w.matrix(MT.ATTN_Q_A, i, (Q, D)) if Q else None,
        q_a_norm=w.norm(MT.ATTN_Q_A_NORM, i, (Q,)) if Q else None,
        wq_b=w.matrix(MT.ATTN_Q_B, i, (H * key_dim, Q)) if Q else None,
        wkv_a=w.matrix(MT.ATTN_KV_A_MQA, i, (L + R, D)), kv_a_norm=w.norm(MT.ATTN_KV_A_NORM, i, (L,)),
        k_b=None, v_b=None, wo=w.matrix(MT.ATTN_OUT, i, (D, H * V)))
    if spec.attention.latent_split:
        weights.k_b, weights.v_b = w.matrix(MT.ATTN_K_B, i, (H, L, N)), w.matrix(MT.ATTN_V_B, i, (H, V, L))
    else:  # files from older converters keep kv_b [H*(N+V), L]: split it as today's converter does
        kv_b = w.get(MT.ATTN_KV_B, i, (H * (N + V), L)).view(H, N + V, L)
        weights.k_b, weights.v_b = kv_b[:, :N].transpose(1, 2).contiguous(), kv_b[:, N:].contiguous()
    return weights, (H, N, R, V)


def mla_options(hp, spec) -> dict:
    """The class's keyword arguments after rope: scale, layer, temperature, latent_split."""
    key_dim = hp.head_dim_mla or hp.head_dim
    temp = (hp.attn_temperature_scale, hp.attn_temperature_length) if hp.attn_temperature_scale else None
    return dict(scale=mla_scale(key_dim, hp), layer=spec.index, temperature=temp, latent_split=spec.attention.latent_split)


@reader(MLA)
def read_mla(cls, w, arch, hp, spec, rope: Rope) -> MLAttention:
    """Layer spec.index's latent attention as `cls` (either implementation)."""
    weights, dims = read_mla_weights(w, hp, spec)
    return cls(weights, *dims, rope=rope, **mla_options(hp, spec))


__all__ = ["MLAWeights", "MLAttention", "latent_attend", "mla_options", "mla_scale", "read_mla", "read_mla_weights",
           "temperature"]
