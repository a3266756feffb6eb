"""Qwen3-Next's hybrid attention (`Arch.gated_deltanet`), the torch reference (the native executor:
strata.models.executor.deltanet and .attention's NativeGatedAttention).

GatedDeltaNet, a linear-attention layer with a fixed-size state per sequence instead of a KV cache:
    [q | k | v] = silu(causal depthwise conv over the last K inputs of attn_qkv . x)   (conv state: K-1 rows)
    z = attn_gate . x;  beta = sigmoid(b);  g = softplus(a + dt) * ssm_a   ([b | a] per key head of ssm_ba . x)
    q, k = l2norm(q), l2norm(k);  q *= dk^-1/2;  each key head serves Hv/Hk consecutive value heads
    S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q              (S [Hv, dk, dv] per sequence)
    out = ssm_out . (rmsnorm(o) * ssm_norm * silu(z))
(transformers' torch_recurrent_gated_delta_rule; llama.cpp's qwen3next graph). The state of layer i
lives in `kv` = cache.layer(i) = (conv [S, K-1, C], ssm [S, Hv, dk, dv]), one row per cache slot
(`Batch.slots`); a sequence starting at position 0 starts from zeros, so a slot's state is never
read by the next sequence that takes the slot. Prefill runs the recurrence token by token.

GatedAttention: full attention whose query projection also gives each head an output gate
(rows [q_h | gate_h] per head): out = attention(q, k, v) * sigmoid(gate), before attn_output.
Must not: read files or allocate the state (the KV cache does).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gguf.constants import MODEL_TENSOR as MT

from .attention import Attention, AttentionWeights, stack_qkv
from .batch import Batch
from .kinds import implements, reader
from .layers import Weight, linear
from .packed import PackedMatrix
from .spec import DELTANET, GATED

L2_EPS = 1e-6  # transformers' l2norm (the FLA kernels')


@dataclass
class DeltaNetWeights:
    wqkv: Weight | None  # [C, D]: C = 2 Hk dk + Hv dv
    wgate: Weight | None  # [Hv dv, D]
    wba: Weight | None  # [2 Hv, D]: per key head, its r = Hv/Hk betas then its r alphas (qwen3next)
    conv: torch.Tensor  # [C, K]
    dt: torch.Tensor  # [Hv]
    a: torch.Tensor  # [Hv]: -exp(A_log)
    norm: torch.Tensor  # [dv]
    wout: Weight  # [D, Hv dv]
    wbeta: Weight | None = None  # [Hv, D] and [Hv, D]: beta and alpha apart, in place of wba (qwen35moe)
    walpha: Weight | None = None
    # packed compute: wqkv, wgate and wba (or wbeta, walpha) stacked by rows, one product in place of
    # three or four (the loader sets it, and those to None, where all are packed in one type);
    # w_in_ba: its last 2 Hv rows are wba's (per key head), else wbeta's then walpha's
    w_in: Weight | None = None
    w_in_ba: bool = False


@implements(DELTANET, "torch")
class GatedDeltaNet(nn.Module):
    """One gated DeltaNet layer (see the module docstring)."""

    def __init__(self, w: DeltaNetWeights, n_k_heads: int, n_v_heads: int, head_k_dim: int, head_v_dim: int,
                 eps: float, layer: int, rope=None, tiled: bool = False):
        super().__init__()
        self.w, self.layer, self.eps = w, layer, eps
        self.tiled = tiled  # value head j reads key head j % Hk (llama.cpp's qwen35moe order), else j // r
        self.rope = rope  # unused (no positions in a recurrence); the block loop builds tables by layer rope
        self.hk, self.hv, self.dk, self.dv = n_k_heads, n_v_heads, head_k_dim, head_v_dim

    def forward(self, x: torch.Tensor, batch: Batch, cos_sin, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        w, T = self.w, x.shape[0]
        if batch.slots is None:
            raise ValueError(f"layer {self.layer}: gated DeltaNet needs the batch's cache slots (Batch.slots)")
        qkv, z, b, a = self.project(x)  # [T, C], [T, Hv*dv], [T, Hv], [T, Hv]
        beta, g = self.gates(b, a)  # [T, Hv] each
        conv_state, ssm_state = kv
        o = torch.empty((T, self.hv, self.dv), dtype=torch.float32, device=x.device)
        for slot, start, n, off in zip(batch.slots, batch.starts, batch.lengths, batch.offsets):
            if start == 0:
                conv_state[slot].zero_()
                ssm_state[slot].zero_()
            o[off:off + n] = self.sequence(qkv[off:off + n], g[off:off + n], beta[off:off + n], conv_state, ssm_state,
                                           slot)
        return linear(self.norm_gate(o, z).flatten(1).to(x.dtype), w.wout)  # [T, D]

    def sequence(self, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, conv_state: torch.Tensor,
                 ssm_state: torch.Tensor, slot: int) -> torch.Tensor:
        """One sequence's n new tokens from its slot's states: o [n, Hv, dv]; the states move on."""
        mixed = self.convolve(qkv, conv_state, slot)  # [n, C]
        return self.recur(mixed, g, beta, ssm_state, slot)

    def norm_gate(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """rmsnorm(o) * ssm_norm * silu(z): [T, Hv, dv]."""
        return _rms(o, self.eps) * self.w.norm.float() * F.silu(z.reshape(o.shape))

    def gates(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """beta = sigmoid(b) and g = softplus(a + dt) * A, [T, Hv] each."""
        return torch.sigmoid(b), F.softplus(a + self.w.dt.float()) * self.w.a.float()

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The input projections, float32: qkv [T, C] (contiguous), z [T, Hv*dv], and the
        pre-activation beta and alpha of each value head [T, Hv] each."""
        w, value = self.w, self.hv * self.dv
        if w.w_in is not None:
            C = w.w_in.shape[0] - value - 2 * self.hv
            qkv, z, ba = linear(x, w.w_in).float().split([C, value, 2 * self.hv], dim=-1)
            return qkv.contiguous(), z, *(self.split_ba(ba) if w.w_in_ba else ba.split(self.hv, dim=-1))
        qkv, z = linear(x, w.wqkv).float(), linear(x, w.wgate).float()
        if w.wba is None:
            return qkv, z, linear(x, w.wbeta).float(), linear(x, w.walpha).float()
        return qkv, z, *self.split_ba(linear(x, w.wba).float())

    def split_ba(self, ba: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """wba's output [T, 2 Hv] (per key head: its r betas, then its r alphas) -> beta, alpha [T, Hv]."""
        T = ba.shape[0]
        ba = ba.reshape(T, self.hk, 2, self.hv // self.hk)  # [T, Hk, 2, r]
        return ba[:, :, 0].reshape(T, self.hv), ba[:, :, 1].reshape(T, self.hv)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """Key heads [n, Hk, dk] -> the key head of each value head [n, Hv, dk]."""
        r = self.hv // self.hk
        return x.repeat(1, r, 1) if self.tiled else x.repeat_interleave(r, dim=1)

    def convolve(self, xs: torch.Tensor, conv_state: torch.Tensor, slot: int) -> torch.Tensor:
        """silu(causal depthwise conv) of xs [n, C] after the slot's last K-1 inputs; the state moves on."""
        K = self.w.conv.shape[1]
        window = torch.cat((conv_state[slot].float(), xs))  # [K-1+n, C]
        conv_state[slot] = window[-(K - 1):].to(conv_state.dtype)
        frames = window.unfold(0, K, 1)  # [n, C, K]
        return F.silu((frames * self.w.conv.float()).sum(-1))  # [n, C]

    def recur(self, mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, ssm_state: torch.Tensor,
              slot: int) -> torch.Tensor:
        """The gated delta rule over n tokens from the slot's state: o [n, Hv, dv]; the state moves on."""
        n, key = mixed.shape[0], self.hk * self.dk
        q = self.heads(_l2(mixed[:, :key].view(n, self.hk, self.dk))) * self.dk ** -0.5  # [n, Hv, dk]
        k = self.heads(_l2(mixed[:, key:2 * key].view(n, self.hk, self.dk)))  # [n, Hv, dk]
        v = mixed[:, 2 * key:].view(n, self.hv, self.dv)  # [n, Hv, dv]
        S = ssm_state[slot].float()  # [Hv, dk, dv]
        out = torch.empty((n, self.hv, self.dv), dtype=torch.float32, device=mixed.device)
        decay = g.exp()  # [n, Hv]
        for t in range(n):
            S = S * decay[t, :, None, None]
            delta = (v[t] - torch.einsum("hkv,hk->hv", S, k[t])) * beta[t, :, None]  # [Hv, dv]
            S = S + k[t, :, :, None] * delta[:, None, :]
            out[t] = torch.einsum("hkv,hk->hv", S, q[t])
        ssm_state[slot] = S.to(ssm_state.dtype)
        return out


def _l2(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@implements(GATED, "torch")
class GatedAttention(Attention):
    """Full attention with a per-head sigmoid output gate from the query projection (qwen3next)."""

    def forward(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        w, T, H, hd, Hkv = self.w, x.shape[0], self.n_head, self.head_dim, self.n_head_kv
        if w.wqkv is not None and w.wv is None:  # packed: q (with the gates), k and v stacked, one product
            qg, k, v = linear(x, w.wqkv).split([2 * H * hd, Hkv * hd, Hkv * hd], dim=-1)
        elif w.wqkv is not None:  # packed: q (with the gates) and k stacked, v of a type of its own
            (qg, k), v = linear(x, w.wqkv).split([2 * H * hd, Hkv * hd], dim=-1), linear(x, w.wv)
        else:
            qg, k, v = linear(x, w.wq), linear(x, w.wk), linear(x, w.wv)
        q, gate = qg.reshape(T, H, 2, hd).unbind(2)  # [T, H, hd] each
        k, v = k.reshape(T, Hkv, hd), v.reshape(T, Hkv, hd)
        q, k = w.q_norm(q.contiguous()), w.k_norm(k)
        return linear(self.attend(q, k, v, gate, batch, cos_sin, kv), w.wo)  # [T, D]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, batch: Batch, cos_sin,
               kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Rope, cache writes, attention and the output gate of normed q [T, H, hd], k, v [T, Hkv, hd]
        and gate [T, H, hd]: [T, H*hd]."""
        T = q.shape[0]
        q, k = self.rope.apply(q, *cos_sin), self.rope.apply(k, *cos_sin)
        k_cache, v_cache = kv
        batch.write(k_cache, k)
        batch.write(v_cache, v)
        out = (self.attend_decode if batch.is_decode else self.attend_each)(q, batch, k_cache, v_cache)
        return out * torch.sigmoid(gate.reshape(T, -1))  # [T, H*hd]



@reader(DELTANET)
def read_deltanet(cls, w, arch, hp, spec, rope) -> GatedDeltaNet:
    """Layer spec.index's gated DeltaNet as `cls`; `arch.deltanet_tiled`: value heads tiled over key
    heads, ssm_beta / ssm_alpha apart (else one ssm_ba per key head)."""
    s, D, i, tiled = hp.ssm, hp.n_embd, spec.index, arch.deltanet_tiled
    C, Hv, value = s.conv_channels, s.n_v_heads, s.inner_size
    weights = DeltaNetWeights(
        wqkv=w.matrix(MT.ATTN_QKV, i, (C, D)), wgate=w.matrix(MT.ATTN_GATE, i, (value, D)),
        wba=None if tiled else w.matrix(MT.SSM_BETA_ALPHA, i, (2 * Hv, D)),
        conv=w.get(MT.SSM_CONV1D, i, (C, s.conv_kernel)).float().contiguous(),
        dt=w.get(MT.SSM_DT, i, (Hv,), "bias"), a=w.get(MT.SSM_A, i, (Hv,), ""),
        norm=w.get(MT.SSM_NORM, i, (s.head_v_dim,)), wout=w.matrix(MT.SSM_OUT, i, (D, value)),
        wbeta=w.matrix(MT.SSM_BETA, i, (Hv, D)) if tiled else None,
        walpha=w.matrix(MT.SSM_ALPHA, i, (Hv, D)) if tiled else None)
    ins = [weights.wqkv, weights.wgate, *((weights.wbeta, weights.walpha) if tiled else (weights.wba,))]
    if w.compute is not None and spec.attention.stacked:  # packed, of one type: one product
        weights.w_in, weights.w_in_ba = PackedMatrix.concat(ins), not tiled
        weights.wqkv = weights.wgate = weights.wba = weights.wbeta = weights.walpha = None
    return cls(weights, s.n_k_heads, Hv, s.head_k_dim, s.head_v_dim, hp.norm_eps, i, rope, tiled)


@reader(GATED)
def read_gated(cls, w, arch, hp, spec, rope) -> GatedAttention:
    """Layer spec.index's gated full attention (qwen3next): q carries the output gate, q/k norms."""
    D, H, Hkv, hd, i = hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, spec.index
    weights = AttentionWeights(
        wq=w.matrix(MT.ATTN_Q, i, (2 * H * hd, D)), wk=w.matrix(MT.ATTN_K, i, (Hkv * hd, D)),
        wv=w.matrix(MT.ATTN_V, i, (Hkv * hd, D)), wo=w.matrix(MT.ATTN_OUT, i, (D, H * hd)),
        q_norm=w.norm(MT.ATTN_Q_NORM, i, (hd,)), k_norm=w.norm(MT.ATTN_K_NORM, i, (hd,)))
    stack_qkv(w, spec, weights)
    return cls(weights, H, Hkv, hd, rope, i)


__all__ = ["DeltaNetWeights", "GatedAttention", "GatedDeltaNet", "read_deltanet", "read_gated"]
